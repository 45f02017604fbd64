package scenario

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/check"
	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/workload"
)

// seed returns NARAD_VERIFY_SEED or a new one; the test prints it either way.
func seed(t *testing.T) int64 {
	if s := os.Getenv("NARAD_VERIFY_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("NARAD_VERIFY_SEED=%q: %v", s, err)
		}
		return n
	}
	return time.Now().UnixNano() % 1_000_000_007
}

// TestKillLoop is the make-test tier: at least 20 kills, half of them at failpoints,
// over at least 5,000 parent messages with a fan-out child and a delay child, SIGSTOP
// pauses and torn tails, restarts with the wall clock stepped back and forward, and a
// topic deleted and recreated under load; the checker must find nothing. Then it doctors
// its own history every way check.Doctor knows and requires the checker to flag each, so
// the check can fail.
func TestKillLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("the kill loop takes about a minute and a half")
	}
	s := seed(t)
	t.Logf("seed %d (repeat with NARAD_VERIFY_SEED=%d)", s, s)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	res := Run(ctx, Config{
		Keep: true, // removed below when the test passes
		Log:  t.Logf,
		Workload: workload.Config{
			Seed: s, Messages: 6000, LoadDuration: 50 * time.Second, RetentionMs: 1000, RecreateEvery: 4 * time.Second,
			Faults: workload.FaultConfig{Kills: 20, MinFailpointKills: 10, FailpointShare: 0.5, Pauses: true, Corrupt: true,
				ClockShare: 0.25, MinClockSteps: 2, MinGap: 400 * time.Millisecond, MaxGap: 2 * time.Second},
		},
	})
	var b bytes.Buffer
	Summary(&b, res)
	t.Logf("\n%s", b.String())
	if !res.OK() {
		t.Fatalf("the kill loop failed; everything is kept in %s (seed %d)", res.Dir, s)
	}
	st := res.Stats
	if n := st.Faults["kill"] + st.Faults["failpoint-kill"]; n < 20 || st.Faults["failpoint-kill"] < 10 {
		t.Fatalf("only %d kills, %d at failpoints", n, st.Faults["failpoint-kill"])
	}
	if n := res.Report.MessagesByTopic[workload.Parent]; n < 5000 {
		t.Fatalf("only %d parent messages", n)
	}
	// Steps alternate backward and forward, so two are one of each.
	if n := st.Faults["clock"]; n < 2 {
		t.Fatalf("only %d clock steps", n)
	}
	if st.Recreated < 3 || res.Report.Incarnations[workload.Recycled] < 4 {
		t.Fatalf("%s recreated only %d times (%d incarnations seen)", workload.Recycled, st.Recreated, res.Report.Incarnations[workload.Recycled])
	}

	es, err := history.Read(filepath.Join(res.Dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range check.DoctorKinds {
		doctored, what, err := check.Doctor(es, kind)
		if err != nil {
			t.Fatalf("doctor %s: %v", kind, err)
		}
		r := check.Check(doctored)
		switch {
		case r.OK():
			t.Errorf("the checker passed a history doctored with %s: %s", kind, what)
		case want != "" && r.Violations[want] == 0:
			t.Errorf("doctored with %s (%s): flagged %v, not %s", kind, what, r.Violations, want)
		case kind == "lost" && r.Lost["orders"] != 1:
			t.Errorf("doctored with lost (%s): lost %v, want orders 1", what, r.Lost)
		}
	}
	if !t.Failed() {
		os.RemoveAll(res.Dir)
	}
}
