package broker

import (
	"context"
	"errors"
	"strconv"
	"testing"
)

// TestABatchNamingANewerIncarnationOnANodeBehindCatchesUp: a produce-batch that names
// the topic's incarnation (every remote child's batch does) reaches a node whose
// metadata has not caught up with the topic's delete and re-create yet. The batch names
// the topic as it is now, so the node must catch up and store it. On the old code it
// answered 409 incarnation_mismatch ("deleted and created again since; nothing was
// written"), which tells a client, and a remote child's copier, that its target is
// gone; an ack naming a newer incarnation already caught up first. Cut off from the
// controller, it answers unavailable (retry).
func TestABatchNamingANewerIncarnationOnANodeBehindCatchesUp(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 3)
	ctx := context.Background()
	_, f, m, undo := recreatedBehind(t, plane, bs, TopicSpec{Name: "again", Partitions: ptr[int32](1)})
	defer undo()
	if !bs[f].Ready() {
		t.Fatal("the cut node is not ready: the test proves nothing")
	}
	_, err := bs[f].ProduceChecked(ctx, "again", ProduceCheck{Incarnation: strconv.FormatUint(m.Incarnation, 10)},
		[]Outgoing{{Partition: -1, Value: []byte("m")}})
	if errors.Is(err, ErrIncarnationMismatch) {
		t.Fatalf("a batch naming the topic's current incarnation %d was refused as naming a deleted one: %v", m.Incarnation, err)
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a batch naming incarnation %d through a node cut off from the controller answered %v; want unavailable (retry)", m.Incarnation, err)
	}
	// Once the node can ask the controller, it catches up and stores the batch.
	undo()
	pollUntil(t, "the batch stored through the node that was behind", func() error {
		_, err := bs[f].ProduceChecked(ctx, "again", ProduceCheck{Incarnation: strconv.FormatUint(m.Incarnation, 10)},
			[]Outgoing{{Partition: -1, Value: []byte("m")}})
		if errors.Is(err, ErrIncarnationMismatch) {
			t.Fatalf("a batch naming the topic's current incarnation %d was refused as naming a deleted one: %v", m.Incarnation, err)
		}
		return err
	})
}
