package segment

import (
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

func TestRoundTripAcrossSegments(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	const n = 400
	appendTestRecords(t, l, 0, n)
	want := testRecords(0, n)
	if l.Oldest() != 0 || l.Next() != n {
		t.Fatalf("Oldest %d Next %d", l.Oldest(), l.Next())
	}
	if segs := l.Stats().Segments; segs < 10 {
		t.Fatalf("only %d segments; the test needs many", segs)
	}
	checkRecords(t, readAll(t, l), want)
	for from := 0; from < n; from++ {
		checkRecords(t, mustRead(t, l, uint64(from), 1, 0), want[from:from+1])
		checkRecords(t, mustRead(t, l, uint64(from), 9, 1<<20), want[from:min(from+9, n)])
	}
	// One whole read crosses every segment boundary.
	checkRecords(t, mustRead(t, l, 0, n+10, 1<<30), want)
}

func TestReadLimits(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	appendTestRecords(t, l, 0, 50)
	want := testRecords(0, 50)
	three := frameSize(&want[10]) + frameSize(&want[11]) + frameSize(&want[12])
	checkRecords(t, mustRead(t, l, 10, 100, three), want[10:13])
	checkRecords(t, mustRead(t, l, 10, 100, three-1), want[10:12])
	// The first record is returned even when it alone passes maxBytes.
	checkRecords(t, mustRead(t, l, 11, 100, 1), want[11:12])
	checkRecords(t, mustRead(t, l, 11, 0, 1<<20), want[11:12])
	checkRecords(t, mustRead(t, l, 40, 100, 1<<20), want[40:])

	if recs, err := l.Read(50, 10, 1<<20); recs != nil || err != nil {
		t.Fatalf("Read at Next: %v %v", recs, err)
	}
	if recs, err := l.Read(1000, 10, 1<<20); recs != nil || err != nil {
		t.Fatalf("Read past Next: %v %v", recs, err)
	}
}

func TestEmptyLog(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	if l.Oldest() != 0 || l.Next() != 0 {
		t.Fatalf("Oldest %d Next %d", l.Oldest(), l.Next())
	}
	if recs, err := l.Read(0, 10, 100); recs != nil || err != nil {
		t.Fatalf("Read of empty log: %v %v", recs, err)
	}
	if off, err := l.OffsetForTime(0); off != 0 || err != nil {
		t.Fatalf("OffsetForTime of empty log: %d %v", off, err)
	}
	if first, err := l.Append(nil); first != 0 || err != nil {
		t.Fatalf("empty Append: %d %v", first, err)
	}
}

func TestTimestampsNeverDecrease(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	mustAppend(t, l, Record{Timestamp: 100}, Record{Timestamp: 50}, Record{Timestamp: 200})
	mustAppend(t, l, Record{Timestamp: 150})
	mustClose(t, l)
	// The newest timestamp is recovered on Open and still clamps.
	l = mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	mustAppend(t, l, Record{Timestamp: 10}, Record{Timestamp: 300})
	var got []int64
	for _, r := range mustRead(t, l, 0, 10, 1<<20) {
		got = append(got, r.Timestamp)
	}
	want := []int64{100, 100, 200, 200, 200, 300}
	if len(got) != len(want) {
		t.Fatalf("timestamps %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("timestamps %v, want %v", got, want)
		}
	}
}

func TestNilAndEmptyKeyDiffer(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	mustAppend(t, l, Record{Key: nil, Value: []byte("a")}, Record{Key: []byte{}, Value: nil}, Record{Key: []byte("k"), Value: []byte{}})
	recs := mustRead(t, l, 0, 3, 1<<20)
	if recs[0].Key != nil || recs[1].Key == nil || len(recs[1].Key) != 0 || string(recs[2].Key) != "k" {
		t.Fatalf("keys: %#v %#v %#v", recs[0].Key, recs[1].Key, recs[2].Key)
	}
	for i, r := range recs {
		if r.Value == nil {
			t.Fatalf("record %d has a nil Value", i)
		}
	}
	// Returned slices are capped, so appending to one cannot overwrite the next.
	_ = append(recs[0].Value, 'X')
	if string(mustRead(t, l, 1, 1, 0)[0].Key) != "" || recs[1].Key == nil {
		t.Fatal("append to a returned Value changed another record")
	}
}

func TestOffsetForTime(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	const n = 300
	appendTestRecords(t, l, 0, n) // timestamps 1000 + 10*i
	for i := 0; i < n; i++ {
		ts := testRecord(i).Timestamp
		for _, q := range []int64{ts, ts - 9} {
			if off, err := l.OffsetForTime(q); off != uint64(i) || err != nil {
				t.Fatalf("OffsetForTime(%d) = %d, %v; want %d", q, off, err, i)
			}
		}
	}
	for _, q := range []int64{math.MinInt64, 0} {
		if off, err := l.OffsetForTime(q); off != 0 || err != nil {
			t.Fatalf("OffsetForTime(%d) = %d, %v; want 0", q, off, err)
		}
	}
	if off, err := l.OffsetForTime(testRecord(n-1).Timestamp + 1); off != n || err != nil {
		t.Fatalf("OffsetForTime past the end = %d, %v; want %d", off, err, n)
	}
	// Equal timestamps: the first record carrying it.
	mustAppend(t, l, Record{Timestamp: 1}, Record{Timestamp: 1}) // clamped to the last timestamp
	if off, _ := l.OffsetForTime(testRecord(n - 1).Timestamp); off != n-1 {
		t.Fatalf("OffsetForTime of a repeated timestamp = %d, want %d", off, n-1)
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 300)
	segs := l.Stats().Segments
	mustClose(t, l)
	if got := len(segmentFiles(t, m, testDir, indexExt)); got != segs-1 {
		t.Fatalf("%d index files for %d sealed segments", got, segs-1)
	}

	// Opening reads the index files and the active segment, never the sealed
	// segments' records.
	var budget int64
	logs := segmentFiles(t, m, testDir, logExt)
	for _, p := range append(segmentFiles(t, m, testDir, indexExt), logs[len(logs)-1], filepath.Join(testDir, recoveryName)) {
		st, _ := m.Stat(p)
		budget += st.Size
	}
	before := m.BytesRead()
	l = mustOpen(t, testDir, memOptions(m))
	if read := m.BytesRead() - before; read > budget {
		t.Fatalf("Open read %d bytes; index files and the active segment are %d", read, budget)
	}
	if l.Next() != 300 || l.Stats().Segments != segs {
		t.Fatalf("after reopen: Next %d, %d segments; want 300, %d", l.Next(), l.Stats().Segments, segs)
	}
	appendTestRecords(t, l, 300, 350)
	checkRecords(t, readAll(t, l), testRecords(0, 350))
	mustClose(t, l)

	l = mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	checkRecords(t, readAll(t, l), testRecords(0, 350))
}

func TestIndexFilesRebuilt(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	appendTestRecords(t, l, 0, 300)
	mustClose(t, l)
	idx := segmentFiles(t, m, testDir, indexExt)
	if len(idx) < 4 {
		t.Fatalf("only %d index files", len(idx))
	}
	good, _ := m.ReadFile(idx[2])
	m.Remove(idx[0])
	m.FlipByte(idx[1], 60, 0x01)   // checksum fails
	m.WriteFile(idx[2], good[:20]) // cut short
	m.WriteFile(idx[3], good)      // a valid index of another segment
	m.SyncDir(testDir)

	l = mustOpen(t, testDir, memOptions(m))
	checkRecords(t, readAll(t, l), testRecords(0, 300))
	for i := 0; i < 300; i++ {
		checkRecords(t, mustRead(t, l, uint64(i), 1, 0), testRecords(i, i+1))
	}
	mustClose(t, l)
	for _, p := range idx[:4] {
		b, _ := m.ReadFile(p)
		if _, err := decodeIndex(b); err != nil {
			t.Fatalf("%s not rewritten: %v", p, err)
		}
	}
	if string(mustReadFile(t, m, idx[2])) != string(good) {
		t.Fatal("rebuilt index differs from the one written at roll")
	}
}

func mustReadFile(t testing.TB, m *vfs.Mem, p string) []byte {
	t.Helper()
	b, err := m.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRecordTooLarge(t *testing.T) {
	m := vfs.NewMem()
	opts := memOptions(m)
	opts.MaxRecordBytes = 100
	l := mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	fits := Record{Value: make([]byte, 100-frameOverhead)}
	mustAppend(t, l, fits)
	_, err := l.Append([]Record{fits, {Value: make([]byte, 101-frameOverhead)}})
	wantErr(t, err, ErrRecordTooLarge)
	if l.Next() != 1 {
		t.Fatalf("a refused batch was partly written: Next %d", l.Next())
	}
	// A record larger than a whole segment gets a segment of its own.
	opts.MaxRecordBytes = 4096
	l2 := mustOpen(t, "/data/p1", opts)
	defer mustClose(t, l2)
	big := Record{Value: make([]byte, 3000)}
	mustAppend(t, l2, Record{}, big, Record{}, big)
	checkRecords(t, mustRead(t, l2, 0, 10, 1), []Record{{Offset: 0, Value: []byte{}}})
	if got := len(mustRead(t, l2, 0, 10, 1<<20)); got != 4 {
		t.Fatalf("read %d records, want 4", got)
	}
}

func TestClosedLog(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	mustAppend(t, l, Record{Value: []byte("x")})
	mustClose(t, l)
	_, err := l.Append([]Record{{}})
	wantErr(t, err, ErrClosed)
	_, err = l.Read(0, 1, 1)
	wantErr(t, err, ErrClosed)
	_, err = l.OffsetForTime(0)
	wantErr(t, err, ErrClosed)
	_, err = l.DeleteBefore(1)
	wantErr(t, err, ErrClosed)
	wantErr(t, l.Close(), ErrClosed)
	if l.Next() != 1 {
		t.Fatalf("Next after Close = %d", l.Next())
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, o := range []Options{
		{SegmentBytes: maxSegmentBytes + 1},
		{MaxRecordBytes: maxRecordLimit + 1},
		{MaxRecordBytes: frameOverhead - 1},
	} {
		o.FS = vfs.NewMem()
		if _, err := Open(testDir, o); err == nil {
			t.Fatalf("Open accepted %+v", o)
		}
	}
}

func TestOSFileSystem(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentBytes: 2048, IndexIntervalBytes: 256}
	l := mustOpen(t, dir, opts)
	appendTestRecords(t, l, 0, 200)
	mustClose(t, l)
	l = mustOpen(t, dir, opts)
	defer mustClose(t, l)
	checkRecords(t, readAll(t, l), testRecords(0, 200))
	if _, err := l.Read(0, 1, 1); errors.Is(err, ErrCorrupt) {
		t.Fatal(err)
	}
}

// TestTimestampFloorOutlivesRetention: a log whose every record aged out and was
// removed, killed and reopened with its clock behind the last stamp, still never
// stamps a record older than one it handed out (the kill loop found the stamps of a
// partition going back an hour after a clock step back).
func TestTimestampFloorOutlivesRetention(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	mustAppend(t, l, Record{Timestamp: 5000, Value: []byte("a")})
	if err := l.Roll(); err != nil {
		t.Fatal(err)
	}
	if n, err := l.DeleteOlderThan(6000); err != nil || n != 1 {
		t.Fatalf("retention removed %d records: %v", n, err)
	}
	m.Crash() // killed: the log is never closed
	l2 := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l2)
	mustAppend(t, l2, Record{Timestamp: 10, Value: []byte("b")})
	recs := mustRead(t, l2, 1, 1, 1<<20)
	if len(recs) != 1 || recs[0].Timestamp < 5000 {
		t.Fatalf("after every record aged out and a kill, a record stamped 10 was stored as %+v; want a timestamp of at least 5000, the newest one handed out", recs)
	}
}
