package raftetcd

import (
	"context"
	"encoding/binary"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// group is one raft group on this node: its RawNode (guarded by mu, as RawNode is
// not safe for concurrent use), its storage, and the goroutine that runs its Ready
// loop.
type group struct {
	h  *Host
	id string
	st logStore         // written by the Ready loop only
	hs raftpb.HardState // the last hard state the Ready loop made durable

	mu       sync.Mutex
	rn       *raft.RawNode
	quiesced bool
	waiters  map[uint64]chan uint64 // proposal id → its index once applied

	wake chan struct{}
}

func (g *group) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// run is the group's Ready loop, following etcd-io/raft's contract: persist the hard
// state and entries (synced when raft says it must), then send the messages, then
// apply the committed entries, then Advance.
func (g *group) run() {
	defer g.h.wg.Done()
	for {
		select {
		case <-g.h.quit:
			return
		case <-g.wake:
		}
		for {
			g.mu.Lock()
			if !g.rn.HasReady() {
				g.mu.Unlock()
				break
			}
			rd := g.rn.Ready()
			leader := g.rn.BasicStatus().RaftState == raft.StateLeader
			g.mu.Unlock()
			later := rd.Messages
			if g.h.opts.ParallelAppend && leader && !g.termOrVoteChanged(rd.HardState) {
				// The leader's appends go to its followers while it writes them itself
				// (Raft thesis 10.2.1): they are not acknowledgements of its own write,
				// and nothing of this Ready is applied or answered before that write is
				// durable (the loop persists before it applies and calls Advance).
				var early []raftpb.Message
				later = nil
				for _, m := range rd.Messages {
					if m.Type == raftpb.MsgApp {
						early = append(early, m)
					} else {
						later = append(later, m)
					}
				}
				g.h.send(g.id, 0, early)
			}
			if err := g.persist(rd); err != nil {
				// A write that failed may or may not be on disk; the group must not
				// answer from a log it cannot trust. The build fences the partition;
				// the spike stops the group.
				g.h.log.Error("raftetcd: persisting failed; group stopped", "group", g.id, "err", err)
				return
			}
			if !raft.IsEmptyHardState(rd.HardState) {
				g.hs = rd.HardState
			}
			g.h.send(g.id, 0, later)
			for _, e := range rd.CommittedEntries {
				g.apply(e)
			}
			g.mu.Lock()
			g.rn.Advance(rd)
			g.mu.Unlock()
		}
	}
}

func (g *group) persist(rd raft.Ready) error { return g.st.persist(rd) }

// termOrVoteChanged reports whether hs changes the term or vote this group last made
// durable: such a Ready's messages wait for its write (a vote must never be sent
// before it is on disk).
func (g *group) termOrVoteChanged(hs raftpb.HardState) bool {
	return !raft.IsEmptyHardState(hs) && (hs.Term != g.hs.Term || hs.Vote != g.hs.Vote)
}

// apply hands a committed proposal to the application and wakes its proposer when it
// was proposed here. Entries without data are a new leader's empty entry.
func (g *group) apply(e raftpb.Entry) {
	if e.Type != raftpb.EntryNormal || len(e.Data) < 8 {
		return
	}
	pid := binary.BigEndian.Uint64(e.Data)
	if g.h.opts.Apply != nil {
		g.h.opts.Apply(g.id, e.Index, e.Data[8:])
	}
	g.mu.Lock()
	ch := g.waiters[pid]
	delete(g.waiters, pid)
	g.mu.Unlock()
	if ch != nil {
		ch <- e.Index
	}
}

func (g *group) propose(ctx context.Context, data []byte) (uint64, error) {
	pid := g.h.nextProposal.Add(1)
	buf := make([]byte, 8+len(data))
	binary.BigEndian.PutUint64(buf, pid)
	copy(buf[8:], data)
	ch := make(chan uint64, 1)
	g.mu.Lock()
	if g.rn.BasicStatus().RaftState != raft.StateLeader {
		g.mu.Unlock()
		return 0, ErrNotLeader
	}
	g.quiesced = false
	if err := g.rn.Propose(buf); err != nil {
		g.mu.Unlock()
		return 0, ErrNotLeader // dropped: leadership is changing
	}
	g.waiters[pid] = ch
	g.mu.Unlock()
	g.signal()
	select {
	case idx := <-ch:
		return idx, nil
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.waiters, pid)
		g.mu.Unlock()
		return 0, ctx.Err()
	case <-g.h.quit:
		return 0, ErrClosed
	}
}

// tick advances the group's clock unless it is quiesced. A leader whose followers are
// all live and caught up quiesces instead of ticking: it sends each a last heartbeat
// marked quiesce and stops; the followers stop their election clocks on it.
func (g *group) tick() {
	g.mu.Lock()
	if g.quiesced {
		g.mu.Unlock()
		return
	}
	if hbs := g.quiesceLocked(); hbs != nil {
		g.quiesced = true
		g.mu.Unlock()
		g.h.send(g.id, flagQuiesce, hbs)
		return
	}
	g.rn.Tick()
	g.mu.Unlock()
	g.signal()
}

// quiesceLocked returns the quiesce heartbeats when the group may quiesce: this node
// leads, nothing is in flight (no Ready pending, everything committed is applied, no
// leadership transfer), every follower has the whole log and is live.
func (g *group) quiesceLocked() []raftpb.Message {
	if g.h.opts.NoQuiesce || g.rn.HasReady() || len(g.waiters) > 0 {
		return nil
	}
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader || bs.LeadTransferee != 0 || bs.Applied != bs.Commit {
		return nil
	}
	ok := true
	var hbs []raftpb.Message
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if pr.Match != bs.Commit {
			ok = false
		}
		if id != g.h.opts.ID {
			if !g.h.isLive(id) {
				ok = false
			}
			hbs = append(hbs, raftpb.Message{Type: raftpb.MsgHeartbeat, To: id, From: g.h.opts.ID, Term: bs.Term, Commit: bs.Commit})
		}
	})
	if !ok {
		return nil
	}
	return hbs
}

// step hands a message from a peer to raft. A quiesce heartbeat from the current
// leader, with the follower's log caught up to it, quiesces the follower. Any other
// message wakes a quiesced group, except the answers to quiesce heartbeats (the
// leader stays asleep) and pre-votes to a follower (its leader is alive, by liveness,
// so the pre-vote would be refused anyway; the leader, which gets one too, wakes and
// tells the candidate).
func (g *group) step(flags byte, m raftpb.Message) {
	g.mu.Lock()
	if err := g.rn.Step(m); err != nil {
		g.mu.Unlock()
		return
	}
	switch {
	case flags&flagQuiesce != 0:
		bs := g.rn.BasicStatus()
		if bs.RaftState == raft.StateFollower && bs.Lead == m.From && bs.Term == m.Term && bs.Commit == m.Commit {
			g.quiesced = true
		}
	case m.Type == raftpb.MsgHeartbeatResp:
	case m.Type == raftpb.MsgPreVote && g.rn.BasicStatus().RaftState == raft.StateFollower:
	default:
		g.quiesced = false
	}
	g.mu.Unlock()
	g.signal()
}

// leaderDown wakes the group when dead led it; when designated, this node campaigns at
// once, as a leadership transfer from the dead leader would have it do.
func (g *group) leaderDown(dead uint64, designated bool) {
	g.mu.Lock()
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateFollower || bs.Lead != dead {
		g.mu.Unlock()
		return
	}
	g.quiesced = false
	if designated {
		_ = g.rn.Step(raftpb.Message{Type: raftpb.MsgTimeoutNow, From: dead, To: g.h.opts.ID, Term: bs.Term})
	}
	g.mu.Unlock()
	g.signal()
}

func (g *group) wakeIfLeader() {
	g.mu.Lock()
	if g.rn.BasicStatus().RaftState == raft.StateLeader {
		g.quiesced = false
	}
	g.mu.Unlock()
}
