package raftlog

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

func mustOpen(t *testing.T, dir string) *Store {
	t.Helper()
	sg := vfs.NewSyncGroup(vfs.EachFile{})
	t.Cleanup(sg.Close)
	s, err := Open(dir, sg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func entries(from, to, term uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte{byte(i)}})
	}
	return out
}

// TestReopenKeepsEntriesAndDivergentSuffixCut stores entries, cuts a suffix as raft
// does for a divergent tail, writes new ones and checks a reopen sees exactly that.
func TestReopenKeepsEntriesAndDivergentSuffixCut(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.StoreLogs(entries(1, 10, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRange(6, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(entries(6, 8, 2)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 2); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = mustOpen(t, dir)
	defer s.Close()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 1 || last != 8 {
		t.Fatalf("after reopen [%d, %d], want [1, 8]", first, last)
	}
	var l raft.Log
	if err := s.GetLog(7, &l); err != nil || l.Term != 2 {
		t.Fatalf("entry 7: %+v, %v; want term 2", l, err)
	}
	if term, _ := s.GetUint64([]byte("CurrentTerm")); term != 2 {
		t.Fatalf("CurrentTerm %d after reopen, want 2", term)
	}
}

// TestTornTailIsDropped cuts the last record in half, as a crash mid-write leaves it.
func TestTornTailIsDropped(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.StoreLogs(entries(1, 3, 1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	name := filepath.Join(dir, "log")
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(name, st.Size()-3); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	defer s.Close()
	if last, _ := s.LastIndex(); last != 2 {
		t.Fatalf("last index %d after a torn third record, want 2", last)
	}
	if err := s.StoreLogs(entries(3, 3, 1)); err != nil {
		t.Fatalf("appending after the cut: %v", err)
	}
}
