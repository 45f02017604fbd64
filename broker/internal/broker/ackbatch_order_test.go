package broker

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAnAckBatchNamingALeaseTwiceTakesItsEntriesInOrder: an ack-batch answers each
// entry as it would have been answered alone, in request order, so an entry that
// names a lease an earlier entry of the batch settled meets the settled lease. Extends
// and nacks were carried out before every settle of the batch, whatever their place:
// [ack H, nack H] handed the message back, answered the ack 410 and delivered the
// message again, and [ack H, extend=true H] answered the renewal of a lease the batch
// then settled 204.
func TestAnAckBatchNamingALeaseTwiceTakesItsEntriesInOrder(t *testing.T) {
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
	h0, h1 := got[0].Handle, got[1].Handle
	errs := b.Ack("t", []AckReq{
		{Handle: h0},                 // ack
		{Handle: h0, Mode: ExtendBy}, // then a nack of the lease just settled
		{Handle: h1, Mode: ExtendBy, Delay: time.Hour}, // a nack with a delay, then
		{Handle: h1},              // its ack within the lease
		{Handle: h1, Mode: Renew}, // and a renewal of the lease just settled
	})
	want := []error{nil, ErrLeaseLost, nil, nil, ErrLeaseLost}
	for i := range want {
		if !errors.Is(errs[i], want[i]) || (want[i] == nil && errs[i] != nil) {
			t.Errorf("entry %d answered %v, want %v", i, errs[i], want[i])
		}
	}
	if again, err := b.Consume(ctx, "t", 10, 0); err != nil || len(again) != 0 {
		t.Fatalf("after the batch acked both messages a consume got %d of them (offset %d first), %v", len(again), again[0].Offset, err)
	}
}
