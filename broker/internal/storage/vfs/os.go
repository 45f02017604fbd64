package vfs

import (
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// OS is the FS of the operating system. Its Sync uses fdatasync where the platform
// has it, which still makes a grown file size durable but skips timestamps.
type OS struct{}

var _ FS = OS{}

// OpenFile opens name with os.OpenFile.
func (OS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// Remove unlinks name.
func (OS) Remove(name string) error { return os.Remove(name) }

// Rename renames oldname to newname.
func (OS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Stat describes name.
func (OS) Stat(name string) (FileInfo, error) {
	st, err := os.Stat(name)
	if err != nil {
		return FileInfo{}, err
	}
	return infoOf(st), nil
}

// ReadDir lists dir sorted by name.
func (OS) ReadDir(dir string) ([]FileInfo, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, 0, len(ents))
	for _, e := range ents {
		st, err := e.Info()
		if err != nil {
			if os.IsNotExist(err) {
				continue // removed since the listing
			}
			return nil, err
		}
		out = append(out, infoOf(st))
	}
	return out, nil
}

// MkdirAll creates dir and its parents.
func (OS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }

// SyncDir fsyncs the directory so that entries created, renamed or removed in it
// survive a power loss.
func (OS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func infoOf(st fs.FileInfo) FileInfo {
	fi := FileInfo{Name: st.Name(), IsDir: st.IsDir()}
	if !fi.IsDir {
		fi.Size = st.Size()
	}
	return fi
}

type osFile struct{ f *os.File }

// SyncHolding syncs f as its Sync does, but on Linux as a raw system call, which Go's
// scheduler does not see: the calling goroutine keeps its processor (P) for the whole
// sync instead of losing it to the scheduler after 20 µs and queueing for one when the
// sync returns. For a goroutine that syncs back to back while the other processors
// are busy (a write-ahead file's writer), that queueing delayed every round, and the
// scheduler's monitor thread, finding a processor to take at each look, polled every
// 20 µs. The price: nothing else runs on that processor meanwhile, and a garbage
// collection's stop-the-world phase waits for the sync to return, so a sync that
// hangs stops the whole process at the next collection (see wal.Options.HoldProcessor
// for how the write-ahead file bounds that). It reports false, and does nothing, for
// a file OS did not open and where there is no raw fdatasync (not Linux).
func SyncHolding(f File) (bool, error) {
	if !CanSyncHolding(f) {
		return false, nil
	}
	return true, datasyncHolding(f.(osFile).f)
}

// CanSyncHolding reports whether SyncHolding syncs f (rather than declining).
func CanSyncHolding(f File) bool {
	_, ok := f.(osFile)
	return ok && rawSync
}

// SleepHolding sleeps for d as a held sync waits for the disk: on Linux in a raw
// system call, keeping the processor, so that a collection meanwhile waits for it as
// it would for a stalled SyncHolding; elsewhere as time.Sleep. It is a test's and a
// failpoint's stand-in for a slow disk (failpoint.Stall), never the product's.
func SleepHolding(d time.Duration) { sleepHolding(d) }

func (o osFile) ReadAt(p []byte, off int64) (int, error)  { return o.f.ReadAt(p, off) }
func (o osFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, off) }
func (o osFile) Truncate(size int64) error                { return o.f.Truncate(size) }
func (o osFile) Close() error                             { return o.f.Close() }
func (o osFile) Sync() error                              { return datasync(o.f) }

// DropCache drops the file's clean pages from the page cache (see SyncForReading).
func (o osFile) DropCache() error { return dropCache(o.f) }

// DropCache asks f, if it can, to drop its clean pages from the page cache, so that
// the next reads come from the disk; a file that cannot (in memory) is left as it is.
// Call it after a sync, on small files read whole at start.
func DropCache(f File) error {
	if d, ok := f.(interface{ DropCache() error }); ok {
		return d.DropCache()
	}
	return nil
}

func (o osFile) Size() (int64, error) {
	st, err := o.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// WriteFileSync replaces path with data atomically and durably: it writes a temporary
// file beside it (mode 0600), fsyncs it, renames it over path and fsyncs the directory,
// so after a crash path holds either its old contents or data, never a torn mix.
func WriteFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close() // the write error is the one to report; tmp is never renamed
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the sync error is the one to report; tmp is never renamed
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }() // opened read-only for Sync; its result is returned
	return d.Sync()
}

// SyncForReading makes the file at path durable before a start reads and trusts it,
// and drops its pages from the page cache so that the reads come from the disk. A
// process killed between a write and its sync leaves the bytes in the page cache,
// where they read as stored (the sync makes them so); after a failed write-back the
// kernel keeps the new bytes in clean pages the disk never got, which no sync writes
// (reading the disk again shows what it holds). Use it on files read whole at start,
// not on large logs, whose pages would all be read again. It fails with an error
// matching fs.ErrNotExist when there is no such file.
func SyncForReading(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = datasync(f)
	if err == nil {
		err = dropCache(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
