package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// kindsSeen records the data request kinds sent to each node.
type kindsSeen struct {
	mu    sync.Mutex
	kinds map[string]map[string]int // addr → kind → count
}

func watchKinds(p *fakePlane) *kindsSeen {
	k := &kindsSeen{kinds: map[string]map[string]int{}}
	p.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
		k.mu.Lock()
		if k.kinds[addr] == nil {
			k.kinds[addr] = map[string]int{}
		}
		k.kinds[addr][req.Kind]++
		k.mu.Unlock()
		return deliver(ctx)
	})
	return k
}

func (k *kindsSeen) count(kind string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, ks := range k.kinds {
		n += ks[kind]
	}
	return n
}

// topicSpreadOver creates a topic of six single-replica partitions (two on each of the
// three nodes) through bs[0], and produces i+1 messages to partition i.
func topicSpreadOver(t *testing.T, bs []*Broker, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](6), ReplicationFactor: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		for range i + 1 {
			pollUntil(t, "a produce to partition "+fmt.Sprint(i), func() error {
				_, err := bs[0].Produce(ctx, name, []Outgoing{{Partition: int32(i), Value: []byte("m")}})
				return err
			})
		}
	}
}

// checkTopicStats reads the topic through b and checks every partition's counters.
func checkTopicStats(t *testing.T, b *Broker, name string) {
	t.Helper()
	_, infos, err := b.Topic(name)
	if err != nil {
		t.Fatalf("GET of the topic through %s: %v", b.opts.NodeID, err)
	}
	for i, in := range infos {
		if !in.Available || in.Stats.End != uint64(i+1) || in.Stats.Backlog != uint64(i+1) {
			t.Fatalf("partition %d through %s: available %v, end %d, backlog %d; want %d", i, b.opts.NodeID, in.Available, in.Stats.End, in.Stats.Backlog, i+1)
		}
	}
}

// TestStatsBatchWaitsForTheClusterVersion: while one node speaks only version 1 (the
// release before cluster versions), a node reading a topic's counters asks each
// partition on its own, as version 1 does, and the read answers; a stats_batch sent to
// that node would fail the read, as its binary does not know the operation.
func TestStatsBatchWaitsForTheClusterVersion(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeClusterAt(t, []int{0, 0, 1})
	topicSpreadOver(t, bs, "mixed")
	seen := watchKinds(plane)
	for _, b := range bs {
		checkTopicStats(t, b, "mixed")
		if v := b.meta.ClusterVersion(); v != 1 || b.meta.Allows(meta.FeatureStatsBatch) {
			t.Fatalf("%s holds cluster version %d with a member speaking only 1", b.opts.NodeID, v)
		}
	}
	if n := seen.count(dataStatsBatch); n != 0 {
		t.Fatalf("%d stats_batch requests sent before the cluster version allowed them", n)
	}
	if seen.count(dataStats) == 0 {
		t.Fatal("no stats request was forwarded: the test proves nothing")
	}
}

// TestStatsBatchOnceTheClusterVersionAllows: once every node speaks version 2 (or later)
// and the controller committed it, a topic's counters come in one stats_batch per other node,
// with the same values.
func TestStatsBatchOnceTheClusterVersionAllows(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeClusterAt(t, []int{0, 0, 0})
	pollUntil(t, "cluster version 2 or later on every node", func() error {
		for _, b := range bs {
			if v := b.meta.ClusterVersion(); v < 2 {
				return fmt.Errorf("%s holds version %d", b.opts.NodeID, v)
			}
		}
		return nil
	})
	topicSpreadOver(t, bs, "batched")
	seen := watchKinds(plane)
	for _, b := range bs {
		checkTopicStats(t, b, "batched")
	}
	// Each node asks the other two once each.
	if n, per := seen.count(dataStatsBatch), seen.count(dataStats); n != 6 || per != 0 {
		t.Fatalf("%d stats_batch and %d stats requests for three reads of a topic on three nodes; want 6 and 0", n, per)
	}
}

// TestAGatedReplicationFactorIsUnavailable: while the cluster runs a version before 3
// (a rolling upgrade under way), a raise of a replication factor answers 503 until the
// upgrade ends, as every feature without an older form does
// (docs/operating/upgrades.md), whether the topic's partitions have one replica or
// more. On the old code a partition of one replica answered 409 conflict, a refusal a
// client does not retry, while one of two answered 503.
func TestAGatedReplicationFactorIsUnavailable(t *testing.T) {
	t.Parallel()
	bs := startReplClusterAt(t, []int{0, 0, 2})
	ctx := context.Background()
	for name, rf := range map[string]int32{"one": 1, "two": 2} {
		if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1), ReplicationFactor: ptr(rf)}); err != nil {
			t.Fatal(err)
		}
		_, err := bs[0].AlterTopic(ctx, name, TopicAlter{ReplicationFactor: ptr[int32](3)})
		var ce *ConflictError
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, meta.ErrVersionGated) || errors.As(err, &ce) {
			t.Errorf("raising topic %s's replication factor from %d at cluster version 2 answered %v; want unavailable (503) until version 3", name, rf, err)
		}
		if m, err := bs[0].TopicMeta(name); err != nil || m.ReplicationFactor != rf {
			t.Errorf("topic %s after the refused raise: %+v, %v; want replication factor %d", name, m, err, rf)
		}
	}
}
