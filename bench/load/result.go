package load

import (
	"time"

	"github.com/narad-mq/narad/bench/proc"
)

// Op names of the latencies a Result carries.
const (
	OpProduce      = "produce"       // request to confirmation (latency shape: from the scheduled send time)
	OpProduceBatch = "produce-batch" // one batch request to its confirmation
	OpConsume      = "consume"       // request to answer, of consumes that returned messages (long-poll wait included)
	OpConsumeBatch = "consume-batch"
	OpConsumeAvail = "consume-avail" // consume of a message whose produce was confirmed before the consume was sent
	OpAck          = "ack"
	OpAckBatch     = "ack-batch"
	OpWakeup       = "wake-up" // consume answered minus produce confirmed, for a consumer parked before the confirmation; clamped at 0
)

// Latency is the distribution of one operation in one shape.
type Latency struct {
	Op string `json:"op"`
	Summary
}

// Result is one shape run against one target.
type Result struct {
	Target string `json:"target"`
	Shape  string `json:"shape"`
	// Window is the measured time: from the start of the shape until every producer
	// returned (the set duration plus the requests in flight at its end).
	Window time.Duration `json:"window_ns"`
	// Produced counts confirmed messages and Acked settled ones, both within Window.
	Produced     int64   `json:"produced"`
	Acked        int64   `json:"acked"`
	ProducedRate float64 `json:"produced_per_s"`
	AckedRate    float64 `json:"acked_per_s"`
	// PayloadMBps is confirmed payload in MB (10^6 bytes) per second.
	PayloadMBps float64 `json:"payload_mb_per_s"`
	// OfferedRate is the open-loop rate asked of the latency and wake-up shapes.
	OfferedRate float64   `json:"offered_per_s,omitempty"`
	Latencies   []Latency `json:"latencies"`
	// Check accounts for every message; nil for shapes that do not consume.
	Check *Check `json:"check,omitempty"`
	// Drain is how long consumers needed after the window to deliver the backlog;
	// DrainTimedOut says the Drain bound passed first (then Lost counts what was
	// still undelivered).
	Drain         time.Duration `json:"drain_ns"`
	DrainTimedOut bool          `json:"drain_timed_out"`
	// Errors counts failed requests (transport errors, unexpected statuses) and failed
	// entries of batch requests; FirstError is the first of them.
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Usage is the server process over Window; nil when it could not be observed.
	Usage *proc.Usage `json:"usage,omitempty"`
	// Client is the benchmark process itself over Window: on a small machine the
	// load generator takes CPU the server could have used.
	Client *proc.Usage `json:"client_usage,omitempty"`
	Fanout *Fanout     `json:"fanout,omitempty"`
}

// Fanout is what the fan-out shape measures beyond the producers.
type Fanout struct {
	Children int `json:"children"`
	// CopiesRate is messages copied into all children per second, from the start
	// until the children caught up.
	CopiesRate float64 `json:"copies_per_s"`
	MaxLag     int64   `json:"max_lag"`
	// CaughtUp is the time from the last confirmed produce until every child held
	// every message; CaughtUpTimedOut says the Drain bound passed first.
	CaughtUp         time.Duration `json:"caught_up_ns"`
	CaughtUpTimedOut bool          `json:"caught_up_timed_out"`
}

// Latency returns the summary of op, and false when the result has none.
func (r Result) Latency(op string) (Summary, bool) {
	for _, l := range r.Latencies {
		if l.Op == op {
			return l.Summary, true
		}
	}
	return Summary{}, false
}
