package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

// moveFSM is a state machine with members n1–n4 alive and topic "t" of two partitions
// placed with three replicas on n1–n3, applied through Apply as Raft would.
type moveFSM struct {
	t     *testing.T
	f     *fsm
	index uint64
}

func newMoveFSM(t *testing.T) *moveFSM {
	m := &moveFSM{t: t, f: newFSM()}
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		m.apply(command{Op: "set_member", Member: &Member{ID: id, ServerID: id + "/d", Status: StatusAlive}})
	}
	m.f.mu.Lock()
	m.f.topics["t"] = Topic{Name: "t", Incarnation: 1, TopicConfig: TopicConfig{Partitions: 2, ReplicationFactor: 3},
		Placement: []Placement{{Replicas: []string{"n1", "n2", "n3"}, Leader: "n1", Epoch: 1}, {Replicas: []string{"n1", "n2", "n3"}, Leader: "n2", Epoch: 1}}}
	m.f.mu.Unlock()
	return m
}

func (m *moveFSM) apply(c command) applyResult {
	m.t.Helper()
	b, err := encodeCommand(c)
	if err != nil {
		m.t.Fatal(err)
	}
	m.index++
	return m.f.Apply(&raft.Log{Index: m.index, Data: b}).(applyResult)
}

func (m *moveFSM) placement(p int) Placement {
	tp, _ := m.f.topic("t")
	return tp.Placement[p]
}

func start(from, to string) command {
	return command{Op: "start_move", MoveOp: &MoveOp{Move: &Move{Topic: "t", Incarnation: 1, Partition: 0, From: from, To: to}, NowMs: 1}}
}

func status(id uint64, st string) command {
	return command{Op: "move_status", MoveOp: &MoveOp{ID: id, Status: st, NowMs: 2}}
}

// TestMoveStepsKeepEveryCopy: a move adds its target as a learner, switches the replica
// set only on switch_move, and each command applied again (a Raft replay) changes
// nothing; at no step does the placement name fewer replicas than before.
func TestMoveStepsKeepEveryCopy(t *testing.T) {
	m := newMoveFSM(t)
	r := m.apply(start("n1", "n4"))
	if r.err != nil || r.move.Status != MoveCopying || r.move.ID == 0 {
		t.Fatalf("start: %+v %v", r.move, r.err)
	}
	id := r.move.ID
	if p := m.placement(0); !slices.Equal(p.Replicas, []string{"n1", "n2", "n3"}) || !slices.Equal(p.Learners, []string{"n4"}) {
		t.Fatalf("copying: %+v", p)
	}
	// A retry returns the same move; a different move of the partition is refused.
	if r := m.apply(start("n1", "n4")); r.err != nil || r.move.ID != id {
		t.Fatalf("identical repeat: %+v %v", r.move, r.err)
	}
	if r := m.apply(start("n2", "n4")); !isConflict(r.err) {
		t.Fatalf("a second move of the partition: %v", r.err)
	}
	// Removing before the switch is refused.
	if r := m.apply(status(id, MoveRemoving)); !isConflict(r.err) {
		t.Fatalf("removing before the switch: %v", r.err)
	}
	for range 2 { // applied twice: a replay
		if r := m.apply(command{Op: "switch_move", MoveOp: &MoveOp{ID: id, NowMs: 3}}); r.err != nil || r.move.Status != MoveSwitching {
			t.Fatalf("switch: %+v %v", r.move, r.err)
		}
		if p := m.placement(0); !slices.Equal(p.Replicas, []string{"n2", "n3", "n4"}) || len(p.Learners) != 0 || p.Leader != "n4" {
			t.Fatalf("switched: %+v", p)
		}
	}
	// Once switched it cannot be cancelled.
	if r := m.apply(status(id, MoveCancelled)); !isConflict(r.err) {
		t.Fatalf("cancel after the switch: %v", r.err)
	}
	for _, st := range []string{MoveRemoving, MoveRemoving, MoveDone, MoveDone} {
		if r := m.apply(status(id, st)); r.err != nil || r.move.Status != st {
			t.Fatalf("%s: %+v %v", st, r.move, r.err)
		}
	}
	if mv, _ := m.f.move(id); mv.Active() {
		t.Fatalf("done move still active: %+v", mv)
	}
}

// TestMoveRefusals: impossible moves are refused with a reason.
func TestMoveRefusals(t *testing.T) {
	m := newMoveFSM(t)
	m.apply(command{Op: "set_status", Name: "n4", ServerID: "n4/d", Status: StatusDead})
	for _, c := range []struct {
		name string
		cmd  command
		want error
	}{
		{"to a dead node", start("n1", "n4"), nil},
		{"from a non-replica", start("n4", "n1"), nil},
		{"to a replica", start("n1", "n2"), nil},
		{"to an unknown node", start("n1", "n9"), ErrMemberNotFound},
		{"of an unknown partition", command{Op: "start_move", MoveOp: &MoveOp{Move: &Move{Topic: "t", Partition: 5, From: "n1", To: "n4"}}}, ErrPartitionNotFound},
		{"of an old incarnation", command{Op: "start_move", MoveOp: &MoveOp{Move: &Move{Topic: "t", Incarnation: 7, From: "n1", To: "n4"}}}, ErrTopicNotFound},
	} {
		r := m.apply(c.cmd)
		if c.want == nil && !isConflict(r.err) || c.want != nil && !errors.Is(r.err, c.want) {
			t.Errorf("%s: %v", c.name, r.err)
		}
	}
	if p := m.placement(0); len(p.Learners) != 0 || p.Epoch != 1 {
		t.Fatalf("a refused move changed the placement: %+v", p)
	}
}

// TestCancelledMoveDropsItsLearner and a deleted topic fails its moves.
func TestCancelledMoveDropsItsLearner(t *testing.T) {
	m := newMoveFSM(t)
	id := m.apply(start("n1", "n4")).move.ID
	if r := m.apply(status(id, MoveCancelled)); r.err != nil {
		t.Fatal(r.err)
	}
	if p := m.placement(0); len(p.Learners) != 0 || !slices.Equal(p.Replicas, []string{"n1", "n2", "n3"}) {
		t.Fatalf("cancelled: %+v", p)
	}
	if r := m.apply(command{Op: "switch_move", MoveOp: &MoveOp{ID: id}}); !isConflict(r.err) {
		t.Fatalf("switch of a cancelled move: %v", r.err)
	}
	id = m.apply(start("n2", "n4")).move.ID
	m.apply(command{Op: "delete_topic", Name: "t"})
	if mv, _ := m.f.move(id); mv.Status != MoveFailed {
		t.Fatalf("move of a deleted topic: %+v", mv)
	}
}

// TestMovesSurviveSnapshot: moves, learners and removed members are in the snapshot.
func TestMovesSurviveSnapshot(t *testing.T) {
	m := newMoveFSM(t)
	m.apply(start("n1", "n4"))
	m.f.mu.Lock()
	m.f.removed["n9/x"] = true
	m.f.mu.Unlock()
	snap, err := m.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.moveList(), m.f.moveList()) || !g.wasRemoved("n9/x") {
		t.Fatalf("restored moves %+v removed %v", g.moveList(), g.removed)
	}
	tp, _ := g.topic("t")
	if !slices.Equal(tp.Placement[0].Learners, []string{"n4"}) {
		t.Fatalf("restored placement %+v", tp.Placement[0])
	}
}

// TestPlanMoves: decommissions come first, then replication factors, then (asked)
// rebalancing, bounded by the limit and one move per partition.
func TestPlanMoves(t *testing.T) {
	members := map[string]Member{}
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		members[id] = Member{ID: id, Status: StatusAlive}
	}
	three := func(name string, rf int32) Topic {
		return Topic{Name: name, Incarnation: 1, TopicConfig: TopicConfig{Partitions: 1, ReplicationFactor: rf},
			Placement: []Placement{{Replicas: []string{"n1", "n2", "n3"}, Leader: "n1"}}}
	}
	// Balanced for three nodes; n4 joined and holds nothing.
	in := planInput{topics: []Topic{three("a", 3), three("b", 3), three("c", 3)}, members: members, limit: 2}
	if got := planMoves(in); len(got) != 0 {
		t.Fatalf("without rebalance: %+v", got)
	}
	in.rebalance = true
	got := planMoves(in)
	if len(got) != 3 || got[0].To != "n4" || got[1].To != "n4" || got[0].Cause != CauseRebalance || got[0].Topic == got[1].Topic {
		t.Fatalf("rebalance: %+v", got)
	}
	// n1 is preferred for all three partitions: one preference moves to a member
	// preferred for none that holds a replica, outside the move limit.
	if l := got[2]; l.Cause != causeLeader || l.From != "n1" || l.To == "n1" || l.To == "n4" {
		t.Fatalf("leadership: %+v", l)
	}
	// A move under way counts against the limit and holds its partition.
	in.moves = []Move{{Topic: "a", Incarnation: 1, Partition: 0, From: "n1", To: "n4", Status: MoveCopying}}
	if got := planMoves(in); len(got) != 2 || got[0].Topic == "a" || got[0].Cause != CauseRebalance || got[1].Cause != causeLeader || got[1].Topic == "a" {
		t.Fatalf("with a move under way: %+v", got)
	}
	in.moves = nil
	in.rebalance = false
	// A decommissioning member's replicas go to the member holding the fewest.
	dm := members["n2"]
	dm.Status = StatusDecommissioning
	members["n2"] = dm
	got = planMoves(in)
	if len(got) != 2 || got[0].From != "n2" || got[0].To != "n4" || got[0].Cause != CauseDecommission {
		t.Fatalf("decommission: %+v", got)
	}
	members["n2"] = Member{ID: "n2", Status: StatusAlive}
	// Replication factor: raised adds, lowered removes a replica that does not lead.
	in.topics = []Topic{three("up", 4), three("down", 2)}
	got = planMoves(in)
	if len(got) != 2 || got[0].From != "" || got[0].To != "n4" || got[1].To != "" || got[1].From == "n1" || got[1].From == "" {
		t.Fatalf("replication factor: %+v", got)
	}
	js, _ := json.Marshal(got)
	t.Logf("plan: %s", js)
}

// TestLoweredReplicationFactorKeepsALiveQuorum: when a topic's replication factor is
// lowered, the replica that goes is one on a dead member, else on a suspect one, and
// only among replicas equally sure to be gone is it the one that is not the preferred
// leader on the member holding the most; the group left must keep a live majority
// whenever one removal can. The plan ignored the members' status: with n3 dead and the
// factor lowered from 3 to 2 it dropped live n2 and kept n3, and the group {n1, n3}
// never reached a quorum again (every produce and ack of the partition answered 503
// until n3 came back, or a forced takeover).
func TestLoweredReplicationFactorKeepsALiveQuorum(t *testing.T) {
	for _, c := range []struct {
		name   string
		status map[string]MemberStatus // the others are alive
		leader string
		want   string
	}{
		{"a dead replica", map[string]MemberStatus{"n3": StatusDead}, "n1", "n3"},
		{"a suspect replica", map[string]MemberStatus{"n3": StatusSuspect}, "n1", "n3"},
		{"the dead before the suspect", map[string]MemberStatus{"n2": StatusSuspect, "n3": StatusDead}, "n1", "n3"},
		{"a dead preferred leader", map[string]MemberStatus{"n1": StatusDead}, "n1", "n1"},
		{"a dead replica that is not the preferred leader first", map[string]MemberStatus{"n1": StatusDead, "n3": StatusDead}, "n1", "n3"},
		{"a replica on a member no longer in the members", map[string]MemberStatus{"n3": ""}, "n1", "n3"},
		{"everyone alive: not the preferred leader", nil, "n2", "n1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			members := map[string]Member{}
			for _, id := range []string{"n1", "n2", "n3"} {
				st, ok := c.status[id]
				if !ok {
					st = StatusAlive
				}
				if st != "" {
					members[id] = Member{ID: id, Status: st}
				}
			}
			tp := Topic{Name: "down", Incarnation: 1, TopicConfig: TopicConfig{Partitions: 1, ReplicationFactor: 2},
				Placement: []Placement{{Replicas: []string{"n1", "n2", "n3"}, Leader: c.leader, Epoch: 1}}}
			got := planMoves(planInput{topics: []Topic{tp}, members: members, limit: 2})
			if len(got) != 1 || got[0].To != "" || got[0].Cause != CauseRF {
				t.Fatalf("plan: %+v, want one removal", got)
			}
			var left []string
			live, liveBefore := 0, 0
			for _, r := range tp.Placement[0].Replicas {
				if members[r].Status == StatusAlive {
					liveBefore++
				}
				if r != got[0].From {
					left = append(left, r)
					if members[r].Status == StatusAlive {
						live++
					}
				}
			}
			// Some removal keeps a live majority when the live replicas (at most the new
			// group's size) are a majority of the new group.
			if majority := len(left)/2 + 1; live < majority && min(liveBefore, len(left)) >= majority {
				t.Fatalf("the plan removes the replica on %s: the group is left with voters %v, %d of them live: no quorum without a member that may never return", got[0].From, left, live)
			}
			if got[0].From != c.want {
				t.Fatalf("the plan removes the replica on %s, not on %s (the group is left with voters %v)", got[0].From, c.want, left)
			}
		})
	}
}

// TestADecommissionWithNowhereToGoKeepsALiveQuorum: a partition on n1 (alive), n2
// (dead) and n3 (decommissioning, alive), its replication factor lowered to 2, and no
// free member to move n3's replica to. The plan must drop the dead replica, not the
// live one that is leaving: the group {n1, n2} has one live voter of two, no quorum.
// On the old code the decommission step came first and removed n3's replica.
func TestADecommissionWithNowhereToGoKeepsALiveQuorum(t *testing.T) {
	members := map[string]Member{
		"n1": {ID: "n1", Status: StatusAlive},
		"n2": {ID: "n2", Status: StatusDead},
		"n3": {ID: "n3", Status: StatusDecommissioning},
	}
	tp := Topic{Name: "down", Incarnation: 1, TopicConfig: TopicConfig{Partitions: 1, ReplicationFactor: 2},
		Placement: []Placement{{Replicas: []string{"n1", "n2", "n3"}, Leader: "n1", Epoch: 1}}}
	got := planMoves(planInput{topics: []Topic{tp}, members: members, limit: 2})
	if len(got) != 1 || got[0].To != "" {
		t.Fatalf("plan: %+v, want one removal", got)
	}
	if got[0].From != "n2" {
		t.Errorf("the plan removes the replica on %s (cause %s), leaving n2's, which is dead: want n2's removed", got[0].From, got[0].Cause)
	}
	// With the dead replica gone and nowhere to go, the leaving one stays for now.
	tp.Placement[0].Replicas = []string{"n1", "n3"}
	if got := planMoves(planInput{topics: []Topic{tp}, members: members, limit: 2}); len(got) != 0 {
		t.Errorf("plan for {n1, n3 leaving} at factor 2 with no free member: %+v, want none", got)
	}
}
