package raftetcd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// Record types of the group's log file.
const (
	recHardState byte = 1
	recEntry     byte = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// wal is one group's append-only file of hard states and entries. Records are
//
//	u32 body length, u32 CRC-32C of the body, u8 type, protobuf body
//
// An entry record at index i replaces every entry at or after i (raft overwriting a
// divergent suffix), so replaying the file in order through MemoryStorage.Append gives
// the log raft last made durable. Durability comes from the node's shared sync round:
// many groups appending at once share one syncfs. It is a prototype: the file is never
// compacted (the build uses the segment format, see docs/internals/replication.md).
type wal struct {
	f    vfs.File
	end  int64
	sync *vfs.SyncGroup
	buf  []byte
}

// openWAL opens (creating) name and replays it: hs is the last hard state written,
// ents every entry record in order. A torn tail is cut, as a crash leaves it.
func openWAL(name string, sg *vfs.SyncGroup) (w *wal, hs raftpb.HardState, ents []raftpb.Entry, err error) {
	f, err := vfs.OS{}.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, hs, nil, err
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close() // the error being returned is the one to report
		return nil, hs, nil, err
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		_ = f.Close() // the error being returned is the one to report
		return nil, hs, nil, err
	}
	var off int64
	for off+9 <= size {
		l := int64(binary.BigEndian.Uint32(data[off:]))
		if l < 1 || off+8+l > size {
			break
		}
		body := data[off+8 : off+8+l]
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[off+4:]) {
			break
		}
		switch body[0] {
		case recHardState:
			if err := hs.Unmarshal(body[1:]); err != nil {
				_ = f.Close() // the error being returned is the one to report
				return nil, hs, nil, fmt.Errorf("%w: %s at %d: %v", ErrBadMessage, name, off, err)
			}
		case recEntry:
			var e raftpb.Entry
			if err := e.Unmarshal(body[1:]); err != nil {
				_ = f.Close() // the error being returned is the one to report
				return nil, hs, nil, fmt.Errorf("%w: %s at %d: %v", ErrBadMessage, name, off, err)
			}
			ents = append(ents, e)
		default:
			_ = f.Close() // the error being returned is the one to report
			return nil, hs, nil, fmt.Errorf("%w: %s at %d: record type %d", ErrBadMessage, name, off, body[0])
		}
		off += 8 + l
	}
	if off < size {
		if err := f.Truncate(off); err != nil {
			_ = f.Close() // the error being returned is the one to report
			return nil, hs, nil, err
		}
	}
	return &wal{f: f, end: off, sync: sg}, hs, ents, nil
}

// save appends hs (when not empty) and ents and returns once they are durable. It is
// called by the group's Ready loop only, so it needs no lock.
func (w *wal) save(hs raftpb.HardState, hasHS bool, ents []raftpb.Entry) error {
	w.buf = w.buf[:0]
	for i := range ents {
		w.buf = appendRecord(w.buf, recEntry, &ents[i])
	}
	if hasHS {
		w.buf = appendRecord(w.buf, recHardState, &hs)
	}
	if len(w.buf) == 0 {
		return nil
	}
	if _, err := w.f.WriteAt(w.buf, w.end); err != nil {
		return err
	}
	w.end += int64(len(w.buf))
	return w.sync.Sync(w.f)
}

type marshaler interface {
	Size() int
	MarshalTo([]byte) (int, error)
}

func appendRecord(dst []byte, typ byte, m marshaler) []byte {
	n := m.Size()
	start := len(dst)
	dst = append(dst, make([]byte, 9+n)...)
	body := dst[start+8:]
	body[0] = typ
	_, _ = m.MarshalTo(body[1:]) // sized above; gogo's MarshalTo cannot fail then
	binary.BigEndian.PutUint32(dst[start:], uint32(1+n))
	binary.BigEndian.PutUint32(dst[start+4:], crc32.Checksum(body, castagnoli))
	return dst
}

func (w *wal) close() error { return w.f.Close() }

// write appends like save but without waiting for a sync: for a hard state whose only
// change is the commit index, which raft can recover (etcd-io/raft's MustSync).
func (w *wal) write(hs raftpb.HardState, hasHS bool, ents []raftpb.Entry) error {
	w.buf = w.buf[:0]
	for i := range ents {
		w.buf = appendRecord(w.buf, recEntry, &ents[i])
	}
	if hasHS {
		w.buf = appendRecord(w.buf, recHardState, &hs)
	}
	if _, err := w.f.WriteAt(w.buf, w.end); err != nil {
		return err
	}
	w.end += int64(len(w.buf))
	return nil
}
