package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/auth"
)

func mustOpen(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTopicsSurviveRestartAndIncarnationsDiffer(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	a, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 3}})
	if err != nil || a.Incarnation == 0 {
		t.Fatalf("create: %+v %v", a, err)
	}
	if _, err := s.CreateTopic(Topic{Name: "orders"}); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	v := int64(5000)
	if got, err := s.AlterTopic("orders", Alter{VisibilityMs: &v}); err != nil || got.VisibilityMs != 5000 || got.Partitions != 3 {
		t.Fatalf("alter: %+v %v", got, err)
	}
	if _, err := s.DeleteTopic("orders", a.Incarnation+1); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("delete of another incarnation: %v", err)
	}
	if _, err := s.DeleteTopic("orders", 0); err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 1}})
	if err != nil || b.Incarnation <= a.Incarnation {
		t.Fatalf("recreate: %+v %v (first incarnation %d)", b, err, a.Incarnation)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, dir)
	defer s.Close()
	got, ok := s.Topic("orders")
	if !ok || got.Incarnation != b.Incarnation || got.Partitions != 1 {
		t.Fatalf("after restart: %+v %v, want incarnation %d", got, ok, b.Incarnation)
	}
	if n := len(s.Topics()); n != 1 {
		t.Fatalf("%d topics after restart", n)
	}
}

func TestSnapshotRestore(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s.CreateTopic(Topic{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteTopic("b", 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, dir)
	defer s.Close()
	ts := s.Topics()
	if len(ts) != 2 || ts[0].Name != "a" || ts[1].Name != "c" {
		t.Fatalf("after snapshot + log replay: %+v", ts)
	}
}

func TestUsersAndSeedOnce(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	admin := auth.User{Name: "admin", Hash: []byte("h1"), Grants: []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}}
	if _, err := s.CreateUser(admin, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUser(auth.User{Name: "admin"}, false); !errors.Is(err, ErrUserExists) {
		t.Fatalf("duplicate user: %v", err)
	}
	if _, err := s.SetPassword("admin", []byte("h2")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteUser("admin"); err != nil {
		t.Fatal(err)
	}
	// A restart with the same --admin-password must not bring a deleted admin back.
	if _, err := s.CreateUser(admin, true); !errors.Is(err, ErrUserExists) {
		t.Fatalf("second seed: %v", err)
	}
	if _, err := s.CreateUser(auth.User{Name: "bob", Hash: []byte("hb")}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetGrants("bob", []auth.Grant{{Action: auth.Produce, Topics: []string{"a"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, dir)
	defer s.Close()
	u, ok := s.User("bob")
	if !ok || string(u.Hash) != "hb" || len(u.Grants) != 1 {
		t.Fatalf("bob after restart: %+v %v", u, ok)
	}
	if _, err := s.CreateUser(admin, true); !errors.Is(err, ErrUserExists) {
		t.Fatalf("seed after snapshot restore: %v", err)
	}
	if _, ok := s.User("admin"); ok {
		t.Fatal("deleted admin came back")
	}
}
