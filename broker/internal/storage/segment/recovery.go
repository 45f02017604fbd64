package segment

import (
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// The recovery point is the log's note of how far its active segment was durable at a
// moment it knew that: after a group's fsync and before its answers, at most once per
// Options.RecoveryPointEvery, and at Close. Recovery cuts the active segment at its
// first bad frame only when that frame lies past the recovery point; before it, bytes
// that fail their checks held acknowledged records, so they are damage: their offsets
// stay taken and are reported, never reused. README.md has the byte layout.
//
// The file has two slots written in turn, each with its own CRC, so a torn write of
// one slot leaves the other. A missing or unreadable file only means less is known:
// recovery then cuts at the first bad frame that no valid frame follows, as logs
// written before the recovery point existed always did.
const (
	recoveryName  = "recovery-point"
	recoveryMagic = "NRDRCP\x00\x01"
	recoveryLen   = 36 // magic, base, next, size, CRC-32C
	// recoveryExtLen is a slot with its extension: the log's newest timestamp and a
	// CRC-32C of the whole 44 bytes before it. Binaries that predate it read the first
	// 36 bytes only; a slot without a valid extension carries no timestamp.
	recoveryExtLen = 48
	recoverySlot   = 64 // the second slot's position
	// defaultRecoveryEvery bounds how much of the active segment recovery cannot tell
	// from a torn write: what was appended since the last recovery point.
	defaultRecoveryEvery = time.Second
)

type recoveryPoint struct {
	base, next uint64 // the active segment's base offset and its next offset
	size       int64  // its durable size in bytes
	// lastTS is the newest timestamp the log had stamped when the point was written
	// (hasTS: the slot carried it). It outlives the records: once retention removed
	// every record, it is the only note of the floor new records must not go below.
	lastTS int64
	hasTS  bool
}

func encodeRecoveryPoint(rp recoveryPoint) []byte {
	b := make([]byte, recoveryExtLen)
	copy(b, recoveryMagic)
	le.PutUint64(b[8:], rp.base)
	le.PutUint64(b[16:], rp.next)
	le.PutUint64(b[24:], uint64(rp.size))
	le.PutUint32(b[32:], crc32.Checksum(b[:32], castagnoli))
	le.PutUint64(b[36:], uint64(rp.lastTS))
	le.PutUint32(b[44:], crc32.Checksum(b[:44], castagnoli))
	return b
}

func decodeRecoveryPoint(b []byte) (recoveryPoint, bool) {
	if len(b) < recoveryLen || string(b[:8]) != recoveryMagic || crc32.Checksum(b[:32], castagnoli) != le.Uint32(b[32:]) {
		return recoveryPoint{}, false
	}
	rp := recoveryPoint{base: le.Uint64(b[8:]), next: le.Uint64(b[16:]), size: int64(le.Uint64(b[24:]))}
	if rp.next < rp.base || rp.size < 0 || rp.size > maxSegmentBytes+maxRecordLimit {
		return recoveryPoint{}, false
	}
	if len(b) >= recoveryExtLen && crc32.Checksum(b[:44], castagnoli) == le.Uint32(b[44:]) {
		rp.lastTS, rp.hasTS = int64(le.Uint64(b[36:])), true
	}
	return rp, true
}

// newer reports whether a describes a later state of the log than b: offsets only
// grow, and within one segment so does its size.
func (a recoveryPoint) newer(b recoveryPoint) bool {
	if a.base != b.base {
		return a.base > b.base
	}
	return a.next > b.next || (a.next == b.next && a.size > b.size)
}

// readRecoveryPoint loads the newest valid slot of the recovery-point file, and picks
// the other slot for the next write so that a torn write never costs the newest one.
func (l *Log) readRecoveryPoint() {
	f, err := l.fs.OpenFile(filepath.Join(l.dir, recoveryName), os.O_RDONLY, 0)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }() // opened read-only
	b := make([]byte, recoverySlot+recoveryExtLen)
	n, err := f.ReadAt(b, 0)
	if err != nil && err != io.EOF {
		return
	}
	b = b[:n]
	for slot := 0; slot < 2; slot++ {
		at := slot * recoverySlot
		if at >= len(b) {
			break
		}
		if rp, ok := decodeRecoveryPoint(b[at:]); ok && (!l.rpValid || rp.newer(l.rp)) {
			l.rp, l.rpValid, l.rpSlot = rp, true, 1-slot
		}
	}
}

// writeRecoveryPoint records the active segment's durable end. It is an aid to
// recovery, not a promise to anyone, so a failure is counted and otherwise ignored.
// l.fileMu must be held, and the log must not have failed: after a failed write the
// durable state is unknown.
func (l *Log) writeRecoveryPoint() {
	l.rpAt = time.Now()
	if l.opts.NoSync || l.failErr != nil {
		return
	}
	active := l.segments[len(l.segments)-1]
	rp := recoveryPoint{base: active.base, next: active.next, size: active.size, lastTS: l.lastTS, hasTS: true}
	if l.rpValid && rp == l.rp {
		return
	}
	err := func() error {
		if l.rpFile == nil {
			path := filepath.Join(l.dir, recoveryName)
			f, err := l.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			created := err == nil
			if errors.Is(err, fs.ErrExist) {
				f, err = l.fs.OpenFile(path, os.O_RDWR, 0)
			}
			if err != nil {
				return err
			}
			l.rpFile = f
			if created {
				if err := l.syncDir(); err != nil {
					return err
				}
			}
		}
		if _, err := l.rpFile.WriteAt(encodeRecoveryPoint(rp), int64(l.rpSlot*recoverySlot)); err != nil {
			return err
		}
		l.stats.recoveryPoints.Add(1)
		return l.sync(l.rpFile)
	}()
	if err != nil {
		l.stats.recoveryErrors.Add(1)
		if l.rpFile != nil {
			_ = l.rpFile.Close() // writing it failed already (counted); the next open rescans
			l.rpFile = nil
		}
		return
	}
	l.rp, l.rpValid, l.rpSlot = rp, true, 1-l.rpSlot
}
