package raftetcd

import (
	"encoding/binary"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

// Leader leases (docs/internals/replication.md, "A leader lease for consumes").
//
// A replica that stepped a message from its leader within the hold (H, the liveness
// timeout) grants no vote to another candidate and stands for no forced election: a
// refused vote request is kept and stepped when the hold ends with the leader still
// silent. A leader that asked for a read index at s, and got its answer in the same
// term, so that a quorum stepped a heartbeat it sent after s, holds a lease until
// s + E, E below both H and the shortest election a follower's own clock starts
// ((ElectionTick-1) ticks): until then no other replica can be elected, because every
// quorum holds a member that holds its vote. While its lease runs the leader refuses
// votes too, and a planned handover ends it first and tells the followers (flagHandover)
// that they may vote.
//
// The lease reads CLOCK_BOOTTIME, which, unlike Go's monotonic clock, counts the time a
// machine spent suspended: a leader suspended must not wake up believing in a lease
// that ended meanwhile (a hypervisor that freezes a guest stops that clock too: the
// broker's --leader-leases=false is for such machines). The holds read Go's monotonic
// clock: one that stops only makes a hold last longer.

// flagHandover marks a leader's message sent after it gave up its lease to hand its
// leadership over: the follower may vote for another candidate at once.
const flagHandover byte = 2

// monoBase anchors monoNanos.
var monoBase = time.Now()

// monoNanos is Go's monotonic clock in nanoseconds (read through the vDSO): the
// follower's side of the protocol reads it. A clock that stops while the machine is
// frozen only makes a hold last longer, which is safe; the lease itself, where a stopped
// clock would not be, reads bootNanos.
func monoNanos() int64 { return int64(time.Since(monoBase)) }

// bootNanos reads CLOCK_BOOTTIME in nanoseconds.
func bootNanos() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Now().UnixNano() // not reached on Linux
	}
	return ts.Nano()
}

// holdFor is H: how long a replica holds its vote after a message from its leader.
func (h *Host) holdFor() int64 { return int64(h.opts.LivenessTimeout) }

// leaseFor is E: two thirds of the shorter of the hold and the shortest election
// timeout a follower's ticks can start an election after.
func (h *Host) leaseFor() int64 {
	d := min(h.opts.LivenessTimeout, time.Duration(h.opts.ElectionTick-1)*h.opts.Tick)
	return int64(d) * 2 / 3
}

// leaseState is a group's part of the lease protocol, guarded by group.mu.
type leaseState struct {
	// Follower side. heard is when this replica last stepped a message from its
	// leader (a heartbeat, an append or a snapshot of the current term), or when the
	// group opened on a log it had before (it may have heard a leader just before it
	// stopped). released is a term whose leader said it hands over.
	heard    int64
	released uint64
	// held is the last vote request refused while holding; holdTimer steps it (and
	// makes a deferred forced campaign: forceFrom) when the hold ends.
	held      *raftpb.Message
	forceFrom uint64
	holdTimer *time.Timer
	// heldAt and forcedAt are when the request was held and the campaign deferred: a
	// leader heard since is alive, and they are dropped.
	heldAt, forcedAt int64

	// Leader side. until is when the lease ends, in term; none is a term in which no
	// lease may be taken any more (a handover began). reads are the read indexes
	// asked, by request id: when each was asked and in which term and configuration.
	until      int64
	term, none uint64
	reads      map[uint64]leaseRead
	renewing   int64 // when the background renewal in flight was asked (0: none)
	// confEpoch counts the configuration changes this replica appended or applied;
	// confIndex is the index of the last one appended. A lease is taken only from a
	// read asked after the last change was applied, in the same epoch.
	confEpoch, confIndex uint64
}

type leaseRead struct {
	at         int64
	term, conf uint64
}

// holdingLocked reports whether this replica must refuse a vote to m now (now on
// monoNanos).
func (g *group) holdingLocked(m raftpb.Message, now int64) bool {
	if m.Type != raftpb.MsgVote {
		return false
	}
	bs := g.rn.BasicStatus()
	if m.From == bs.Lead && bs.Lead != 0 {
		return false
	}
	if bs.RaftState == raft.StateLeader {
		if bs.LeadTransferee != 0 && m.From == bs.LeadTransferee {
			return false
		}
		return g.lease.term == bs.Term && bootNanos() < g.lease.until
	}
	return g.heardRecentlyLocked(now)
}

// holdLocked keeps m, refused while holding, and arms the timer that steps it when
// the hold ends.
func (g *group) holdLocked(m raftpb.Message) {
	g.h.votesHeld.Add(1)
	c := m
	g.lease.held, g.lease.heldAt = &c, monoNanos()
	g.armHoldLocked()
}

// deferForceLocked defers the forced campaign against dead until the hold ends.
func (g *group) deferForceLocked(dead uint64) {
	g.lease.forceFrom, g.lease.forcedAt = dead, monoNanos()
	g.armHoldLocked()
}

func (g *group) armHoldLocked() {
	if g.lease.holdTimer != nil {
		return
	}
	g.lease.holdTimer = time.AfterFunc(g.holdLeft(), g.holdEnded)
}

// holdLeft is how long the current hold has to run (a little more, so the timer finds
// it over), at least a millisecond.
func (g *group) holdLeft() time.Duration {
	return max(time.Duration(g.lease.heard+g.h.holdFor()-monoNanos())+time.Millisecond, time.Millisecond)
}

// holdEnded steps the vote request held, and makes the forced campaign deferred, once
// the hold is over (the leader spoke again meanwhile: later).
func (g *group) holdEnded() {
	g.mu.Lock()
	g.lease.holdTimer = nil
	select {
	case <-g.quit:
		g.mu.Unlock()
		return
	case <-g.h.quit:
		g.mu.Unlock()
		return
	default:
	}
	now := monoNanos()
	if g.lease.held != nil && g.lease.heard > g.lease.heldAt {
		g.lease.held = nil // its leader spoke since: alive, and the request stale
	}
	if g.lease.forceFrom != 0 && (g.lease.heard > g.lease.forcedAt || g.h.peerLive(g.lease.forceFrom)) {
		g.lease.forceFrom = 0 // its leader spoke since, or answers again
	}
	if g.heardRecentlyLocked(now) && (g.lease.held != nil || g.lease.forceFrom != 0) {
		g.armHoldLocked()
		g.mu.Unlock()
		return
	}
	if m := g.lease.held; m != nil {
		g.lease.held = nil
		_ = g.rn.Step(*m) // refused now, as raft decides
		g.quiesced = false
	}
	if dead := g.lease.forceFrom; dead != 0 {
		g.lease.forceFrom = 0
		g.forceCampaignLocked(dead)
	}
	g.mu.Unlock()
	g.signal()
}

// heardRecentlyLocked reports whether this replica's hold still runs (for its own
// forced campaign).
func (g *group) heardRecentlyLocked(now int64) bool {
	bs := g.rn.BasicStatus()
	if g.lease.released != 0 && g.lease.released == bs.Term {
		return false
	}
	return g.lease.heard != 0 && now-g.lease.heard < g.h.holdFor()
}

// withoutHeldCampaign drops this node's own (pre-)vote requests from msgs while its
// hold runs: a replica holding its vote for its leader's lease must not elect itself
// either (its election clock can run out before the hold, and some campaigns skip it).
func (g *group) withoutHeldCampaign(msgs []raftpb.Message) []raftpb.Message {
	has := false
	for _, m := range msgs {
		has = has || own(m)
	}
	if !has {
		return msgs
	}
	g.mu.Lock()
	held := g.heardRecentlyLocked(monoNanos())
	g.mu.Unlock()
	if !held {
		return msgs
	}
	out := msgs[:0:0]
	for _, m := range msgs {
		if !own(m) {
			out = append(out, m)
		}
	}
	return out
}

// own reports whether m is a request of this replica's own campaign that its hold
// stops: a pre-vote, or a vote not forced. A forced one (a leadership handed to it, or
// a takeover of a dead leader's group) was let start only after its hold was over or
// released, and raft's term has moved past the one released by then.
func own(m raftpb.Message) bool {
	return m.Type == raftpb.MsgPreVote || (m.Type == raftpb.MsgVote && string(m.Context) != campaignTransfer)
}

// campaignTransfer is etcd-io/raft's context of a forced campaign's vote requests.
const campaignTransfer = "CampaignTransfer"

// steppedLocked notes a message raft took: one from the leader of the current term
// renews the hold; one flagged as a handover releases it.
func (g *group) steppedLocked(flags byte, m raftpb.Message) {
	switch m.Type {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
	default:
		return
	}
	bs := g.rn.BasicStatus()
	if bs.Lead != m.From || bs.Term != m.Term {
		return
	}
	if flags&flagHandover != 0 {
		g.lease.released = m.Term
		if g.lease.held != nil || g.lease.forceFrom != 0 {
			g.releaseNowLocked()
		}
		return
	}
	g.lease.heard = monoNanos()
}

// releaseNowLocked ends the hold at once (its timer fires now).
func (g *group) releaseNowLocked() {
	if g.lease.holdTimer != nil && g.lease.holdTimer.Stop() {
		g.lease.holdTimer = nil
	}
	if g.lease.holdTimer == nil {
		g.lease.holdTimer = time.AfterFunc(0, g.holdEnded)
	}
}

// askReadLocked asks raft for a read index and records when, for the lease. It
// returns the request's id.
func (g *group) askReadLocked() uint64 {
	g.readSeq++
	id := g.readSeq
	if g.lease.reads == nil {
		g.lease.reads = map[uint64]leaseRead{}
	}
	g.lease.reads[id] = leaseRead{at: bootNanos(), term: g.rn.BasicStatus().Term, conf: g.lease.confEpoch}
	g.quiesced = false
	g.rn.ReadIndex(binary.BigEndian.AppendUint64(nil, id))
	return id
}

// readStatesLocked answers the reads raft released and takes the lease they prove.
func (g *group) readStatesLocked(rss []raft.ReadState) {
	if len(rss) == 0 {
		return
	}
	bs := g.rn.BasicStatus()
	for _, rs := range rss {
		id := binary.BigEndian.Uint64(rs.RequestCtx)
		if ch := g.reads[id]; ch != nil {
			delete(g.reads, id)
			ch <- rs.Index
		}
		r, ok := g.lease.reads[id]
		if !ok {
			continue
		}
		delete(g.lease.reads, id)
		if bs.RaftState != raft.StateLeader || r.term != bs.Term || g.lease.none == bs.Term ||
			bs.LeadTransferee != 0 || r.conf != g.lease.confEpoch || g.applied < g.lease.confIndex ||
			!g.isVoterLocked() {
			continue
		}
		if until := r.at + g.h.leaseFor(); g.lease.term != bs.Term || until > g.lease.until {
			g.lease.term, g.lease.until = bs.Term, until
		}
	}
	g.lease.renewing = 0
	// Reads raft will never answer (asked before a step-down, or lost) are forgotten.
	if len(g.lease.reads) > 64 {
		now := bootNanos()
		for id, r := range g.lease.reads {
			if now-r.at > 2*g.h.holdFor() {
				delete(g.lease.reads, id)
			}
		}
	}
}

// confAppended is confSeenLocked for the entries this replica appends, from a Ready
// loop: it takes the group's lock only when one of them changes the configuration.
func (g *group) confAppended(ents []raftpb.Entry) {
	for _, e := range ents {
		if e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2 {
			g.mu.Lock()
			g.confSeenLocked(ents, true)
			g.mu.Unlock()
			return
		}
	}
}

// confSeenLocked notes configuration changes among ents, entries this replica
// appends or applies: a lease proved under the old configuration ends.
func (g *group) confSeenLocked(ents []raftpb.Entry, appended bool) {
	for _, e := range ents {
		if e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2 {
			g.lease.confEpoch++
			g.lease.until = 0
			if appended {
				g.lease.confIndex = max(g.lease.confIndex, e.Index)
			}
		}
	}
}

// endLeaseForHandoverLocked gives up the lease for the rest of the term, before a
// transfer of the leadership, and tells the followers with a flagged heartbeat that
// they may vote (commit 0: a heartbeat's commit only ever raises a follower's).
func (g *group) endLeaseForHandoverLocked() []raftpb.Message {
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader {
		return nil
	}
	g.lease.none, g.lease.until = bs.Term, 0
	var hbs []raftpb.Message
	for _, id := range g.voters { // outgoing ones included
		if id != g.h.opts.ID {
			hbs = append(hbs, raftpb.Message{Type: raftpb.MsgHeartbeat, To: id, From: g.h.opts.ID, Term: bs.Term})
		}
	}
	return hbs
}

// leaseHeld reports whether this replica leads under a lease now, and asks for its
// renewal in the background when less than half of it is left. served counts a
// consume served under it (Stats.LeaseServed).
func (g *group) leaseHeld(served bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader || !g.leading {
		return false
	}
	now := bootNanos()
	held := g.lease.term == bs.Term && now < g.lease.until && bs.LeadTransferee == 0 &&
		g.lease.none != bs.Term
	if held && served {
		g.h.leaseServed.Add(1)
	}
	left := int64(0)
	if g.lease.term == bs.Term {
		left = g.lease.until - now
	}
	if g.lease.none != bs.Term && bs.LeadTransferee == 0 && left < g.h.leaseFor()/2 &&
		(g.lease.renewing == 0 || now-g.lease.renewing > g.h.leaseFor()) {
		g.lease.renewing = now
		g.h.leaseRenewals.Add(1)
		g.askReadLocked()
		defer g.signal()
	}
	return held
}

// isVoterLocked: a leader removed from the configuration may still lead a moment, and
// raft answers its read index at once when one voter is left: no lease then.
func (g *group) isVoterLocked() bool {
	for _, v := range g.voters {
		if v == g.h.opts.ID {
			return true
		}
	}
	return false
}
