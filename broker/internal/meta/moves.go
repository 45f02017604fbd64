package meta

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
)

// A move changes one partition's replica set by one replica: it adds the new replica
// as a learner (it copies the log but does not vote), switches the replica set once the
// partition's leader reports it caught up, and then the old replica deletes its copy.
// The control plane holds every move, so any party (the controller, the partition's
// leader, the source, the target) can crash at any step and the next one to run picks
// it up from the record. Data is deleted only after the switch committed here and the
// partition's group applied it (status removing), never on a node's absence from a
// placement alone.

// Move statuses, in the order a move goes through them.
const (
	MoveCopying   = "copying"
	MoveSwitching = "switching"
	MoveRemoving  = "removing"
	MoveDone      = "done"
	MoveCancelled = "cancelled"
	MoveFailed    = "failed"
)

// Causes of a move.
const (
	CauseRequest      = "request"
	CauseDecommission = "decommission"
	CauseReplace      = "replace"
	CauseRebalance    = "rebalance"
	CauseRF           = "replication_factor"
)

// ReasonTakenOverByForce is the reason of the moves a forced takeover ends (force_leader
// fails every active move of the partition, copying, switching or removing: the
// target of one that switched may have voted, and its copy is kept).
const ReasonTakenOverByForce = "the partition was taken over by force"

// keptEndedMoves bounds the ended moves the state keeps (the oldest go first).
const keptEndedMoves = 256

// ErrPartitionNotFound means the topic has no partition of that number.
var ErrPartitionNotFound = errors.New("meta: partition not found")

// ErrMoveNotFound means no move of that id exists.
var ErrMoveNotFound = errors.New("meta: move not found")

// Move is one change of a partition's replica set by one replica.
type Move struct {
	// ID is the Raft index of the command that started it.
	ID          uint64 `json:"id"`
	Topic       string `json:"topic"`
	Incarnation uint64 `json:"incarnation"`
	Partition   int32  `json:"partition"`
	// From is the node whose replica goes, "" when one is only added; To the node
	// that gets one, "" when one is only removed.
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	Cause  string `json:"cause"`
	// Progress (0 to 1) and Lag (messages) are what the partition's leader last
	// reported of the new replica while copying.
	Progress    float64 `json:"progress,omitempty"`
	Lag         uint64  `json:"lag,omitempty"`
	CreatedAtMs int64   `json:"created_at_ms"`
	UpdatedAtMs int64   `json:"updated_at_ms"`
}

// Active reports whether the move has not ended.
func (m Move) Active() bool {
	return m.Status == MoveCopying || m.Status == MoveSwitching || m.Status == MoveRemoving
}

// MoveOp is the argument of the move commands.
type MoveOp struct {
	Move *Move  `json:"move,omitempty"` // start_move
	ID   uint64 `json:"id,omitempty"`   // switch_move, move_status, move_progress
	// Status and Reason, on move_status; Progress and Lag on move_progress.
	Status   string  `json:"status,omitempty"`
	Reason   string  `json:"reason,omitempty"`
	Progress float64 `json:"progress,omitempty"`
	Lag      uint64  `json:"lag,omitempty"`
	NowMs    int64   `json:"now_ms"`
	// RF, on set_replication_factor, is the topic's new replica count.
	RF int32 `json:"rf,omitempty"`
	// Node and Lost, on force_leader: the surviving replica and the lower bound of
	// the messages the takeover may have lost.
	Node string `json:"node,omitempty"`
}

func (c command) checkMove() error {
	bad := func(why string) error { return fmt.Errorf("%s command %s", c.Op, why) }
	if c.MoveOp == nil {
		return bad("without its arguments")
	}
	switch c.Op {
	case "start_move":
		m := c.MoveOp.Move
		if m == nil || m.Topic == "" || m.Partition < 0 || (m.From == "" && m.To == "") || m.From == m.To {
			return bad("without a topic, a partition and two different nodes")
		}
	case "switch_move", "move_progress":
		if c.MoveOp.ID == 0 {
			return bad("without a move id")
		}
	case "move_status":
		switch c.MoveOp.Status {
		case MoveRemoving, MoveDone, MoveCancelled, MoveFailed:
		default:
			return bad("without a status it can set")
		}
		if c.MoveOp.ID == 0 {
			return bad("without a move id")
		}
	case "set_replication_factor":
		if c.Name == "" || c.MoveOp.RF < 1 {
			return bad("without a topic and a replication factor")
		}
	case "force_leader":
		m := c.MoveOp.Move
		if m == nil || m.Topic == "" || m.Partition < 0 || c.MoveOp.Node == "" {
			return bad("without a topic, a partition and a node")
		}
	case "remove_member":
		if c.Name == "" || c.ServerID == "" {
			return bad("without a member")
		}
	case "set_leader":
		m := c.MoveOp.Move
		if m == nil || m.Topic == "" || m.Partition < 0 || c.MoveOp.Node == "" {
			return bad("without a topic, a partition and a node")
		}
	}
	return nil
}

// activeMove returns the move under way of partition p of topic t. Called with f.mu held.
func (f *fsm) activeMove(topic string, inc uint64, p int32) (Move, bool) {
	for _, m := range f.moves {
		if m.Active() && m.Topic == topic && m.Incarnation == inc && m.Partition == p {
			return m, true
		}
	}
	return Move{}, false
}

// applyMove applies the move commands. Each is idempotent on re-apply and refuses
// (ConflictError) what the state no longer allows. Called with f.mu held.
func (f *fsm) applyMove(index uint64, c command) applyResult {
	op := c.MoveOp
	switch c.Op {
	case "start_move":
		want := *op.Move
		t, err := f.partitionOf(&want)
		if err != nil {
			return applyResult{err: err}
		}
		if cur, ok := f.activeMove(t.Name, t.Incarnation, want.Partition); ok {
			if cur.From == want.From && cur.To == want.To {
				return applyResult{move: cur} // a retry: the same move
			}
			return conflict("partition %d of topic %s is already moving (move %d, %s → %s, %s); wait for it or cancel it first",
				want.Partition, t.Name, cur.ID, orNone(cur.From), orNone(cur.To), cur.Status)
		}
		pl := t.Placement[want.Partition]
		if want.From != "" && !slices.Contains(pl.Replicas, want.From) {
			return conflict("node %s holds no replica of partition %d of topic %s (its replicas: %v)", want.From, want.Partition, t.Name, pl.Replicas)
		}
		if want.To != "" {
			if slices.Contains(pl.Replicas, want.To) {
				return conflict("node %s already holds a replica of partition %d of topic %s", want.To, want.Partition, t.Name)
			}
			m, ok := f.members[want.To]
			if !ok {
				return applyResult{err: ErrMemberNotFound}
			}
			if m.Status != StatusAlive {
				return conflict("node %s is %s: a partition moves only to an alive node", want.To, m.Status)
			}
		}
		if want.To == "" && len(pl.Replicas) <= 1 {
			return conflict("partition %d of topic %s has one replica; it cannot lose it", want.Partition, t.Name)
		}
		mv := Move{ID: index, Topic: t.Name, Incarnation: t.Incarnation, Partition: want.Partition, From: want.From, To: want.To,
			Cause: want.Cause, CreatedAtMs: op.NowMs, UpdatedAtMs: op.NowMs}
		if mv.Cause == "" {
			mv.Cause = CauseRequest
		}
		pl = clonePlacement(pl)
		pl.Group = true
		if want.To != "" {
			mv.Status = MoveCopying
			pl.Learners = []string{want.To}
		} else {
			// Only removed: nothing to copy.
			mv.Status = MoveSwitching
			pl.Replicas = slices.DeleteFunc(pl.Replicas, func(r string) bool { return r == want.From })
			if pl.Leader == want.From {
				pl.Leader = pl.Replicas[0]
			}
		}
		pl.Epoch++
		t = f.setPlacement(t, want.Partition, pl)
		f.moves[mv.ID] = mv
		f.pruneMoves()
		return applyResult{move: mv}
	case "switch_move":
		mv, ok := f.moves[op.ID]
		if !ok {
			return applyResult{err: ErrMoveNotFound}
		}
		if mv.Status != MoveCopying {
			if mv.Status == MoveSwitching || mv.Status == MoveRemoving || mv.Status == MoveDone {
				return applyResult{move: mv} // a retry
			}
			return conflict("move %d is %s; it can no longer switch", mv.ID, mv.Status)
		}
		t, ok := f.topics[mv.Topic]
		if !ok || t.Incarnation != mv.Incarnation {
			return conflict("the topic of move %d is gone", mv.ID)
		}
		pl := clonePlacement(t.Placement[mv.Partition])
		if mv.From != "" {
			pl.Replicas = slices.DeleteFunc(pl.Replicas, func(r string) bool { return r == mv.From })
			if pl.Leader == mv.From {
				// The new replica takes the preference, and the leadership once it
				// votes (see Placement.LeaderSetAtMs).
				pl.Leader, pl.LeaderSetAtMs = mv.To, op.NowMs
			}
		}
		pl.Replicas = append(pl.Replicas, mv.To)
		pl.Learners = nil
		pl.Epoch++
		t = f.setPlacement(t, mv.Partition, pl)
		mv.Status, mv.Progress, mv.Lag, mv.UpdatedAtMs = MoveSwitching, 1, 0, op.NowMs
		f.moves[mv.ID] = mv
		return applyResult{move: mv}
	case "move_status":
		mv, ok := f.moves[op.ID]
		if !ok {
			return applyResult{err: ErrMoveNotFound}
		}
		if mv.Status == op.Status {
			return applyResult{move: mv} // a retry
		}
		switch op.Status {
		case MoveCancelled, MoveFailed:
			if mv.Status != MoveCopying {
				return conflict("move %d is %s: only a move still copying can be cancelled (it switched the replica set and finishes)", mv.ID, mv.Status)
			}
			if t, ok := f.topics[mv.Topic]; ok && t.Incarnation == mv.Incarnation {
				pl := clonePlacement(t.Placement[mv.Partition])
				pl.Learners = nil
				pl.Epoch++
				t = f.setPlacement(t, mv.Partition, pl)
			}
		case MoveRemoving:
			if mv.Status != MoveSwitching {
				return conflict("move %d is %s, not switching", mv.ID, mv.Status)
			}
		case MoveDone:
			if mv.Status != MoveSwitching && mv.Status != MoveRemoving {
				return conflict("move %d is %s; it cannot be done", mv.ID, mv.Status)
			}
		}
		mv.Status, mv.Reason, mv.UpdatedAtMs = op.Status, op.Reason, op.NowMs
		f.moves[mv.ID] = mv
		f.pruneMoves()
		return applyResult{move: mv}
	case "move_progress":
		mv, ok := f.moves[op.ID]
		if !ok {
			return applyResult{err: ErrMoveNotFound}
		}
		if mv.Status == MoveCopying {
			mv.Progress, mv.Lag = op.Progress, op.Lag
			f.moves[mv.ID] = mv
		}
		return applyResult{move: mv}
	case "set_replication_factor":
		t, ok := f.topics[c.Name]
		if !ok || (c.Topic != nil && c.Topic.Incarnation != 0 && c.Topic.Incarnation != t.Incarnation) {
			return applyResult{err: ErrTopicNotFound}
		}
		if int(op.RF) > f.eligibleCount() {
			return conflict("replication_factor %d is more than the %d nodes that can hold a replica; add nodes first", op.RF, f.eligibleCount())
		}
		t.ReplicationFactor = op.RF
		f.topics[t.Name] = t
		return applyResult{topic: t}
	case "force_leader":
		return f.applyForceLeader(index, c)
	case "set_leader":
		want := op.Move
		t, err := f.partitionOf(want)
		if err != nil {
			return applyResult{err: err}
		}
		pl := clonePlacement(t.Placement[want.Partition])
		if !slices.Contains(pl.Replicas, op.Node) {
			return conflict("node %s holds no replica of partition %d of topic %s", op.Node, want.Partition, t.Name)
		}
		pl.Leader, pl.LeaderSetAtMs = op.Node, op.NowMs
		t = f.setPlacement(t, want.Partition, pl)
		return applyResult{topic: t}
	case "remove_member":
		m, ok := f.members[c.Name]
		if !ok || m.ServerID != c.ServerID {
			return applyResult{err: ErrMemberNotFound}
		}
		if f.holdsAny(c.Name) {
			return conflict("node %s still holds partition replicas; it is removed once it holds none", c.Name)
		}
		delete(f.members, c.Name)
		f.removed[c.ServerID] = true
		return applyResult{}
	}
	return applyResult{}
}

// applyForceLeader makes op.Node the only replica of the partition. Called with f.mu held.
func (f *fsm) applyForceLeader(index uint64, c command) applyResult {
	op := c.MoveOp
	want := op.Move
	t, err := f.partitionOf(want)
	if err != nil {
		return applyResult{err: err}
	}
	pl := clonePlacement(t.Placement[want.Partition])
	if len(pl.Replicas) == 1 && pl.Replicas[0] == op.Node {
		return applyResult{topic: t} // a retry
	}
	if !slices.Contains(pl.Replicas, op.Node) {
		return conflict("node %s holds no replica of partition %d of topic %s (its replicas: %v)", op.Node, want.Partition, t.Name, pl.Replicas)
	}
	// A move under way of this partition ends: its replica set is replaced whole.
	for id, mv := range f.moves {
		if mv.Active() && mv.Topic == t.Name && mv.Incarnation == t.Incarnation && mv.Partition == want.Partition {
			mv.Status, mv.Reason, mv.UpdatedAtMs = MoveFailed, ReasonTakenOverByForce, op.NowMs
			f.moves[id] = mv
		}
	}
	pl.Replicas, pl.Learners, pl.Leader, pl.Group = []string{op.Node}, nil, op.Node, true
	pl.Epoch++
	// A forced group starts afresh: its id changes, so no old member can vote in it.
	pl.Forced = index
	t = f.setPlacement(t, want.Partition, pl)
	return applyResult{topic: t}
}

// setPlacement stores pl as partition i of t's placement, copying the placement
// slice (snapshots and readers share the old one), and returns t as stored. Called
// with f.mu held.
func (f *fsm) setPlacement(t Topic, i int32, pl Placement) Topic {
	t.Placement = slices.Clone(t.Placement)
	t.Placement[i] = pl
	f.topics[t.Name] = t
	return t
}

// partitionOf returns the topic a move command names, checking its incarnation (when
// given) and that the partition exists. Called with f.mu held.
func (f *fsm) partitionOf(want *Move) (Topic, error) {
	t, ok := f.topics[want.Topic]
	if !ok || (want.Incarnation != 0 && want.Incarnation != t.Incarnation) {
		return Topic{}, ErrTopicNotFound
	}
	if want.Partition >= int32(len(t.Placement)) {
		return Topic{}, ErrPartitionNotFound
	}
	return t, nil
}

// eligibleCount counts the members that may hold a new replica (not dead, not
// decommissioning). Called with f.mu held.
func (f *fsm) eligibleCount() int {
	n := 0
	for _, m := range f.members {
		if m.Status != StatusDead && m.Status != StatusDecommissioning {
			n++
		}
	}
	return n
}

// holdsAny reports whether node is a replica or learner of any partition. Called with
// f.mu held.
func (f *fsm) holdsAny(node string) bool {
	for _, t := range f.topics {
		for _, p := range t.Placement {
			if slices.Contains(p.Replicas, node) || slices.Contains(p.Learners, node) {
				return true
			}
		}
	}
	return false
}

// pruneMoves drops the oldest ended moves past keptEndedMoves. Called with f.mu held.
func (f *fsm) pruneMoves() {
	var ended []uint64
	for id, m := range f.moves {
		if !m.Active() {
			ended = append(ended, id)
		}
	}
	if len(ended) <= keptEndedMoves {
		return
	}
	slices.Sort(ended)
	for _, id := range ended[:len(ended)-keptEndedMoves] {
		delete(f.moves, id)
	}
}

// failMovesOf ends the moves of a deleted topic. Called with f.mu held.
func (f *fsm) failMovesOf(topic string, inc uint64) {
	for id, m := range f.moves {
		if m.Active() && m.Topic == topic && m.Incarnation == inc {
			m.Status, m.Reason = MoveFailed, "the topic was deleted"
			f.moves[id] = m
		}
	}
}

func clonePlacement(p Placement) Placement {
	p.Replicas = slices.Clone(p.Replicas)
	p.Learners = slices.Clone(p.Learners)
	return p
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func (f *fsm) moveList() []Move {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]Move, 0, len(f.moves))
	for _, m := range f.moves {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out
}

func (f *fsm) move(id uint64) (Move, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.moves[id]
	return m, ok
}

// wasRemoved reports whether the Raft server id was a member removed from the cluster
// (decommissioned or replaced): it is refused if it comes back.
func (f *fsm) wasRemoved(serverID string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.removed[serverID]
}

// StartMove records a move and starts it (its replica set gains the learner). A move of
// the partition identical to one under way returns that one.
func (s *Store) StartMove(m Move) (Move, error) {
	res, err := s.applyCmd(command{Op: "start_move", MoveOp: &MoveOp{Move: &m, NowMs: nowMs()}})
	return res.move, err
}

// SwitchMove switches the replica set of a move whose new replica caught up.
func (s *Store) SwitchMove(id uint64) (Move, error) {
	res, err := s.applyCmd(command{Op: "switch_move", MoveOp: &MoveOp{ID: id, NowMs: nowMs()}})
	return res.move, err
}

// SetMoveStatus moves a move on to status (removing, done), or ends it (cancelled,
// failed: only while copying) with reason.
func (s *Store) SetMoveStatus(id uint64, status, reason string) (Move, error) {
	res, err := s.applyCmd(command{Op: "move_status", MoveOp: &MoveOp{ID: id, Status: status, Reason: reason, NowMs: nowMs()}})
	return res.move, err
}

// MoveProgress records how far the new replica of a move has copied.
func (s *Store) MoveProgress(id uint64, progress float64, lag uint64) error {
	_, err := s.applyCmd(command{Op: "move_progress", MoveOp: &MoveOp{ID: id, Progress: progress, Lag: lag, NowMs: nowMs()}})
	return err
}

// SetReplicationFactor sets the replica count the topic's partitions should have; the
// controller starts the moves that get them there.
func (s *Store) SetReplicationFactor(name string, incarnation uint64, rf int32) (Topic, error) {
	res, err := s.applyCmd(command{Op: "set_replication_factor", Name: name, Topic: &Topic{Incarnation: incarnation}, MoveOp: &MoveOp{RF: rf, NowMs: nowMs()}})
	return res.topic, err
}

// ForceLeader makes node the only replica of partition p of the topic (a new group).
func (s *Store) ForceLeader(topic string, incarnation uint64, p int32, node string) (Topic, error) {
	res, err := s.applyCmd(command{Op: "force_leader", MoveOp: &MoveOp{Move: &Move{Topic: topic, Incarnation: incarnation, Partition: p}, Node: node, NowMs: nowMs()}})
	return res.topic, err
}

// Moves lists the moves, newest first.
func (s *Store) Moves() []Move { return s.fsm.moveList() }

// Move returns the move of that id.
func (s *Store) Move(id uint64) (Move, bool) { return s.fsm.move(id) }

// WasRemoved reports whether the Raft server id belonged to a member removed from the
// cluster.
func (s *Store) WasRemoved(serverID string) bool { return s.fsm.wasRemoved(serverID) }

func nowMs() int64 { return time.Now().UnixMilli() }
