//go:build failpoints

package partition

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
)

// TestClockSeamOffsetAndDrift: a failpoints build started with a clock offset and a
// drift reads its wall clock that far off and gaining that fast against the monotonic
// clock (the verify tiers' clock faults rely on it). The seam is read at start, so the
// test runs itself again with the variables set.
func TestClockSeamOffsetAndDrift(t *testing.T) {
	if os.Getenv("NARAD_CLOCK_SEAM_HELPER") == "1" {
		m0, w0 := time.Now(), WallMillis()
		time.Sleep(300 * time.Millisecond)
		w1, m := WallMillis(), time.Since(m0)
		fmt.Printf("seam: %d %d %d %d\n", w0, w1, m.Milliseconds(), time.Now().UnixMilli())
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestClockSeamOffsetAndDrift$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NARAD_CLOCK_SEAM_HELPER=1", failpoint.ClockEnvVar+"=-1h", failpoint.ClockDriftEnvVar+"=0.4")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the helper run: %v\n%s", err, out)
	}
	var w0, w1, mono, now int64
	if _, err := fmt.Sscanf(string(out), "seam: %d %d %d %d", &w0, &w1, &mono, &now); err != nil {
		t.Fatalf("the helper printed %q: %v", out, err)
	}
	// 1.4 times the monotonic time passed, give or take a millisecond of truncation
	// each and 2 % for the moments between the readings.
	if want := 1.4 * float64(mono); float64(w1-w0) < want*0.98-2 || float64(w1-w0) > want*1.02+2 {
		t.Errorf("the wall clock moved %d ms while the monotonic clock moved %d ms; with a drift of 0.4 it should move %.0f", w1-w0, mono, want)
	}
	if behind := now - w1; behind < 3590_000 || behind > 3600_000 {
		t.Errorf("the wall clock reads %d ms behind the system's; an offset of -1h and a drift over well under a minute put it 3590–3600 s behind", behind)
	}
}
