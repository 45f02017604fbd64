package broker

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

// The order a consume asks partitions in: the rotation, except that partitions led by
// nodes whose own consumers attend to them go last, and one due to be heard again goes
// first, for one consume.
func TestConsumeOrder(t *testing.T) {
	t.Parallel()
	const n = 6
	now := int64(time.Hour)
	sec := int64(time.Second)
	local := map[int]bool{0: true, 3: true}
	leads := func(i int) bool { return local[i] }
	a := newAttendance(n)
	if got := a.order(nil, n, 2, leads, now); !reflect.DeepEqual(got, []int{2, 3, 4, 5, 0, 1}) {
		t.Fatalf("with nothing heard the order is %v; want the rotation from 2", got)
	}
	a.heard(1, true, now-sec/2)   // attended
	a.heard(2, true, now-sec/4)   // attended
	a.heard(4, true, now-3*sec)   // attended once, too long ago to count
	a.heard(5, true, now-3*sec/2) // attended, and due to be asked again
	a.heard(3, true, now)         // led here now (a leadership that moved): in turn
	if got, want := a.order(nil, n, 2, leads, now), []int{5, 3, 4, 0, 2, 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v; want %v (5 to hear again first, then the rotation, attended 2 and 1 last)", got, want)
	}
	// The next consume does not ask 5 first again: one was sent to hear it.
	if got, want := a.order(nil, n, 2, leads, now+sec/10), []int{3, 4, 0, 2, 5, 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v; want %v (5 asked again already)", got, want)
	}
	// Heard again (attended), it goes last, and is due to be asked again a second on.
	a.heard(5, true, now+sec/5)
	if got, want := a.order(nil, n, 2, leads, now+sec/4), []int{3, 4, 0, 2, 5, 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v; want %v (5 heard again)", got, want)
	}
	// (1 and 2, heard 1.5 and 1.25 s before, are due by then too.)
	if got, want := a.order(nil, n, 2, leads, now+sec/5+sec), []int{2, 5, 1, 3, 4, 0}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v; want %v (5 due to be heard again a second after it was)", got, want)
	}
	a.heard(5, true, now+sec)
	// Its holder says no consumer attends it any more: it is back in turn.
	a.heard(5, false, now+sec+sec/5)
	a.heard(1, false, now+sec+sec/5)
	if got, want := a.order(nil, n, 2, leads, now+sec+sec/4), []int{3, 4, 5, 0, 1, 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v; want %v", got, want)
	}
	// An attendance not heard again lapses after attendTTL.
	if got := a.order(nil, n, 2, leads, now+3*sec); !reflect.DeepEqual(got, []int{2, 3, 4, 5, 0, 1}) {
		t.Fatalf("order %v once every attendance lapsed; want the rotation", got)
	}
	// Past the 64 partitions kept on the stack.
	big := newAttendance(100)
	big.heard(7, true, now)
	got := big.order(nil, 100, 0, func(int) bool { return false }, now)
	if len(got) != 100 || got[99] != 7 || got[7] != 8 {
		t.Fatalf("100 partitions, 7 attended: order %v", got)
	}
}

// A holder counts its topic attended while a consume made to it is in progress and
// for attendWindow after the last one ended.
func TestAttendedByLocalConsumes(t *testing.T) {
	t.Parallel()
	a := newAttendance(1)
	for _, at := range []int64{1, mono(), mono() + int64(attendWindow)} {
		if a.attended(at) {
			t.Fatalf("attended at %d with no consume ever made (a node just started must not claim consumers)", at)
		}
	}
	a.consuming()
	if !a.attended(mono() + 10*int64(attendWindow)) {
		t.Fatal("not attended while a consume (a long poll) is in progress")
	}
	a.consumed()
	if !a.attended(mono()) {
		t.Fatal("not attended just after a consume")
	}
	if a.attended(mono() + int64(attendWindow) + 1) {
		t.Fatal("still attended past attendWindow after the last consume")
	}
}

// attendTopic makes a topic of parts partitions on a fake cluster of three nodes with
// per messages on each partition, and returns, per node, the partitions it leads.
func attendTopic(t *testing.T, bs []*Broker, name string, parts, per int) map[int][]int {
	t.Helper()
	ctx := context.Background()
	if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr(int32(parts)), VisibilityMs: ptr(int64(60_000))}); err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		pollUntil(t, "the topic opens on "+b.NodeID(), func() error {
			_, err := b.lookup(name)
			return err
		})
	}
	led := map[int][]int{}
	pollUntil(t, "every partition has one leader", func() error {
		clear(led)
		for i := range parts {
			k := -1
			for j, b := range bs {
				if tp, err := b.lookup(name); err == nil && tp.leads(i) {
					if k >= 0 {
						return fmt.Errorf("partition %d is led by two nodes", i)
					}
					k = j
				}
			}
			if k < 0 {
				return fmt.Errorf("partition %d has no leader", i)
			}
			led[k] = append(led[k], i)
		}
		return nil
	})
	for k := range bs {
		if len(led[k]) == 0 {
			t.Fatalf("node %d leads none of the %d partitions (%v); the test needs each to lead some", k, parts, led)
		}
	}
	for i := range parts {
		out := make([]Outgoing, per)
		for j := range out {
			out[j] = Outgoing{Partition: int32(i), Value: []byte(fmt.Sprintf("p%d-%d", i, j))}
		}
		if _, err := bs[0].Produce(ctx, name, out); err != nil {
			t.Fatal(err)
		}
	}
	return led
}

// countLeases counts the leases forwarded to each node.
func countLeases(plane *fakePlane) (counts func() map[string]int) {
	var mu sync.Mutex
	seen := map[string]int{}
	plane.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
		if req.Kind == dataLease {
			mu.Lock()
			seen[addr]++
			mu.Unlock()
		}
		return deliver(ctx)
	})
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps(seen)
	}
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// With consumers on every node, each node's consumes are served by the partitions it
// leads while they hold messages: no lease is forwarded but the few that ask whether
// the others are still attended.
func TestConsumesOnEveryNodeStayOnTheirNode(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 3)
	defer plane.setHook(nil)
	const parts, per = 6, 40
	led := attendTopic(t, bs, "spread", parts, per)
	ctx := context.Background()
	// Consumers of the topic on every node: a long poll on each, in progress for the
	// whole test (as consumes that keep coming are).
	for _, b := range bs {
		tp, err := b.lookup("spread")
		if err != nil {
			t.Fatal(err)
		}
		tp.att.consuming()
		t.Cleanup(tp.att.consumed)
	}
	// Each node hears from every other partition's holder: one consume starting at
	// each partition.
	for _, b := range bs {
		for range parts {
			if _, err := b.Consume(ctx, "spread", 1, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Not asked again within the test (TestConsumeOrder covers that): every consume
	// below must be served here.
	for _, b := range bs {
		tp, _ := b.lookup("spread")
		tp.att.refresh, tp.att.ttl = int64(time.Hour), int64(time.Hour)
	}
	// Every other node's holder said its consumers attend its partitions.
	for k, b := range bs {
		tp, _ := b.lookup("spread")
		for i := range parts {
			if !tp.leads(i) && tp.att.seen[i].Load() == 0 {
				t.Fatalf("node %d has not heard that partition %d is attended, with consumers on every node", k, i)
			}
		}
	}
	leases := countLeases(plane)
	const rounds = 30
	for k, b := range bs {
		mine := map[int32]bool{}
		for _, i := range led[k] {
			mine[int32(i)] = true
		}
		for r := range rounds {
			ds, err := b.Consume(ctx, "spread", 1, 0)
			if err != nil || len(ds) != 1 {
				t.Fatalf("node %d, consume %d: %d messages, %v", k, r, len(ds), err)
			}
			if !mine[ds[0].Partition] {
				t.Errorf("node %d (leading %v) served consume %d from partition %d, led elsewhere, with its own holding messages",
					k, led[k], r, ds[0].Partition)
			}
		}
	}
	if n := leases(); len(n) > 0 {
		t.Errorf("leases forwarded while every node's consumes could be served by its own partitions: %v", n)
	}
}

// With consumers on one node only, the partitions the others lead are not starved
// while that node's own partitions keep messages: nobody attends them, so they keep
// their turn (a node that took its own partitions first regardless would deliver none
// of theirs here).
func TestConsumesOnOneNodeServeEveryPartition(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 3)
	defer plane.setHook(nil)
	const parts = 6
	led := attendTopic(t, bs, "lopsided", parts, 30)
	ctx := context.Background()
	leases := countLeases(plane)
	got := map[int32]int{}
	for r := range 3 * parts {
		ds, err := bs[0].Consume(ctx, "lopsided", 1, 0)
		if err != nil || len(ds) != 1 {
			t.Fatalf("consume %d: %d messages, %v", r, len(ds), err)
		}
		got[ds[0].Partition]++
	}
	// Nobody attends the others' partitions: the order is the rotation, and each of the
	// 18 consumes starts one partition further, so each partition serves 3.
	for i := range parts {
		if got[int32(i)] != 3 {
			t.Errorf("partition %d delivered %d of %d consumes on node 0 (leading %v); want 3 each, in turn: %v", i, got[int32(i)], 3*parts, led[0], got)
		}
	}
	if len(leases()) == 0 {
		t.Error("no lease was forwarded; the consumes never reached the other nodes' partitions")
	}
	// The holders said so: no consumer asks them directly.
	tp, _ := bs[0].lookup("lopsided")
	for i := range parts {
		if !tp.leads(i) && tp.att.seen[i].Load() != 0 {
			t.Errorf("partition %d counts attended on node 0, though no consume was made to its holder", i)
		}
	}
}
