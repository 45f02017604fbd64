package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// closeInPlace closes partition i of topic name on b while the topic stays open: the
// moment between a request's look at the topic's partitions and followPlacement's
// replacing the partition (reopened in a new group after its replication factor was
// raised from 1 or a forced takeover, moved off the node, rebuilt after damage).
func closeInPlace(t *testing.T, b *Broker, name string, i int) {
	t.Helper()
	tp, err := b.lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.parts()[i].Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAPartitionClosedUnderItsTopicIsNotANotFound: a produce, a consume (a long poll
// too) and an ack that picked up a partition closed while its topic stays, unchanged,
// did nothing in it and must answer 503 unavailable (retry: the next request finds the
// partition where it is now), on the node holding the partition and through another
// one, whose holder answers "closed". A batch that was stored in another partition
// must still say that part of it was stored. The old code answered every closed
// partition 404 topic_not_found ("deleted while the request ran"), and the catch-up
// with the controller kept it, the incarnation being the same: the client's producer
// dropped its message as "no such topic" and its consumer stopped.
func TestAPartitionClosedUnderItsTopicIsNotANotFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// "moving" has one partition, with a message leased; "split" has two, for a batch
	// over both. Partition 0 of each is closed.
	setUp := func(t *testing.T, via *Broker) (handle string) {
		t.Helper()
		for name, n := range map[string]int32{"moving": 1, "split": 2} {
			if _, err := via.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr(n), VisibilityMs: ptr[int64](60_000)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := via.Produce(ctx, "moving", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
		ds, err := via.Consume(ctx, "moving", 1, 5*time.Second)
		if err != nil || len(ds) != 1 {
			t.Fatalf("consume: %v, %d messages", err, len(ds))
		}
		return ds[0].Handle
	}
	check := func(t *testing.T, via *Broker, handle string) {
		_, err := via.Produce(ctx, "moving", []Outgoing{{Partition: 0, Value: []byte("m2")}})
		if errors.Is(err, ErrTopicNotFound) || !errors.Is(err, ErrUnavailable) {
			t.Errorf("a produce to the closed partition answered %v; want unavailable (retry), not topic not found", err)
		}
		for _, wait := range []time.Duration{0, 500 * time.Millisecond} {
			if _, err := via.Consume(ctx, "moving", 1, wait); errors.Is(err, ErrTopicNotFound) || !errors.Is(err, ErrUnavailable) {
				t.Errorf("a consume waiting %v answered %v; want unavailable (retry), not topic not found", wait, err)
			}
		}
		for _, mode := range []AckMode{Settle, Renew} {
			if err := via.Ack("moving", []AckReq{{Handle: handle, Mode: mode}})[0]; errors.Is(err, ErrTopicNotFound) || !errors.Is(err, ErrUnavailable) {
				t.Errorf("an ack (mode %d) answered %v; want unavailable (retry), not topic not found", mode, err)
			}
		}
		_, err = via.Produce(ctx, "split", []Outgoing{{Partition: 0, Value: []byte("a")}, {Partition: 1, Value: []byte("b")}})
		if !errors.Is(err, ErrPartlyStored) {
			t.Errorf("a batch whose share in the other partition was stored answered %v; it must say part was stored", err)
		}
		if errors.Is(err, ErrTopicNotFound) || !errors.Is(err, ErrUnavailable) {
			t.Errorf("a batch half in the closed partition answered %v; want unavailable (retry), not topic not found", err)
		}
		for _, name := range []string{"moving", "split"} {
			if err := via.Exists(name); err != nil {
				t.Fatalf("topic %q is gone: %v", name, err)
			}
		}
	}

	t.Run("cluster", func(t *testing.T) {
		_, bs := startFakeCluster(t, 2)
		handle := setUp(t, bs[0])
		for _, name := range []string{"moving", "split"} {
			closeInPlace(t, bs[holderIndex(t, bs, name, 0)], name, 0)
		}
		for k := range bs {
			// One node holds the partition (its own closed); the other forwards.
			t.Run(fmt.Sprintf("through n%d", k+1), func(t *testing.T) { check(t, bs[k], handle) })
		}
	})
	t.Run("one node", func(t *testing.T) {
		b := mustStartBroker(t, t.TempDir())
		defer b.Close()
		handle := setUp(t, b)
		for _, name := range []string{"moving", "split"} {
			closeInPlace(t, b, name, 0)
		}
		check(t, b, handle)
	})
}

// TestAPartitionClosedByItsTopicsDeleteIsStillANotFound: a produce, a consume and an
// ack whose partition was closed because its topic was deleted while they ran must
// still answer 404 topic_not_found, also through a node that had not applied the
// delete when the holder answered "closed": it learns of the delete by catching up
// with the controller, and answers as for a topic that does not exist.
func TestAPartitionClosedByItsTopicsDeleteIsStillANotFound(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 2)
	ctx := context.Background()
	defer plane.setHook(nil)
	for _, kind := range []string{dataAppend, dataLease, dataSettle} {
		name := "gone-" + kind
		if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1), VisibilityMs: ptr[int64](60_000)}); err != nil {
			t.Fatal(err)
		}
		h := holderIndex(t, bs, name, 0)
		holder, entry := bs[h], bs[1-h]
		if _, err := entry.Produce(ctx, name, []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
		handle := ""
		if kind == dataSettle {
			ds, err := entry.Consume(ctx, name, 1, 5*time.Second)
			if err != nil || len(ds) != 1 {
				t.Fatalf("consume: %v, %d messages", err, len(ds))
			}
			handle = ds[0].Handle
		}
		// The holder closes the partition and answers "closed"; the delete is
		// committed before the answer reaches the entry node.
		closeInPlace(t, holder, name, 0)
		var deleted error
		plane.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
			if req.Topic != name || req.Kind != kind {
				return deliver(ctx)
			}
			resp, err := deliver(ctx)
			deleted = holder.DeleteTopic(ctx, name, 0)
			return resp, err
		})
		var err error
		switch kind {
		case dataAppend:
			_, err = entry.Produce(ctx, name, []Outgoing{{Partition: 0, Value: []byte("m2")}})
		case dataLease:
			_, err = entry.Consume(ctx, name, 1, 0)
		case dataSettle:
			err = entry.Ack(name, []AckReq{{Handle: handle}})[0]
		}
		plane.setHook(nil)
		if deleted != nil {
			t.Fatal(deleted)
		}
		if !errors.Is(err, ErrTopicNotFound) {
			t.Errorf("%s: a request whose partition closed for the topic's delete answered %v; want topic not found", kind, err)
		}
	}
}
