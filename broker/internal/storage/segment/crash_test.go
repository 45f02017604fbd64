package segment

import (
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// checkRecovered opens the log in m and checks that it holds exactly want (the
// first len(want) test records), that appends continue at the right offset and
// that the result survives another reopen.
func checkRecovered(t *testing.T, m *vfs.Mem, want int, what string) {
	t.Helper()
	l, err := Open(testDir, memOptions(m))
	if err != nil {
		t.Fatalf("%s: Open: %v", what, err)
	}
	if l.Next() != uint64(want) {
		t.Fatalf("%s: Next %d, want %d", what, l.Next(), want)
	}
	checkRecords(t, readAll(t, l), testRecords(0, want))
	if first := mustAppend(t, l, testRecord(want)); first != uint64(want) {
		t.Fatalf("%s: append after recovery got offset %d, want %d", what, first, want)
	}
	mustClose(t, l)
	l = mustOpen(t, testDir, memOptions(m))
	checkRecords(t, readAll(t, l), testRecords(0, want+1))
	mustClose(t, l)
}

// TestTornLastRecord cuts the active segment at every byte of its last record,
// and flips every byte of it, and checks that recovery keeps exactly the
// records before it. The last record was written after the last recovery point,
// as a write torn by a crash always is.
func TestTornLastRecord(t *testing.T) {
	const n = 60
	base := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(base))
	appendTestRecords(t, l, 0, n-1)
	mustClose(t, l)
	rp := mustReadFile(t, base, filepath.Join(testDir, recoveryName))
	l = mustOpen(t, testDir, memOptions(base))
	start := l.segments[len(l.segments)-1].size
	mustAppend(t, l, testRecord(n-1))
	mustClose(t, l)
	if err := base.WriteFile(filepath.Join(testDir, recoveryName), rp); err != nil {
		t.Fatal(err)
	}
	logs := segmentFiles(t, base, testDir, logExt)
	if len(logs) < 3 {
		t.Fatalf("only %d segments", len(logs))
	}
	active := logs[len(logs)-1]
	full := mustReadFile(t, base, active)
	if int64(len(full))-start != int64(frameSize(&[]Record{testRecord(n - 1)}[0])) {
		t.Fatalf("last record spans %d bytes of the file", int64(len(full))-start)
	}

	for cut := start; cut < int64(len(full)); cut++ {
		m := cloneMem(t, base, testDir)
		if err := m.TruncateFile(active, cut); err != nil {
			t.Fatal(err)
		}
		checkRecovered(t, m, n-1, "cut")
	}
	for pos := start; pos < int64(len(full)); pos++ {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			m := cloneMem(t, base, testDir)
			if err := m.FlipByte(active, pos, mask); err != nil {
				t.Fatal(err)
			}
			checkRecovered(t, m, n-1, "flip")
		}
	}
	checkRecovered(t, cloneMem(t, base, testDir), n, "intact")
}

// TestDamagedLastRecordBeforeRecoveryPoint is TestTornLastRecord for a record the
// recovery point covers: it was synced and acknowledged, so damage to it, a flipped
// bit or a file cut short, is kept as a damaged offset, reported, and never reused.
func TestDamagedLastRecordBeforeRecoveryPoint(t *testing.T) {
	const n = 60
	base := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(base))
	appendTestRecords(t, l, 0, n-1)
	start := l.segments[len(l.segments)-1].size
	mustAppend(t, l, testRecord(n-1))
	mustClose(t, l)
	logs := segmentFiles(t, base, testDir, logExt)
	active := logs[len(logs)-1]
	full := mustReadFile(t, base, active)

	check := func(m *vfs.Mem, what string) {
		t.Helper()
		l := mustOpen(t, testDir, memOptions(m))
		if l.Next() != n {
			t.Fatalf("%s: Next %d, want %d: an acknowledged record was dropped", what, l.Next(), n)
		}
		if d := l.Damaged(); len(d) != 1 || d[0] != (Damage{From: n - 1, To: n}) || l.Stats().DamagedRecords != 1 {
			t.Fatalf("%s: damage reported as %v (%d records), want [%d, %d)", what, d, l.Stats().DamagedRecords, n-1, n)
		}
		_, err := l.Read(n-1, 1, 0)
		wantErr(t, err, ErrCorrupt)
		checkRecords(t, mustRead(t, l, 0, 2*n, 1<<20), testRecords(0, n-1))
		if first := mustAppend(t, l, testRecord(n)); first != n {
			t.Fatalf("%s: append after recovery got offset %d, want %d", what, first, n)
		}
		checkRecords(t, mustRead(t, l, n, 1, 0), testRecords(n, n+1))
		mustClose(t, l)
		// Sealed now or not, the damage stays where it was and is found again.
		l = mustOpen(t, testDir, memOptions(m))
		defer mustClose(t, l)
		if d := l.Damaged(); len(d) != 1 || d[0] != (Damage{From: n - 1, To: n}) {
			t.Fatalf("%s: after a second Open damage reported as %v", what, d)
		}
		checkRecords(t, mustRead(t, l, n, 1, 0), testRecords(n, n+1))
	}
	for _, cut := range []int64{start, start + 1, start + 20, int64(len(full)) - 1} {
		m := cloneMem(t, base, testDir)
		if err := m.TruncateFile(active, cut); err != nil {
			t.Fatal(err)
		}
		check(m, fmt.Sprintf("cut at %d", cut))
	}
	for _, pos := range []int64{start, start + 5, start + frameHeader + 1, int64(len(full)) - 1} {
		m := cloneMem(t, base, testDir)
		if err := m.FlipByte(active, pos, 0x40); err != nil {
			t.Fatal(err)
		}
		check(m, fmt.Sprintf("flip at %d", pos))
	}
}

// TestGarbageAfterTail checks that bytes after the last whole record that do not
// form the next record (zeros from a size extended before its data, or a copy
// of an earlier record) are cut off.
func TestGarbageAfterTail(t *testing.T) {
	base := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(base))
	appendTestRecords(t, l, 0, 20)
	mustClose(t, l)
	logs := segmentFiles(t, base, testDir, logExt)
	active := logs[len(logs)-1]
	full := mustReadFile(t, base, active)

	m := cloneMem(t, base, testDir)
	m.WriteFile(active, append(full, make([]byte, 300)...))
	checkRecovered(t, m, 20, "zeros")

	// A valid frame with a repeated offset is not the next record.
	m = cloneMem(t, base, testDir)
	m.WriteFile(active, appendFrame(full, &Record{Value: []byte("dup")}, 19, 0))
	checkRecovered(t, m, 20, "repeated offset")
}

// TestCrashDropsUnsynced writes records that are never synced and crashes: only
// the synced ones come back, and a torn crash leaves a clean prefix.
func TestCrashDropsUnsynced(t *testing.T) {
	const acked, unsynced = 80, 120
	for seed := int64(0); seed < 40; seed++ {
		m := vfs.NewMem()
		l := mustOpen(t, testDir, memOptions(m))
		appendTestRecords(t, l, 0, acked)
		mustClose(t, l)
		opts := memOptions(m)
		opts.NoSync = true
		l = mustOpen(t, testDir, opts)
		appendTestRecords(t, l, acked, unsynced)
		if seed == 0 {
			m.Crash()
		} else {
			m.CrashTorn(rand.New(rand.NewSource(seed)))
		}
		l.Close()

		l = mustOpen(t, testDir, memOptions(m))
		got := readAll(t, l)
		if len(got) < acked || len(got) > unsynced {
			t.Fatalf("seed %d: %d records after the crash, want %d to %d", seed, len(got), acked, unsynced)
		}
		if seed == 0 && len(got) != acked {
			t.Fatalf("crash kept %d records, want %d", len(got), acked)
		}
		checkRecords(t, got, testRecords(0, len(got)))
		appendTestRecords(t, l, len(got), len(got)+5)
		mustClose(t, l)
	}
}

// TestCorruptSealedSegment damages a record in a sealed segment: it is never
// served; reads up to it succeed and reads of it fail with ErrCorrupt, with
// the index intact and with the index rebuilt by a scan.
func TestCorruptSealedSegment(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 200)
	seg := l.segments[2]
	victim := seg.base + 3
	if victim >= seg.next {
		t.Fatal("segment too small for the test")
	}
	// Find the victim's position by walking the frames.
	pos := int64(0)
	for _, r := range testRecords(int(seg.base), int(victim)) {
		pos += int64(frameSize(&r))
	}
	mustClose(t, l)

	if err := m.FlipByte(seg.path, pos+frameHeader+1, 0x20); err != nil {
		t.Fatal(err)
	}
	truncated := false
	check := func(what string) {
		l := mustOpen(t, testDir, memOptions(m))
		defer mustClose(t, l)
		got := mustRead(t, l, seg.base, 100, 1<<20)
		checkRecords(t, got, testRecords(int(seg.base), int(victim)))
		if _, err := l.Read(victim, 10, 1<<20); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: Read(%d) = %v, want ErrCorrupt", what, victim, err)
		}
		// Every record past the damage is served, also those the index reaches
		// only by way of the damaged one; the damaged one never is.
		for from := victim + 1; from < seg.next && !truncated; from++ {
			recs, err := l.Read(from, 10, 1<<20)
			if err != nil {
				t.Fatalf("%s: Read(%d) past the damaged record %d: %v", what, from, victim, err)
			}
			checkRecords(t, recs, testRecords(int(from), int(from)+len(recs)))
		}
		checkRecords(t, mustRead(t, l, seg.next, 5, 1<<20), testRecords(int(seg.next), int(seg.next)+5))
		checkRecords(t, mustRead(t, l, 0, 1000, 1<<20), testRecords(0, int(victim)))
		if l.Next() != 200 {
			t.Fatalf("%s: Next %d", what, l.Next())
		}
	}
	check("index intact")
	m.Remove(seg.indexPath())
	check("index rebuilt")
	check("index rebuilt again") // a damaged segment gets no index; it is scanned every time

	// A sealed segment cut short loses its tail to ErrCorrupt, not silence.
	m.TruncateFile(seg.path, pos)
	truncated = true
	check("segment truncated")
}

// TestFailedSync makes an fsync fail: the append and every later one fail with
// ErrFailed, readers never see the batch, and a reopen shows only what was
// acknowledged.
func TestFailedSync(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 30)
	m.FailSync(1)
	_, err := l.Append(testRecords(30, 33))
	wantErr(t, err, ErrFailed)
	wantErr(t, err, syscall.EIO)
	if l.Next() != 30 {
		t.Fatalf("Next %d after a failed append", l.Next())
	}
	if recs, err := l.Read(30, 10, 1<<20); recs != nil || err != nil {
		t.Fatalf("Read shows the failed batch: %v %v", recs, err)
	}
	_, err = l.Append(testRecords(30, 31))
	wantErr(t, err, ErrFailed)
	wantErr(t, l.Roll(), ErrFailed)
	_, err = l.DeleteBefore(10)
	wantErr(t, err, ErrFailed)
	checkRecords(t, readAll(t, l), testRecords(0, 30))
	mustClose(t, l)
	checkRecovered(t, cloneMem(t, m, testDir), 30, "reopen")
	m.Crash()
	checkRecovered(t, m, 30, "crash")
}

// TestFailedSyncDuringRoll fails the fsync of a group's second segment: the
// records already synced in the first segment are taken back too.
func TestFailedSyncDuringRoll(t *testing.T) {
	for fail := 1; fail <= 2; fail++ {
		m := vfs.NewMem()
		l := mustOpen(t, testDir, memOptions(m))
		appendTestRecords(t, l, 0, 3)
		segs := l.Stats().Segments
		m.FailSync(fail)
		_, err := l.Append(testRecords(3, 40)) // more than a segment
		wantErr(t, err, ErrFailed)
		if l.Next() != 3 || l.Stats().Segments != segs {
			t.Fatalf("fail at sync %d: Next %d, %d segments", fail, l.Next(), l.Stats().Segments)
		}
		mustClose(t, l)
		if got := len(segmentFiles(t, m, testDir, logExt)); got != segs {
			t.Fatalf("fail at sync %d: %d segment files left, want %d", fail, got, segs)
		}
		m.Crash()
		checkRecovered(t, m, 3, "roll")
	}
}

// TestDiskFull fills the disk in the middle of a group: that append fails with
// ErrNoSpace and leaves nothing behind, the log stays open, and appends succeed again
// once space returns.
func TestDiskFull(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 30)
	m.SetFreeSpace(50)
	_, err := l.Append(testRecords(30, 35))
	wantErr(t, err, ErrNoSpace)
	wantErr(t, err, syscall.ENOSPC)
	if errors.Is(err, ErrFailed) {
		t.Fatalf("a fully undone ENOSPC write failed the log closed: %v", err)
	}
	if recs, _ := l.Read(30, 10, 1<<20); recs != nil {
		t.Fatalf("Read shows a partial record: %v", recs)
	}
	if l.Next() != 30 {
		t.Fatalf("Next %d after a refused append, want 30", l.Next())
	}
	m.SetFreeSpace(-1) // space returns
	if first, err := l.Append(testRecords(30, 31)); err != nil || first != 30 {
		t.Fatalf("append after space returned: %d %v", first, err)
	}
	mustClose(t, l)
	m.Crash()
	checkRecovered(t, m, 31, "disk full")
}

// TestCrashDuringRoll crashes after a failed fsync at each step of a group that
// rolls to a new segment: the old segment's chunk, the new one's, and the
// index file written after the acknowledgement.
func TestCrashDuringRoll(t *testing.T) {
	rec := func(i int) Record { return Record{Timestamp: int64(i), Value: make([]byte, 400)} }
	for step := 1; step <= 3; step++ {
		m := vfs.NewMem()
		l := mustOpen(t, testDir, memOptions(m))
		mustAppend(t, l, rec(0))
		m.FailSync(step)
		_, err := l.Append([]Record{rec(1), rec(2), rec(3)}) // the third goes to a new segment
		if step <= 2 {
			wantErr(t, err, ErrFailed)
		} else if err != nil {
			t.Fatalf("a failed index write failed the append: %v", err)
		}
		m.Crash()
		l.Close()
		l = mustOpen(t, testDir, memOptions(m))
		want := 1
		if step == 3 {
			want = 4
		}
		if got := readAll(t, l); len(got) != want {
			t.Fatalf("step %d: %d records after the crash, want %d", step, len(got), want)
		}
		if first := mustAppend(t, l, rec(9)); first != uint64(want) {
			t.Fatalf("step %d: next append at %d, want %d", step, first, want)
		}
		mustClose(t, l)
	}
}

// TestDamagedLastSealedSegment damages the segment just before an empty active
// one: its newest timestamp is unknown, so retention keeps it, and new appends
// are not clamped to the unknown bound. (With a recovery point, which carries the
// newest timestamp stamped, they are clamped to that; here it is gone, as in a log
// written before it carried one.)
func TestDamagedLastSealedSegment(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 30)
	if err := l.Roll(); err != nil {
		t.Fatal(err)
	}
	seg := l.segments[len(l.segments)-2]
	mustClose(t, l)
	m.Remove(seg.indexPath())
	m.Remove(filepath.Join(testDir, recoveryName))
	// The segment's last record: with nothing valid after it, its time is unknown. (Damage
	// before a valid record leaves the segment's age known: timestamps never decrease.)
	last := testRecord(29)
	m.FlipByte(seg.path, seg.size-int64(frameSize(&last))+frameHeader+2, 0x04)

	l = mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	_, err := l.Read(29, 1, 0)
	wantErr(t, err, ErrCorrupt)
	checkRecords(t, mustRead(t, l, seg.base, 100, 1<<20), testRecords(int(seg.base), 29))
	if _, err := l.DeleteOlderThan(testRecord(29).Timestamp + 1); err != nil {
		t.Fatal(err)
	}
	if l.Oldest() != seg.base {
		t.Fatalf("retention removed a damaged segment of unknown age: Oldest %d", l.Oldest())
	}
	mustAppend(t, l, Record{Timestamp: 5})
	if ts := mustRead(t, l, 30, 1, 0)[0].Timestamp; ts != testRecord(int(seg.base)-1).Timestamp {
		t.Fatalf("new record's timestamp clamped to %d", ts)
	}
}

// TestCrashWithSharedSyncer has several logs on one disk share a vfs.SyncGroup while
// goroutines append to them at once, rolling segments as they go; then the machine
// crashes. Every log must hold every record whose Append returned, in order, and
// accept appends after reopening.
func TestCrashWithSharedSyncer(t *testing.T) {
	for seed := int64(0); seed < 5; seed++ {
		m := vfs.NewMem()
		m.SetSyncDelay(100 * time.Microsecond)
		g := vfs.NewSyncGroup(vfs.EachFile{})
		const logs, perLog = 4, 120
		ls := make([]*Log, logs)
		for i := range ls {
			opts := memOptions(m)
			opts.Syncer = g
			ls[i] = mustOpen(t, fmt.Sprintf("/data/p%d", i), opts)
		}
		var wg sync.WaitGroup
		for i, l := range ls {
			wg.Add(2) // two appenders per log: commit groups with more than one caller
			for half := 0; half < 2; half++ {
				go func() {
					defer wg.Done()
					for j := half; j < perLog; j += 2 {
						if _, err := l.Append([]Record{testRecord(j)}); err != nil {
							t.Errorf("log %d: %v", i, err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		if seed == 0 {
			m.Crash()
		} else {
			m.CrashTorn(rand.New(rand.NewSource(seed)))
		}
		for _, l := range ls {
			l.Close()
		}
		g.Close()
		if st := g.Stats(); st.Rounds >= st.Files {
			t.Logf("seed %d: %d rounds for %d file syncs (none shared)", seed, st.Rounds, st.Files)
		}
		for i := range ls {
			l := mustOpen(t, fmt.Sprintf("/data/p%d", i), memOptions(m))
			if got := readAll(t, l); len(got) != perLog {
				t.Fatalf("seed %d, log %d: %d records after the crash, want %d (all were acknowledged)", seed, i, len(got), perLog)
			}
			mustAppend(t, l, testRecord(0))
			mustClose(t, l)
		}
	}
}
