package partition

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// FuzzCheckpoint opens a partition over an arbitrary queue.ckpt (after five messages
// were written). Open must either refuse with an error wrapping segment.ErrCorrupt or
// start with a frontier no further than the log's end; it must never panic or allocate
// what a length field claims without checking it.
func FuzzCheckpoint(f *testing.F) {
	good := func(frontier, journal uint64, ahead ...uint64) []byte {
		b := append([]byte("NQCK"), ckptVersion)
		b = binary.BigEndian.AppendUint64(b, frontier)
		b = binary.BigEndian.AppendUint64(b, journal)
		b = binary.BigEndian.AppendUint32(b, uint32(len(ahead)))
		for _, o := range ahead {
			b = binary.BigEndian.AppendUint64(b, o)
		}
		return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
	}
	f.Add(good(2, 0, 3))
	f.Add(good(9, 0))
	f.Add(good(0, 7))
	f.Add([]byte("NQCK\x01"))
	f.Add(append(good(1, 0)[:25], 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, ck []byte) {
		fs := vfs.NewMem()
		p := mustOpen(t, fs)
		for i := 0; i < 5; i++ {
			if _, err := p.Append([]segment.Record{{Value: []byte{byte(i)}}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.closeFiles(); err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile("/p/"+ckptName, ck); err != nil {
			t.Fatal(err)
		}
		q, err := Open(Options{Dir: "/p", FS: fs, Queue: testQueue})
		if err != nil {
			if !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("Open refused a checkpoint without saying it is corrupt: %v", err)
			}
			return
		}
		defer q.closeFiles()
		if st := q.Stats(); st.Frontier > st.End {
			t.Fatalf("frontier %d past the log end %d", st.Frontier, st.End)
		}
	})
}
