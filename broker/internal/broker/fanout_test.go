package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/auth"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 60 s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *Broker) copierOf(t *testing.T, child string) *copier {
	t.Helper()
	b.copiersMu.Lock()
	defer b.copiersMu.Unlock()
	for k, c := range b.copiers {
		if k.child == child {
			return c
		}
	}
	t.Fatalf("no copier runs for child %s", child)
	return nil
}

func childEnd(t *testing.T, b *Broker, name string) uint64 {
	t.Helper()
	ct, err := b.lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(0)
	for _, p := range ct.parts() {
		n += p.Stats().End
	}
	return n
}

func childPaused(t *testing.T, b *Broker, parent, child string) string {
	t.Helper()
	cs, err := b.Children(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Name == child {
			return c.Paused
		}
	}
	t.Fatalf("%s is not listed as a child of %s", child, parent)
	return ""
}

// TestFanoutStopsWhenOwnerLosesParentGrant: attaching needs consume on the parent, and
// the copy must keep needing it. Once the child's owner loses that grant (or is
// deleted), nothing more is copied, the children list says why, and the gauge is 1;
// when the grant returns the copy resumes with what was produced meanwhile. A deleted
// owner never comes back, not even as a new user of the same name.
func TestFanoutStopsWhenOwnerLosesParentGrant(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	full := []auth.Grant{{Action: auth.Consume, Topics: []string{"p", "c"}}}
	bob, err := b.CreateUser(ctx, "bob", "bob-password", full)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "p", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "c", OwnerID: bob.ID, Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "p", 1)
	waitUntil(t, "the first message to reach the child", func() bool { return childEnd(t, b, "c") == 1 })
	if why := childPaused(t, b, "p", "c"); why != "" {
		t.Fatalf("child listed paused while its owner holds the grant: %s", why)
	}

	paused := func() float64 { return promtest.ToFloat64(b.metrics.FanoutPaused.WithLabelValues("c")) }
	for _, revoke := range []struct {
		name   string
		do     func() error
		reason string
	}{
		{"grant revoked", func() error {
			_, err := b.SetGrants(ctx, "bob", []auth.Grant{{Action: auth.Consume, Topics: []string{"c"}}})
			return err
		}, "holds no consume grant on p"},
		{"user deleted", func() error { return b.DeleteUser(ctx, "bob") }, "no longer exists"},
	} {
		before := childEnd(t, b, "c")
		if err := revoke.do(); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, revoke.name+": the copier to pause", func() bool { return paused() == 1 })
		if why := childPaused(t, b, "p", "c"); !strings.Contains(why, revoke.reason) {
			t.Fatalf("%s: children list gives reason %q, want one containing %q", revoke.name, why, revoke.reason)
		}
		c := b.copierOf(t, "c")
		r0 := c.rounds.Load()
		produceN(t, b, "p", 1)
		waitUntil(t, revoke.name+": the copier to look at the new message", func() bool { return c.rounds.Load() > r0 })
		if got := childEnd(t, b, "c"); got != before {
			t.Fatalf("%s: the child holds %d messages, had %d: a message was copied after its owner lost read access to the parent", revoke.name, got, before)
		}
		if revoke.name == "user deleted" {
			// A new user of the same name is not the owner (IDs are never reused): the
			// copy stays paused until an operator detaches the child.
			if _, err := b.CreateUser(ctx, "bob", "bob-password", full); err != nil {
				t.Fatal(err)
			}
			c.poke()
			r1 := c.rounds.Load()
			waitUntil(t, "the copier to look again after bob was recreated", func() bool { return c.rounds.Load() > r1 })
			if got := childEnd(t, b, "c"); got != before || paused() != 1 {
				t.Fatalf("a recreated bob took over the deleted bob's child: child holds %d (had %d), paused gauge %v", got, before, paused())
			}
			continue
		}
		// Access returns: the copy resumes where it stopped.
		if _, err := b.SetGrants(ctx, "bob", full); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, revoke.name+": the copy to resume", func() bool { return childEnd(t, b, "c") == before+1 && paused() == 0 })
		if why := childPaused(t, b, "p", "c"); why != "" {
			t.Fatalf("%s: still listed paused after the grant returned: %s", revoke.name, why)
		}
	}
}

// TestAttachRefusesParentRecreatedMeanwhile deletes and recreates the parent (and
// produces to the new one) between the attach's read of the parent's tail and its
// command: the attach must be refused, not link the new parent from the old tail and
// skip its first messages.
func TestAttachRefusesParentRecreatedMeanwhile(t *testing.T) {
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1)}); err != nil {
			t.Fatal(err)
		}
	}
	produceN(t, b, "p", 5)
	attachHook = func() {
		attachHook = nil
		if err := b.DeleteTopic(ctx, "p", 0); err != nil {
			t.Error(err)
		}
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: "p", Partitions: ptr[int32](1)}); err != nil {
			t.Error(err)
		}
		produceN(t, b, "p", 2)
	}
	defer func() { attachHook = nil }()
	_, err := b.AttachChild(ctx, "p", "c", 0)
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("attach across a recreate of the parent: %v, want a conflict", err)
	}
	if cs, _ := b.Children("p"); len(cs) != 0 {
		t.Fatalf("child linked anyway: %+v", cs)
	}
	// Attaching again reads the new parent's tail and works.
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
}
