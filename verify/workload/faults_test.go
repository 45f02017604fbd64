package workload

import (
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/node"
	"golang.org/x/sys/unix"
)

func monoNow(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// A failpoint line whose wall time is off (the machine's wall clock was stepped while
// the run went on) is still placed where it happened: a soak run once recorded a kill
// 10.8 s after the harness had seen it, and the checker then called the kill's
// redeliveries and stale acks violations.
func TestFiredAtUsesTheMonotonicReading(t *testing.T) {
	clk := history.NewClock()
	time.Sleep(20 * time.Millisecond)
	now := clk.Now()
	for _, skew := range []time.Duration{10800 * time.Millisecond, -time.Hour} {
		f := node.Fired{Name: "segment-after-write", Action: "kill",
			UnixNano: time.Now().Add(skew).UnixNano(), MonoNano: monoNow(t)}
		end := clk.Now() + int64(time.Second)
		got := firedAt(clk, f, end)
		if d := time.Duration(got - now); d < 0 || d > 500*time.Millisecond {
			t.Errorf("wall skewed by %v: placed %v from now, want within 500ms", skew, d)
		}
	}
}

// Without a monotonic reading (an older binary) the wall time is used, but never past
// the moment the harness saw the outcome.
func TestFiredAtFallsBackToWallAndClampsToEnd(t *testing.T) {
	clk := history.NewClock()
	end := clk.Now()
	f := node.Fired{UnixNano: time.Now().Add(10 * time.Second).UnixNano()}
	if got := firedAt(clk, f, end); got != end {
		t.Errorf("a wall time past end placed at %v, want end %v", time.Duration(got), time.Duration(end))
	}
	f.UnixNano = clk.Start().Add(5 * time.Millisecond).UnixNano()
	if got := firedAt(clk, f, end+int64(time.Second)); got != int64(5*time.Millisecond) {
		t.Errorf("wall fallback placed at %v, want 5ms", time.Duration(got))
	}
}
