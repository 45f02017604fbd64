package raftetcd

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestMergeEntries: the worker writes several queued appends as one; the result must
// be the log that writing them in turn would leave, including a later append that
// replaces part of an earlier one (a new leader's entries over a divergent tail).
func TestMergeEntries(t *testing.T) {
	t.Parallel()
	e := func(i, term uint64) raftpb.Entry { return raftpb.Entry{Index: i, Term: term} }
	for _, c := range []struct {
		name       string
		ents, next []raftpb.Entry
		want       []raftpb.Entry
	}{
		{"nothing queued", nil, []raftpb.Entry{e(5, 1)}, []raftpb.Entry{e(5, 1)}},
		{"nothing to add", []raftpb.Entry{e(5, 1)}, nil, []raftpb.Entry{e(5, 1)}},
		{"follows", []raftpb.Entry{e(5, 1), e(6, 1)}, []raftpb.Entry{e(7, 1)}, []raftpb.Entry{e(5, 1), e(6, 1), e(7, 1)}},
		{"replaces the tail", []raftpb.Entry{e(5, 1), e(6, 1), e(7, 1)}, []raftpb.Entry{e(6, 2)}, []raftpb.Entry{e(5, 1), e(6, 2)}},
		{"replaces the last", []raftpb.Entry{e(5, 1), e(6, 1)}, []raftpb.Entry{e(6, 2), e(7, 2)}, []raftpb.Entry{e(5, 1), e(6, 2), e(7, 2)}},
		{"replaces all", []raftpb.Entry{e(5, 1), e(6, 1)}, []raftpb.Entry{e(5, 2)}, []raftpb.Entry{e(5, 2)}},
		{"starts before", []raftpb.Entry{e(5, 1), e(6, 1)}, []raftpb.Entry{e(3, 2), e(4, 2)}, []raftpb.Entry{e(3, 2), e(4, 2)}},
	} {
		got := mergeEntries(append([]raftpb.Entry(nil), c.ents...), c.next)
		if len(got) != len(c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i].Index != c.want[i].Index || got[i].Term != c.want[i].Term {
				t.Errorf("%s: got %v, want %v", c.name, got, c.want)
				break
			}
		}
	}
}

// gatedSyncer is a node's sync round that can be held: while closed, every sync
// waits (its files written, not yet durable) until it opens.
type gatedSyncer struct {
	mu      sync.Mutex
	cond    *sync.Cond
	closed  bool
	waiting int // syncs held now
}

func newGatedSyncer() *gatedSyncer {
	g := &gatedSyncer{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gatedSyncer) SyncFiles(files []vfs.File) error {
	g.mu.Lock()
	for g.closed {
		g.waiting++
		g.cond.Wait()
		g.waiting--
	}
	g.mu.Unlock()
	return vfs.EachFile{}.SyncFiles(files)
}

func (g *gatedSyncer) set(closed bool) {
	g.mu.Lock()
	g.closed = closed
	g.mu.Unlock()
	g.cond.Broadcast()
}

func (g *gatedSyncer) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// TestAnswersWaitForTheWrite holds the asynchronous Ready loop to raft's rule: a
// follower answers an append only once its write is durable. Both followers' syncs
// are held; the leader's entry is written on all three, durable on the leader alone,
// and must not commit until a follower's sync is let go. A worker that answered
// before its sync would let a proposal commit on two unsynced copies, which a power
// cut of those two loses.
func TestAnswersWaitForTheWrite(t *testing.T) {
	t.Parallel()
	gates := map[uint64]*gatedSyncer{}
	var gmu sync.Mutex
	ns := startClusterWith(t, 1, func(o *Options) {
		g := newGatedSyncer()
		gmu.Lock()
		gates[o.ID] = g
		gmu.Unlock()
		o.Store, o.AsyncStorageWrites = StoreRaftstore, true
		o.Sync = vfs.NewSyncGroup(g)
	})
	t.Cleanup(func() { // before the nodes stop (a held sync would hold their stop)
		for _, g := range gates {
			g.set(false)
		}
	})
	g := groupName(0)
	lead := leaders(t, ns, 1)[g]
	propose(t, lead, g)
	var followers []*gatedSyncer
	for _, n := range ns {
		if n != lead {
			followers = append(followers, gates[n.id])
		}
	}
	for _, f := range followers {
		f.set(true)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := lead.host.Propose(ctx, g, []byte("held"))
		done <- err
	}()
	poll(t, 10*time.Second, "both followers holding the entry's sync", func() bool {
		return followers[0].held() > 0 && followers[1].held() > 0
	})
	// The followers' answers, had they left before the sync, would be back within a
	// few milliseconds on loopback.
	select {
	case err := <-done:
		t.Fatalf("the proposal was answered (err %v) while no follower had made it durable", err)
	case <-time.After(300 * time.Millisecond):
	}
	followers[0].set(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the proposal after one follower's sync: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the proposal was not answered after a follower made it durable")
	}
	followers[1].set(false)
}
