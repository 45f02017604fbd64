package vfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

func openFiles(t *testing.T, dir string, n int) []File {
	t.Helper()
	var files []File
	for i := 0; i < n; i++ {
		f, err := OS{}.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.WriteAt([]byte("data"), 0); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestFSSyncer runs the real system calls (syncfs on Linux 5.8+, fdatasync for one
// file) over files of one directory, directly and through a group. It cannot see the
// disk; the fault tests below check the error handling.
func TestFSSyncer(t *testing.T) {
	dir := t.TempDir()
	s, err := NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	files := openFiles(t, dir, 3)
	if err := s.SyncFiles(files); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncFiles(files[:1]); err != nil {
		t.Fatal(err)
	}
	g := NewSyncGroup(s)
	defer g.Close()
	var wg sync.WaitGroup
	for _, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Sync(f); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	files[0].Close()
	if err := s.SyncFiles(files); err == nil {
		t.Fatal("SyncFiles with a closed file: no error")
	}
}

// TestFSSyncerUsesItsOwnDescriptor: syncfs goes through the directory the syncer
// holds, never through a descriptor of a file in the round (which could miss an error
// that happened before it was opened).
func TestFSSyncerUsesItsOwnDescriptor(t *testing.T) {
	if !syncfsReportsErrors() {
		t.Skip("kernel older than 5.8: every file is synced by itself")
	}
	dir := t.TempDir()
	s, err := NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var used []string
	s.syncfs = func(f *os.File) error { used = append(used, f.Name()); return nil }
	if err := s.SyncFiles(openFiles(t, dir, 2)); err != nil {
		t.Fatal(err)
	}
	if len(used) != 1 || used[0] != dir {
		t.Fatalf("syncfs through %v, want once through %s", used, dir)
	}
}

// TestFSSyncerFailsForGood: after syncfs reports a write-back error, every later round
// fails too, one file or many: the error may have cost any file's unsynced pages, and
// the next syncfs would no longer report it.
func TestFSSyncerFailsForGood(t *testing.T) {
	if !syncfsReportsErrors() {
		t.Skip("kernel older than 5.8: every file is synced by itself")
	}
	dir := t.TempDir()
	s, err := NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	calls := 0
	s.syncfs = func(*os.File) error {
		calls++
		if calls == 1 {
			return &os.PathError{Op: "syncfs", Path: dir, Err: syscall.EIO}
		}
		return nil
	}
	files := openFiles(t, dir, 2)
	if err := s.SyncFiles(files); !errors.Is(err, syscall.EIO) {
		t.Fatalf("first round: %v, want EIO", err)
	}
	for _, round := range [][]File{files, files[:1]} {
		if err := s.SyncFiles(round); !errors.Is(err, syscall.EIO) {
			t.Fatalf("round of %d files after the error: %v, want the EIO again", len(round), err)
		}
	}
	if calls != 1 {
		t.Fatalf("syncfs called %d times; after the error nothing should reach the disk", calls)
	}
}
