package meta

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hashicorp/raft"
)

// TestRemoteChildCursorIsDurableAndMovesOnce: a remote child's cursor moves only from
// where it stands (a command applied twice moves it once, never back), survives a
// restart, and goes with its parent's deletion; a second attach of the same remote
// topic is refused.
func TestRemoteChildCursorIsDurableAndMovesOnce(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	p, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 2}})
	if err != nil {
		t.Fatal(err)
	}
	rc := RemoteChild{Parent: "orders", ParentIncarnation: p.Incarnation, URL: "http://dr:7942", Topic: "orders",
		Username: "copier", Sealed: []byte("sealed"), RemoteIncarnation: "9", Start: "now", Cursors: []uint64{5, 7}}
	got, err := s.AttachRemoteChild(rc)
	if err != nil || got.ID == 0 || got.Cursors[0] != 5 || got.Cursors[1] != 7 {
		t.Fatalf("attach: %+v %v", got, err)
	}
	if _, err := s.AttachRemoteChild(rc); !isConflict(err) {
		t.Fatalf("second attach of the same remote topic: %v, want a conflict", err)
	}
	if _, err := s.AttachRemoteChild(RemoteChild{Parent: "orders", URL: "http://dr:7942", Topic: "x", Cursors: []uint64{0}}); !isConflict(err) {
		t.Fatalf("attach with the wrong partition count: %v, want a conflict", err)
	}
	if err := s.MoveRemoteCursor(got.ID, 1, 7, 20, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.MoveRemoteCursor(got.ID, 1, 7, 20, 3); !isConflict(err) {
		t.Fatalf("the same move again: %v, want a conflict", err)
	}
	if err := s.MoveRemoteCursor(got.ID, 1, 20, 10, 0); !isConflict(err) {
		t.Fatalf("a move backwards: %v, want a conflict", err)
	}
	if err := s.PauseRemoteChild(got.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, dir)
	defer s.Close()
	r, ok := s.RemoteChild(got.ID)
	if !ok || r.Cursors[0] != 5 || r.Cursors[1] != 20 || r.Expired[1] != 3 || !r.Paused || !bytes.Equal(r.Sealed, []byte("sealed")) {
		t.Fatalf("after restart: %+v %v", r, ok)
	}
	if err := s.DetachRemoteChild("other", got.ID); !errors.Is(err, ErrChildNotFound) {
		t.Fatalf("detach under another parent: %v", err)
	}
	if _, _, err := s.DeleteTopic("orders", 0); err != nil {
		t.Fatal(err)
	}
	if n := len(s.RemoteChildren()); n != 0 {
		t.Fatalf("%d remote children left after their parent was deleted", n)
	}
}

// TestRemoteChildrenTravelInSnapshots: a snapshot holds the remote children (cursors,
// pause, sealed password) and a restore brings them back.
func TestRemoteChildrenTravelInSnapshots(t *testing.T) {
	f := newFSM()
	apply := func(i uint64, c command) applyResult {
		b, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		return f.Apply(&raft.Log{Index: i, Data: b}).(applyResult)
	}
	apply(1, command{Op: "create_topic", Topic: &Topic{Name: "a", TopicConfig: TopicConfig{Partitions: 1}}})
	if r := apply(2, command{Op: "attach_remote", Remote: &RemoteChild{Parent: "a", URL: "https://x", Topic: "b", Sealed: []byte{1, 2}, Cursors: []uint64{4}}}); r.err != nil {
		t.Fatal(r.err)
	}
	if r := apply(3, command{Op: "move_remote_cursor", RemoteOp: &RemoteOp{ID: 2, From: 4, To: 9}}); r.err != nil {
		t.Fatal(r.err)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM()
	if err := g.Restore(io.NopCloser(&sink.buf)); err != nil {
		t.Fatal(err)
	}
	rs := g.remoteList()
	if len(rs) != 1 || rs[0].ID != 2 || rs[0].Cursors[0] != 9 || !bytes.Equal(rs[0].Sealed, []byte{1, 2}) {
		t.Fatalf("restored: %+v", rs)
	}
}

// TestRemoteCursorCountsExpiredOnce: a cursor move counts at most the messages it
// skips as expired, so one applied twice (a retry) counts them once; a move that skips
// nothing but names expired messages would count them at every application.
func TestRemoteCursorCountsExpiredOnce(t *testing.T) {
	f := newFSM()
	applyAt(t, f, 1, command{Op: "create_topic", Topic: &Topic{Name: "a", TopicConfig: TopicConfig{Partitions: 1}}})
	if r := applyAt(t, f, 2, command{Op: "attach_remote", Remote: &RemoteChild{Parent: "a", URL: "https://x", Topic: "b", Cursors: []uint64{4}}}); r.err != nil {
		t.Fatal(r.err)
	}
	for i, op := range []RemoteOp{{ID: 2, From: 4, To: 4, Expired: 3}, {ID: 2, From: 4, To: 6, Expired: 3}, {ID: 2, From: 4, To: 6, Expired: 2}} {
		for n := range 2 {
			applyAt(t, f, uint64(3+2*i+n), command{Op: "move_remote_cursor", RemoteOp: &op})
			if r := f.remoteList()[0]; r.Expired[0] > r.Cursors[0]-4 {
				t.Fatalf("%+v applied %d times: cursor %d, %d expired: more messages counted expired than the cursor skipped", op, n+1, r.Cursors[0], r.Expired[0])
			}
		}
	}
	if r := f.remoteList()[0]; r.Cursors[0] != 6 || r.Expired[0] != 2 {
		t.Fatalf("cursor %d, %d expired; want 6 and 2 (only the move that skipped as many as it counted)", r.Cursors[0], r.Expired[0])
	}
}

// TestRemoteChildUpdateKeepsTheCursorAndChecksWhatItReplaces: update_remote replaces the
// URL, username, CA certificates and sealed password and keeps the cursors; it applies
// only while the child holds the sealed password it was made from (a reseal or another
// update meanwhile is a conflict), and never gives a parent two children at one remote
// topic.
func TestRemoteChildUpdateKeepsTheCursorAndChecksWhatItReplaces(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	p, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 2}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.AttachRemoteChild(RemoteChild{Parent: "orders", ParentIncarnation: p.Incarnation, URL: "http://dr:7942", Topic: "orders",
		Username: "copier", Sealed: []byte("s1"), RemoteIncarnation: "9", Start: "now", Cursors: []uint64{5, 7}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AttachRemoteChild(RemoteChild{Parent: "orders", ParentIncarnation: p.Incarnation, URL: "http://dr2:7942", Topic: "orders",
		Username: "copier", Sealed: []byte("t1"), RemoteIncarnation: "4", Start: "now", Cursors: []uint64{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MoveRemoteCursor(a.ID, 0, 5, 9, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateRemoteChild(a.ID, "https://dr.new:7942", "copier2", "PEM", []byte("s2"), []byte("stale"), 0); !isConflict(err) {
		t.Fatalf("an update made from a sealed password the child no longer holds: %v, want a conflict", err)
	}
	if _, err := s.UpdateRemoteChild(a.ID, "http://dr2:7942", "copier", "", []byte("s2"), []byte("s1"), 0); !isConflict(err) {
		t.Fatalf("an update onto the remote topic of another child: %v, want a conflict", err)
	}
	if err := s.ResealRemoteChild(a.ID, []byte("s1b")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateRemoteChild(a.ID, "https://dr.new:7942", "copier2", "PEM", []byte("s2"), []byte("s1"), 0); !isConflict(err) {
		t.Fatalf("an update racing a reseal: %v, want a conflict", err)
	}
	got, err := s.UpdateRemoteChild(a.ID, "https://dr.new:7942", "copier2", "PEM", []byte("s2"), []byte("s1b"), 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	defer s.Close()
	r, _ := s.RemoteChild(a.ID)
	for _, x := range []RemoteChild{got, r} {
		if x.URL != "https://dr.new:7942" || x.Username != "copier2" || x.CAPEM != "PEM" || string(x.Sealed) != "s2" ||
			x.Topic != "orders" || x.RemoteIncarnation != "9" || x.Cursors[0] != 9 || x.Cursors[1] != 7 || x.OwnerID != 7 {
			t.Fatalf("after the update (and a restart): %+v", x)
		}
	}
	if o, _ := s.RemoteChild(b.ID); o.URL != "http://dr2:7942" || string(o.Sealed) != "t1" {
		t.Fatalf("the other child changed: %+v", o)
	}
}
