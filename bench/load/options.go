package load

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// The shapes, in the order Run runs them.
const (
	ShapeProduce = "produce" // producers only, one message per request
	ShapeFlow    = "flow"    // produce, consume and ack, one request per message each
	ShapeBatch   = "batch"   // the same flow, Batch messages per request
	ShapeLatency = "latency" // open-loop producers at Rate; consume of an available message
	ShapeWakeup  = "wakeup"  // consumers parked in long polls, one producer at WakeRate
	ShapeFanout  = "fanout"  // producers into a parent with children (Fanouter targets only)
)

// Shapes lists every shape in run order.
var Shapes = []string{ShapeProduce, ShapeFlow, ShapeBatch, ShapeLatency, ShapeWakeup, ShapeFanout}

// Options are the workload parameters shared by every shape.
type Options struct {
	Producers  int           `json:"producers"`   // concurrent producers (16)
	Consumers  int           `json:"consumers"`   // concurrent consumers (16)
	Size       int           `json:"size"`        // payload bytes, at least IDSize (256)
	Partitions int           `json:"partitions"`  // partitions of each queue (6)
	Batch      int           `json:"batch"`       // messages per request in the batch shape (100)
	Duration   time.Duration `json:"duration_ns"` // measured window of each shape (10 s)
	// Wait is the long poll of every consume (1 s).
	Wait time.Duration `json:"wait_ns"`
	// Drain bounds how long consumers keep going after the producers stopped, to
	// deliver the backlog before loss is counted (30 s).
	Drain time.Duration `json:"drain_ns"`
	// Rate is the open-loop produce rate of the latency shape in messages/s; 0 means
	// half of the flow shape's acked rate measured in the same run, or when the flow
	// shape did not run, half of the produce shape's rate (the produce shape is run
	// first when neither was asked for).
	Rate float64 `json:"rate"`
	// WakeRate is the produce rate of the wake-up shape, low so consumers are parked
	// when a message arrives (50/s).
	WakeRate float64 `json:"wake_rate"`
	// Children is the number of children of the fan-out shape (3).
	Children int `json:"children"`
	// Log receives one progress line per shape; nil discards them.
	Log io.Writer `json:"-"`
}

// Defaults are the options of `make bench`.
func Defaults() Options {
	return Options{
		Producers: 16, Consumers: 16, Size: 256, Partitions: 6, Batch: 100,
		Duration: 10 * time.Second, Wait: time.Second, Drain: 30 * time.Second,
		WakeRate: 50, Children: 3,
	}
}

// Validate reports the first option that cannot run.
func (o Options) Validate() error {
	switch {
	case o.Producers < 1:
		return fmt.Errorf("producers must be at least 1, not %d", o.Producers)
	case o.Consumers < 1:
		return fmt.Errorf("consumers must be at least 1, not %d", o.Consumers)
	case o.Size < IDSize:
		return fmt.Errorf("size must be at least %d bytes (the message id), not %d", IDSize, o.Size)
	case o.Partitions < 1:
		return fmt.Errorf("partitions must be at least 1, not %d", o.Partitions)
	case o.Batch < 1:
		return fmt.Errorf("batch must be at least 1, not %d", o.Batch)
	case o.Duration <= 0:
		return fmt.Errorf("duration must be positive, not %s", o.Duration)
	case o.Wait <= 0:
		return fmt.Errorf("wait must be positive, not %s", o.Wait)
	case o.Drain < 0:
		return fmt.Errorf("drain must not be negative, not %s", o.Drain)
	case o.Rate < 0 || o.WakeRate <= 0:
		return fmt.Errorf("rate must not be negative and wake rate must be positive (%g, %g)", o.Rate, o.WakeRate)
	case o.Children < 1:
		return fmt.Errorf("children must be at least 1, not %d", o.Children)
	}
	return nil
}

// ParseShapes turns a --mode value into shapes in run order: "all", one shape, or a
// comma-separated list. "latency" brings "wakeup" with it, as the two halves of the
// latency measurement.
func ParseShapes(mode string) ([]string, error) {
	want := map[string]bool{}
	for _, m := range strings.Split(mode, ",") {
		m = strings.TrimSpace(m)
		switch m {
		case "all":
			for _, s := range Shapes {
				want[s] = true
			}
		case ShapeLatency:
			want[ShapeLatency], want[ShapeWakeup] = true, true
		case ShapeProduce, ShapeFlow, ShapeBatch, ShapeWakeup, ShapeFanout:
			want[m] = true
		default:
			return nil, fmt.Errorf("unknown mode %q: want all, or some of %s", m, strings.Join(Shapes, ","))
		}
	}
	var out []string
	for _, s := range Shapes {
		if want[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// RegisterFlags binds the options to flags of fs with the options' current values as
// defaults, so every benchmark command spells them the same way.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Producers, "producers", o.Producers, "concurrent producers")
	fs.IntVar(&o.Consumers, "consumers", o.Consumers, "concurrent consumers")
	fs.IntVar(&o.Size, "size", o.Size, "message size in bytes (the first 8 carry the message id)")
	fs.IntVar(&o.Partitions, "partitions", o.Partitions, "partitions of each benchmark topic")
	fs.IntVar(&o.Batch, "batch", o.Batch, "messages per request in the batch shape")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "measured window of each shape")
	fs.DurationVar(&o.Wait, "wait", o.Wait, "long poll of every consume")
	fs.DurationVar(&o.Drain, "drain", o.Drain, "longest time consumers get after a window to deliver the backlog")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "messages/s of the latency shape (0: half of the flow shape's acked rate in this run, else half of the produce shape's)")
	fs.Float64Var(&o.WakeRate, "wake-rate", o.WakeRate, "messages/s of the wake-up shape")
	fs.IntVar(&o.Children, "children", o.Children, "children of the fan-out shape")
}
