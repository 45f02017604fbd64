package segment

import (
	"errors"
	"math/rand"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

func openTestWAL(t *testing.T, m *vfs.Mem) (*wal.WAL, wal.Replayed) {
	t.Helper()
	w, rep, err := wal.Open("/wal", wal.Options{FS: m, Root: "/", FileBytes: 8 << 10})
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	return w, rep
}

// TestWALAppendsSurviveAPowerLoss: a log whose appends go through the write-ahead
// file, with segments small enough to roll every few appends, loses its unsynced
// bytes (torn at random) in a crash at every point of a run: after the replay, the
// log holds exactly what was acknowledged, with nothing damaged. A roll commits the
// chunks before the new segment is created, so no segment is left behind a torn one.
func TestWALAppendsSurviveAPowerLoss(t *testing.T) {
	for _, n := range []int{1, 7, 40, 160} {
		m := vfs.NewMem()
		w, _ := openTestWAL(t, m)
		opts := memOptions(m)
		opts.WAL = w
		l := mustOpen(t, testDir, opts)
		appendTestRecords(t, l, 0, n)
		if segs := len(segmentFiles(t, m, testDir, logExt)); n >= 40 && segs < 3 {
			t.Fatalf("%d records made only %d segments", n, segs)
		}
		m.CrashTorn(rand.New(rand.NewSource(int64(n))))
		if _, rep := openTestWAL(t, m); rep.Records == 0 {
			t.Fatalf("%d records: nothing replayed", n)
		}
		l = mustOpen(t, testDir, memOptions(m))
		if d := l.Damaged(); len(d) != 0 {
			t.Fatalf("%d records: damage after the replay: %+v", n, d)
		}
		if l.Next() != uint64(n) {
			t.Fatalf("%d records: Next %d after the replay", n, l.Next())
		}
		checkRecords(t, readAll(t, l), testRecords(0, n))
		mustClose(t, l)
	}
}

// failingWAL stands for a write-ahead file whose commit fails with err.
type failingWAL struct{ err error }

func (f failingWAL) Commit([]wal.Span) error { return f.err }

func (f failingWAL) SyncOwn(_ string, sync func() error) error { return sync() }

// TestWALCommitErrors: a commit that wrote nothing into the write-ahead file is undone
// like a failed write (for want of space the log stays open); any other commit
// error may have left the records durable, so the append reports ErrNotUndone and
// the log fails closed.
func TestWALCommitErrors(t *testing.T) {
	m := vfs.NewMem()
	opts := memOptions(m)
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 5)
	mustClose(t, l)

	opts.WAL = failingWAL{err: errors.Join(wal.ErrNotWritten, syscall.ENOSPC)}
	l = mustOpen(t, testDir, opts)
	_, err := l.Append(testRecords(5, 6))
	wantErr(t, err, ErrNoSpace)
	if l.Next() != 5 {
		t.Fatalf("Next %d after an undone append", l.Next())
	}
	if b := mustReadFile(t, m, filepath.Join(testDir, "00000000000000000000.log")); int64(len(b)) != l.segments[0].size {
		t.Fatalf("the segment file holds %d bytes, the log %d: the write was not undone", len(b), l.segments[0].size)
	}
	mustClose(t, l)

	opts.WAL = failingWAL{err: wal.ErrFailed}
	l = mustOpen(t, testDir, opts)
	_, err = l.Append(testRecords(5, 6))
	wantErr(t, err, ErrNotUndone)
	_, err = l.Append(testRecords(5, 6))
	wantErr(t, err, ErrFailed)
	_ = l.Close()
}

// crashAtRollWAL passes commits to the write-ahead file until one names a segment
// file after the first roll-th new ones: then it cuts the power instead, tearing
// every unsynced tail at random (the kernel may have written back any part of them).
type crashAtRollWAL struct {
	w       *wal.WAL
	m       *vfs.Mem
	rng     *rand.Rand
	roll    int
	seen    map[string]bool
	crashed bool
}

func (c *crashAtRollWAL) SyncOwn(what string, sync func() error) error {
	return c.w.SyncOwn(what, sync)
}

func (c *crashAtRollWAL) Commit(spans []wal.Span) error {
	if c.crashed {
		return wal.ErrFailed
	}
	for _, s := range spans {
		if !c.seen[s.Path] {
			c.seen[s.Path] = true
			if len(c.seen) == c.roll+1 {
				c.crashed = true
				c.m.CrashTorn(c.rng)
				return wal.ErrFailed
			}
		}
	}
	return c.w.Commit(spans)
}

// TestWALRollNeverLeavesATornSegment: power lost while a group that rolls to a new
// segment is in flight. The group's records in the previous segment were committed
// to the write-ahead file before the new segment's file was created, so the replay
// completes that segment, whatever parts of the new one the disk kept: no damage,
// nothing acknowledged lost.
func TestWALRollNeverLeavesATornSegment(t *testing.T) {
	for roll := 1; roll <= 3; roll++ {
		for seed := int64(1); seed <= 20; seed++ {
			m := vfs.NewMem()
			w, _ := openTestWAL(t, m)
			cw := &crashAtRollWAL{w: w, m: m, rng: rand.New(rand.NewSource(seed)), roll: roll, seen: map[string]bool{}}
			opts := memOptions(m)
			opts.WAL = cw
			l := mustOpen(t, testDir, opts)
			acked := 0
			// Appends of 12 records (about 1,100 bytes) roll the 1 KiB segments inside
			// most groups.
			for i := 0; i < 600 && !cw.crashed; i += 12 {
				if _, err := l.Append(testRecords(i, i+12)); err != nil {
					break
				}
				acked = i + 12
			}
			if !cw.crashed {
				t.Fatalf("roll %d never happened", roll)
			}
			_ = l.Close() // its handles died with the power
			openTestWAL(t, m)
			l = mustOpen(t, testDir, memOptions(m))
			if d := l.Damaged(); len(d) != 0 {
				t.Fatalf("roll %d seed %d: damage after the replay: %+v", roll, seed, d)
			}
			if l.Next() < uint64(acked) {
				t.Fatalf("roll %d seed %d: Next %d, %d were acknowledged", roll, seed, l.Next(), acked)
			}
			checkRecords(t, readAll(t, l), testRecords(0, int(l.Next())))
			mustClose(t, l)
		}
	}
}

// notWrittenOnce passes commits to a real write-ahead file, but answers the next one
// after arm with ErrNotWritten (no space for a new write-ahead file), recording nothing.
type notWrittenOnce struct {
	w   *wal.WAL
	arm bool
}

func (c *notWrittenOnce) Commit(spans []wal.Span) error {
	if c.arm {
		c.arm = false
		return errors.Join(wal.ErrNotWritten, syscall.ENOSPC)
	}
	return c.w.Commit(spans)
}

func (c *notWrittenOnce) SyncOwn(what string, sync func() error) error {
	return c.w.SyncOwn(what, sync)
}

// TestOwnSyncFailureFailsTheWAL: a sync of a segment made outside the write-ahead file
// (the undo of an append the write-ahead file refused) that fails may be the only
// report of a lost write-back of records the write-ahead file holds: the write-ahead
// file fails closed and keeps them (a checkpoint through a new handle would have
// freed them), and a start after a crash replays them.
func TestOwnSyncFailureFailsTheWAL(t *testing.T) {
	m := vfs.NewMem()
	w, _ := openTestWAL(t, m)
	c := &notWrittenOnce{w: w}
	opts := memOptions(m)
	opts.WAL = c
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 5)
	c.arm = true
	m.FailSync(1) // the undo's sync of the truncated segment
	_, err := l.Append(testRecords(5, 6))
	wantErr(t, err, ErrNotUndone)
	if err := w.Commit([]wal.Span{{Path: filepath.Join("/", testDir, "x"), Data: []byte("x")}}); !errors.Is(err, wal.ErrFailed) {
		t.Fatalf("a commit after a segment's own sync failed answered %v; want wal.ErrFailed", err)
	}
	if err := w.Checkpoint(); !errors.Is(err, wal.ErrFailed) {
		t.Fatalf("a checkpoint after a segment's own sync failed answered %v; want wal.ErrFailed (nothing freed)", err)
	}
	_ = l.Close()
	m.Crash()
	if _, rep := openTestWAL(t, m); rep.Records == 0 {
		t.Fatal("nothing replayed: the records of the acknowledged appends were freed")
	}
	l = mustOpen(t, testDir, memOptions(m))
	checkRecords(t, readAll(t, l), testRecords(0, 5))
	mustClose(t, l)
}

// dyingWAL passes commits to the write-ahead file until die is set; then a commit
// records nothing and fails with an outcome unknown, as the round whose sync failed
// before the node exits (or a process killed before its round was durable).
type dyingWAL struct {
	w   *wal.WAL
	die bool
}

func (d *dyingWAL) Commit(spans []wal.Span) error {
	if d.die {
		return wal.ErrFailed
	}
	return d.w.Commit(spans)
}

func (d *dyingWAL) SyncOwn(what string, sync func() error) error {
	return d.w.SyncOwn(what, sync)
}

// TestKilledAppendIsDurableOnceRead: records a process wrote into its active segment
// and never committed stay in the page cache when it dies. The log opened again read
// them as records, and appends after them went through the write-ahead file without
// making them durable: a power loss then cut the unsynced records and every
// acknowledged one after them (the replay wrote the later ones behind a hole, which
// the next open cut as a torn tail). Open now makes the active segment durable before
// it reads it. (Found in review; fails on the code before.)
func TestKilledAppendIsDurableOnceRead(t *testing.T) {
	m := vfs.NewMem()
	w, _ := openTestWAL(t, m)
	dw := &dyingWAL{w: w}
	opts := memOptions(m)
	opts.WAL = dw
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 5)
	if err := w.Checkpoint(); err != nil { // records 0–4 durable in their segment
		t.Fatal(err)
	}
	dw.die = true
	if _, err := l.Append(testRecords(5, 6)); err == nil {
		t.Fatal("an append over a dying write-ahead file succeeded")
	}
	// The process dies (the page cache stays): the log and the WAL are abandoned.
	w2, _ := openTestWAL(t, m)
	opts.WAL = w2
	l2 := mustOpen(t, testDir, opts)
	if l2.Next() != 6 {
		t.Fatalf("the log opened again holds %d records; want 6 (the unanswered one may be there)", l2.Next())
	}
	appendTestRecords(t, l2, 6, 10) // answered: durable through the write-ahead file
	m.Crash()                       // a power loss before any checkpoint
	_ = w2.Close()
	if _, rep := openTestWAL(t, m); rep.Records == 0 {
		t.Fatal("nothing replayed")
	}
	l3 := mustOpen(t, testDir, memOptions(m))
	if l3.Next() != 10 || len(l3.Damaged()) != 0 {
		t.Fatalf("after the power loss the log holds %d records (damage %+v); want all 10, as the reopened log read and extended them", l3.Next(), l3.Damaged())
	}
	checkRecords(t, readAll(t, l3), testRecords(0, 10))
	mustClose(t, l3)
}

// TestWALPeriodicPointsAreNotSyncedAndSurviveAPowerLoss: with a write-ahead file the
// once-a-period recovery point is written without a sync of its own (a node of many
// partitions would otherwise pay a file-system-wide sync per partition per second),
// and whatever a power loss leaves of it — the newest slot, the other, a torn one or
// nothing — the log comes back with exactly what was acknowledged and no damage: the
// point claims only bytes the write-ahead file had committed, and they replay.
func TestWALPeriodicPointsAreNotSyncedAndSurviveAPowerLoss(t *testing.T) {
	for seed := int64(0); seed < 24; seed++ {
		n := 5 + int(seed)*7
		m := vfs.NewMem()
		w, _ := openTestWAL(t, m)
		opts := memOptions(m)
		opts.WAL = w
		opts.RecoveryPointEvery = time.Nanosecond // a point with every group
		l := mustOpen(t, testDir, opts)
		appendTestRecords(t, l, 0, n)
		if st := l.Stats(); st.RecoveryPoints < 2 {
			t.Fatalf("seed %d: %d recovery points for %d records", seed, st.RecoveryPoints, n)
		}
		if b, err := m.Durable(filepath.Join(testDir, recoveryName)); err != nil || len(b) != 0 {
			t.Fatalf("seed %d: the recovery-point file was synced: %d durable bytes (%v)", seed, len(b), err)
		}
		if seed%3 == 0 {
			m.Crash() // every unsynced byte lost: no point at all
		} else {
			m.CrashTorn(rand.New(rand.NewSource(seed)))
		}
		openTestWAL(t, m)
		l = mustOpen(t, testDir, memOptions(m))
		if d := l.Damaged(); len(d) != 0 {
			t.Fatalf("seed %d: damage after the replay: %+v", seed, d)
		}
		if l.Next() != uint64(n) {
			t.Fatalf("seed %d: Next %d after the replay, want %d", seed, l.Next(), n)
		}
		checkRecords(t, readAll(t, l), testRecords(0, n))
		mustClose(t, l)
	}
}

// TestWALTimestampFloorSyncedBeforeRetentionEmptiesTheLog: with a write-ahead file, a
// periodic recovery point (unsynced) that already describes the state retention will
// leave — here written by an empty group after a Roll — must not let the retention's
// point be skipped as already written: retention then removes the last records for
// good, and a power loss would take the only note of the newest timestamp with the
// unsynced point, so a record appended after the restart would be stamped below one
// handed out before.
func TestWALTimestampFloorSyncedBeforeRetentionEmptiesTheLog(t *testing.T) {
	m := vfs.NewMem()
	w, _ := openTestWAL(t, m)
	opts := memOptions(m)
	opts.WAL = w
	opts.RecoveryPointEvery = time.Nanosecond // a periodic point with every group
	l := mustOpen(t, testDir, opts)
	mustAppend(t, l, Record{Timestamp: 5000, Value: []byte("a")})
	if err := l.Roll(); err != nil {
		t.Fatal(err)
	}
	points := l.Stats().RecoveryPoints
	time.Sleep(time.Millisecond) // past RecoveryPointEvery on any clock
	mustAppend(t, l)             // an empty group: commits nothing, writes the periodic point
	if l.Stats().RecoveryPoints != points+1 {
		t.Fatalf("the empty group wrote %d recovery points, want 1", l.Stats().RecoveryPoints-points)
	}
	if n, err := l.DeleteOlderThan(6000); err != nil || n != 1 {
		t.Fatalf("retention removed %d records: %v", n, err)
	}
	if b, err := m.Durable(filepath.Join(testDir, recoveryName)); err != nil || len(b) == 0 {
		t.Errorf("the last records were removed while the recovery point holding their timestamp is not durable (%d durable bytes, %v)", len(b), err)
	}
	m.Crash()
	l2 := reopenWithWAL(t, m)
	mustAppend(t, l2, Record{Timestamp: 10, Value: []byte("b")})
	recs := mustRead(t, l2, 1, 1, 1<<20)
	if len(recs) != 1 || recs[0].Timestamp < 5000 {
		t.Fatalf("after every record aged out and a power loss, a record stamped 10 was stored as %+v; want at least 5000, the newest timestamp handed out", recs)
	}
}

// TestWALClosePointIsDurable: Close's recovery point is the clean state and keeps its
// sync even when the last group's periodic point (unsynced under a write-ahead file)
// already describes it. Otherwise, after a clean stop and a power loss, an
// acknowledged last record damaged at rest would be cut as a torn write: lost without
// a report, and its offset handed out again.
func TestWALClosePointIsDurable(t *testing.T) {
	const n = 20
	m := vfs.NewMem()
	w, _ := openTestWAL(t, m)
	opts := memOptions(m)
	opts.WAL = w
	opts.RecoveryPointEvery = time.Nanosecond
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, n)
	active := l.segments[len(l.segments)-1]
	last := active.size - 1 // a byte of the last record
	mustClose(t, l)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := m.Durable(filepath.Join(testDir, recoveryName)); err != nil || len(b) == 0 {
		t.Errorf("after a clean Close the recovery point is not durable (%d bytes, %v)", len(b), err)
	}
	m.Crash()
	if err := m.FlipByte(active.path, last, 0x40); err != nil { // damage at rest
		t.Fatal(err)
	}
	l2 := reopenWithWAL(t, m)
	if l2.Next() != n || len(l2.Damaged()) != 1 {
		t.Fatalf("acknowledged record %d damaged at rest after a clean stop: Next %d (want %d), damage %v (want it reported)", n-1, l2.Next(), n, l2.Damaged())
	}
}

// reopenWithWAL opens the write-ahead file on m (replaying it) and the test log over
// it, both closed when the test ends.
func reopenWithWAL(t *testing.T, m *vfs.Mem) *Log {
	t.Helper()
	w, _ := openTestWAL(t, m)
	opts := memOptions(m)
	opts.WAL = w
	l := mustOpen(t, testDir, opts)
	t.Cleanup(func() {
		mustClose(t, l)
		_ = w.Close()
	})
	return l
}
