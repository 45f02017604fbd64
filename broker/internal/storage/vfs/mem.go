package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrCrashed is returned by operations on a Mem file handle that was opened
// before a simulated crash; the process that held it is, in the model, gone.
var ErrCrashed = errors.New("vfs: file handle from before a simulated crash")

// Mem is an in-memory FS for tests that models what survives a power loss. Every
// file has the bytes a reader sees now and the bytes last made durable by Sync;
// every directory has the entries readers see now and the entries last made
// durable by SyncDir. Crash throws away everything that was not made durable.
// A directory created with MkdirAll is an entry of its parent like any file: it
// survives a crash only once its parent was synced with SyncDir (and the parent
// itself survives), and with it go the files inside it. The zero value is not
// usable; call NewMem. All methods are safe for concurrent use.
type Mem struct {
	mu         sync.Mutex
	gen        uint64               // bumped by every crash; older handles are dead
	files      map[string]*memInode // names visible now
	durable    map[string]*memInode // names as of the last SyncDir of their directory
	dirs       map[string]bool      // directories visible now
	durableDir map[string]bool      // directories whose entry in their parent was synced
	syncs      int64                // successful and failed File.Sync calls
	dirSyncs   int64                // SyncDir calls
	bytesRead  int64                // bytes returned by ReadAt
	failSyncIn int                  // when > 0, the failSyncIn-th next Sync fails with EIO
	free       int64                // bytes writes may still add; < 0 means unlimited
	syncDelay  time.Duration        // how long each Sync takes
}

type memInode struct {
	data   []byte // what reads see
	synced []byte // what survives a crash
}

// NewMem returns an empty Mem with unlimited space and no faults armed.
func NewMem() *Mem {
	return &Mem{
		files:      map[string]*memInode{},
		durable:    map[string]*memInode{},
		dirs:       map[string]bool{"/": true, ".": true},
		durableDir: map[string]bool{"/": true, ".": true},
		free:       -1,
	}
}

var _ FS = (*Mem)(nil)

func pathErr(op, name string, err error) error { return &fs.PathError{Op: op, Path: name, Err: err} }

// OpenFile opens or creates name; the parent directory must exist.
func (m *Mem) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if flag&os.O_APPEND != 0 {
		return nil, pathErr("open", name, errors.New("O_APPEND is not supported"))
	}
	if m.dirs[name] {
		return nil, pathErr("open", name, syscall.EISDIR)
	}
	if !m.dirs[filepath.Dir(name)] {
		return nil, pathErr("open", name, fs.ErrNotExist)
	}
	writable := flag&(os.O_WRONLY|os.O_RDWR) != 0
	ino := m.files[name]
	switch {
	case ino == nil && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, fs.ErrNotExist)
	case ino == nil:
		ino = &memInode{}
		m.files[name] = ino
	case flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, pathErr("open", name, fs.ErrExist)
	}
	if flag&os.O_TRUNC != 0 && writable {
		ino.data = ino.data[:0]
	}
	return &memFile{m: m, ino: ino, name: name, gen: m.gen, writable: writable}, nil
}

// Remove unlinks name, a file or an empty directory; open handles keep working. A
// directory's removal is durable once its parent is synced.
func (m *Mem) Remove(name string) error {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.files[name] == nil {
		if !m.dirs[name] {
			return pathErr("remove", name, fs.ErrNotExist)
		}
		for f := range m.files {
			if filepath.Dir(f) == name {
				return pathErr("remove", name, syscall.ENOTEMPTY)
			}
		}
		for d := range m.dirs {
			if d != name && filepath.Dir(d) == name {
				return pathErr("remove", name, syscall.ENOTEMPTY)
			}
		}
		delete(m.dirs, name)
		return nil
	}
	delete(m.files, name)
	return nil
}

// Rename moves oldname to newname, replacing newname. A directory moves with
// everything in it, to a newname that does not exist (nor inside it); as on a disk,
// the entries inside it travel with it at once, and its own move is durable once the
// parents of both names are synced: a crash before that brings it back at oldname.
func (m *Mem) Rename(oldname, newname string) error {
	oldname, newname = filepath.Clean(oldname), filepath.Clean(newname)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dirs[oldname] {
		return m.renameDir(oldname, newname)
	}
	ino := m.files[oldname]
	if ino == nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	if !m.dirs[filepath.Dir(newname)] || m.dirs[newname] {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrInvalid}
	}
	delete(m.files, oldname)
	m.files[newname] = ino
	return nil
}

// under reports whether name lies inside dir, and its path relative to dir.
func under(name, dir string) (string, bool) {
	rest, ok := strings.CutPrefix(name, dir+string(filepath.Separator))
	return rest, ok && dir != name
}

// renameDir is Rename of the directory oldname. m.mu is held.
func (m *Mem) renameDir(oldname, newname string) error {
	_, inside := under(newname, oldname)
	if !m.dirs[filepath.Dir(newname)] || m.dirs[newname] || m.files[newname] != nil || inside || filepath.Dir(oldname) == oldname {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrInvalid}
	}
	moved := func(name string) (string, bool) {
		if name == oldname {
			return newname, true
		}
		rest, ok := under(name, oldname)
		return filepath.Join(newname, rest), ok
	}
	// What readers see moves now.
	files := map[string]*memInode{}
	for name, ino := range m.files {
		if to, ok := moved(name); ok {
			delete(m.files, name)
			files[to] = ino
		}
	}
	maps.Copy(m.files, files)
	var dirs []string
	for d := range m.dirs {
		if to, ok := moved(d); ok {
			delete(m.dirs, d)
			dirs = append(dirs, to)
		}
	}
	for _, d := range dirs {
		m.dirs[d] = true
	}
	// The entries inside the directory are the directory's own, not its parent's: the
	// durable ones are durable under the new name too. Under the old name they stay
	// until a sync of its parent makes the move durable (SyncDir drops them then).
	durable := map[string]*memInode{}
	for name, ino := range m.durable {
		if rest, ok := under(name, oldname); ok {
			durable[filepath.Join(newname, rest)] = ino
		}
	}
	maps.Copy(m.durable, durable)
	var durableDirs []string
	for d := range m.durableDir {
		if rest, ok := under(d, oldname); ok {
			durableDirs = append(durableDirs, filepath.Join(newname, rest))
		}
	}
	for _, d := range durableDirs {
		m.durableDir[d] = true
	}
	return nil
}

// forgetDurableUnder drops what a crash would keep inside dir, a directory that is
// durably gone from its parent (removed or renamed away) or newly made in its place:
// nothing of an earlier directory of that name may come back inside it. m.mu is held.
func (m *Mem) forgetDurableUnder(dir string) {
	for name := range m.durable {
		if _, ok := under(name, dir); ok {
			delete(m.durable, name)
		}
	}
	for d := range m.durableDir {
		if _, ok := under(d, dir); ok {
			delete(m.durableDir, d)
		}
	}
}

// Stat describes name.
func (m *Mem) Stat(name string) (FileInfo, error) {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dirs[name] {
		return FileInfo{Name: filepath.Base(name), IsDir: true}, nil
	}
	ino := m.files[name]
	if ino == nil {
		return FileInfo{}, pathErr("stat", name, fs.ErrNotExist)
	}
	return FileInfo{Name: filepath.Base(name), Size: int64(len(ino.data))}, nil
}

// ReadDir lists the files and directories directly inside dir.
func (m *Mem) ReadDir(dir string) ([]FileInfo, error) {
	dir = filepath.Clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[dir] {
		return nil, pathErr("readdir", dir, fs.ErrNotExist)
	}
	var out []FileInfo
	for name, ino := range m.files {
		if filepath.Dir(name) == dir {
			out = append(out, FileInfo{Name: filepath.Base(name), Size: int64(len(ino.data))})
		}
	}
	for d := range m.dirs {
		if d != dir && filepath.Dir(d) == dir {
			out = append(out, FileInfo{Name: filepath.Base(d), IsDir: true})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MkdirAll creates dir and its parents; each new entry is durable only after
// SyncDir of its parent.
func (m *Mem) MkdirAll(dir string, perm fs.FileMode) error {
	dir = filepath.Clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	for d := dir; !m.dirs[d]; d = filepath.Dir(d) {
		if m.files[d] != nil {
			return pathErr("mkdir", d, syscall.ENOTDIR)
		}
		m.dirs[d] = true
		m.forgetDurableUnder(d) // a new directory is empty, whatever one of its name held
	}
	return nil
}

// SyncDir makes the current entries of dir durable.
func (m *Mem) SyncDir(dir string) error {
	dir = filepath.Clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[dir] {
		return pathErr("syncdir", dir, fs.ErrNotExist)
	}
	m.dirSyncs++
	for d := range m.durableDir {
		if d != dir && filepath.Dir(d) == dir && !m.dirs[d] {
			delete(m.durableDir, d) // removed, or renamed away
			m.forgetDurableUnder(d)
		}
	}
	for d := range m.dirs {
		if d != dir && filepath.Dir(d) == dir {
			m.durableDir[d] = true
		}
	}
	for name := range m.durable {
		if filepath.Dir(name) == dir {
			delete(m.durable, name)
		}
	}
	for name, ino := range m.files {
		if filepath.Dir(name) == dir {
			m.durable[name] = ino
		}
	}
	return nil
}

// Crash simulates a power loss: every file goes back to its last synced
// contents, every directory to its last synced entries (a directory whose own
// entry was never synced is gone, with everything in it), and handles opened
// before the crash fail with ErrCrashed.
func (m *Mem) Crash() { m.crash(nil, nil) }

// CrashTorn is Crash, except that a file written past its last Sync keeps a
// random prefix of the unsynced bytes, as a torn write would.
func (m *Mem) CrashTorn(r *rand.Rand) { m.crash(r, nil) }

// CrashHoled is Crash, except that a file holed picks, written past its last Sync,
// keeps every unsynced byte but one random sector of them, which reads as zeros: the
// disk wrote the later pages of those writes and lost an earlier one.
func (m *Mem) CrashHoled(r *rand.Rand, holed func(name string) bool) { m.crash(r, holed) }

// holeSector is the size of the span CrashHoled zeroes.
const holeSector = 512

func (m *Mem) crash(r *rand.Rand, holed func(string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	kept := func(d string) bool {
		for ; ; d = filepath.Dir(d) {
			if !m.durableDir[d] {
				return false
			}
			if filepath.Dir(d) == d {
				return true
			}
		}
	}
	dirs := map[string]bool{}
	for _, set := range []map[string]bool{m.dirs, m.durableDir} { // a removal not synced comes undone
		for d := range set {
			if kept(d) {
				dirs[d] = true
			}
		}
	}
	for d := range m.durableDir {
		if !dirs[d] {
			delete(m.durableDir, d)
		}
	}
	m.dirs = dirs
	m.files = make(map[string]*memInode, len(m.durable))
	for name, ino := range m.durable {
		if !m.dirs[filepath.Dir(name)] {
			delete(m.durable, name)
			continue
		}
		kept := ino.synced
		switch {
		case r == nil || len(ino.data) <= len(ino.synced) || !bytes.HasPrefix(ino.data, ino.synced):
		case holed == nil:
			kept = ino.data[:len(ino.synced)+r.Intn(len(ino.data)-len(ino.synced)+1)]
		case holed(name):
			kept = bytes.Clone(ino.data)
			at := len(ino.synced) + r.Intn(len(ino.data)-len(ino.synced))
			clear(kept[at:min(at+holeSector, len(kept))])
		}
		ino.data = bytes.Clone(kept)
		ino.synced = bytes.Clone(kept)
		m.files[name] = ino
	}
}

// FailSync arms a fault: the n-th File.Sync from now (n = 1: the next one)
// fails with EIO and makes nothing durable. n <= 0 disarms it.
func (m *Mem) FailSync(n int) {
	m.mu.Lock()
	m.failSyncIn = max(n, 0)
	m.mu.Unlock()
}

// SetFreeSpace limits how many more bytes writes may add to files; a write that
// would pass the limit writes what fits and fails with ENOSPC. n < 0 removes the
// limit.
func (m *Mem) SetFreeSpace(n int64) {
	m.mu.Lock()
	m.free = n
	m.mu.Unlock()
}

// SetSyncDelay makes every File.Sync take d, like a real disk flush.
func (m *Mem) SetSyncDelay(d time.Duration) {
	m.mu.Lock()
	m.syncDelay = d
	m.mu.Unlock()
}

// Syncs returns how many File.Sync calls were made, failed ones included.
func (m *Mem) Syncs() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

// Durable returns the bytes of name that a crash now would keep (as of its last
// successful Sync), or an error matching fs.ErrNotExist.
func (m *Mem) Durable(name string) ([]byte, error) {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino := m.files[name]
	if ino == nil {
		return nil, pathErr("durable", name, fs.ErrNotExist)
	}
	return bytes.Clone(ino.synced), nil
}

// DirSyncs returns how many SyncDir calls were made.
func (m *Mem) DirSyncs() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dirSyncs
}

// BytesRead returns how many bytes ReadAt has returned, to check that a reader
// touched only what it should.
func (m *Mem) BytesRead() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytesRead
}

// ReadFile returns a copy of what a reader of name sees now.
func (m *Mem) ReadFile(name string) ([]byte, error) {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino := m.files[name]
	if ino == nil {
		return nil, pathErr("readfile", name, fs.ErrNotExist)
	}
	return bytes.Clone(ino.data), nil
}

// WriteFile creates or replaces name with data, durably (contents and entry, and
// the entries of the directories above it), as if it had been on disk all along.
func (m *Mem) WriteFile(name string, data []byte) error {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[filepath.Dir(name)] {
		return pathErr("writefile", name, fs.ErrNotExist)
	}
	ino := &memInode{data: bytes.Clone(data), synced: bytes.Clone(data)}
	m.files[name] = ino
	m.durable[name] = ino
	for d := filepath.Dir(name); !m.durableDir[d]; d = filepath.Dir(d) {
		m.durableDir[d] = true
	}
	return nil
}

// FlipByte damages name on "disk": the byte at off is XORed with mask both in
// what readers see and in what survives a crash.
func (m *Mem) FlipByte(name string, off int64, mask byte) error {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino := m.files[name]
	if ino == nil {
		return pathErr("flipbyte", name, fs.ErrNotExist)
	}
	if off < 0 || off >= int64(len(ino.data)) {
		return pathErr("flipbyte", name, fs.ErrInvalid)
	}
	ino.data[off] ^= mask
	if off < int64(len(ino.synced)) {
		ino.synced[off] ^= mask
	}
	return nil
}

// TruncateFile damages name on "disk": both what readers see and what survives
// a crash are cut to at most size bytes.
func (m *Mem) TruncateFile(name string, size int64) error {
	name = filepath.Clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino := m.files[name]
	if ino == nil {
		return pathErr("truncatefile", name, fs.ErrNotExist)
	}
	if size < 0 {
		return pathErr("truncatefile", name, fs.ErrInvalid)
	}
	ino.data = ino.data[:min(size, int64(len(ino.data)))]
	ino.synced = ino.synced[:min(size, int64(len(ino.synced)))]
	return nil
}

type memFile struct {
	m        *Mem
	ino      *memInode
	name     string
	gen      uint64
	writable bool
	closed   bool // guarded by m.mu
}

// check reports why the handle cannot be used; m.mu must be held.
func (f *memFile) check(op string, write bool) error {
	switch {
	case f.closed:
		return pathErr(op, f.name, fs.ErrClosed)
	case f.gen != f.m.gen:
		return pathErr(op, f.name, ErrCrashed)
	case write && !f.writable:
		return pathErr(op, f.name, syscall.EBADF)
	}
	return nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("read", f.name, fs.ErrInvalid)
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.ino.data[off:])
	f.m.bytesRead += int64(n)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("write", f.name, fs.ErrInvalid)
	}
	var err error
	end := off + int64(len(p))
	if grow := end - int64(len(f.ino.data)); grow > 0 && f.m.free >= 0 && grow > f.m.free {
		end = int64(len(f.ino.data)) + f.m.free
		p = p[:max(end-off, 0)]
		end = max(end, off)
		err = pathErr("write", f.name, syscall.ENOSPC)
	}
	if grow := end - int64(len(f.ino.data)); grow > 0 {
		if f.m.free >= 0 {
			f.m.free -= grow
		}
		f.ino.data = append(f.ino.data, make([]byte, grow)...)
	}
	n := copy(f.ino.data[off:end], p)
	return n, err
}

// Allocate extends the file with zeros to size, all or nothing: ENOSPC when the free
// space set by SetFreeSpace cannot hold it. Like the rest of a write, the new size is
// durable only after Sync.
func (f *memFile) Allocate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("fallocate", true); err != nil {
		return err
	}
	grow := size - int64(len(f.ino.data))
	if grow <= 0 {
		return nil
	}
	if f.m.free >= 0 {
		if grow > f.m.free {
			return pathErr("fallocate", f.name, syscall.ENOSPC)
		}
		f.m.free -= grow
	}
	f.ino.data = append(f.ino.data, make([]byte, grow)...)
	return nil
}

func (f *memFile) Sync() error {
	f.m.mu.Lock()
	if err := f.check("sync", false); err != nil {
		f.m.mu.Unlock()
		return err
	}
	f.m.syncs++
	delay := f.m.syncDelay
	var err error
	if f.m.failSyncIn > 0 {
		f.m.failSyncIn--
		if f.m.failSyncIn == 0 {
			err = pathErr("sync", f.name, syscall.EIO)
		}
	}
	if err == nil {
		f.ino.synced = bytes.Clone(f.ino.data)
	}
	f.m.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	return err
}

func (f *memFile) Truncate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return pathErr("truncate", f.name, fs.ErrInvalid)
	}
	if size <= int64(len(f.ino.data)) {
		f.ino.data = f.ino.data[:size]
	} else {
		f.ino.data = append(f.ino.data, make([]byte, size-int64(len(f.ino.data)))...)
	}
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("stat", false); err != nil {
		return 0, err
	}
	return int64(len(f.ino.data)), nil
}

func (f *memFile) Close() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, fs.ErrClosed)
	}
	f.closed = true
	return nil
}
