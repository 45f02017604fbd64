package wal

import (
	"bytes"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestAPayloadOfAnEarlierUseIsNotReadAsARecord: a reused write-ahead file holds the
// bytes of its earlier use behind the new records, and those bytes are mostly the
// producers' message bodies (a span's data is the segment frame, the body in it
// verbatim). A body can hold a well-formed record: its CRC is computable, and its
// path may name any file under the data directory (another tenant's segment, a queue
// checkpoint). Only its sequence number must match the new use's, and that was
// predictable: a node's n-th start began its uses at n·2^40, counting up by one a
// file. A producer who laid such a record where the new use's records would end
// (the record sizes are its own to choose on a quiet node) got its bytes written
// into that file by the replay after a crash. Each start begins its uses at a random
// distance above the floor now, which the producer cannot know.
func TestAPayloadOfAnEarlierUseIsNotReadAsARecord(t *testing.T) {
	m := vfs.NewMem()
	dataFile(t, m, "t/other.log")
	if err := m.WriteFile(filepath.Join(root, "t/other.log"), []byte("mine.")); err != nil {
		t.Fatal(err)
	}
	// The first start of a new directory: its first use has sequence 0, the floor it
	// leaves is 2^40, so the second start's first use is (was) 2^40.
	w, _ := open(t, m, 0)
	v := dataFile(t, m, "t/victim.log")
	fake := forgedRecord(seqLease, "t/other.log", 0, []byte("PWNED"))
	write(t, w, v, "t/victim.log", 0, fake) // a producer's message, as far as the WAL knows
	// Where the forged record lies in the file: after the header and the real
	// record's own header, path and offset.
	at := headerLen + recHeaderLen + 2 + len("t/victim.log") + 8
	if err := w.Close(); err != nil { // a clean stop: the file is free, its bytes stay
		t.Fatal(err)
	}
	// The second start reuses the file. One commit whose record ends exactly where the
	// forged record begins (26 bytes of framing, a 7-byte path, the rest data).
	w, _ = open(t, m, 0)
	x := dataFile(t, m, "t/x.log")
	write(t, w, x, "t/x.log", 0, bytes.Repeat([]byte{'x'}, at-headerLen-26-len("t/x.log")))
	m.Crash()
	open(t, m, 0)
	if got := string(content(t, m, "t/other.log")); got != "mine." {
		t.Fatalf("other.log = %q: a message body of an earlier use was replayed as a record into another file", got)
	}
}

// forgedRecord builds a well-formed record as a producer could, inside a message body.
func forgedRecord(seq uint64, rel string, off int64, data []byte) []byte {
	b := appendRecord(nil, seq, rel, off, data)
	le.PutUint32(b[4:], crc32.Checksum(b[8:], castagnoli))
	return b
}

// TestEveryStartBeginsAboveTheLastOne: the random start of each life's uses stays
// above every sequence used before (the floor) and leaves room for the life's uses
// below the floor it writes.
func TestEveryStartBeginsAboveTheLastOne(t *testing.T) {
	m := vfs.NewMem()
	prev := uint64(0)
	for i := range 20 {
		w, _ := open(t, m, 0)
		f, err := m.OpenFile(filepath.Join(walDir, seqName), os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 8)
		if _, err := f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		floor := le.Uint64(b)
		seq := w.cur.seq
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if i > 0 && seq <= prev {
			t.Fatalf("start %d began at %d, not above the last start's %d", i, seq, prev)
		}
		if floor < seq+seqLease/2 {
			t.Fatalf("start %d began at %d under a floor of %d: too little room for its uses", i, seq, floor)
		}
		prev = seq
	}
}

// TestARecordNeverNamesAFileOutsideTheRoot: a record whose path climbs out of the data
// directory past its first element ("t/../../x") is not a record: the replay would
// write into a file outside the data directory. (Commit never writes one; only a
// forged record could.)
func TestARecordNeverNamesAFileOutsideTheRoot(t *testing.T) {
	for _, rel := range []string{"t/../../outside", "../outside", "/etc/outside", "t/../.."} {
		rec := forgedRecord(7, rel, 0, []byte("x"))
		if _, _, _, _, ok := decodeRecord(rec, 7); ok {
			t.Errorf("a record naming %q decodes", rel)
		}
	}
	if _, _, _, _, ok := decodeRecord(forgedRecord(7, "t/a/../b.log", 0, []byte("x")), 7); !ok {
		t.Error("a record naming a file under the root does not decode")
	}
}
