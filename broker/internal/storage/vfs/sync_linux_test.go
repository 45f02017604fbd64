package vfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// TestSleepHoldingIsNotCutShortBySignals: the failpoints' stand-in for a stalled sync
// (SleepHolding) must hold its processor for the whole stall, as a real fdatasync does.
// A nanosleep returns on every signal: the runtime's preemption signals (SIGURG) sent
// to stop the world for a collection ended it early, and one that landed in the Go code
// between two sleeps let the collection through (TestFailpointWALSyncStalls saw a
// collection of 3.5 ms in a held stall of 400 ms). So the thread blocks SIGURG while
// it sleeps: this test floods the sleeping thread with SIGURG and wants no sleep cut
// short, the signal blocked during the sleep and unblocked after it.
func TestSleepHoldingIsNotCutShortBySignals(t *testing.T) {
	const stall = 300 * time.Millisecond
	tids := make(chan int, 1)
	done := make(chan time.Duration, 1)
	before := sleepInterruptions.Load()
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- unix.Gettid()
		start := time.Now()
		SleepHolding(stall)
		done <- time.Since(start)
	}()
	tid := <-tids
	var blockedSeen bool
	var slept time.Duration
	// Bounded: a sleep that every signal cuts short restarts so often under the flood
	// that it may not end while the flood lasts (the old stand-in did not, in 10 minutes).
	deadline := time.Now().Add(20 * stall)
flood:
	for time.Now().Before(deadline) {
		select {
		case slept = <-done:
			break flood
		default:
		}
		if err := unix.Tgkill(unix.Getpid(), tid, unix.SIGURG); err != nil {
			t.Fatal(err)
		}
		if !blockedSeen {
			blockedSeen = urgBlocked(t, tid)
		}
	}
	if slept == 0 {
		slept = <-done
	}
	if n := sleepInterruptions.Load() - before; n != 0 {
		t.Fatalf("%d signals cut the held sleep short; want none (SIGURG blocked while it sleeps)", n)
	}
	if !blockedSeen {
		t.Fatal("SIGURG was never blocked on the sleeping thread")
	}
	if slept < stall {
		t.Fatalf("the held sleep took %v; want at least %v", slept, stall)
	}
	if urgBlocked(t, tid) {
		t.Fatal("SIGURG is still blocked on the thread after the sleep")
	}
}

// urgBlocked reads whether thread tid of this process has SIGURG blocked.
func urgBlocked(t *testing.T, tid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigBlk:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return mask&(1<<(unix.SIGURG-1)) != 0
		}
	}
	t.Fatal("no SigBlk line in the thread's status")
	return false
}
