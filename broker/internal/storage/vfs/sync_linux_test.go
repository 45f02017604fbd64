package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestKernelAtLeast(t *testing.T) {
	for _, c := range []struct {
		release string
		want    bool
	}{
		{"5.8.0", true}, {"5.7.19", false}, {"6.1.0-18-amd64", true}, {"4.19.0", false},
		{"5.10", true}, {"6.18.44-fc-v595", true}, {"", false}, {"garbage", false}, {"5", false},
	} {
		if got := kernelAtLeast(c.release, 5, 8); got != c.want {
			t.Errorf("kernelAtLeast(%q, 5, 8) = %v, want %v", c.release, got, c.want)
		}
	}
}

// TestSyncHolding: a file OS opened is synced by the raw system call, with
// fdatasync's errors (a pipe cannot be synced: EINVAL; a closed file: an error); a
// file of another FS is left to its own Sync.
func TestSyncHolding(t *testing.T) {
	f, err := OS{}.OpenFile(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if held, err := SyncHolding(f); !held || err != nil {
		t.Fatalf("SyncHolding of an OS file: held %v, %v", held, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if held, err := SyncHolding(f); !held || err == nil {
		t.Fatalf("SyncHolding of a closed file: held %v, %v; want an error", held, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if held, err := SyncHolding(osFile{w}); !held || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("SyncHolding of a pipe: held %v, %v; want EINVAL", held, err)
	}
	m := NewMem()
	mf, err := m.OpenFile("/m", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := SyncHolding(mf); held || err != nil {
		t.Fatalf("SyncHolding of a Mem file: held %v, %v; want false, nil", held, err)
	}
}

// TestSyncHoldingKeepsTheProcessor: with one processor, nothing else runs while
// SyncHolding syncs, and something does while the plain sync does (the scheduler
// hands the processor over after 20 µs). The syncs must be long enough to tell the two
// apart, so the test writes more until a plain sync takes 20 ms.
func TestSyncHoldingKeepsTheProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var spins atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			spins.Add(1)
			runtime.Gosched()
		}
	}()
	for spins.Load() == 0 {
		runtime.Gosched()
	}
	chunk := make([]byte, 1<<20)
	off := int64(0)
	// during dirties size bytes, then reports how many times the spinner ran while sync
	// synced them, and how long that took.
	during := func(size int, sync func() error) (int64, time.Duration) {
		for range size >> 20 {
			if _, err := f.WriteAt(chunk, off); err != nil {
				t.Fatal(err)
			}
			off += int64(len(chunk))
		}
		before, start := spins.Load(), time.Now()
		if err := sync(); err != nil {
			t.Fatal(err)
		}
		return spins.Load() - before, time.Since(start)
	}
	plain := func() error { return datasync(f) }
	held := func() error {
		if held, err := SyncHolding(osFile{f}); !held {
			t.Fatal("SyncHolding declined an OS file on Linux")
		} else if err != nil {
			return err
		}
		return nil
	}
	for size := 8 << 20; ; size *= 2 {
		ran, took := during(size, plain)
		if took < 20*time.Millisecond {
			if size >= 256<<20 {
				t.Skipf("syncing %d MiB took %v here (a file system in memory?): too short to tell a held sync from a plain one", size>>20, took)
			}
			continue
		}
		// The spinner runs thousands of times during a plain sync of 20 ms. During a
		// held one it may run once or twice as the sync returns: the scheduler asks a
		// goroutine running for over 10 ms to yield, and the syncing one does at its
		// next function call.
		if ran < 100 {
			t.Fatalf("the spinner ran %d times during a plain sync of %v: this test cannot tell holding from not", ran, took)
		}
		plainRan := ran
		ran, took = during(size, held)
		if ran > 2 {
			t.Fatalf("the spinner ran %d times during a held sync of %v (%d during a plain one): the processor was handed over", ran, took, plainRan)
		}
		t.Logf("%d MiB: the spinner ran %d times during a plain sync, %d during a held one of %v", size>>20, plainRan, ran, took)
		return
	}
}
