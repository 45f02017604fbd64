package segment

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// activeRecordPos returns the file position of record off in the single segment of a log
// written with testRecords from 0.
func activeRecordPos(off int) int64 {
	pos := int64(0)
	for _, r := range testRecords(0, off) {
		pos += int64(frameSize(&r))
	}
	return pos
}

// TestFlipInActiveSegmentKeepsLaterRecords flips one bit in the middle of the active
// segment of a cleanly closed log. The records after it were synced and acknowledged:
// recovery must keep them at their offsets, report the damaged one, and continue offsets
// after the last record, never reusing one.
func TestFlipInActiveSegmentKeepsLaterRecords(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{FS: m, SegmentBytes: 1 << 20, IndexIntervalBytes: 100}
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 40)
	path := l.segments[0].path
	mustClose(t, l)
	if err := m.FlipByte(path, activeRecordPos(10)+frameHeader+1, 0x10); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	if l.Next() != 40 {
		t.Fatalf("Next %d after a bit flip in record 10, want 40: acknowledged records were dropped", l.Next())
	}
	checkRecords(t, mustRead(t, l, 0, 100, 1<<20), testRecords(0, 10))
	_, err := l.Read(10, 1, 1<<20)
	wantErr(t, err, ErrCorrupt)
	for from := 11; from < 40; from++ {
		checkRecords(t, mustRead(t, l, uint64(from), 100, 1<<20), testRecords(from, 40))
	}
	if d := l.Damaged(); len(d) != 1 || d[0] != (Damage{From: 10, To: 11}) || l.Stats().DamagedRecords != 1 {
		t.Fatalf("damage reported as %v, want [10, 11)", d)
	}
	if first := mustAppend(t, l, testRecord(40)); first != 40 {
		t.Fatalf("append after recovery got offset %d, want 40", first)
	}
}

// TestFlipAfterCrashKeepsLaterRecords is the same after a crash with no recovery point
// newer than the log's creation: damage followed by valid records is damage, whatever
// the recovery point says, and the first record of a segment may be the damaged one.
func TestFlipAfterCrashKeepsLaterRecords(t *testing.T) {
	for _, victim := range []int{0, 7, 38} {
		m := vfs.NewMem()
		opts := Options{FS: m, SegmentBytes: 1 << 20, IndexIntervalBytes: 100, RecoveryPointEvery: -1}
		l := mustOpen(t, testDir, opts)
		appendTestRecords(t, l, 0, 40)
		path := l.segments[0].path
		m.Crash()
		l.Close()
		if err := m.FlipByte(path, activeRecordPos(victim)+4, 0x01); err != nil { // the CRC
			t.Fatal(err)
		}
		l = mustOpen(t, testDir, opts)
		if l.Next() != 40 {
			t.Fatalf("victim %d: Next %d, want 40", victim, l.Next())
		}
		for from := 0; from < 40; from++ {
			recs, err := l.Read(uint64(from), 100, 1<<20)
			if from == victim {
				wantErr(t, err, ErrCorrupt)
				continue
			}
			if err != nil {
				t.Fatalf("victim %d: Read(%d): %v", victim, from, err)
			}
			end := 40
			if from < victim {
				end = victim
			}
			checkRecords(t, recs, testRecords(from, end))
		}
		if d := l.Damaged(); len(d) != 1 || d[0] != (Damage{From: uint64(victim), To: uint64(victim) + 1}) {
			t.Fatalf("victim %d: damage reported as %v", victim, d)
		}
		if first := mustAppend(t, l, testRecord(40)); first != 40 {
			t.Fatalf("victim %d: append after recovery got offset %d, want 40", victim, first)
		}
		mustClose(t, l)
	}
}

// TestRecoveryPointWrittenWhileAppending: with a period, the recovery point follows the
// appends before they return, so damage to records appended since the last Close is
// still told from a torn write after a crash.
func TestRecoveryPointWrittenWhileAppending(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{FS: m, SegmentBytes: 1 << 20, IndexIntervalBytes: 100, RecoveryPointEvery: time.Nanosecond}
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 20)
	st := l.Stats()
	if st.RecoveryPoints == 0 {
		t.Fatalf("no recovery point written by 20 records of appends: %+v", st)
	}
	path := l.segments[0].path
	m.Crash()
	l.Close()
	// Damage the last record: with the recovery point past it, it is damage, not a tear.
	last := testRecord(19)
	if err := m.FlipByte(path, activeRecordPos(20)-int64(frameSize(&last))+20, 0x02); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	if l.Next() != 20 || len(l.Damaged()) != 1 || l.Damaged()[0] != (Damage{From: 19, To: 20}) {
		t.Fatalf("Next %d, damage %v: want 20 and [19, 20)", l.Next(), l.Damaged())
	}
}

// TestRecoveryPointFromOldLog opens a log written before recovery points existed (no
// recovery-point file): it opens as before, a torn tail is cut, and a recovery point is
// written at Close.
func TestRecoveryPointFromOldLog(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{FS: m, SegmentBytes: 1 << 20, IndexIntervalBytes: 100}
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 20)
	path := l.segments[0].path
	mustClose(t, l)
	if err := m.Remove(filepath.Join(testDir, recoveryName)); err != nil {
		t.Fatal(err)
	}
	b := mustReadFile(t, m, path)
	if err := m.WriteFile(path, append(b, make([]byte, 50)...)); err != nil { // a torn tail
		t.Fatal(err)
	}
	l = mustOpen(t, testDir, opts)
	if l.Next() != 20 || l.Stats().TornBytes != 50 || len(l.Damaged()) != 0 {
		t.Fatalf("Next %d, stats %+v, damage %v", l.Next(), l.Stats(), l.Damaged())
	}
	checkRecords(t, readAll(t, l), testRecords(0, 20))
	mustClose(t, l)
	rp, ok := decodeRecoveryPoint(mustReadFile(t, m, filepath.Join(testDir, recoveryName)))
	if !ok || rp != (recoveryPoint{base: 0, next: 20, size: int64(len(b)), lastTS: testRecords(0, 20)[19].Timestamp, hasTS: true}) {
		t.Fatalf("recovery point after Close: %+v %v", rp, ok)
	}
}

// TestTornRecoveryPointSlot checks that a torn write of one slot of the recovery-point
// file leaves the other: the older point is used.
func TestTornRecoveryPointSlot(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{FS: m, SegmentBytes: 1 << 20, IndexIntervalBytes: 100, RecoveryPointEvery: -1}
	l := mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 0, 10)
	mustClose(t, l) // slot 0: 10 records
	l = mustOpen(t, testDir, opts)
	appendTestRecords(t, l, 10, 20)
	mustClose(t, l) // slot 1: 20 records
	rpPath := filepath.Join(testDir, recoveryName)
	if err := m.FlipByte(rpPath, recoverySlot+20, 0x01); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	if !l.rp.valid || l.rp.rp.next != 10 || l.rp.slot != 1 {
		t.Fatalf("recovery point %+v valid %v, next slot %d; want the 10-record one, and slot 1 next", l.rp.rp, l.rp.valid, l.rp.slot)
	}
}

// TestNewLogSurvivesPowerLoss (issue 15 #9): a new log's directory entry must be durable
// before the first append returns.
func TestNewLogSurvivesPowerLoss(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, "/new/log", Options{FS: m})
	mustAppend(t, l, testRecord(0))
	m.Crash()
	l.Close()
	l = mustOpen(t, "/new/log", Options{FS: m})
	defer mustClose(t, l)
	if l.Next() != 1 {
		t.Fatalf("after a power loss the new log holds %d records, want the 1 acknowledged", l.Next())
	}
}

// TestDamagedSegmentBeforeEmptyActiveAgesOut (issue 15 #7): a sealed segment whose last
// records are damaged, next to an empty active segment, has no known age at Open. Once a
// record is appended after it, that record's time bounds it, and retention removes it
// while the process runs, as it would after a restart.
func TestDamagedSegmentBeforeEmptyActiveAgesOut(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 30)
	if err := l.Roll(); err != nil {
		t.Fatal(err)
	}
	seg := l.segments[len(l.segments)-2]
	mustClose(t, l)
	m.Remove(seg.indexPath())
	last := testRecord(29)
	m.FlipByte(seg.path, seg.size-int64(frameSize(&last))+frameHeader+2, 0x04)

	l = mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	ts := testRecord(40).Timestamp
	mustAppend(t, l, Record{Timestamp: ts, Value: []byte("later")})
	if _, err := l.DeleteOlderThan(ts + 1); err != nil {
		t.Fatal(err)
	}
	if l.Oldest() != 30 {
		t.Fatalf("Oldest %d after retention past every record: the damaged segment at %d did not age out", l.Oldest(), seg.base)
	}
}
