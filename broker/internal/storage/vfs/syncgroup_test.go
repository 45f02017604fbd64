package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSyncGroupDurableOnReturn has writers append to their own files and sync them
// through one group, with a slow disk so that rounds overlap. Each writer checks, as
// soon as its Sync returns, that everything it wrote is durable: a group that answered
// before its round (or from a round that began before the write) would fail here.
func TestSyncGroupDurableOnReturn(t *testing.T) {
	m := NewMem()
	m.SetSyncDelay(500 * time.Microsecond)
	g := NewSyncGroup(m)
	defer g.Close()
	const writers, writes = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("/f%d", w)
			f, err := m.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				errs <- err
				return
			}
			var want []byte
			for i := 0; i < writes; i++ {
				rec := []byte(fmt.Sprintf("%d-%d;", w, i))
				if _, err := f.WriteAt(rec, int64(len(want))); err != nil {
					errs <- err
					return
				}
				want = append(want, rec...)
				if err := g.Sync(f); err != nil {
					errs <- err
					return
				}
				got, err := m.Durable(name)
				if err != nil || !bytes.Equal(got, want) {
					errs <- fmt.Errorf("%s after Sync %d: durable %q, want %q (%v)", name, i, got, want, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := g.Stats()
	if st.Files != writers*writes {
		t.Fatalf("rounds synced %d files, want %d", st.Files, writers*writes)
	}
	// The point of the group: concurrent callers share rounds.
	if st.Rounds >= st.Files {
		t.Fatalf("%d rounds for %d syncs: no round was shared", st.Rounds, st.Files)
	}
}

// TestSyncGroupFailedRound checks that a failed sync reaches the caller and that the
// group keeps serving later rounds (the storage above decides to fail closed).
func TestSyncGroupFailedRound(t *testing.T) {
	m := NewMem()
	g := NewSyncGroup(m)
	defer g.Close()
	f, err := m.OpenFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("x"), 0)
	m.FailSync(1)
	if err := g.Sync(f); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Sync with a failing disk: %v, want EIO", err)
	}
	if got, _ := m.Durable("/a"); len(got) != 0 {
		t.Fatalf("a failed sync made %q durable", got)
	}
	if err := g.Sync(f); err != nil {
		t.Fatalf("Sync after the fault: %v", err)
	}
	if got, _ := m.Durable("/a"); string(got) != "x" {
		t.Fatalf("durable %q after a good sync, want x", got)
	}
}

// TestSyncGroupAfterClose checks that Close serves nobody twice and that a Sync after
// Close still makes its file durable, by itself.
func TestSyncGroupAfterClose(t *testing.T) {
	m := NewMem()
	g := NewSyncGroup(m)
	f, _ := m.OpenFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	f.WriteAt([]byte("x"), 0)
	g.Close()
	g.Close()
	if err := g.Sync(f); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Durable("/a"); string(got) != "x" {
		t.Fatalf("durable %q, want x", got)
	}
}

// TestOSSyncFiles runs the real implementation (syncfs on Linux 5.8+) over files of
// one directory and a group over them; it cannot see the disk, but it runs the
// system calls and their error paths' plumbing.
func TestOSSyncFiles(t *testing.T) {
	dir := t.TempDir()
	var files []File
	for i := 0; i < 3; i++ {
		f, err := OS{}.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("data"), 0); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if err := SyncFiles(OS{}, files); err != nil {
		t.Fatal(err)
	}
	if err := SyncFiles(OS{}, files[:1]); err != nil {
		t.Fatal(err)
	}
	g := NewSyncGroup(OS{})
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
	if err := SyncFiles(OS{}, files); err == nil {
		t.Fatal("SyncFiles with a closed file: no error")
	}
}
