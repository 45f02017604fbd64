package wal

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// lostWriteback models Linux's report of a lost write-back of one data file: the
// first sync of it (the user's own) reports EIO and marks the error seen; the pages
// are clean from then on but never reached the disk, so a sync through a handle
// opened after that reports nothing and makes nothing durable. The user's own sync
// pauses after the error was seen, before it returns (its goroutine descheduled
// between the system call and its call to Fail).
type lostWriteback struct {
	*vfs.Mem
	target        string
	mu            sync.Mutex
	lost          bool
	seen, release chan struct{}
}

type lwFile struct {
	vfs.File
	fs   *lostWriteback
	user bool
}

func (l *lostWriteback) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	f, err := l.Mem.OpenFile(name, flag, perm)
	if err != nil || filepath.Clean(name) != l.target {
		return f, err
	}
	return &lwFile{File: f, fs: l}, nil
}

func (f *lwFile) Sync() error {
	f.fs.mu.Lock()
	lost := f.fs.lost
	f.fs.lost = true
	f.fs.mu.Unlock()
	if lost {
		return nil // clean pages: nothing to write, no error for this handle
	}
	if !f.user {
		return f.File.Sync()
	}
	close(f.fs.seen)
	<-f.fs.release
	return &fs.PathError{Op: "fdatasync", Path: f.fs.target, Err: syscall.EIO}
}

// TestAnOwnSyncFailureRacingACheckpoint: a data file's own sync (a segment log
// undoing an append, a Raft log cutting) meets a lost write-back and fails the WAL,
// so that a checkpoint, whose fresh handle does not see the error again, frees
// nothing. The users called Fail after the sync returned; a checkpoint that opened,
// synced and checked its files between the two freed the record of an acknowledged
// write whose bytes never reached the disk, and the power loss after took it (on the
// old code: a.log = "", Checkpoint nil, nothing replayed). SyncOwn keeps a
// checkpoint's opens, syncs and check out of an own sync and its report.
func TestAnOwnSyncFailureRacingACheckpoint(t *testing.T) {
	m := &lostWriteback{Mem: vfs.NewMem(), target: filepath.Join(root, "a.log"), seen: make(chan struct{}), release: make(chan struct{})}
	w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	dataFile(t, m.Mem, "a.log")
	h, err := m.OpenFile(filepath.Join(root, "a.log"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	uh := h.(*lwFile)
	uh.user = true
	write(t, w, uh, "a.log", 0, []byte("acked"))
	synced := make(chan error, 1)
	go func() { synced <- w.SyncOwn("sync of a.log", uh.Sync) }() // as segment.Log.sync does it
	// The error is seen; the sync has not returned.
	<-m.seen
	ck := make(chan error, 1)
	go func() { ck <- w.Checkpoint() }()
	// Once the Checkpoint's rotation handed file 0 to the checkpointer, the sync
	// returns and reports.
	for {
		w.ckMu.Lock()
		rotated := w.rotated
		w.ckMu.Unlock()
		if rotated > 0 {
			break
		}
		runtime.Gosched()
	}
	close(m.release)
	if err := <-synced; !errors.Is(err, syscall.EIO) {
		t.Fatalf("the own sync: %v, want EIO", err)
	}
	ckErr := <-ck
	m.Crash()
	_, rep := open(t, m.Mem, 64<<10)
	if got := string(content(t, m.Mem, "a.log")); got != "acked" {
		t.Fatalf("a.log = %q after a power loss (Checkpoint: %v, replayed %+v): the checkpoint freed the record of an acknowledged write whose bytes a lost write-back took", got, ckErr, rep)
	}
	if !errors.Is(ckErr, ErrFailed) {
		t.Fatalf("Checkpoint: %v, want ErrFailed", ckErr)
	}
}
