package broker

import (
	"context"
	"testing"
)

// TestFanoutSurvivesAClosedPartition: a fan-out copy that meets a closed partition of a
// topic still open (one replaced on this node by a move or a forced takeover, caught
// between the two) retries, as for any failed batch, instead of ending for good: the
// copier stayed registered, so nothing started another one and the child received
// nothing more until the node restarted.
func TestFanoutSurvivesAClosedPartition(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ref(int32(1))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	ct, err := b.lookup("c")
	if err != nil {
		t.Fatal(err)
	}
	produce := func() {
		t.Helper()
		if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
	}
	childEnd := func() uint64 { return ct.parts()[0].Stats().End }
	produce()
	waitUntil(t, "the first copy", func() bool { return childEnd() == 1 })

	// The child's partition is closed while still in the topic (the moment between a
	// copier's look at the partitions and followPlacement's replacing it).
	old := ct.parts()[0]
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	cp := b.copierOf(t, "c")
	rounds := cp.rounds.Load()
	produce()
	// Two rounds since the produce: the second at least read the new message and met
	// the closed partition (or the copier ended on it).
	waitUntil(t, "the copier to meet the closed partition", func() bool { return closed(cp.done) || cp.rounds.Load() >= rounds+2 })
	p, err := b.openPart(ct, *ct.cur.Load(), 0)
	if err != nil {
		t.Fatal(err)
	}
	ct.setPart(0, p)
	produce()
	waitUntil(t, "the copy to go on into the reopened partition", func() bool { return childEnd() == 3 })
}
