package broker

import (
	"context"
	"errors"
	"testing"
)

// TestADeleteOfAnIncarnationReplacedSinceIsAMismatch: a delete naming an incarnation
// of a topic deleted and created again since, refused by the controller (the node that
// took it had not seen the topic created again, so its own check let it through), says
// the name is another topic now: ErrIncarnationMismatch, which the API answers 409
// incarnation_mismatch as its spec says. It answered ErrTopicNotFound (404), as if the
// name had no topic. The topic created again stays.
func TestADeleteOfAnIncarnationReplacedSinceIsAMismatch(t *testing.T) {
	t.Parallel()
	_, bs := startFakeCluster(t, 3)
	ctx := context.Background()
	old, err := bs[1].CreateTopic(ctx, TopicSpec{Name: "pinned", Partitions: ptr[int32](1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := bs[0].DeleteTopic(ctx, "pinned", old.Incarnation); err != nil {
		t.Fatal(err)
	}
	again, err := bs[0].CreateTopic(ctx, TopicSpec{Name: "pinned", Partitions: ptr[int32](1)})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bs {
		err := b.DeleteTopic(ctx, "pinned", old.Incarnation)
		if !errors.Is(err, ErrIncarnationMismatch) {
			t.Errorf("node %d: a delete of incarnation %d after incarnation %d was created answered %v, want an incarnation mismatch", i+1, old.Incarnation, again.Incarnation, err)
		}
	}
	for i, b := range bs {
		if err := b.meta.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if m, ok := b.meta.Topic("pinned"); !ok || m.Incarnation != again.Incarnation {
			t.Fatalf("node %d: the topic created again is gone: %+v %v", i+1, m, ok)
		}
	}
	if err := bs[2].DeleteTopic(ctx, "gone", 7); !errors.Is(err, ErrTopicNotFound) {
		t.Errorf("a delete of an incarnation of a name with no topic answered %v, want not found", err)
	}
}
