package segment

import (
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestFlushMakesNoSyncLogDurable: a log opened with NoSync loses what it wrote at a
// power loss, unless Flush ran after the write; then every record up to the flush
// survives, across many segment files.
func TestFlushMakesNoSyncLogDurable(t *testing.T) {
	for _, flush := range []bool{false, true} {
		m := vfs.NewMem()
		// The log makes its own directory, without a sync (NoSync): Flush must make
		// the directory's entry durable too.
		if err := vfs.MkdirAllSync(m, filepath.Dir(testDir), 0o755); err != nil {
			t.Fatal(err)
		}
		opts := memOptions(m)
		opts.NoSync = true
		l := mustOpen(t, testDir, opts)
		appendTestRecords(t, l, 0, 40) // more than a segment
		if l.Stats().Segments < 2 {
			t.Fatalf("want several segments, got %d", l.Stats().Segments)
		}
		if flush {
			if err := l.Flush(); err != nil {
				t.Fatalf("Flush: %v", err)
			}
		}
		m.Crash()
		l2 := mustOpen(t, testDir, opts)
		got := l2.Next()
		mustClose(t, l2)
		if flush && got != 40 {
			t.Fatalf("after Flush and a power loss the log ends at %d, want 40", got)
		}
		if !flush && got == 40 {
			t.Fatalf("without Flush the NoSync log kept every record through a power loss: the test cannot tell Flush's work")
		}
		if flush {
			l3 := mustOpen(t, testDir, opts)
			checkRecords(t, readAll(t, l3), testRecords(0, 40))
			mustClose(t, l3)
		}
	}
}

// noSyncPowerCut writes 60 records to a NoSync log of many segments, flushing after
// the first 20 when flush is set, then models a power loss that kept every file as it
// was except for the bytes of record hole, zeroed (the page holding it never reached
// the disk, while later ones did), and opens the log again.
func noSyncPowerCut(t *testing.T, flush bool, hole int) (*Log, int) {
	t.Helper()
	m, opts, l := openNoSync(t)
	appendTestRecords(t, l, 0, 20)
	if flush {
		if err := l.Flush(); err != nil {
			t.Fatalf("Flush: %v", err)
		}
	}
	appendTestRecords(t, l, 20, 60)
	var holder *segment
	later := 0
	for _, s := range l.segments {
		switch {
		case s.base <= uint64(hole) && uint64(hole) < s.next:
			holder = s
		case s.base > uint64(hole):
			later++
		}
	}
	if holder == nil || later == 0 {
		t.Fatalf("record %d is not followed by another segment (segments %d)", hole, len(l.segments))
	}
	files := map[string][]byte{}
	ents, err := m.ReadDir(testDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if files[e.Name], err = m.ReadFile(filepath.Join(testDir, e.Name)); err != nil {
			t.Fatal(err)
		}
	}
	pos := 0
	for _, r := range testRecords(int(holder.base), hole) {
		pos += frameSize(&r)
	}
	r := testRecord(hole)
	b := files[filepath.Base(holder.path)]
	clear(b[pos : pos+frameSize(&r)])
	m.Crash()
	_ = l.Close()                                               // the power is gone; its handles fail
	if err := vfs.MkdirAllSync(m, testDir, 0o700); err != nil { // a log never flushed lost its directory too
		t.Fatal(err)
	}
	for name, data := range files {
		if err := m.WriteFile(filepath.Join(testDir, name), data); err != nil {
			t.Fatal(err)
		}
	}
	return mustOpen(t, testDir, opts), later
}

// TestNoSyncLogCutsAHolePastTheFlushPoint: a replica's log is written without syncs of
// its own, and a power loss may keep any part of what was written since its last Flush:
// a record missing with later ones kept is a torn write there, not damage. The log is
// cut at it, the segments after it go, and appends continue at its offset (the group
// writes those records again). Before the flush point, the same hole is damage; and a
// log that never flushed knows no flush point and keeps its damage as before.
func TestNoSyncLogCutsAHolePastTheFlushPoint(t *testing.T) {
	l, later := noSyncPowerCut(t, true, 30)
	if d := l.Damaged(); len(d) != 0 {
		t.Fatalf("a hole past the flush point was reported as damage %v: the replica would be set aside", d)
	}
	if l.Next() != 30 || l.Stats().CutSegments != later {
		t.Fatalf("log ends at %d with %d segments cut; want it cut at 30 and the %d segments after it removed", l.Next(), l.Stats().CutSegments, later)
	}
	checkRecords(t, readAll(t, l), testRecords(0, 30))
	appendTestRecords(t, l, 30, 45)
	mustClose(t, l)
	l = mustOpen(t, testDir, l.opts)
	checkRecords(t, readAll(t, l), testRecords(0, 45))
	mustClose(t, l)

	// Sealed segments before the flush point are trusted through their index files, so
	// the damage shows when the record is read.
	for _, c := range []struct {
		flush bool
		hole  int
	}{{true, 10}, {false, 30}} {
		l, _ = noSyncPowerCut(t, c.flush, c.hole)
		if l.Next() != 60 || l.Stats().CutSegments != 0 {
			t.Fatalf("flushed %v, hole at %d: log ends at %d with %d segments cut; want every record kept", c.flush, c.hole, l.Next(), l.Stats().CutSegments)
		}
		_, err := l.Read(uint64(c.hole), 1, 1<<20)
		wantErr(t, err, ErrCorrupt)
		mustClose(t, l)
	}
}

// TestSyncedOpenDropsTheFlushPoint: a flush point describes a log written without
// syncs of its own. Once the log is opened with syncs (a partition no longer
// replicated), its records past that point are durable and acknowledged: the point
// goes, so that opened without syncs again the log never cuts them as torn.
func TestSyncedOpenDropsTheFlushPoint(t *testing.T) {
	m, opts, l := openNoSync(t)
	appendTestRecords(t, l, 0, 10)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	fp := filepath.Join(testDir, flushName)
	if _, err := m.Stat(fp); err != nil {
		t.Fatalf("Flush of a NoSync log wrote no flush point: %v", err)
	}
	synced := opts
	synced.NoSync = false
	l = mustOpen(t, testDir, synced)
	mustClose(t, l)
	if _, err := m.Stat(fp); err == nil {
		t.Fatal("a log opened with syncs kept its flush point")
	}
	l = mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	if l.fp.valid {
		t.Fatal("the flush point came back")
	}
}

// TestFlushFailsWhenItCannotWriteTheFlushPoint: the flush point is a promise now, not
// a hint: Open cuts the log at the first bad frame past it, with the segments after it.
// A Flush whose flush point could not be written must not report success, or its
// caller (a snapshot) drops the group's entries that wrote the records past the old
// point, and a record damaged there later (the disk's fault, not a torn write: Flush
// synced it) costs every record after it for good, instead of being reported.
func TestFlushFailsWhenItCannotWriteTheFlushPoint(t *testing.T) {
	m, opts, l := openNoSync(t)
	appendTestRecords(t, l, 0, 10)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	appendTestRecords(t, l, 10, 40)
	// Flush syncs the segment files from the last flush point's on, then the flush
	// point: its sync fails.
	synced := 0
	for _, s := range l.segments {
		if s.base >= l.fp.rp.base {
			synced++
		}
	}
	m.FailSync(synced + 1)
	err := l.Flush()
	m.FailSync(0)
	if err != nil {
		mustClose(t, l)
		return // the caller keeps the entries that can write the records again
	}
	// Flush said every record is durable. A bit of record 30 goes bad on the disk.
	var holder *segment
	for _, s := range l.segments {
		if s.base <= 30 && 30 < s.next {
			holder = s
		}
	}
	pos := 0
	for _, r := range testRecords(int(holder.base), 30) {
		pos += frameSize(&r)
	}
	mustClose(t, l)
	if err := m.FlipByte(holder.path, int64(pos+frameOverhead-1), 0x40); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	l = mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	t.Fatalf("Flush returned nil though it could not write its flush point; after a record it made durable went bad, the log ends at %d (want 40, with the damage reported; damage %v, %d segments cut)",
		l.Next(), l.Damaged(), l.Stats().CutSegments)
}

// TestFlushSyncsOnlyWhatChangedSinceTheLastOne: the segments sealed before the last
// flush were synced by it and never change; a replica flushes at each snapshot and
// each start, so syncing all of them each time would cost a sync per segment file. The
// next flush syncs the segments from the last flush point's on, and everything stays
// durable through a power loss.
func TestFlushSyncsOnlyWhatChangedSinceTheLastOne(t *testing.T) {
	m, opts, l := openNoSync(t)
	appendTestRecords(t, l, 0, 60)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	segs := len(l.segments)
	if segs < 4 {
		t.Fatalf("want several segments, have %d", segs)
	}
	appendTestRecords(t, l, 60, 62)
	before := m.Syncs()
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	// The segment active at the last flush, any rolled since, and the flush point.
	if n, most := m.Syncs()-before, int64(len(l.segments)-segs+2); n > most {
		t.Fatalf("the second flush made %d file syncs over %d segments; want at most %d", n, len(l.segments), most)
	}
	m.Crash()
	_ = l.Close()
	l = mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	checkRecords(t, readAll(t, l), testRecords(0, 62))
}

// openNoSync opens a log without syncs of its own on a fresh vfs.Mem whose parent
// directory is durable (the log makes its own directory without a sync).
func openNoSync(t *testing.T) (*vfs.Mem, Options, *Log) {
	t.Helper()
	m := vfs.NewMem()
	if err := vfs.MkdirAllSync(m, filepath.Dir(testDir), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := memOptions(m)
	opts.NoSync = true
	return m, opts, mustOpen(t, testDir, opts)
}
