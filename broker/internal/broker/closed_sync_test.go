package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
)

// nonController returns the index of a broker that is not the controller.
func nonController(t *testing.T, bs []*Broker) int {
	t.Helper()
	for k, b := range bs {
		if !b.meta.Leader() {
			return k
		}
	}
	t.Fatal("every node is the controller")
	return -1
}

// slowSync makes every catch-up with the controller (sync_index) take d, as a
// controller that is far, loaded, or being replaced does, and counts them.
func slowSync(plane *fakePlane, d time.Duration) *atomic.Int64 {
	var n atomic.Int64
	plane.mu.Lock()
	plane.seeMeta = func(body []byte) {
		var r struct{ Kind string }
		_ = json.Unmarshal(body, &r)
		if r.Kind == "sync_index" {
			n.Add(1)
			time.Sleep(d)
		}
	}
	plane.mu.Unlock()
	return &n
}

// TestABatchAckOnAClosedPartitionAsksTheControllerOnce: a batch ack of 50 handles of
// a partition closed under it (a move) must find its answer (503, the topic stays)
// with one catch-up with the controller. On the old code each handle caught up in
// turn: 50 round trips in series, 1.5 s with a controller 30 ms away, and 50 times
// syncBound (100 s) for one request with a controller that cannot answer.
func TestABatchAckOnAClosedPartitionAsksTheControllerOnce(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 2)
	ctx := context.Background()
	e := nonController(t, bs)
	entry := bs[e]
	const name, n = "acked-while-moving", 50
	if _, err := entry.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1), VisibilityMs: ptr[int64](60_000)}); err != nil {
		t.Fatal(err)
	}
	var out []Outgoing
	for i := range n {
		out = append(out, Outgoing{Partition: 0, Value: []byte(fmt.Sprint(i))})
	}
	if _, err := entry.Produce(ctx, name, out); err != nil {
		t.Fatal(err)
	}
	var reqs []AckReq
	for len(reqs) < n {
		ds, err := entry.Consume(ctx, name, n, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			reqs = append(reqs, AckReq{Handle: d.Handle})
		}
	}
	closeInPlace(t, bs[holderIndex(t, bs, name, 0)], name, 0)
	syncs := slowSync(plane, 30*time.Millisecond)
	defer func() { plane.mu.Lock(); plane.seeMeta = nil; plane.mu.Unlock() }()
	start := time.Now()
	errs := entry.Ack(name, reqs)
	took := time.Since(start)
	for _, err := range errs {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("an ack answered %v; want unavailable", err)
		}
	}
	t.Logf("the batch ack of %d handles took %v and caught up with the controller %d times", n, took, syncs.Load())
	if syncs.Load() > 2 || took > time.Second {
		t.Errorf("one batch ack caught up with the controller %d times in series (%v): one catch-up answers every handle of the closed partition", syncs.Load(), took)
	}
}

// TestAConsumeHoldingLeasesDoesNotWaitOnTheController: a consume that holds leases
// from one partition and then meets another partition closed under it (a move) must
// answer with its leases at once. On the old code it waited for a catch-up with the
// controller to word an error it then dropped: with a visibility timeout of 1 s and a
// controller 1.2 s away, the client was handed leases that had lapsed, and its ack
// answered 410 lease_lost though it acked at once.
func TestAConsumeHoldingLeasesDoesNotWaitOnTheController(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 2)
	ctx := context.Background()
	e := nonController(t, bs)
	entry := bs[e]
	const name = "half-moving"
	if _, err := entry.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](2), VisibilityMs: ptr[int64](1000)}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := entry.Produce(ctx, name, []Outgoing{{Partition: 1, Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
	}
	closeInPlace(t, bs[holderIndex(t, bs, name, 0)], name, 0)
	slowSync(plane, 1200*time.Millisecond)
	defer func() { plane.mu.Lock(); plane.seeMeta = nil; plane.mu.Unlock() }()
	for k := range 2 { // one of two consumes asks partition 1 first
		start := time.Now()
		ds, err := entry.Consume(ctx, name, 10, 0)
		took := time.Since(start)
		if err != nil || len(ds) == 0 {
			t.Logf("consume %d: %v after %v (the closed partition was asked first)", k, err, took)
			continue
		}
		aerr := entry.Ack(name, []AckReq{{Handle: ds[0].Handle}})[0]
		t.Logf("consume %d: %d message(s) after %v; the ack at once answered %v", k, len(ds), took, aerr)
		if errors.Is(aerr, ErrLeaseLost) || errors.Is(aerr, queue.ErrLeaseLost) {
			t.Errorf("a consume handed out a lease %v after taking it (visibility 1 s): the ack at once answered %v", took, aerr)
		}
	}
}
