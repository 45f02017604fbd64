package e2e

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestClusterMoveSurvivesAKill: a move whose one party (chosen by the seed: the
// controller, the partition's leader, the replica moving off, or the one it moves
// to) is killed with SIGKILL while the move is under way, and started again, still
// ends done, and under load nothing is lost or delivered again after its ack. The
// seed (NARAD_MOVE_SEED to repeat one) picks the party and whether it dies while
// copying or at the switch: make test runs one a run, make chaos-cluster every
// combination.
func TestClusterMoveSurvivesAKill(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("NARAD_MOVE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("NARAD_MOVE_SEED=%q: %v", s, err)
		}
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	parties := []string{"controller", "leader", "source", "target"}
	party := parties[rng.IntN(len(parties))]
	phase := []string{"copying", "switching"}[rng.IntN(2)]
	if e := os.Getenv("NARAD_MOVE_PARTY"); e != "" {
		party = e
	}
	if e := os.Getenv("NARAD_MOVE_PHASE"); e != "" {
		phase = e
	}
	t.Logf("seed %d (NARAD_MOVE_SEED): kill the %s while the move is %s", seed, party, phase)
	moveKill(t, party, phase)
}

// moveKill runs one move on four nodes under load and kills party when the move is
// first seen at phase (or later).
func moveKill(t *testing.T, party, phase string) {
	c := startMovesCluster(t, 4)
	c.load()
	c.progress(50)
	lead := leaderOf(t, c.nodes, c.topic, 1)
	reps := replicasOf(lead, c.topic, 1)
	var source, target *clusterNode
	for _, nd := range c.nodes {
		switch {
		case !slices.Contains(reps, nd.id):
			target = nd
		case nd != lead && source == nil:
			source = nd
		}
	}
	victim := map[string]*clusterNode{"controller": controllerOf(t, c.nodes...), "leader": lead, "source": source, "target": target}[party]
	mv := startMove(t, c.nodes[0], c.topic, 1, source.id, target.id)
	if phase == "switching" {
		waitFor(t, 60*time.Second, "the move to switch", func() bool {
			for _, m := range moves(c.nodes[0]) {
				if m.ID == mv.ID {
					return m.Status != "copying"
				}
			}
			return false
		})
	}
	c.mu.Lock()
	c.stopping[victim.id] = true
	c.mu.Unlock()
	victim.Kill()
	t.Logf("killed %s (the %s)", victim.id, party)
	victim.RestartAfterKill()
	if err := victim.WaitReady(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	delete(c.stopping, victim.id)
	c.mu.Unlock()
	c.moveEnds(mv.ID, 120*time.Second)
	waitFor(t, 60*time.Second, "the moved-off replica's data to be deleted", func() bool { return partitionDir(source, c.topic, 1) == "" })
	want := slices.DeleteFunc(slices.Clone(reps), func(r string) bool { return r == source.id })
	want = append(want, target.id)
	slices.Sort(want)
	if got := replicasOf(c.nodes[0], c.topic, 1); !slices.Equal(got, want) {
		t.Fatalf("replicas after the move: %v, want %v", got, want)
	}
	c.progress(20)
	c.finish()
}
