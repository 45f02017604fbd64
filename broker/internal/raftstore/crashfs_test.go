package raftstore

import (
	"errors"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sync"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// crashMode is what a simulated power loss keeps of what was not synced.
type crashMode int

const (
	// crashClean keeps nothing that was not synced (vfs.Mem.Crash).
	crashClean crashMode = iota
	// crashTorn keeps a random prefix of each file's unsynced appends
	// (vfs.Mem.CrashTorn).
	crashTorn
	// crashWriteback keeps every unsynced write's data but not an unsynced
	// truncate: the page cache wrote the data blocks back, the shrunk size never
	// reached the disk. A file truncated and rewritten without a sync in between
	// then shows the new bytes with the old ones after them.
	crashWriteback
)

func (m crashMode) String() string {
	return [...]string{"clean", "torn", "writeback"}[m]
}

var errPowerLoss = errors.New("simulated power loss")

// crashFS wraps a vfs.Mem and simulates a power loss just before the n-th mutating
// operation (write, truncate, sync, create, remove, rename, directory sync) after
// arm. From then on every operation fails, as if the process were gone; the test
// then opens a new store on the Mem, as a restarted process would.
type crashFS struct {
	mem  *vfs.Mem
	mode crashMode
	rng  *rand.Rand

	mu      sync.Mutex
	armed   bool
	at, n   int
	crashed bool
	ops     []string
	pending map[string][]pendingWrite // writeback mode: unsynced writes per file
}

type pendingWrite struct {
	off  int64
	data []byte
}

func newCrashFS(mem *vfs.Mem, mode crashMode, seed int64) *crashFS {
	return &crashFS{mem: mem, mode: mode, rng: rand.New(rand.NewSource(seed)), pending: map[string][]pendingWrite{}}
}

// arm schedules the crash before the at-th mutating operation from now.
func (c *crashFS) arm(at int) {
	c.mu.Lock()
	c.armed, c.at, c.n, c.ops = true, at, 0, nil
	c.mu.Unlock()
}

// step counts one mutating operation and crashes when its turn has come.
func (c *crashFS) step(op, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed {
		return errPowerLoss
	}
	if !c.armed {
		return nil
	}
	c.n++
	c.ops = append(c.ops, op+" "+filepath.Base(name))
	if c.n < c.at {
		return nil
	}
	c.crashed = true
	images := map[string][]byte{}
	if c.mode == crashWriteback {
		for name, ws := range c.pending {
			img, err := c.mem.Durable(name)
			if err != nil {
				continue
			}
			for _, w := range ws {
				if end := w.off + int64(len(w.data)); end > int64(len(img)) {
					img = append(img, make([]byte, end-int64(len(img)))...)
				}
				copy(img[w.off:], w.data)
			}
			images[name] = img
		}
	}
	if c.mode == crashTorn {
		c.mem.CrashTorn(c.rng)
	} else {
		c.mem.Crash()
	}
	for name, img := range images {
		if _, err := c.mem.Stat(name); err == nil {
			_ = c.mem.WriteFile(name, img) // the file survived the crash: give it the written-back bytes
		}
	}
	return errPowerLoss
}

// disarm lets every later operation through: the operation under test is done.
func (c *crashFS) disarm() {
	c.mu.Lock()
	c.armed = false
	c.mu.Unlock()
}

func (c *crashFS) crashedNow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed
}

func (c *crashFS) opsSeen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.ops...)
}

func (c *crashFS) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	if flag&os.O_CREATE != 0 {
		if err := c.step("create", name); err != nil {
			return nil, err
		}
	}
	f, err := c.mem.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if flag&os.O_TRUNC != 0 {
		c.mu.Lock()
		delete(c.pending, filepath.Clean(name))
		c.mu.Unlock()
	}
	return &crashFile{File: f, c: c, name: filepath.Clean(name)}, nil
}

func (c *crashFS) Remove(name string) error {
	if err := c.step("remove", name); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.pending, filepath.Clean(name))
	c.mu.Unlock()
	return c.mem.Remove(name)
}

func (c *crashFS) Rename(oldname, newname string) error {
	if err := c.step("rename", newname); err != nil {
		return err
	}
	c.mu.Lock()
	c.pending[filepath.Clean(newname)] = c.pending[filepath.Clean(oldname)]
	delete(c.pending, filepath.Clean(oldname))
	c.mu.Unlock()
	return c.mem.Rename(oldname, newname)
}

func (c *crashFS) Stat(name string) (vfs.FileInfo, error)     { return c.mem.Stat(name) }
func (c *crashFS) ReadDir(dir string) ([]vfs.FileInfo, error) { return c.mem.ReadDir(dir) }
func (c *crashFS) MkdirAll(dir string, perm fs.FileMode) error {
	if err := c.step("mkdir", dir); err != nil {
		return err
	}
	return c.mem.MkdirAll(dir, perm)
}

func (c *crashFS) SyncDir(dir string) error {
	if err := c.step("syncdir", dir); err != nil {
		return err
	}
	return c.mem.SyncDir(dir)
}

type crashFile struct {
	vfs.File
	c    *crashFS
	name string
}

func (f *crashFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.c.step("write", f.name); err != nil {
		return 0, err
	}
	f.c.mu.Lock()
	f.c.pending[f.name] = append(f.c.pending[f.name], pendingWrite{off: off, data: append([]byte(nil), p...)})
	f.c.mu.Unlock()
	return f.File.WriteAt(p, off)
}

func (f *crashFile) Truncate(size int64) error {
	if err := f.c.step("truncate", f.name); err != nil {
		return err
	}
	return f.File.Truncate(size)
}

func (f *crashFile) Sync() error {
	if err := f.c.step("sync", f.name); err != nil {
		return err
	}
	if err := f.File.Sync(); err != nil {
		return err
	}
	f.c.mu.Lock()
	delete(f.c.pending, f.name)
	f.c.mu.Unlock()
	return nil
}
