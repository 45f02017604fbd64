package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// ErrMoveNotFound: no move of that id.
var ErrMoveNotFound = errors.New("move not found")

// ErrMemberNotFound: no member of that node id.
var ErrMemberNotFound = errors.New("member not found")

// Move statuses, in the order a move goes through them. A move can be cancelled
// only while copying; once switching, it finishes.
const (
	MoveCopying   = "copying"   // the new replica is being added and caught up
	MoveSwitching = "switching" // the replica set is switched in the control plane; the partition's group follows
	MoveRemoving  = "removing"  // the group runs on the new set; the old replica deletes its copy
	MoveDone      = "done"
	MoveCancelled = "cancelled"
	MoveFailed    = "failed"
)

// MoveInfo is one move of a partition replica.
type MoveInfo struct {
	ID        string
	Topic     string
	Partition int32
	// From is the node whose replica goes ("" when a replica is only added: a raised
	// replication factor); To the node that gets one ("" when a replica is only
	// removed: a lowered replication factor).
	From, To string
	Status   string
	// Reason says why a move failed or was cancelled ("" otherwise).
	Reason string
	// Cause is what started it: request, decommission, replace, rebalance or
	// replication_factor.
	Cause string
	// Progress is the share (0 to 1) of the partition's log the new replica holds;
	// Lag the messages it is behind while copying.
	Progress float64
	Lag      uint64
	// CreatedAtMs and UpdatedAtMs are when the move started and last changed status.
	CreatedAtMs, UpdatedAtMs int64
}

// ForceLeaderResult is the answer of a forced takeover.
type ForceLeaderResult struct {
	// PossiblyLostAtLeast is the highest high watermark any replica reported to the
	// control plane minus the survivor's log end: a lower bound of the messages lost.
	PossiblyLostAtLeast uint64
	// Replicas is the partition's replica set right after the takeover.
	Replicas []string
}

func moveInfo(m meta.Move) MoveInfo {
	return MoveInfo{ID: strconv.FormatUint(m.ID, 10), Topic: m.Topic, Partition: m.Partition, From: m.From, To: m.To,
		Status: m.Status, Reason: m.Reason, Cause: m.Cause, Progress: m.Progress, Lag: m.Lag,
		CreatedAtMs: m.CreatedAtMs, UpdatedAtMs: m.UpdatedAtMs}
}

// clusterOnly refuses the membership operations on a lone node (no node plane).
func (b *Broker) clusterOnly(what string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if b.repl == nil {
		return &ConflictError{Msg: what + " needs a cluster: this node runs alone (start it with --peers or --join)"}
	}
	return nil
}

// StartMove moves the replica of partition p of topic from node from to node to. An
// identical move already under way is returned as it is (a retry). Errors:
// ErrTopicNotFound, ErrPartitionNotFound, ErrMemberNotFound (from or to unknown),
// *ConflictError (to dead or already a replica, from not a replica, another move of
// the partition under way, the cluster version too old), ErrUnavailable.
func (b *Broker) StartMove(ctx context.Context, topic string, p int32, from, to string) (MoveInfo, error) {
	if err := b.clusterOnly("moving a partition"); err != nil {
		return MoveInfo{}, err
	}
	if err := checkName(topic); err != nil {
		return MoveInfo{}, err
	}
	if err := b.meta.Sync(ctx); err != nil {
		return MoveInfo{}, mapMetaErr(err)
	}
	m, ok := b.meta.Topic(topic)
	if !ok {
		return MoveInfo{}, ErrTopicNotFound
	}
	if p < 0 || p >= m.Partitions {
		return MoveInfo{}, ErrPartitionNotFound
	}
	for _, n := range []string{from, to} {
		if _, ok := b.meta.Member(n); !ok {
			return MoveInfo{}, fmt.Errorf("%w: no member %q; list them with GET /v1/cluster/members", ErrMemberNotFound, n)
		}
	}
	if from == to {
		return MoveInfo{}, &ConflictError{Msg: fmt.Sprintf("from and to are both %s; a move needs two different nodes", from)}
	}
	mv, err := b.meta.StartMove(meta.Move{Topic: topic, Incarnation: m.Incarnation, Partition: p, From: from, To: to, Cause: meta.CauseRequest})
	if err != nil {
		return MoveInfo{}, mapMetaErr(err)
	}
	return moveInfo(mv), nil
}

// Moves lists every move the control plane holds, newest first.
func (b *Broker) Moves(ctx context.Context) ([]MoveInfo, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	ms := b.meta.Moves()
	out := make([]MoveInfo, 0, len(ms))
	for _, m := range ms {
		out = append(out, moveInfo(m))
	}
	return out, nil
}

// CancelMove cancels move id while it is copying. Errors: ErrMoveNotFound;
// *ConflictError once it switched (or ended).
func (b *Broker) CancelMove(ctx context.Context, id string) error {
	if err := b.clusterOnly("cancelling a move"); err != nil {
		return err
	}
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || n == 0 {
		return fmt.Errorf("%w: move ids are the numbers GET /v1/cluster/moves lists", ErrMoveNotFound)
	}
	if _, err := b.meta.SetMoveStatus(n, meta.MoveCancelled, "cancelled on request"); err != nil {
		return mapMetaErr(err)
	}
	return nil
}

// Decommission starts moving every replica off node and removes it once it holds
// nothing; a dead node's replicas are re-replicated from the survivors. A repeat
// returns the member as it is. Errors: ErrMemberNotFound; *ConflictError (the last
// node, or no live node to take a replica).
func (b *Broker) Decommission(ctx context.Context, node string) (MemberInfo, error) {
	if err := b.ensureReady(); err != nil {
		return MemberInfo{}, err
	}
	if _, ok := b.meta.Member(node); !ok && b.repl == nil {
		return MemberInfo{}, fmt.Errorf("%w: no member %q; list them with GET /v1/cluster/members", ErrMemberNotFound, node)
	}
	if err := b.clusterOnly("decommissioning a node"); err != nil {
		return MemberInfo{}, err
	}
	if err := b.meta.Sync(ctx); err != nil {
		return MemberInfo{}, mapMetaErr(err)
	}
	m, err := b.meta.Decommission(node)
	if err != nil {
		return MemberInfo{}, mapMetaErr(err)
	}
	l := b.meta.MemberLoads()[m.ID]
	return MemberInfo{Member: m, PartitionsHeld: l.Held, PartitionsLed: l.Led}, nil
}

// Rebalance starts the moves that even out replicas over the members (a bounded
// number at once; the controller starts the rest as those finish when auto-rebalance
// is on) and returns those it started.
func (b *Broker) Rebalance(ctx context.Context) ([]MoveInfo, error) {
	if err := b.clusterOnly("rebalancing"); err != nil {
		return nil, err
	}
	if err := b.meta.Sync(ctx); err != nil {
		return nil, mapMetaErr(err)
	}
	ms, err := b.meta.Rebalance()
	out := make([]MoveInfo, 0, len(ms))
	for _, m := range ms {
		out = append(out, moveInfo(m))
	}
	return out, mapMetaErr(err)
}

// ForceLeader makes the replica on node the only member of partition p's new
// replica set (then grown back to the topic's replication factor), for a partition
// that lost its quorum for good. Errors: ErrTopicNotFound, ErrPartitionNotFound,
// ErrMemberNotFound, *ConflictError (node holds no replica of it, or is not live).
//
// PossiblyLostAtLeast is the highest log end any replica reported to the controller
// (in heartbeats, this controller's term) minus the survivor's log end once it leads
// the new group: a lower bound, logged with the takeover.
func (b *Broker) ForceLeader(ctx context.Context, topic string, p int32, node string) (ForceLeaderResult, error) {
	if err := b.clusterOnly("a forced takeover"); err != nil {
		return ForceLeaderResult{}, err
	}
	if err := checkName(topic); err != nil {
		return ForceLeaderResult{}, err
	}
	if err := b.meta.Sync(ctx); err != nil {
		return ForceLeaderResult{}, mapMetaErr(err)
	}
	m, ok := b.meta.Topic(topic)
	if !ok {
		return ForceLeaderResult{}, ErrTopicNotFound
	}
	if p < 0 || p >= m.Partitions || int(p) >= len(m.Placement) {
		return ForceLeaderResult{}, ErrPartitionNotFound
	}
	mem, ok := b.meta.Member(node)
	if !ok {
		return ForceLeaderResult{}, fmt.Errorf("%w: no member %q; list them with GET /v1/cluster/members", ErrMemberNotFound, node)
	}
	pl := m.Placement[p]
	if !slices.Contains(pl.Replicas, node) {
		return ForceLeaderResult{}, &ConflictError{Msg: fmt.Sprintf("node %s holds no replica of partition %d of topic %s (its replicas: %v); name one that does", node, p, topic, pl.Replicas)}
	}
	if mem.Status != meta.StatusAlive {
		return ForceLeaderResult{}, &ConflictError{Msg: fmt.Sprintf("node %s is %s; a forced takeover needs a live replica", node, mem.Status)}
	}
	if !b.meta.Allows(meta.FeatureMoves) {
		return ForceLeaderResult{}, mapMetaErr(fmt.Errorf("%w: a forced takeover needs cluster version %d and the cluster runs %d", meta.ErrVersionGated, meta.FeatureMoves.Since, b.meta.ClusterVersion()))
	}
	before := groupOf(&m, int(p))
	reported, err := b.meta.MaxReportedEnd(ctx, before)
	if err != nil {
		return ForceLeaderResult{}, mapMetaErr(err)
	}
	nt, err := b.forceLeaderMeta(ctx, topic, m.Incarnation, p, node, pl.Forced)
	if err != nil {
		return ForceLeaderResult{}, mapMetaErr(err)
	}
	res := ForceLeaderResult{Replicas: slices.Clone(nt.Placement[p].Replicas)}
	// The survivor's log end, read from it once it leads the new group.
	t, err := b.lookup(topic)
	if err != nil {
		return res, err
	}
	end, err := b.survivorEnd(ctx, t, int(p), node, groupOf(&nt, int(p)))
	if err != nil {
		return res, err
	}
	if reported > end {
		res.PossiblyLostAtLeast = reported - end
	}
	b.log.Error("forced takeover of a partition that lost its quorum: messages only the lost replicas held are lost",
		"topic", topic, "partition", p, "node", node, "possibly_lost_at_least", res.PossiblyLostAtLeast, "highest_reported_end", reported, "survivor_end", end)
	return res, nil
}

// forceLeaderMeta commits the takeover in the metadata. When the write's outcome is
// unknown (the controller lost its leadership or stopped while holding it, which a
// loaded cluster may see at any time), it catches up with the next controller, which
// settles the outcome: a takeover that took effect shows in the placement (a new
// Forced index) and is answered; one that did not is sent again. It is never sent
// again blindly: once the replica set grows back, a second takeover would replace
// the new group and refuse its new members. before is the partition's Forced index
// when the call began.
func (b *Broker) forceLeaderMeta(ctx context.Context, topic string, incarnation uint64, p int32, node string, before uint64) (meta.Topic, error) {
	write := b.meta.ForceLeader
	if b.forceLeaderWrite != nil {
		write = b.forceLeaderWrite
	}
	nt, err := write(topic, incarnation, p, node)
	if !errors.Is(err, meta.ErrOutcomeUnknown) {
		return nt, err
	}
	b.log.Warn("a forced takeover's metadata write has an unknown outcome; asking the next controller", "topic", topic, "partition", p, "node", node, "err", err)
	// Bounded as the wait for the survivor to lead is (survivorEnd): the answer stays
	// 503 timeout when no controller settles it by then.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for errors.Is(err, meta.ErrOutcomeUnknown) {
		if serr := b.meta.Sync(sctx); serr != nil {
			select {
			case <-sctx.Done():
				return nt, err
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		cur, ok := b.meta.Topic(topic)
		if !ok || cur.Incarnation != incarnation || int(p) >= len(cur.Placement) {
			return meta.Topic{}, meta.ErrTopicNotFound // deleted meanwhile
		}
		if cur.Placement[p].Forced != before {
			return cur, nil
		}
		nt, err = write(topic, incarnation, p, node)
	}
	return nt, err
}

// survivorEnd is the log end of partition p of t on node, read from it once it leads
// group, the group a forced takeover started there. Only that node's answer counts:
// until the replicas of the replaced group apply the takeover, its leader still serves
// the partition (the takeover is for a group that lost its majority, but an operator
// may take over one that did not), and its log end is not the survivor's. Reading it
// instead reported no loss where the survivor lacked messages, and returned before the
// survivor led.
func (b *Broker) survivorEnd(ctx context.Context, t *topic, p int, node, group string) (uint64, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if group == "" {
			// Not a group (one replica, never replicated: the takeover changed
			// nothing): read where it is held.
			if st, err := b.statsOf(ctx, t, p); err == nil {
				return st.End, nil
			}
		} else if node == b.opts.NodeID {
			if lp, err := b.inGroup(t, p, group); err == nil {
				if st, _, err := b.localStats(t, p, lp); err == nil {
					return st.End, nil
				}
			}
		} else {
			req := b.dataReq(t, dataStats, p)
			req.Group = group
			if resp, err := b.call(ctx, node, req, remoteCallTimeout); err == nil && resp.Err == nil && resp.Stats != nil {
				return resp.Stats.End, nil
			}
		}
		if cur, ok := b.meta.Topic(t.name); !ok || cur.Incarnation != t.incarnation {
			// Deleted meanwhile: the survivor will never lead it, and waiting on would
			// end in a 503 that says to look at a node.
			return 0, fmt.Errorf("%w: topic %q was deleted while the takeover waited for node %s to lead it", ErrTopicNotFound, t.name, node)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%w: the takeover is committed, but node %s did not lead the partition within 30 s; its log end (and so the loss) is unknown", ErrUnavailable, node)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// alterReplicationFactor records topic's new replica count; the controller's moves
// follow (docs/operating/cluster.md).
func (b *Broker) alterReplicationFactor(name string, inc uint64, rf int32) error {
	changes, err := b.checkReplicationFactor(name, rf)
	if err != nil || !changes {
		return err
	}
	_, err = b.meta.SetReplicationFactor(name, inc, rf)
	return mapMetaErr(err)
}

// checkReplicationFactor refuses a replication factor this node can tell is not to be
// had, and reports whether rf changes the topic's.
func (b *Broker) checkReplicationFactor(name string, rf int32) (bool, error) {
	if rf < 1 || rf > MaxReplicationFactor {
		return false, invalid(apigen.ErrorCodeInvalidParameter, "replication_factor must be 1 to %d", MaxReplicationFactor)
	}
	if b.repl == nil {
		if rf == 1 {
			return false, nil
		}
		return false, &ConflictError{Msg: "replication_factor above 1 needs a cluster: this node runs alone (start it with --peers or --join)"}
	}
	m, ok := b.meta.Topic(name)
	if !ok {
		return false, ErrTopicNotFound
	}
	if rf == m.ReplicationFactor {
		return false, nil
	}
	for i, p := range m.Placement {
		if len(p.Replicas) == 1 && rf > 1 && !b.meta.Allows(meta.FeatureGroupOnData) {
			// Unavailable until the rolling upgrade ends, as every gated feature
			// (docs/operating/upgrades.md), not a conflict a client gives up on.
			return false, mapMetaErr(fmt.Errorf("%w: partition %d of topic %s has a single replica; raising its replication factor needs cluster version %d and the cluster runs %d (finish the rolling upgrade first)",
				meta.ErrVersionGated, i, name, meta.FeatureGroupOnData.Since, b.meta.ClusterVersion()))
		}
	}
	return true, nil
}

// steerMoves is the partition leader's and the replicas' part in moves, run every
// second: a leader adds the learners its placement names, reports their progress,
// switches a move once its learner caught up, and marks it removing once the group
// runs on the new replica set; the old replica then deletes its copy (followPlacement).
func (b *Broker) steerMoves(t *topic, i int, info raftetcd.GroupInfo, mv meta.Move, hasMove bool) {
	if !hasMove || !info.Leader {
		return
	}
	m := t.cur.Load()
	switch mv.Status {
	case meta.MoveCopying:
		to, ok := b.meta.Member(mv.To)
		if !ok {
			return
		}
		id := raftID(to.ServerID)
		if !slices.Contains(info.Learners, id) {
			return // reconcileVoters adds it first
		}
		match := info.Match[id]
		lp := t.parts()[i]
		if lp == nil {
			return
		}
		hw := lp.Stats().End
		off := min(lp.OffsetAtIndex(match), hw)
		lag := hw - off
		progress := 1.0
		if hw > 0 {
			progress = float64(off) / float64(hw)
		}
		// Caught up: it acknowledged entries (a learner of a compacted log only after it
		// restored the snapshot), and is within learnerSlack of the leader's log. A
		// learner that acknowledged nothing never counts, however short the log.
		if match > 0 && match+1 >= info.FirstIndex && match+learnerSlack >= info.Last {
			if _, err := b.meta.SwitchMove(mv.ID); err != nil {
				b.log.Warn("switching a move's replica set failed; retrying", "move", mv.ID, "topic", t.name, "partition", i, "err", err)
				return
			}
			b.log.Info("a move's new replica caught up; switched the partition's replica set", "move", mv.ID, "topic", t.name, "partition", i, "from", mv.From, "to", mv.To)
			return
		}
		if mv.Progress != progress || mv.Lag != lag {
			b.moveReports.Lock()
			if b.moveReports.at == nil || len(b.moveReports.at) > 1024 {
				b.moveReports.at = map[uint64]time.Time{} // bounded: a report is only paced
			}
			last := b.moveReports.at[mv.ID]
			due := time.Since(last) >= moveReportEvery
			if due {
				b.moveReports.at[mv.ID] = time.Now()
			}
			b.moveReports.Unlock()
			if due {
				_ = b.meta.MoveProgress(mv.ID, progress, lag) // a report; the next one follows
			}
		}
	case meta.MoveSwitching:
		want, known := b.voters(m.Placement[i].Replicas)
		if !known || info.Joint || len(info.Learners) > 0 || !slices.Equal(want, info.Voters) {
			return
		}
		next := meta.MoveRemoving
		if mv.From == "" {
			next = meta.MoveDone
		}
		if _, err := b.meta.SetMoveStatus(mv.ID, next, ""); err != nil {
			b.log.Warn("recording a move's progress failed; retrying", "move", mv.ID, "err", err)
		}
	}
}

// learnerSlack is how many entries behind the leader's log a learner may be when
// its move switches: it is caught up in all but the last few proposals.
const learnerSlack = 64

// moveReportEvery bounds how often a leader records a move's progress.
const moveReportEvery = 2 * time.Second

// leaveLeadership hands the leadership of partition i of t, if this node leads it,
// to the most caught-up other voter, and reports whether this node no longer leads.
// A leader must not simply close its group: its followers, quiet while the group is
// idle, would go on counting it as their leader as long as its node is alive.
func (b *Broker) leaveLeadership(t *topic, i int, why string) bool {
	if !t.leads(i) {
		return true
	}
	info, ok := b.repl.host.Info(t.gid(i))
	if !ok {
		return false
	}
	var others []uint64
	b.repl.mu.Lock()
	for _, id := range info.Voters {
		if b.repl.nodes[id] != b.opts.NodeID {
			others = append(others, id)
		}
	}
	b.repl.mu.Unlock()
	b.handOverTo(t, i, info, others, why)
	return !t.leads(i)
}

// rebuildReplica closes this node's replica of partition i of t, which met a damaged
// record while it served or could not write a committed command (and no longer
// leads), and sets its data aside: the caller
// opens it again empty, and its group rebuilds it from the intact copies (applying its
// log again, or restoring a snapshot and fetching the messages). If the data cannot be
// set aside, the replica opens again as it is, and the next damaged record it meets
// asks again.
func (b *Broker) rebuildReplica(t *topic, i int, lp *partition.Partition) {
	b.log.Error("a replica met a damaged record or failed a write while serving; it is set aside in damaged/ and rebuilt from the partition's group",
		"topic", t.name, "partition", i)
	if old := t.openedAs[i]; old != "" {
		b.repl.host.CloseGroup(old)
	}
	t.setPart(i, nil)
	_ = lp.Close() // its data is being set aside; the rebuilt replica is what counts
	t.sig.broadcast()
	if err := partition.DiscardData(nil, filepath.Join(t.dir, strconv.Itoa(i))); err != nil {
		b.log.Error("setting aside a damaged replica's data failed; it is opened again as it is", "topic", t.name, "partition", i, "err", err)
	} else {
		b.metrics.ReplicaRebuilds.WithLabelValues(t.name).Inc()
	}
}

// followPlacement makes this node hold what the placement gives it: it opens the
// replicas a move added here, and deletes the ones a move took away, but only on
// the control plane's word (a move from here that is removing, or a move here that
// was cancelled), confirmed current by a read of the controller. A replica no longer
// placed here for another reason (a forced takeover) is closed and its data kept.
func (b *Broker) followPlacement() {
	if b.repl == nil {
		return
	}
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	ts := b.topicList()
	moves := b.meta.Moves()
	synced := false
	for _, t := range ts {
		select {
		case <-t.done:
			continue
		default:
		}
		m := *t.cur.Load()
		for i, lp := range t.parts() {
			want := b.holds(m, int32(i))
			if want && lp != nil && t.takeRebuild(i) {
				if b.leaveLeadership(t, i, "its replica here is rebuilt") {
					b.rebuildReplica(t, i, lp)
					lp = nil // opened again below
				} else {
					t.markRebuild(i) // still leading: tried again at the next pass
				}
			}
			if want && lp != nil && t.openedAs[i] != groupOf(&m, i) {
				// Its group changed (made over its data, or taken over by force):
				// reopened in the new one, its data kept. A group replaced by force
				// lost its majority for good: on the survivor, the reopening applies
				// what the replaced group's log holds, committed or not, before the new
				// group starts (openReplica's applyReplacedLog, as at a start), so that
				// the new group starts from everything the survivor held (entries it had
				// recorded with a majority among them); a write failing there fails the
				// opening, tried again at the next pass, and the new group never starts
				// without them. A replica the takeover left out that a move placed here
				// again joins the new group afresh (openReplica sets its copy aside):
				// the old log is nothing to it.
				if old := t.openedAs[i]; old != "" {
					if b.soleOverData(m.Placement[i]) {
						failpoint.Inject(failpoint.ReplicaTakeover)
						t.openedAs[i] = "" // opened afresh: openReplica applies the old log
					}
					b.repl.host.CloseGroup(old)
				}
				t.setPart(i, nil)
				_ = lp.Close() // reopened at once below
				b.log.Info("reopening a partition in its new group", "topic", t.name, "partition", i, "now", groupOf(&m, i))
				lp = nil
			}
			switch {
			case want && lp == nil && b.leftClosed(t, i, groupOf(&m, i)):
				// Its group's own log is damaged: it stays closed (leaveClosed).
			case !want && lp == nil && b.switchingFrom(moves, t, m, i):
				// A move from here is switching: the group's joint change needs the old
				// replica set's majority too, so this replica must take part although
				// its placement no longer names it. A node that started again in that
				// window (a crash, a rolling restart) did not open it at its start; with
				// two replicas the group then had no majority for good, and the move
				// never ended (a review, 6 December). Opened as it was; deleted once
				// the move is removing.
				p, err := b.openPart(t, m, int32(i))
				if err != nil {
					b.log.Warn("opening the replica a switching move takes off this node failed; retrying at the next placement pass", "topic", t.name, "partition", i, "err", err)
					continue
				}
				b.placePart(t, i, p, m)
				b.log.Info("opened the replica a switching move takes off this node: its group may still count it", "topic", t.name, "partition", i)
				t.sig.broadcast()
			case !want && lp == nil:
				b.forgetClosed(t, i)
			case want && lp == nil:
				p, err := b.openPart(t, m, int32(i))
				if err != nil && b.leaveClosed(t, m, i, err) {
					continue
				}
				if err != nil {
					b.log.Warn("opening a replica placed here (by a move, or again in a new group) failed; retrying at the next placement pass", "topic", t.name, "partition", i, "err", err)
					continue
				}
				b.placePart(t, i, p, m)
				b.log.Info("opened a replica a move placed here", "topic", t.name, "partition", i)
				t.sig.broadcast()
			case !want && lp != nil:
				mv, act := leftBy(moves, b.opts.NodeID, t, i)
				if !synced {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					err := b.meta.Sync(ctx)
					cancel()
					if err != nil {
						b.log.Warn("a replica no longer placed here waits until the metadata is confirmed current", "topic", t.name, "partition", i, "err", err)
						continue
					}
					synced = true
					moves = b.meta.Moves()
					mv, act = leftBy(moves, b.opts.NodeID, t, i)
				}
				if cur, ok := b.meta.Topic(t.name); ok && cur.Incarnation == t.incarnation && b.holds(cur, int32(i)) {
					continue // placed here after all: this view was behind, the next pass has it
				}
				if act == leaveDelete && !b.leaveLeadership(t, i, "its replica here leaves the partition") {
					// It may lead still, although the group's configuration no longer
					// counts it (its removal committed under its own leadership, when it
					// was elected before that entry committed: raft keeps such a leader
					// leading). Closed so, it left its followers quiesced under a leader
					// gone silent, and the partition had no leader for good (a review, 5
					// December). Deleted only once another voter leads; tried again at
					// the next pass.
					b.log.Warn("a replica leaving its partition still leads it; it hands the leadership over before its copy is deleted", "topic", t.name, "partition", i)
					continue
				}
				switch act {
				case leaveOpen:
					continue
				case leaveClose:
					b.closeReplica(t, i)
					t.setPart(i, nil)
					_ = lp.Close() // closed for good here; its data stays on disk
					b.log.Warn("closed a replica no longer placed here; its data is kept", "topic", t.name, "partition", i)
					continue
				}
				b.closeReplica(t, i)
				t.setPart(i, nil)
				_ = lp.Close()             // its data is deleted next
				_ = b.removeCopy(t, i, mv) // on failure the copy stays on disk, logged; removeUnopened tries again
				if mv.Status == meta.MoveRemoving && mv.From == b.opts.NodeID {
					b.moveDone(mv)
				}
			}
		}
	}
	b.removeUnopened(ts, moves)
}

// placePart makes p, opened from the topic's settings m, partition i of t here. An
// alter applied while it opened (reconcile does not wait for the placement pass) found
// no partition i to change, and the replica kept the settings from before it until the
// next alter: they are pushed to it now. applySettings stores the settings before it
// reads the partitions, so either it sees p or the loads below see its settings (and
// one racing this push is pushed again after it).
func (b *Broker) placePart(t *topic, i int, p *partition.Partition, m meta.Topic) {
	t.setPart(i, p)
	t.openedAs[i] = groupOf(&m, i)
	for cur := t.cur.Load(); !sameTopic(*cur, m); cur = t.cur.Load() {
		p.SetConfig(queueConfig(*cur))
		m = *cur
	}
}

// switchingFrom reports whether partition i of t (placed as m), not open here, is the
// source of a move that is switching, with its copy still on this node's disk.
func (b *Broker) switchingFrom(moves []meta.Move, t *topic, m meta.Topic, i int) bool {
	if !b.replicated(&m, i) {
		return false
	}
	if _, act := leftBy(moves, b.opts.NodeID, t, i); act != leaveOpen {
		return false
	}
	_, err := os.Stat(filepath.Join(b.partDir(t, i), raftDirOf(&m, i)))
	return err == nil
}

// removeUnopened finishes the moves off this node whose replica is not open here: the
// node restarted after the switch (a replica no longer placed here is not opened), or
// was away when the controller ended the move. It also deletes the copy a move to this
// node left when it was cancelled or failed while the node was down (the controller
// fails a copying move whose target died): that learner never voted. Its data is
// deleted on the same word as an open one's (leftBy), after a read of the controller.
func (b *Broker) removeUnopened(ts []*topic, moves []meta.Move) {
	self := b.opts.NodeID
	synced := false
	for _, mv := range moves {
		fromHere := mv.From == self && (mv.Status == meta.MoveRemoving || mv.Status == meta.MoveDone)
		// As leftBy: a move a forced takeover failed leaves its target's copy kept.
		learnerHere := mv.To == self && (mv.Status == meta.MoveCancelled ||
			(mv.Status == meta.MoveFailed && mv.Reason != meta.ReasonTakenOverByForce))
		if !fromHere && !learnerHere {
			continue
		}
		var t *topic
		for _, x := range ts {
			if x.name == mv.Topic && x.incarnation == mv.Incarnation {
				t = x
			}
		}
		if t == nil || int(mv.Partition) >= len(t.parts()) || t.parts()[mv.Partition] != nil || b.holds(*t.cur.Load(), mv.Partition) {
			continue
		}
		dir := b.partDir(t, int(mv.Partition))
		_, statErr := os.Stat(dir)
		if (mv.Status == meta.MoveDone || learnerHere) && statErr != nil {
			continue // nothing left to do
		}
		if !synced {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := b.meta.Sync(ctx)
			cancel()
			if err != nil {
				return
			}
			synced = true
		}
		if _, act := leftBy(b.meta.Moves(), self, t, int(mv.Partition)); act != leaveDelete {
			continue
		}
		if statErr == nil && b.removeCopy(t, int(mv.Partition), mv) != nil {
			continue
		}
		if mv.Status == meta.MoveRemoving {
			b.moveDone(mv)
		}
	}
}

// removeCopy deletes this node's copy of partition i of t, which move mv took off it.
func (b *Broker) removeCopy(t *topic, i int, mv meta.Move) error {
	dir := b.partDir(t, i)
	if err := b.checkpointWAL("deleting a moved replica's data"); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		b.log.Error("deleting a moved replica's data failed; it stays on disk", "topic", t.name, "partition", i, "dir", dir, "err", err)
		return err
	}
	// Durably gone before the move records it: a power loss must not bring back an
	// old copy (its Raft log and vote) that a later move of the partition back here
	// would open instead of starting afresh.
	if err := (vfs.OS{}).SyncDir(filepath.Dir(dir)); err != nil {
		b.log.Error("syncing the directory of a deleted replica failed", "topic", t.name, "partition", i, "dir", dir, "err", err)
		return err
	}
	b.log.Info("deleted the data of a replica moved off this node", "topic", t.name, "partition", i, "move", mv.ID)
	return nil
}

// moveDone records that this node, the source of mv, deleted its copy.
func (b *Broker) moveDone(mv meta.Move) {
	if _, err := b.meta.SetMoveStatus(mv.ID, meta.MoveDone, ""); err != nil {
		b.log.Warn("recording a move done failed; the controller ends it", "move", mv.ID, "err", err)
	}
}

// What a node does with a replica no longer placed on it.
const (
	leaveOpen   = iota // a move from here is switching: the group still counts it
	leaveClose         // no move's doing (a forced takeover): closed, data kept
	leaveDelete        // the control plane's word: deleted
)

// leftBy finds the latest move of partition i of t that involves node self and says
// what to do with its replica there: delete it when the move from here is removing
// (or done: the controller ended it while the node was away), or when the move here
// was cancelled or failed while copying (a learner never voted); keep it open while a
// move from here is switching; else close it and keep its data. A forced takeover
// fails a move at any status: the target of one that had switched was a voter, and
// its copy may hold messages the survivor lacks, so it is kept as the copy of every
// replica a takeover leaves out (before 6 December it was deleted).
func leftBy(moves []meta.Move, self string, t *topic, i int) (meta.Move, int) {
	for _, mv := range moves { // newest first
		if mv.Topic != t.name || mv.Incarnation != t.incarnation || int(mv.Partition) != i || (mv.From != self && mv.To != self) {
			continue
		}
		switch {
		case mv.From == self && (mv.Status == meta.MoveRemoving || mv.Status == meta.MoveDone):
			return mv, leaveDelete
		case mv.To == self && mv.Status == meta.MoveCancelled:
			return mv, leaveDelete // only a copying move can be cancelled
		case mv.To == self && mv.Status == meta.MoveFailed && mv.Reason != meta.ReasonTakenOverByForce:
			return mv, leaveDelete // the controller fails only copying moves
		case mv.From == self && mv.Status == meta.MoveSwitching:
			return mv, leaveOpen
		}
		return mv, leaveClose
	}
	return meta.Move{}, leaveClose
}

func (b *Broker) partDir(t *topic, i int) string {
	return t.dir + string(os.PathSeparator) + strconv.Itoa(i)
}

// replicaEnds is the log end of each replicated partition held here, by group id
// (meta.Cluster.Ends: heartbeats carry it to the controller).
func (b *Broker) replicaEnds() map[string]uint64 {
	ts := b.topicList()
	out := map[string]uint64{}
	for _, t := range ts {
		m := t.cur.Load()
		for i, p := range t.parts() {
			if p != nil && b.replicated(m, i) {
				out[groupOf(m, i)] = p.Stats().End
			}
		}
	}
	return out
}
