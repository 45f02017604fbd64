package broker

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestADeposedLeaderAnswersNoCountersOfItsOldTerm: a partition's leader deposed
// without knowing it yet (in a chaos run a slow disk starved its process past the
// election timeout; resumed, it answered the stats requests queued meanwhile before it
// heard of the new term) must not answer its partition's counters from its old term:
// they lag what its successor has already answered (the checker saw the high
// watermark and the frontier go back). It confirms it still leads first and, failing
// that, the request goes to the group's leader; for one partition and for the whole
// topic. Serial: it sets roleHook.
func TestADeposedLeaderAnswersNoCountersOfItsOldTerm(t *testing.T) {
	bs := startReplCluster(t, 3, false)
	const name = "deposedstats"
	_, lead := replLeasedOne(t, bs, name) // one message, leased
	target := (lead + 1) % 3
	lt, err := bs[lead].lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	gid, deposed, oldTerm := lt.gid(0), bs[lead].opts.NodeID, lt.parts()[0].Term()
	// The old leader's replica is not told that it stopped leading.
	hook := func(node, group string, leads bool) bool {
		return leads || node != deposed || group != gid
	}
	roleHook.Store(&hook)
	t.Cleanup(func() { roleHook.Store(nil) })
	bs[lead].repl.host.TransferLeader(gid, raftID(bs[target].meta.ServerID()))
	ctx := context.Background()
	tt, err := bs[target].lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 30*time.Second, "the new leader leads", func() error {
		if !tt.leads(0) {
			return fmt.Errorf("node %s does not lead yet", bs[target].opts.NodeID)
		}
		return nil
	})
	waitOrFail(t, 30*time.Second, "two produces through the new leader", func() error {
		_, err := bs[target].Produce(ctx, name, []Outgoing{{Value: []byte("a")}, {Value: []byte("b")}})
		return err
	})
	if !lt.parts()[0].Leading() {
		t.Fatal("the old leader's replica was told it no longer leads; the test needs it not to know")
	}
	st, err := bs[lead].statsOf(ctx, lt, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.End < 3 {
		t.Fatalf("the deposed leader answered a high watermark of %d, want 3 (the new leader's): its old term's counters", st.End)
	}
	// Asked by another node, as its leader: one partition, or a stats_batch. (Unless
	// an election on a loaded machine gave it the leadership back meanwhile.)
	if info, _ := bs[lead].repl.host.Info(gid); !info.Leader {
		if resp := bs[lead].serveData(ctx, bs[lead].dataReq(lt, dataStats, 0)); resp.Err == nil || resp.Err.Code != "not_leader" {
			t.Fatalf("the deposed leader, asked for its counters by another node, answered %+v (error %+v), want not_leader", resp.Stats, resp.Err)
		}
		req := bs[lead].dataReq(lt, dataStatsBatch, 0)
		req.Parts = []int32{0}
		if resp := bs[lead].serveData(ctx, req); len(resp.Batch) != 1 || resp.Batch[0].Err == nil || resp.Batch[0].Err.Code != "not_leader" {
			t.Fatalf("the deposed leader answered a stats_batch with %+v, want not_leader for its partition", resp.Batch)
		}
	}
	// The topic: the counters, epoch and name of a leader of a later term than the
	// deposed one's (the new leader, or whoever an election chose since).
	waitOrFail(t, 30*time.Second, "the topic read through the deposed leader shows a later leader's counters", func() error {
		_, infos, err := bs[lead].Topic(name)
		if err != nil {
			return err
		}
		ri := infos[0].Replication
		if infos[0].Stats.End < 3 || ri == nil || ri.Epoch <= oldTerm {
			return fmt.Errorf("high watermark %d in %+v, want 3 in an epoch after %d", infos[0].Stats.End, ri, oldTerm)
		}
		for _, b := range bs {
			if bt, err := b.lookup(name); err == nil && b.opts.NodeID == infos[0].Leader && bt.parts()[0].Term() == ri.Epoch {
				return nil
			}
		}
		return fmt.Errorf("the leader is named %s, which does not lead in epoch %d", infos[0].Leader, ri.Epoch)
	})
}
