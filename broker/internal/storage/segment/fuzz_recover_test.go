package segment

import (
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// FuzzRecoverTail writes n valid records, appends arbitrary bytes to the active segment
// (what a crash can leave after the last synced record, or worse), and reopens. Recovery
// must succeed, keep every one of the n records unchanged, serve only whole consecutive
// records after them (a tail that happens to hold valid frames may stay), give the same
// answer when opened again, and take new appends after what it kept.
func FuzzRecoverTail(f *testing.F) {
	f.Add(uint8(3), []byte{})
	f.Add(uint8(3), make([]byte, 100))
	f.Add(uint8(0), []byte{200, 0, 0, 0, 1, 2, 3, 4, 1})
	f.Add(uint8(7), []byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(uint8(12), []byte("garbage after the last record"))
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
		got := readAll(t, l)
		if len(got) < len(want) {
			t.Fatalf("recovery kept %d records of the %d written before the tail", len(got), len(want))
		}
		checkRecords(t, got[:len(want)], want)
		for i, r := range got {
			if r.Offset != uint64(i) {
				t.Fatalf("record %d has offset %d", i, r.Offset)
			}
		}
		mustClose(t, l)
		l = mustOpen(t, testDir, opts)
		checkRecords(t, readAll(t, l), got)
		next := mustAppend(t, l, testRecords(len(got), len(got)+2)...)
		if next != uint64(len(got)) {
			t.Fatalf("append after recovery got offset %d, want %d", next, len(got))
		}
		mustClose(t, l)
	})
}
