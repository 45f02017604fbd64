// Package load is the workload engine behind narad-bench and narad-bench-peers: it
// drives a Target (narad over HTTP, NATS JetStream, Redis Streams, or an in-memory
// fake in tests) through fixed workload shapes, tracks every message by a unique id
// carried in its payload, and reports throughput, latency percentiles, loss,
// duplicates and the server process's CPU and memory.
//
// The engine knows nothing of any broker's API: a Target adapts one broker to the
// four operations every shape is built from (produce, produce a batch, consume up to
// n with a long poll, acknowledge).
package load

import (
	"context"
	"time"
)

// Target is one broker under test. A Target is opened (its server started, its client
// connected) by its own package and closed by the caller after the run.
type Target interface {
	// Name identifies the target in tables, e.g. "narad" or "jetstream-sync".
	Name() string
	// PID is the server process whose CPU and memory are sampled; 0 when the server
	// is not a local process the run can observe (then those columns are empty).
	PID() int
	// Open creates a fresh, empty queue of the given number of partitions for one
	// shape. Each shape opens its own queue.
	Open(ctx context.Context, partitions int) (Queue, error)
	// Close releases the client and stops any server the target started.
	Close() error
}

// Observer is a Target that watches its servers shape by shape: ShapeStarted is called
// just before a shape's measured window starts (a profile over it, say, in the
// background; what it does itself is not measured) and
// ShapeEnded when the shape is over, drain included. The target's Close waits for what
// it started.
type Observer interface {
	ShapeStarted(shape string, window time.Duration)
	ShapeEnded(shape string)
}

// Queue is one topic (or its equivalent) created by Target.Open.
type Queue interface {
	// Producer returns the producer that goroutine i uses. The engine never shares a
	// Producer between goroutines, so it may keep per-goroutine buffers, and a target
	// whose partitions are client-side may start goroutine i on partition i.
	Producer(i int) Producer
	// Consumer returns the consumer that goroutine i of n uses, under the same rules.
	// A target with client-side partitions can pin consumer i to partition
	// i mod partitions when n >= partitions, so every partition has consumers parked
	// on it, and rotate them otherwise.
	Consumer(i, n int) Consumer
	// Delete removes the queue and its data; errors are reported but not fatal.
	Delete(ctx context.Context) error
}

// Producer writes messages. Both methods return only once the broker confirmed the
// messages as its durable write path defines it (narad: 202, fsynced; JetStream: the
// PubAck; Redis: the XADD reply). A nil error means every message was confirmed; the
// payload slices are not retained after the call returns.
type Producer interface {
	Produce(ctx context.Context, payload []byte) error
	ProduceBatch(ctx context.Context, payloads [][]byte) error
}

// Consumer takes and settles messages.
type Consumer interface {
	// Consume returns up to max messages, waiting up to wait for the first one;
	// an empty result with a nil error means none arrived within wait.
	Consume(ctx context.Context, max int, wait time.Duration) ([]Delivery, error)
	// Ack settles deliveries in one request when the broker allows it and returns how
	// many were settled; err describes the first failure.
	Ack(ctx context.Context, ds []Delivery) (int, error)
}

// Delivery is one consumed message. Payload may alias a buffer of the Consumer that
// the next Consume overwrites; Handle and Ref are whatever the target needs to ack.
type Delivery struct {
	Payload []byte
	Handle  string
	Part    int
	Ref     any
}

// Fanouter is implemented by targets that copy a parent topic into children
// (narad's fan-out). The fan-out shape runs only on such targets.
type Fanouter interface {
	// OpenFanout creates a parent queue with children attached and returns a probe
	// of the copies: the total lag of every child and the number of messages copied.
	OpenFanout(ctx context.Context, partitions, children int) (Queue, func(context.Context) (lag, copied int64, err error), error)
}

// Processes is implemented by targets whose server is several processes (a cluster of
// nodes on this machine). Their usage is added up: the CPU of every process, and the
// sum of each one's peak RSS.
type Processes interface {
	// PIDs are the server's processes; PID is then one of them.
	PIDs() []int
}
