//go:build !linux

package vfs

import "os"

// datasync falls back to a full fsync where fdatasync is not available.
func datasync(f *os.File) error { return f.Sync() }

// FSSyncer syncs each file by itself where syncfs(2) is not available.
type FSSyncer struct{ EachFile }

// NewFSSyncer returns a syncer that syncs every file by itself.
func NewFSSyncer(dir string) (*FSSyncer, error) { return &FSSyncer{}, nil }

// Close does nothing.
func (s *FSSyncer) Close() error { return nil }
