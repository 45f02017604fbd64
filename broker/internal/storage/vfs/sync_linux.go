package vfs

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// datasync uses fdatasync: for an appended file it flushes the data and the new
// size (needed to read the data back) but not the modification time.
func datasync(f *os.File) error {
	return onFD(f, "fdatasync", func(fd int) error { return syscall.Fdatasync(fd) })
}

// rawSync says whether datasyncHolding exists here.
const rawSync = true

// datasyncHolding is fdatasync as a raw system call, which Go's scheduler does not
// see (see SyncHolding).
func datasyncHolding(f *os.File) error {
	return onFD(f, "fdatasync", func(fd int) error {
		if _, _, e := syscall.RawSyscall(syscall.SYS_FDATASYNC, uintptr(fd), 0, 0); e != 0 {
			return e
		}
		return nil
	})
}

// sleepHolding is nanosleep as a raw system call (see SleepHolding), with the
// runtime's preemption signal (SIGURG) blocked on its thread while it sleeps. A real
// fdatasync sleeps in the kernel where no signal ends it; a nanosleep returns early on
// every signal, and one the runtime sent to stop the world for a collection, landing
// in the Go code between two sleeps, let the collection through at once (seen as a
// 3.5 ms collection in a held stall of 400 ms, which is what the stand-in is for).
// The signal waits, pending, until the sleep ends.
func sleepHolding(d time.Duration) {
	runtime.LockOSThread() // the mask is the thread's: it must be restored on the same one
	defer runtime.UnlockOSThread()
	var urg, old unix.Sigset_t
	urg.Val[(unix.SIGURG-1)/64] |= 1 << ((unix.SIGURG - 1) % 64)
	blocked := unix.PthreadSigmask(unix.SIG_BLOCK, &urg, &old) == nil
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		_, _, e := syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), uintptr(unsafe.Pointer(&rem)), 0)
		if e != syscall.EINTR {
			break
		}
		sleepInterruptions.Add(1)
		ts = rem
	}
	if blocked {
		_ = unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil) // restores a mask it read: cannot fail
	}
}

// sleepInterruptions counts the signals that ended one of sleepHolding's nanosleeps
// early (a test's view: with SIGURG blocked, the runtime's preemptions are none of them).
var sleepInterruptions atomic.Int64

// onFD runs call on f's descriptor, again while it fails with EINTR, and names a
// failure with op and f's path.
func onFD(f *os.File, op string, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = call(int(fd)); serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: op, Path: f.Name(), Err: serr}
	}
	return nil
}

// FSSyncer makes many files durable at once with syncfs(2) of their file system,
// through a descriptor of the data directory it holds from the start.
//
// Holding one descriptor matters for errors: syncfs reports a write-back error of the
// file system only to descriptors opened before the error and only once each, so a
// descriptor of whichever file happens to be in a round could miss, or use up, an
// error that belongs to another file's pages. With one descriptor every error after
// NewFSSyncer is seen by the next syncfs, and the first one fails the syncer for good:
// the error may have cost any file's unsynced pages, ours or another program's on the
// same file system, so every later round fails too and the storage above fails closed
// until a restart. Rounds of one file use that file's fdatasync, whose errors belong
// to that file alone. syncfs reports write-back errors only since Linux 5.8; on older
// kernels, and for files on another file system than the directory, every file gets
// its own fdatasync.
type FSSyncer struct {
	dir    *os.File
	dev    uint64
	syncfs func(*os.File) error // syncfs, or a fault in tests

	mu     sync.Mutex
	failed error
}

// NewFSSyncer opens dir, on the file system whose files it will sync. Close releases
// it.
func NewFSSyncer(dir string) (*FSSyncer, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := fstat(d, &st); err != nil {
		_ = d.Close() // the fstat error is the one to report
		return nil, err
	}
	return &FSSyncer{dir: d, dev: st.Dev, syncfs: syncfs}, nil
}

// Close releases the directory.
func (s *FSSyncer) Close() error { return s.dir.Close() }

// SyncFiles makes every file in files durable: one file by its fdatasync, more by one
// syncfs of the directory's file system (files elsewhere each by its fdatasync).
func (s *FSSyncer) SyncFiles(files []File) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	if len(files) == 1 || !syncfsReportsErrors() {
		return EachFile{}.SyncFiles(files)
	}
	covered := false
	for _, f := range files {
		of, ok := f.(osFile)
		if ok {
			var st unix.Stat_t
			if err := fstat(of.f, &st); err != nil {
				return err
			}
			ok = st.Dev == s.dev
		}
		if !ok {
			if err := f.Sync(); err != nil {
				return err
			}
			continue
		}
		covered = true
	}
	if !covered {
		return nil
	}
	if err := s.syncfs(s.dir); err != nil {
		s.failed = fmt.Errorf("vfs: the file system of %s reported a write-back error; every later sync fails until a restart: %w", s.dir.Name(), err)
		return s.failed
	}
	return nil
}

func fstat(f *os.File, st *unix.Stat_t) error {
	return onFD(f, "fstat", func(fd int) error { return unix.Fstat(fd, st) })
}

func syncfs(f *os.File) error {
	return onFD(f, "syncfs", unix.Syncfs)
}

// syncfsReportsErrors tells whether the kernel is Linux 5.8 or later, where syncfs
// returns the write-back errors of the file system since the descriptor was opened.
var syncfsReportsErrors = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 8)
})

// kernelAtLeast parses the "major.minor" at the start of a kernel release string.
func kernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if n, _ := fmt.Sscanf(release, "%d.%d", &ma, &mi); n != 2 {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

// Allocate reserves size bytes for the file with fallocate(2).
func (o osFile) Allocate(size int64) error {
	return onFD(o.f, "fallocate", func(fd int) error { return unix.Fallocate(fd, 0, 0, size) })
}

// dropCache asks the kernel to drop f's clean pages from the page cache, so the next
// reads come from the disk. After a failed write-back Linux keeps the new bytes in
// clean pages though the disk holds the old ones; a sync then writes nothing, and only
// reading the disk again shows what it holds.
func dropCache(f *os.File) error {
	return onFD(f, "fadvise", func(fd int) error { return unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED) })
}
