package meta

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/raft"
)

// DefaultMaxMoves is how many moves the controller runs at once.
const DefaultMaxMoves = 2

// planInput is the state a plan of moves is made from.
type planInput struct {
	topics  []Topic
	members map[string]Member
	moves   []Move
	// rebalance asks for moves that even out the replicas over the alive members.
	rebalance bool
	// silent are the members the controller has not heard from for SuspectAfter: a
	// decommissioning one among them is being replaced (its replicas are copied from
	// the survivors).
	silent map[string]bool
	// unheard are the members the controller has not heard from since it was
	// elected: not targets yet (one may have died just before).
	unheard map[string]bool
	limit   int
}

// planMoves returns the moves to start now, at most in.limit minus the moves under way:
// first those that take replicas off decommissioning members, then those that bring
// partitions to their topic's replication factor, then (with in.rebalance) those that
// even out the replicas held per alive member until no two differ by more than one.
// Each partition gets at most one move under way. It reads only in, so it is the same
// on any node given the same state.
func planMoves(in planInput) []Move {
	busy := map[string]bool{}
	active := 0
	for _, m := range in.moves {
		if m.Active() {
			active++
			busy[partKey(m.Topic, m.Incarnation, m.Partition)] = true
		}
	}
	room := in.limit - active
	if room <= 0 {
		return nil
	}
	held := map[string]int{}
	var alive []string
	for id, m := range in.members {
		if m.Status == StatusAlive && !in.unheard[id] {
			alive = append(alive, id)
			held[id] += 0
		}
	}
	sort.Strings(alive)
	for _, t := range in.topics {
		for _, p := range t.Placement {
			for _, r := range append(slices.Clone(p.Replicas), p.Learners...) {
				held[r]++
			}
		}
	}
	// target picks the alive member holding the fewest replicas that is not one of pl.
	target := func(pl Placement) string {
		best := ""
		for _, id := range alive {
			if slices.Contains(pl.Replicas, id) || slices.Contains(pl.Learners, id) {
				continue
			}
			if best == "" || held[id] < held[best] {
				best = id
			}
		}
		return best
	}
	var out []Move
	add := func(t Topic, p int, from, to, cause string) bool {
		k := partKey(t.Name, t.Incarnation, int32(p))
		if busy[k] || len(out) >= room {
			return false
		}
		busy[k] = true
		if to != "" {
			held[to]++
		}
		if from != "" {
			held[from]--
		}
		out = append(out, Move{Topic: t.Name, Incarnation: t.Incarnation, Partition: int32(p), From: from, To: to, Cause: cause})
		return true
	}
	leaving := func(id string) bool {
		m, ok := in.members[id]
		return ok && m.Status == StatusDecommissioning
	}
	for _, t := range in.topics {
		for i, pl := range t.Placement {
			for _, r := range pl.Replicas {
				if !leaving(r) {
					continue
				}
				cause := CauseDecommission
				if in.silent[r] {
					cause = CauseReplace
				}
				if to := target(pl); to != "" {
					add(t, i, r, to, cause)
				} else if len(pl.Replicas) > 1 && int32(len(pl.Replicas)) > t.ReplicationFactor {
					if d := dropOne(pl, in.members, held); !in.silent[r] && goneRank(in.members, d) > 0 {
						// Another replica is on a member that is dead or suspect: the
						// lowered factor's step below drops that one, and this live one
						// stays until a target is free. Dropped instead, it left a
						// group whose majority was not alive (a review, 5 December).
						break
					}
					add(t, i, r, "", cause)
				}
				break
			}
		}
	}
	for _, t := range in.topics {
		for i, pl := range t.Placement {
			n := int32(len(pl.Replicas))
			switch {
			case n < t.ReplicationFactor:
				if to := target(pl); to != "" {
					add(t, i, "", to, CauseRF)
				}
			case n > t.ReplicationFactor && n > 1:
				add(t, i, dropOne(pl, in.members, held), "", CauseRF)
			}
		}
	}
	if !in.rebalance || len(alive) < 2 {
		return out
	}
	for len(out) < room {
		most, least := extremes(alive, held)
		if held[most]-held[least] <= 1 {
			break
		}
		moved := false
		for _, t := range in.topics {
			for i, pl := range t.Placement {
				if len(pl.Replicas) < 2 || !slices.Contains(pl.Replicas, most) || slices.Contains(pl.Replicas, least) || slices.Contains(pl.Learners, least) {
					continue // a partition of one replica moves only on request
				}
				if add(t, i, most, least, CauseRebalance) {
					moved = true
					break
				}
			}
			if moved {
				break
			}
		}
		if !moved {
			break
		}
	}
	// Leaderships follow once replicas are spread.
	return append(out, planLeaders(in, alive, busy)...)
}

// dropOne returns the replica of pl that goes when its topic's replication factor is
// lowered: one on a dead member (or one no longer a member) first, then one on a
// suspect member, then, among the rest, the one on the member holding the most; among
// replicas equally sure to be gone, never the preferred leader while another can go.
// Dropping the replica most surely gone keeps as many live replicas as any choice
// would, so the smaller group keeps a live majority whenever one removal can leave it
// one: dropping a live replica while a dead one stays can leave a group that never
// reaches a quorum again (two voters, one dead).
func dropOne(pl Placement, members map[string]Member, held map[string]int) string {
	gone := func(id string) int { return goneRank(members, id) }
	from := ""
	for _, r := range pl.Replicas {
		if from == "" {
			from = r
			continue
		}
		if g, gf := gone(r), gone(from); g != gf {
			if g > gf {
				from = r
			}
			continue
		}
		if (r == pl.Leader) != (from == pl.Leader) {
			if from == pl.Leader {
				from = r
			}
			continue
		}
		if held[r] > held[from] {
			from = r
		}
	}
	return from
}

// goneRank says how surely member id is gone: 2 dead (or no longer a member), 1
// suspect, 0 otherwise.
func goneRank(members map[string]Member, id string) int {
	m, ok := members[id]
	switch {
	case !ok || m.Status == StatusDead:
		return 2
	case m.Status == StatusSuspect:
		return 1
	}
	return 0
}

// extremes returns the first of ids with the highest count and the first with the
// lowest (ids is not empty).
func extremes(ids []string, count map[string]int) (most, least string) {
	most, least = ids[0], ids[0]
	for _, id := range ids {
		if count[id] > count[most] {
			most = id
		}
		if count[id] < count[least] {
			least = id
		}
	}
	return most, least
}

// planLeaders returns at most one change of a replicated partition's preferred leader
// (a Move with Cause "leader" and To the new one), from the alive member preferred
// for the most partitions to the one preferred for the fewest that holds a replica of
// it, while they differ by more than one. Partitions under a move are left alone.
func planLeaders(in planInput, alive []string, busy map[string]bool) []Move {
	led := map[string]int{}
	for _, id := range alive {
		led[id] = 0
	}
	for _, t := range in.topics {
		for _, p := range t.Placement {
			if p.Replicated() {
				if _, ok := led[p.Leader]; ok {
					led[p.Leader]++
				}
			}
		}
	}
	most, least := extremes(alive, led)
	if led[most]-led[least] <= 1 {
		return nil
	}
	for _, t := range in.topics {
		for i, p := range t.Placement {
			if p.Replicated() && p.Leader == most && slices.Contains(p.Replicas, least) && !busy[partKey(t.Name, t.Incarnation, int32(i))] {
				return []Move{{Topic: t.Name, Incarnation: t.Incarnation, Partition: int32(i), From: most, To: least, Cause: causeLeader}}
			}
		}
	}
	return nil
}

// causeLeader marks a planned change of preferred leader (not a move).
const causeLeader = "leader"

func partKey(topic string, inc uint64, p int32) string {
	return fmt.Sprintf("%s/%d/%d", topic, inc, p)
}

// steer is the controller's part in moves, every tick: it ends the moves that can no
// longer finish, starts the moves decommissions, replication factors and (when
// AutoRebalance) an uneven spread need, and removes the decommissioned members that
// hold nothing any more.
func (s *Store) steer() error {
	if s.fsm.clusterVersion() < opSince["start_move"] {
		return nil
	}
	c := s.opts.Cluster
	for _, mv := range s.fsm.moveList() {
		if !mv.Active() {
			continue
		}
		switch mv.Status {
		case MoveCopying:
			// A suspect target may be restarting: the move waits for it until it is
			// dead (DeadAfter).
			if m, ok := s.fsm.member(mv.To); !ok || m.Status == StatusDead || m.Status == StatusDecommissioning {
				why := fmt.Sprintf("the target node %s is down or leaving; another move is planned when one is needed", mv.To)
				if _, err := s.SetMoveStatus(mv.ID, MoveFailed, why); err != nil && !isConflict(err) {
					return err
				}
				s.opts.Logger.Warn("meta: a move failed", "move", mv.ID, "topic", mv.Topic, "partition", mv.Partition, "why", why)
			}
		case MoveRemoving:
			// The old replica deletes its copy and says so; one whose node is gone or
			// silent past SuspectAfter cannot now: its copy is not served, the move
			// ends, and the node deletes the copy if it comes back (removeUnopened).
			m, ok := s.fsm.member(mv.From)
			if !ok || m.Status == StatusDead || time.Since(s.ctl.seen(m.ServerID)) > c.SuspectAfter {
				if _, err := s.SetMoveStatus(mv.ID, MoveDone, fmt.Sprintf("node %s was down; it no longer serves its old copy", mv.From)); err != nil && !isConflict(err) {
					return err
				}
			}
		}
	}
	for _, mv := range s.plan(c.AutoRebalance) {
		if mv.Cause == causeLeader {
			if err := s.setLeader(mv); err != nil {
				return err
			}
			continue
		}
		if _, err := s.StartMove(mv); err != nil {
			if isConflict(err) || errors.Is(err, ErrMemberNotFound) {
				continue // the state changed since the plan; the next tick plans again
			}
			return err
		}
		s.opts.Logger.Info("meta: started a move", "topic", mv.Topic, "partition", mv.Partition, "from", orNone(mv.From), "to", orNone(mv.To), "cause", mv.Cause)
	}
	return s.removeDecommissioned()
}

// plan is planMoves over this node's state.
func (s *Store) plan(rebalance bool) []Move {
	s.fsm.mu.RLock()
	in := planInput{members: make(map[string]Member, len(s.fsm.members)), rebalance: rebalance, limit: max(1, s.opts.Cluster.MaxMoves), silent: map[string]bool{}, unheard: map[string]bool{}}
	for id, m := range s.fsm.members {
		in.members[id] = m
	}
	s.fsm.mu.RUnlock()
	for id, m := range in.members {
		// Only the controller hears heartbeats; elsewhere every member is taken as heard.
		if !s.Leader() || m.ServerID == s.ServerID() {
			continue
		}
		if time.Since(s.ctl.seen(m.ServerID)) > s.opts.Cluster.SuspectAfter {
			in.silent[id] = true
		}
		if !s.ctl.heardThisTerm(m.ServerID) {
			in.unheard[id] = true
		}
	}
	in.topics, in.moves = s.fsm.list(), s.fsm.moveList()
	return planMoves(in)
}

// Rebalance starts, now, the moves that even out the replicas over the alive members
// (at most Cluster.MaxMoves under way) and returns them; the controller starts the rest
// as those end when AutoRebalance is on, else at the next call.
func (s *Store) Rebalance() ([]Move, error) {
	if err := s.gateCmd(command{Op: "start_move"}); err != nil {
		return nil, err
	}
	var out []Move
	for _, mv := range s.plan(true) {
		if mv.Cause == causeLeader {
			if err := s.setLeader(mv); err != nil {
				return out, err
			}
			continue
		}
		m, err := s.StartMove(mv)
		if err != nil {
			if isConflict(err) {
				continue
			}
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

// removeDecommissioned removes from the Raft configuration, then from the members,
// every decommissioning member that holds no replica and has no move under way.
func (s *Store) removeDecommissioned() error {
	busy := map[string]bool{}
	for _, mv := range s.fsm.moveList() {
		if mv.Active() {
			busy[mv.From], busy[mv.To] = true, true
		}
	}
	for _, m := range s.fsm.memberList() {
		if m.Status != StatusDecommissioning || busy[m.ID] {
			continue
		}
		s.fsm.mu.RLock()
		holds := s.fsm.holdsAny(m.ID)
		s.fsm.mu.RUnlock()
		if holds {
			continue
		}
		if m.ServerID == s.ServerID() {
			// The controller leaves last: it hands the control plane over first.
			s.opts.Logger.Info("meta: this node is decommissioned; handing the controller over before it leaves")
			if err := s.raft.LeadershipTransfer().Error(); err != nil {
				return leaderErr(err)
			}
			// Handed over: the next controller removes this node.
			return fmt.Errorf("%w: handed the controller over (this node is decommissioned)", ErrNotLeader)
		}
		if err := s.awaitWrite(s.raft.RemoveServer(raft.ServerID(m.ServerID), 0, s.opts.ApplyTimeout), "remove "+m.ServerID); err != nil {
			return err
		}
		if _, err := s.applyLocal(command{Op: "remove_member", Name: m.ID, ServerID: m.ServerID, MoveOp: &MoveOp{NowMs: nowMs()}}); err != nil && !isConflict(err) && !errors.Is(err, ErrMemberNotFound) {
			return err
		}
		s.opts.Logger.Info("meta: removed a decommissioned member; its process can be stopped", "member", m.ID, "server", m.ServerID)
	}
	return nil
}

// Decommission marks node decommissioning: the controller moves every replica off it
// (from the survivors, when it is dead) and then removes it. A repeat returns the
// member as it is. ConflictError when it cannot go: the last member, or one whose
// replicas no other alive member could take.
func (s *Store) Decommission(node string) (Member, error) {
	if err := s.gateCmd(command{Op: "start_move"}); err != nil {
		return Member{}, err
	}
	m, err := s.decommission(node)
	if n, ok := s.fsm.member(node); errors.Is(err, ErrMemberNotFound) && ok && n.ServerID != m.ServerID {
		// The node was admitted meanwhile under a new server (its disk was wiped):
		// decommission that one.
		m, err = s.decommission(node)
	}
	if err != nil {
		return Member{}, err
	}
	return m, nil
}

// decommission is one try of Decommission. On ErrMemberNotFound, it returns the
// member it read (so the caller sees whether its server changed).
func (s *Store) decommission(node string) (Member, error) {
	m, ok := s.fsm.member(node)
	if !ok {
		return Member{}, ErrMemberNotFound
	}
	if m.Status == StatusDecommissioning {
		return m, nil
	}
	others := 0
	for _, o := range s.fsm.memberList() {
		if o.ID != node && o.Status == StatusAlive {
			others++
		}
	}
	if others == 0 {
		return Member{}, &ConflictError{Msg: fmt.Sprintf("node %s is the last live member; a cluster cannot decommission all its nodes", node)}
	}
	for _, t := range s.fsm.list() {
		for i, pl := range t.Placement {
			if !slices.Contains(pl.Replicas, node) {
				continue
			}
			free := 0
			for _, o := range s.fsm.memberList() {
				if o.Status == StatusAlive && o.ID != node && !slices.Contains(pl.Replicas, o.ID) {
					free++
				}
			}
			if free == 0 && int32(len(pl.Replicas)) <= t.ReplicationFactor {
				return Member{}, &ConflictError{Msg: fmt.Sprintf("partition %d of topic %s has replication factor %d and no other live node can take the replica on %s; add a node first, or lower the topic's replication_factor",
					i, t.Name, t.ReplicationFactor, node)}
			}
		}
	}
	if _, err := s.applyCmd(command{Op: "set_status", Name: node, ServerID: m.ServerID, Status: StatusDecommissioning}); err != nil {
		return m, err
	}
	m, _ = s.fsm.member(node)
	return m, nil
}

func isConflict(err error) bool {
	var c *ConflictError
	return errors.As(err, &c)
}

// setLeader records the preferred leader a rebalance chose; the partition's leader
// hands its leadership over (its leases with it).
func (s *Store) setLeader(mv Move) error {
	_, err := s.applyCmd(command{Op: "set_leader", MoveOp: &MoveOp{Move: &Move{Topic: mv.Topic, Incarnation: mv.Incarnation, Partition: mv.Partition}, Node: mv.To, NowMs: nowMs()}})
	if err != nil && !isConflict(err) && !errors.Is(err, ErrTopicNotFound) && !errors.Is(err, ErrPartitionNotFound) {
		return err
	}
	if err == nil {
		s.opts.Logger.Info("meta: chose another preferred leader to spread leaderships", "topic", mv.Topic, "partition", mv.Partition, "from", mv.From, "to", mv.To)
	}
	return nil
}
