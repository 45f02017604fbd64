//go:build !linux

package vfs

import "os"

// datasync falls back to a full fsync where fdatasync is not available.
func datasync(f *os.File) error { return f.Sync() }
