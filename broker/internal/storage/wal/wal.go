// Package wal is the node-wide write-ahead file: the appends of every partition's
// message log and settle journal on a node are made durable by one write and one
// fdatasync of one file per round, instead of a sync of each file they went to.
//
// A writer first writes its bytes into its own file (the segment file, as before),
// then commits a Span naming that file, the position and the bytes. Commit returns once
// the span's record is durable in the write-ahead file. The data files themselves are
// made durable later, in the background, a whole write-ahead file at a time (a
// checkpoint); only then is that write-ahead file reused. Open replays every record not
// yet checkpointed into its data file (a redo of the same bytes at the same position,
// which is idempotent) and makes them durable, before anything opens the data files.
//
// The write-ahead files are recycled rather than created anew, so that most rounds
// write into space the file system has already allocated: an fdatasync of such a
// file flushes its data and the disk's cache without a commit of the file system's
// journal, which is what makes one round cheaper than a sync over many files.
// Every use of a file carries a new sequence number in its header and in each record,
// so the records of an earlier use are never taken for current ones. README.md has the
// byte layout and the crash contract.
package wal

import (
	cryptorand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// Span is one write a caller made into a data file, to be made durable by the
// write-ahead file.
type Span struct {
	// Path is the data file's path as the caller opened it; it must lie under the
	// WAL's Root. Replay opens it again by this path.
	Path string
	// Off is where Data was written in the file.
	Off int64
	// Data is the bytes written; Commit does not keep it after it returns.
	Data []byte
}

// Options configure a WAL. FS and Root are required.
type Options struct {
	// FS is the file system of the write-ahead files and of the data files.
	FS vfs.FS
	// Root is the directory every Span.Path lies under; records name data files
	// relative to it, so a data directory can be moved as a whole.
	Root string
	// FileBytes is the size at which a write-ahead file is full and the next one is
	// used (default 8 MiB). A commit larger than that still goes in one file.
	FileBytes int64
	// Spares is how many checkpointed files are kept for reuse (default 4); more are
	// removed.
	Spares int
	// Syncer makes a checkpoint's data files durable (one syncfs on Linux); nil syncs
	// each file by itself.
	Syncer vfs.FilesSyncer
	// Observe, when set, is called after every round with the records it made
	// durable and how long its write and sync took. It runs on the writer goroutine.
	Observe func(records int, d time.Duration)
	// OnFail, when set, is called once, with the error, when the WAL fails closed
	// (ErrFailed): a write, sync or checkpoint failed, or Fail was called. It must not
	// block; it may run on the writer or the checkpointer goroutine or in Fail's caller.
	OnFail func(error)
	// HoldProcessor syncs each round with vfs.SyncHolding: the writer goroutine keeps
	// its processor through the sync, and the next round starts as soon as the sync
	// returns. Meanwhile nothing else runs on that processor, and a stop-the-world
	// phase of the garbage collector waits for the sync to return: if the disk stalls
	// in a held sync, the whole process stops at the next collection until it returns.
	// So rounds sync the plain way while Go runs one processor, and after a held sync
	// of SlowSync or more (OnHoldOff is told) for a pause of SlowHoldOff. A stall
	// (a sync, held or plain, of StallSync or more) keeps them plain until a sync
	// under StallSync and then SlowHoldOff after the stall, so a disk that stays slow
	// is held through its first slow sync only, however seldom it is written; and each
	// held stall doubles the next pause, up to MaxHoldOff, until MaxHoldOff passes
	// without a stall, so a disk that stalls now and then is held through a stall once
	// a pause at most.
	HoldProcessor bool
	// OnHoldOff, when set, is called on the writer goroutine with the duration of a
	// held sync that started a hold-off (HoldProcessor). It must not block.
	OnHoldOff func(time.Duration)
	// OnCheckpointRetry, when set, is called on the checkpointer goroutine each time a
	// checkpoint could not open a data file to sync for a shortage (EMFILE, ENFILE,
	// ENOMEM) and waits a second before it tries again; nothing is lost meanwhile, and
	// a WAL closing gives up and fails closed instead. Any other failure to open fails
	// the WAL closed at once.
	OnCheckpointRetry func(error)
	// NoGather starts each round as soon as a commit waits, without first letting
	// the writers that are ready to run commit too (see GatherYields).
	NoGather bool
}

// GatherYields is how many times the writer goroutine hands its processor to the
// scheduler before it takes the commits of a round: waking it was the first commit's
// last act, and Go runs the goroutine it woke next, so a round started at once carried
// that commit and the few that queued during the round before, while the other
// partitions' writers, ready to commit, waited for the round after. Yielding lets
// them commit into this one; with none ready, a yield returns at once, so a lone
// commit waits a microsecond or two, not a timer's tick. Measured on 7 December
// (docs/performance.md): 16 producers over 6 partitions, 3.45 to 5.1 records a round,
// 13 to 19 % less CPU per produced message; more yields gathered no more.
const GatherYields = 6

// ErrFailed means a write or sync of the write-ahead file, or a checkpoint, failed:
// the WAL refuses every later commit. Whether the failed commit's records are
// durable is unknown; they may be replayed on the next Open.
var ErrFailed = errors.New("wal: failed closed after a write or sync error")

// ErrNotWritten wraps an error of a commit that wrote nothing into the write-ahead
// file (no space for a new file): the commit's spans are not durable and will not be
// replayed, and the WAL stays usable.
var ErrNotWritten = errors.New("wal: nothing of the commit was written")

const (
	fileExt       = ".wal"
	headerLen     = 32
	recHeaderLen  = 16 // length u32, crc u32, seq u64
	magic         = "NARADWAL"
	version       = 1
	defaultFile   = 8 << 20
	defaultSpares = 4
	maxPath       = 4096
	// maxFull is how many full files may wait for their checkpoint: past it, a
	// rotation waits, and with it the commits, so that the write-ahead files never
	// outgrow what the checkpoints can make durable.
	maxFull = 3
	// seqName holds a floor for the sequence numbers of the uses to come, raised by
	// seqLease at every Open: no use ever repeats a sequence of an earlier life, even
	// when the header that held it was lost.
	seqName  = "seq"
	seqLease = 1 << 40
	// seqJitter bounds the random distance above the floor at which each Open begins
	// its uses: a record's sequence is the only thing that tells a record of the use
	// from bytes of an earlier one, which are mostly producers' message bodies, and a
	// body can hold a well-formed record (its CRC is computable) naming any file. So
	// the sequence of a use must not be guessable from outside: a node's n-th start
	// began its uses at n·2^40 before.
	seqJitter = 1 << 39
)

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	le         = binary.LittleEndian
)

// WAL is the write-ahead file of one node. It is safe for concurrent use.
type WAL struct {
	opts Options
	dir  string

	mu      sync.Mutex
	pending []*waiter
	closed  bool
	kick    chan struct{}
	quit    chan struct{}
	done    chan struct{}

	// Owned by the writer goroutine.
	cur     *file
	nextSeq uint64
	nextNum atomic.Int64 // name of the next new file
	buf     []byte

	// The checkpointer's queue and the spare files, under ckMu.
	ckMu    sync.Mutex
	ckCond  *sync.Cond
	full    []*file // written files waiting for their checkpoint, oldest first
	spares  []*file
	ckDone  chan struct{}
	ckStop  bool
	rotated uint64 // files handed to the checkpointer so far
	retired uint64 // of those, files checkpointed (in order) or given up on a failure
	// wantSpare asks the checkpointer for a new file ahead of the rotation that
	// needs it (set when the current file is half full and there is no spare).
	wantSpare bool
	// closing is set by Close before it waits for the writer, and rotWaits while the
	// writer's rotation waits for a checkpoint (maxFull): a checkpoint that cannot
	// open its data file then gives up rather than retry, or Close would wait for the
	// writer, the writer for the checkpoint, and the checkpoint for ckStop, which
	// Close sets only after the writer is done.
	closing, rotWaits bool

	failed atomic.Pointer[error]
	// ownMu orders the data files' own syncs (SyncOwn holds it for reading across the
	// sync and its Fail) against a checkpoint's open, sync and check of its data files
	// (held for writing): see SyncOwn.
	ownMu sync.RWMutex
	stats struct {
		rounds, records, bytes, checkpoints, nanos atomic.Uint64
	}

	// holdOff is when the rounds may sync holding their processor again after a slow
	// held sync or a stall (HoldProcessor); pause is the next hold-off's length, and
	// lastStall when a sync last took stallSync or more. All are the writer
	// goroutine's (a test may change them between commits).
	holdOff, lastStall  time.Time
	pause               time.Duration
	stalling            bool          // the last sync was a stall
	slowSync, stallSync time.Duration // SlowSync, StallSync
	// held counts the rounds synced holding the processor; holdOffs the hold-offs;
	// stalls the syncs, held or plain, of stallSync or more.
	held, holdOffs, stalls atomic.Uint64

	// The disk's health as Stalled reads it, from any goroutine, in nanoseconds of
	// the monotonic clock since born: when the round in flight began (plus one; 0 when
	// none is), and when the last round ended, shifted left by one, its low bit set
	// when it took shedSync or more (one word, so that a reader never pairs one
	// round's end with another's verdict).
	born                 time.Time
	roundSince, roundEnd atomic.Int64
	shedSync             time.Duration // ShedSync
}

type file struct {
	f       vfs.File
	num     int
	seq     uint64
	pos     int64
	size    int64 // allocated size
	asked   bool  // a spare was asked for during this use
	touched map[string]struct{}
}

type waiter struct {
	spans []Span
	rels  []string // each span's path relative to the root, as its record names it
	err   chan error
}

var waiterPool = sync.Pool{New: func() any { return &waiter{err: make(chan error, 1)} }}

// Replayed tells what Open found and redid.
type Replayed struct {
	Files   int // write-ahead files holding records
	Records int // records redone into their data files
	Skipped int // records whose data file no longer exists
	// Damaged counts records that failed their checks with a valid record of the
	// same use after them (pastDamaged): damaged at rest, or torn in the last round before a
	// power loss (unacknowledged, when nothing acknowledged follows). Their bytes are
	// not redone (their data files show the hole, which the segment log reports as
	// damage); the records after them are. FirstDamaged names the first: its
	// write-ahead file and byte.
	Damaged      int
	FirstDamaged string
	// DamagedHeaders counts files whose header failed its checks while a valid record
	// of a use not yet checkpointed followed it (see firstUse): the header rotted at
	// rest, or was torn by a power cut in the use's first round. Their records were
	// replayed. FirstDamagedHeader names the first such file.
	DamagedHeaders     int
	FirstDamagedHeader string
}

// DamagedHeadersMessage is what a node logs when a replay met DamagedHeaders.
const DamagedHeadersMessage = "a write-ahead file's header failed its checks (damaged at rest, or torn by a power cut in its first round) while records of a use not yet checkpointed followed it: they were replayed; check the disk"

// Open opens (creating it if needed) the write-ahead directory dir, redoes every
// record not yet checkpointed into its data file, makes those files durable and
// starts the WAL with every file free.
func Open(dir string, opts Options) (*WAL, Replayed, error) {
	if opts.FS == nil || opts.Root == "" {
		return nil, Replayed{}, errors.New("wal: FS and Root are required")
	}
	if opts.FileBytes <= 0 {
		opts.FileBytes = defaultFile
	}
	if opts.Spares <= 0 {
		opts.Spares = defaultSpares
	}
	if opts.Syncer == nil {
		opts.Syncer = vfs.EachFile{}
	}
	opts.Root = filepath.Clean(opts.Root)
	if err := vfs.MkdirAllSync(opts.FS, dir, 0o700); err != nil {
		return nil, Replayed{}, err
	}
	w := &WAL{opts: opts, dir: dir, kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), ckDone: make(chan struct{}), slowSync: SlowSync, stallSync: StallSync, pause: SlowHoldOff, born: time.Now(), shedSync: ShedSync}
	w.ckCond = sync.NewCond(&w.ckMu)
	files, rep, err := w.replay()
	if err != nil {
		return nil, rep, err
	}
	if err := w.leaseSeqs(); err != nil {
		return nil, rep, err
	}
	// Every file is free now: the first becomes the current one, the rest spares. A
	// file shorter than FileBytes (a crash while it was made) is filled first, so that
	// no round ever grows a file, which could run out of space half-way.
	for i, f := range files {
		if f.size < opts.FileBytes && (i == 0 || len(w.spares) < opts.Spares) {
			if err := fill(f.f, opts.FileBytes); err != nil {
				return nil, rep, fmt.Errorf("wal: filling %s: %w", w.name(f.num), err)
			}
			if err := f.f.Sync(); err != nil {
				return nil, rep, err
			}
			f.size = opts.FileBytes
		}
		if i == 0 {
			w.cur = f
		} else if len(w.spares) < opts.Spares {
			w.spares = append(w.spares, f)
		} else {
			_ = f.f.Close() // removed below; its close error changes nothing
			if err := opts.FS.Remove(w.name(f.num)); err != nil {
				return nil, rep, err
			}
		}
	}
	if w.cur == nil {
		if w.cur, err = w.create(); err != nil {
			return nil, rep, err
		}
	}
	if err := opts.FS.SyncDir(dir); err != nil {
		return nil, rep, err
	}
	if err := w.begin(w.cur); err != nil {
		return nil, rep, err
	}
	go w.run()
	go w.checkpointer()
	return w, rep, nil
}

// A held sync of SlowSync or more makes a HoldProcessor WAL sync the plain way for a
// pause, SlowHoldOff at first. SlowSync is above a solid-state disk's rounds under load
// (mostly under 1 ms, under one in a hundred 4–16 ms on the development machine's
// virtual disk; a round beside a checkpoint's syncfs, 20–30 ms); SlowHoldOff is short,
// so that such a blip costs the holding little. A sync of StallSync or more is a stall:
// long enough that a collection waiting for it shows (the node's peers count it dead
// after a second without an answer). After a stall the rounds sync the plain way until
// one of them takes less than StallSync (a disk written seldom is not held again for
// the time between its writes) and SlowHoldOff has passed since the last stall; a
// processor's wait after a plain sync (which holding saves) is far below StallSync, so
// a busy machine does not keep the holding off by itself. Each held stall doubles the
// pause, up to MaxHoldOff; a sync MaxHoldOff after the last stall sets it back to
// SlowHoldOff.
const (
	SlowSync    = 20 * time.Millisecond
	StallSync   = 100 * time.Millisecond
	SlowHoldOff = time.Second
	MaxHoldOff  = time.Minute
)

// ShedSync is how long a round (its write and its sync) takes, or has been taking, for
// Stalled to report the disk stalling: past the node's peers' one-second liveness
// timeout, far past any round of a healthy disk (docs/internals/replication.md, "A
// leader whose disk stalls"). The verdict of a slow round that ended holds until the
// next round ends, for at most StalledFor.
const (
	ShedSync   = time.Second
	StalledFor = 10 * time.Second
)

// Stalled reports whether the disk is stalling now: a round has been in flight for
// ShedSync or more (in its sync, its write, or waiting for a checkpoint to free a file),
// or the last one took that long, ended less than StalledFor ago and none has ended
// since. A replicated partition's leader on such a disk answers each write only after
// its own round, so the node hands its leaderships over while it lasts. It is safe to
// call from any goroutine.
func (w *WAL) Stalled() bool {
	now := int64(time.Since(w.born))
	if s := w.roundSince.Load(); s != 0 && now-(s-1) >= int64(w.shedSync) {
		return true
	}
	e := w.roundEnd.Load()
	return e&1 == 1 && now-e>>1 < int64(StalledFor)
}

// roundBegan and roundEnded keep what Stalled reads, for a round that began at start.
func (w *WAL) roundBegan(start time.Time) { w.roundSince.Store(int64(start.Sub(w.born)) + 1) }

func (w *WAL) roundEnded(start time.Time) {
	end := time.Since(w.born)
	slow := int64(0)
	if end-start.Sub(w.born) >= w.shedSync {
		slow = 1
	}
	w.roundEnd.Store(int64(end)<<1 | slow)
	w.roundSince.Store(0)
}

// sync makes a round's write in f durable, holding the writer's processor unless
// HoldProcessor is off, Go runs one processor, f cannot be synced holding, or a slow
// sync paused the holding.
func (w *WAL) sync(f vfs.File) error {
	start := time.Now()
	if !w.opts.HoldProcessor || runtime.GOMAXPROCS(0) < 2 || w.stalling || start.Before(w.holdOff) || !vfs.CanSyncHolding(f) {
		failpoint.Stall(failpoint.WALSync, time.Sleep)
		err := f.Sync()
		if w.opts.HoldProcessor {
			w.synced(false, start)
		}
		return err
	}
	failpoint.Stall(failpoint.WALSync, vfs.SleepHolding)
	_, err := vfs.SyncHolding(f)
	w.held.Add(1)
	w.synced(true, start)
	return err
}

// synced decides from a sync that began at start, held or not, when the rounds may
// hold their processor again (see SlowSync). It reads the clock once.
func (w *WAL) synced(held bool, start time.Time) {
	now := time.Now()
	d := now.Sub(start)
	if now.Sub(w.lastStall) >= MaxHoldOff {
		w.pause = SlowHoldOff
	}
	stall := d >= w.stallSync
	// A disk still stalling is not held through again until it is quick.
	w.stalling = stall
	if stall {
		w.stalls.Add(1)
		w.lastStall = now
		if until := now.Add(SlowHoldOff); !held && until.After(w.holdOff) {
			w.holdOff = until
		}
	}
	if !held || d < w.slowSync {
		return
	}
	w.holdOff = now.Add(w.pause)
	if stall {
		w.pause = min(2*w.pause, MaxHoldOff)
	}
	w.holdOffs.Add(1)
	if w.opts.OnHoldOff != nil {
		w.opts.OnHoldOff(d)
	}
}

// Replay redoes every record of the write-ahead directory dir not yet checkpointed
// into its data file, makes those files durable and frees the write-ahead files, as
// Open does, but opens nothing for use: it creates, grows and leases no write-ahead
// file (the fold of a rollback, on a disk that may be nearly full). A missing dir
// replays nothing.
func Replay(dir string, opts Options) (Replayed, error) {
	if opts.FS == nil || opts.Root == "" {
		return Replayed{}, errors.New("wal: FS and Root are required")
	}
	if opts.Syncer == nil {
		opts.Syncer = vfs.EachFile{}
	}
	opts.Root = filepath.Clean(opts.Root)
	if _, err := opts.FS.ReadDir(dir); errors.Is(err, fs.ErrNotExist) {
		return Replayed{}, nil
	}
	w := &WAL{opts: opts, dir: dir}
	files, rep, err := w.replay()
	if err != nil {
		return rep, err
	}
	for _, f := range files {
		if cerr := f.f.Close(); err == nil {
			err = cerr
		}
	}
	return rep, err
}

// RemoveFiles deletes what the write-ahead directory dir holds (after a Replay, the
// fold of a rollback), leaving dir itself, in an order safe at every crash: the
// write-ahead files first, durably, and the sequence floor (seq) last. A file whose
// header is unreadable (torn) may still hold records of an earlier use; only the floor
// keeps a later Open from giving its sequence to a new use, whose replay would then
// take those records for its own. So the floor must outlive every such file.
func RemoveFiles(fsys vfs.FS, dir string) error {
	entries, err := fsys.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	floor := false
	for _, e := range entries {
		if e.Name == seqName {
			floor = true
			continue
		}
		if err := fsys.Remove(filepath.Join(dir, e.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := fsys.SyncDir(dir); err != nil {
		return err
	}
	if !floor {
		return nil
	}
	if err := fsys.Remove(filepath.Join(dir, seqName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fsys.SyncDir(dir)
}

// leaseSeqs raises nextSeq to the floor an earlier Open left, adds a random distance
// below seqJitter (so that no one outside can forge a record of this life's uses), and
// durably moves the floor seqLease further, before this life begins any use.
func (w *WAL) leaseSeqs() error {
	path := filepath.Join(w.dir, seqName)
	if f, err := w.opts.FS.OpenFile(path, os.O_RDONLY, 0); err == nil {
		b := make([]byte, 12)
		n, _ := f.ReadAt(b, 0)
		_ = f.Close() // read-only
		if n == 12 && crc32.Checksum(b[:8], castagnoli) == le.Uint32(b[8:]) {
			w.nextSeq = max(w.nextSeq, le.Uint64(b))
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var r [8]byte
	_, _ = cryptorand.Read(r[:]) // never fails (it crashes the process instead)
	w.nextSeq += 1 + le.Uint64(r[:])%seqJitter
	b := le.AppendUint64(nil, w.nextSeq+seqLease)
	b = le.AppendUint32(b, crc32.Checksum(b, castagnoli))
	tmp := path + ".tmp"
	f, err := w.opts.FS.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.WriteAt(b, 0); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = w.opts.FS.Rename(tmp, path)
	}
	if err == nil {
		err = w.opts.FS.SyncDir(w.dir)
	}
	if err != nil {
		return fmt.Errorf("wal: writing the sequence floor: %w", err)
	}
	return nil
}

func (w *WAL) name(num int) string {
	return filepath.Join(w.dir, fmt.Sprintf("%08d%s", num, fileExt))
}

// replay reads every write-ahead file, redoes the records of those in use in the
// order of their sequence numbers, syncs the data files they touched and marks every
// file free. It returns the files, free, in name order.
func (w *WAL) replay() ([]*file, Replayed, error) {
	var rep Replayed
	ents, err := w.opts.FS.ReadDir(w.dir)
	if err != nil {
		return nil, rep, err
	}
	var files []*file
	for _, e := range ents {
		num, ok := strings.CutSuffix(e.Name, fileExt)
		if e.IsDir || !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 {
			continue
		}
		f, err := w.opts.FS.OpenFile(filepath.Join(w.dir, e.Name), os.O_RDWR, 0)
		if err != nil {
			return nil, rep, err
		}
		files = append(files, &file{f: f, num: n, size: e.Size})
		w.nextNum.Store(max(w.nextNum.Load(), int64(n)+1))
	}
	closeAll := func() {
		for _, f := range files {
			_ = f.f.Close() // Open failed; its error is the one reported
		}
	}
	type used struct {
		f    *file
		data []byte
	}
	var inUse []used
	for _, f := range files {
		// The header first: a free file (every file, after a clean stop) is not read.
		data, err := readAll(f.f, min(f.size, headerLen))
		if err != nil {
			closeAll()
			return nil, rep, err
		}
		seq, inuse, ok := decodeHeader(data)
		if !ok && f.size > headerLen {
			// Unreadable: free, unless a record of a use that was never freed follows
			// it (firstUse). Such a file's records are the only copy of acknowledged
			// writes; a header rotted at rest must not make them read as free.
			whole, err := readAll(f.f, f.size)
			if err != nil {
				closeAll()
				return nil, rep, err
			}
			if s, found := firstUse(whole); found {
				seq, inuse, ok = s, true, true
				if rep.DamagedHeaders++; rep.DamagedHeaders == 1 {
					rep.FirstDamagedHeader = w.name(f.num)
				}
			}
		}
		if ok {
			w.nextSeq = max(w.nextSeq, seq+1)
		}
		f.seq = seq
		if ok && inuse {
			if data, err = readAll(f.f, f.size); err != nil {
				closeAll()
				return nil, rep, err
			}
			inUse = append(inUse, used{f, data})
		} else if ok {
			// Free as read, maybe only in the page cache: a process killed between a
			// checkpoint's write of the header and its sync (or whose sync failed,
			// leaving the page clean but the disk stale) leaves the disk saying "in
			// use" with the old records, which a start after a later power loss would
			// replay over whatever this life writes. Written again and synced, free
			// is what the disk says. (A sync alone would not do after a failed one.)
			if err := freeFile(f); err != nil {
				closeAll()
				return nil, rep, err
			}
		}
	}
	sort.Slice(inUse, func(i, j int) bool { return inUse[i].f.seq < inUse[j].f.seq })
	touched := map[string]vfs.File{}
	defer func() {
		for _, t := range touched {
			_ = t.Close() // read-write handles for the redo; their sync result is what counts
		}
	}()
	damaged := func(u used, pos int64) {
		if rep.Damaged++; rep.Damaged == 1 {
			rep.FirstDamaged = fmt.Sprintf("%s at byte %d", w.name(u.f.num), pos)
		}
	}
	for i, u := range inUse {
		rep.Files++
		for pos := int64(headerLen); ; {
			rel, off, data, n, ok := decodeRecord(u.data[pos:], u.f.seq)
			if !ok {
				// The end of the use, or a damaged record: skipped (and counted) only
				// when a valid record of the same use follows it (pastDamaged), so that
				// one rotten record does not drop every acknowledged write after it.
				next, ok := pastDamaged(u.data, pos, u.f.seq)
				if !ok {
					// A file with a later use after it was full: the writer rotated
					// away from it after a round that succeeded, so its use never ends
					// in a torn round. A record there whose sequence field reads the
					// use's is an answered write damaged at rest, not the end: counted,
					// or its loss (its data file may lack its bytes) would go unsaid.
					if i < len(inUse)-1 && int64(len(u.data))-pos >= recHeaderLen && le.Uint64(u.data[pos+8:]) == u.f.seq {
						damaged(u, pos)
					}
					break
				}
				damaged(u, pos)
				pos = next
				continue
			}
			pos += n
			path := filepath.Join(w.opts.Root, rel)
			t, ok := touched[path]
			if !ok {
				var err error
				t, err = w.opts.FS.OpenFile(path, os.O_RDWR, 0)
				if errors.Is(err, fs.ErrNotExist) {
					rep.Skipped++
					continue // removed since: a deleted topic or a segment retention dropped
				}
				if err != nil {
					closeAll()
					return nil, rep, fmt.Errorf("wal: redo into %s: %w", path, err)
				}
				touched[path] = t
			}
			if _, err := t.WriteAt(data, off); err != nil {
				closeAll()
				return nil, rep, fmt.Errorf("wal: redo into %s: %w", path, err)
			}
			rep.Records++
		}
	}
	if len(touched) > 0 {
		hs := make([]vfs.File, 0, len(touched))
		for _, t := range touched {
			hs = append(hs, t)
		}
		if err := w.opts.Syncer.SyncFiles(hs); err != nil {
			closeAll()
			return nil, rep, fmt.Errorf("wal: syncing the redone files: %w", err)
		}
	}
	for _, u := range inUse {
		if err := freeFile(u.f); err != nil {
			closeAll()
			return nil, rep, err
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].num < files[j].num })
	return files, rep, nil
}

// pastDamaged tells where the record after the one at pos in b begins, when the one
// at pos fails its checks but is a damaged record of the use seq (rotted at rest, a
// sector lost, or torn within the last round), not the end of the use. The end of a
// use never looks like one: what follows it is zeros, records of an earlier use
// (another sequence), or bytes a torn last round left, none of which is followed by
// a valid record of this use except within that unacknowledged round.
//
// The next record is the first valid one of the use after pos, looked for byte by
// byte, whatever part of the record at pos was damaged: its length may lead past
// valid records (they would be skipped too), and a damaged header (its length and its
// sequence both, as when a sector is lost) tells nothing of where it ended. Nothing
// but the use's own records passes the checks: a record's CRC covers its sequence,
// and a use's sequence cannot be guessed by whoever chose the bytes of a message
// (seqJitter).
func pastDamaged(b []byte, pos int64, seq uint64) (int64, bool) {
	for q := pos + 1; q+recHeaderLen <= int64(len(b)); q++ {
		if le.Uint64(b[q+8:]) != seq {
			continue
		}
		if _, _, _, _, ok := decodeRecord(b[q:], seq); ok {
			return q, true
		}
	}
	return 0, false
}

// firstUse reads the use of a file whose header failed its checks from its first
// record: found when a valid record lies right after the header, its sequence being
// the use's. Every use writes its first record there, in the round that makes its
// header durable, and freeFile zeroes that record's header when it frees the file, so
// a valid one means a use that was never freed: in use when the node stopped, its
// header rotted at rest (its records may be the only copy of acknowledged writes), or
// a use whose first round a power cut tore (never acknowledged; redoing its records
// writes what the data files may hold already). Files freed before freeFile zeroed the
// record (an earlier release) are freed again, zeroed, by the first Open that reads
// their header.
func firstUse(b []byte) (uint64, bool) {
	if int64(len(b)) < headerLen+recHeaderLen {
		return 0, false
	}
	seq := le.Uint64(b[headerLen+8:])
	if seq == 0 {
		return 0, false
	}
	_, _, _, _, ok := decodeRecord(b[headerLen:], seq)
	return seq, ok
}

func readAll(f vfs.File, size int64) ([]byte, error) {
	b := make([]byte, size)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// freeFile marks f free durably: its records are never replayed again. The header
// keeps the sequence of its last use, so that Open never starts a use under a
// sequence whose records may still lie in a file. The first record's header is
// zeroed in the same write (it sits in the same sector): a file whose header later
// fails its checks is then told free from one in use (firstUse).
func freeFile(f *file) error {
	b := append(encodeHeader(f.seq, false), make([]byte, recHeaderLen)...)
	if _, err := f.f.WriteAt(b[:min(int64(len(b)), max(f.size, headerLen))], 0); err != nil {
		return err
	}
	f.pos, f.touched = headerLen, nil
	return f.f.Sync()
}

// create makes a new free write-ahead file of FileBytes, allocated and written with
// zeros once: later writes into it change no metadata of the file, so their
// fdatasync needs no commit of the file system's journal. Errors wrap
// ErrNotWritten.
func (w *WAL) create() (*file, error) {
	num := int(w.nextNum.Add(1) - 1)
	name := w.name(num)
	f, err := w.opts.FS.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotWritten, err)
	}
	if err := fill(f, w.opts.FileBytes); err != nil {
		_ = f.Close()              // the allocation error is the one reported
		_ = w.opts.FS.Remove(name) // a free file; Open ignores or reuses it if this fails
		return nil, fmt.Errorf("%w: %w", ErrNotWritten, err)
	}
	nf := &file{f: f, num: num, size: w.opts.FileBytes}
	if err := freeFile(nf); err != nil {
		_ = f.Close()
		_ = w.opts.FS.Remove(name)
		return nil, fmt.Errorf("%w: %w", ErrNotWritten, err)
	}
	if err := w.opts.FS.SyncDir(w.dir); err != nil {
		_ = f.Close()
		_ = w.opts.FS.Remove(name)
		return nil, fmt.Errorf("%w: %w", ErrNotWritten, err)
	}
	return nf, nil
}

// fill allocates size bytes of f (so that running out of space shows here, whole)
// and writes them with zeros: a write into allocated but unwritten space still
// changes the file's extent map.
func fill(f vfs.File, size int64) error {
	if a, ok := f.(vfs.Allocator); ok {
		if err := a.Allocate(size); err != nil {
			return err
		}
	}
	zero := make([]byte, min(size, 1<<20))
	for off := int64(0); off < size; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero[:min(int64(len(zero)), size-off)], off); err != nil {
			return err
		}
	}
	return nil // freeFile syncs
}

// begin starts a use of the free file f under the next sequence number. The header
// becomes durable with the first round's sync; until then the file reads as free
// or as its previous, checkpointed use, whose records are all in their data files.
func (w *WAL) begin(f *file) error {
	f.seq = w.nextSeq
	w.nextSeq++
	f.pos = headerLen
	f.asked = false
	f.touched = map[string]struct{}{}
	if _, err := f.f.WriteAt(encodeHeader(f.seq, true), 0); err != nil {
		return err
	}
	return nil
}

// Commit makes spans durable: it returns nil once their records are synced in the
// write-ahead file. The data must already be written in the data files. An error
// wrapping ErrNotWritten means nothing was recorded; any other error means the
// records may or may not be durable.
func (w *WAL) Commit(spans []Span) error {
	if errp := w.failed.Load(); errp != nil {
		return *errp
	}
	// A bad path is refused here, to its caller alone: in a round it would fail
	// every commit that shares it.
	wt := waiterPool.Get().(*waiter)
	wt.rels = wt.rels[:0]
	for _, s := range spans {
		rel, err := w.rel(s.Path)
		if err != nil {
			waiterPool.Put(wt)
			return err
		}
		wt.rels = append(wt.rels, rel)
	}
	wt.spans = spans
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		waiterPool.Put(wt)
		return fmt.Errorf("%w: %w", ErrNotWritten, errors.New("wal: closed"))
	}
	w.pending = append(w.pending, wt)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	err := <-wt.err
	wt.spans = nil
	waiterPool.Put(wt)
	return err
}

func (w *WAL) run() {
	defer close(w.done)
	var batch []*waiter
	for stop := false; !stop; {
		select {
		case <-w.kick:
		case <-w.quit:
			stop = true // after serving whoever queued before Close
		}
		for {
			w.mu.Lock()
			waiting := len(w.pending) > 0
			w.mu.Unlock()
			if waiting && !w.opts.NoGather {
				for range GatherYields {
					runtime.Gosched()
				}
			}
			w.mu.Lock()
			batch, w.pending = w.pending, batch[:0]
			w.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			rotate, err := w.round(batch)
			var rerr error
			if err == nil && rotate {
				rerr = w.rotateIf()
			}
			for _, wt := range batch {
				if rerr != nil && len(wt.spans) == 1 && wt.spans[0].Path == rotateMarker {
					wt.err <- rerr // only the Checkpoint's: the records of the round are durable
				} else {
					wt.err <- err
				}
			}
			clear(batch)
		}
	}
}

// round writes the records of batch and syncs them. It also reports whether a
// Checkpoint asked for a rotation.
func (w *WAL) round(batch []*waiter) (bool, error) {
	rotate := false
	for _, wt := range batch {
		for _, s := range wt.spans {
			rotate = rotate || s.Path == rotateMarker
		}
	}
	if errp := w.failed.Load(); errp != nil {
		return false, *errp
	}
	start := time.Now()
	w.buf = w.buf[:0]
	records := 0
	for _, wt := range batch {
		for i, s := range wt.spans {
			if s.Path == rotateMarker {
				continue
			}
			w.buf = appendRecord(w.buf, 0, wt.rels[i], s.Off, s.Data)
			records++
		}
	}
	if records == 0 {
		return rotate, nil
	}
	w.roundBegan(start)
	defer w.roundEnded(start)
	if w.cur.pos > headerLen && w.cur.pos+int64(len(w.buf)) > w.opts.FileBytes {
		if err := w.rotate(); err != nil {
			if errors.Is(err, ErrNotWritten) {
				return false, err
			}
			return false, w.fail(err)
		}
	}
	if end := w.cur.pos + int64(len(w.buf)); end > w.cur.size {
		// A round larger than the file: reserve the space first, so that a full disk
		// fails it before a byte is written, and the WAL stays usable.
		a, ok := w.cur.f.(vfs.Allocator)
		if !ok {
			return false, w.fail(errors.New("wal: a round larger than the file on a file system that cannot reserve space"))
		}
		if err := a.Allocate(end); err != nil {
			return false, fmt.Errorf("%w: %w", ErrNotWritten, err)
		}
		w.cur.size = end
	}
	// The sequence number goes in now that the file is known.
	for p := 0; p < len(w.buf); {
		n := int(le.Uint32(w.buf[p:]))
		le.PutUint64(w.buf[p+8:], w.cur.seq)
		le.PutUint32(w.buf[p+4:], crc32.Checksum(w.buf[p+8:p+recHeaderLen+n], castagnoli))
		p += recHeaderLen + n
	}
	if _, err := w.cur.f.WriteAt(w.buf, w.cur.pos); err != nil {
		return false, w.fail(err)
	}
	err := w.sync(w.cur.f)
	if err == nil {
		err = failpoint.Err(failpoint.WALAfterWrite) // stands for a failed fdatasync
	}
	if err != nil {
		return false, w.fail(err)
	}
	w.cur.pos += int64(len(w.buf))
	w.cur.size = max(w.cur.size, w.cur.pos)
	if !w.cur.asked && w.cur.pos > w.opts.FileBytes/2 {
		w.cur.asked = true
		w.ckMu.Lock()
		if len(w.spares) == 0 {
			w.wantSpare = true
			w.ckCond.Broadcast()
		}
		w.ckMu.Unlock()
	}
	for _, wt := range batch {
		for _, s := range wt.spans {
			if s.Path != rotateMarker {
				w.cur.touched[s.Path] = struct{}{}
			}
		}
	}
	took := time.Since(start)
	w.stats.rounds.Add(1)
	w.stats.records.Add(uint64(records))
	w.stats.bytes.Add(uint64(len(w.buf)))
	w.stats.nanos.Add(uint64(took))
	if w.opts.Observe != nil {
		w.opts.Observe(records, took)
	}
	if cap(w.buf) > 4<<20 {
		w.buf = nil
	}
	return rotate, nil
}

// rel is path relative to the root, as a record names it.
func (w *WAL) rel(path string) (string, error) {
	rel, err := filepath.Rel(w.opts.Root, filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || len(rel) > maxPath {
		return "", fmt.Errorf("%w: %w", ErrNotWritten, fmt.Errorf("wal: %s is not a file under %s", path, w.opts.Root))
	}
	return rel, nil
}

// rotateIf rotates for a Checkpoint when the current file holds records.
func (w *WAL) rotateIf() error {
	if w.cur.pos == headerLen {
		return nil
	}
	if err := w.rotate(); err != nil {
		if errors.Is(err, ErrNotWritten) {
			return err
		}
		return w.fail(err)
	}
	return nil
}

func (w *WAL) fail(err error) error {
	e := fmt.Errorf("%w: %w", ErrFailed, err)
	first := w.failed.CompareAndSwap(nil, &e)
	w.ckMu.Lock()
	w.ckCond.Broadcast()
	w.ckMu.Unlock()
	if first && w.opts.OnFail != nil {
		w.opts.OnFail(e)
	}
	return *w.failed.Load()
}

// Fail fails the WAL closed on behalf of a data file whose own sync failed. Linux
// reports a lost write-back once per open file, so such a sync may be the only report
// that bytes a record here covers never reached the disk: a checkpoint, syncing the
// file through a new handle, would succeed and free the record. Failed, the WAL frees
// nothing, refuses every later commit, and the next start replays what it holds.
func (w *WAL) Fail(err error) {
	_ = w.fail(fmt.Errorf("wal: a data file's own sync failed: %w", err))
}

// SyncOwn runs sync, a sync of a data file made outside the WAL (a segment log
// undoing an append, a Raft log cutting its tail), and fails the WAL closed (Fail,
// the error named by what) when it fails. Use it, not Fail after the sync, for every
// such sync: the sync marks a lost write-back seen when it meets it, and a checkpoint
// that opened, synced and checked its files between that and the Fail would have met
// no error through its fresh handle and freed the records of bytes the disk never
// got. A checkpoint does not open, sync and check its data files while one runs.
func (w *WAL) SyncOwn(what string, sync func() error) error {
	w.ownMu.RLock()
	defer w.ownMu.RUnlock()
	err := sync()
	if err != nil {
		w.Fail(fmt.Errorf("%s: %w", what, err))
	}
	return err
}

// rotate hands the current file to the checkpointer and begins the next one: a
// spare if there is one, else a new file.
func (w *WAL) rotate() error {
	w.ckMu.Lock()
	for len(w.full) >= maxFull && w.failed.Load() == nil {
		w.rotWaits = true
		w.ckCond.Wait() // the checkpoints are behind: wait for one
	}
	w.rotWaits = false
	if errp := w.failed.Load(); errp != nil {
		w.ckMu.Unlock()
		return *errp
	}
	var next *file
	if n := len(w.spares); n > 0 {
		next = w.spares[n-1]
		w.spares = w.spares[:n-1]
	}
	w.ckMu.Unlock()
	if next == nil {
		var err error
		if next, err = w.create(); err != nil {
			return err
		}
	}
	if err := w.begin(next); err != nil {
		return err
	}
	w.ckMu.Lock()
	w.full = append(w.full, w.cur)
	w.rotated++
	w.ckCond.Broadcast()
	w.ckMu.Unlock()
	w.cur = next
	return nil
}

// checkpointer makes the data files of every full write-ahead file durable, then
// frees that file for reuse.
func (w *WAL) checkpointer() {
	defer close(w.ckDone)
	for {
		w.ckMu.Lock()
		for len(w.full) == 0 && !w.wantSpare && !w.ckStop {
			w.ckCond.Wait()
		}
		if len(w.full) == 0 && w.wantSpare && !w.ckStop {
			w.wantSpare = false
			w.ckMu.Unlock()
			// A failure here is not the WAL's: the rotation creates one itself and
			// reports what it meets.
			if nf, err := w.create(); err == nil {
				w.ckMu.Lock()
				w.spares = append(w.spares, nf)
				w.ckMu.Unlock()
			}
			continue
		}
		if len(w.full) == 0 {
			w.ckMu.Unlock()
			return
		}
		f := w.full[0]
		w.ckMu.Unlock()
		err := w.checkpoint(f)
		var oe *openError
		if errors.As(err, &oe) && shortage(oe.err) && w.retryOpen(err) {
			continue // f is still first in line
		}
		if err != nil {
			// Failed closed before the file counts as retired: a Checkpoint woken by
			// the count must see the failure, or it would report records durable
			// whose file a start still replays.
			_ = w.fail(fmt.Errorf("wal: checkpoint of %s: %w", w.name(f.num), err))
		}
		w.ckMu.Lock()
		w.full = w.full[1:]
		w.retired++
		if err == nil {
			if len(w.spares) < w.opts.Spares {
				w.spares = append(w.spares, f)
				f = nil
			}
		}
		w.ckCond.Broadcast()
		w.ckMu.Unlock()
		if err != nil {
			continue
		}
		if f != nil {
			_ = f.f.Close() // a surplus free file; removing it is tidiness
			if w.opts.FS.Remove(w.name(f.num)) == nil {
				_ = w.opts.FS.SyncDir(w.dir) // a free file that comes back is reused or removed by Open
			}
		}
	}
}

// checkpoint syncs every data file f's records went to and marks f free.
func (w *WAL) checkpoint(f *file) error {
	if errp := w.failed.Load(); errp != nil {
		return *errp
	}
	// No data file's own sync (SyncOwn) runs from the opens to the check: one that
	// met a lost write-back before the opens has failed the WAL by the check.
	w.ownMu.Lock()
	err := w.syncPaths(f.touched)
	if errp := w.failed.Load(); err == nil && errp != nil {
		err = *errp // a data file's own sync failed meanwhile (Fail): keep the records
	}
	w.ownMu.Unlock()
	if err != nil {
		return err
	}
	if err := freeFile(f); err != nil {
		return err
	}
	w.stats.checkpoints.Add(1)
	return nil
}

func (w *WAL) syncPaths(paths map[string]struct{}) error {
	hs := make([]vfs.File, 0, len(paths))
	defer func() {
		for _, h := range hs {
			_ = h.Close() // opened only to sync; the sync result is what counts
		}
	}()
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		h, err := w.opts.FS.OpenFile(p, os.O_RDWR, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed: nothing of it to keep
		}
		if err != nil {
			return &openError{err}
		}
		hs = append(hs, h)
	}
	if len(hs) == 0 {
		return nil
	}
	return w.opts.Syncer.SyncFiles(hs)
}

// openError is a checkpoint's failure to open a data file it was to sync: unlike a
// failed sync it loses nothing. Out of descriptors or memory (shortage), the
// checkpoint is tried again rather than failing the WAL; any other failure (a file
// system remounted read-only, a file made unwritable, EIO) would fail the same way a
// second later, while the commits waited on the files it cannot free, so it fails the
// WAL closed, and the next start replays the records.
type openError struct{ err error }

// shortage reports whether err is a shortage that passes: descriptors or memory.
func shortage(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN)
}

func (e *openError) Error() string { return "opening a data file to sync it: " + e.err.Error() }
func (e *openError) Unwrap() error { return e.err }

// retryWait is how long the checkpointer waits before it tries again a checkpoint
// whose data file could not be opened.
var retryWait = time.Second

// retryOpen reports the failure to open (OnCheckpointRetry) and waits retryWait before
// the checkpoint is tried again. It returns false when the WAL is closing (its writer
// done, or waiting for a checkpoint to free a file, which would wait for ever): the
// checkpoint then fails the WAL closed, and the next start replays its records.
func (w *WAL) retryOpen(err error) bool {
	if w.opts.OnCheckpointRetry != nil {
		w.opts.OnCheckpointRetry(err)
	}
	deadline := time.Now().Add(retryWait)
	for {
		w.ckMu.Lock()
		stop := w.ckStop || w.closing && w.rotWaits
		w.ckMu.Unlock()
		if stop {
			return false
		}
		if !time.Now().Before(deadline) {
			return true
		}
		time.Sleep(min(10*time.Millisecond, time.Until(deadline)))
	}
}

// Checkpoint makes every span committed so far durable in its data file and frees
// the write-ahead files that held them, so that no record of a file removed after it
// returns can be replayed into a new file at the same path. Callers removing a data
// directory whose path may be used again call it first.
func (w *WAL) Checkpoint() error {
	// A commit of nothing runs a round, which rotates nothing; instead ask the writer
	// for a rotation through an empty marker waiter.
	done := make(chan error, 1)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errors.New("wal: closed; the next Open replays what it holds")
	}
	w.pending = append(w.pending, &waiter{spans: []Span{{Path: rotateMarker}}, err: done})
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if err := <-done; err != nil {
		return err
	}
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	// Only the files full by now, the current one's records among them: files that
	// fill later under a steady load do not hold this Checkpoint back.
	target := w.rotated
	for w.retired < target && w.failed.Load() == nil {
		w.ckCond.Wait()
	}
	if errp := w.failed.Load(); errp != nil {
		return *errp
	}
	return nil
}

// rotateMarker is the Path of the span Checkpoint queues: the round that meets it
// rotates the current file if it holds records, and writes nothing for it.
const rotateMarker = "\x00rotate"

// Stats counts a WAL's work since it opened.
type Stats struct {
	Rounds      uint64        // write-and-sync rounds
	Records     uint64        // spans made durable
	Bytes       uint64        // bytes written to write-ahead files
	Checkpoints uint64        // write-ahead files checkpointed and freed
	Time        time.Duration // spent in rounds
	Held        uint64        // rounds synced holding the writer's processor (HoldProcessor)
	HoldOffs    uint64        // times a slow held sync paused the holding (SlowSync)
	Stalls      uint64        // syncs, held or plain, that took StallSync or more (HoldProcessor)
}

// Stats returns the counts so far.
func (w *WAL) Stats() Stats {
	return Stats{Rounds: w.stats.rounds.Load(), Records: w.stats.records.Load(), Bytes: w.stats.bytes.Load(), Checkpoints: w.stats.checkpoints.Load(), Time: time.Duration(w.stats.nanos.Load()), Held: w.held.Load(), HoldOffs: w.holdOffs.Load(), Stalls: w.stalls.Load()}
}

// Close serves the commits already queued, makes every record durable in its data
// file and frees the write-ahead files, so that a clean stop leaves nothing to
// replay. Later commits fail with ErrNotWritten.
func (w *WAL) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	close(w.quit)
	w.ckMu.Lock()
	w.closing = true
	w.ckMu.Unlock()
	<-w.done
	w.ckMu.Lock()
	w.ckStop = true
	w.ckCond.Broadcast()
	w.ckMu.Unlock()
	<-w.ckDone // every full file checkpointed (or the WAL failed)
	err := w.checkpoint(w.cur)
	for _, f := range append(w.spares, w.cur) {
		if cerr := f.f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

func encodeHeader(seq uint64, inUse bool) []byte {
	b := make([]byte, headerLen)
	copy(b, magic)
	le.PutUint32(b[8:], version)
	le.PutUint64(b[12:], seq)
	if inUse {
		le.PutUint32(b[20:], 1)
	}
	le.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// decodeHeader returns the header's sequence, whether the file is in use, and
// whether the header is valid (a file without one is free).
func decodeHeader(b []byte) (seq uint64, inUse, ok bool) {
	if len(b) < headerLen || string(b[:8]) != magic || le.Uint32(b[8:]) != version || crc32.Checksum(b[:28], castagnoli) != le.Uint32(b[28:]) {
		return 0, false, false
	}
	return le.Uint64(b[12:]), le.Uint32(b[20:]) == 1, true
}

// appendRecord appends one record: length of the body (u32), CRC-32C of the sequence
// and the body (u32), sequence (u64), then the body: path length (u16), path, offset
// (i64), data. The sequence and CRC are filled in by the round.
func appendRecord(b []byte, seq uint64, rel string, off int64, data []byte) []byte {
	n := 2 + len(rel) + 8 + len(data)
	b = le.AppendUint32(b, uint32(n))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, seq)
	b = le.AppendUint16(b, uint16(len(rel)))
	b = append(b, rel...)
	b = le.AppendUint64(b, uint64(off))
	return append(b, data...)
}

// decodeRecord reads the record at the start of b if it is whole, belongs to the use
// seq and passes its CRC.
func decodeRecord(b []byte, seq uint64) (rel string, off int64, data []byte, n int64, ok bool) {
	if len(b) < recHeaderLen {
		return "", 0, nil, 0, false
	}
	body := int64(le.Uint32(b))
	if body < 10 || body > int64(len(b)-recHeaderLen) || le.Uint64(b[8:]) != seq {
		return "", 0, nil, 0, false
	}
	if crc32.Checksum(b[8:recHeaderLen+body], castagnoli) != le.Uint32(b[4:]) {
		return "", 0, nil, 0, false
	}
	p := b[recHeaderLen : recHeaderLen+body]
	pl := int64(le.Uint16(p))
	if 2+pl+8 > body {
		return "", 0, nil, 0, false
	}
	rel = string(p[2 : 2+pl])
	off = int64(le.Uint64(p[2+pl:]))
	// IsLocal, not a look at the first element only: "t/../../x" joined to the root
	// names a file outside it.
	if off < 0 || !filepath.IsLocal(rel) {
		return "", 0, nil, 0, false
	}
	return rel, off, p[2+pl+8:], recHeaderLen + body, true
}
