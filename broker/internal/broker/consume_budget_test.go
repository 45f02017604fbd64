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
	plane, bs := startFakeCluster(t, 2)
	ctx := context.Background()
	const parts = 12
	if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: "slow", Partitions: ptr[int32](parts), VisibilityMs: ptr[int64](60_000)}); err != nil {
		t.Fatal(err)
	}
	entry := bs[0]
	consumable(t, entry, "slow")
	remote := 0
	for p := range parts {
		if holderIndex(t, bs, "slow", p) != 0 {
			remote++
		}
		if _, err := entry.Produce(ctx, "slow", []Outgoing{{Partition: int32(p), Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
	}
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
