package meta

import (
	"context"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// RaftState is the control plane's Raft node as seen from outside, for metrics.
type RaftState struct {
	// State is "Leader", "Follower", "Candidate" or "Shutdown".
	State string
	// Term is the node's current Raft term.
	Term uint64
	// LeaderChanges counts the changes of leader this node observed since it started,
	// losing one included (the leader became unknown).
	LeaderChanges uint64
	// LeaseLapses counts the times this node's metadata lease ran out (lease.go).
	LeaseLapses uint64
	// AppliedIndex is the index of the last entry applied to the state machine.
	AppliedIndex uint64
	// CommitIndex is the index of the last entry known committed; the difference to
	// AppliedIndex is what this node has yet to apply.
	CommitIndex uint64
}

// RaftState returns the Raft node's state.
func (s *Store) RaftState() RaftState {
	return RaftState{
		State:         s.raft.State().String(),
		Term:          s.raft.CurrentTerm(),
		LeaderChanges: s.leaderChanges.Load(),
		LeaseLapses:   s.leaseLapse.Load(),
		AppliedIndex:  s.raft.AppliedIndex(),
		CommitIndex:   s.raft.CommitIndex(),
	}
}

// countLeaderChanges registers an observer that counts leader observations and, at
// each, closes the channel gen holds and puts a new one in its place (see
// untilLeaderMoves). The filter runs on Raft's goroutine and neither blocks nor sends:
// nothing is ever sent to the channel.
func countLeaderChanges(r *raft.Raft, n *atomic.Uint64, gen *atomic.Pointer[chan struct{}]) {
	first := make(chan struct{})
	gen.Store(&first)
	ch := make(chan raft.Observation, 1)
	r.RegisterObserver(raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		if _, ok := o.Data.(raft.LeaderObservation); ok {
			n.Add(1)
			next := make(chan struct{})
			close(*gen.Swap(&next))
		}
		return false
	}))
}

// untilLeaderMoves returns a context that ends with ctx, at the next change of Raft's
// leader or when the store closes, and a function that releases it and reports
// whether the leader changed since. A request that waits on a controller that died (a
// forward hangs until its bound) is so cut short as soon as this node learns of
// another one.
func (s *Store) untilLeaderMoves(ctx context.Context) (context.Context, func() bool) {
	gen := *s.leaderGen.Load()
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-gen:
			cancel()
		case <-s.stop:
			cancel() // Close waits for the loops before it stops Raft
		case <-cctx.Done():
		}
	}()
	return cctx, func() bool {
		cancel()
		select {
		case <-gen:
			return true
		default:
			return false
		}
	}
}
