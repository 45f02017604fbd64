package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
)

// delayChildWaiting makes topic p (2 partitions) with a delay child c, stores m0 in
// partition 0 and returns once the child's copier has read it and sleeps until it is
// due, a minute on.
func delayChildWaiting(t *testing.T, b *Broker) *copier {
	t.Helper()
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ref(int32(2))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AttachChild(ctx, "p", "c", delayWakeMs); err != nil {
		t.Fatal(err)
	}
	c := b.copierOf(t, "c")
	if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	sleepsOnItsTimer(t, c)
	return c
}

// sleepsOnItsTimer returns once c sleeps until a message is due: only m0 sets a timer,
// so the round that read it has ended.
func sleepsOnItsTimer(t *testing.T, c *copier) {
	t.Helper()
	pollUntil(t, "the copier sleeps until m0 is due", func() error {
		if c.sleepsUntil.Load() == 0 {
			return errors.New("no timer set")
		}
		return nil
	})
}

const delayWakeMs = 60_000

// TestDelayCopierWakesForAnEarlierMessageInAnotherPartition: a delay child's copier
// sleeping until partition 0's m0 is due slept through every append of the parent,
// on the reasoning that new messages are due later. m1, given a timestamp a delay and
// a second old (a batch's or another cluster's), in partition 1 where nothing waits,
// is due at once; on the old code it was copied only with m0, a minute on (found by
// an adversarial review, 6 December).
func TestDelayCopierWakesForAnEarlierMessageInAnotherPartition(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	delayChildWaiting(t, b)
	ts := partition.WallMillis() - delayWakeMs - 1000
	if _, err := b.Produce(context.Background(), "p", []Outgoing{{Partition: 1, Value: []byte("m1"), Timestamp: ts}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second) // a third of m0's wait: room on a loaded machine
	for childEnd(t, b, "c") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("m1, due already, was not copied while m0 waited: the copier slept through its append")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := childEnd(t, b, "c"); n != 1 {
		t.Fatalf("the child holds %d messages; want m1 only (m0 is due in a minute)", n)
	}
}

// TestDelayCopierDoesNotReadAWaitingPartitionAgain: the copier wakes on every append
// of the parent, but a partition whose first message is not yet due holds back the
// rest, so appends behind it cost no read of it.
func TestDelayCopierDoesNotReadAWaitingPartitionAgain(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	c := delayChildWaiting(t, b)
	reads, rounds := c.reads.Load(), c.rounds.Load()
	rounds0 := rounds
	for i := 0; i < 50; i++ {
		if _, err := b.Produce(context.Background(), "p", []Outgoing{{Partition: 0, Value: []byte("behind m0")}}); err != nil {
			t.Fatal(err)
		}
		// Each append wakes the copier: the rounds show it looked, the reads what it cost.
		pollUntil(t, "a round after the append", func() error {
			if c.rounds.Load() == rounds {
				return errors.New("no round yet")
			}
			return nil
		})
		rounds = c.rounds.Load()
		sleepsOnItsTimer(t, c)
	}
	// Partition 1 is empty, so each round reads it (an empty read); partition 0 is
	// never read, however many rounds the appends woke.
	if got, max := c.reads.Load()-reads, c.rounds.Load()-rounds0; got > max {
		t.Fatalf("%d rounds after 50 appends behind a waiting message read the parent %d times; want one read a round (partition 1's), none of partition 0", max, got)
	}
	if n := childEnd(t, b, "c"); n != 0 {
		t.Fatalf("the child holds %d messages before m0 is due", n)
	}
}
