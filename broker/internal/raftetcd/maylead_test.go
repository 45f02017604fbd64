package raftetcd

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAReplicaThatMayNotLeadStandsForNothing: a replica whose application says it may
// not lead (the broker's replica that failed a write: its state stopped there) is not
// elected, refuses a leadership handed to it (the chaos tier saw such a replica lead
// within half a second of its failure, and answer stale counters as its leader), and
// still votes, so the others elect among themselves when their leader dies. Once it may
// lead again, a handed leadership is taken.
func TestAReplicaThatMayNotLeadStandsForNothing(t *testing.T) {
	t.Parallel()
	const g = "ml"
	ns := startCluster(t, 0)
	var may atomic.Bool
	barred := ns[2] // id 3
	for _, n := range ns {
		cfg := GroupConfig{Voters: []uint64{1, 2, 3}, Dir: filepath.Join(n.opts.Dir, "ml")}
		if n == barred {
			cfg.MayLead = may.Load
		}
		if err := n.host.OpenGroup(g, cfg); err != nil {
			t.Fatal(err)
		}
	}
	leader := func(among []*testNode) *testNode {
		t.Helper()
		var l *testNode
		poll(t, 20*time.Second, "a leader of the group that every live node names", func() bool {
			l = nil
			var lead uint64
			for _, n := range among {
				info, _ := n.host.Info(g)
				if info.Lead == 0 || (lead != 0 && info.Lead != lead) {
					return false
				}
				lead = info.Lead
			}
			for _, n := range among {
				if info, _ := n.host.Info(g); n.id == lead && info.Leader {
					l = n
				}
			}
			return l != nil
		})
		return l
	}
	// barredLeads watches the group for d and reports whether any node named the
	// barred replica its leader meanwhile.
	barredLeads := func(among []*testNode, d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			for _, n := range among {
				if info, _ := n.host.Info(g); info.Lead == barred.id {
					return true
				}
			}
		}
		return false
	}
	l := leader(ns)
	if l == barred {
		t.Fatal("the replica that may not lead was elected")
	}
	write := func(n *testNode) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := n.host.Propose(ctx, g, []byte("m")); err != nil {
			t.Fatalf("a write through n%d: %v", n.id, err)
		}
	}
	write(l)
	// A transfer times out after an election timeout (300 ms here); a second of watching
	// covers three.
	l.host.TransferLeader(g, barred.id)
	if barredLeads(ns, time.Second) {
		t.Fatal("a leadership handed to the replica that may not lead was taken")
	}
	// Its leader dies: the other replica is elected with its vote.
	var other *testNode
	for _, n := range ns {
		if n != l && n != barred {
			other = n
		}
	}
	l.stop()
	live := []*testNode{other, barred}
	if got := leader(live); got != other {
		t.Fatalf("after n%d stopped, n%d leads; want n%d (the replica that may not lead votes, and stands for nothing)", l.id, got.id, other.id)
	}
	write(other)
	may.Store(true)
	other.host.TransferLeader(g, barred.id)
	poll(t, 20*time.Second, "the replica allowed to lead again to take the leadership handed to it", func() bool {
		info, _ := barred.host.Info(g)
		return info.Leader
	})
	write(barred)
}
