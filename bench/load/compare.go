package load

import (
	"fmt"
	"io"
	"time"
)

// metric is one row of the comparison: a figure of one shape, and which way is better.
type metric struct {
	shape  string // "" for a figure over every shape
	label  string
	better string // "higher", "lower", or "" for figures without a ratio
	value  func(rs []Result) (float64, bool)
	format func(float64) string
}

func shapeOf(rs []Result, shape string) (Result, bool) {
	for _, r := range rs {
		if r.Shape == shape {
			return r, true
		}
	}
	return Result{}, false
}

func field(shape string, f func(Result) (float64, bool)) func([]Result) (float64, bool) {
	return func(rs []Result) (float64, bool) {
		r, ok := shapeOf(rs, shape)
		if !ok {
			return 0, false
		}
		return f(r)
	}
}

func pct(op string, p func(Summary) time.Duration) func(Result) (float64, bool) {
	return func(r Result) (float64, bool) {
		s, ok := r.Latency(op)
		if !ok || s.N == 0 {
			return 0, false
		}
		return float64(p(s)), true
	}
}

func p50(s Summary) time.Duration { return s.P50 }
func p99(s Summary) time.Duration { return s.P99 }

// cpuPerMsg is the server's CPU time per message: produced or acked.
func cpuPerMsg(acked bool) func(Result) (float64, bool) {
	return func(r Result) (float64, bool) {
		rate := r.ProducedRate
		if acked {
			rate = r.AckedRate
		}
		if r.Usage == nil || rate <= 0 {
			return 0, false
		}
		return r.Usage.CPU * 1e6 / rate, true
	}
}

func sum(f func(Result) int64) func([]Result) (float64, bool) {
	return func(rs []Result) (float64, bool) {
		var n int64
		for _, r := range rs {
			n += f(r)
		}
		return float64(n), len(rs) > 0
	}
}

func fmtMs(v float64) string    { return ms(time.Duration(v)) }
func fmtInt(v float64) string   { return fmt.Sprintf("%.0f", v) }
func fmtFixed(v float64) string { return fmt.Sprintf("%.2f", v) }

var metrics = []metric{
	{ShapeProduce, "msg/s", "higher", field(ShapeProduce, func(r Result) (float64, bool) { return r.ProducedRate, true }), count},
	{ShapeProduce, "produce p50 ms", "lower", field(ShapeProduce, pct(OpProduce, p50)), fmtMs},
	{ShapeProduce, "produce p99 ms", "lower", field(ShapeProduce, pct(OpProduce, p99)), fmtMs},
	{ShapeProduce, "server CPU us/msg", "lower", field(ShapeProduce, cpuPerMsg(false)), count},
	{ShapeFlow, "acked msg/s", "higher", field(ShapeFlow, func(r Result) (float64, bool) { return r.AckedRate, true }), count},
	{ShapeFlow, "produced msg/s", "higher", field(ShapeFlow, func(r Result) (float64, bool) { return r.ProducedRate, true }), count},
	{ShapeFlow, "produce p99 ms", "lower", field(ShapeFlow, pct(OpProduce, p99)), fmtMs},
	{ShapeFlow, "consume p99 ms", "lower", field(ShapeFlow, pct(OpConsume, p99)), fmtMs},
	{ShapeFlow, "ack p99 ms", "lower", field(ShapeFlow, pct(OpAck, p99)), fmtMs},
	{ShapeFlow, "server CPU us/acked msg", "lower", field(ShapeFlow, cpuPerMsg(true)), count},
	{ShapeBatch, "acked msg/s", "higher", field(ShapeBatch, func(r Result) (float64, bool) { return r.AckedRate, true }), count},
	{ShapeBatch, "payload MB/s produced", "higher", field(ShapeBatch, func(r Result) (float64, bool) { return r.PayloadMBps, true }), fmtFixed},
	{ShapeBatch, "produce-batch p99 ms", "lower", field(ShapeBatch, pct(OpProduceBatch, p99)), fmtMs},
	{ShapeBatch, "server CPU us/acked msg", "lower", field(ShapeBatch, cpuPerMsg(true)), count},
	{ShapeLatency, "offered msg/s", "", field(ShapeLatency, func(r Result) (float64, bool) { return r.OfferedRate, true }), fmtInt},
	{ShapeLatency, "produce p50 ms", "lower", field(ShapeLatency, pct(OpProduce, p50)), fmtMs},
	{ShapeLatency, "produce p99 ms", "lower", field(ShapeLatency, pct(OpProduce, p99)), fmtMs},
	{ShapeLatency, "consume-avail p50 ms", "lower", field(ShapeLatency, pct(OpConsumeAvail, p50)), fmtMs},
	{ShapeLatency, "consume-avail p99 ms", "lower", field(ShapeLatency, pct(OpConsumeAvail, p99)), fmtMs},
	{ShapeWakeup, "wake-up p50 ms", "lower", field(ShapeWakeup, pct(OpWakeup, p50)), fmtMs},
	{ShapeWakeup, "wake-up p99 ms", "lower", field(ShapeWakeup, pct(OpWakeup, p99)), fmtMs},
	{"", "server RSS peak MB", "lower", func(rs []Result) (float64, bool) {
		var peak int64
		for _, r := range rs {
			if r.Usage != nil {
				peak = max(peak, r.Usage.RSSPeak)
			}
		}
		return float64(peak) / 1e6, peak > 0
	}, fmtFixed},
	{"", "lost", "", sum(func(r Result) int64 {
		if r.Check == nil {
			return 0
		}
		return r.Check.Lost
	}), fmtInt},
	{"", "duplicates", "", sum(func(r Result) int64 {
		if r.Check == nil {
			return 0
		}
		return r.Check.Duplicates
	}), fmtInt},
	{"", "errors", "", sum(func(r Result) int64 { return r.Errors }), fmtInt},
}

// PrintComparison writes one table of every target's figures side by side, the
// first target being the base, and base/target ratios: above 1 the base has more of
// it (better for rates, worse for latencies and costs; the "better" column says
// which way is good). Rows a shape did not produce are left out.
//
// names[i] names targets[i]; a target that produced no results shows "-" throughout.
func PrintComparison(w io.Writer, names []string, targets [][]Result) {
	if len(targets) == 0 || len(names) != len(targets) {
		return
	}
	head := append([]string{"shape", "figure", "better"}, names...)
	for _, n := range names[1:] {
		head = append(head, names[0]+"/"+n)
	}
	t := &table{left: 3}
	t.add(head...)
	for _, m := range metrics {
		row := []string{m.shape, m.label, m.better}
		if m.shape == "" {
			row[0] = "all"
		}
		seen := false
		vals := make([]float64, len(targets))
		oks := make([]bool, len(targets))
		for i, rs := range targets {
			if len(rs) > 0 {
				vals[i], oks[i] = m.value(rs)
			}
			if oks[i] {
				row = append(row, m.format(vals[i]))
				seen = true
			} else {
				row = append(row, "-")
			}
		}
		if !seen {
			continue
		}
		for i := 1; i < len(targets); i++ {
			if m.better == "" || !oks[0] || !oks[i] || vals[0] == 0 || vals[i] == 0 {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%.2fx", vals[0]/vals[i]))
		}
		t.add(row...)
	}
	t.write(w)
}
