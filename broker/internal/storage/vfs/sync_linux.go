package vfs

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// datasync uses fdatasync: for an appended file it flushes the data and the new
// size (needed to read the data back) but not the modification time.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// SyncFiles makes every file in files durable. One file gets its own fdatasync. More
// get one syncfs(2) per file system they live on (nearly always one): a single
// journal commit for all of them instead of one per file, which is what lets many
// partition logs share the disk's few fsyncs a second. syncfs reports write-back
// errors only since Linux 5.8; on older kernels every file gets its own fdatasync.
// An error of syncfs may come from any file of that file system, ours or not: it
// fails the whole round, the safe reading.
func (OS) SyncFiles(files []File) error {
	if len(files) == 1 || !syncfsReportsErrors() {
		for _, f := range files {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		return nil
	}
	var devs [4]uint64
	seen := devs[:0]
	for _, f := range files {
		of, ok := f.(osFile)
		if !ok {
			if err := f.Sync(); err != nil {
				return err
			}
			continue
		}
		var st unix.Stat_t
		if err := fstat(of.f, &st); err != nil {
			return err
		}
		if slices.Contains(seen, st.Dev) {
			continue
		}
		seen = append(seen, st.Dev)
		if err := syncfs(of.f); err != nil {
			return err
		}
	}
	return nil
}

func fstat(f *os.File, st *unix.Stat_t) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), st) }); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fstat", Path: f.Name(), Err: serr}
	}
	return nil
}

func syncfs(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Syncfs(int(fd))
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "syncfs", Path: f.Name(), Err: serr}
	}
	return nil
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
