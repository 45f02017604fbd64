package raftstore

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

const testDir = "/data/p0/raft"

// idx builds entries from index i on, like raft's own storage tests.
type idx uint64

func (i idx) terms(ts ...uint64) []raftpb.Entry {
	out := make([]raftpb.Entry, len(ts))
	for k, t := range ts {
		out[k] = raftpb.Entry{Index: uint64(i) + uint64(k), Term: t}
	}
	return out
}

// withData builds entries [from, to] of term with a payload naming them.
func withData(from, to, term uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := from; i <= to; i++ {
		out = append(out, raftpb.Entry{Index: i, Term: term, Type: raftpb.EntryNormal, Data: fmt.Appendf(nil, "e%d-t%d", i, term)})
	}
	return out
}

// modes are the option sets every contract test runs with: entries served from the
// cache, and from the files with one entry per segment (so cuts and compactions
// cross segment boundaries).
var modes = []struct {
	name string
	opts Options
}{
	{"cached", Options{}},
	{"disk-one-entry-per-segment", Options{CacheEntries: -1, SegmentBytes: 1}},
	{"disk-small-segments", Options{CacheEntries: -1, SegmentBytes: 100}},
}

func openOn(t *testing.T, mem *vfs.Mem, opts Options) *Store {
	t.Helper()
	opts.FS = mem
	s, err := Open(testDir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// newWith opens a store on a fresh Mem holding ents, the first of which is the
// dummy entry at the compaction point (as in MemoryStorage's tests).
func newWith(t *testing.T, ents []raftpb.Entry, opts Options) (*Store, *vfs.Mem) {
	t.Helper()
	mem := vfs.NewMem()
	s := openOn(t, mem, opts)
	if ents[0].Index > 0 {
		if err := s.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: ents[0].Index, Term: ents[0].Term}}); err != nil {
			t.Fatalf("ApplySnapshot: %v", err)
		}
	}
	if err := s.Append(ents[1:]); err != nil {
		t.Fatalf("Append: %v", err)
	}
	return s, mem
}

// logOf returns the dummy entry and every entry of s, checked against Term.
func logOf(t *testing.T, s *Store) []raftpb.Entry {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	dt, err := s.Term(first - 1)
	if err != nil {
		t.Fatalf("Term(%d) of the compaction point: %v", first-1, err)
	}
	out := []raftpb.Entry{{Index: first - 1, Term: dt}}
	if last < first {
		return out
	}
	ents, err := s.Entries(first, last+1, ^uint64(0))
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	for _, e := range ents {
		if term, err := s.Term(e.Index); err != nil || term != e.Term {
			t.Fatalf("Term(%d) = %d, %v; the entry says %d", e.Index, term, err, e.Term)
		}
	}
	return append(out, ents...)
}

// sameLog reports whether two logs hold the same entries (an empty payload and a
// nil one count as equal).
func sameLog(a, b []raftpb.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if len(x.Data) == 0 && len(y.Data) == 0 {
			x.Data, y.Data = nil, nil
		}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

func describe(ents []raftpb.Entry) string {
	s := ""
	for _, e := range ents {
		s += fmt.Sprintf(" %d/%d", e.Index, e.Term)
	}
	return s
}

func wantErr(t *testing.T, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("error %v, want %v", got, want)
	}
}
