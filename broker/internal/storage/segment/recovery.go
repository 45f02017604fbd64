package segment

import (
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
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

// pointFile is a two-slot file of points (recovery.go's layout): the recovery point,
// or the flush point of a log written without syncs of its own.
type pointFile struct {
	name  string
	rp    recoveryPoint
	valid bool
	// synced: rp was synced when this run wrote it. A point read at open counts as
	// not synced (an earlier run may have left it in the page cache only).
	synced bool
	slot   int      // slot the next write goes to
	f      vfs.File // open once written
}

// read loads the newest valid slot of the file, and picks the other slot for the
// next write so that a torn write never costs the newest one.
func (pf *pointFile) read(fsys vfs.FS, dir string) {
	f, err := fsys.OpenFile(filepath.Join(dir, pf.name), os.O_RDONLY, 0)
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
		if rp, ok := decodeRecoveryPoint(b[at:]); ok && (!pf.valid || rp.newer(pf.rp)) {
			pf.rp, pf.valid, pf.slot = rp, true, 1-slot
		}
	}
}

// write writes rp to the file's next slot and makes it durable with sync, or leaves
// it unsynced when sync is nil (and, when it creates the file, makes the directory's
// entry durable with syncDir).
func (pf *pointFile) write(fsys vfs.FS, dir string, rp recoveryPoint, sync func(vfs.File) error, syncDir func() error) error {
	if pf.f == nil {
		path := filepath.Join(dir, pf.name)
		f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		created := err == nil
		if errors.Is(err, fs.ErrExist) {
			f, err = fsys.OpenFile(path, os.O_RDWR, 0)
		}
		if err != nil {
			return err
		}
		pf.f = f
		if created {
			if err := syncDir(); err != nil {
				return err
			}
		}
	}
	if _, err := pf.f.WriteAt(encodeRecoveryPoint(rp), int64(pf.slot*recoverySlot)); err != nil {
		return err
	}
	if sync != nil {
		if err := sync(pf.f); err != nil {
			return err
		}
	}
	pf.rp, pf.valid, pf.slot, pf.synced = rp, true, 1-pf.slot, sync != nil
	return nil
}

// close closes the file if it is open.
func (pf *pointFile) close() {
	if pf.f != nil {
		_ = pf.f.Close() // only a hint for the next open, whatever reached the disk
		pf.f = nil
	}
}

// readRecoveryPoint loads the recovery point, and the flush point of a log written
// without syncs of its own.
func (l *Log) readRecoveryPoint() {
	l.rp.read(l.fs, l.dir)
	if l.opts.NoSync {
		l.fp.read(l.fs, l.dir)
	}
}

// writeRecoveryPoint records the active segment's durable end. It is an aid to
// recovery, not a promise to anyone, so a failure is counted and otherwise ignored.
// l.fileMu must be held, and the log must not have failed: after a failed write the
// durable state is unknown.
func (l *Log) writeRecoveryPoint() { l.writePoint(true) }

// writePeriodicPoint is the recovery point a group's append writes once a period.
// With a write-ahead file it is written without a sync of its own: every byte it
// claims was committed to the write-ahead file before it was written, and the file
// replays into the segment before the log opens, so whatever version of the point a
// power loss leaves (this one, the previous slot's, or none) claims only bytes the
// segment holds again after the replay. The next checkpoint's syncfs usually makes it
// durable with the data files. Without that sync, a node of many partitions is spared
// one file-system-wide sync round per partition per second: at 256 partitions most of
// its writes to disk (docs/performance.md). The points written at Close and before
// retention removes the last records keep their sync: the one is the clean state,
// the other the only note of how far timestamps went.
func (l *Log) writePeriodicPoint() { l.writePoint(l.opts.WAL == nil) }

// writePoint writes the recovery point, synced if durable. A point equal to the newest
// one is skipped only when that one was synced or no sync is asked for: a point the
// periodic write left unsynced is written again, synced, when Close or retention
// needs it durable.
func (l *Log) writePoint(durable bool) {
	l.rpAt = time.Now()
	if l.opts.NoSync || l.failErr != nil {
		return
	}
	rp := l.activePoint()
	if l.rp.valid && rp == l.rp.rp && (l.rp.synced || !durable) {
		return
	}
	var sync func(vfs.File) error
	if durable {
		sync = l.sync
	}
	if err := l.rp.write(l.fs, l.dir, rp, sync, l.syncDir); err != nil {
		l.pointFailed(&l.rp)
		return
	}
	l.stats.recoveryPoints.Add(1)
}

// activePoint is the active segment's end, and the newest timestamp appended.
func (l *Log) activePoint() recoveryPoint {
	active := l.segments[len(l.segments)-1]
	return recoveryPoint{base: active.base, next: active.next, size: active.size, lastTS: l.lastTS, hasTS: true}
}

// pointFailed counts a failed write of a point file and closes it: the next write
// opens it again, and the next Open reads whichever slot is whole.
func (l *Log) pointFailed(pf *pointFile) {
	l.stats.recoveryErrors.Add(1)
	pf.close()
}

// The flush point: a log written without syncs of its own (Options.NoSync: a
// replica's, whose group replays its own log to write again whatever a power loss
// took) is durable only as far as its last Flush. Flush records how far in the
// flush-point file (the recovery point's layout), synced for real. Past that point
// nothing was ever durable, so a power loss may have torn any of it, in the middle
// as well as at the end, and later segment files with it: Open cuts the log at the
// first bad record past the flush point and removes the segments after it, instead
// of reporting damage that would set the whole replica aside. Before the flush point,
// bad bytes are damage as in any log. A log with no flush point yet (one written
// before Flush wrote it, or never flushed) is read as before.
const flushName = "flush-point"

// writeFlushPoint records, after a Flush made everything appended durable, how far
// that is. l.fileMu must be held. Unlike the recovery point it is a promise, not an
// aid: Open cuts the log past it. So a failure is returned, and Flush fails with it:
// its caller must not drop what could write the records past the old point again.
func (l *Log) writeFlushPoint() error {
	rp := l.activePoint()
	if l.fp.valid && rp == l.fp.rp {
		return nil
	}
	realSync := func(f vfs.File) error { return f.Sync() }
	if err := l.fp.write(l.fs, l.dir, rp, realSync, func() error { return l.fs.SyncDir(l.dir) }); err != nil {
		l.pointFailed(&l.fp)
		return err
	}
	return nil
}

// cutAt is the byte position in the segment at base from which a bad frame is torn,
// cut off with everything after it, rather than damage: past the flush point, in a
// log written without syncs of its own; math.MaxInt64 (never) elsewhere.
func (l *Log) cutAt(base uint64) int64 {
	fp := l.fp.rp
	switch {
	case !l.opts.NoSync || !l.fp.valid || base < fp.base:
		return math.MaxInt64
	case base == fp.base:
		return fp.size
	default:
		return 0
	}
}
