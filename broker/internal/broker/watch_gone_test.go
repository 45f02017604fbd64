package broker

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestWatchOfAPartitionThatLeftStaysServed: a holder answering a long-poll watch
// (dataWait) looks at its partitions each time it is woken. One of them may have left
// the node meanwhile (moved off, or closed to be reopened in a new group); the watch
// must answer, not dereference the replica that is gone: a panic in the handler reached
// the entry node as "the outcome is unknown" and held the holder down there for a second.
func TestWatchOfAPartitionThatLeftStaysServed(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "w", Partitions: ptr(int32(2))}); err != nil {
		t.Fatal(err)
	}
	tp, err := b.lookupLocal("w")
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(dataReq{Kind: dataWait, Topic: "w", Incarnation: tp.incarnation, Partition: 0, Parts: []int32{0, 1}, DurationMs: 20000})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		out      []byte
		err      error
		panicked any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			r.panicked = recover()
			done <- r
		}()
		r.out, r.err = b.HandleData(ctx, body)
	}()
	waitUntil(t, "the watch to wait for a message", func() bool {
		tp.sig.mu.Lock()
		defer tp.sig.mu.Unlock()
		return tp.sig.ch != nil
	})
	// Partition 0 leaves this node (as a move's reconcile does), and the topic's signal
	// wakes the watch.
	lp := tp.parts()[0]
	tp.setPart(0, nil)
	t.Cleanup(func() { _ = lp.Close() })
	tp.sig.broadcast()

	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not answer after a partition it watched left the node")
	}
	if r.panicked != nil {
		t.Fatalf("the watch panicked after a partition it watched left the node: %v", r.panicked)
	}
	var resp dataResp
	if r.err != nil || json.Unmarshal(r.out, &resp) != nil || resp.Err != nil || !resp.Ready {
		t.Fatalf("watch answered %s, %v; want ready (its consumers look again, and find where the partition went)", r.out, r.err)
	}
}
