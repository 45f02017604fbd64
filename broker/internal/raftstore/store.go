// Package raftstore is the Raft log of one partition: it implements etcd-io/raft's
// raft.Storage over segment files of CRC'd entry records, and the write side a Ready
// loop needs (Save, Append, SetHardState, ApplySnapshot, CreateSnapshot, Compact).
//
// It does not reuse storage/segment, whose log is the partition's message log: that
// log's offsets only ever move forward and its recovery keeps damaged offsets rather
// than reusing them, while a Raft log must cut a divergent uncommitted suffix and
// write other entries at the same indexes. The record frame, file naming, torn-tail
// handling, shared sync rounds and whole-file compaction follow the segment log's
// habits; README.md is the on-disk format and the crash contract.
package raftstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// WAL is the node's write-ahead file (*wal.WAL): the store writes its frames and
// state slots into their files as before and commits them there instead of syncing
// the files.
type WAL interface {
	// Commit returns once spans already written into their files are durable.
	Commit(spans []wal.Span) error
	// Checkpoint makes every span committed so far durable in its file and frees
	// the write-ahead files that held them, so that none is replayed later.
	Checkpoint() error
	// SyncOwn runs sync, a sync of one of the store's files made outside the
	// write-ahead file, and is told of its failure (what names it): it may be the one
	// report of a lost write-back of bytes the write-ahead file holds records of,
	// which it must then keep, and a checkpoint must not free them between the sync
	// and the report (wal.WAL.SyncOwn).
	SyncOwn(what string, sync func() error) error
}

// Options tune a Store. The zero value is usable.
type Options struct {
	// FS is the file system; nil means vfs.OS{}.
	FS vfs.FS
	// Sync, when set, is the node's shared sync round: every fsync of a log or state
	// file goes through it, so partitions appending at once share one round.
	Sync *vfs.SyncGroup
	// WAL, when set, makes appends and state writes durable: each is committed to the
	// node's write-ahead file (one fdatasync of a preallocated file, shared with every
	// other log of the node) instead of syncing the segment or state file. Its Root
	// must hold the store's directory. Cuts, snapshot installs and directory changes
	// still sync directly. README.md says how a cut stays crash safe.
	WAL WAL
	// SegmentBytes is the size at which a new segment file is started (default 64
	// MiB, at most 2 GiB). A segment is the unit of compaction.
	SegmentBytes int64
	// CacheEntries and CacheBytes bound the recent entries kept in memory so that
	// Entries on the hot path (replicating to followers, applying) reads no file.
	// Defaults 4096 and 8 MiB; a negative value turns the cache off.
	CacheEntries int
	CacheBytes   int
	// MaxEntryBytes is the largest marshalled entry accepted (default 64 MiB);
	// recovery treats a longer frame length as damage.
	MaxEntryBytes int
}

func (o Options) withDefaults() (Options, error) {
	if o.FS == nil {
		o.FS = vfs.OS{}
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = 64 << 20
	}
	if o.SegmentBytes < 0 || o.SegmentBytes > 2<<30 {
		return o, fmt.Errorf("raftstore: SegmentBytes %d: want 1 B … 2 GiB", o.SegmentBytes)
	}
	if o.CacheEntries == 0 {
		o.CacheEntries = 4096
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = 8 << 20
	}
	if o.MaxEntryBytes == 0 {
		o.MaxEntryBytes = 64 << 20
	}
	if o.MaxEntryBytes < 0 || o.MaxEntryBytes > 1<<30 {
		return o, fmt.Errorf("raftstore: MaxEntryBytes %d: want 1 B … 1 GiB", o.MaxEntryBytes)
	}
	return o, nil
}

// Store is one Raft group's durable log, hard state and snapshot metadata in one
// directory. Reads (the raft.Storage methods) are safe concurrently with each other
// and with one writer; writes are serialised. What a read returns is durable:
// entries become visible only after the sync that made them durable returned.
type Store struct {
	dir  string
	opts Options
	fs   vfs.FS

	wmu sync.Mutex // held by writers (Save, Compact, snapshots, Close) across their I/O

	mu        sync.RWMutex // guards everything below; readers hold it across file reads
	files     []*segFile   // contiguous; the last one is the active segment
	first     uint64       // first index Entries may return; first-1 is the compaction point
	firstTerm uint64       // term of entry first-1
	last      uint64       // last durable index
	runs      []termRun    // terms of [first-1, last]; runs[0].index <= first-1
	cache     []raftpb.Entry
	cacheSize int
	hs        raftpb.HardState
	snap      raftpb.Snapshot
	state     *stateFile
	failed    error
	closed    bool
	stats     Stats
	diskReads atomic.Uint64
	buf       []byte
	span      [1]wal.Span
	// walSegs: spans of segment files may be in the WAL, waiting for its
	// checkpoint. A replay writes them back into the file at their path, so no
	// segment may be truncated or removed before they are checkpointed (forgetWAL).
	walSegs bool
}

// Stats counts what the store did since Open.
type Stats struct {
	Cuts        uint64 // divergent suffixes cut by Append
	CutEntries  uint64 // entries those cuts removed
	TornBytes   int64  // bytes of a torn last record cut on Open
	DiskReads   uint64 // Entries calls served from the segment files
	Compactions uint64 // segment files removed by Compact
}

var _ raft.Storage = (*Store)(nil)

// Open opens (creating) the store in dir and recovers it: a torn last record is cut,
// an interrupted cut, compaction or snapshot install is finished, and damage in
// records that were once whole is refused with ErrCorrupt naming file and offset.
func Open(dir string, opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	// Until recovery has read the segments, any of them may have records in the
	// write-ahead file (a store closed and opened again by the same process).
	s := &Store{dir: dir, opts: opts, fs: opts.FS, walSegs: opts.WAL != nil}
	if err := vfs.MkdirAllSync(s.fs, dir, 0o755); err != nil {
		return nil, err
	}
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, err
	}
	return s, nil
}

// sync makes f durable through the shared round when there is one.
func (s *Store) sync(f vfs.File) error {
	sync := func() error {
		if s.opts.Sync != nil {
			return s.opts.Sync.Sync(f)
		}
		return f.Sync()
	}
	if s.opts.WAL != nil {
		return s.opts.WAL.SyncOwn("sync of a file of Raft log "+s.dir, sync)
	}
	return sync()
}

// durable makes data, just written at off in f (the file at path), durable: a record
// in the write-ahead file when there is one, else a sync of f.
func (s *Store) durable(f vfs.File, path string, off int64, data []byte) error {
	if s.opts.WAL == nil {
		return s.sync(f)
	}
	s.span[0] = wal.Span{Path: path, Off: off, Data: data}
	err := s.opts.WAL.Commit(s.span[:])
	s.span[0] = wal.Span{}
	return err
}

// forgetWAL is called before a segment file is truncated or removed. A record of an
// earlier write to it, replayed after a crash, would put back the bytes the cut
// removed (or write them into a new segment of the same name): past new entries of a
// lower term they pass every frame check. So every record is checkpointed first:
// its bytes made durable in their file and the write-ahead files holding them freed.
// Cuts and snapshot installs are rare (they follow a leader change); a compaction
// needs none, since a compacted segment's name never comes back (every later segment
// starts past the compaction point).
func (s *Store) forgetWAL() error {
	if s.opts.WAL == nil || !s.walSegs {
		return nil
	}
	if err := s.opts.WAL.Checkpoint(); err != nil {
		return err
	}
	s.walSegs = false
	return nil
}

func (s *Store) recover() error {
	if err := s.fs.Remove(filepath.Join(s.dir, snapTmp)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// State file.
	stName := filepath.Join(s.dir, stateName)
	_, statErr := s.fs.Stat(stName)
	sf, err := s.fs.OpenFile(stName, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	s.state = &stateFile{f: sf, name: stName, durable: -1}
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := s.fs.SyncDir(s.dir); err != nil {
			return err
		}
	} else if err := s.sync(sf); err != nil {
		// A process killed after writing a term or vote and before its commit leaves
		// it in the page cache, where this start would read it as durable and hand it
		// to raft; a power loss later would take it back (a second vote in a term).
		// So what is read is made durable first, and read from the disk: after a
		// failed sync the kernel keeps the new bytes in clean pages the disk never
		// got, which no sync writes. (The file is two small slots.)
		return err
	} else if err := vfs.DropCache(sf); err != nil {
		return err
	}
	st, err := readState(sf, stName)
	if err != nil {
		return err
	}
	s.state = st
	s.hs = raftpb.HardState{Term: st.cur.term, Vote: st.cur.vote, Commit: st.cur.commit}
	if s.snap, err = readSnapshot(s.fs, s.dir); err != nil {
		return err
	}
	// Segments: scan them all, in order.
	infos, err := s.fs.ReadDir(s.dir)
	if err != nil {
		return err
	}
	var bases []uint64
	for _, fi := range infos {
		if b, ok := parseSegmentName(fi.Name); ok && !fi.IsDir {
			bases = append(bases, b)
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	var runs []termRun
	var prevTerm uint64
	for i, base := range bases {
		seg, r, err := s.openSegment(base, prevTerm, i == len(bases)-1)
		if err != nil {
			return err
		}
		if n := len(s.files); n > 0 && s.files[n-1].next() != base {
			return fmt.Errorf("%w: %s ends at index %d but the next segment is %s", ErrCorrupt,
				s.files[n-1].path, s.files[n-1].next()-1, seg.path)
		}
		s.files = append(s.files, seg)
		for _, run := range r.runs {
			if len(runs) == 0 || runs[len(runs)-1].term != run.term {
				runs = append(runs, run)
			}
		}
		prevTerm = r.lastTerm
	}
	// Where the log attaches: the compaction point from the state file, or the
	// snapshot if it is newer and the log does not reach it with the same term.
	c, ct := st.cur.compactIndex, st.cur.compactTerm
	sn, stm := s.snap.Metadata.Index, s.snap.Metadata.Term
	logFirst, logLast := uint64(0), uint64(0)
	if len(s.files) > 0 {
		logFirst, logLast = s.files[0].base, s.files[len(s.files)-1].next()-1
	}
	termOnDisk := func(i uint64) (uint64, bool) {
		if len(s.files) == 0 || i < logFirst || i > logLast {
			return 0, false
		}
		return termIn(runs, i), true
	}
	attaches := func(i, t uint64) bool {
		if len(s.files) == 0 {
			return false
		}
		if i+1 == logFirst {
			return true
		}
		got, ok := termOnDisk(i)
		return ok && got == t
	}
	keep := attaches(c, ct)
	if sn > c {
		if t, ok := termOnDisk(sn); !keep || !ok || t != stm {
			// A snapshot install that did not finish: finish it.
			c, ct = sn, stm
			keep = attaches(c, ct)
			if err := s.writeStateSync(persistentState{term: s.hs.Term, vote: s.hs.Vote, commit: s.hs.Commit, compactIndex: c, compactTerm: ct}); err != nil {
				return err
			}
		}
	}
	if !keep {
		// The files hold no entry after the compaction point that belongs to this
		// log (an interrupted snapshot install): start an empty log after it.
		if len(s.files) > 0 {
			if err := s.forgetWAL(); err != nil {
				return err
			}
		}
		if err := s.removeSegments(s.files, true); err != nil {
			return err
		}
		s.files = nil
		runs = nil
		seg, err := s.createSegment(c + 1)
		if err != nil {
			return err
		}
		s.files = []*segFile{seg}
	}
	s.first, s.firstTerm = c+1, ct
	s.last = s.files[len(s.files)-1].next() - 1
	// A segment with bytes may have records in the write-ahead file (a store closed
	// and opened again by the same process; a restart replays and frees them all
	// first). Empty ones have none: data directories are checkpointed before they
	// are removed, so a new directory starts with nothing in the WAL.
	s.walSegs = s.opts.WAL != nil && slices.ContainsFunc(s.files, func(f *segFile) bool { return f.size > 0 })
	if s.last < c {
		s.last = c
	}
	s.runs = trimRuns(runs, c, ct)
	// Finish a compaction a crash interrupted.
	if err := s.dropCompacted(); err != nil {
		return err
	}
	// Entries at or below the compaction point, and those the stored snapshot covers,
	// are committed (a snapshot is taken of applied entries only), but the commit
	// index stored may be below them: a commit-only change is not synced (see Save),
	// a caller may snapshot and compact entries it applied before the write carrying
	// their commit index was made, and a state file written before this version could
	// install a snapshot with the commit index of before it. Raise it: raft refuses to
	// start a node whose commit index is below its log's start or its applied index.
	s.hs.Commit = max(s.hs.Commit, c)
	if sn <= s.last {
		s.hs.Commit = max(s.hs.Commit, sn)
	}
	if s.hs.Commit > s.last {
		return fmt.Errorf("%w: %s: commit index %d is past the last stored entry %d", ErrCorrupt, stName, s.hs.Commit, s.last)
	}
	// Warm the cache with the newest entries.
	if s.opts.CacheEntries > 0 && s.last >= s.first {
		lo := max(s.first, s.last-min(s.last-s.first, uint64(s.opts.CacheEntries)-1))
		ents, err := s.readDisk(lo, s.last+1, uint64(s.opts.CacheBytes))
		if err != nil {
			return err
		}
		// readDisk stops at the byte bound from lo; keep the newest that fit.
		if n := uint64(len(ents)); lo+n-1 == s.last {
			s.cacheAppend(ents)
		}
	}
	return nil
}

// openSegment opens and scans one segment. A bad frame in the last segment with
// nothing valid after it is a torn write: it is cut. Any other bad frame is damage.
func (s *Store) openSegment(base, prevTerm uint64, isLast bool) (*segFile, scanResult, error) {
	path := segmentPath(s.dir, base)
	f, err := s.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, scanResult{}, err
	}
	seg := &segFile{base: base, path: path, f: f}
	if isLast {
		// Frames a killed process wrote and never committed stay in the page cache,
		// where the scan would take them for entries (raft could then report them to
		// its leader as stored) while a power loss would still drop them. Only the
		// last segment can hold such frames (a segment is created only after the one
		// before it is durable), so it is made durable before it is read.
		if err := s.sync(f); err != nil {
			_ = f.Close() // the error being returned is the one to report
			return nil, scanResult{}, err
		}
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close() // the error being returned is the one to report
		return nil, scanResult{}, err
	}
	r, err := scanSegment(f, path, base, size, s.opts.MaxEntryBytes, prevTerm)
	if err != nil {
		_ = f.Close() // the error being returned is the one to report
		return nil, r, err
	}
	if r.bad != "" {
		if !isLast || r.validAfter {
			_ = f.Close() // the error being returned is the one to report
			where := "valid records follow it"
			if !isLast {
				where = "in a sealed segment"
			}
			return nil, r, fmt.Errorf("%w: %s at offset %d (index %d): %s; %s", ErrCorrupt, path, r.end, base+uint64(len(r.pos)), r.bad, where)
		}
		if err := s.forgetWAL(); err != nil {
			_ = f.Close() // the error being returned is the one to report
			return nil, r, err
		}
		if err := f.Truncate(r.end); err != nil {
			_ = f.Close() // the error being returned is the one to report
			return nil, r, err
		}
		if err := s.sync(f); err != nil {
			_ = f.Close() // the error being returned is the one to report
			return nil, r, err
		}
		s.stats.TornBytes += size - r.end
	}
	seg.pos, seg.size = r.pos, r.end
	return seg, r, nil
}

// createSegment creates an empty segment file for entries from base on and makes
// its directory entry durable.
func (s *Store) createSegment(base uint64) (*segFile, error) {
	path := segmentPath(s.dir, base)
	f, err := s.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		_ = f.Close() // the error being returned is the one to report
		return nil, err
	}
	return &segFile{base: base, path: path, f: f}, nil
}

// removeSegments deletes segs' files one at a time, syncing the directory after each
// removal, so a crash leaves a contiguous run of segments (never a gap): from the end
// when backwards, from the start otherwise.
func (s *Store) removeSegments(segs []*segFile, backwards bool) error {
	order := slices.Clone(segs)
	if backwards {
		slices.Reverse(order)
	}
	for _, seg := range order {
		_ = seg.f.Close() // the file is going away; a close error changes nothing
		if err := s.fs.Remove(seg.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := s.fs.SyncDir(s.dir); err != nil {
			return err
		}
	}
	return nil
}

// dropCompacted removes the segments every entry of which is at or below the
// compaction point, oldest first; never the active one.
func (s *Store) dropCompacted() error {
	n := 0
	for n < len(s.files)-1 && s.files[n].next() <= s.first {
		n++
	}
	if n == 0 {
		return nil
	}
	gone := s.files[:n]
	s.mu.Lock()
	s.files = slices.Clone(s.files[n:])
	s.mu.Unlock()
	s.stats.Compactions += uint64(n)
	return s.removeSegments(gone, false)
}

// writeStateSync writes st to the state file and waits until it is durable.
func (s *Store) writeStateSync(st persistentState) error {
	off, b, err := s.state.write(st)
	if err != nil {
		return err
	}
	if err := s.durable(s.state.f, s.state.name, off, b); err != nil {
		if errors.Is(err, wal.ErrNotWritten) {
			// Nothing recorded: spoil the slot, so that a store opened again by
			// this process reads the other one, the newest durable state, rather
			// than a term or vote never made durable; with no durable state yet,
			// empty the file, which reads as a store never written. (Best effort.)
			if s.state.durable < 0 {
				_ = s.state.f.Truncate(0)
			} else {
				_, _ = s.state.f.WriteAt(make([]byte, len(b)), off)
			}
		}
		return err
	}
	s.state.synced()
	return nil
}

func termIn(runs []termRun, i uint64) uint64 {
	k := sort.Search(len(runs), func(k int) bool { return runs[k].index > i })
	if k == 0 {
		return 0
	}
	return runs[k-1].term
}

// trimRuns keeps the runs covering c on, with entry c's term set to ct.
func trimRuns(runs []termRun, c, ct uint64) []termRun {
	k := sort.Search(len(runs), func(k int) bool { return runs[k].index > c })
	out := []termRun{{index: c, term: ct}}
	for _, r := range runs[k:] {
		if r.term != out[len(out)-1].term {
			out = append(out, r)
		}
	}
	return out
}

// InitialState returns the saved HardState and the ConfState of the latest
// snapshot.
func (s *Store) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hs, s.snap.Metadata.ConfState, nil
}

// FirstIndex is the first index Entries may return.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.first, nil
}

// LastIndex is the last durable index (the compaction point if the log is empty).
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last, nil
}

// Term returns the term of entry i, for i in [FirstIndex()-1, LastIndex()]. It reads
// no file: terms are kept in memory as runs.
func (s *Store) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case i < s.first-1:
		return 0, raft.ErrCompacted
	case i > s.last:
		return 0, raft.ErrUnavailable
	}
	return termIn(s.runs, i), nil
}

// Snapshot returns the latest snapshot (its Data is the caller's small state).
func (s *Store) Snapshot() (raftpb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.snap, nil
}

// HardState returns the hard state last saved.
func (s *Store) HardState() raftpb.HardState {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hs
}

// Stats returns the store's counts since Open.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.stats
	st.DiskReads = s.diskReads.Load()
	return st
}

// Entries returns the entries [lo, hi), at least one if any, within maxSize bytes
// of marshalled entries as raft counts them. Recent entries come from memory; older
// ones are read from the segment files. The returned slice is the caller's.
func (s *Store) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case lo < s.first:
		return nil, raft.ErrCompacted
	case hi > s.last+1:
		return nil, fmt.Errorf("%w: entries [%d, %d) asked, last index %d: %w", ErrOutOfRange, lo, hi, s.last, raft.ErrUnavailable)
	case s.last < s.first:
		return nil, raft.ErrUnavailable
	case lo >= hi:
		return nil, nil
	}
	if c := s.cacheFirst(); len(s.cache) > 0 && lo >= c {
		ents := limitSize(s.cache[lo-c:hi-c], maxSize)
		return slices.Clone(ents), nil
	}
	s.diskReads.Add(1)
	ents, err := s.readDisk(lo, hi, maxSize)
	if err == nil && len(ents) == 0 {
		err = fmt.Errorf("raftstore: entries [%d, %d) not in any segment: %w", lo, hi, raft.ErrUnavailable)
	}
	return ents, err
}

func limitSize(ents []raftpb.Entry, maxSize uint64) []raftpb.Entry {
	if len(ents) == 0 {
		return ents
	}
	size := uint64(ents[0].Size())
	for n := 1; n < len(ents); n++ {
		size += uint64(ents[n].Size())
		if size > maxSize {
			return ents[:n]
		}
	}
	return ents
}

// readDisk reads [lo, hi) from the segment files, stopping before maxSize bytes of
// entries (but returning at least one). The caller holds mu (for reading or writing).
func (s *Store) readDisk(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	k := sort.Search(len(s.files), func(k int) bool { return s.files[k].next() > lo })
	var out []raftpb.Entry
	var size uint64
	for idx := lo; idx < hi && k < len(s.files); k++ {
		seg := s.files[k]
		from := int(idx - seg.base)
		to := from
		for ; to < len(seg.pos) && seg.base+uint64(to) < hi; to++ {
			n := uint64(seg.frameEnd(to) - int64(seg.pos[to]) - headerBytes)
			if len(out)+(to-from) > 0 && size+n > maxSize {
				break
			}
			size += n
		}
		if to == from {
			break
		}
		start, end := int64(seg.pos[from]), seg.frameEnd(to-1)
		b := make([]byte, end-start)
		if _, err := seg.f.ReadAt(b, start); err != nil {
			return nil, fmt.Errorf("raftstore: %s at offset %d: %w", seg.path, start, err)
		}
		for i := from; i < to; i++ {
			off := int64(seg.pos[i]) - start
			fb := b[off : seg.frameEnd(i)-start]
			h, whole, ok := checkFrame(fb, s.opts.MaxEntryBytes)
			if !whole || !ok || h.index != seg.base+uint64(i) {
				return nil, fmt.Errorf("%w: %s at offset %d (index %d): record fails its checks on read", ErrCorrupt, seg.path, seg.pos[i], seg.base+uint64(i))
			}
			e, err := decodeFrame(fb, h)
			if err != nil {
				return nil, fmt.Errorf("%w: %s at offset %d (index %d): %v", ErrCorrupt, seg.path, seg.pos[i], seg.base+uint64(i), err)
			}
			out = append(out, e)
		}
		idx = seg.base + uint64(to)
		if to < len(seg.pos) {
			break // stopped by maxSize or hi
		}
	}
	return out, nil
}

func (s *Store) cacheFirst() uint64 { return s.last + 1 - uint64(len(s.cache)) }

// cacheAppend adds ents (which follow the cached ones) and evicts the oldest
// entries beyond the bounds. The caller holds mu for writing.
func (s *Store) cacheAppend(ents []raftpb.Entry) {
	if s.opts.CacheEntries < 0 || s.opts.CacheBytes < 0 {
		return
	}
	for i := range ents {
		s.cacheSize += ents[i].Size()
	}
	s.cache = append(s.cache, ents...)
	drop := 0
	for drop < len(s.cache) && (len(s.cache)-drop > s.opts.CacheEntries || s.cacheSize > s.opts.CacheBytes) {
		s.cacheSize -= s.cache[drop].Size()
		drop++
	}
	if drop > 0 {
		clear(s.cache[:drop]) // let the evicted entries' data go
		s.cache = s.cache[drop:]
	}
}

// cacheCut drops cached entries from index i on. The caller holds mu for writing,
// with s.last still the old last index.
func (s *Store) cacheCut(i uint64) {
	c := s.cacheFirst()
	if len(s.cache) == 0 || i > s.last {
		return
	}
	if i <= c {
		s.cache, s.cacheSize = nil, 0
		return
	}
	for _, e := range s.cache[i-c:] {
		s.cacheSize -= e.Size()
	}
	s.cache = s.cache[: i-c : i-c] // appends must not write over entries a reader holds
}

// TrimCache drops the cached entries below index i: the caller (the group's loop)
// will not read them soon, having applied them and, on a leader, seen every active
// follower hold them. They stay in the log and are read from its files if asked for.
// Without it, each group would keep its last CacheBytes of entries in memory for as
// long as it lives, on every node, busy or idle.
func (s *Store) TrimCache(i uint64) {
	s.mu.Lock()
	s.cacheDropBelow(i)
	s.mu.Unlock()
}

// CachedBytes is the size of the entries held in memory now (their marshalled size).
func (s *Store) CachedBytes() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cacheSize
}

// cacheDropBelow drops cached entries below i. The caller holds mu for writing.
func (s *Store) cacheDropBelow(i uint64) {
	c := s.cacheFirst()
	if len(s.cache) == 0 || i <= c {
		return
	}
	n := int(min(i-c, uint64(len(s.cache))))
	for _, e := range s.cache[:n] {
		s.cacheSize -= e.Size()
	}
	if n == len(s.cache) {
		// Nothing left: let the backing array go too.
		s.cache = nil
		return
	}
	clear(s.cache[:n]) // let the dropped entries' data go
	s.cache = s.cache[n:]
}

// Close syncs the state file if a commit-only change is not yet durable, and closes
// the files. Later calls fail with ErrClosed.
func (s *Store) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	failed := s.failed
	s.mu.Unlock()
	var err error
	if failed == nil && s.state.dirty {
		if err = s.sync(s.state.f); err == nil {
			s.state.synced()
		}
	}
	s.mu.Lock()
	s.closeFiles()
	s.mu.Unlock()
	return err
}

func (s *Store) closeFiles() {
	for _, seg := range s.files {
		_ = seg.f.Close() // read-only use from here on; nothing to lose
	}
	if s.state != nil {
		_ = s.state.f.Close() // synced above when it mattered
	}
}
