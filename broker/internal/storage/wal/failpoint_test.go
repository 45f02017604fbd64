//go:build failpoints

package wal

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
)

// TestFailpointWALSyncStalls: a disk whose syncs stall (the wal-sync failpoint, which
// sleeps as the round syncs) is held through its first stall only. That stall is a
// held one: a collection waits for it, as it would for a real sync that keeps its
// processor. While the stalls go on, the rounds stay plain (before, the holding came
// back a second after the first stall, and every other stall stopped the process at
// its next collection); once a sync is quick and a second has passed since the last
// stall, they hold again.
func TestFailpointWALSyncStalls(t *testing.T) {
	t.Cleanup(func() { failpoint.Set("") })
	const first = 400 * time.Millisecond
	// A machine loaded enough (make test builds and runs packages beside this one)
	// may not run this process at all for the whole stall: then nothing was seen,
	// neither the stall nor a collection during it, and the look is made again on a
	// new write-ahead file (its first stall is held again). Anything seen is judged.
	var w *WAL
	var commit func()
	var gc time.Duration
	for attempt := 1; ; attempt++ {
		var seen bool
		w, commit, gc, seen = firstHeldStall(t, first)
		if seen {
			break
		}
		if attempt == 3 {
			t.Fatal("three held stalls of 400 ms passed while this test did not run, and no collection ran during any")
		}
		t.Logf("attempt %d: the stall passed while this test did not run, and no collection ran during it", attempt)
	}
	// Generous: the collection began at most a few milliseconds into the stall on any
	// machine this runs on; a sleep that gave its processor up lets it finish at once.
	if gc < first/4 {
		t.Fatalf("a collection during the held stall took %v; want it to wait for the stall (%v)", gc, first)
	}
	if st := w.Stats(); st.Held != 1 || st.HoldOffs != 1 {
		t.Fatalf("the first stall: %d held, %d hold-offs; want 1 and 1", st.Held, st.HoldOffs)
	}
	// The disk stalls on for well past the first pause (SlowHoldOff): no round holds.
	if err := failpoint.Set(failpoint.WALSync + ":sleep(150ms)"); err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(SlowHoldOff + SlowHoldOff/2); time.Now().Before(until); {
		commit()
	}
	if st := w.Stats(); st.Held != 1 {
		t.Fatalf("stalls after the first: %d rounds held (of %d); want the first only", st.Held, st.Rounds)
	}
	// Quick again: the rounds hold once a sync was quick and a second has passed since
	// the last stall (read after the commit that made it returned).
	if err := failpoint.Set(""); err != nil {
		t.Fatal(err)
	}
	last := w.lastStall
	for w.Stats().Held == 1 {
		if time.Since(last) > 30*time.Second {
			t.Fatalf("no round held %v after the stalls ended", time.Since(last))
		}
		commit()
		time.Sleep(10 * time.Millisecond)
	}
	if d := time.Since(last); d < SlowHoldOff {
		t.Fatalf("a round held %v after the last stall; want a pause of %v first", d, SlowHoldOff)
	}
}

// firstHeldStall opens a holding write-ahead file, stalls its first sync for stall,
// and measures the longest collection during that held stall. seen is false when the
// stall came and went while this goroutine did not run and no collection ran during
// it: nothing was measured.
func firstHeldStall(t *testing.T, stall time.Duration) (w *WAL, commit func(), gc time.Duration, seen bool) {
	t.Helper()
	w, commit = holdingWAL(t, nil)
	if err := failpoint.Set(failpoint.WALSync + ":sleep(" + stall.String() + ")"); err != nil {
		t.Fatal(err)
	}
	var before debug.GCStats
	debug.ReadGCStats(&before)
	done := make(chan struct{})
	go func() {
		defer close(done)
		commit()
	}()
	// Wait for the sleep itself, not the hit: the hit is counted before the fired
	// line is written, and a collection that starts while that write(2) blocks (a
	// slow reader of stderr, as under make test) runs to its end in the meantime.
	missed := false
	for failpoint.Sleeping(failpoint.WALSync) == 0 && !missed {
		select {
		case <-done:
			missed = true
		case <-time.After(time.Millisecond):
		}
	}
	if missed {
		// The stall came and went while this goroutine did not run: a collection that
		// began with it stopped the world until the held processor came back (make test
		// once hung here for ever, polling for a stall that had passed). That
		// collection waited for the stall: its pause is the measure.
		var after debug.GCStats
		debug.ReadGCStats(&after)
		if after.NumGC == before.NumGC {
			return w, commit, 0, false
		}
		for _, p := range after.Pause[:min(int(after.NumGC-before.NumGC), len(after.Pause))] {
			gc = max(gc, p)
		}
		return w, commit, gc, true
	}
	// Sleeping is raised a few instructions before the stand-in for a held sync
	// (vfs.SleepHolding) blocks the runtime's preemption signal and sleeps: a
	// collection that stops the world in between gets through at once. (Before the
	// stand-in blocked that signal, one landing between two of its nanosleeps did the
	// same: collections of 2 ms and 3.5 ms were seen in a 400 ms stall.) So a few
	// collections are taken while the stall lasts, and the longest counts; a sync that
	// gave its processor up lets every one of them finish at once.
	for i := 0; i < 3 && gc < stall/4 && (i == 0 || failpoint.Sleeping(failpoint.WALSync) > 0); i++ {
		gcStart := time.Now()
		runtime.GC()
		gc = max(gc, time.Since(gcStart))
	}
	<-done
	return w, commit, gc, true
}

// TestFailpointStalledWhileSyncing: a round whose sync is still in flight after
// ShedSync makes the disk Stalled before it returns (a disk that hangs is found hanging, not only once
// its sync comes back), and a quick sync ends it.
func TestFailpointStalledWhileSyncing(t *testing.T) {
	w, commit := holdingWAL(t, nil)
	t.Cleanup(func() { failpoint.Set("") })
	w.shedSync = 100 * time.Millisecond
	if err := failpoint.Set(failpoint.WALSync + ":sleep(2s)@1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		commit()
	}()
	for !w.Stalled() {
		select {
		case <-done:
			t.Fatal("the stalled sync returned before Stalled reported it")
		case <-time.After(5 * time.Millisecond):
		}
	}
	<-done
	if !w.Stalled() {
		t.Fatal("not Stalled after the slow sync returned")
	}
	w.shedSync = time.Hour // a real sync on a busy disk may take 100 ms
	if commit(); w.Stalled() {
		t.Fatal("Stalled after a quick sync")
	}
}
