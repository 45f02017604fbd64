// Package vfs is the small file-system interface the storage packages do all their
// I/O through. OS is the real implementation; Mem is an in-memory one that remembers
// what was made durable and can lose everything else, fail an fsync or run out of
// space, so crash and disk-fault behaviour can be tested quickly and exactly.
package vfs

import (
	"errors"
	"io/fs"
	"path/filepath"
)

// FS is the set of file-system operations the storage packages need. Names are
// slash- or OS-separated paths; implementations must be safe for concurrent use.
type FS interface {
	// OpenFile opens name. flag is a combination of os.O_RDONLY, os.O_RDWR,
	// os.O_WRONLY, os.O_CREATE, os.O_EXCL and os.O_TRUNC; other flags (os.O_APPEND)
	// are not supported, because writers use WriteAt at positions they track.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Remove unlinks name. Open handles stay readable, as on POSIX. The removal is
	// durable only after SyncDir of the parent directory.
	Remove(name string) error
	// Rename atomically replaces newname with oldname. It is durable only after
	// SyncDir of the parent directory.
	Rename(oldname, newname string) error
	// Stat describes name; it fails with an error matching fs.ErrNotExist when
	// name does not exist.
	Stat(name string) (FileInfo, error)
	// ReadDir lists the entries of dir sorted by name.
	ReadDir(dir string) ([]FileInfo, error)
	// MkdirAll creates dir and any missing parents.
	MkdirAll(dir string, perm fs.FileMode) error
	// SyncDir makes the entries of dir (creations, renames, removals) durable.
	SyncDir(dir string) error
}

// File is an open file. Reads and writes are positional, so concurrent readers
// never share a cursor.
type File interface {
	// ReadAt follows io.ReaderAt: a short read returns io.EOF.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes p at off, extending the file as needed. A short write
	// returns an error.
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes the data written so far and the file size durable.
	Sync() error
	// Truncate changes the size of the file; it is durable only after Sync.
	Truncate(size int64) error
	// Size returns the current size of the file.
	Size() (int64, error)
	// Close releases the handle.
	Close() error
}

// Allocator is a File that can reserve space ahead of writes. Writes into allocated
// space cannot run out of space, and once written they change no metadata, so an
// fdatasync of such a file need not commit the file system's journal.
type Allocator interface {
	// Allocate makes the file at least size bytes long with its blocks allocated;
	// the new bytes read as zeros. It fails (ENOSPC) rather than allocate part.
	Allocate(size int64) error
}

// FileInfo describes a directory entry.
type FileInfo struct {
	Name  string // base name
	Size  int64  // bytes; 0 for directories
	IsDir bool
}

// MkdirAllSync creates dir and any missing parents, and makes their entries durable:
// the parent of every directory it created is synced, top down, and so is dir's
// parent even when dir already existed (a process killed between a mkdir and its sync
// leaves a directory that exists but may not survive a power loss). A new directory's
// entry is otherwise lost in a crash, with every file inside it, however well those
// files were synced.
func MkdirAllSync(fsys FS, dir string, perm fs.FileMode) error {
	dir = filepath.Clean(dir)
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := fsys.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := fsys.MkdirAll(dir, perm); err != nil {
		return err
	}
	if len(created) == 0 || created[0] != dir {
		created = append([]string{dir}, created...)
	}
	for i := len(created) - 1; i >= 0; i-- {
		if parent := filepath.Dir(created[i]); parent != created[i] {
			if err := fsys.SyncDir(parent); err != nil {
				return err
			}
		}
	}
	return nil
}
