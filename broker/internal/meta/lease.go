package meta

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The metadata lease. Knowing a controller is not knowing its latest state: a node
// whose answers to the controller are lost (a one-way cut) still hears its Raft
// heartbeats, which carry no entries, and a node stopped with SIGSTOP and continued
// knows the controller it knew before, for as long as its Raft timers take to notice.
// Either would serve a topic the cluster deleted seconds ago. So a member of a
// cluster counts its metadata as current only while it holds a lease: a catch-up with
// the controller (a read index, or a verified leadership on the controller itself)
// that started less than Lease ago. Everything the controller had committed when the
// catch-up started is then applied here. The lease loop renews it every
// HeartbeatInterval; a node that cannot renew it for Lease is not ready (metadata
// reads and data requests answer 503) until a catch-up succeeds again.
//
// What it buys: a write committed on the controller at time T is applied on every
// ready node from T+Lease on — whether or not that node can be reached. The delete
// fence (broker/deletefence.go) waits that long for a replica that does not confirm.
//
// A node alone in its control plane (a single-node cluster) holds the lease for good:
// nothing can commit without it.

// freshMark records one catch-up: at is when it started (before the request was
// sent), index the state machine's applied command index once it had applied what the
// controller had then. Every write committed before at is at or below index.
type freshMark struct {
	at    time.Time
	index uint64
}

// leaseMarks is how many recent catch-ups are kept: a reader that has processed the
// metadata through an index finds the newest catch-up at or below it.
const leaseMarks = 16

// leaseState holds the recent catch-ups, newest first, as an immutable slice that a
// new catch-up replaces (readers, one per request, take no lock).
type leaseState struct {
	leaseMu    sync.Mutex // serializes writers
	marks      atomic.Pointer[[]freshMark]
	alone      atomic.Bool
	leaseLapse atomic.Uint64
}

// Lease is how long a catch-up with the controller keeps this node's metadata
// current: SuspectAfter, the time the controller takes to suspect a silent member.
func (s *Store) Lease() time.Duration { return s.opts.Cluster.SuspectAfter }

// markFresh records a catch-up that started at at and has been applied.
func (s *Store) markFresh(at time.Time) {
	idx := s.fsm.applied.Load()
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	var old []freshMark
	if p := s.marks.Load(); p != nil {
		old = *p
	}
	// Keep them ordered by start: a slower catch-up that started earlier adds nothing
	// once a later one finished.
	if len(old) > 0 && !at.After(old[0].at) {
		return
	}
	marks := make([]freshMark, 0, leaseMarks)
	marks = append(marks, freshMark{at: at, index: idx})
	marks = append(marks, old[:min(len(old), leaseMarks-1)]...)
	s.marks.Store(&marks)
}

// freshAsOf returns when the newest catch-up this node has processed through index
// started (zero when none is known).
func (s *Store) freshAsOf(index uint64) time.Time {
	p := s.marks.Load()
	if p == nil {
		return time.Time{}
	}
	for _, m := range *p {
		if m.index <= index {
			return m.at
		}
	}
	return time.Time{}
}

// CurrentThrough reports whether state processed through the metadata index index
// is current: a catch-up that started less than Lease ago is at or below it.
func (s *Store) CurrentThrough(index uint64) bool {
	if s.alone.Load() {
		return true
	}
	at := s.freshAsOf(index)
	return !at.IsZero() && time.Since(at) < s.Lease()
}

// LeaseLapses counts the times this node's metadata lease ran out (see above).
func (s *Store) LeaseLapses() uint64 { return s.leaseLapse.Load() }

// leaseLoop renews the lease every HeartbeatInterval (at most a quarter of Lease). A
// renewal in flight to a controller that died moves to the new one as soon as this
// node learns of it (Sync does that for every caller); a renewal that fails is tried
// again after leaseRetry, doubling up to the period, and at once when Raft's leader
// changes (after a spell without a controller the next try could be a period away).
func (s *Store) leaseLoop() {
	every := min(s.opts.Cluster.HeartbeatInterval, s.Lease()/4)
	first := min(every, leaseRetry)
	held := true
	next, retry := every, first
	for {
		gen := *s.leaderGen.Load()
		t := time.NewTimer(next)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-gen:
			retry = first
		case <-t.C:
		}
		t.Stop()
		next = every
		if c, err := s.configuration(); err == nil {
			s.alone.Store(len(c.Servers) == 1 && string(c.Servers[0].ID) == s.ServerID())
		}
		if s.alone.Load() || !s.ready.Load() || s.fsm.haltedErr() != nil {
			// Alone: nothing to renew. Not ready: the ready loop's catch-up renews it.
			// Halted: it cannot apply what a renewal would wait for.
			held, retry = true, first
			continue
		}
		if age := time.Since(s.freshAsOf(s.fsm.applied.Load())); age < every {
			next = every - age // woken early (a change of leader): keep the period
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), s.Lease()/2)
			err := s.Sync(ctx)
			cancel()
			if err != nil {
				s.opts.Logger.Debug("meta: renewing the metadata lease failed", "err", err)
				next, retry = retry, min(2*retry, every)
			} else {
				retry = first
			}
		}
		now := s.CurrentThrough(s.fsm.applied.Load())
		switch {
		case held && !now:
			s.leaseLapse.Add(1)
			s.opts.Logger.Warn("meta: no catch-up with the controller succeeded for the metadata lease; this node serves nothing until one does",
				"lease", s.Lease(), "last", time.Since(s.freshAsOf(s.fsm.applied.Load())).Round(time.Millisecond))
		case !held && now:
			s.opts.Logger.Info("meta: caught up with the controller again; serving")
		}
		held = now
	}
}

// leaseRetry is how soon a failed lease renewal is first tried again.
const leaseRetry = 50 * time.Millisecond
