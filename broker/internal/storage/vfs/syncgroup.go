package vfs

import (
	"sync"
	"sync/atomic"
	"time"
)

// FilesSyncer makes several files durable at once, cheaper than one Sync per file
// where the file system allows (FSSyncer, with syncfs(2) on Linux).
type FilesSyncer interface {
	// SyncFiles makes the data written so far, and the size, of every file in files
	// durable, as Sync on each would. It may make other files durable too. An error
	// means any of them may not be.
	SyncFiles(files []File) error
}

// EachFile is the FilesSyncer of any FS: a Sync of each file in turn.
type EachFile struct{}

// SyncFiles syncs each file, stopping at the first error.
func (EachFile) SyncFiles(files []File) error {
	for _, f := range files {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// SyncGroup shares durability work between files written concurrently, such as the
// logs of every partition of a node: Sync calls that arrive while a round is running
// are served together by the next round, one SyncFiles call for all of them. A round
// begins only after its callers' writes have returned, so a caller's data is durable
// when its Sync returns nil. It is safe for concurrent use; the zero value is not
// usable, call NewSyncGroup.
type SyncGroup struct {
	syncer  FilesSyncer
	mu      sync.Mutex
	pending []*syncWaiter
	kick    chan struct{}
	quit    chan struct{}
	done    chan struct{}
	closed  bool
	rounds  atomic.Uint64
	files   atomic.Uint64
	nanos   atomic.Uint64
	observe atomic.Pointer[func(files int, d time.Duration)]
}

// Observe has f called after every round with the number of files it made durable
// and how long it took (for the node's sync histograms). f runs on the group's one
// goroutine, before the round's callers are answered: it must be quick.
func (g *SyncGroup) Observe(f func(files int, d time.Duration)) { g.observe.Store(&f) }

type syncWaiter struct {
	f   File
	err chan error
}

var waiterPool = sync.Pool{New: func() any { return &syncWaiter{err: make(chan error, 1)} }}

// NewSyncGroup starts a group whose rounds go through s. Close stops it.
func NewSyncGroup(s FilesSyncer) *SyncGroup {
	g := &SyncGroup{syncer: s, kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

// Sync makes f's written data and size durable, sharing the work with concurrent
// callers. After Close it syncs f by itself.
func (g *SyncGroup) Sync(f File) error {
	w := waiterPool.Get().(*syncWaiter)
	w.f = f
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		waiterPool.Put(w)
		return f.Sync()
	}
	g.pending = append(g.pending, w)
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default: // a kick is already waiting; the round it starts will take this waiter
	}
	err := <-w.err
	w.f = nil
	waiterPool.Put(w)
	return err
}

// run serves rounds until Close: each takes every waiter queued so far.
func (g *SyncGroup) run() {
	defer close(g.done)
	var batch []*syncWaiter
	var files []File
	for {
		select {
		case <-g.kick:
		case <-g.quit:
			return
		}
		for {
			g.mu.Lock()
			batch, g.pending = g.pending, batch[:0]
			g.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			// A file appears once: each log has one writer, waiting for its own Sync.
			files = files[:0]
			for _, w := range batch {
				files = append(files, w.f)
			}
			start := time.Now()
			err := g.syncer.SyncFiles(files)
			took := time.Since(start)
			g.nanos.Add(uint64(took))
			if f := g.observe.Load(); f != nil {
				(*f)(len(files), took)
			}
			g.rounds.Add(1)
			g.files.Add(uint64(len(files)))
			for _, w := range batch {
				w.err <- err
			}
			clear(batch)
			clear(files)
		}
	}
}

// SyncStats counts a SyncGroup's work since it started.
type SyncStats struct {
	Rounds uint64        // SyncFiles calls
	Files  uint64        // files they made durable
	Time   time.Duration // spent in SyncFiles
}

// Stats returns the group's counts so far.
func (g *SyncGroup) Stats() SyncStats {
	return SyncStats{Rounds: g.rounds.Load(), Files: g.files.Load(), Time: time.Duration(g.nanos.Load())}
}

// Close stops the group once the waiters already queued are served; later Sync
// calls sync their file alone.
func (g *SyncGroup) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	g.mu.Unlock()
	// Serve whoever queued before closed was set, then stop.
	select {
	case g.kick <- struct{}{}:
	default:
	}
	close(g.quit)
	<-g.done
	g.mu.Lock()
	rest := g.pending
	g.pending = nil
	g.mu.Unlock()
	for _, w := range rest {
		w.err <- w.f.Sync()
	}
}
