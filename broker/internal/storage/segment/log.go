// Package segment is Narad's append-only, per-partition log: CRC-framed records
// in segment files with a sparse offset index, group commit, crash recovery that
// cuts a torn tail and never serves a corrupt record, and retention by whole
// segments. The broker keeps message data in one Log per partition and, reusing
// the same type, a journal of settle commands. README.md is the on-disk spec and
// DESIGN.md explains the flows and invariants.
//
// Logs that share a vfs.SyncGroup (Options.Syncer) share one file-system sync per
// round. The log's throughput, read rates and recovery time are measured by make
// bench-storage and kept, dated, in docs/performance.md.
package segment

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// Options configures a Log. The zero value is usable.
type Options struct {
	FS                 vfs.FS // file system to use; nil means vfs.OS
	SegmentBytes       int64  // roll to a new segment file past this size; default 64 MiB, at most 2 GiB
	IndexIntervalBytes int    // one sparse index entry per this many bytes of records; default 4 KiB
	MaxRecordBytes     int    // largest encoded record accepted or read back; default 16 MiB, at most 1 GiB; never lower it on an existing log
	NoSync             bool   // skip every fsync; for tests and benchmarks only
	// RecoveryPointEvery is how often, at most, a group's append also records the
	// active segment's durable end in the recovery-point file (it is always recorded at
	// Close). Damage before that point is told from a torn write on Open; see README.md.
	// 0 means once a second; a negative value records it only at Close.
	RecoveryPointEvery time.Duration
	// Syncer, when set, makes segment data durable instead of a Sync of the file:
	// a vfs.SyncGroup shared by many logs lets one file-system sync serve them all.
	Syncer Syncer
	// WAL, when set, makes appended records durable by a commit to the node's
	// write-ahead file instead of a sync of the segment file (Syncer still serves
	// the index files and the recovery points of Close and retention; the periodic
	// one is written without a sync). The WAL must have replayed its records before
	// the log is opened.
	WAL Committer
}

// Committer makes spans written into data files durable; *wal.WAL is one.
type Committer interface {
	Commit(spans []wal.Span) error
	// SyncOwn runs sync, a sync of one of the log's files made outside the committer
	// (a truncate's, a new segment's), and is told of its failure (what names it):
	// the failure may be the one report of a lost write-back of bytes the committer
	// holds records of, which it must then keep, and a checkpoint must not free them
	// between the sync and the report (wal.WAL.SyncOwn).
	SyncOwn(what string, sync func() error) error
}

// Syncer makes a file's written data and size durable; *vfs.SyncGroup is one.
type Syncer interface {
	Sync(f vfs.File) error
}

const (
	defaultSegmentBytes  = 64 << 20
	defaultIndexInterval = 4 << 10
	defaultMaxRecord     = 16 << 20
	// Positions inside a segment are stored in 32 bits, and a segment holds at
	// most max(SegmentBytes, MaxRecordBytes) bytes.
	maxSegmentBytes = 2 << 30
	maxRecordLimit  = 1 << 30
	// maxGroupBytes stops one commit group from growing without bound while
	// appenders keep arriving; a single larger Append still goes in one group.
	maxGroupBytes = 8 << 20
	queueDepth    = 1024
)

func (o Options) withDefaults() (Options, error) {
	if o.FS == nil {
		o.FS = vfs.OS{}
	}
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = defaultSegmentBytes
	}
	if o.IndexIntervalBytes <= 0 {
		o.IndexIntervalBytes = defaultIndexInterval
	}
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = defaultMaxRecord
	}
	if o.RecoveryPointEvery == 0 {
		o.RecoveryPointEvery = defaultRecoveryEvery
	}
	switch {
	case o.SegmentBytes > maxSegmentBytes:
		return o, fmt.Errorf("segment: SegmentBytes %d above the limit of %d", o.SegmentBytes, maxSegmentBytes)
	case o.MaxRecordBytes > maxRecordLimit:
		return o, fmt.Errorf("segment: MaxRecordBytes %d above the limit of %d", o.MaxRecordBytes, maxRecordLimit)
	case o.MaxRecordBytes < frameOverhead:
		return o, fmt.Errorf("segment: MaxRecordBytes %d below the %d bytes of an empty record", o.MaxRecordBytes, frameOverhead)
	}
	return o, nil
}

// Log is one append-only log in one directory. All methods are safe for
// concurrent use. Appends are written by a single goroutine that commits
// everything queued behind an fsync together; reads never block appends for
// longer than it takes to copy a few fields.
type Log struct {
	dir  string
	fs   vfs.FS
	opts Options

	// mu guards the segment list and the fields of segments that readers see.
	mu       sync.RWMutex
	segments []*segment // oldest first; the last one is the active segment, never empty of a list
	closed   bool       // Close has released the files

	// fileMu is held by whoever changes files: the writer for each group,
	// retention, Roll, SetNext and Close. Only its holder changes the segment
	// list, so it may read the list without mu.
	fileMu  sync.Mutex
	failErr error  // set when a write or fsync failed; wraps ErrFailed
	lastTS  int64  // newest timestamp appended, for clamping
	wbuf    []byte // encoded frames of the group being committed
	chunks  []chunk
	spans   []wal.Span // the group's chunks, for a commit to Options.WAL
	pending []indexEntry

	// The recovery point and the flush point (recovery.go), guarded by fileMu.
	rp   pointFile
	fp   pointFile
	rpAt time.Time // last write of the recovery point

	// What Open found; set before the log is shared, read-only after.
	damage      []Damage
	tornBytes   int64
	cutSegments int // segment files removed past the flush point

	// sendMu orders Append's enqueue against Close closing the queue.
	sendMu     sync.RWMutex
	sendClosed bool
	queue      chan *request
	done       chan struct{} // closed when the writer goroutine exits

	stats struct {
		records, bytes, groups, syncs, indexErrors, recoveryErrors, recoveryPoints atomic.Uint64
	}
}

// Open opens the log in dir, creating dir and an empty log if needed. It
// recovers the last segment by cutting off a torn tail: bytes after the last
// valid record that no valid record follows and that lie past the recovery point.
// Records that fail their checks anywhere else are damage: their offsets stay
// taken, reads of them fail with ErrCorrupt, and Damaged reports them. Sealed
// segments are trusted through their index files and are scanned only when an
// index is missing or does not match.
func Open(dir string, opts Options) (*Log, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Log{
		dir:    dir,
		fs:     opts.FS,
		opts:   opts,
		lastTS: math.MinInt64,
		queue:  make(chan *request, queueDepth),
		done:   make(chan struct{}),
		rpAt:   time.Now(), // what Open found is on disk; the first point is due a period on
		rp:     pointFile{name: recoveryName},
		fp:     pointFile{name: flushName},
	}
	mkdir := vfs.MkdirAllSync // the directory's entry must be durable before any append is
	if opts.NoSync {
		mkdir = vfs.FS.MkdirAll
	}
	if err := mkdir(l.fs, dir, 0o700); err != nil {
		return nil, fmt.Errorf("segment: open %s: %w", dir, err)
	}
	if err := l.load(); err != nil {
		for _, s := range l.segments {
			_ = s.release() // the load error is the one to report
		}
		return nil, fmt.Errorf("segment: open %s: %w", dir, err)
	}
	for _, s := range l.segments {
		if s.next > s.base && !s.damaged { // a damaged segment's lastTS is only an upper bound
			l.lastTS = max(l.lastTS, s.lastTS)
		}
	}
	for _, pf := range []*pointFile{&l.rp, &l.fp} {
		if pf.valid && pf.rp.hasTS {
			// Retention may have removed the records that held the newest timestamps
			// (every record, in a log that aged out): the points keep the floor.
			l.lastTS = max(l.lastTS, pf.rp.lastTS)
		}
	}
	go l.run()
	return l, nil
}

// load builds the segment list from the directory.
func (l *Log) load() error {
	ents, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return err
	}
	l.readRecoveryPoint()
	var bases []uint64
	sizes := map[uint64]int64{}
	indexes := map[uint64]bool{}
	var stale []string
	for _, e := range ents {
		if e.IsDir {
			continue
		}
		if base, ok := parseSegmentName(e.Name, logExt); ok {
			bases = append(bases, base)
			sizes[base] = e.Size
		} else if base, ok := parseSegmentName(e.Name, indexExt); ok {
			indexes[base] = true
		} else if strings.HasSuffix(e.Name, tmpExt) || e.Name == flushName && !l.opts.NoSync {
			// A flush point describes the log as written without syncs of its own; a
			// log synced since is durable past it, and must never be cut there if it
			// is opened without syncs again.
			stale = append(stale, e.Name)
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })

	if len(bases) == 0 {
		s, err := l.createSegment(0)
		if err != nil {
			return err
		}
		l.segments = []*segment{s}
		return nil
	}
	for i := 0; i < len(bases)-1; i++ {
		base := bases[i]
		s, err := l.loadSealed(base, bases[i+1], sizes[base], indexes[base])
		if errors.Is(err, errCutHere) {
			// Torn past the flush point: this segment becomes the last one, and the
			// ones after it go (recoverActive cuts it).
			if err := l.removeAfter(bases[i+1:]); err != nil {
				return err
			}
			bases = bases[:i+1]
			break
		}
		if err != nil {
			return err
		}
		l.segments = append(l.segments, s)
		delete(indexes, base)
	}
	active, err := l.recoverActive(bases[len(bases)-1])
	if err != nil {
		return err
	}
	l.segments = append(l.segments, active)

	// A damaged segment's own newest timestamp is unknown; bound it by the
	// first timestamp after it so retention and OffsetForTime never act early.
	// With nothing after it yet, the bound waits for the first append (boundDamaged).
	for i, s := range l.segments {
		if s.damaged {
			s.validTS, s.lastTS = s.lastTS, math.MaxInt64
			if n := l.segments[i+1]; len(n.entries) > 0 {
				s.lastTS = max(n.entries[0].ts, s.validTS)
			}
		}
	}

	// Leftovers of interrupted index writes and retention runs, and any index
	// beside the active segment, describe nothing and would only mislead.
	for base := range indexes {
		stale = append(stale, segmentName(base, indexExt))
	}
	for _, name := range stale {
		if err := l.fs.Remove(filepath.Join(l.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if len(stale) > 0 {
		return l.syncDir()
	}
	return nil
}

// loadSealed loads a segment that is not the last one. Its records end where the
// next segment begins. Its index file is used if it matches; otherwise the
// segment is scanned and the index rewritten. A segment whose records do not all
// check out is kept, marked damaged: reads of its bad part fail with ErrCorrupt.
//
// Past the flush point of a log written without syncs of its own, the index is not
// trusted (it may have outlived the records it describes), and a segment whose
// records stop short of the next one at a bad frame there is torn: loadSealed
// returns errCutHere.
func (l *Log) loadSealed(base, next uint64, size int64, hasIndex bool) (*segment, error) {
	s := newSegment(l.dir, base)
	s.next, s.size = next, size
	cutAt := l.cutAt(base)
	if hasIndex && cutAt == math.MaxInt64 {
		if ix, err := l.readIndex(s); err == nil && ix.base == base && ix.next == next && ix.size == size {
			s.entries, s.lastTS, s.indexedAt = ix.entries, ix.lastTS, int64(ix.entries[len(ix.entries)-1].pos)
			return s, nil
		}
	}
	f, err := l.fs.OpenFile(s.path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	res, err := scanSegment(f, base, size, next, cutAt, &l.opts)
	_ = f.Close() // opened read-only to scan
	if err != nil {
		return nil, err
	}
	if (res.stop != nil || res.next != next) && res.size >= cutAt {
		return nil, errCutHere
	}
	s.entries, s.lastTS, s.indexedAt = res.entries, res.lastTS, res.indexedAt
	l.damage = append(l.damage, res.holes...)
	if res.next != next {
		s.damaged = true
		l.damage = append(l.damage, Damage{From: res.next, To: next})
	}
	// A segment with damage gets no index file: it is scanned, and its damage
	// reported, at every Open.
	s.holes = s.damaged || res.resynced
	if !s.holes {
		l.writeIndex(s)
	}
	return s, nil
}

// readIndex reads and checks the index file of s.
func (l *Log) readIndex(s *segment) (*indexFile, error) {
	f, err := l.fs.OpenFile(s.indexPath(), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // opened read-only
	n, err := f.Size()
	if err != nil {
		return nil, err
	}
	// An index holds at most one entry per record; anything larger is damage,
	// and must not make us allocate without bound.
	if n > indexHeader+indexTrailer+indexEntrySize*(s.size/frameOverhead+1) {
		return nil, errBadIndex
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil && err != io.EOF {
		return nil, err
	}
	return decodeIndex(b)
}

// recoverActive opens the last segment for appending. Bad bytes followed by valid
// records are damage (the scan keeps the offsets). Bad bytes at the end are cut off
// as a torn write, unless the recovery point says the segment was durable past
// them: then the offsets up to the recovery point are damage, kept and reported,
// and only what lies past it is cut.
func (l *Log) recoverActive(base uint64) (*segment, error) {
	s := newSegment(l.dir, base)
	f, err := l.fs.OpenFile(s.path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	s.f = f
	// Records a killed process wrote and never made durable stay in the page cache,
	// where the scan would take them for durable ones; appends after them through the
	// write-ahead file would not make them durable either, and a power loss would then
	// cut them and everything after. Only the active segment can hold such records (a
	// segment begins only after the one before it is durable), so it is made durable
	// before it is read (a log without syncs of its own skips this, as every sync).
	if err := l.sync(f); err != nil {
		_ = f.Close() // the sync error is the one to report
		return nil, err
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close() // the stat error is the one to report
		return nil, err
	}
	res, err := scanSegment(f, base, size, math.MaxUint64, l.cutAt(base), &l.opts)
	if err != nil {
		_ = f.Close() // the scan error is the one to report
		return nil, err
	}
	l.damage = append(l.damage, res.holes...)
	keep, next := res.size, res.next
	s.holes = res.resynced
	pt := &l.rp
	if l.fp.valid {
		pt = &l.fp // a log written without syncs of its own: durable as far as its last Flush
	}
	if rp := pt.rp; pt.valid && rp.base == base && rp.size > res.size && rp.next > res.next &&
		rp.next-res.next <= uint64(rp.size-res.size)/frameOverhead {
		// Synced and acknowledged: a damaged tail, not a torn one. A file cut below the
		// recovery point is extended with zeros, which read as damage too.
		l.damage = append(l.damage, Damage{From: res.next, To: rp.next})
		keep, next = rp.size, rp.next
		s.holes = true
		res.indexedAt = forceIndexEntry
	} else if keep < size {
		l.tornBytes = size - keep
	}
	if keep != size {
		if err = f.Truncate(keep); err == nil {
			err = l.sync(f)
			if l.opts.NoSync {
				// Synced even in a log without syncs of its own: a cut at its flush
				// point must not come undone, leaving old records past the new ones.
				err = f.Sync()
			}
		}
		if err != nil {
			_ = f.Close() // the create or sync error is the one to report
			return nil, err
		}
	}
	s.next, s.size, s.lastTS, s.entries, s.indexedAt = next, keep, res.lastTS, res.entries, res.indexedAt
	return s, nil
}

// errCutHere is loadSealed's answer for a segment torn past the flush point.
var errCutHere = errors.New("segment: torn past the flush point")

// removeAfter removes the segment files at bases, and their index files, durably:
// they lie past a cut at the flush point, so nothing in them was ever durable.
func (l *Log) removeAfter(bases []uint64) error {
	for _, b := range bases {
		for _, name := range []string{segmentName(b, logExt), segmentName(b, indexExt)} {
			if err := l.fs.Remove(filepath.Join(l.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		l.cutSegments++
	}
	return l.fs.SyncDir(l.dir)
}

// createSegment creates the empty file of a new active segment, durably.
func (l *Log) createSegment(base uint64) (*segment, error) {
	s := newSegment(l.dir, base)
	f, err := l.fs.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	s.f = f
	failpoint.Inject(failpoint.SegmentRollCreated)
	if err := l.syncDir(); err != nil {
		_ = f.Close()           // the directory sync error is the one to report
		_ = l.fs.Remove(s.path) // an empty segment; recovery removes it if this fails
		return nil, err
	}
	return s, nil
}

// writeIndex writes the index file of the sealed segment s. The index is a
// cache of what a scan would find: a failed write is counted, not fatal.
func (l *Log) writeIndex(s *segment) {
	b := encodeIndex(&indexFile{base: s.base, next: s.next, size: s.size, lastTS: s.lastTS, entries: s.entries})
	tmp := s.indexPath() + tmpExt
	err := func() error {
		f, err := l.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err = f.WriteAt(b, 0); err == nil {
			err = l.sync(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = l.fs.Rename(tmp, s.indexPath())
		}
		if err == nil {
			err = l.syncDir()
		}
		return err
	}()
	if err != nil {
		l.stats.indexErrors.Add(1)
		_ = l.fs.Remove(tmp) // a partial index; never renamed into place, and recovery rebuilds it
	}
}

func (l *Log) sync(f vfs.File) error {
	if l.opts.NoSync {
		return nil
	}
	sync := func() error {
		if l.opts.Syncer != nil {
			return l.opts.Syncer.Sync(f)
		}
		return f.Sync()
	}
	if l.opts.WAL != nil {
		return l.opts.WAL.SyncOwn("sync of a file of log "+l.dir, sync)
	}
	return sync()
}

func (l *Log) syncDir() error {
	if l.opts.NoSync {
		return nil
	}
	return l.fs.SyncDir(l.dir)
}

// Oldest returns the first offset still stored. It equals Next when the log holds
// no records.
func (l *Log) Oldest() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.segments[0].base
}

// Next returns one past the last durable record: the offset the next append
// gets.
func (l *Log) Next() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.segments[len(l.segments)-1].next
}

// segmentView is a reader's copy of a segment's fields, taken under Log.mu.
type segmentView struct {
	base, next uint64
	size       int64
	path       string
	entries    []indexEntry
}

// acquire finds the segment holding offset from and takes a reference on it. It
// returns a nil segment when from >= Next.
func (l *Log) acquire(from uint64) (*segment, segmentView, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return nil, segmentView{}, ErrClosed
	}
	segs := l.segments
	if from < segs[0].base {
		return nil, segmentView{}, fmt.Errorf("%w: offset %d is below the oldest offset %d", ErrOffsetOutOfRange, from, segs[0].base)
	}
	if from >= segs[len(segs)-1].next {
		return nil, segmentView{}, nil
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > from }) - 1
	s, v := take(segs[i])
	return s, v, nil
}

// take takes a reference on s and copies its fields; Log.mu must be held.
func take(s *segment) (*segment, segmentView) {
	s.refs.Add(1)
	return s, segmentView{base: s.base, next: s.next, size: s.size, path: s.path, entries: s.entries}
}

// reader returns a frameReader positioned at index entry e of the viewed segment.
func (l *Log) reader(s *segment, v *segmentView, e indexEntry) (*frameReader, error) {
	f, err := s.file(l.fs, v.path)
	if err == errSegmentGone {
		return nil, fmt.Errorf("%w: segment %d was deleted", ErrOffsetOutOfRange, v.base)
	}
	if err != nil {
		return nil, err
	}
	return &frameReader{f: f, end: v.size, pos: int64(e.pos), off: v.base + uint64(e.rel), max: l.opts.MaxRecordBytes, fresh: true}, nil
}

// seek returns the index entry to start from for rel, or the segment start when
// no entry lies at or before rel (a segment whose first records are damaged).
func (v *segmentView) seek(rel uint64) indexEntry {
	if len(v.entries) == 0 || uint64(v.entries[0].rel) > rel {
		return indexEntry{}
	}
	return seekOffset(v.entries, rel)
}

// Read returns up to maxRecords consecutive records starting at offset from,
// stopping before the total encoded size would pass maxBytes but always
// returning at least one record when one is available. It returns
// ErrOffsetOutOfRange when from < Oldest, and nil, nil when from >= Next. Only
// durable records are returned. Records' Key and Value share a few buffers owned
// by the caller. When a corrupt record is met after some good ones, the good ones
// are returned and the next Read, starting at the corrupt record, fails with
// ErrCorrupt; a corrupt record is never skipped.
func (l *Log) Read(from uint64, maxRecords, maxBytes int) ([]Record, error) {
	maxRecords = max(maxRecords, 1)
	var out []Record
	used := 0
	for {
		s, v, err := l.acquire(from)
		if err != nil || s == nil {
			if len(out) > 0 {
				return out, nil
			}
			return nil, err
		}
		var full bool
		out, used, full, err = l.readSegment(s, &v, from, out, used, maxRecords, maxBytes)
		_ = s.release() // a read reference; the data it covered was synced when written
		switch {
		case err != nil && len(out) > 0:
			return out, nil
		case err != nil:
			return nil, err
		case full:
			return out, nil
		}
		from = v.next
	}
}

// readSegment appends records from one segment to out until the segment ends or
// a limit is reached (full).
func (l *Log) readSegment(s *segment, v *segmentView, from uint64, out []Record, used, maxRecords, maxBytes int) ([]Record, int, bool, error) {
	e := v.seek(from - v.base)
	r, err := l.reader(s, v, e)
	if err != nil {
		return out, used, false, err
	}
	avg := max(v.size/int64(v.next-v.base), 1)
	if out == nil {
		out = make([]Record, 0, min(maxRecords, max(maxBytes, 0)/int(avg)+1, 1024))
	}
	for r.off < v.next {
		// Size reads by what the limits still allow, so a small read does not
		// pull a large chunk of the file and a large one needs few reads.
		want := min(int64(maxRecords-len(out))*avg, int64(max(maxBytes-used, 0))) + avg
		if r.off < from {
			want += int64(from-r.off) * avg
		}
		r.chunk = int(min(max(want, 512), 4<<20))
		rec, n, err := r.next()
		var ferr *frameError
		if err != nil && r.off < from && errors.As(err, &ferr) {
			// A damaged record lies between the index entry and the one wanted: look
			// past it, so one bad record does not hide its neighbours.
			found, rerr := r.resync(from)
			if rerr != nil {
				// The look past failed to read: the record wanted may be fine, so this
				// must not read as damage (callers skip damaged records for good).
				return out, used, false, fmt.Errorf("%s reading past damage at offset %d: %w", v.path, r.off, rerr)
			}
			if found {
				continue
			}
		}
		if err != nil {
			if err == io.EOF {
				err = corrupt("segment ends at byte %d before offset %d", r.pos, r.off)
			}
			return out, used, false, fmt.Errorf("%s at offset %d: %w", v.path, r.off, err)
		}
		if rec.Offset < from {
			continue
		}
		if len(out) > 0 && used+n > maxBytes {
			return out, used, true, nil
		}
		out = append(out, rec)
		used += n
		if len(out) >= maxRecords {
			return out, used, true, nil
		}
	}
	return out, used, false, nil
}

// OffsetForTime returns the first offset whose record's timestamp is >= ts, or
// Next when there is none.
func (l *Log) OffsetForTime(ts int64) (uint64, error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return 0, ErrClosed
	}
	segs := l.segments
	n := len(segs)
	if last := segs[n-1]; last.next == last.base {
		n-- // the empty active segment has no timestamp
	}
	i := sort.Search(n, func(i int) bool { return segs[i].lastTS >= ts })
	if i == n {
		next := segs[len(segs)-1].next
		l.mu.RUnlock()
		return next, nil
	}
	s, v := take(segs[i])
	l.mu.RUnlock()
	defer func() { _ = s.release() }() // a read reference; the data was synced when written

	e := indexEntry{}
	if len(v.entries) > 0 {
		e = seekTime(v.entries, ts)
	}
	r, err := l.reader(s, &v, e)
	if err != nil {
		return 0, err
	}
	r.fresh, r.chunk = false, 2*l.opts.IndexIntervalBytes
	for r.off < v.next {
		rec, _, err := r.next()
		var ferr *frameError
		if errors.As(err, &ferr) {
			// A damaged record's time is unknown, but the records after it still
			// order by time: look past it.
			if found, rerr := r.resync(v.next - 1); rerr == nil && found {
				continue
			}
		}
		if err == io.EOF {
			err = corrupt("segment ends at byte %d before offset %d", r.pos, r.off)
		}
		if err != nil {
			return 0, fmt.Errorf("%s at offset %d: %w", v.path, r.off, err)
		}
		if rec.Timestamp >= ts {
			return rec.Offset, nil
		}
	}
	return v.next, nil
}

// Stats are counters of a Log since Open.
type Stats struct {
	Records          uint64 // records appended durably
	Bytes            uint64 // encoded bytes appended durably
	Groups           uint64 // commit groups: one write per segment touched, then an fsync
	Syncs            uint64 // fsyncs of segment data (a group that rolls a segment needs two)
	IndexWriteErrors uint64 // index files that could not be written (they are rebuilt on Open)
	// RecoveryPointErrors counts recovery-point writes that failed; recovery then
	// knows less about which bad bytes were acknowledged (see README.md).
	RecoveryPointErrors uint64
	RecoveryPoints      uint64 // recovery-point writes, each with its own fsync but the periodic ones under a WAL
	Segments            int    // segment files now
	SizeBytes           int64  // bytes of durable records in those files
	DamagedRecords      uint64 // records Open found damaged (see Damaged)
	TornBytes           int64  // bytes of a torn write Open cut off the active segment
	// CutSegments counts the segment files Open removed because they lay past a cut at
	// the flush point (a log written without syncs of its own; see recovery.go).
	CutSegments int
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	l.mu.RLock()
	n := len(l.segments)
	var size int64
	for _, s := range l.segments {
		size += s.size
	}
	l.mu.RUnlock()
	return Stats{
		SizeBytes:           size,
		Records:             l.stats.records.Load(),
		Bytes:               l.stats.bytes.Load(),
		Groups:              l.stats.groups.Load(),
		Syncs:               l.stats.syncs.Load(),
		IndexWriteErrors:    l.stats.indexErrors.Load(),
		RecoveryPointErrors: l.stats.recoveryErrors.Load(),
		RecoveryPoints:      l.stats.recoveryPoints.Load(),
		Segments:            n,
		DamagedRecords:      damagedCount(l.damage),
		TornBytes:           l.tornBytes,
		CutSegments:         l.cutSegments,
	}
}

// Damaged returns the runs of offsets whose records Open found damaged, oldest
// first. Their offsets stay taken and reading them fails with ErrCorrupt. Damage
// in a sealed segment whose index file was intact is not scanned for on Open; it
// shows when the record is read.
func (l *Log) Damaged() []Damage { return slices.Clone(l.damage) }

func damagedCount(ds []Damage) uint64 {
	n := uint64(0)
	for _, d := range ds {
		n += d.To - d.From
	}
	return n
}

// Close stops the log. Appends already queued are committed (or failed) before
// Close returns; later Appends, Reads and maintenance fail with ErrClosed. Reads
// in progress finish on files that stay open until they are done. A second Close
// returns ErrClosed.
func (l *Log) Close() error {
	l.sendMu.Lock()
	if l.sendClosed {
		l.sendMu.Unlock()
		return ErrClosed
	}
	l.sendClosed = true
	close(l.queue)
	l.sendMu.Unlock()
	<-l.done

	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	// Everything is durable now: a later Open can tell damage anywhere in the active
	// segment from a torn write.
	l.writeRecoveryPoint()
	l.rp.close()
	l.fp.close()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	var err error
	for _, s := range l.segments {
		if cerr := s.release(); err == nil {
			err = cerr
		}
	}
	return err
}

// usable reports why files may not be changed now; l.fileMu must be held.
func (l *Log) usable() error {
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return l.failErr
}
