package raftetcd

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// TestFirstTerm: a group created alone with FirstTerm (a forced takeover's group,
// made over data a replaced group held) leads in a term above it, keeps that term
// across a reopen, and a member added later joins in the same term and gets the
// log. LastTerm reads the highest term of a closed group's log.
func TestFirstTerm(t *testing.T) {
	t.Parallel()
	const g, first = "f", 700
	hosts := make([]*Host, 2)
	apps := map[uint64]*snapApp{1: {}, 2: {}}
	dirs := make([]string, 2)
	peers := map[uint64]string{}
	nodes := make([]*transport.Node, 2)
	for i := range nodes {
		n, err := transport.New(transport.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: "127.0.0.1:0", Secret: testSecret, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		nodes[i] = n
		peers[uint64(i+1)] = n.Addr()
	}
	for i := range hosts {
		dirs[i] = t.TempDir()
		fss, err := vfs.NewFSSyncer(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		sg := vfs.NewSyncGroup(fss)
		t.Cleanup(sg.Close)
		h, err := New(Options{Node: nodes[i], ID: uint64(i + 1), Peers: peers, Dir: dirs[i], Sync: sg, Store: StoreRaftstore,
			Tick: testTick, LivenessInterval: 100 * time.Millisecond, LivenessTimeout: time.Second, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		hosts[i] = h
	}
	for _, a := range apps {
		a.apps = apps
	}
	raftDir := filepath.Join(dirs[0], "part", "raft-f9")
	if lt, err := hosts[0].LastTerm(raftDir); err != nil || lt != 0 {
		t.Fatalf("LastTerm of a directory that does not exist: %d, %v; want 0", lt, err)
	}
	cfg := GroupConfig{Voters: []uint64{1}, Dir: raftDir, Campaign: true, FirstTerm: func() (uint64, error) { return first, nil }, Apply: apps[1].apply}
	if err := hosts[0].OpenGroup(g, cfg); err != nil {
		t.Fatal(err)
	}
	var term uint64
	poll(t, 20*time.Second, "n1 to lead the new group", func() bool {
		info, _ := hosts[0].Info(g)
		term = info.Term
		return info.Leader
	})
	if term <= first {
		t.Fatalf("the group leads in term %d, want above its first term %d", term, first)
	}
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			var err error
			poll(t, 20*time.Second, fmt.Sprintf("write %d", i), func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err = hosts[0].Propose(ctx, g, []byte(fmt.Sprintf("v%02d", i)))
				return err == nil
			})
		}
	}
	write(0, 5)
	poll(t, 10*time.Second, "the leader accepts n2 as a voter", func() bool { return hosts[0].ChangeVoters(g, nil, []uint64{2}) == nil })
	if err := hosts[1].OpenGroup(g, GroupConfig{Join: true, Dir: filepath.Join(dirs[1], "part", "raft-f9"), Apply: apps[2].apply}); err != nil {
		t.Fatal(err)
	}
	write(5, 8)
	want := []string{"v00", "v01", "v02", "v03", "v04", "v05", "v06", "v07"}
	poll(t, 20*time.Second, "n2 to hold every value", func() bool { return slices.Equal(apps[2].values(), want) })
	if i2, _ := hosts[1].Info(g); i2.Term < term {
		t.Fatalf("the joined member is in term %d, below the leader's %d", i2.Term, term)
	}
	hosts[0].CloseGroup(g)
	lt, err := hosts[0].LastTerm(raftDir)
	if err != nil || lt < term {
		t.Fatalf("LastTerm of the closed group: %d, %v; want at least %d", lt, err, term)
	}
	// Reopened (not created again), it keeps its terms.
	apps[1].mu.Lock()
	apps[1].vals, apps[1].last = nil, 0
	apps[1].mu.Unlock()
	if err := hosts[0].OpenGroup(g, cfg); err != nil {
		t.Fatal(err)
	}
	poll(t, 20*time.Second, "the reopened member to replay every value", func() bool { return slices.Equal(apps[1].values(), want) })
	if info, _ := hosts[0].Info(g); info.Term < term {
		t.Fatalf("the reopened member is in term %d, below %d", info.Term, term)
	}
}
