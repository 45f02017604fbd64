package meta

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// A node notes the index of the first state that shows its own server id a member, and
// only that one: a topic created before it was made for a group that existed before
// this disk, one created after it is the node's to start (see memberSinceFile). A
// restored snapshot that already holds the node counts from the snapshot's index.
func TestMemberSinceIsTheFirstStateHoldingThisServer(t *testing.T) {
	var told []uint64
	f := newFSM()
	f.self = "n3/new-disk"
	f.onSelf = func(i uint64) { told = append(told, i) }
	applyAt(t, f, 2, command{Op: "init_cluster", ClusterID: "c", Members: []Member{
		{ID: "n1", ServerID: "n1/a", ClusterAddr: "a1", Status: StatusAlive, Voter: true},
		{ID: "n3", ServerID: "n3/old-disk", ClusterAddr: "a3", Status: StatusAlive, Voter: true},
	}})
	applyAt(t, f, 5, command{Op: "create_topic", Topic: &Topic{Name: "before", TopicConfig: TopicConfig{Partitions: 1}}})
	if got := f.selfSince.Load(); got != 0 {
		t.Fatalf("member since %d while only this node id's old disk is a member", got)
	}
	applyAt(t, f, 7, command{Op: "set_member", Member: &Member{ID: "n3", ServerID: "n3/new-disk", ClusterAddr: "a3", Status: StatusAlive, Voter: true}})
	applyAt(t, f, 9, command{Op: "create_topic", Topic: &Topic{Name: "after", TopicConfig: TopicConfig{Partitions: 1}}})
	applyAt(t, f, 11, command{Op: "set_member", Member: &Member{ID: "n3", ServerID: "n3/new-disk", ClusterAddr: "a3b", Status: StatusAlive, Voter: true}})
	if got := f.selfSince.Load(); got != 7 || len(told) != 1 {
		t.Fatalf("member since %d (told %v), want 7 once", got, told)
	}
	if b, a := f.topics["before"].Incarnation, f.topics["after"].Incarnation; !(b < 7 && a > 7) {
		t.Fatalf("incarnations %d and %d do not fall on both sides of 7", b, a)
	}

	g := snapshotRestoreAs(t, f, "n3/new-disk")
	if got := g.selfSince.Load(); got != 11 {
		t.Fatalf("restored from a snapshot at 11 holding this node: member since %d, want 11", got)
	}
	h := snapshotRestoreAs(t, f, "n9/disk")
	if got := h.selfSince.Load(); got != 0 {
		t.Fatalf("a snapshot without this node made it a member since %d", got)
	}
}

// The index survives a restart in the metadata directory; a damaged file stops the
// start with what to do.
func TestMemberSinceFile(t *testing.T) {
	dir := t.TempDir()
	if v, err := loadMemberSince(dir); v != 0 || err != nil {
		t.Fatalf("no file: %d, %v", v, err)
	}
	s := &Store{opts: Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	s.saveMemberSince(42)
	if v, err := loadMemberSince(dir); v != 42 || err != nil {
		t.Fatalf("after saving 42: %d, %v", v, err)
	}
	if err := os.WriteFile(filepath.Join(dir, memberSinceFile), []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadMemberSince(dir); err == nil {
		t.Fatal("a damaged file was read")
	}
}
