// Package narad is the Go SDK of Narad, a durable, queue-first message broker spoken
// over plain HTTP.
//
// Make one Client per process with New and a list of endpoints; calls go to the first
// healthy one and fail over to the next, with a circuit breaker per endpoint, and lease
// calls go to the endpoint that leased the message:
//
//	c, err := narad.New([]string{"http://10.0.0.1:7942", "http://10.0.0.2:7942"})
//	defer c.Close()
//
// Produce writes one message and returns once it is durable; ProduceBatch writes many
// in one request and reports a result per message; a Publisher batches for you by count,
// bytes and linger. Bodies are bytes and round-trip exactly; strings and JSON values are
// conveniences on top.
//
// Consume runs a worker pool over a topic: it takes only as many messages as it has free
// workers, renews each lease before two thirds of its window while the handler runs (up
// to a max lease), cancels the handler's context when a lease is lost (and never acks
// that message), acks on success with confirmed retries, hands the message back on error
// or panic, and drains on cancellation. Receive is the one-poll building block; Replay
// reads the log without leases from a Position, bounded or following. A Position keeps
// the topic's incarnation, so a topic deleted and created again since is refused with
// ErrConflict (code incarnation_mismatch) rather than read at offsets that meant other
// messages.
//
// Errors carry their kind as a sentinel for errors.Is (ErrNotFound, ErrLeaseLost,
// ErrUnavailable, ...) and the details as *Error for errors.As; Retryable and Uncertain
// answer the two questions every failure raises.
//
// The sub-package api is the low-level client generated from openapi.yaml, for the raw
// API. This package builds every request with api's generated builders, so a change to
// the spec that breaks the SDK fails to compile.
package narad
