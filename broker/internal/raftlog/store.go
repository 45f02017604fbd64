// Package raftlog is the spike's raft LogStore and StableStore for one group: an
// append-only file of entries and a file of term and vote, both made durable through
// the node's shared vfs.SyncGroup, so many groups writing at once share one sync round.
//
// It is a measurement prototype (see docs/internals/replication.md): entries are also
// held in memory, the prefix a snapshot compacts is dropped from memory only, and the
// file is never rewritten. The build replaces it with a store on the segment format.
package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// ErrCorrupt is returned by Open when the state file has a damaged record before its
// end (a torn last record is dropped silently, as a crash leaves it).
var ErrCorrupt = errors.New("raftlog: corrupt record")

var (
	mh      = &codec.MsgpackHandle{}
	castagn = crc32.MakeTable(crc32.Castagnoli)
)

// Store is one group's log and stable store.
type Store struct {
	sync *vfs.SyncGroup

	mu      sync.RWMutex
	log     vfs.File
	logEnd  int64
	first   uint64     // index of entries[0]; 0 when empty
	entries []raft.Log // contiguous from first
	offsets []int64    // file offset of each entry's record
	state   vfs.File
	stEnd   int64
	kv      map[string][]byte
}

var (
	_ raft.LogStore          = (*Store)(nil)
	_ raft.StableStore       = (*Store)(nil)
	_ raft.MonotonicLogStore = (*Store)(nil)
)

// Open opens (creating) the store in dir, replaying both files. Records are
//
//	u32 body length, u32 CRC-32C of the body, body
//
// with a msgpack raft.Log as the body of a log record and u8 key length, key, value
// as the body of a state record.
func Open(dir string, sg *vfs.SyncGroup) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &Store{sync: sg, kv: map[string][]byte{}}
	var err error
	if s.log, s.logEnd, err = replay(filepath.Join(dir, "log"), func(body []byte, off int64) error {
		var l raft.Log
		if err := codec.NewDecoderBytes(body, mh).Decode(&l); err != nil {
			return err
		}
		if len(s.entries) > 0 && l.Index != s.first+uint64(len(s.entries)) {
			return fmt.Errorf("%w: index %d after %d", ErrCorrupt, l.Index, s.first+uint64(len(s.entries))-1)
		}
		if len(s.entries) == 0 {
			s.first = l.Index
		}
		s.entries = append(s.entries, l)
		s.offsets = append(s.offsets, off)
		return nil
	}); err != nil {
		return nil, err
	}
	if s.state, s.stEnd, err = replay(filepath.Join(dir, "state"), func(body []byte, _ int64) error {
		if len(body) < 1 || len(body) < 1+int(body[0]) {
			return ErrCorrupt
		}
		k := string(body[1 : 1+body[0]])
		s.kv[k] = append([]byte(nil), body[1+body[0]:]...)
		return nil
	}); err != nil {
		_ = s.log.Close() // the replay error is the one to report
		return nil, err
	}
	return s, nil
}

// replay reads every whole record of name, truncates a torn tail, and returns the
// file open for appending at its end.
func replay(name string, each func(body []byte, off int64) error) (vfs.File, int64, error) {
	f, err := vfs.OS{}.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, 0, err
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close() // the error above is the one to report
		return nil, 0, err
	}
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		_ = f.Close() // the error above is the one to report
		return nil, 0, err
	}
	var off int64
	for off+8 <= size {
		l := int64(binary.BigEndian.Uint32(buf[off:]))
		if off+8+l > size {
			break
		}
		body := buf[off+8 : off+8+l]
		if crc32.Checksum(body, castagn) != binary.BigEndian.Uint32(buf[off+4:]) {
			break
		}
		if err := each(body, off); err != nil {
			_ = f.Close() // the error above is the one to report
			return nil, 0, fmt.Errorf("%s at %d: %w", name, off, err)
		}
		off += 8 + l
	}
	if off < size {
		if err := f.Truncate(off); err != nil {
			_ = f.Close() // the error above is the one to report
			return nil, 0, err
		}
	}
	return f, off, nil
}

func appendRecord(dst, body []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	dst = binary.BigEndian.AppendUint32(dst, crc32.Checksum(body, castagn))
	return append(dst, body...)
}

// Close closes both files.
func (s *Store) Close() error {
	return errors.Join(s.log.Close(), s.state.Close())
}

// IsMonotonic tells raft the indexes only grow (a restore replaces the whole log).
func (s *Store) IsMonotonic() bool { return true }

// FirstIndex is the first index held, 0 when empty.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.entries) == 0 {
		return 0, nil
	}
	return s.first, nil
}

// LastIndex is the last index held, 0 when empty.
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.entries) == 0 {
		return 0, nil
	}
	return s.first + uint64(len(s.entries)) - 1, nil
}

// GetLog copies entry index into out, or returns raft.ErrLogNotFound.
func (s *Store) GetLog(index uint64, out *raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.entries) == 0 || index < s.first || index >= s.first+uint64(len(s.entries)) {
		return raft.ErrLogNotFound
	}
	*out = s.entries[index-s.first]
	return nil
}

// StoreLog stores one entry.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs appends entries, which must follow the last one, and returns once they are
// durable: the write is this group's, the sync is the node's round.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	var buf []byte
	for _, l := range logs {
		var body []byte
		if err := codec.NewEncoderBytes(&body, mh).Encode(l); err != nil {
			return err
		}
		buf = appendRecord(buf, body)
	}
	s.mu.Lock()
	if len(s.entries) > 0 && logs[0].Index != s.first+uint64(len(s.entries)) {
		s.mu.Unlock()
		return fmt.Errorf("raftlog: entry %d does not follow %d", logs[0].Index, s.first+uint64(len(s.entries))-1)
	}
	if _, err := s.log.WriteAt(buf, s.logEnd); err != nil {
		s.mu.Unlock()
		return err
	}
	off := s.logEnd
	for _, l := range logs {
		if len(s.entries) == 0 {
			s.first = l.Index
		}
		s.entries = append(s.entries, *l)
		s.offsets = append(s.offsets, off)
		off += 8 + int64(binary.BigEndian.Uint32(buf[off-s.logEnd:]))
	}
	s.logEnd = off
	s.mu.Unlock()
	return s.sync.Sync(s.log)
}

// DeleteRange removes [min, max]. A suffix (raft dropping a divergent tail) is cut
// from the file and synced before it returns; a prefix (compaction) is dropped from
// memory only in this prototype.
func (s *Store) DeleteRange(min, max uint64) error {
	s.mu.Lock()
	if len(s.entries) == 0 {
		s.mu.Unlock()
		return nil
	}
	last := s.first + uint64(len(s.entries)) - 1
	min = maxU(min, s.first)
	max = minU(max, last)
	if min > max {
		s.mu.Unlock()
		return nil
	}
	if max == last {
		cut := s.offsets[min-s.first]
		if err := s.log.Truncate(cut); err != nil {
			s.mu.Unlock()
			return err
		}
		s.logEnd = cut
		s.entries = s.entries[:min-s.first]
		s.offsets = s.offsets[:min-s.first]
		if len(s.entries) == 0 {
			s.first = 0
		}
		s.mu.Unlock()
		return s.sync.Sync(s.log)
	}
	if min == s.first {
		n := max - s.first + 1
		s.entries = append([]raft.Log(nil), s.entries[n:]...)
		s.offsets = append([]int64(nil), s.offsets[n:]...)
		s.first = max + 1
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return fmt.Errorf("raftlog: DeleteRange(%d, %d) is neither a prefix nor a suffix of [%d, %d]", min, max, s.first, last)
}

func minU(a, b uint64) uint64 {
	if a < b {
		return a
	}
	return b
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// Set stores key's value durably.
func (s *Store) Set(key, val []byte) error {
	if len(key) > 255 {
		return fmt.Errorf("raftlog: key of %d bytes", len(key))
	}
	body := append([]byte{byte(len(key))}, key...)
	body = append(body, val...)
	rec := appendRecord(nil, body)
	s.mu.Lock()
	if _, err := s.state.WriteAt(rec, s.stEnd); err != nil {
		s.mu.Unlock()
		return err
	}
	s.stEnd += int64(len(rec))
	s.kv[string(key)] = append([]byte(nil), val...)
	s.mu.Unlock()
	return s.sync.Sync(s.state)
}

// Get returns key's value; raft expects an error containing "not found" when unset.
func (s *Store) Get(key []byte) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.kv[string(key)]
	if !ok {
		return nil, errors.New("not found")
	}
	return v, nil
}

// SetUint64 stores a number.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns a number, 0 when unset.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil || len(v) != 8 {
		return 0, nil
	}
	return binary.BigEndian.Uint64(v), nil
}
