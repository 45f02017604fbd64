package meta

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// Readiness: a node serves reads of the metadata, and takes destructive steps on them
// (deleting a deleted topic's files), only once it knows a controller and has applied
// every entry the controller had committed when the node asked. The controller itself
// proves that with a Barrier; a follower asks the controller for its applied index
// after a Barrier (a read index) and waits until it has applied that far. A node that
// has known no controller for longer than SuspectAfter is not ready again until it has
// caught up again.

// Ready reports whether this node's metadata is current (see above).
// A member of a cluster is ready only while it holds the metadata lease (lease.go).
func (s *Store) Ready() bool {
	return s.ready.Load() && s.fsm.haltedErr() == nil && s.CurrentThrough(s.fsm.applied.Load())
}

// WaitReady blocks until Ready or ctx ends; the error then says why (no controller, a
// join refused, a halted state machine).
func (s *Store) WaitReady(ctx context.Context) error {
	for !s.Ready() {
		if err := s.fsm.haltedErr(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			if p := s.joinErr.Load(); p != nil {
				return fmt.Errorf("%w: not admitted to the cluster: %w", ErrUnavailable, *p)
			}
			return fmt.Errorf("%w: not caught up with a controller: %v", ErrUnavailable, ctx.Err())
		case <-s.stop:
			return fmt.Errorf("%w: closing", ErrUnavailable)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func (s *Store) readyLoop() {
	// The loop wakes when Raft's leader changes (the leader generation, closed by
	// countLeaderChanges's observer), every readyRetry while it catches up, when a lost
	// controller has been unknown for SuspectAfter, and at least every readyRecheck. It
	// used to poll every 10 ms, which was most of an idle node's CPU
	// (docs/performance.md, "Idle").
	wake := time.NewTimer(0) // the first look is at once: a leader may be known already
	defer wake.Stop()
	// lostAt is when this loop last saw the controller become unknown (or its start).
	lostAt, known := time.Now(), false
	gen := *s.leaderGen.Load()
	for {
		select {
		case <-s.stop:
			return
		case <-gen:
		case <-wake.C:
		}
		wake.Stop()
		// Taken before the state is read: a change from here on wakes the next wait.
		gen = *s.leaderGen.Load()
		s.readyWakes.Add(1)
		next := readyRecheck
		addr, _ := s.raft.LeaderWithID()
		if addr == "" && known {
			lostAt = time.Now()
		}
		known = addr != ""
		switch {
		case !known:
			if s.ready.Load() {
				if gone := time.Since(lostAt); gone > s.opts.Cluster.SuspectAfter {
					s.opts.Logger.Warn("meta: no controller known; metadata reads are not current until one is", "for", gone.Round(time.Millisecond))
					s.ready.Store(false)
				} else {
					next = min(next, s.opts.Cluster.SuspectAfter-gone+time.Millisecond)
				}
			}
		case s.ready.Load():
		case s.fsm.haltedErr() != nil:
			// It cannot apply what a catch-up would wait for, and each try would
			// append a barrier on the controller: stay not ready until a restart.
		default:
			// A catch-up that waits on a controller that died (its request hangs for
			// ApplyTimeout) is cut short when Raft's leader changes, and made again
			// with the new one at once.
			ctx, release := s.untilLeaderMoves(context.Background())
			// The leader again, now that a change from here on cuts the catch-up.
			if addr, _ = s.raft.LeaderWithID(); addr == "" {
				release()
				next = readyRetry
				break
			}
			err := s.catchUp(ctx, addr)
			moved := release()
			switch {
			case err != nil && moved:
				next = 0
			case err != nil:
				s.opts.Logger.Debug("meta: not caught up yet", "err", err)
				next = readyRetry
			default:
				s.ready.Store(true)
			}
		}
		wake.Reset(next)
	}
}

// The ready loop's periods (see readyLoop).
const (
	readyRetry   = 10 * time.Millisecond
	readyRecheck = time.Second
)

// catchUp returns once this node has applied what the controller at addr had applied
// after a barrier.
func (s *Store) catchUp(ctx context.Context, addr raft.ServerAddress) error {
	started := time.Now()
	if err := s.catchUpOnce(ctx, addr); err != nil {
		return err
	}
	s.markFresh(started)
	return nil
}

func (s *Store) catchUpOnce(ctx context.Context, addr raft.ServerAddress) error {
	if s.Leader() {
		if err := s.awaitRead(s.raft.Barrier(s.opts.ApplyTimeout), "barrier"); err != nil {
			return err
		}
		// The controller is ready once the cluster has its id and this node its member
		// record (at once on a new cluster or a single-node directory's first start).
		if m, ok := s.fsm.member(s.opts.NodeID); s.fsm.cluster() == "" || !ok || m.ServerID != s.ServerID() || m.Status != StatusAlive {
			s.ctl.lead()
			return s.controlTick()
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.ApplyTimeout)
	defer cancel()
	resp, err := s.forward(ctx, addr, fwdRequest{Kind: kindReadIndex})
	if err != nil {
		return err
	}
	return s.waitApplied(ctx, resp.Index)
}
