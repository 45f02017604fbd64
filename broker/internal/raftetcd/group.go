package raftetcd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

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

	voters []uint64 // sorted
	cfg    GroupConfig

	mu       sync.Mutex
	rn       *raft.RawNode
	quiesced bool
	// resetting is set while a learner that lost its log is removed and added again
	// (resetLearner); refusedAt is when a message raft refused was last logged.
	resetting atomic.Bool
	refusedAt time.Time
	// broken is closed when raft panicked on a message other than a heartbeat past
	// this replica's log (stepLocked): the group stops, as after a failed write.
	broken    chan struct{}
	breakOnce sync.Once
	waiters   map[uint64]chan proposal // proposal id → its outcome once applied
	reads     map[uint64]chan uint64   // read-index request id → the index to wait for
	readSeq   uint64
	applied   uint64 // last index applied (written by the Ready loop)
	skipTo    uint64 // the application holds the entries up to it already (GroupConfig.Applied)
	leading   bool   // OnRole(true) was said and not taken back
	// recampaign counts the ticks a new group's preferred leader stands again while no
	// leader is known: its first votes are lost when the other replicas have not
	// opened the group yet, and the election timeout would cost another 1–2 s.
	recampaign int
	appliedC   *sync.Cond
	lease      leaseState // the lease protocol's state (lease.go)

	// atCommit: proposals whose callers wait for the commit, not this node's apply
	// (proposeCommitted), by proposal id; atCommitN is its size, read without mu by
	// the Ready loop.
	atCommit  map[uint64]*commitWait
	atCommitN atomic.Int32

	// Snapshots (GroupConfig.Snapshot, Restore). cs is the configuration as of applied;
	// snapIndex the index of the last snapshot stored; pending a snapshot whose state
	// the application must take before anything is applied (set by OpenGroup).
	cs                  raftpb.ConfState
	snapIndex           uint64
	snapshots, restores uint64
	nextSnapTry         uint64 // after a failed snapshot, the applied index to try again at
	// cacheTrimmed: the store's cache was told to let go of the entries below it
	// (trimCache; guarded by mu).
	cacheTrimmed uint64
	// confChanged: the configuration changed since the last snapshot. A snapshot is
	// taken at once, because raft sends the stored one to a replica behind the log's
	// start, and a replica refuses a snapshot whose configuration does not name it.
	confChanged bool
	// snapFirst: the group was made over data the application held before it
	// (GroupConfig.SnapshotFirst) and has not taken its first snapshot yet.
	snapFirst bool
	pending   *raftpb.Snapshot
	// snapHold: no snapshot is taken before applied reaches it (set by OpenGroup; see
	// maybeSnapshot). deferSaid: a snapshot the application deferred
	// (ErrSnapshotDeferred) was logged since the last one taken.
	snapHold  uint64
	deferSaid bool

	wake       chan struct{}
	quit, done chan struct{}

	// recv remembers when this node's log took its recent entries, a span per write,
	// oldest first (see appendedAt).
	recvMu sync.Mutex
	recv   []recvSpan
}

// recvSpan: entries first to last reached this node's log at at.
type recvSpan struct {
	first, last uint64
	at          time.Time
}

// keptSpans bounds the spans a group remembers: an entry applied so long after it
// arrived that its span is gone counts from its apply.
const keptSpans = 1024

// noteAppend records that ents reached this node's log now (a leader's proposals, or a
// follower's appends from its leader), before they are written.
func (g *group) noteAppend(ents []raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	now := time.Now()
	g.recvMu.Lock()
	if len(g.recv) == keptSpans {
		g.recv = append(g.recv[:0], g.recv[keptSpans/2:]...)
	}
	g.recv = append(g.recv, recvSpan{first: ents[0].Index, last: ents[len(ents)-1].Index, at: now})
	g.recvMu.Unlock()
}

// appendedAt returns when the entry at index reached this node's log in this run of
// the group: the newest span holding it (a later append at that index replaced the
// earlier entry). false for an entry read back from disk at a restart, installed by a
// snapshot, or too old to be remembered.
func (g *group) appendedAt(index uint64) (time.Time, bool) {
	g.recvMu.Lock()
	defer g.recvMu.Unlock()
	for i := len(g.recv) - 1; i >= 0; i-- {
		if s := g.recv[i]; index >= s.first && index <= s.last {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// proposal is the outcome of one proposal: its index and what Apply returned.
type proposal struct {
	index  uint64
	result any
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
	defer close(g.done)
	defer g.stepDown()
	if g.pending != nil {
		snap := *g.pending
		g.pending = nil
		if !g.restore(snap) {
			return
		}
	}
	if g.h.opts.AsyncStorageWrites {
		g.runAsync()
		return
	}
	for {
		select {
		case <-g.h.quit:
			return
		case <-g.quit:
			return
		case <-g.broken:
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
			g.noteAppend(rd.Entries)
			g.confAppended(rd.Entries)
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
			if !raft.IsEmptySnap(rd.Snapshot) && !g.takeSnapshot(rd.Snapshot) {
				return
			}
			if !g.mayLead() {
				later = withoutPreVotes(later)
			}
			later = g.withoutHeldCampaign(later)
			g.h.send(g.id, 0, later)
			g.reportSnapshots(rd.Messages)
			for _, e := range rd.CommittedEntries {
				if !g.apply(e) {
					return
				}
			}
			g.mu.Lock()
			g.readStatesLocked(rd.ReadStates)
			g.rn.Advance(rd)
			g.mu.Unlock()
			g.appliedC.Broadcast()
			g.maybeSnapshot()
			g.trimCache()
		}
	}
}

// mayLead reports whether the application lets this replica lead now
// (GroupConfig.MayLead).
func (g *group) mayLead() bool { return g.cfg.MayLead == nil || g.cfg.MayLead() }

// withoutPreVotes drops this node's pre-vote requests from msgs: a replica that may
// not lead stands for no election. (A pre-vote changes no term, so nothing else needs
// undoing; the vote requests of an election it won the pre-vote of before go out.)
func withoutPreVotes(msgs []raftpb.Message) []raftpb.Message {
	out := msgs[:0:0]
	for _, m := range msgs {
		if m.Type != raftpb.MsgPreVote {
			out = append(out, m)
		}
	}
	return out
}

// reportSnapshots tells raft that the snapshots among msgs went out: the leader then
// probes the follower again instead of waiting in the snapshot state for ever (a
// snapshot lost on the way is sent again when the probe finds the follower still
// behind the log's start).
func (g *group) reportSnapshots(msgs []raftpb.Message) {
	for _, m := range msgs {
		if m.Type == raftpb.MsgSnap {
			g.mu.Lock()
			g.rn.ReportSnapshot(m.To, raft.SnapshotFinish)
			g.mu.Unlock()
			g.h.log.Info("raftetcd: sent a snapshot to a replica behind the log's start", "group", g.id, "to", m.To, "index", m.Snapshot.Metadata.Index)
		}
	}
}

// takeSnapshot follows a snapshot from the leader that was just written: the group's
// configuration and snapshot index become the snapshot's, and the application takes
// its state (the entries before it will never come) before this node answers or
// applies anything after it. False when the group must stop.
func (g *group) takeSnapshot(snap raftpb.Snapshot) bool {
	g.mu.Lock()
	g.voters = votersOf(snap.Metadata.ConfState)
	g.cs = snap.Metadata.ConfState
	g.snapIndex = snap.Metadata.Index
	g.mu.Unlock()
	if !g.restore(snap) {
		return false
	}
	g.mu.Lock()
	g.applied = max(g.applied, snap.Metadata.Index)
	g.mu.Unlock()
	return true
}

// restore has the application take snap's state (GroupConfig.Restore), retrying with
// a backoff until it succeeds; false when the group or host closed first.
func (g *group) restore(snap raftpb.Snapshot) bool {
	if g.cfg.Restore == nil {
		return true
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-g.quit:
		case <-g.h.quit:
		case <-ctx.Done():
		}
		cancel()
	}()
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := g.cfg.Restore(ctx, snap.Metadata.Index, snap.Data, g.sources())
		if err == nil {
			g.mu.Lock()
			g.restores++
			g.mu.Unlock()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if attempt == 1 || attempt%10 == 0 {
			g.h.log.Warn("raftetcd: taking a snapshot's state failed; retrying", "group", g.id, "index", snap.Metadata.Index, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 3*time.Second)
	}
}

// sources are the nodes to fetch a snapshot's data from: the leader first, then the
// other voters.
func (g *group) sources() []uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []uint64
	lead := g.rn.BasicStatus().Lead
	if lead != 0 && lead != g.h.opts.ID {
		out = append(out, lead)
	}
	for _, v := range append(append([]uint64(nil), g.cs.Voters...), g.cs.VotersOutgoing...) {
		if v != g.h.opts.ID && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// trimCache lets the store's cache drop the entries this replica will not read
// soon: those it applied and, when it leads, those every active follower in step
// holds. A follower that is not (down, cut off, or being probed after a gap) does not
// hold them back: the leader reads what it lacks from the log's files, as for any
// follower behind the cache. Without this each group kept its newest entries (up to
// 8 MiB) in memory on every replica for as long as it lived, idle or not: a node
// holding 60 replicas of partitions that had taken a burst kept about 480 MB.
//
// It runs after each Ready and at each tick: the last follower's answer to a
// leader's last entries makes no Ready, and the ticks go on until the group
// quiesces, which waits for that answer.
func (g *group) trimCache() {
	g.mu.Lock()
	g.trimCacheLocked()
	g.mu.Unlock()
}

func (g *group) trimCacheLocked() {
	upto := g.applied
	if g.rn.BasicStatus().RaftState == raft.StateLeader {
		self := g.h.opts.ID
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if id != self && pr.State == tracker.StateReplicate && pr.RecentActive {
				upto = min(upto, pr.Match)
			}
		})
	}
	if upto+1 > g.cacheTrimmed {
		g.st.trimCache(upto + 1)
		g.cacheTrimmed = upto + 1
	}
}

// maybeSnapshot takes a snapshot of the application every Options.SnapshotEvery
// applied entries and compacts the log behind it, keeping Options.SnapshotKeep
// entries for followers a little behind (one further behind gets the snapshot).
func (g *group) maybeSnapshot() {
	every := g.h.opts.SnapshotEvery
	g.mu.Lock()
	applied, cs, last, changed, first := g.applied, g.cs, g.snapIndex, g.confChanged, g.snapFirst
	g.mu.Unlock()
	if applied < g.skipTo {
		// The application's state is past applied (GroupConfig.Applied): a snapshot
		// labelled applied would describe a later state. Wait until raft caught up.
		return
	}
	if applied < g.snapHold {
		// Applying again what it applied before it was opened (see OpenGroup): the
		// application's state may be ahead of applied, the first snapshot owed by a
		// group made over data included.
		return
	}
	if first && applied > 0 && g.cfg.Snapshot != nil && g.h.opts.Store == StoreRaftstore {
		g.takeFirstSnapshot(applied, cs)
		return
	}
	if g.cfg.Snapshot == nil || every <= 0 || g.h.opts.Store != StoreRaftstore {
		return
	}
	// After a change of voters, a snapshot matters only once the log was compacted: a
	// new member of a group whose log is whole catches up from it (so a new group's
	// bootstrap entries take none).
	due := applied >= last+uint64(every)
	if !due && changed && applied > last {
		first, _ := g.st.FirstIndex()
		due = first > 1
	}
	if !due || applied < g.nextSnapTry {
		return
	}
	// Asked only when one is due: it runs after every Ready of every group.
	if allowed := g.h.opts.SnapshotsAllowed; allowed != nil && !allowed() {
		return
	}
	data, err := g.cfg.Snapshot()
	if err == nil {
		err = g.st.snapshot(applied, cs, data)
	}
	if err != nil {
		g.nextSnapTry = applied + uint64(every)/4 + 1
		if !g.deferred(applied, err) {
			g.h.log.Error("raftetcd: a snapshot failed; the group's log is not compacted", "group", g.id, "applied", applied, "err", err)
		}
		return
	}
	g.deferSaid = false
	g.mu.Lock()
	g.snapIndex = applied
	g.snapshots++
	g.confChanged = false
	g.mu.Unlock()
	if keep := uint64(g.h.opts.SnapshotKeep); applied > keep {
		if first, err := g.st.FirstIndex(); err == nil && applied-keep >= first {
			if err := g.st.compact(applied - keep); err != nil {
				g.h.log.Error("raftetcd: compacting a group's log failed", "group", g.id, "index", applied-keep, "err", err)
			}
		}
	}
}

// takeFirstSnapshot is the SnapshotFirst snapshot: at applied, with every entry
// before it dropped. A failure is retried after the next Ready.
func (g *group) takeFirstSnapshot(applied uint64, cs raftpb.ConfState) {
	data, err := g.cfg.Snapshot()
	if err == nil {
		err = g.st.snapshot(applied, cs, data)
	}
	if err == nil {
		if first, ferr := g.st.FirstIndex(); ferr == nil && applied >= first {
			err = g.st.compact(applied)
		}
	}
	if err != nil {
		if !g.deferred(applied, err) {
			g.h.log.Error("raftetcd: the first snapshot of a group made over existing data failed; retrying (no member is added before it)", "group", g.id, "applied", applied, "err", err)
		}
		return
	}
	g.deferSaid = false
	g.mu.Lock()
	g.snapIndex, g.snapFirst = applied, false
	g.snapshots++
	g.mu.Unlock()
	g.h.log.Info("raftetcd: a group made over existing data took its first snapshot", "group", g.id, "index", applied)
}

// deferred reports whether err is the application deferring its snapshot
// (ErrSnapshotDeferred), an expected refusal retried like a failure: it is logged at
// debug level the first time only, until a snapshot is taken.
func (g *group) deferred(applied uint64, err error) bool {
	if !errors.Is(err, ErrSnapshotDeferred) {
		return false
	}
	if !g.deferSaid {
		g.deferSaid = true
		g.h.log.Debug("raftetcd: the application deferred a snapshot; trying again later", "group", g.id, "applied", applied, "err", err)
	}
	return true
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
//
// It returns false, and applies nothing, for an entry that does not follow the last one
// applied: the log store handed out a log that is not raft's, and a group applying it
// would diverge from its replicas (or, handed the same index again, loop on it for
// ever). The group then stops, as after a failed write.
func (g *group) apply(e raftpb.Entry) bool {
	prev := g.applied // written by this loop only (under mu, for the readers elsewhere)
	if e.Index != prev+1 {
		g.h.log.Error("raftetcd: the log store handed a committed entry that does not follow the last applied; group stopped",
			"group", g.id, "index", e.Index, "applied", prev)
		return false
	}
	defer func() {
		g.mu.Lock()
		g.applied = e.Index
		g.mu.Unlock()
	}()
	if e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2 {
		g.applyConfChange(e)
		return true
	}
	if e.Type != raftpb.EntryNormal {
		return true
	}
	if len(e.Data) == 0 {
		// A leader's first entry of its term: once it is applied here, so is everything
		// committed before it, and this node may serve as leader.
		g.mu.Lock()
		bs := g.rn.BasicStatus()
		lead := bs.RaftState == raft.StateLeader && bs.Term == e.Term && !g.leading
		if lead {
			g.leading = true
		}
		g.mu.Unlock()
		if lead {
			g.h.won.Add(1)
		}
		if lead && g.cfg.OnRole != nil {
			g.cfg.OnRole(true, e.Term)
		}
		return true
	}
	if len(e.Data) < 8 || e.Index <= g.skipTo {
		return true // not a proposal, or one the application holds already
	}
	pid := binary.BigEndian.Uint64(e.Data)
	res := g.applyData(e)
	g.mu.Lock()
	ch := g.waiters[pid]
	delete(g.waiters, pid)
	g.mu.Unlock()
	if ch != nil {
		ch <- proposal{index: e.Index, result: res}
	}
	return true
}

// applyData hands a normal entry's command (its data past the proposal id) to the
// application, and returns the application's result.
func (g *group) applyData(e raftpb.Entry) any {
	switch {
	case g.cfg.Apply != nil:
		return g.cfg.Apply(e.Index, e.Data[8:])
	case g.h.opts.Apply != nil:
		g.h.opts.Apply(g.id, e.Index, e.Data[8:])
	}
	return nil
}

// applyConfChange applies a committed membership change of the group.
func (g *group) applyConfChange(e raftpb.Entry) {
	var cc raftpb.ConfChangeI
	if e.Type == raftpb.EntryConfChange {
		var c raftpb.ConfChange
		if err := c.Unmarshal(e.Data); err != nil {
			g.h.log.Error("raftetcd: a committed configuration change does not parse; ignored", "group", g.id, "index", e.Index, "err", err)
			return
		}
		cc = c
	} else {
		var c raftpb.ConfChangeV2
		if err := c.Unmarshal(e.Data); err != nil {
			g.h.log.Error("raftetcd: a committed configuration change does not parse; ignored", "group", g.id, "index", e.Index, "err", err)
			return
		}
		cc = c
	}
	g.mu.Lock()
	g.confSeenLocked([]raftpb.Entry{e}, false)
	cs := g.rn.ApplyConfChange(cc)
	g.cs = *cs
	g.confChanged = true
	g.voters = votersOf(*cs)
	g.mu.Unlock()
	g.h.log.Info("raftetcd: group membership changed", "group", g.id, "index", e.Index, "voters", cs.Voters, "outgoing", cs.VotersOutgoing)
	// The appends that tell the followers this change committed were queued before it
	// was applied (the loop sends before it applies), and may wait for the next tick
	// (lazy). They go now: a follower that has not learned that the entry leaving a
	// joint configuration committed still needs a majority of the old voters to
	// elect a leader, and with an old voter gone for good (a wiped replica being
	// replaced), the leader's death in that window would leave the group without one
	// until it came back. Membership changes are rare; the frames cost nothing.
	g.h.flushAll()
}

// stepDown tells the application this node no longer leads (once per leadership).
func (g *group) stepDown() {
	g.mu.Lock()
	was := g.leading
	g.leading = false
	// The read index rounds asked while leading: raft dropped them with its
	// leadership and answers none. Their confirms end now, not at their deadlines (a
	// deposed leader that had not noticed waited out its caller's bound).
	for id, ch := range g.reads {
		delete(g.reads, id)
		close(ch)
	}
	g.mu.Unlock()
	if was && g.cfg.OnRole != nil {
		g.cfg.OnRole(false, 0)
	}
	g.appliedC.Broadcast()
}

// confirm is ConfirmLeader: a read index round, then a wait until it is applied.
func (g *group) confirm(ctx context.Context) error {
	ch := make(chan uint64, 1)
	g.mu.Lock()
	if g.rn.BasicStatus().RaftState != raft.StateLeader || !g.isVoterLocked() {
		// A leader whose own removal committed under its leadership leads on in
		// etcd-io/raft, but commits nothing; and its read index is answered without a
		// round when the configuration left has one voter (another node, which may
		// lead by now).
		g.mu.Unlock()
		return ErrNotLeader
	}
	id := g.askReadLocked()
	g.reads[id] = ch
	g.mu.Unlock()
	g.signal()
	var idx uint64
	select {
	case i, ok := <-ch:
		if !ok {
			return ErrNotLeader // stepped down before the round ended
		}
		idx = i
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.reads, id)
		g.mu.Unlock()
		return ctx.Err()
	case <-g.quit:
		return ErrClosed
	case <-g.h.quit:
		return ErrClosed
	}
	// Then the wait for the apply, which ends with ctx and with the group too: the
	// condition wakes on each apply, on a step down and when the loop ends (its
	// stepDown), and, from here, when ctx ends. Without that the wait outlived its
	// caller's deadline while nothing was applied (a stalled disk), and for ever once
	// the group closed under it, its raft still a leader.
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.appliedC.Broadcast()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.applied < idx {
		if g.rn.BasicStatus().RaftState != raft.StateLeader {
			return ErrNotLeader
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-g.quit:
			return ErrClosed
		case <-g.h.quit:
			return ErrClosed
		default:
		}
		g.appliedC.Wait()
	}
	if !g.leading {
		return ErrNotLeader
	}
	return nil
}

func (g *group) propose(ctx context.Context, data []byte, submitted func()) (uint64, any, error) {
	pid := g.h.nextProposal.Add(1)
	buf := make([]byte, 8+len(data))
	binary.BigEndian.PutUint64(buf, pid)
	copy(buf[8:], data)
	ch := make(chan proposal, 1)
	g.mu.Lock()
	if g.rn.BasicStatus().RaftState != raft.StateLeader {
		g.mu.Unlock()
		return 0, nil, ErrNotLeader
	}
	g.quiesced = false
	if err := g.rn.Propose(buf); err != nil {
		g.mu.Unlock()
		return 0, nil, ErrNotLeader // dropped: leadership is changing
	}
	g.waiters[pid] = ch
	g.mu.Unlock()
	if submitted != nil {
		submitted()
	}
	g.signal()
	select {
	case p := <-ch:
		return p.index, p.result, nil
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.waiters, pid)
		g.mu.Unlock()
		return 0, nil, ctx.Err()
	case <-g.quit:
		return 0, nil, ErrClosed
	case <-g.h.quit:
		return 0, nil, ErrClosed
	}
}

// commitWait is a proposal waiting for its commit: its index once the Ready loop saw
// it appended, the term it was proposed in, and where its outcome goes.
type commitWait struct {
	index, term uint64
	done        chan error
}

// proposeCommitted replicates data and returns once it is committed, without waiting
// for this node to apply it. A leader applies only what its own log holds durably
// (etcd-io/raft with asynchronous storage writes), so on a leader whose disk stalls a
// command its followers committed at once waits for its slow syncs before it is
// applied: a handover's leases (the L command) waited seconds, and the partition
// with them. ErrNotLeader when this node does not lead, or stops leading before it
// sees the commit (the command may then commit or not). Without asynchronous storage
// writes it is propose.
func (g *group) proposeCommitted(ctx context.Context, data []byte) (uint64, error) {
	if !g.h.opts.AsyncStorageWrites {
		idx, _, err := g.propose(ctx, data, nil)
		return idx, err
	}
	pid := g.h.nextProposal.Add(1)
	buf := make([]byte, 8+len(data))
	binary.BigEndian.PutUint64(buf, pid)
	copy(buf[8:], data)
	w := &commitWait{done: make(chan error, 1)}
	g.mu.Lock()
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader {
		g.mu.Unlock()
		return 0, ErrNotLeader
	}
	w.term = bs.Term
	g.quiesced = false
	if err := g.rn.Propose(buf); err != nil {
		g.mu.Unlock()
		return 0, ErrNotLeader // dropped: leadership is changing
	}
	if g.atCommit == nil {
		g.atCommit = map[uint64]*commitWait{}
	}
	g.atCommit[pid] = w
	g.atCommitN.Add(1)
	g.mu.Unlock()
	g.signal()
	forget := func() {
		g.mu.Lock()
		if _, ok := g.atCommit[pid]; ok {
			delete(g.atCommit, pid)
			g.atCommitN.Add(-1)
		}
		g.mu.Unlock()
	}
	select {
	case err := <-w.done:
		return w.index, err
	case <-ctx.Done():
		forget()
		return 0, ctx.Err()
	case <-g.quit:
		forget()
		return 0, ErrClosed
	case <-g.h.quit:
		forget()
		return 0, ErrClosed
	}
}

// noteProposed records the index of each entry a proposeCommitted caller waits for,
// as this leader's append of it goes to the append worker.
func (g *group) noteProposed(ents []raftpb.Entry) {
	if g.atCommitN.Load() == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range ents {
		if e.Type != raftpb.EntryNormal || len(e.Data) < 8 {
			continue
		}
		if w, ok := g.atCommit[binary.BigEndian.Uint64(e.Data)]; ok && e.Term == w.term {
			w.index = e.Index
		}
	}
}

// resolveCommittedLocked answers the proposeCommitted callers whose entry committed,
// and those whose leader term ended (the outcome unknown). A leader never replaces an
// entry of its own term, so an entry it appended in term t is the one at its index
// while it still leads in t.
func (g *group) resolveCommittedLocked() {
	if len(g.atCommit) == 0 {
		return
	}
	bs := g.rn.BasicStatus()
	for pid, w := range g.atCommit {
		var err error
		switch {
		case bs.RaftState != raft.StateLeader || bs.Term != w.term:
			err = ErrNotLeader
		case w.index != 0 && bs.Commit >= w.index:
		default:
			continue
		}
		w.done <- err
		delete(g.atCommit, pid)
		g.atCommitN.Add(-1)
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
	g.trimCacheLocked()
	if hbs := g.quiesceLocked(); hbs != nil {
		g.quiesced = true
		g.h.quiesces.Add(1)
		g.mu.Unlock()
		g.h.send(g.id, flagQuiesce, hbs)
		return
	}
	g.rn.Tick()
	if g.recampaign > 0 {
		g.recampaign--
		if bs := g.rn.BasicStatus(); bs.Lead != 0 {
			g.recampaign = 0
		} else if g.recampaign%3 == 0 && bs.RaftState != raft.StateCandidate && g.mayLead() {
			_ = g.rn.Campaign() // an error only means it cannot stand now
		}
	}
	g.mu.Unlock()
	g.signal()
}

// quiesceLocked returns the quiesce heartbeats when the group may quiesce: this node
// leads, nothing is in flight (no Ready pending, everything committed is applied, no
// leadership transfer), every follower has the whole log and is live.
func (g *group) quiesceLocked() []raftpb.Message {
	if g.h.opts.NoQuiesce || g.rn.HasReady() || len(g.waiters) > 0 || len(g.atCommit) > 0 {
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

// stepLocked steps m into raft. etcd-io/raft panics on a message its log cannot take
// (a heartbeat whose commit index is past the log's end: the leader counts on entries
// this replica no longer holds, as when a learner's copy was deleted and it joined
// again under the same id). The panic is the message's refusal here: this replica
// goes on with what it holds, where a panic left the group's lock held and stopped
// every group on the node (a review, 5 December).
//
// The heartbeat is answered with a refused append that says where this replica's log
// ends, which the leader reads as a learner that lost its log (lostLearnerLocked): an
// idle group sends nothing else, and its learner stayed empty while the leader
// counted it caught up (a review of that fix). A panic on any other message (a
// storage read that failed, in raft's own code) stops the group, as a failed write
// does: it had ended the process before.
func (g *group) stepLocked(m raftpb.Message) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		err = fmt.Errorf("raftetcd: raft refused a message: %v", r)
		if m.Type != raftpb.MsgHeartbeat {
			g.h.log.Error("raftetcd: raft failed on a message; group stopped", "group", g.id, "type", m.Type.String(), "from", m.From, "err", err)
			g.breakOnce.Do(func() { close(g.broken) })
			return
		}
		if now := time.Now(); now.Sub(g.refusedAt) >= time.Second {
			g.refusedAt = now
			g.h.log.Error("raftetcd: a heartbeat's commit index is past this replica's log (its leader counts on entries it lacks); dropped, and the leader told where the log ends",
				"group", g.id, "from", m.From, "term", m.Term, "commit", m.Commit, "err", err)
		}
		last, lerr := g.st.LastIndex()
		if lerr != nil {
			return
		}
		g.h.send(g.id, 0, []raftpb.Message{{Type: raftpb.MsgAppResp, To: m.From, From: g.h.opts.ID, Term: m.Term,
			Index: m.Commit, Reject: true, RejectHint: last}})
	}()
	return g.rn.Step(m)
}

// lostLearnerLocked reports whether m, an append refused by a learner, says the
// learner's log ends before entries it acknowledged: its copy was lost (deleted when a
// move to it was cancelled, and it joined again under the same id). etcd-io/raft never
// lowers what it knows a member holds, so it would send that learner appends it
// cannot take, and heartbeats past its log's end, for ever. A learner never votes, so
// losing its log loses nothing: it is removed and added again (resetLearner).
func (g *group) lostLearnerLocked(m raftpb.Message) bool {
	if g.rn.BasicStatus().RaftState != raft.StateLeader {
		return false
	}
	pr, ok := g.rn.Status().Progress[m.From]
	return ok && pr.IsLearner && m.RejectHint < pr.Match
}

// step hands a message from a peer to raft. A quiesce heartbeat from the current
// leader, with the follower's log caught up to it, quiesces the follower. Any other
// message wakes a quiesced group, except the answers to quiesce heartbeats and the
// answers to appends that leave the leader nothing to do (the leader stays asleep),
// and pre-votes to a follower (its leader is alive, by liveness, so the pre-vote would
// be refused anyway; the leader, which gets one too, wakes and tells the candidate).
func (g *group) step(flags byte, m raftpb.Message) {
	if m.Type == raftpb.MsgTransferLeader {
		// A transfer is asked of the leader's own host (TransferLeader), which first
		// gives up its lease; one forwarded by a follower would skip that.
		return
	}
	if m.Type == raftpb.MsgTimeoutNow && !g.mayLead() {
		// The leader hands its leadership over after an election timeout of no
		// answer, and leads on.
		g.h.log.Warn("raftetcd: a replica that may not lead now refused the leadership handed to it", "group", g.id, "from", m.From)
		return
	}
	g.mu.Lock()
	if m.Type == raftpb.MsgVote && g.holdingLocked(m, monoNanos()) {
		// Its leader spoke within the hold: the vote waits for the hold's end, and is
		// stepped then if the leader stayed silent. A leader under a lease drops it:
		// a candidate still standing asks again (lease.go).
		if g.rn.BasicStatus().RaftState != raft.StateLeader {
			g.holdLocked(m)
		}
		g.mu.Unlock()
		return
	}
	if m.Type == raftpb.MsgAppResp && m.Reject && g.lostLearnerLocked(m) {
		go g.h.resetLearner(g.id, m.From)
	}
	if err := g.stepLocked(m); err != nil {
		g.mu.Unlock()
		return
	}
	g.steppedLocked(flags, m)
	switch {
	case flags&flagQuiesce != 0:
		bs := g.rn.BasicStatus()
		// Not while this node counts the leader dead: a takeover its hold deferred
		// was dropped because the leader still spoke, and a quiesced follower neither
		// ticks nor answers pre-votes, so a real death then would elect nobody.
		if bs.RaftState == raft.StateFollower && bs.Lead == m.From && bs.Term == m.Term && bs.Commit == m.Commit &&
			g.h.peerLive(m.From) {
			g.quiesced = true
		}
	case m.Type == raftpb.MsgHeartbeatResp:
	case m.Type == raftpb.MsgPreVote && g.rn.BasicStatus().RaftState == raft.StateFollower:
	case m.Type == raftpb.MsgAppResp && !m.Reject && g.quiesced && !g.rn.HasReady():
		// A quiesced leader's answer to an append that changed nothing: the commit
		// index sent lazily (host.lazy) just before the quiesce heartbeats, which
		// carry it too. Waking for it cost an idle leader another tick and another
		// round of quiesce heartbeats after every lone write.
	default:
		g.quiesced = false
	}
	g.mu.Unlock()
	g.signal()
}

// leaderDown wakes the group when dead led it; when designated, this node campaigns at
// once, as a leadership transfer from the dead leader would have it do.
func (g *group) leaderDown(dead uint64) {
	g.mu.Lock()
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateFollower || bs.Lead != dead {
		g.mu.Unlock()
		return
	}
	designated := true
	for _, id := range g.voters {
		if id != dead && id < g.h.opts.ID && g.h.isLive(id) {
			designated = false
		}
	}
	g.quiesced = false
	if designated && g.mayLead() {
		if g.heardRecentlyLocked(monoNanos()) {
			// It spoke to this replica within the hold: it may still hold a lease
			// (this node's liveness calls may be what fails, or it restarted and
			// leads again), so the campaign waits for the hold to end with the leader
			// still silent (lease.go).
			g.deferForceLocked(dead)
		} else {
			g.forceCampaignLocked(dead)
		}
	}
	g.mu.Unlock()
	g.signal()
}

// forceCampaignLocked makes this replica stand at once, as a leadership transfer from
// its dead leader would have it do, if it still follows that leader.
func (g *group) forceCampaignLocked(dead uint64) {
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateFollower || bs.Lead != dead || !g.mayLead() {
		return
	}
	if g.rn.Step(raftpb.Message{Type: raftpb.MsgTimeoutNow, From: dead, To: g.h.opts.ID, Term: bs.Term}) == nil {
		g.h.forced.Add(1)
	}
}

func (g *group) wakeIfLeader() {
	g.mu.Lock()
	if g.rn.BasicStatus().RaftState == raft.StateLeader {
		g.quiesced = false
	}
	g.mu.Unlock()
}

// votersOf is every voter of cs, the outgoing ones of a joint configuration too, in
// order and once each.
func votersOf(cs raftpb.ConfState) []uint64 {
	vs := append(append([]uint64(nil), cs.Voters...), cs.VotersOutgoing...)
	sort.Slice(vs, func(i, j int) bool { return vs[i] < vs[j] })
	return slices.Compact(vs)
}
