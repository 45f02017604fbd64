package raftstore

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The tests below mirror etcd-io/raft's MemoryStorage tests (storage_test.go), case
// for case, against the store in each mode; where MemoryStorage panics the store
// returns ErrOutOfRange.

func TestTerm(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ents := idx(3).terms(3, 4, 5)
			for _, tt := range []struct {
				i     uint64
				err   error
				wterm uint64
			}{{2, raft.ErrCompacted, 0}, {3, nil, 3}, {4, nil, 4}, {5, nil, 5}, {6, raft.ErrUnavailable, 0}} {
				s, _ := newWith(t, ents, m.opts)
				term, err := s.Term(tt.i)
				if err != tt.err || term != tt.wterm {
					t.Errorf("Term(%d) = %d, %v; want %d, %v", tt.i, term, err, tt.wterm, tt.err)
				}
			}
		})
	}
}

func TestEntries(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ents := idx(3).terms(3, 4, 5, 6)
			sz := func(i int) uint64 { return uint64(ents[i].Size()) }
			for _, tt := range []struct {
				lo, hi, maxSize uint64
				err             error
				want            []raftpb.Entry
			}{
				{2, 6, math.MaxUint64, raft.ErrCompacted, nil},
				{3, 4, math.MaxUint64, raft.ErrCompacted, nil},
				{4, 5, math.MaxUint64, nil, idx(4).terms(4)},
				{4, 6, math.MaxUint64, nil, idx(4).terms(4, 5)},
				{4, 7, math.MaxUint64, nil, idx(4).terms(4, 5, 6)},
				{4, 7, 0, nil, idx(4).terms(4)}, // at least one entry
				{4, 7, sz(1) + sz(2), nil, idx(4).terms(4, 5)},
				{4, 7, sz(1) + sz(2) + sz(3)/2, nil, idx(4).terms(4, 5)},
				{4, 7, sz(1) + sz(2) + sz(3) - 1, nil, idx(4).terms(4, 5)},
				{4, 7, sz(1) + sz(2) + sz(3), nil, idx(4).terms(4, 5, 6)},
			} {
				s, _ := newWith(t, ents, m.opts)
				got, err := s.Entries(tt.lo, tt.hi, tt.maxSize)
				if err != tt.err || !sameLog(got, tt.want) {
					t.Errorf("Entries(%d, %d, %d) = %s, %v; want %s, %v", tt.lo, tt.hi, tt.maxSize, describe(got), err, describe(tt.want), tt.err)
				}
			}
			// Past the last index: an error, where MemoryStorage panics.
			s, _ := newWith(t, ents, m.opts)
			if _, err := s.Entries(4, 8, math.MaxUint64); !errors.Is(err, ErrOutOfRange) || !errors.Is(err, raft.ErrUnavailable) {
				t.Errorf("Entries past the end: %v, want ErrOutOfRange and raft.ErrUnavailable", err)
			}
			// Only the dummy entry: unavailable.
			s, _ = newWith(t, idx(3).terms(3), m.opts)
			if _, err := s.Entries(4, 4, math.MaxUint64); err != raft.ErrUnavailable {
				t.Errorf("Entries of an empty log: %v, want ErrUnavailable", err)
			}
		})
	}
}

func TestEntriesReturnsTheCallersSlice(t *testing.T) {
	s, _ := newWith(t, idx(3).terms(3, 4, 5, 6), Options{})
	got, err := s.Entries(4, 6, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(got, raftpb.Entry{Index: 99, Term: 99}) // raft may append to it
	got[0].Term = 77                                   // or, against the rules, write to it
	again, _ := s.Entries(4, 7, math.MaxUint64)
	if !sameLog(again, idx(4).terms(4, 5, 6)) {
		t.Fatalf("the store's entries changed through a returned slice: %s", describe(again))
	}
}

func TestLastIndex(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, _ := newWith(t, idx(3).terms(3, 4, 5), m.opts)
			if last, err := s.LastIndex(); err != nil || last != 5 {
				t.Fatalf("LastIndex = %d, %v; want 5", last, err)
			}
			if err := s.Append(idx(6).terms(5)); err != nil {
				t.Fatal(err)
			}
			if last, err := s.LastIndex(); err != nil || last != 6 {
				t.Fatalf("LastIndex = %d, %v; want 6", last, err)
			}
		})
	}
}

func TestFirstIndex(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, _ := newWith(t, idx(3).terms(3, 4, 5), m.opts)
			if first, err := s.FirstIndex(); err != nil || first != 4 {
				t.Fatalf("FirstIndex = %d, %v; want 4", first, err)
			}
			if err := s.Compact(4); err != nil {
				t.Fatal(err)
			}
			if first, err := s.FirstIndex(); err != nil || first != 5 {
				t.Fatalf("FirstIndex = %d, %v; want 5", first, err)
			}
		})
	}
}

func TestCompact(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, tt := range []struct {
				i                     uint64
				err                   error
				windex, wterm, wcount uint64 // compaction point and entries left counting it
			}{
				{2, raft.ErrCompacted, 3, 3, 3},
				{3, raft.ErrCompacted, 3, 3, 3},
				{4, nil, 4, 4, 2},
				{5, nil, 5, 5, 1},
			} {
				for _, reopen := range []bool{false, true} {
					s, mem := newWith(t, idx(3).terms(3, 4, 5), m.opts)
					if err := s.Compact(tt.i); err != tt.err {
						t.Fatalf("Compact(%d) = %v, want %v", tt.i, err, tt.err)
					}
					if reopen {
						if err := s.Close(); err != nil {
							t.Fatal(err)
						}
						s = openOn(t, mem, m.opts)
					}
					log := logOf(t, s)
					if log[0].Index != tt.windex || log[0].Term != tt.wterm || uint64(len(log)) != tt.wcount {
						t.Errorf("Compact(%d), reopen %v: log%s; want it to start at %d/%d with %d entries", tt.i, reopen, describe(log), tt.windex, tt.wterm, tt.wcount)
					}
				}
			}
			s, _ := newWith(t, idx(3).terms(3, 4, 5), m.opts)
			wantErr(t, s.Compact(6), ErrOutOfRange)
		})
	}
}

func TestCreateSnapshot(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
			data := []byte("data")
			for _, tt := range []struct {
				i     uint64
				wsnap raftpb.Snapshot
			}{
				{4, raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 4, Term: 4, ConfState: *cs}}},
				{5, raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 5, ConfState: *cs}}},
			} {
				s, mem := newWith(t, idx(3).terms(3, 4, 5), m.opts)
				snap, err := s.CreateSnapshot(tt.i, cs, data)
				if err != nil || !reflect.DeepEqual(snap, tt.wsnap) {
					t.Fatalf("CreateSnapshot(%d) = %+v, %v; want %+v", tt.i, snap, err, tt.wsnap)
				}
				// Entries stay until Compact; the snapshot survives a reopen.
				if first, _ := s.FirstIndex(); first != 4 {
					t.Errorf("FirstIndex after CreateSnapshot = %d, want 4", first)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = openOn(t, mem, m.opts)
				if got, _ := s.Snapshot(); !reflect.DeepEqual(got, tt.wsnap) {
					t.Errorf("snapshot after reopen %+v, want %+v", got, tt.wsnap)
				}
				if log := logOf(t, s); !sameLog(log, idx(3).terms(3, 4, 5)) {
					t.Errorf("log after reopen%s, want 3/3 4/4 5/5", describe(log))
				}
				if _, err := s.CreateSnapshot(tt.i, cs, data); err != raft.ErrSnapOutOfDate {
					t.Errorf("CreateSnapshot(%d) again: %v, want ErrSnapOutOfDate", tt.i, err)
				}
			}
			s, _ := newWith(t, idx(3).terms(3, 4, 5), m.opts)
			if _, err := s.CreateSnapshot(6, cs, data); !errors.Is(err, ErrOutOfRange) {
				t.Errorf("CreateSnapshot past the end: %v, want ErrOutOfRange", err)
			}
		})
	}
}

func TestAppend(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, tt := range []struct {
				ents, want []raftpb.Entry
			}{
				{idx(1).terms(1, 2), idx(3).terms(3, 4, 5)},
				{idx(3).terms(3, 4, 5), idx(3).terms(3, 4, 5)},
				{idx(3).terms(3, 6, 6), idx(3).terms(3, 6, 6)},
				{idx(3).terms(3, 4, 5, 5), idx(3).terms(3, 4, 5, 5)},
				// Incoming entries below the compaction point are dropped, the
				// stored suffix is cut and the rest appended.
				{idx(2).terms(3, 3, 5), idx(3).terms(3, 5)},
				// The stored suffix is cut and the entries appended.
				{idx(4).terms(5), idx(3).terms(3, 5)},
				{idx(6).terms(5), idx(3).terms(3, 4, 5, 5)},
				// An identical prefix does not keep the stored suffix after it.
				{idx(4).terms(4), idx(3).terms(3, 4)},
			} {
				for _, reopen := range []bool{false, true} {
					s, mem := newWith(t, idx(3).terms(3, 4, 5), m.opts)
					if err := s.Append(tt.ents); err != nil {
						t.Fatalf("Append(%s): %v", describe(tt.ents), err)
					}
					if reopen {
						if err := s.Close(); err != nil {
							t.Fatal(err)
						}
						s = openOn(t, mem, m.opts)
					}
					if log := logOf(t, s); !sameLog(log, tt.want) {
						t.Errorf("Append(%s), reopen %v: log%s, want%s", describe(tt.ents), reopen, describe(log), describe(tt.want))
					}
				}
			}
			s, _ := newWith(t, idx(3).terms(3, 4, 5), m.opts)
			wantErr(t, s.Append(idx(7).terms(5)), ErrNotContiguous)
			wantErr(t, s.Append([]raftpb.Entry{{Index: 6, Term: 5}, {Index: 8, Term: 5}}), ErrNotContiguous)
			wantErr(t, s.Append(idx(6).terms(4)), ErrNotContiguous) // term below the stored 5
			big := Options{MaxEntryBytes: 64, CacheEntries: m.opts.CacheEntries, SegmentBytes: m.opts.SegmentBytes}
			s, _ = newWith(t, idx(3).terms(3), big)
			wantErr(t, s.Append([]raftpb.Entry{{Index: 4, Term: 3, Data: make([]byte, 64)}}), ErrEntryTooLarge)
		})
	}
}

func TestApplySnapshot(t *testing.T) {
	cs := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	data := []byte("data")
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, mem := newWith(t, []raftpb.Entry{{}}, m.opts)
			if err := s.Append(withData(1, 6, 1)); err != nil {
				t.Fatal(err)
			}
			snap := raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 4, Term: 4, ConfState: cs}}
			if err := s.ApplySnapshot(snap); err != nil {
				t.Fatal(err)
			}
			old := raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 3, Term: 3, ConfState: cs}}
			if err := s.ApplySnapshot(old); err != raft.ErrSnapOutOfDate {
				t.Fatalf("older snapshot: %v, want ErrSnapOutOfDate", err)
			}
			for _, reopen := range []bool{false, true} {
				if reopen {
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					s = openOn(t, mem, m.opts)
				}
				if log := logOf(t, s); !sameLog(log, idx(4).terms(4)) {
					t.Errorf("reopen %v: log after the snapshot%s, want just 4/4", reopen, describe(log))
				}
				if _, cs2, _ := s.InitialState(); !reflect.DeepEqual(cs2, cs) {
					t.Errorf("reopen %v: ConfState %+v, want %+v", reopen, cs2, cs)
				}
			}
			if err := s.Append(withData(5, 7, 4)); err != nil {
				t.Fatal(err)
			}
			if log := logOf(t, s); len(log) != 4 || log[3].Index != 7 {
				t.Errorf("log after appending to the snapshot%s", describe(log))
			}
		})
	}
}

// TestReopenKeepsState closes and reopens after every kind of write and checks the
// reopened store answers exactly as the one before.
func TestReopenKeepsState(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, mem := newWith(t, []raftpb.Entry{{}}, m.opts)
			steps := []func() error{
				func() error { return s.Save(raftpb.HardState{Term: 1, Vote: 2, Commit: 0}, withData(1, 20, 1)) },
				func() error { return s.SetHardState(raftpb.HardState{Term: 1, Vote: 2, Commit: 12}) }, // commit only: not synced until Close
				func() error { return s.Append(withData(15, 30, 2)) },
				func() error {
					_, err := s.CreateSnapshot(10, &raftpb.ConfState{Voters: []uint64{1, 2}}, []byte("s"))
					return err
				},
				func() error { return s.Compact(8) },
				func() error { return s.Save(raftpb.HardState{Term: 3, Vote: 1, Commit: 20}, withData(31, 33, 3)) },
			}
			for i, step := range steps {
				if err := step(); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				before := logOf(t, s)
				hs, cs, _ := s.InitialState()
				snap, _ := s.Snapshot()
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = openOn(t, mem, m.opts)
				after := logOf(t, s)
				hs2, cs2, _ := s.InitialState()
				snap2, _ := s.Snapshot()
				if !sameLog(before, after) || hs != hs2 || !reflect.DeepEqual(cs, cs2) || !reflect.DeepEqual(snap, snap2) {
					t.Fatalf("step %d: before close%s %+v %+v; after reopen%s %+v %+v", i, describe(before), hs, snap.Metadata, describe(after), hs2, snap2.Metadata)
				}
			}
			if err := s.Close(); err != ErrClosed && err != nil {
				t.Fatal(err)
			}
			wantErr(t, s.Close(), ErrClosed)
			wantErr(t, s.Append(withData(34, 34, 3)), ErrClosed)
		})
	}
}

// TestTrimCache: entries let go from memory are read back from the files, whole; the
// ones kept are still served from memory; appends after a trim are cached again.
func TestTrimCache(t *testing.T) {
	ents := append(idx(0).terms(0), withData(1, 10, 2)...)
	s, _ := newWith(t, ents, Options{SegmentBytes: 64})
	full := s.CachedBytes()
	if full == 0 {
		t.Fatal("nothing cached after an append")
	}
	s.TrimCache(7) // entries 1–6 go
	if got := s.CachedBytes(); got <= 0 || got >= full {
		t.Fatalf("%d bytes cached after trimming below 7, of %d", got, full)
	}
	reads := s.Stats().DiskReads
	got, err := s.Entries(7, 11, math.MaxUint64)
	if err != nil || !sameLog(got, ents[7:]) {
		t.Fatalf("Entries(7, 11) = %s, %v", describe(got), err)
	}
	if s.Stats().DiskReads != reads {
		t.Fatal("entries kept in memory were read from the files")
	}
	got, err = s.Entries(1, 11, math.MaxUint64)
	if err != nil || !sameLog(got, ents[1:]) {
		t.Fatalf("Entries(1, 11) after the trim = %s, %v", describe(got), err)
	}
	if s.Stats().DiskReads != reads+1 {
		t.Fatal("trimmed entries were not read from the files")
	}
	s.TrimCache(100) // past the last index: everything goes
	if got := s.CachedBytes(); got != 0 {
		t.Fatalf("%d bytes cached after trimming past the end", got)
	}
	more := withData(11, 12, 2)
	if err := s.Append(more); err != nil {
		t.Fatal(err)
	}
	reads = s.Stats().DiskReads
	got, err = s.Entries(11, 13, math.MaxUint64)
	if err != nil || !sameLog(got, more) || s.Stats().DiskReads != reads {
		t.Fatalf("Entries(11, 13) after a full trim and an append = %s, %v (%d disk reads)", describe(got), err, s.Stats().DiskReads-reads)
	}
	got, err = s.Entries(1, 13, math.MaxUint64)
	if err != nil || !sameLog(got, append(ents[1:], more...)) {
		t.Fatalf("the whole log after the trims = %s, %v", describe(got), err)
	}
}

// TestALargeWriteLeavesNoLargeBuffer: the buffer the frames are gathered in is kept
// for the next write only while small. Kept whatever its size, every group of a node
// held its largest write (a batch of 1,000 messages is 256 KB; queued appends written
// at once, several) in memory for good.
func TestALargeWriteLeavesNoLargeBuffer(t *testing.T) {
	s, _ := newWith(t, idx(0).terms(0), Options{})
	big := raftpb.Entry{Index: 1, Term: 1, Type: raftpb.EntryNormal, Data: make([]byte, 1<<20)}
	if err := s.Append([]raftpb.Entry{big}); err != nil {
		t.Fatal(err)
	}
	if c := cap(s.buf); c > keptWriteBuffer {
		t.Fatalf("a write of 1 MiB left a buffer of %d bytes", c)
	}
	small := withData(2, 3, 1)
	if err := s.Append(small); err != nil {
		t.Fatal(err)
	}
	if cap(s.buf) == 0 {
		t.Fatal("a small write's buffer was not kept for the next")
	}
	got, err := s.Entries(1, 4, math.MaxUint64)
	if err != nil || len(got) != 3 || len(got[0].Data) != 1<<20 || !sameLog(got[1:], small) {
		t.Fatalf("Entries(1, 4) = %s, %v", describe(got), err)
	}
}
