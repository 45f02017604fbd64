package broker

import (
	"context"
	"testing"
	"time"
)

// TestConsumeForAGoneClientLeasesNothing: a consume whose client has gone (its context
// is cancelled) must not lease a message, or the message stays hidden for a visibility
// timeout with nobody to process it. Here the client is gone before the message is
// looked at: the message must stay available to the next consumer at once.
func TestConsumeForAGoneClientLeasesNothing(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t", Partitions: ptr[int32](1), VisibilityMs: ptr[int64](3_600_000)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 1)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		got, err := b.Consume(gone, "t", 10, wait)
		if len(got) != 0 || err == nil {
			t.Fatalf("wait %v: a consume for a gone client got %d messages, err %v; want none and the context's error", wait, len(got), err)
		}
	}
	got, err := b.Consume(context.Background(), "t", 10, 0)
	if err != nil || len(got) != 1 || got[0].Attempt != 1 {
		t.Fatalf("the next consumer got %+v, %v; want the message, first attempt", got, err)
	}
}

// TestHandBackFreesLeasesAtOnce: leases taken for a client that went while they were
// being taken are handed back, deliverable again at once (not after an hour's
// visibility timeout).
func TestHandBackFreesLeasesAtOnce(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](2), VisibilityMs: ptr[int64](3_600_000)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 4)
	got, err := b.Consume(ctx, "t", 10, 0)
	if err != nil || len(got) != 4 {
		t.Fatalf("%d messages, %v", len(got), err)
	}
	tp, err := b.lookup("t")
	if err != nil {
		t.Fatal(err)
	}
	b.handBack(tp, got)
	again, err := b.Consume(ctx, "t", 10, 0)
	if err != nil || len(again) != 4 {
		t.Fatalf("after the hand-back a consume got %d messages, %v; want all 4", len(again), err)
	}
}

// TestHandBackCountsNoAttempt: a lease handed back because its client went was never
// sent to anyone, so it is not a delivery attempt: the next consumer must see the
// message's first attempt, as after an unsent lease (Unlease), not a second one.
// delivery_attempt drives retry tiers and parking after N attempts.
func TestHandBackCountsNoAttempt(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](1), VisibilityMs: ptr[int64](3_600_000)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 2)
	got, err := b.Consume(ctx, "t", 10, 0)
	if err != nil || len(got) != 2 {
		t.Fatalf("%d messages, %v", len(got), err)
	}
	tp, err := b.lookup("t")
	if err != nil {
		t.Fatal(err)
	}
	b.handBack(tp, got)
	again, err := b.Consume(ctx, "t", 10, 0)
	if err != nil || len(again) != 2 {
		t.Fatalf("after the hand-back a consume got %d messages, %v; want both", len(again), err)
	}
	for _, d := range again {
		if d.Attempt != 1 {
			t.Fatalf("offset %d: delivery_attempt %d after a hand-back, want 1: a lease never sent counted as an attempt", d.Offset, d.Attempt)
		}
	}
	// A handle that is no longer the lease (here: the one handed back) hands back nothing.
	b.handBack(tp, got)
	if more, err := b.Consume(ctx, "t", 10, 0); err != nil || len(more) != 0 {
		t.Fatalf("a stale hand-back freed leases another consumer holds: %d messages, %v", len(more), err)
	}
}
