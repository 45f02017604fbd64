package broker

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// replicaOf opens, in dir, a replica standing in for partition i of topic tp, over a
// one-replica group in memory (soloGroup), leading term 1.
func replicaOf(t *testing.T, tp *topic, i int, dir string) *partition.Partition {
	t.Helper()
	g := &soloGroup{}
	p, err := partition.Open(partition.Options{Dir: dir, Index: uint32(i), Group: g, OnAvailable: tp.sig.broadcast})
	if err != nil {
		t.Fatal(err)
	}
	g.p = p
	t.Cleanup(func() { _ = p.Close() })
	p.SetRole(true, 1)
	return p
}

// wentBack is partition 0 of pt as a history that went back (a forced takeover onto a
// replica holding only the first 6 of the 10 messages): a new replica, led here,
// holding 6 messages; the caller puts it in place.
func wentBack(t *testing.T, pt *topic) *partition.Partition {
	t.Helper()
	rp := replicaOf(t, pt, 0, t.TempDir())
	for range 6 {
		if _, err := rp.Append([]segment.Record{{Value: []byte("old")}}); err != nil {
			t.Fatal(err)
		}
	}
	return rp
}

// fannedOut starts a broker with topics p and c of one partition each, c a fan-out
// child of p, and n messages produced to p and copied.
func fannedOut(t *testing.T, n int) (*Broker, *topic) {
	t.Helper()
	b := mustStartBroker(t, t.TempDir())
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ref(int32(1))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: []byte("old")}}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the copy", func() bool { return childEnd(t, b, "c") == uint64(i+1) })
	}
	pt, err := b.lookup("p")
	if err != nil {
		t.Fatal(err)
	}
	return b, pt
}

// TestFanoutResumesFromTheGroupsCursorWhenItLeads: this node copied 10 messages, and its
// own cursor says 10. The partition is then a history that went back (a forced
// takeover onto a replica holding only the first 6, whose group committed the cursor
// at 6), led here, and 4 new messages are stored at offsets 6 to 9. Before, the copier
// kept its own cursor and never copied them (the child listed as healthy); it takes
// the group's cursor when it starts leading now. Found by an adversarial review (5
// December); fails on the old code.
func TestFanoutResumesFromTheGroupsCursorWhenItLeads(t *testing.T) {
	t.Parallel()
	b, pt := fannedOut(t, 10)
	cp := b.copierOf(t, "c")
	rp := wentBack(t, pt)
	if err := rp.CommitFanoutCursor(context.Background(), cp.attachID, 6); err != nil {
		t.Fatal(err)
	}
	pt.setPart(0, rp) // led here
	for range 4 {
		if _, err := b.Produce(context.Background(), "p", []Outgoing{{Partition: 0, Value: []byte("new")}}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the 4 new messages copied (14 in the child)", func() bool { return childEnd(t, b, "c") == 14 })
}

// TestFanoutCopiesFromTheEndOfAParentLogThatWentBack: with no cursor committed in the
// new history, a parent partition that ends before the copier's cursor went back (a
// forced takeover, a restore): the copier copies from its end, so the messages stored
// there next are copied. Before, it waited at its cursor and skipped them.
func TestFanoutCopiesFromTheEndOfAParentLogThatWentBack(t *testing.T) {
	t.Parallel()
	b, pt := fannedOut(t, 10)
	cp := b.copierOf(t, "c")
	rp := wentBack(t, pt)
	pt.setPart(0, rp)
	pt.sig.broadcast()
	waitUntil(t, "the cursor back at the log's end (6)", func() bool {
		pt.sig.broadcast()
		return cp.cursors[0].Load() == 6
	})
	for range 4 {
		if _, err := b.Produce(context.Background(), "p", []Outgoing{{Partition: 0, Value: []byte("new")}}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the 4 new messages copied (14 in the child)", func() bool { return childEnd(t, b, "c") == 14 })
}

// TestFanoutCursorReachesAGroupMadeOverALoneCopy: a partition of one replica keeps its
// fan-out cursor in its node's file only. A group made over its data (its replication
// factor raised, or a move) learned the cursor only with the next copied batch; in a
// quiet topic none came, and the next leader, on another node, copied the whole
// partition again. The node that starts leading such a group commits its cursor
// there. Found by an adversarial review (5 December); fails on the old code.
func TestFanoutCursorReachesAGroupMadeOverALoneCopy(t *testing.T) {
	t.Parallel()
	b, pt := fannedOut(t, 5)
	cp := b.copierOf(t, "c")
	lone := pt.parts()[0]
	dir := filepath.Join(pt.dir, "0")
	if err := lone.Close(); err != nil {
		t.Fatal(err)
	}
	rp := replicaOf(t, pt, 0, dir) // the group made over this node's data, led here
	if end := rp.Stats().End; end != 5 {
		t.Fatalf("the group's log ends at %d, want 5", end)
	}
	pt.setPart(0, rp)
	pt.sig.broadcast()
	waitUntil(t, "the cursor committed in the group", func() bool {
		pt.sig.broadcast()
		return rp.FanoutCursor(cp.attachID) == 5
	})
}
