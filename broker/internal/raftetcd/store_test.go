package raftetcd

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// TestRaftstoreGroupsFailOver: the engine on the build's log store (raftstore) elects,
// replicates to every node, and after the node leading most groups stops, the
// survivors elect new leaders and commit, as on the spike's wal store; the same with
// leaders sending their appends while they write them, and with each group's writes
// off its Ready loop (built, not enabled in the product).
func TestRaftstoreGroupsFailOver(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"serial", "parallel append", "async storage writes"} {
		t.Run(mode, func(t *testing.T) {
			raftstoreFailOver(t, mode)
		})
	}
}

// raftstoreFailOver is TestRaftstoreGroupsFailOver with the serial Ready loop, with
// the leader's parallel append, or with asynchronous storage writes.
func raftstoreFailOver(t *testing.T, mode string) {
	const groups = 10
	ns := startClusterWith(t, groups, func(o *Options) {
		o.Store, o.ParallelAppend, o.AsyncStorageWrites = StoreRaftstore, mode == "parallel append", mode == "async storage writes"
	})
	ls := leaders(t, ns, groups)
	for g, n := range ls {
		propose(t, n, g)
	}
	poll(t, 10*time.Second, "every node applied one write per group", func() bool {
		for _, n := range ns {
			for g := range groups {
				if n.appliedIn(groupName(g)) != 1 {
					return false
				}
			}
		}
		return true
	})
	count := map[*testNode]int{}
	for _, n := range ls {
		count[n]++
	}
	victim := ns[0]
	for _, n := range ns {
		if count[n] > count[victim] {
			victim = n
		}
	}
	victim.stop()
	var survivors []*testNode
	for _, n := range ns {
		if n != victim {
			survivors = append(survivors, n)
		}
	}
	ls2 := leaders(t, survivors, groups)
	for g, n := range ls2 {
		propose(t, n, g)
	}
	poll(t, 10*time.Second, "every survivor applied both writes of every group", func() bool {
		for _, n := range survivors {
			for g := range groups {
				if n.appliedIn(groupName(g)) != 2 {
					return false
				}
			}
		}
		return true
	})
}

// TestRaftstoreGroupRecoversItsLog: a one-node group on raftstore takes writes, its
// host closes, and a new host on the same directory finds every committed write in the
// log and applies it again (the spike applies from index 1 on every start).
func TestRaftstoreGroupRecoversItsLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const writes = 25
	open := func() (*Host, *transport.Node, *vfs.SyncGroup, *sync.Map) {
		n, err := transport.New(transport.Options{NodeID: "solo", ListenAddr: "127.0.0.1:0", Secret: testSecret, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		fss, err := vfs.NewFSSyncer(dir)
		if err != nil {
			t.Fatal(err)
		}
		sg := vfs.NewSyncGroup(fss)
		applied := &sync.Map{}
		h, err := New(Options{Node: n, ID: 1, Peers: map[uint64]string{1: n.Addr()}, Dir: dir, Sync: sg, Store: StoreRaftstore,
			Tick: testTick, LivenessInterval: 100 * time.Millisecond, LivenessTimeout: time.Second, Logger: quiet(),
			Apply: func(_ string, index uint64, data []byte) { applied.Store(index, string(data)) }})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddGroup("solo"); err != nil {
			t.Fatal(err)
		}
		return h, n, sg, applied
	}
	h, n, sg, applied := open()
	poll(t, 10*time.Second, "the one-node group elected itself", func() bool {
		info, _ := h.Info("solo")
		return info.Leader
	})
	var last uint64
	for i := range writes {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		idx, err := h.Propose(ctx, "solo", []byte{byte('a' + i%26)})
		cancel()
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		last = idx
	}
	h.Close()
	_ = n.Close()
	sg.Close()

	h, n, sg, applied2 := open()
	defer func() { h.Close(); _ = n.Close(); sg.Close() }()
	poll(t, 10*time.Second, "the reopened group applied every committed write again", func() bool {
		_, ok := applied2.Load(last)
		return ok
	})
	count := 0
	applied.Range(func(k, v any) bool {
		count++
		if w, ok := applied2.Load(k); !ok || w != v {
			t.Errorf("index %v: applied %q before the restart, %q after", k, v, w)
		}
		return true
	})
	if count != writes {
		t.Errorf("%d writes applied before the restart, want %d", count, writes)
	}
}
