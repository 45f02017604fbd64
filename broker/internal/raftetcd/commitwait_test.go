package raftetcd

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	storagewal "github.com/narad-mq/narad/broker/internal/storage/wal"
)

// gatedWAL stands for a node's write-ahead file: its commits return at once, or wait
// while the gate is shut (a disk whose syncs stall).
type gatedWAL struct {
	shut    atomic.Bool
	release chan struct{}
}

func (w *gatedWAL) Commit([]storagewal.Span) error {
	if w.shut.Load() {
		<-w.release
	}
	return nil
}
func (w *gatedWAL) Checkpoint() error                         { return nil }
func (w *gatedWAL) SyncOwn(_ string, sync func() error) error { return sync() }

// TestProposeCommittedDoesNotWaitForTheLeadersDisk: a leader applies only what its own
// log holds durably, so on a leader whose disk stalls a proposal its followers
// committed at once waited for the stall (a handover's leases waited seconds, and the
// partition with them). ProposeCommitted answers at the commit: here while the
// leader's own write of the entry is still held, so it has not applied it; it applies
// it once its disk answers.
func TestProposeCommittedDoesNotWaitForTheLeadersDisk(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	wals := map[uint64]*gatedWAL{}
	var mu sync.Mutex
	ns := startClusterWith(t, 1, func(o *Options) {
		w := &gatedWAL{release: release}
		mu.Lock()
		wals[o.ID] = w
		mu.Unlock()
		o.Store, o.WAL, o.AsyncStorageWrites, o.NoQuiesce = StoreRaftstore, w, true, true
	})
	t.Cleanup(open) // before the nodes stop: a held write would keep its group from closing
	g := groupName(0)
	lead := leaders(t, ns, 1)[g]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := lead.host.Propose(ctx, g, []byte("before")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	wals[lead.id].shut.Store(true)
	mu.Unlock()
	idx, err := lead.host.ProposeCommitted(ctx, g, []byte("while the leader's disk stalls"))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := lead.host.Info(g)
	if info.Commit < idx {
		t.Fatalf("answered at index %d with the commit at %d", idx, info.Commit)
	}
	if info.Applied >= idx {
		t.Fatalf("the leader applied index %d with its own write held: the test did not stall its disk", idx)
	}
	open()
	poll(t, 30*time.Second, "the leader applies the entry once its disk answers", func() bool {
		info, _ := lead.host.Info(g)
		return info.Applied >= idx
	})
	// A follower's proposal, or a node that does not lead: ErrNotLeader at once.
	for _, n := range ns {
		if n != lead {
			if _, err := n.host.ProposeCommitted(ctx, g, []byte("x")); err == nil {
				t.Fatalf("n%d, a follower, committed a proposal", n.id)
			}
			break
		}
	}
}
