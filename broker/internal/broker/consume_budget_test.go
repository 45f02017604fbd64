package broker

import (
	"context"
	"testing"
	"time"
)

// TestConsumeOfSlowHoldersAnswersWithinItsBudget: a consume asks a topic's partitions
// one after another, and each lease forwarded to a slow holder may wait up to
// remoteCallTimeout. With every remote holder slow, the consume stops starting new
// asks once leaseBudget is spent and answers with what it has, instead of adding the
// waits of every partition up (the chaos tier saw a consume-batch take 13 s, past the
// bound a client may expect).
func TestConsumeOfSlowHoldersAnswersWithinItsBudget(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 2)
	ctx := context.Background()
	const parts = 12
	entry := bs[0]
	remote, _ := oneMessageEach(t, bs, "slow", parts, 60_000)
	const delay = 2 * time.Second
	if remote < 4 {
		t.Fatalf("%d of %d partitions are held by the other node; the test needs at least 4 to tell a budget from none", remote, parts)
	}
	plane.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
		if req.Kind == dataLease {
			time.Sleep(delay) // a holder that answers slowly, every time
		}
		return deliver(ctx)
	})
	defer plane.setHook(nil)
	// Asked one at a time, the remote partitions alone would take remote × delay.
	start := time.Now()
	ds, err := entry.Consume(ctx, "slow", parts, 0)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the consume answered %v after %s", err, took)
	}
	if len(ds) == 0 {
		t.Fatalf("the consume answered no message after %s; the partitions it asked hold one each", took)
	}
	if bound := leaseBudget + delay + 2*time.Second; took > bound {
		t.Fatalf("the consume took %s with %d slow holders of %s each; want at most %s (its budget, one slow ask, and room)", took, remote, delay, bound)
	}
	t.Logf("%d messages in %s; %d of %d partitions held by a slow node", len(ds), took, remote, parts)
}

// TestConsumeHandsOutNoLapsedLease: the leases a consume holds age while it asks the
// other partitions. With a 3 s visibility timeout and holders that take 2.5 s to
// lease, a look that went on asking for its fixed 3 s (and let each forwarded ask run
// its course) answered after its first leases had lapsed: their acks met 410 and the
// messages were already due again (the cluster chaos tier saw a lease answered 2.3 s
// after its grant with a 2 s timeout). Every message handed out must still be leased
// to the caller: each is acked with 204.
func TestConsumeHandsOutNoLapsedLease(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 2)
	ctx := context.Background()
	const parts = 12
	entry := bs[0]
	remote, far := oneMessageEach(t, bs, "short", parts, 3000)
	if remote < 4 || remote == parts {
		t.Fatalf("%d of %d partitions are held by the other node; the test needs at least 4 there and one here", remote, parts)
	}
	plane.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
		if req.Kind == dataLease {
			select { // a holder that answers slowly, every time
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return deliver(ctx)
	})
	defer plane.setHook(nil)
	for round := range 2 { // the second look starts at another partition
		ds, took := consumeAndAckAll(t, entry, "short", parts, round)
		var ps []int32
		for _, d := range ds {
			ps = append(ps, d.Partition)
		}
		t.Logf("round %d: %d messages (partitions %v) in %s", round, len(ds), ps, took)
		// An ask cut at the budget finds a slow holder, not a dead one: the node
		// still takes the requests forwarded to it.
		if _, err := entry.Produce(ctx, "short", []Outgoing{{Partition: far, Value: []byte("after")}}); err != nil {
			t.Fatalf("round %d: a produce to partition %d on the slow node: %v", round, far, err)
		}
	}
}

// oneMessageEach creates topic name with parts partitions and the visibility timeout
// vis (ms) through bs[0], and produces one message to every partition. It returns how
// many partitions the other nodes hold, and one of those.
func oneMessageEach(t *testing.T, bs []*Broker, name string, parts int, vis int64) (remote int, far int32) {
	t.Helper()
	ctx := context.Background()
	if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr(int32(parts)), VisibilityMs: ptr(vis)}); err != nil {
		t.Fatal(err)
	}
	consumable(t, bs[0], name)
	far = -1
	for p := range parts {
		if holderIndex(t, bs, name, p) != 0 {
			remote, far = remote+1, int32(p)
		}
		if _, err := bs[0].Produce(ctx, name, []Outgoing{{Partition: int32(p), Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
	}
	return remote, far
}

// TestConsumeHandsOutNoLeaseLapsedWhileALocalPartitionWaited: a consume's leases age
// while it asks the other partitions, and an ask of a partition held on the node the
// consume came to waited without a bound (a forwarded one waits no longer than the
// budget of the leases held): a local lease whose confirmation waited on a slow disk
// held the whole answer past the visibility timeout of a lease taken before it, so the
// consumer got a handle dead on arrival, its message already leased to another one (a
// chaos run in namespaces, seed 253381824, every write-ahead sync of the leader taking
// 1.5 s). Here every lease of a partition held on the entry node takes 3.5 s, past the
// 3 s visibility timeout: every message handed out must still be leased to the caller.
func TestConsumeHandsOutNoLeaseLapsedWhileALocalPartitionWaited(t *testing.T) {
	_, bs := startFakeCluster(t, 2)
	const parts = 12
	entry := bs[0]
	remote, _ := oneMessageEach(t, bs, "local", parts, 3000)
	if remote < 2 || remote > parts-2 {
		t.Fatalf("%d of %d partitions are held by the other node; the test needs at least 2 on each", remote, parts)
	}
	slow := func(topic string, p int) {
		if topic == "local" {
			time.Sleep(3500 * time.Millisecond)
		}
	}
	localLeaseHook.Store(&slow)
	defer localLeaseHook.Store(nil)
	for round := range 2 { // the second look starts at another partition
		ds, took := consumeAndAckAll(t, entry, "local", parts, round)
		t.Logf("round %d: %d messages in %s", round, len(ds), took)
	}
}

// consumeAndAckAll consumes up to max messages of topic through entry (round names the
// try in failures) and acks each: every message handed out must still be leased to the
// caller, so each ack must answer 204. It returns what came and how long the consume
// took.
func consumeAndAckAll(t *testing.T, entry *Broker, topic string, max, round int) ([]Delivered, time.Duration) {
	t.Helper()
	start := time.Now()
	ds, err := entry.Consume(context.Background(), topic, max, 0)
	took := time.Since(start)
	if err != nil || len(ds) == 0 {
		t.Fatalf("round %d: the consume answered %d messages, %v, after %s", round, len(ds), err, took)
	}
	reqs := make([]AckReq, len(ds))
	for i, d := range ds {
		reqs[i] = AckReq{Handle: d.Handle}
	}
	for i, err := range entry.Ack(topic, reqs) {
		if err != nil {
			t.Errorf("round %d: the ack of partition %d's message, handed out %s after the consume began: %v", round, ds[i].Partition, took, err)
		}
	}
	return ds, took
}
