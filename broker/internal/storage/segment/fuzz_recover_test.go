package segment

import (
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// FuzzRecoverTail writes n valid records, appends arbitrary bytes to the active segment
// (what a crash can leave after the last synced record, or worse), and reopens. Recovery
// must succeed, keep every one of the n records unchanged, serve only whole records after
// them at their own offsets (a tail that happens to hold valid frames may stay; the
// offsets of bad bytes between valid frames are reported as damage and fail to read),
// give the same answer when opened again, and take new appends after what it kept.
func FuzzRecoverTail(f *testing.F) {
	f.Add(uint8(3), []byte{})
	f.Add(uint8(3), make([]byte, 100))
	f.Add(uint8(0), []byte{200, 0, 0, 0, 1, 2, 3, 4, 1})
	f.Add(uint8(7), []byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(uint8(12), []byte("garbage after the last record"))
	// Bad bytes, then a valid frame two offsets on: a hole of damage in between.
	f.Add(uint8(3), appendFrame(make([]byte, 40), &Record{Value: []byte("x")}, 4, 2000))
	f.Fuzz(func(t *testing.T, n uint8, tail []byte) {
		m := vfs.NewMem()
		opts := Options{FS: m, SegmentBytes: 1 << 20, IndexIntervalBytes: 100}
		l := mustOpen(t, testDir, opts)
		k := int(n % 20)
		appendTestRecords(t, l, 0, k)
		want := readAll(t, l)
		mustClose(t, l)

		path := filepath.Join(testDir, segmentName(0, logExt))
		b, err := m.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.WriteFile(path, append(b, tail...)); err != nil {
			t.Fatal(err)
		}
		l, err = Open(testDir, opts)
		if err != nil {
			t.Fatalf("Open after a torn tail: %v", err)
		}
		got := readAllDamaged(t, l)
		if len(got) < len(want) {
			t.Fatalf("recovery kept %d records of the %d written before the tail", len(got), len(want))
		}
		checkRecords(t, got[:len(want)], want)
		for _, d := range l.Damaged() {
			if d.From < uint64(len(want)) || d.To <= d.From || d.To > l.Next() {
				t.Fatalf("damage %v reported over the %d records written, or outside the log (next %d)", d, len(want), l.Next())
			}
		}
		mustClose(t, l)
		l = mustOpen(t, testDir, opts)
		checkRecords(t, readAllDamaged(t, l), got)
		end := l.Next()
		next := mustAppend(t, l, testRecords(int(end), int(end)+2)...)
		if next != end {
			t.Fatalf("append after recovery got offset %d, want %d", next, end)
		}
		mustClose(t, l)
	})
}

// readAllDamaged reads every record from Oldest to Next, skipping the offsets Damaged
// reports (which must fail with ErrCorrupt) and no others.
func readAllDamaged(t testing.TB, l *Log) []Record {
	t.Helper()
	bad := map[uint64]bool{}
	for _, d := range l.Damaged() {
		for o := d.From; o < d.To; o++ {
			bad[o] = true
		}
	}
	var out []Record
	for from := l.Oldest(); from < l.Next(); from++ {
		recs, err := l.Read(from, 1, 0)
		if bad[from] {
			wantErr(t, err, ErrCorrupt)
			continue
		}
		if err != nil || len(recs) != 1 || recs[0].Offset != from {
			t.Fatalf("Read(%d) = %d records, %v", from, len(recs), err)
		}
		out = append(out, recs[0])
	}
	return out
}
