package workload

import (
	"fmt"
	"math/rand"
	"path/filepath"
	"slices"
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

// A start after the machine's wall clock moved records the offset the node will really
// run with (ours plus the machine's), so the checker excuses what a forward jump does to
// delays and retention; moves under driftStep, and an unchanged clock, add no line, and
// only our own steps count as faults.
func TestClockLinesCarryTheMachinesDrift(t *testing.T) {
	w, path := recordingRun(t)
	drift := time.Duration(0)
	in := &injector{w: w, cfg: FaultConfig{ClockShare: 1}, rng: rand.New(rand.NewSource(1)),
		wallDrift: func() time.Duration { return drift }}

	in.clock(false)                    // no step, no drift: no line
	drift = 10 * time.Millisecond      // under driftStep: no line
	in.clock(false)                    //
	drift = 10800 * time.Millisecond   // the machine jumped forward
	in.clock(false)                    // a drift line: offset 0 + 10.8 s
	off := in.clock(true)              // our step (ClockShare 1) on top of the drift
	drift = 10800*time.Millisecond - 2 // unchanged within driftStep: the step's line only
	off2 := in.clock(true)
	var got []int64
	for _, e := range clockLines(t, w.rec, path) {
		got = append(got, e.ClockOffset)
	}
	want := []int64{int64(10800 * time.Millisecond), int64(off + 10800*time.Millisecond), int64(off2 + 10800*time.Millisecond)}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("clock lines carry offsets %v, want %v", got, want)
	}
	if n := w.stats.Faults[history.FaultClock]; n != 2 {
		t.Fatalf("%d clock faults counted, want our 2 steps only", n)
	}
}

// TestClusterScheduleRepeats: a seed gives one schedule of cluster steps (kinds and
// order), whatever the map order; another seed gives another.
func TestClusterScheduleRepeats(t *testing.T) {
	cfg := ClusterFaultConfig{Steps: map[string]int{StepLeaderKill: 4, StepPause: 2, StepNetCut: 1, StepKillAll: 1, StepDoubleFailover: 1, StepWipe: 1}}
	a := cfg.Schedule(rand.New(rand.NewSource(7)))
	for range 20 {
		if b := cfg.Schedule(rand.New(rand.NewSource(7))); !slices.Equal(a, b) {
			t.Fatalf("seed 7 gave %v, then %v", a, b)
		}
	}
	if len(a) != 10 {
		t.Fatalf("%d steps, want 10: %v", len(a), a)
	}
	if b := cfg.Schedule(rand.New(rand.NewSource(8))); slices.Equal(a, b) {
		t.Fatalf("seeds 7 and 8 gave the same schedule %v", a)
	}
	if _, err := ParseSteps("leader-kill=2,bogus=1"); err == nil {
		t.Fatal("an unknown step kind parsed")
	}
	if m, err := ParseSteps("leader-kill=2, pause=1"); err != nil || m[StepLeaderKill] != 2 || m[StepPause] != 1 {
		t.Fatalf("ParseSteps: %v %v", m, err)
	}
}

// The kill count a schedule announces follows its steps: the namespace tier's list
// (verify/Makefile's NETNS_STEPS) gives the 28 kills a seed its comment promises, and
// steps that kill nothing add none.
func TestKillsCountsEveryStepThatKills(t *testing.T) {
	steps, err := ParseSteps("leader-kill=4,controller-kill=2,node-kill=1,double-failover=2,pause=3,netcut=2,netdeaf=2,netmute=2,netlossy=1,netslow=1,netsplit=3,wipe=1,kill-all=1,corrupt=2,clock=1,failpoint-kill=2,rolling-restart=1,disk=1,slowdisk=1,move=3")
	if err != nil {
		t.Fatal(err)
	}
	if got := (ClusterFaultConfig{Steps: steps}).Kills(5); got != 28 {
		t.Errorf("the namespace tier's steps on 5 nodes: %d kills, want 28", got)
	}
	quiet, _ := ParseSteps("pause=3,netcut=2,netsplit=1,rolling-restart=2,slowdisk=2")
	if got := (ClusterFaultConfig{Steps: quiet}).Kills(3); got != 0 {
		t.Errorf("steps that kill nothing: %d kills, want 0", got)
	}
	if got := (ClusterFaultConfig{Steps: map[string]int{StepKillAll: 2}}).Kills(3); got != 6 {
		t.Errorf("two kill-alls of 3 nodes: %d kills, want 6", got)
	}
}

func TestSleepOf(t *testing.T) {
	for _, c := range []struct {
		action string
		want   time.Duration
		ok     bool
	}{{"sleep(1500ms)", 1500 * time.Millisecond, true}, {"sleep(2s)", 2 * time.Second, true}, {"eio", 0, false}, {"sleep(x)", 0, false}} {
		if d, ok := sleepOf(c.action); d != c.want || ok != c.ok {
			t.Errorf("sleepOf(%q) = %v, %v; want %v, %v", c.action, d, ok, c.want, c.ok)
		}
	}
}

// TestClusterStartsRecordTheMachinesDrift: a cluster node reads the machine's wall
// clock as it starts, so a start after that clock moved against the monotonic one
// records the node's offset with the move in it (a line per node, written only when
// its offset changed by a millisecond or more); the environment still carries only the
// offset a step gave it. Without these lines a netns chaos run took copies of the
// delay child stamped up to 25 ms early, between nodes started before and after the
// machine's clock moved, for violations.
func TestClusterStartsRecordTheMachinesDrift(t *testing.T) {
	w, path := recordingRun(t)
	drift := time.Duration(0)
	in := &clusterInjector{w: w, clock: map[string]nodeClock{}, recorded: map[string]time.Duration{},
		wallDrift: func() time.Duration { return drift }}

	env := func(id string) string { return fmt.Sprint(in.clockEnv(id)) }
	if e := env("n1"); e != "[]" { // no step, no move: no line, no offset
		t.Fatalf("n1's environment %s, want none", e)
	}
	drift = 500 * time.Microsecond // under a millisecond: no line
	env("n1")
	drift = 470 * time.Millisecond // the machine's clock moved forward
	if e := env("n1"); e != "[]" {
		t.Fatalf("n1's environment %s after the machine's clock moved, want none (the node reads it itself)", e)
	}
	env("n1") // unchanged: no line
	env("n2") // n2's first start since: its line
	in.clock["n3"] = nodeClock{off: -11 * time.Second}
	in.recorded["n3"] = -11 * time.Second // the step's own line (StepClock)
	if e := env("n3"); e != "["+ClockEnvVar+"=-11s]" {
		t.Fatalf("n3's environment %s, want its step's offset only", e)
	}
	var got []string
	for _, e := range clockLines(t, w.rec, path) {
		got = append(got, fmt.Sprintf("%s %v", e.Target, time.Duration(e.ClockOffset)))
	}
	want := []string{"n1 470ms", "n2 470ms", "n3 -10.53s"}
	if !slices.Equal(got, want) {
		t.Fatalf("clock lines %v, want %v", got, want)
	}
	if n := w.stats.Faults[history.FaultClock]; n != 0 {
		t.Fatalf("%d clock faults counted, want none (the machine's moves are not ours)", n)
	}
}

// clockLines closes rec, reads the history it wrote to path back, and returns its clock
// lines in order.
func clockLines(t *testing.T, rec *history.Writer, path string) []history.Entry {
	t.Helper()
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	es, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []history.Entry
	for _, e := range es {
		if e.Kind == history.KindFault && e.Fault == history.FaultClock {
			out = append(out, e)
		}
	}
	return out
}

// recordingRun is a run writing its history to a file of a temporary directory, whose
// path it returns.
func recordingRun(t *testing.T) (*run, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.jsonl")
	rec, err := history.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	return &run{rec: rec, clk: history.NewClock(), stats: &Stats{Faults: map[string]int{}}}, path
}
