package partition

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// TestCrashAnywhereInAPartitionsLife: a partition of its own over the node's
// write-ahead file, with segments that roll every few messages and a settle journal
// that rolls every few settles, runs appends, leases, settles, hand-backs, retention
// (rolls and whole segments removed) and queue checkpoints (journal segments
// removed), and closes and opens again in the same process, and its node stops at a
// random file operation: kill -9 (the page cache
// stays) or a power cut (every unsynced byte gone, torn at random), in the middle of
// any of them, including a checkpoint's or a retention's removals and the
// write-ahead file's own rounds and checkpoints. After the replay, six lives in a
// row: no message whose settle was answered is delivered again, and every message
// whose append was answered, not settled and not past a retention cutoff, is.
//
// The existing power-cut tests cover appends and settles under load; none removed
// files while records of them might be in the write-ahead file, nor stopped the node
// within a removal.
func TestCrashAnywhereInAPartitionsLife(t *testing.T) {
	defer func(n int64) { journalSegmentBytes = n }(journalSegmentBytes)
	journalSegmentBytes = 300 // a journal segment every dozen settles or so
	for seed := int64(1); seed <= 300; seed++ {
		crashAnywhere(t, seed)
		if t.Failed() {
			t.Logf("seed %d failed", seed)
			return
		}
	}
}

func crashAnywhere(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mem := vfs.NewMem()
	now := int64(1_000_000)
	wall := func() int64 { return now }
	stored := map[string]int64{} // answered appends: their timestamp
	settled := map[string]bool{} // answered settles
	unknown := map[string]bool{} // settles that failed: they may have been stored
	maxCut := int64(0)           // the latest retention cutoff asked for
	stoppedAt := "nothing"       // the operation the last life stopped at
	// check opens the partition as a start does and holds it to what was answered; it
	// reports false if the process stopped meanwhile (nothing checked).
	check := func(fsys vfs.FS, stopped func() bool, life int) (*wal.WAL, *Partition, bool) {
		w, _, err := wal.Open("/wal", wal.Options{FS: fsys, Root: "/", FileBytes: 4 << 10})
		if err != nil {
			if !stopped() {
				t.Fatalf("seed %d life %d (the last stopped at %s): replay: %v", seed, life, stoppedAt, err)
			}
			return nil, nil, false
		}
		p, err := Open(Options{Dir: "/p", FS: fsys, Queue: testQueue, WAL: w, WallClock: wall, Logger: quiet, SegmentBytes: 700, CheckpointEvery: 1 + rng.Intn(4)})
		if err != nil {
			if !stopped() {
				t.Fatalf("seed %d life %d (the last stopped at %s): open: %v", seed, life, stoppedAt, err)
			}
			_ = w.Close()
			return nil, nil, false
		}
		ds, err := p.Lease(1<<20, time.Minute, 1<<40)
		if err != nil || stopped() {
			// Stopped meanwhile (a goroutine of the write-ahead file or of a log met
			// the stop): the lease may have failed to read what it granted.
			return w, p, false
		}
		if lr, jr := p.Damage(); lr+jr != 0 {
			t.Errorf("seed %d life %d (the last stopped at %s): %d damaged messages, %d damaged settle records after a stop", seed, life, stoppedAt, lr, jr)
		}
		seen := map[string]bool{}
		for _, d := range ds {
			v := string(d.Record.Value)
			if settled[v] {
				t.Errorf("seed %d life %d (the last stopped at %s): %s was settled and is delivered again", seed, life, stoppedAt, v)
			}
			seen[v] = true
		}
		for v, ts := range stored {
			if !settled[v] && !unknown[v] && !seen[v] && ts >= maxCut {
				t.Errorf("seed %d life %d (the last stopped at %s): %s (stamped %d, retention cutoff %d) was answered and is lost", seed, life, stoppedAt, v, ts, maxCut)
			}
		}
		for _, d := range ds {
			_ = p.HandBack(d.Record.Offset, d.Nonce) // in memory only
		}
		return w, p, true
	}
	for life := range 6 {
		// A start on what the disk kept: checked, then worked until it stops. No clean
		// stop in between: a life goes on from whatever the last one left.
		sf := &stopFS{mem: mem, rng: rand.New(rand.NewSource(rng.Int63())), at: int64(30 + rng.Intn(600)), kill: rng.Intn(3) == 0}
		w, p, ok := check(sf, sf.stopped.Load, life)
		if ok {
			reopen := func(p *Partition) (*Partition, error) {
				if err := p.Close(); err != nil {
					return nil, err
				}
				return Open(Options{Dir: "/p", FS: sf, Queue: testQueue, WAL: w, WallClock: wall, Logger: quiet, SegmentBytes: 700, CheckpointEvery: 1 + rng.Intn(4)})
			}
			p = lifeUntilStopped(p, reopen, rng, life, &now, stored, settled, unknown, &maxCut)
		}
		sf.waitStopped()
		if p != nil {
			_ = p.closeFiles()
		}
		if w != nil {
			_ = w.Close() // fails: its files went with the process
		}
		if t.Failed() {
			return
		}
		if sf.stopped.Load() {
			stoppedAt = sf.what + map[bool]string{true: " (kill -9)", false: " (power cut)"}[sf.kill]
		}
	}
	w, p, _ := check(mem, func() bool { return false }, 6)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// lifeUntilStopped runs random work on p until its file system stops, and returns the
// partition then open (reopen closes p and opens it again, in the same process).
func lifeUntilStopped(p *Partition, reopen func(*Partition) (*Partition, error), rng *rand.Rand, life int, now *int64, stored map[string]int64, settled, unknown map[string]bool, maxCut *int64) *Partition {
	for n := 0; ; n++ {
		switch r := rng.Intn(10); {
		case r < 5:
			v := fmt.Sprintf("%d-%d", life, n)
			if _, err := p.Append([]segment.Record{{Value: []byte(v)}}); err != nil {
				return p
			}
			stored[v] = *now
			if rng.Intn(8) == 0 {
				*now += 100
			}
		case r < 8:
			ds, err := p.Lease(1+rng.Intn(5), time.Minute, 1<<20)
			if err != nil {
				return p
			}
			for _, d := range ds {
				v := string(d.Record.Value)
				if rng.Intn(4) == 0 {
					_ = p.HandBack(d.Record.Offset, d.Nonce)
				} else if err := settleOne(p, d); err == nil {
					settled[v] = true
				} else {
					unknown[v] = true // not answered, but it may be in the journal
				}
			}
		case r < 9:
			cut := *now - int64(rng.Intn(2000))
			*maxCut = max(*maxCut, cut) // a retention that fails may have removed some
			if _, err := p.EnforceRetention(cut); err != nil {
				return p
			}
		default:
			if rng.Intn(3) == 0 {
				// Closed and opened again by the same process, records of its files
				// still in the write-ahead file, a background checkpoint maybe still
				// under way.
				np, err := reopen(p)
				if err != nil {
					return p
				}
				p = np
			} else if err := p.Checkpoint(); err != nil {
				return p
			}
		}
	}
}

// stopFS is a node's disk (mem) as its process sees it until the process stops, at
// its at-th operation that changes something: then every operation fails, and with
// a power cut (kill false) mem loses what was not synced, torn at random. Operations
// run under a read lock the stop takes for writing, so none lands after it.
type stopFS struct {
	mem  *vfs.Mem
	rng  *rand.Rand // its own: the stop may come on any goroutine
	at   int64
	kill bool

	mu      sync.RWMutex
	n       atomic.Int64
	stopped atomic.Bool
	what    string // the operation it stopped at
}

var errStopped = errors.New("the process is stopped")

// do runs op unless the process stopped; the at-th call stops it instead.
func (f *stopFS) do(op, name string, fn func() error) error {
	f.mu.RLock()
	if f.stopped.Load() {
		f.mu.RUnlock()
		return &fs.PathError{Op: op, Path: name, Err: errStopped}
	}
	if f.n.Add(1) != f.at {
		err := fn()
		f.mu.RUnlock()
		return err
	}
	f.mu.RUnlock()
	f.mu.Lock()
	if !f.stopped.Swap(true) {
		f.what = op + " " + name
		if !f.kill {
			f.mem.CrashTorn(f.rng)
		}
	}
	f.mu.Unlock()
	return &fs.PathError{Op: op, Path: name, Err: errStopped}
}

// read runs a read unless the process stopped.
func (f *stopFS) read(op, name string, fn func() error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.stopped.Load() {
		return &fs.PathError{Op: op, Path: name, Err: errStopped}
	}
	return fn()
}

// waitStopped returns once no operation is under way: a stop that began is complete.
func (f *stopFS) waitStopped() {
	f.mu.Lock()
	_ = f.what // read under the lock the stop writes it under
	f.mu.Unlock()
}

func (f *stopFS) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	var h vfs.File
	if err := f.do("open", name, func() (err error) { h, err = f.mem.OpenFile(name, flag, perm); return err }); err != nil {
		return nil, err
	}
	return &stopFile{File: h, fs: f, name: name}, nil
}

func (f *stopFS) Remove(name string) error {
	return f.do("remove", name, func() error { return f.mem.Remove(name) })
}

func (f *stopFS) Rename(oldname, newname string) error {
	return f.do("rename", oldname, func() error { return f.mem.Rename(oldname, newname) })
}

func (f *stopFS) Stat(name string) (fi vfs.FileInfo, err error) {
	err = f.read("stat", name, func() error { fi, err = f.mem.Stat(name); return err })
	return fi, err
}

func (f *stopFS) ReadDir(dir string) (out []vfs.FileInfo, err error) {
	err = f.read("readdir", dir, func() error { out, err = f.mem.ReadDir(dir); return err })
	return out, err
}

func (f *stopFS) MkdirAll(dir string, perm fs.FileMode) error {
	return f.do("mkdir", dir, func() error { return f.mem.MkdirAll(dir, perm) })
}

func (f *stopFS) SyncDir(dir string) error {
	return f.do("syncdir", dir, func() error { return f.mem.SyncDir(dir) })
}

type stopFile struct {
	vfs.File
	fs   *stopFS
	name string
}

func (h *stopFile) WriteAt(b []byte, off int64) (n int, err error) {
	err = h.fs.do("write", h.name, func() error { n, err = h.File.WriteAt(b, off); return err })
	return n, err
}

func (h *stopFile) Sync() error { return h.fs.do("sync", h.name, h.File.Sync) }

func (h *stopFile) Truncate(size int64) error {
	return h.fs.do("truncate", h.name, func() error { return h.File.Truncate(size) })
}

func (h *stopFile) Allocate(size int64) error {
	return h.fs.do("allocate", h.name, func() error { return h.File.(vfs.Allocator).Allocate(size) })
}
