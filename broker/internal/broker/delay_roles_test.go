package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// soloGroup is a one-replica partition group in memory: a proposal is applied at once
// while the replica leads, refused (not the leader) otherwise. The test moves the
// leadership with SetRole, as raftetcd's OnRole does.
type soloGroup struct {
	mu sync.Mutex
	p  *partition.Partition
	n  uint64
}

func (g *soloGroup) Propose(_ context.Context, cmd []byte, submitted func()) (any, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.p.Leading() {
		return nil, partition.ErrNotLeader
	}
	if submitted != nil {
		submitted()
	}
	g.n++
	return g.p.Apply(g.n, cmd), nil
}

func (g *soloGroup) Confirm(context.Context) error { return nil }

// TestDelayCopierWakesForALeadershipGainedWhileItWaits: a delay child's copier waiting
// for a parent message not yet due once slept through everything but a change of what
// the node leads. A parent partition this node starts leading meanwhile may hold
// messages due already; the copier slept through that too, until its timer, up to the
// whole delay (with a delay past an hour, enough for them to age out at the minimum
// retention). The topic's signal is broadcast on that change, and the copier wakes on
// it. Found by an adversarial review (5 December); on the code before that m1 is copied
// only with m0, at m0's due time.
func TestDelayCopierWakesForALeadershipGainedWhileItWaits(t *testing.T) {
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ref(int32(2))}); err != nil {
			t.Fatal(err)
		}
	}
	pt, err := b.lookup("p")
	if err != nil {
		t.Fatal(err)
	}
	// Partition 1 of the parent is a replica this node leads only for m1's append.
	rp := replicaOf(t, pt, 1, t.TempDir())
	pt.setPart(1, rp)
	const delay = 4000 // ms
	var m1At int64
	attachHook = func() { // after the attach read the start offsets: the copy owes m1
		if _, err := rp.Append([]segment.Record{{Value: []byte("m1")}}); err != nil {
			t.Error(err)
		}
		m1At = partition.WallMillis()
		rp.SetRole(false, 1)
	}
	defer func() { attachHook = nil }()
	// The attach commits; only its answer's listing of the lag may fail (partition 1
	// is led elsewhere, and this test has no node plane).
	_, _ = b.AttachChild(ctx, "p", "c", delay)
	attachHook = nil
	_ = b.copierOf(t, "c")
	// Half a delay later m0 goes into partition 0, led here: the copier sleeps until
	// m0 is due, 2 s after m1.
	time.Sleep(delay / 2 * time.Millisecond)
	if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	m0Due := partition.WallMillis() + delay
	for partition.WallMillis() < m1At+delay+100 {
		time.Sleep(10 * time.Millisecond)
	}
	// m1 is due: this node wins partition 1's leadership (what OnRole does).
	rp.SetRole(true, 2)
	pt.sig.broadcast()
	deadline := time.Now().Add(30 * time.Second)
	for childEnd(t, b, "c") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("m1 never copied")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if now := partition.WallMillis(); now >= m0Due {
		t.Fatalf("m1, due %d ms before this node led its partition, was copied only at m0's due time (%d ms after the leadership was won)",
			100, now-(m1At+delay+100))
	}
}
