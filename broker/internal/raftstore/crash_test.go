package raftstore

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// crashOpts: two entries per segment, entries read from the files, so that a cut
// removes whole segments and truncates another, and the new entries roll.
var crashOpts = Options{SegmentBytes: 100, CacheEntries: -1}

// isPrefixOf reports whether a is a prefix of b.
func isPrefixOf(a, b []raftpb.Entry) bool { return len(a) <= len(b) && sameLog(a, b[:len(a)]) }

// crashWALBytes is the size of the write-ahead files in the crash tests: far more
// than a test writes, so no spare is made in the background while they run.
const crashWALBytes = 64 << 10

// runCrashesOn runs op against a store on a fresh crashFS for every crash point
// k = 1, 2, … until op completes without meeting one, and hands the log a reopened
// store recovers after each crash to check. setup prepares the store before arming.
// It returns how many crash points there were. With withWAL the store's writes are
// committed to a write-ahead file on the same crashFS; after a crash the new process
// replays it first, as the broker does, then opens the store.
func runCrashesOn(t *testing.T, withWAL bool, mode crashMode, opts Options, setup func(*Store), op func(*Store) error, check func(k int, ops []string, s *Store)) int {
	t.Helper()
	for k := 1; ; k++ {
		mem := vfs.NewMem()
		cfs := newCrashFS(mem, mode, int64(k))
		withFS := opts
		withFS.FS = cfs
		var w *wal.WAL
		if withWAL {
			var err error
			if w, _, err = wal.Open("/wal", wal.Options{FS: cfs, Root: "/", FileBytes: crashWALBytes}); err != nil {
				t.Fatal(err)
			}
			withFS.WAL = w
		}
		s, err := Open(testDir, withFS)
		if err != nil {
			t.Fatal(err)
		}
		setup(s)
		cfs.arm(k)
		err = op(s)
		if !cfs.crashedNow() {
			if err != nil {
				t.Fatalf("without a crash: %v", err)
			}
			cfs.disarm() // a clean stop after the operation
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if w != nil {
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			s = openOn(t, mem, opts)
			check(0, cfs.opsSeen(), s)
			return k - 1
		}
		if err == nil {
			t.Fatalf("crash point %d (%s): the operation reported success", k, strings.Join(cfs.opsSeen(), ", "))
		}
		if w != nil {
			_ = w.Close() // the power is gone: it fails, and only stops its goroutines
			w2, _, err := wal.Open("/wal", wal.Options{FS: mem, Root: "/", FileBytes: crashWALBytes})
			if err != nil {
				t.Fatalf("crash at step %d of [%s]: replaying the write-ahead file: %v", k, strings.Join(cfs.opsSeen(), ", "), err)
			}
			if err := w2.Close(); err != nil {
				t.Fatal(err)
			}
		}
		// The process is gone; a new one opens the store on what the disk kept.
		withFS.FS, withFS.WAL = mem, nil
		s2, err := Open(testDir, withFS)
		if err != nil {
			t.Fatalf("crash at step %d of [%s]: reopen: %v", k, strings.Join(cfs.opsSeen(), ", "), err)
		}
		check(k, cfs.opsSeen(), s2)
		_ = s2.Close() // the check is done; the Mem is dropped
	}
}

// durability names the two ways a store makes its writes durable in the crash
// tests: syncing its own files, or committing them to a write-ahead file.
var durability = []struct {
	name string
	wal  bool
}{{"sync", false}, {"wal", true}}

// TestCrashDuringCut crashes at every step of an append that cuts a divergent
// suffix and writes fewer new entries over it. After each crash the log must be
// the old log (or a prefix of it still holding everything before the cut) or the
// cut log with a prefix of the new entries: never a new entry followed by an old
// one. Two shapes: the cut spans segments (whole segments removed, another
// truncated, the new entries rolling), and the cut is inside one segment with new
// entries of a lower term than the cut ones (a new leader's log may carry an older
// term than a deposed leader's uncommitted tail), so a mix would pass every frame
// check. The writeback mode keeps written data whose truncation was not synced;
// it is the one that fails if the cut is not made durable before the new entries
// are written.
func TestCrashDuringCut(t *testing.T) {
	for _, shape := range []struct {
		name     string
		opts     Options
		old, new []raftpb.Entry
		term     uint64
	}{
		{"across segments", crashOpts, withData(1, 12, 1), withData(6, 9, 2), 2},
		{"inside a segment, lower term", Options{CacheEntries: -1}, append(withData(1, 5, 1), withData(6, 12, 3)...), withData(6, 9, 2), 4},
	} {
		for _, d := range durability {
			for _, mode := range []crashMode{crashClean, crashTorn, crashWriteback} {
				t.Run(shape.name+"/"+d.name+"/"+mode.String(), func(t *testing.T) {
					old := append(idx(0).terms(0), shape.old...)
					want := append(append([]raftpb.Entry(nil), old[:6]...), shape.new...)
					hs := raftpb.HardState{Term: shape.term, Vote: 2, Commit: 4}
					points := runCrashesOn(t, d.wal, mode, shape.opts,
						func(s *Store) {
							if err := s.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 4}, old[1:]); err != nil {
								t.Fatal(err)
							}
						},
						func(s *Store) error { return s.Save(hs, shape.new) },
						func(k int, ops []string, s *Store) {
							got := logOf(t, s)
							okOld := isPrefixOf(got, old) && len(got) >= 6
							okNew := isPrefixOf(got, want) && len(got) >= 6
							if !okOld && !okNew {
								t.Fatalf("crash at step %d of [%s]: log%s is neither a prefix of the old log through 5 nor the cut log with new entries", k, strings.Join(ops, ", "), describe(got))
							}
							if k == 0 && !sameLog(got, want) {
								t.Fatalf("no crash: log%s, want%s", describe(got), describe(want))
							}
							if h := s.HardState(); h.Term < 1 || h.Commit != 4 {
								t.Fatalf("crash at step %d: hard state %+v", k, h)
							}
							// The recovered store takes the leader's entries again.
							if err := s.Save(hs, shape.new); err != nil {
								t.Fatalf("crash at step %d: append after recovery: %v", k, err)
							}
							if got := logOf(t, s); !sameLog(got, want) {
								t.Fatalf("crash at step %d: log after re-append%s, want%s", k, describe(got), describe(want))
							}
						})
					if points < 4 {
						t.Fatalf("only %d crash points: the cut did less I/O than expected", points)
					}
				})
			}
		}
	}
}

// TestCrashDuringCompact crashes at every step of a compaction: entries after the
// compaction point must all stay readable (from the files), and the compaction
// point is the old one or the new one.
func TestCrashDuringCompact(t *testing.T) {
	for _, d := range durability {
		for _, mode := range []crashMode{crashClean, crashWriteback} {
			t.Run(d.name+"/"+mode.String(), func(t *testing.T) {
				old := append(idx(0).terms(0), withData(1, 12, 1)...)
				runCrashesOn(t, d.wal, mode, crashOpts,
					func(s *Store) {
						if err := s.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 12}, old[1:]); err != nil {
							t.Fatal(err)
						}
					},
					func(s *Store) error { return s.Compact(8) },
					func(k int, ops []string, s *Store) {
						got := logOf(t, s)
						switch {
						case sameLog(got, old):
						case len(got) == 5 && got[0].Index == 8 && sameLog(got[1:], old[9:]):
						default:
							t.Fatalf("crash at step %d of [%s]: log%s", k, strings.Join(ops, ", "), describe(got))
						}
					})
			})
		}
	}
}

// TestCrashDuringApplySnapshot crashes at every step of installing a snapshot over
// a divergent log: the store must come back with the old log or with the snapshot
// and an empty log after it, never the snapshot with the old entries after it.
func TestCrashDuringApplySnapshot(t *testing.T) {
	for _, d := range durability {
		for _, mode := range []crashMode{crashClean, crashWriteback} {
			t.Run(d.name+"/"+mode.String(), func(t *testing.T) {
				old := append(idx(0).terms(0), withData(1, 12, 1)...)
				snap := raftpb.Snapshot{Data: []byte("frontier"), Metadata: raftpb.SnapshotMetadata{Index: 20, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
				runCrashesOn(t, d.wal, mode, crashOpts,
					func(s *Store) {
						if err := s.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 4}, old[1:]); err != nil {
							t.Fatal(err)
						}
					},
					func(s *Store) error { return s.ApplySnapshot(snap) },
					func(k int, ops []string, s *Store) {
						got := logOf(t, s)
						sn, _ := s.Snapshot()
						switch {
						case sameLog(got, old) && sn.Metadata.Index == 0:
						case sameLog(got, idx(20).terms(3)) && sn.Metadata.Index == 20 && string(sn.Data) == "frontier":
						default:
							t.Fatalf("crash at step %d of [%s]: log%s, snapshot at %d", k, strings.Join(ops, ", "), describe(got), sn.Metadata.Index)
						}
					})
			})
		}
	}
}

// TestCrashAfterSnapshotOverDivergentLog installs a snapshot inside a divergent log
// (its index is one the log holds, with another term), so the empty segment after it
// gets the name of a segment the install removed, and appends the leader's next entry
// there; then a new term is stored, the step the crashes stop at last. The removed
// segment held two entries of a higher term than the new one: had a record of them
// stayed in the write-ahead file, a replay would write them back under the new entry,
// where the second passes every frame check. The log after any crash is the old one,
// or the snapshot followed by nothing or by the new entry, never the old entry after it.
func TestCrashAfterSnapshotOverDivergentLog(t *testing.T) {
	for _, d := range durability {
		for _, mode := range []crashMode{crashClean, crashTorn, crashWriteback} {
			t.Run(d.name+"/"+mode.String(), func(t *testing.T) {
				old := append(append(idx(0).terms(0), withData(1, 4, 1)...), withData(5, 12, 3)...)
				snap := raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 6, Term: 2, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
				next := withData(7, 7, 2)
				runCrashesOn(t, d.wal, mode, crashOpts,
					func(s *Store) {
						if err := s.Save(raftpb.HardState{Term: 3, Vote: 1, Commit: 4}, old[1:]); err != nil {
							t.Fatal(err)
						}
					},
					func(s *Store) error {
						if err := s.ApplySnapshot(snap); err != nil {
							return err
						}
						if err := s.Append(next); err != nil {
							return err
						}
						return s.SetHardState(raftpb.HardState{Term: 4, Vote: 2, Commit: 7})
					},
					func(k int, ops []string, s *Store) {
						got := logOf(t, s)
						sn, _ := s.Snapshot()
						withSnap := append(idx(6).terms(2), next...)
						switch {
						case sameLog(got, old) && sn.Metadata.Index == 0:
						case sn.Metadata.Index == 6 && isPrefixOf(got, withSnap) && len(got) >= 1:
						default:
							t.Fatalf("crash at step %d of [%s]: log%s, snapshot at %d", k, strings.Join(ops, ", "), describe(got), sn.Metadata.Index)
						}
					})
			})
		}
	}
}

// TestTornLastRecordIsDropped cuts the last segment inside its last frame, and
// appends garbage after it, as crashes leave them: Open drops the partial frame,
// counts the bytes, and appends continue at its index.
func TestTornLastRecordIsDropped(t *testing.T) {
	for _, damage := range []string{"short", "zeros", "garbage"} {
		t.Run(damage, func(t *testing.T) {
			s, mem := newWith(t, []raftpb.Entry{{}}, Options{})
			if err := s.Save(raftpb.HardState{Term: 1, Commit: 3}, withData(1, 5, 1)); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			name := segmentPath(testDir, 1)
			b, _ := mem.ReadFile(name)
			switch damage {
			case "short":
				b = b[:len(b)-3]
			case "zeros":
				b = append(b, make([]byte, 40)...)
			case "garbage":
				junk := make([]byte, 57)
				rand.New(rand.NewSource(1)).Read(junk)
				b = append(b, junk...)
			}
			if err := mem.WriteFile(name, b); err != nil {
				t.Fatal(err)
			}
			s = openOn(t, mem, Options{})
			want := withData(1, 5, 1)
			if damage == "short" {
				want = want[:4]
			}
			if got := logOf(t, s); !sameLog(got[1:], want) {
				t.Fatalf("log after a torn tail%s, want%s", describe(got), describe(want))
			}
			if s.Stats().TornBytes == 0 {
				t.Fatal("TornBytes is 0 after cutting a torn tail")
			}
			if err := s.Append(withData(uint64(len(want)+1), 7, 2)); err != nil {
				t.Fatal(err)
			}
			if last, _ := s.LastIndex(); last != 7 {
				t.Fatalf("LastIndex %d after appending past the cut tail, want 7", last)
			}
		})
	}
}

// TestDamagedRecordIsAnError flips a bit inside an entry with valid entries after
// it, in the active segment and in a sealed one, and inside the last committed
// entry: Open refuses with ErrCorrupt naming the file and the frame's offset,
// rather than dropping acknowledged entries.
func TestDamagedRecordIsAnError(t *testing.T) {
	for _, tt := range []struct {
		name    string
		opts    Options
		entry   uint64 // entry whose frame is damaged
		segBase uint64 // segment holding it
		want    string // in the error text
	}{
		{"middle of the active segment", Options{}, 3, 1, "valid records follow"},
		{"sealed segment", Options{SegmentBytes: 100}, 3, 3, "sealed segment"},
		{"last entry, committed", Options{}, 5, 1, "commit index 5 is past"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, mem := newWith(t, []raftpb.Entry{{}}, tt.opts)
			if err := s.Save(raftpb.HardState{Term: 1, Commit: 5}, withData(1, 5, 1)); err != nil {
				t.Fatal(err)
			}
			s.mu.RLock()
			var seg *segFile
			for _, f := range s.files {
				if f.base == tt.segBase {
					seg = f
				}
			}
			off := int64(seg.pos[tt.entry-seg.base])
			s.mu.RUnlock()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := mem.FlipByte(seg.path, off+headerBytes+2, 0x40); err != nil {
				t.Fatal(err)
			}
			_, err := Open(testDir, Options{FS: mem, SegmentBytes: tt.opts.SegmentBytes})
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open over a damaged entry: %v, want ErrCorrupt", err)
			}
			if tt.want != "commit index 5 is past" && !strings.Contains(err.Error(), fmt.Sprintf("%s at offset %d", seg.path, off)) {
				t.Fatalf("error %q does not name %s at offset %d", err, seg.path, off)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// TestDamageFoundOnRead: a bit flipped in a sealed record after Open is caught by
// its CRC when Entries reads it, with file and offset in the error.
func TestDamageFoundOnRead(t *testing.T) {
	s, mem := newWith(t, []raftpb.Entry{{}}, Options{CacheEntries: -1})
	if err := s.Append(withData(1, 5, 1)); err != nil {
		t.Fatal(err)
	}
	off := int64(s.files[0].pos[1])
	if err := mem.FlipByte(s.files[0].path, off+headerBytes+1, 1); err != nil {
		t.Fatal(err)
	}
	_, err := s.Entries(1, 6, ^uint64(0))
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("at offset %d (index 2)", off)) {
		t.Fatalf("Entries over a damaged record: %v", err)
	}
}

// TestCompactKeepsNeededSegments compacts at every index of a log spread over many
// segments and checks, from the files alone, that every entry after the
// compaction point is still readable before and after a reopen, that every
// segment with an entry above the point is still there, and that a segment whose
// entries are all at or below it is gone.
func TestCompactKeepsNeededSegments(t *testing.T) {
	opts := Options{SegmentBytes: 120, CacheEntries: -1}
	all := withData(1, 30, 1)
	for c := uint64(1); c <= 30; c++ {
		s, mem := newWith(t, []raftpb.Entry{{}}, opts)
		if err := s.Save(raftpb.HardState{Term: 1, Commit: 30}, all); err != nil {
			t.Fatal(err)
		}
		if err := s.Compact(c); err != nil {
			t.Fatalf("Compact(%d): %v", c, err)
		}
		for _, reopen := range []bool{false, true} {
			if reopen {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = openOn(t, mem, opts)
			}
			got := logOf(t, s)
			if got[0].Index != c || !sameLog(got[1:], all[c:]) {
				t.Fatalf("Compact(%d), reopen %v: log%s", c, reopen, describe(got))
			}
			infos, _ := mem.ReadDir(testDir)
			var bases []uint64
			for _, fi := range infos {
				if b, ok := parseSegmentName(fi.Name); ok {
					bases = append(bases, b)
				}
			}
			if len(bases) == 0 || bases[0] > c+1 {
				t.Fatalf("Compact(%d): segments %v; the one holding entry %d is gone", c, bases, c+1)
			}
			if len(bases) > 1 && bases[1] <= c+1 {
				t.Fatalf("Compact(%d): segments %v; %d holds only compacted entries and is still there", c, bases, bases[0])
			}
		}
		_ = s.Close() // checked; the Mem is dropped
	}
}
