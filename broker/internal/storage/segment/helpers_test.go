package segment

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

const testDir = "/data/p0"

// memOptions gives small segments and a dense index, so a few hundred records
// cross many segment and index boundaries. The recovery point is written at Close
// only, so tests that count fsyncs see the same ones on every run.
func memOptions(m *vfs.Mem) Options {
	return Options{FS: m, SegmentBytes: 1024, IndexIntervalBytes: 100, RecoveryPointEvery: -1}
}

func mustOpen(t testing.TB, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

func mustClose(t testing.TB, l *Log) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func mustAppend(t testing.TB, l *Log, recs ...Record) uint64 {
	t.Helper()
	first, err := l.Append(recs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return first
}

func mustRead(t testing.TB, l *Log, from uint64, maxRecords, maxBytes int) []Record {
	t.Helper()
	recs, err := l.Read(from, maxRecords, maxBytes)
	if err != nil {
		t.Fatalf("Read(%d, %d, %d): %v", from, maxRecords, maxBytes, err)
	}
	return recs
}

// testRecord is record i of a deterministic sequence that mixes nil, empty and
// present keys and values of many sizes.
func testRecord(i int) Record {
	r := Record{
		Timestamp: 1_000 + int64(i)*10,
		Value:     bytes.Repeat([]byte{byte('a' + i%26)}, (i*37)%150),
		Attrs:     uint16(i * 7),
	}
	switch {
	case i%5 == 0: // no key
	case i%7 == 0:
		r.Key = []byte{}
	default:
		r.Key = []byte(fmt.Sprintf("key-%d", i))
	}
	return r
}

func testRecords(from, to int) []Record {
	out := make([]Record, 0, to-from)
	for i := from; i < to; i++ {
		r := testRecord(i)
		r.Offset = uint64(i)
		out = append(out, r)
	}
	return out
}

// appendTestRecords appends records [from, to) in batches of varying size.
func appendTestRecords(t testing.TB, l *Log, from, to int) {
	t.Helper()
	for i := from; i < to; {
		n := min(1+i%4, to-i)
		if first := mustAppend(t, l, testRecords(i, i+n)...); first != uint64(i) {
			t.Fatalf("Append of record %d returned offset %d", i, first)
		}
		i += n
	}
}

// readAll reads every record from Oldest to Next in small steps.
func readAll(t testing.TB, l *Log) []Record {
	t.Helper()
	var out []Record
	for from := l.Oldest(); from < l.Next(); {
		recs := mustRead(t, l, from, 13, 700)
		if len(recs) == 0 {
			t.Fatalf("Read(%d) returned nothing below Next %d", from, l.Next())
		}
		out = append(out, recs...)
		from = recs[len(recs)-1].Offset + 1
	}
	return out
}

func sameRecord(a, b Record) bool {
	return a.Offset == b.Offset && a.Timestamp == b.Timestamp && a.Attrs == b.Attrs &&
		(a.Key == nil) == (b.Key == nil) && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value)
}

func checkRecords(t testing.TB, got, want []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range got {
		if !sameRecord(got[i], want[i]) {
			t.Fatalf("record %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func segmentFiles(t testing.TB, fsys vfs.FS, dir, ext string) []string {
	t.Helper()
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if _, ok := parseSegmentName(e.Name, ext); ok {
			out = append(out, filepath.Join(dir, e.Name))
		}
	}
	return out
}

// cloneMem copies the durable state of dir into a fresh Mem.
func cloneMem(t testing.TB, src *vfs.Mem, dir string) *vfs.Mem {
	t.Helper()
	dst := vfs.NewMem()
	if err := dst.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := src.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := src.ReadFile(filepath.Join(dir, e.Name))
		if err != nil {
			t.Fatal(err)
		}
		if err := dst.WriteFile(filepath.Join(dir, e.Name), b); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}
