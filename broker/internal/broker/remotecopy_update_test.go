package broker

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// TestRemoteChildChangedInPlaceGoesOnFromItsCursor: a remote child whose remote moved
// to another URL (and user) is changed in place: the copy goes on from its cursor at the
// new address, each message copied once (a new address needs the password: the stored
// one is never sent elsewhere).
// What the new address refuses (another cluster, a produce refused) changes nothing,
// and bad input is refused before the remote is asked.
func TestRemoteChildChangedInPlaceGoesOnFromItsCursor(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	old := startFakeRemote(t)
	old.cluster = "dr-cluster"
	rc := meta.RemoteChild{Parent: "orders", ParentIncarnation: m.Incarnation, URL: old.srv.URL, Topic: "copy", Username: "copier",
		RemoteIncarnation: "1", RemoteClusterID: "dr-cluster", RemotePartitions: 1, Start: "earliest", Cursors: []uint64{0}}
	if rc.Sealed, err = b.sealPassword("first-password-1", remoteAAD(rc)); err != nil {
		t.Fatal(err)
	}
	if rc, err = b.meta.AttachRemoteChild(rc); err != nil {
		t.Fatal(err)
	}
	if err := b.reconcile(false); err != nil {
		t.Fatal(err)
	}
	id := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
	produce := func(n int) {
		for range n {
			if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cursor := func() uint64 {
		r, _ := b.meta.RemoteChild(rc.ID)
		return r.Cursors[0]
	}
	produce(3)
	waitUntil(t, "the first three messages to be copied", func() bool { return cursor() == 3 })

	// The remote moves: the old address is gone, and the copy fails.
	old.srv.Close()
	produce(3)
	waitUntil(t, "the copy to fail at the old address", func() bool {
		infos, err := b.RemoteChildren("orders")
		return err == nil && len(infos) == 1 && infos[0].State == "failing"
	})

	moved := startFakeRemote(t)
	moved.cluster, moved.password = "dr-cluster", "first-password-1"
	str := func(s string) *string { return &s }
	unchanged := func(what string) {
		t.Helper()
		if r, _ := b.meta.RemoteChild(rc.ID); r.URL != old.srv.URL || r.Username != "copier" {
			t.Fatalf("%s changed the child: %+v", what, r)
		}
	}
	for _, bad := range []struct {
		name string
		u    RemoteUpdate
	}{
		{"nothing to change", RemoteUpdate{}},
		{"a username without its password", RemoteUpdate{Username: str("copier2")}},
		{"a URL with a path", RemoteUpdate{URL: str(moved.srv.URL + "/v1")}},
		{"a CA for an http URL", RemoteUpdate{URL: str(moved.srv.URL), CAPEM: str("-----BEGIN CERTIFICATE-----"), Password: str("first-password-1")}},
		{"a short password", RemoteUpdate{Password: str("short")}},
	} {
		var ie *InvalidError
		if _, err := b.UpdateRemoteChild(ctx, "orders", id, bad.u); !errors.As(err, &ie) || strings.Contains(ie.Msg, "remote.") {
			t.Errorf("%s: %v, want an invalid argument naming the update body's members (url, not remote.url)", bad.name, err)
		}
		unchanged(bad.name)
	}
	var ce *ConflictError
	if _, err := b.UpdateRemoteChild(ctx, "orders", "orders-copy", RemoteUpdate{URL: str(moved.srv.URL)}); !errors.As(err, &ce) {
		t.Errorf("a child topic of this cluster: %v, want a conflict", err)
	}
	// Another cluster at the new URL, and a remote that refuses the produce.
	other := startFakeRemote(t)
	other.cluster = "another-cluster"
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(other.srv.URL), Password: str("first-password-1")}); !errors.Is(err, ErrRemoteRefused) {
		t.Errorf("a URL of another cluster: %v, want ErrRemoteRefused", err)
	}
	unchanged("another cluster")
	refusing := startFakeRemote(t, 403)
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(refusing.srv.URL), Password: str("first-password-1")}); !errors.Is(err, ErrRemoteRefused) {
		t.Errorf("a remote refusing the produce: %v, want ErrRemoteRefused", err)
	}
	unchanged("a refusing remote")
	if n, _ := other.counts(); n != 0 {
		t.Errorf("the other cluster was sent %d produce requests", n)
	}

	// The move, with the password: the copy goes on from 3.
	info, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(moved.srv.URL), Password: str("first-password-1")})
	if err != nil {
		t.Fatal(err)
	}
	if info.URL != moved.srv.URL || info.ID != id {
		t.Fatalf("the update answered %+v", info)
	}
	waitUntil(t, "the copy to go on at the new address", func() bool { return cursor() == 6 })
	// Then another user, with its password.
	moved.mu.Lock()
	moved.password = "second-password-2"
	moved.mu.Unlock()
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{Username: str("copier2"), Password: str("second-password-2")}); err != nil {
		t.Fatal(err)
	}
	produce(2)
	waitUntil(t, "the copy to go on as the new user", func() bool { return cursor() == 8 })
	waitUntil(t, "the child to be running", func() bool {
		infos, err := b.RemoteChildren("orders")
		return err == nil && len(infos) == 1 && infos[0].State == "running" && infos[0].Username == "copier2"
	})
	moved.mu.Lock()
	defer moved.mu.Unlock()
	if len(moved.stored) != 5 {
		t.Fatalf("the new address stored %d messages, want 5 (offsets 3 to 7, once each): %+v", len(moved.stored), moved.stored)
	}
	for i, o := range moved.stored {
		if o.Offset != int64(3+i) {
			t.Fatalf("the new address stored offsets %+v, want 3 to 7 once each", moved.stored)
		}
	}
}

// TestRemoteChildRoutesOfAMissingTopicSayTopicNotFound: the remote child routes of a
// topic that does not exist say so (topic_not_found), as every other route of a topic
// does, not that the child is not found.
func TestRemoteChildRoutesOfAMissingTopicSayTopicNotFound(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))}); err != nil {
		t.Fatal(err)
	}
	pass := "a-password-1"
	if _, err := b.UpdateRemoteChild(ctx, "nosuch", "remote:3", RemoteUpdate{Password: &pass}); !errors.Is(err, ErrTopicNotFound) {
		t.Errorf("update of a child of a missing topic: %v, want ErrTopicNotFound", err)
	}
	if err := b.PauseRemoteChild(ctx, "nosuch", "remote:3", true); !errors.Is(err, ErrTopicNotFound) {
		t.Errorf("pause of a child of a missing topic: %v, want ErrTopicNotFound", err)
	}
	if err := b.UpdateRemoteCredentials(ctx, "nosuch", "remote:3", pass); !errors.Is(err, ErrTopicNotFound) {
		t.Errorf("new password of a child of a missing topic: %v, want ErrTopicNotFound", err)
	}
	if err := b.PauseRemoteChild(ctx, "orders", "remote:3", true); !errors.Is(err, ErrChildNotFound) {
		t.Errorf("pause of a missing child of a topic: %v, want ErrChildNotFound", err)
	}
}
