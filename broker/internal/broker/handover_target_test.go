package broker

import (
	"testing"

	"github.com/narad-mq/narad/broker/internal/raftetcd"
)

// A planned handover goes to a live voter: the most caught-up follower may be a node
// that just stopped, and a transfer to it fails and lets the handed-over leases lapse
// as in a crash. Only when every candidate is silent is the most caught-up one tried.
func TestHandOverTargetSkipsSilentVoters(t *testing.T) {
	t.Parallel()
	info := raftetcd.GroupInfo{Voters: []uint64{1, 2, 3, 4}, Match: map[uint64]uint64{2: 90, 3: 100, 4: 100}}
	silent := map[uint64]bool{}
	isSilent := func(id uint64) bool { return silent[id] }
	for _, c := range []struct {
		name       string
		candidates []uint64
		silent     []uint64
		want       uint64
	}{
		{"all live: the most caught-up, the first on a tie", []uint64{2, 3, 4}, nil, 3},
		{"the most caught-up is silent", []uint64{2, 3, 4}, []uint64{3}, 4},
		{"both caught-up ones silent", []uint64{2, 3, 4}, []uint64{3, 4}, 2},
		{"every candidate silent", []uint64{2, 3, 4}, []uint64{2, 3, 4}, 3},
		{"not a voter, or no match known", []uint64{5, 1}, nil, 0},
		{"order of the candidates decides a tie", []uint64{4, 3}, nil, 4},
	} {
		clear(silent)
		for _, id := range c.silent {
			silent[id] = true
		}
		if got := handOverTarget(info, c.candidates, isSilent); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// One handover of a partition at a time: a second one (the disk-stall shed beside a
// placement's or the stop's) is refused until the first releases it, and the first's
// giving up (ResumeAfterHandOver) cannot cut into the second's.
func TestClaimHandOverIsExclusive(t *testing.T) {
	t.Parallel()
	b := &Broker{repl: &replication{}}
	release, ok := b.claimHandOver("g1")
	if !ok {
		t.Fatal("the first claim was refused")
	}
	if _, ok := b.claimHandOver("g1"); ok {
		t.Fatal("a second handover of the same partition was let start")
	}
	r2, ok := b.claimHandOver("g2")
	if !ok {
		t.Fatal("another partition's handover was refused")
	}
	release()
	r3, ok := b.claimHandOver("g1")
	if !ok {
		t.Fatal("a claim after the release was refused")
	}
	r2()
	r3()
}

// TestHandOverAvoidsAReplicaOnItsWayOut: a move's source stays a voter of its group
// until the switch's removal of it applies, and may be the most caught-up one. Handed
// the leadership then (a disk stall, a stop), it led a group that no longer counted it,
// and its own handover after the removal could not commit the leases: they lapsed in a
// planned change (a review, 6 December). A voter the placement still names is chosen
// first.
func TestHandOverAvoidsAReplicaOnItsWayOut(t *testing.T) {
	t.Parallel()
	bs := startReplCluster(t, 3, false)
	replLeasedOne(t, bs, "out")
	lead := leaderIndex(bs, "out", 0)
	b := bs[lead]
	tp, err := b.lookup("out")
	if err != nil {
		t.Fatal(err)
	}
	info, ok := b.repl.host.Info(tp.gid(0))
	if !ok || !info.Leader {
		t.Fatal("the leader's group is not led here")
	}
	var followers []uint64
	var names []string
	for _, id := range info.Voters {
		if id != raftID(b.meta.ServerID()) {
			followers = append(followers, id)
			names = append(names, b.nodeOf(id))
		}
	}
	if len(followers) != 2 || names[0] == "" || names[1] == "" {
		t.Fatalf("followers %v (%v), want two known nodes", followers, names)
	}
	// The first follower is the most caught-up, and the placement no longer names it.
	match := map[uint64]uint64{followers[0]: info.Commit + 10, followers[1]: info.Commit}
	info.Match = match
	all := append([]string{b.opts.NodeID}, names...)
	if got := b.handOverChoice(tp.gid(0), all, info, followers); got != followers[0] {
		t.Fatalf("with every voter placed the most caught-up (%d) takes over; got %d", followers[0], got)
	}
	placed := []string{b.opts.NodeID, names[1]}
	if got := b.handOverChoice(tp.gid(0), placed, info, followers); got != followers[1] {
		t.Fatalf("the handover went to %d (%s), a voter the placement no longer names; want %d (%s)", got, b.nodeOf(got), followers[1], names[1])
	}
}
