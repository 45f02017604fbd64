package broker

import (
	"context"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestACopyForgetsWhatItSentWhenTheParentsHistoryWentBack: c.sent remembers, for the
// batch after the cursor, how far each child partition already holds it. It is
// cleared when the cursor moves, but not when the parent partition's history went back
// with the cursor still below its new end (a forced takeover onto a replica that
// lacked some messages, while one child partition kept failing). Offsets 6 to 9 then
// hold new messages, and the copy skips them for the child partition that took the
// old ones: lost for that child.
func TestACopyForgetsWhatItSentWhenTheParentsHistoryWentBack(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "p", Partitions: ref(int32(1))}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "c", Partitions: ref(int32(2))}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	var keys [2][]byte
	for i := 0; keys[0] == nil || keys[1] == nil; i++ {
		k := []byte{byte('a' + i)}
		if cp := PartitionForKey(k, 2); keys[cp] == nil {
			keys[cp] = k
		}
	}
	ct, err := b.lookup("c")
	if err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup("p")
	if err != nil {
		t.Fatal(err)
	}
	// Child partition 1 fails (closed while still in the topic).
	if err := ct.parts()[1].Close(); err != nil {
		t.Fatal(err)
	}
	var msgs []Outgoing
	for i := range 10 {
		msgs = append(msgs, Outgoing{Partition: 0, Key: keys[i%2], Value: []byte("old")})
	}
	cp := b.copierOf(t, "c")
	r := cp.rounds.Load()
	if _, err := b.Produce(ctx, "p", msgs); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "child partition 0 to hold its 5 copies", func() bool { return ct.parts()[0].Stats().End == 5 })
	waitUntil(t, "a failed round after", func() bool { return cp.rounds.Load() >= r+2 })
	if cp.cursors[0].Load() != 0 {
		t.Fatalf("cursor %d, want 0 (child partition 1 fails)", cp.cursors[0].Load())
	}
	// The parent's history goes back: a replica holding only the first 6, led here.
	rp := replicaOf(t, pt, 0, t.TempDir())
	for i := range 6 {
		if _, err := rp.Append([]segment.Record{{Key: keys[i%2], Value: []byte("old")}}); err != nil {
			t.Fatal(err)
		}
	}
	pt.setPart(0, rp)
	// Child partition 1 is back.
	p1, err := b.openPart(ct, *ct.cur.Load(), 1)
	if err != nil {
		t.Fatal(err)
	}
	ct.setPart(1, p1)
	// 4 new messages at offsets 6 to 9, all for child partition 0.
	var more []Outgoing
	for range 4 {
		more = append(more, Outgoing{Partition: 0, Key: keys[0], Value: []byte("new")})
	}
	if _, err := b.Produce(ctx, "p", more); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the copy to catch up with the parent (cursor 10)", func() bool {
		pt.sig.broadcast()
		return cp.cursors[0].Load() == 10
	})
	n := 0
	recs, err := ct.parts()[0].Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if string(r.Value) == "new" {
			n++
		}
	}
	if n != 4 {
		t.Fatalf("child partition 0 holds %d of the 4 new messages stored at offsets 6-9 after the history went back, want 4", n)
	}
}
