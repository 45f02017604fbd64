package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// The state file holds what must survive with the log but is not an entry: raft's
// HardState (term, vote, commit) and the compaction point (the index and term of the
// last entry compacted away, which raft still asks the term of). It has two slots,
// at byte 0 and byte slotStride, written in place in turn:
//
//	8 magic "NRDRST\x00\x01" | u64 sequence | u64 term | u64 vote | u64 commit |
//	u64 compact index | u64 compact term | u32 CRC-32C of the 56 bytes before it
//
// A slot is valid if its magic and CRC check out; of two valid slots the one with
// the higher sequence wins. A write never touches the slot that holds the newest
// durable state, so a write torn by a crash costs at most the state being written,
// which was not acknowledged. One pwrite and one fsync per durable change, against
// three syncs (file, rename, directory) for a rewrite by rename.
const (
	stateName  = "state"
	slotBytes  = 60
	slotStride = 512 // slots in different sectors, so one torn sector cannot hit both
)

var stateMagic = [8]byte{'N', 'R', 'D', 'R', 'S', 'T', 0, 1}

// persistentState is one slot's content.
type persistentState struct {
	seq                       uint64
	term, vote, commit        uint64
	compactIndex, compactTerm uint64
}

func encodeState(st persistentState) []byte {
	b := make([]byte, slotBytes)
	copy(b, stateMagic[:])
	for i, v := range []uint64{st.seq, st.term, st.vote, st.commit, st.compactIndex, st.compactTerm} {
		binary.LittleEndian.PutUint64(b[8+8*i:], v)
	}
	binary.LittleEndian.PutUint32(b[56:], crc32.Checksum(b[:56], castagnoli))
	return b
}

func decodeState(b []byte) (persistentState, bool) {
	if len(b) < slotBytes || [8]byte(b[:8]) != stateMagic || crc32.Checksum(b[:56], castagnoli) != binary.LittleEndian.Uint32(b[56:]) {
		return persistentState{}, false
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8+8*i:]) }
	return persistentState{seq: u(0), term: u(1), vote: u(2), commit: u(3), compactIndex: u(4), compactTerm: u(5)}, true
}

// stateFile is the open state file and which slot holds the newest durable state.
type stateFile struct {
	f       vfs.File
	name    string
	cur     persistentState // the newest state written (durable or not)
	durable int             // slot holding the newest durable state (-1: none yet)
	dirty   bool            // cur was written to slot written but not synced
	written int             // slot of the last write
}

// readState reads both slots. A file with no valid slot is an error unless it is
// empty or shorter than one slot (created, crashed before its first durable write).
func readState(f vfs.File, name string) (*stateFile, error) {
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	sf := &stateFile{f: f, name: name, durable: -1}
	buf := make([]byte, slotStride+slotBytes)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	buf = buf[:n]
	for slot := range 2 {
		at := slot * slotStride
		if len(buf) < at+slotBytes {
			continue
		}
		if st, ok := decodeState(buf[at : at+slotBytes]); ok && (sf.durable < 0 || st.seq > sf.cur.seq) {
			sf.cur, sf.durable = st, slot
		}
	}
	if sf.durable < 0 && size >= slotBytes {
		return nil, fmt.Errorf("%w: %s: neither state slot is valid", ErrCorrupt, name)
	}
	return sf, nil
}

// write puts st in the slot that does not hold the newest durable state and returns
// where it wrote and what. The caller makes that durable when st must be, and then
// calls synced.
func (sf *stateFile) write(st persistentState) (int64, []byte, error) {
	st.seq = sf.cur.seq + 1
	slot := 0
	if sf.durable == 0 {
		slot = 1
	}
	b, off := encodeState(st), int64(slot*slotStride)
	if _, err := sf.f.WriteAt(b, off); err != nil {
		return 0, nil, err
	}
	sf.cur, sf.dirty, sf.written = st, true, slot
	return off, b, nil
}

// synced records that the last write is durable.
func (sf *stateFile) synced() {
	if sf.dirty {
		sf.durable, sf.dirty = sf.written, false
	}
}
