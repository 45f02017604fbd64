package segment

import (
	"math"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

func TestDeleteOlderThan(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	const n = 300
	appendTestRecords(t, l, 0, n) // timestamps 1000 + 10*i
	cutoff := testRecord(150).Timestamp
	removed, err := l.DeleteOlderThan(cutoff)
	if err != nil {
		t.Fatal(err)
	}
	oldest := l.Oldest()
	if removed != oldest || oldest == 0 || oldest > 150 {
		t.Fatalf("removed %d, Oldest %d", removed, oldest)
	}
	// Whole segments only: the record before Oldest was older than the cutoff,
	// and the segment now first still holds a record at or after it.
	if testRecord(int(oldest)-1).Timestamp >= cutoff || l.segments[0].lastTS < cutoff {
		t.Fatalf("Oldest %d does not sit on the right segment boundary", oldest)
	}
	_, err = l.Read(oldest-1, 1, 0)
	wantErr(t, err, ErrOffsetOutOfRange)
	checkRecords(t, readAll(t, l), testRecords(int(oldest), n))
	if off, _ := l.OffsetForTime(0); off != oldest {
		t.Fatalf("OffsetForTime before everything = %d, want Oldest %d", off, oldest)
	}
	if got := len(segmentFiles(t, m, testDir, logExt)); got != l.Stats().Segments {
		t.Fatalf("%d files for %d segments", got, l.Stats().Segments)
	}
	if got := len(segmentFiles(t, m, testDir, indexExt)); got != l.Stats().Segments-1 {
		t.Fatalf("%d index files for %d sealed segments", got, l.Stats().Segments-1)
	}

	// The active segment is never deleted, however old.
	if _, err := l.DeleteOlderThan(math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if l.Stats().Segments != 1 || l.Oldest() != l.segments[0].base || l.Next() != n {
		t.Fatalf("after deleting everything sealed: %d segments, Oldest %d, Next %d", l.Stats().Segments, l.Oldest(), l.Next())
	}
}

func TestDeleteBefore(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	appendTestRecords(t, l, 0, 300)
	for _, x := range []uint64{0, 1, 37, 38, 120, 299, 1000} {
		before := l.Oldest()
		removed, err := l.DeleteBefore(x)
		if err != nil {
			t.Fatal(err)
		}
		if l.Oldest() != before+removed || l.Oldest() > max(x, before) {
			t.Fatalf("DeleteBefore(%d): Oldest %d -> %d, removed %d", x, before, l.Oldest(), removed)
		}
		if x < 300 && l.Oldest() <= x && len(l.segments) > 1 && l.segments[0].next <= x {
			t.Fatalf("DeleteBefore(%d) kept a segment wholly below it", x)
		}
		checkRecords(t, readAll(t, l), testRecords(int(l.Oldest()), 300))
	}
}

// TestAgedOutLogKeepsOffsets rolls, deletes everything and reopens: the empty
// log remembers where offsets stand, and appends continue from there.
func TestAgedOutLogKeepsOffsets(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 100)
	if err := l.Roll(); err != nil {
		t.Fatal(err)
	}
	if err := l.Roll(); err != nil { // no-op on an empty active segment
		t.Fatal(err)
	}
	removed, err := l.DeleteOlderThan(math.MaxInt64)
	if err != nil || removed != 100 {
		t.Fatalf("removed %d, %v", removed, err)
	}
	if l.Oldest() != 100 || l.Next() != 100 {
		t.Fatalf("Oldest %d Next %d", l.Oldest(), l.Next())
	}
	_, err = l.Read(99, 1, 0)
	wantErr(t, err, ErrOffsetOutOfRange)
	mustClose(t, l)

	m.Crash()
	l = mustOpen(t, testDir, memOptions(m))
	if l.Oldest() != 100 || l.Next() != 100 {
		t.Fatalf("after reopen: Oldest %d Next %d", l.Oldest(), l.Next())
	}
	if off, err := l.OffsetForTime(0); off != 100 || err != nil {
		t.Fatalf("OffsetForTime on an aged-out log: %d %v", off, err)
	}
	if first := mustAppend(t, l, Record{Value: []byte("after")}); first != 100 {
		t.Fatalf("append after aging out got offset %d, want 100", first)
	}
	mustClose(t, l)
}

func TestSetNext(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	if err := l.SetNext(500); err != nil {
		t.Fatal(err)
	}
	if l.Oldest() != 500 || l.Next() != 500 {
		t.Fatalf("Oldest %d Next %d", l.Oldest(), l.Next())
	}
	wantErr(t, l.SetNext(499), ErrOffsetOutOfRange)
	if err := l.SetNext(500); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	m.Crash() // the rename was made durable
	l = mustOpen(t, testDir, memOptions(m))
	if l.Next() != 500 {
		t.Fatalf("Next after crash %d", l.Next())
	}
	if first := mustAppend(t, l, Record{}); first != 500 {
		t.Fatalf("first offset %d", first)
	}
	wantErr(t, l.SetNext(1000), ErrNotEmpty)
	mustClose(t, l)
}
