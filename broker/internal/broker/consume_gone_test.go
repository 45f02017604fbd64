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
