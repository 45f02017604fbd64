package raftetcd

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"
)

// cachedBytes sums what the nodes' groups hold of their logs in memory.
func cachedBytes(ns []*testNode) (sum int64, each []int64) {
	for _, n := range ns {
		if n.down {
			each = append(each, -1)
			continue
		}
		c := n.host.CachedBytes()
		sum += c
		each = append(each, c)
	}
	return sum, each
}

// waitNoneCached waits until no node of ns holds any of its groups' entries in
// memory.
func waitNoneCached(t *testing.T, ns []*testNode) {
	t.Helper()
	var each []int64
	defer func() {
		if t.Failed() {
			t.Logf("bytes held in memory by each node: %v", each)
		}
	}()
	poll(t, 20*time.Second, "no node to hold the applied entries in memory", func() bool {
		var sum int64
		sum, each = cachedBytes(ns)
		return sum == 0
	})
}

// startStoreCluster starts three nodes whose groups use the build's log store and
// its asynchronous writes, and waits for each group's leader.
func startStoreCluster(t *testing.T, groups int) ([]*testNode, map[string]*testNode) {
	t.Helper()
	ns := startClusterWith(t, groups, func(o *Options) {
		o.Store, o.AsyncStorageWrites = StoreRaftstore, true
	})
	return ns, leaders(t, ns, groups)
}

// proposeBig writes count entries of size bytes to group g through its leader.
func proposeBig(t *testing.T, lead *testNode, g string, count, size int) {
	t.Helper()
	for i := range count {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		data := bytes.Repeat([]byte{byte(i)}, size)
		_, err := lead.host.Propose(ctx, g, data)
		cancel()
		if err != nil {
			t.Fatalf("propose %d to %s on n%d: %v", i, g, lead.id, err)
		}
	}
}

// TestAnIdleGroupHoldsNoEntriesInMemory: once every replica applied a burst, no node
// keeps its entries in memory. Each group's store caches its newest entries (up to 8
// MiB) for the replication and the apply; before the cache was trimmed, every
// replica of every group that ever took a burst kept them for as long as it lived:
// here 4 groups × 2 MiB on each of three nodes.
func TestAnIdleGroupHoldsNoEntriesInMemory(t *testing.T) {
	t.Parallel()
	const groups, count, size = 4, 32, 64 << 10
	ns, ls := startStoreCluster(t, groups)
	for g, lead := range ls {
		proposeBig(t, lead, g, count, size)
	}
	caughtUp(t, ns, ls)
	waitNoneCached(t, ns)
	// The entries are still the log's: a replica reads them back from its files.
	for g, lead := range ls {
		info, _ := lead.host.Info(g)
		ents, err := lead.host.group(g).st.Entries(info.Last-count+1, info.Last+1, 1<<30)
		if err != nil {
			t.Fatalf("%s: reading the burst back: %v", g, err)
		}
		if len(ents) != count {
			t.Fatalf("%s: read back %d entries of the burst's %d", g, len(ents), count)
		}
		for i, e := range ents {
			// A proposal's entry is its 8-byte id, then its data.
			if len(e.Data) != 8+size || e.Data[8] != byte(i) {
				t.Fatalf("%s: entry %d read back as %d bytes, data starting %d", g, e.Index, len(e.Data), e.Data[8])
			}
		}
	}
}

// TestADownFollowerDoesNotPinTheLeadersMemory: with a follower down, the leader still
// lets go of what the other follower and it applied: the returning follower is
// caught up from the log's files.
func TestADownFollowerDoesNotPinTheLeadersMemory(t *testing.T) {
	t.Parallel()
	const groups, count, size = 2, 32, 64 << 10
	ns, ls := startStoreCluster(t, groups)
	// Stop a node that leads none of the groups.
	var down *testNode
	for _, n := range ns {
		leads := false
		for _, l := range ls {
			leads = leads || l == n
		}
		if !leads {
			down = n
			break
		}
	}
	if down == nil {
		t.Fatal("no node is without a group to lead")
	}
	down.stop()
	up := slices.DeleteFunc(slices.Clone(ns), func(n *testNode) bool { return n == down })
	// The leaders count it inactive after an election timeout without an answer
	// (CheckQuorum); from then on a burst is let go of as soon as the other replica
	// holds it.
	for g, lead := range ls {
		proposeBig(t, lead, g, count, size)
	}
	caughtUp(t, up, ls)
	waitNoneCached(t, up)
	down.restart(t)
	caughtUp(t, ns, ls)
	for g := range ls {
		for _, n := range ns {
			if got, want := n.appliedIn(g), count; got < want {
				t.Fatalf("n%d applied %d entries of %s, want at least %d", n.id, got, g, want)
			}
		}
	}
}
