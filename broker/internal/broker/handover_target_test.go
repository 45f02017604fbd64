package broker

import (
	"testing"

	"github.com/narad-mq/narad/broker/internal/raftetcd"
)

// A planned handover goes to a live voter: the most caught-up follower may be a node
// that just stopped, and a transfer to it fails and lets the handed-over leases lapse
// as in a crash. Only when every candidate is silent is the most caught-up one tried.
func TestHandOverTargetSkipsSilentVoters(t *testing.T) {
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
