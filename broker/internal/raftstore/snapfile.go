package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// The snapshot file holds the latest referential snapshot: raft's snapshot metadata
// (index, term, ConfState) and the caller's small opaque data, never the state
// machine's data itself (that stays in the partition's message log and is streamed
// from there). Format:
//
//	8 magic "NRDRSN\x00\x01" | u32 length N | u32 CRC-32C of the payload | N bytes: marshalled raftpb.Snapshot
//
// It is replaced whole: written to snapshot.tmp, synced, renamed over snapshot, and
// the directory synced, so a crash leaves the old file or the new one.
const (
	snapName   = "snapshot"
	snapTmp    = "snapshot.tmp"
	snapHeader = 16
)

var snapMagic = [8]byte{'N', 'R', 'D', 'R', 'S', 'N', 0, 1}

// readSnapshot returns the stored snapshot, or an empty one if there is none.
func readSnapshot(fsys vfs.FS, dir string) (raftpb.Snapshot, error) {
	var snap raftpb.Snapshot
	name := filepath.Join(dir, snapName)
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return snap, nil
	}
	if err != nil {
		return snap, err
	}
	defer func() { _ = f.Close() }() // read-only; nothing to lose
	size, err := f.Size()
	if err != nil {
		return snap, err
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return snap, err
	}
	if len(b) < snapHeader || [8]byte(b[:8]) != snapMagic {
		return snap, fmt.Errorf("%w: %s: bad header", ErrCorrupt, name)
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if n != len(b)-snapHeader || crc32.Checksum(b[snapHeader:], castagnoli) != binary.LittleEndian.Uint32(b[12:]) {
		return snap, fmt.Errorf("%w: %s: length or CRC mismatch", ErrCorrupt, name)
	}
	if err := snap.Unmarshal(b[snapHeader:]); err != nil {
		return snap, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
	}
	return snap, nil
}

// writeSnapshot replaces the snapshot file durably.
func writeSnapshot(fsys vfs.FS, dir string, snap *raftpb.Snapshot, sync func(vfs.File) error) error {
	payload, err := snap.Marshal()
	if err != nil {
		return err
	}
	b := make([]byte, snapHeader+len(payload))
	copy(b, snapMagic[:])
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(payload, castagnoli))
	copy(b[snapHeader:], payload)
	tmp := filepath.Join(dir, snapTmp)
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		_ = f.Close() // the write error is the one to report
		return err
	}
	if err := sync(f); err != nil {
		_ = f.Close() // the sync error is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fsys.Rename(tmp, filepath.Join(dir, snapName)); err != nil {
		return err
	}
	return fsys.SyncDir(dir)
}
