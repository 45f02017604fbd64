package load

import (
	"bytes"
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func testOptions() Options {
	o := Defaults()
	o.Producers, o.Consumers, o.Size, o.Batch = 4, 4, 64, 10
	o.Duration, o.Wait, o.Drain = 300*time.Millisecond, 100*time.Millisecond, 5*time.Second
	o.Rate, o.WakeRate = 2000, 100
	return o
}

func payloadOf(id uint64) []byte {
	b := make([]byte, 16)
	PutID(b, id)
	return b
}

func TestTrackerAccounts(t *testing.T) {
	var tr Tracker
	first := tr.Reserve(10)
	if first != 0 {
		t.Fatalf("first id %d, want 0", first)
	}
	for id := uint64(0); id < 9; id++ { // 9 stays unconfirmed
		tr.Confirm(id)
	}
	for id := uint64(0); id < 8; id++ { // 8 is lost
		tr.Deliver(payloadOf(id))
	}
	tr.Deliver(payloadOf(3)) // a duplicate
	tr.Deliver(payloadOf(3)) // and a second redelivery of it
	tr.Deliver(payloadOf(9)) // delivered though never confirmed
	if _, ok := tr.Deliver(payloadOf(10)); ok {
		t.Error("an id never reserved was taken as ours")
	}
	if _, ok := tr.Deliver([]byte("short")); ok {
		t.Error("a payload without an id was taken as ours")
	}
	if tr.AllDelivered() {
		t.Error("AllDelivered with id 8 never delivered")
	}
	got := tr.Check()
	want := Check{Reserved: 10, Confirmed: 9, Delivered: 9, Lost: 1, Duplicates: 1, Redelivered: 2, Unconfirmed: 1, Foreign: 2}
	if got != want {
		t.Fatalf("check\n got %+v\nwant %+v", got, want)
	}
	tr.Deliver(payloadOf(8))
	if !tr.AllDelivered() {
		t.Error("not AllDelivered once id 8 arrived")
	}
}

// Confirm and Deliver of the same id race in real runs; Covered must stay exact.
func TestTrackerConfirmDeliverRace(t *testing.T) {
	var tr Tracker
	const n = 3 * chunkSize // crosses chunk boundaries
	tr.Reserve(n)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(2)
		go func(w int) {
			defer wg.Done()
			for id := uint64(w); id < n; id += 4 {
				tr.Confirm(id)
			}
		}(w)
		go func(w int) {
			defer wg.Done()
			for id := uint64(w); id < n; id += 4 {
				tr.Deliver(payloadOf(id))
			}
		}(w)
	}
	wg.Wait()
	if tr.Confirmed() != n || tr.Covered() != n {
		t.Fatalf("confirmed %d covered %d, want %d each", tr.Confirmed(), tr.Covered(), n)
	}
	if c := tr.Check(); c.Lost != 0 || c.Duplicates != 0 || c.Delivered != n {
		t.Fatalf("check %+v", c)
	}
}

func TestSummarizeNearestRank(t *testing.T) {
	var a, b Recorder
	for i := 1; i <= 50; i++ {
		a.Add(time.Duration(i) * time.Millisecond)
		b.Add(time.Duration(100-i+1) * time.Millisecond)
	}
	s := Summarize(&a, nil, &b)
	want := Summary{N: 100, P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
	if (Summarize() != Summary{}) {
		t.Fatal("empty summary not zero")
	}
}

func TestParseShapes(t *testing.T) {
	for mode, want := range map[string]string{
		"all":           "produce,flow,batch,latency,wakeup,fanout",
		"latency":       "latency,wakeup",
		"batch,produce": "produce,batch",
		"fanout":        "fanout",
	} {
		got, err := ParseShapes(mode)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("ParseShapes(%q) = %v, %v; want %s", mode, got, err, want)
		}
	}
	if _, err := ParseShapes("produce,nope"); err == nil {
		t.Error("unknown mode accepted")
	}
}

// Every shape runs against an honest fake and reports a clean account.
func TestShapesAgainstFake(t *testing.T) {
	if testing.Short() {
		t.Skip("runs each shape for 300 ms")
	}
	o := testOptions()
	var log bytes.Buffer
	o.Log = &log
	rs, err := Run(context.Background(), fakeFanout{&fake{delay: 200 * time.Microsecond}}, Shapes, o)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, r.Shape)
		if r.Produced == 0 || r.ProducedRate <= 0 {
			t.Errorf("%s: nothing produced: %+v", r.Shape, r)
		}
		if r.Errors != 0 {
			t.Errorf("%s: %d errors (%s)", r.Shape, r.Errors, r.FirstError)
		}
		if s, ok := r.Latency(OpProduce); ok && s.N == 0 {
			t.Errorf("%s: no produce latency", r.Shape)
		}
		if r.Shape == ShapeProduce || r.Shape == ShapeFanout {
			continue
		}
		c := r.Check
		if c == nil || c.Lost != 0 || c.Duplicates != 0 || c.Unconfirmed != 0 || c.Foreign != 0 || r.DrainTimedOut {
			t.Errorf("%s: account %+v (drain timed out %v)", r.Shape, c, r.DrainTimedOut)
		}
		if r.AckedRate <= 0 {
			t.Errorf("%s: nothing acked", r.Shape)
		}
	}
	if strings.Join(got, ",") != strings.Join(Shapes, ",") {
		t.Fatalf("shapes run %v, want %v", got, Shapes)
	}
	if s, _ := rs[4].Latency(OpWakeup); s.N == 0 {
		t.Errorf("wake-up shape measured no wake-up: %+v", rs[4].Latencies)
	}
	if f := rs[5].Fanout; f == nil || f.CopiesRate <= 0 || f.CaughtUpTimedOut {
		t.Errorf("fan-out: %+v", f)
	}
	if n := strings.Count(log.String(), "\n"); n != len(Shapes) {
		t.Errorf("%d progress lines, want %d:\n%s", n, len(Shapes), log.String())
	}

	var out bytes.Buffer
	PrintTable(&out, rs)
	t.Log("\n" + out.String())
	for _, want := range []string{"produced/s", "flow", "batch", "latency@2000/s", "wakeup@100/s", "fanout(3)", "consume-avail", "wake-up", "ack-batch"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// The latency shape without a rate measures produce first and offers half of it.
func TestLatencyRateDefaultsToHalfOfProduce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two shapes")
	}
	o := testOptions()
	o.Rate = 0
	rs, err := Run(context.Background(), &fake{delay: 200 * time.Microsecond}, []string{ShapeLatency}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Shape != ShapeProduce || rs[1].Shape != ShapeLatency {
		t.Fatalf("ran %d shapes: %+v", len(rs), rs)
	}
	if rs[1].OfferedRate != rs[0].ProducedRate/2 {
		t.Fatalf("offered %f, want half of %f", rs[1].OfferedRate, rs[0].ProducedRate)
	}
}

// After a flow shape, the latency shape offers half of the flow's acked rate: it
// consumes and acks too.
func TestLatencyRateDefaultsToHalfOfFlow(t *testing.T) {
	o := testOptions()
	o.Rate = 0
	rs, err := Run(context.Background(), &fake{delay: 200 * time.Microsecond}, []string{ShapeProduce, ShapeFlow, ShapeLatency}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || rs[2].Shape != ShapeLatency {
		t.Fatalf("ran %d shapes: %+v", len(rs), rs)
	}
	if rs[2].OfferedRate != rs[1].AckedRate/2 {
		t.Fatalf("offered %f, want half of the flow's %f acked/s", rs[2].OfferedRate, rs[1].AckedRate)
	}
}

// A broker that confirms messages and then loses them must be caught.
func TestFlowCatchesLoss(t *testing.T) {
	o := testOptions()
	o.Drain = 300 * time.Millisecond
	for _, shape := range []string{ShapeFlow, ShapeBatch} {
		rs, err := Run(context.Background(), &fake{dropEvery: 10, delay: 200 * time.Microsecond}, []string{shape}, o)
		if err != nil {
			t.Fatal(err)
		}
		c := rs[0].Check
		if c.Lost == 0 || c.Lost > c.Confirmed/10+1 || c.Lost < c.Confirmed/10-1 {
			t.Errorf("%s: lost %d of %d confirmed, want a tenth", shape, c.Lost, c.Confirmed)
		}
		if !rs[0].DrainTimedOut {
			t.Errorf("%s: drain ended although messages were missing", shape)
		}
	}
}

// A broker that delivers messages twice must be caught.
func TestFlowCatchesDuplicates(t *testing.T) {
	o := testOptions()
	for _, shape := range []string{ShapeFlow, ShapeBatch} {
		rs, err := Run(context.Background(), &fake{dupEvery: 10, delay: 200 * time.Microsecond}, []string{shape}, o)
		if err != nil {
			t.Fatal(err)
		}
		c := rs[0].Check
		if c.Duplicates == 0 || c.Lost != 0 {
			t.Errorf("%s: %+v, want duplicates and no loss", shape, c)
		}
	}
}

func TestPrintComparison(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two shapes on two fakes")
	}
	o := testOptions()
	var all [][]Result
	for _, f := range []*fake{{name: "base", delay: 200 * time.Microsecond}, {name: "peer", delay: 2 * time.Millisecond}} {
		rs, err := Run(context.Background(), f, []string{ShapeProduce, ShapeFlow}, o)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, rs)
	}
	var out bytes.Buffer
	PrintComparison(&out, []string{"base", "peer", "gone"}, append(all, nil))
	t.Log("\n" + out.String())
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "base/peer") || !strings.Contains(lines[0], "base/gone") {
		t.Fatalf("header: %s", lines[0])
	}
	var rate string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "produce" && f[1] == "msg/s" {
			rate = l
		}
	}
	// The ratio is the base's figure over the peer's, whatever the rates came out as
	// on this machine (on a loaded one the slower fake can produce faster).
	f := strings.Fields(rate)
	if len(f) != 8 || f[7] != "-" || f[5] != "-" {
		t.Fatalf("produce row: %q", rate)
	}
	base, err1 := strconv.ParseFloat(f[3], 64)
	peer, err2 := strconv.ParseFloat(f[4], 64)
	ratio, err3 := strconv.ParseFloat(strings.TrimSuffix(f[6], "x"), 64)
	if err1 != nil || err2 != nil || err3 != nil || peer == 0 || math.Abs(ratio-base/peer) > 0.01+0.01*base/peer {
		t.Fatalf("produce row: %q: the ratio is not base/peer", rate)
	}
	if strings.Contains(out.String(), "wake-up") {
		t.Error("rows of shapes that did not run are printed")
	}
}
