//go:build !linux

package vfs

import (
	"os"
	"time"
)

// datasync falls back to a full fsync where fdatasync is not available.
func datasync(f *os.File) error { return f.Sync() }

// rawSync says whether datasyncHolding exists here: no, SyncHolding declines.
const rawSync = false

func datasyncHolding(f *os.File) error { return datasync(f) }

func sleepHolding(d time.Duration) { time.Sleep(d) }

// FSSyncer syncs each file by itself where syncfs(2) is not available.
type FSSyncer struct{ EachFile }

// NewFSSyncer returns a syncer that syncs every file by itself.
func NewFSSyncer(dir string) (*FSSyncer, error) { return &FSSyncer{}, nil }

// Close does nothing.
func (s *FSSyncer) Close() error { return nil }

// Allocate extends the file to size where fallocate(2) is not available; the
// space is not reserved.
func (o osFile) Allocate(size int64) error {
	st, err := o.f.Stat()
	if err != nil || st.Size() >= size {
		return err
	}
	return o.f.Truncate(size)
}

// dropCache does nothing where posix_fadvise is not available.
func dropCache(*os.File) error { return nil }
