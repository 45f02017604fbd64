package segment

import (
	"bytes"
	"errors"
	"flag"
	"hash/crc32"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

var propertySeed = flag.Int64("segment.seed", 0, "seed for TestProperty; 0 picks one from the clock")

// model is what the log must hold: records[i] has offset oldest+i.
type model struct {
	oldest  uint64
	records []Record
	lastTS  int64
	// floor is the newest timestamp the log must still know with no record left
	// to hold it: retention records it before it removes a log's last records.
	floor int64
}

func (m *model) next() uint64 { return m.oldest + uint64(len(m.records)) }

// TestProperty runs random sequences of appends, reads, reopens, crashes,
// failed fsyncs, full disks, rolls and deletions against a model. The seed is
// printed; rerun a failure with -segment.seed=N.
func TestProperty(t *testing.T) {
	seed := *propertySeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with go test -run TestProperty -segment.seed=%d)", seed, seed)
	r := rand.New(rand.NewSource(seed))
	for run := 0; run < 8; run++ {
		runProperty(t, r, 400)
	}
}

func runProperty(t *testing.T, r *rand.Rand, steps int) {
	mem := vfs.NewMem()
	opts := Options{FS: mem, SegmentBytes: int64(300 + r.Intn(2000)), IndexIntervalBytes: 1 + r.Intn(400)}
	l := mustOpen(t, testDir, opts)
	defer func() { l.Close() }()
	md := &model{lastTS: math.MinInt64, floor: math.MinInt64}
	clock := int64(r.Intn(1000))

	randomBatch := func() []Record {
		recs := make([]Record, 1+r.Intn(6))
		for i := range recs {
			clock += int64(r.Intn(20)) - 5 // now and then a timestamp from the past
			recs[i] = Record{Timestamp: clock, Attrs: uint16(r.Intn(1 << 16))}
			switch r.Intn(3) {
			case 0:
				recs[i].Key = []byte{}
			case 1:
				recs[i].Key = randomBytes(r, 20)
			}
			recs[i].Value = randomBytes(r, 200)
			if r.Intn(30) == 0 {
				recs[i].Value = randomBytes(r, 3000) // larger than a segment
			}
		}
		return recs
	}
	accept := func(recs []Record) {
		for _, rec := range recs {
			ts := max(rec.Timestamp, md.lastTS)
			md.lastTS = ts
			md.records = append(md.records, Record{Offset: md.next(), Timestamp: ts, Key: rec.Key, Value: rec.Value, Attrs: rec.Attrs})
		}
	}
	reopen := func(crash bool) {
		if crash {
			mem.CrashTorn(r)
		}
		l.Close()
		l = mustOpen(t, testDir, opts)
		if len(md.records) == 0 {
			// With no record left, the floor comes from the recovery point: at least
			// what retention saved, at most what was stamped (a later recovery point,
			// written at a close or now and then by an append, may carry more).
			if l.lastTS < md.floor || l.lastTS > md.lastTS {
				t.Fatalf("empty log reopened with timestamp floor %d, want within [%d, %d]", l.lastTS, md.floor, md.lastTS)
			}
			md.lastTS = l.lastTS
		}
	}
	tryAppend := func() {
		recs := randomBatch()
		first, err := l.Append(recs)
		if err == nil {
			if first != md.next() {
				t.Fatalf("Append at %d, model next %d", first, md.next())
			}
			accept(recs)
			return
		}
		if !errors.Is(err, ErrFailed) && !errors.Is(err, ErrNoSpace) {
			t.Fatalf("a failed append returned %v, want ErrFailed or ErrNoSpace", err)
		}
		if got := l.Next(); got != md.next() {
			t.Fatalf("Next %d after a failed append, want %d", got, md.next())
		}
		mem.FailSync(0)
		mem.SetFreeSpace(-1)
		reopen(r.Intn(2) == 0)
	}

	for step := 0; step < steps; step++ {
		switch op := r.Intn(100); {
		case op < 40:
			tryAppend()
		case op < 62:
			checkRead(t, l, md, r)
		case op < 67:
			q := clock - int64(r.Intn(500))
			want := md.next()
			for _, rec := range md.records {
				if rec.Timestamp >= q {
					want = rec.Offset
					break
				}
			}
			if got, err := l.OffsetForTime(q); got != want || err != nil {
				t.Fatalf("OffsetForTime(%d) = %d, %v; want %d", q, got, err, want)
			}
		case op < 72:
			reopen(false)
		case op < 77:
			reopen(true)
		case op < 81:
			mem.FailSync(1 + r.Intn(3))
			tryAppend()
			mem.FailSync(0)
		case op < 84:
			mem.SetFreeSpace(int64(r.Intn(600)))
			tryAppend()
			mem.SetFreeSpace(-1)
		case op < 87:
			if err := l.Roll(); err != nil {
				t.Fatal(err)
			}
		case op < 94:
			x := md.oldest + uint64(r.Intn(len(md.records)+5))
			removed, err := l.DeleteBefore(x)
			if err != nil {
				t.Fatal(err)
			}
			dropTo(t, l, md, removed, max(x, md.oldest))
		case op < 97:
			cutoff := clock - int64(r.Intn(300))
			removed, err := l.DeleteOlderThan(cutoff)
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range md.records[:removed] {
				if rec.Timestamp >= cutoff {
					t.Fatalf("DeleteOlderThan(%d) removed offset %d of time %d", cutoff, rec.Offset, rec.Timestamp)
				}
			}
			dropTo(t, l, md, removed, md.next())
		default:
			if len(md.records) == 0 {
				n := md.next() + uint64(r.Intn(50))
				if err := l.SetNext(n); err != nil {
					t.Fatal(err)
				}
				md.oldest = n
			} else {
				wantErr(t, l.SetNext(md.next()+1), ErrNotEmpty)
			}
		}
		if l.Next() != md.next() || l.Oldest() != md.oldest {
			t.Fatalf("step %d: Oldest %d Next %d, model %d %d", step, l.Oldest(), l.Next(), md.oldest, md.next())
		}
	}
	checkRecords(t, readAll(t, l), md.records)
}

// dropTo applies a deletion of removed records to the model after checking it
// stayed within limit.
func dropTo(t *testing.T, l *Log, md *model, removed, limit uint64) {
	t.Helper()
	if md.oldest+removed > limit || removed > uint64(len(md.records)) {
		t.Fatalf("removed %d records from %d, past %d", removed, md.oldest, limit)
	}
	md.records = md.records[removed:]
	md.oldest += removed
	if removed > 0 && len(md.records) == 0 {
		md.floor = md.lastTS
	}
}

func checkRead(t *testing.T, l *Log, md *model, r *rand.Rand) {
	t.Helper()
	from := md.oldest + uint64(r.Intn(len(md.records)+4))
	if md.oldest > 0 && r.Intn(8) == 0 {
		from = md.oldest - 1
	}
	maxRecords, maxBytes := 1+r.Intn(30), r.Intn(3000)
	got, err := l.Read(from, maxRecords, maxBytes)
	switch {
	case from < md.oldest:
		wantErr(t, err, ErrOffsetOutOfRange)
		return
	case err != nil:
		t.Fatalf("Read(%d, %d, %d): %v", from, maxRecords, maxBytes, err)
	case from >= md.next():
		if got != nil {
			t.Fatalf("Read past Next returned %d records", len(got))
		}
		return
	}
	// The expected answer: as many as fit, but at least one.
	var want []Record
	used := 0
	for _, rec := range md.records[from-md.oldest:] {
		n := frameSize(&rec)
		if len(want) == maxRecords || (len(want) > 0 && used+n > maxBytes) {
			break
		}
		want = append(want, rec)
		used += n
	}
	checkRecords(t, got, want)
}

func randomBytes(r *rand.Rand, maxLen int) []byte {
	b := make([]byte, r.Intn(maxLen+1))
	r.Read(b)
	return b
}

// FuzzDecodeRecord feeds arbitrary bytes to the record decoder: it never
// panics, never accepts a frame whose CRC does not match, and what it accepts
// encodes back to the same bytes. The same input, read as a key and a value,
// must survive an encode and decode unchanged.
func FuzzDecodeRecord(f *testing.F) {
	for i := 0; i < 8; i++ {
		rec := testRecord(i)
		f.Add(appendFrame(nil, &rec, uint64(i), rec.Timestamp))
	}
	f.Add([]byte{})
	f.Add(make([]byte, frameOverhead))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxRecord = 1 << 16
		if len(data) > 256 {
			// Longer inputs reach no new code, and the fuzzer's minimizer, which
			// is quadratic in the input length, would crawl on them.
			return
		}
		rec, n, err := decodeRecord(data, maxRecord)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode error %v does not match ErrCorrupt", err)
			}
		} else {
			if n < frameOverhead || n > len(data) || n > maxRecord {
				t.Fatalf("decoded a frame of %d bytes from %d", n, len(data))
			}
			if sum := crc32Of(data[8:n]); sum != le.Uint32(data[4:]) {
				t.Fatalf("accepted a frame with checksum %08x, stored %08x", sum, le.Uint32(data[4:]))
			}
			if again := appendFrame(nil, &rec, rec.Offset, rec.Timestamp); !bytes.Equal(again, data[:n]) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, data[:n])
			}
		}

		in := Record{Value: data, Attrs: uint16(len(data))}
		if len(data) > 0 {
			split := int(data[0]) % len(data)
			in.Value = data[split:]
			if data[0]&1 == 1 {
				in.Key = data[:split]
			}
		}
		frame := appendFrame([]byte("prefix"), &in, uint64(len(data))*7, -int64(len(data)))[len("prefix"):]
		out, n, err := decodeRecord(append(frame, "trailing"...), 1<<30)
		if err != nil || n != len(frame) || !sameRecord(out, Record{Offset: uint64(len(data)) * 7, Timestamp: -int64(len(data)), Key: in.Key, Value: in.Value, Attrs: in.Attrs}) {
			t.Fatalf("round trip of %+v: %+v, %d, %v", in, out, n, err)
		}
	})
}

func crc32Of(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
