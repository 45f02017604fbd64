package meta

import (
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

// countLeaderChanges registers an observer that counts leader observations. The filter
// runs on Raft's goroutine and only counts; nothing is ever sent to the channel.
func countLeaderChanges(r *raft.Raft, n *atomic.Uint64) {
	ch := make(chan raft.Observation, 1)
	r.RegisterObserver(raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		if _, ok := o.Data.(raft.LeaderObservation); ok {
			n.Add(1)
		}
		return false
	}))
}
