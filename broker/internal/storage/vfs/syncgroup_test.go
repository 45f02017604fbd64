package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
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
	g := NewSyncGroup(EachFile{})
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
	g := NewSyncGroup(EachFile{})
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
	g := NewSyncGroup(EachFile{})
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
