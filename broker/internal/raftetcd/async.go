package raftetcd

import (
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The asynchronous Ready loop (Options.AsyncStorageWrites, etcd-io/raft's
// Config.AsyncStorageWrites). The serial loop persists each Ready before it takes the
// next, so a proposal, or an append arriving from the leader, waits for whatever write
// is in flight to finish before its own write starts: under load each message waited
// for about three sync rounds in series (the leader's, the follower's, and the leader's
// next Ready before it applied). Here the loop hands each Ready's log writes
// (MsgStorageAppend) to the group's append worker and goes on: new entries are sent
// and queued for the next write while the last one syncs, and the worker writes all
// that queued up in one Save (one sync round). raft itself still decides what waits
// for what: the answers a write owes (a follower's MsgAppResp, a vote, the leader's
// own acknowledgement) are the append message's Responses, delivered only after the
// write is durable; and it hands an entry to apply (MsgStorageApply) only once it is
// committed and durable on this node. The loop applies those itself, in order, so a
// committed entry no longer waits behind the write of newer ones.
//
// A snapshot from the leader is rare and restores the application: the loop waits
// for the worker to finish what it holds and installs it itself, as the serial loop
// does.

// appendQueue is a group's queue of storage appends for its worker.
type appendQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	msgs   []raftpb.Message
	busy   bool // the worker holds messages taken from msgs
	closed bool
	failed bool // a write failed: the group stops
}

func newAppendQueue() *appendQueue {
	q := &appendQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// put queues m for the worker.
func (q *appendQueue) put(m raftpb.Message) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	q.cond.Broadcast()
}

// take waits for queued messages and takes them all; nil once closed.
func (q *appendQueue) take() []raftpb.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy = false
	q.cond.Broadcast() // a drain may be waiting for the worker to be idle
	for len(q.msgs) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return nil
	}
	msgs := q.msgs
	q.msgs = nil
	q.busy = true
	return msgs
}

// drain waits until the worker has written everything queued; false if a write
// failed or the queue closed.
func (q *appendQueue) drain() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for (len(q.msgs) > 0 || q.busy) && !q.closed && !q.failed {
		q.cond.Wait()
	}
	return !q.closed && !q.failed
}

func (q *appendQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *appendQueue) fail() {
	q.mu.Lock()
	q.failed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

// runAsync is run with asynchronous storage writes.
func (g *group) runAsync() {
	q := newAppendQueue()
	failed := make(chan struct{})
	var worker sync.WaitGroup
	worker.Add(1)
	go func() {
		defer worker.Done()
		g.appendWorker(q, failed)
	}()
	defer func() {
		q.close()
		worker.Wait()
	}()
	for {
		select {
		case <-g.h.quit:
			return
		case <-g.quit:
			return
		case <-g.broken:
			return
		case <-failed:
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
			if !leader {
				g.stepDown() // at once: a deposed leader serves nothing more
			}
			// The messages to peers first: a leader's new entries go to its followers
			// before anything here waits (raft holds back, as the append's Responses,
			// whatever must wait for this node's write).
			var out, local []raftpb.Message
			for _, m := range rd.Messages {
				switch m.To {
				case raft.LocalAppendThread, raft.LocalApplyThread, g.h.opts.ID:
					local = append(local, m)
				default:
					out = append(out, m)
				}
			}
			if !g.mayLead() {
				out = withoutPreVotes(out)
			}
			out = g.withoutHeldCampaign(out)
			g.h.send(g.id, 0, out)
			g.reportSnapshots(out)
			// Then the local ones, in order: the appends to the worker (a snapshot
			// after the worker wrote all before it), the committed entries applied here.
			for _, m := range local {
				switch m.To {
				case raft.LocalAppendThread:
					if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
						if !q.drain() || !g.installSnapshot(m) {
							return
						}
						continue
					}
					g.noteAppend(m.Entries)
					g.noteProposed(m.Entries)
					g.confAppended(m.Entries)
					q.put(m)
				case raft.LocalApplyThread:
					for _, e := range m.Entries {
						if !g.apply(e) {
							return
						}
					}
					g.deliver(m.Responses)
				default:
					g.deliver([]raftpb.Message{m})
				}
			}
			g.mu.Lock()
			g.readStatesLocked(rd.ReadStates)
			g.resolveCommittedLocked()
			g.mu.Unlock()
			g.appliedC.Broadcast()
			g.maybeSnapshot()
			g.trimCache()
		}
	}
}

// appendWorker writes what the loop queued, everything queued at once in one Save,
// then delivers the answers the writes owed. A failed write stops the group: the
// write may or may not be on disk, and the group must not answer from a log it
// cannot trust.
func (g *group) appendWorker(q *appendQueue, failed chan struct{}) {
	// The hard state last handed to the store: a Ready built here says MustSync as
	// raft's own would (entries, or a new term or vote). The prototype store syncs
	// only then; without it every append was acknowledged, and every vote sent,
	// before anything reached the disk.
	prev, _, _ := g.st.InitialState()
	for {
		msgs := q.take()
		if msgs == nil {
			return
		}
		var hs raftpb.HardState
		var ents []raftpb.Entry
		for _, m := range msgs {
			ents = mergeEntries(ents, m.Entries)
			if st := (raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}); !raft.IsEmptyHardState(st) {
				hs = st
			}
		}
		st := hs
		if raft.IsEmptyHardState(st) {
			st = prev
		}
		must := raft.MustSync(st, prev, len(ents))
		if err := g.st.persist(raft.Ready{HardState: hs, Entries: ents, MustSync: must}); err != nil {
			g.h.log.Error("raftetcd: persisting failed; group stopped", "group", g.id, "err", err)
			q.fail()
			close(failed)
			return
		}
		prev = st
		for _, m := range msgs {
			g.deliver(m.Responses)
		}
	}
}

// mergeEntries appends next to ents as a log would: entries of next at indexes ents
// already holds replace them and everything after (a new leader's entries over a
// divergent tail), so one write of the result leaves what writing each in turn would.
func mergeEntries(ents, next []raftpb.Entry) []raftpb.Entry {
	if len(next) == 0 {
		return ents
	}
	if len(ents) > 0 {
		first := ents[0].Index
		switch at := next[0].Index; {
		case at <= first:
			ents = ents[:0]
		case at <= ents[len(ents)-1].Index:
			ents = ents[:at-first]
		}
	}
	return append(ents, next...)
}

// deliver hands the answers of a storage write or apply on: to this node's raft, or
// to the peer they are for.
func (g *group) deliver(msgs []raftpb.Message) {
	var out []raftpb.Message
	local := false
	for _, m := range msgs {
		if m.To != g.h.opts.ID {
			out = append(out, m)
			continue
		}
		g.mu.Lock()
		_ = g.rn.Step(m) // refused only for a peer no longer in the group
		g.mu.Unlock()
		local = true
	}
	if len(out) > 0 {
		g.h.send(g.id, 0, out)
	}
	if local {
		g.signal()
	}
}

// installSnapshot writes a snapshot the leader sent, with what else its append
// message carries, has the application take its state, and delivers the answers;
// false when the group must stop.
func (g *group) installSnapshot(m raftpb.Message) bool {
	rd := raft.Ready{Snapshot: *m.Snapshot, Entries: m.Entries, HardState: raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}, MustSync: true}
	if err := g.persist(rd); err != nil {
		g.h.log.Error("raftetcd: persisting failed; group stopped", "group", g.id, "err", err)
		return false
	}
	if !g.takeSnapshot(rd.Snapshot) {
		return false
	}
	g.deliver(m.Responses)
	return true
}
