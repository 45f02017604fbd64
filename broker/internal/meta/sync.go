package meta

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Sync returns once this node has applied every metadata write the controller had
// committed when Sync was called: a read of this node's replica after it sees what a
// client wrote through any node (a topic created on another node a moment ago). It
// costs a round trip to the controller: the controller confirms it still leads (a
// heartbeat round) and answers the index of its last entry that may carry a write
// (writesThrough). It appends a barrier (a nudge) only when this node has not learned
// yet that that entry is committed, which happens only a moment after a write.
//
// Calls that arrive while one is in flight share the next one, so a burst of callers
// costs one round trip after the one already running.
func (s *Store) Sync(ctx context.Context) error {
	arrived := time.Now()
	for {
		s.syncMu.Lock()
		c := s.syncing
		switch {
		case c == nil:
			c = &syncCall{started: time.Now(), done: make(chan struct{})}
			s.syncing = c
			s.syncMu.Unlock()
			// A controller that dies under the call leaves its forward hanging until
			// ctx ends: a change of Raft's leader cuts the forward short, and the call
			// (with the callers sharing it) waits for the next controller and asks it.
			cut, release := s.untilLeaderMoves(ctx)
			c.err = s.syncOnce(ctx, cut)
			c.moved = release()
			c.cut = c.err != nil && (ctx.Err() != nil || c.moved)
			if c.err == nil {
				s.markFresh(c.started)
			}
			s.syncMu.Lock()
			s.syncing = nil
			s.syncMu.Unlock()
			close(c.done)
			if c.err != nil && c.moved && ctx.Err() == nil && s.awaitController(ctx) == nil {
				continue
			}
			return c.err
		case !c.started.Before(arrived):
			// It started after this call arrived: its answer covers this call.
			s.syncMu.Unlock()
			select {
			case <-c.done:
				if c.cut && ctx.Err() == nil {
					// It failed because its caller's context ended (a catch-up with a
					// short bound) or the controller changed under it, not for want of
					// a controller: this call has time left, so it runs or joins another
					// (once there is a controller again, after a change).
					if !c.moved || s.awaitController(ctx) == nil {
						continue
					}
				}
				return c.err
			case <-ctx.Done():
				return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
			}
		default:
			// It started before: wait for it to end, then run (or join) a newer one.
			s.syncMu.Unlock()
			select {
			case <-c.done:
				// Cut by a change of leader: Raft reports the lost leader first, so
				// wait for the next one before running a newer call.
				if c.moved && ctx.Err() == nil {
					if err := s.awaitController(ctx); err != nil {
						return c.err
					}
				}
			case <-ctx.Done():
				return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
			}
		}
	}
}

// syncCall is one Sync in flight that later callers may share.
type syncCall struct {
	started time.Time
	done    chan struct{}
	err     error
	cut     bool // err came from its caller's context ending, or a change of leader
	moved   bool // Raft's leader changed while it ran
}

type syncState struct {
	syncMu  sync.Mutex
	syncing *syncCall
	// leaderGen is closed and replaced at every change of Raft's leader
	// (countLeaderChanges).
	leaderGen atomic.Pointer[chan struct{}]
}

// syncOnce asks the controller for its last index and waits until this node has
// applied that far. The request to a controller on another node goes under cut (see
// Sync); the wait to apply, under ctx.
func (s *Store) syncOnce(ctx, cut context.Context) error {
	if s.Leader() {
		idx, err := s.leaderIndex()
		if err != nil {
			return err
		}
		return s.waitApplied(ctx, idx)
	}
	addr, _ := s.raft.LeaderWithID()
	if addr == "" {
		return fmt.Errorf("%w: no controller known", ErrUnavailable)
	}
	resp, err := s.forward(cut, addr, fwdRequest{Kind: kindSyncIndex, Commit: s.raft.CommitIndex()})
	if err != nil {
		return err
	}
	// An index this node has not learned is committed may be the tail of a
	// controller that was deposed (never committed, cut by the next term): a change of
	// leader ends that wait too, and the call asks the next controller. A committed
	// index is never cut, so waiting for one stays safe.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(cut, func() {
		if s.raft.CommitIndex() < resp.Index {
			stop()
		}
	})()
	return s.waitApplied(wctx, resp.Index)
}

// awaitController waits until Raft names a leader (Raft reports a lost leader before
// it knows the next one), ctx ends, the store closes, or a lease has gone by (callers
// without a deadline, such as an admin request's, must not wait out a lost quorum).
func (s *Store) awaitController(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.Lease())
	defer cancel()
	for {
		gen := *s.leaderGen.Load()
		if addr, _ := s.raft.LeaderWithID(); addr != "" {
			return nil
		}
		select {
		case <-gen:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return fmt.Errorf("%w: closing", ErrUnavailable)
		}
	}
}

// writesThrough returns the index of the last entry at or below last that may carry a
// write: it steps back over barriers and no-ops (at most maxQuietScan of them), which
// carry none. A node current through it holds every write committed up to last. A
// follower told last itself would wait to learn that those barriers are committed,
// which a quiet controller tells only at its next CommitTimeout; and the barrier a
// nudge appends is one of them, so a Sync answered with it nudged again, without end.
func (s *Store) writesThrough(last uint64) uint64 {
	i := last
	for ; i > 0 && last-i < maxQuietScan; i-- {
		var l raft.Log
		if err := s.bolt.GetLog(i, &l); err != nil || (l.Type != raft.LogBarrier && l.Type != raft.LogNoop) {
			break
		}
	}
	return i
}

// maxQuietScan bounds writesThrough's walk back; past it, it answers where it stopped.
const maxQuietScan = 64

// leaderIndex confirms this node still leads and returns its last log index: every
// write committed before the call is at or below it.
func (s *Store) leaderIndex() (uint64, error) {
	if err := s.awaitRead(s.raft.VerifyLeader(), "verify leadership"); err != nil {
		return 0, err
	}
	return s.raft.LastIndex(), nil
}
