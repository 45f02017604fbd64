package broker

import (
	"testing"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// TestLeftByKeepsTheCopyOfATargetAForcedTakeoverLeftOut: what a node does with a replica
// of partition 0 that is no longer placed on it, after the latest move that involves
// it. A forced takeover fails every active move of the partition, whatever its status:
// the target of one that had switched was a voter and may hold messages the survivor
// lacks, and its copy is kept (closed) as every replica a takeover leaves out is. The
// old code deleted it as a failed move's learner (a review of the moves, 5 December).
func TestLeftByKeepsTheCopyOfATargetAForcedTakeoverLeftOut(t *testing.T) {
	t.Parallel()
	tp := &topic{name: "t", incarnation: 7}
	move := func(from, to, status, reason string) meta.Move {
		return meta.Move{ID: 1, Topic: "t", Incarnation: 7, Partition: 0, From: from, To: to, Status: status, Reason: reason}
	}
	names := map[int]string{leaveOpen: "open", leaveClose: "close, keep the data", leaveDelete: "delete"}
	for _, tc := range []struct {
		name string
		mv   meta.Move
		want int
	}{
		{"the target of a move a forced takeover failed", move("n1", "me", meta.MoveFailed, meta.ReasonTakenOverByForce), leaveClose},
		{"the target of a move that failed copying", move("n1", "me", meta.MoveFailed, "the target node me is down or leaving"), leaveDelete},
		{"the target of a cancelled move", move("n1", "me", meta.MoveCancelled, "cancelled on request"), leaveDelete},
		{"the source of a removing move", move("me", "n2", meta.MoveRemoving, ""), leaveDelete},
		{"the source of a done move", move("me", "n2", meta.MoveDone, ""), leaveDelete},
		{"the source of a switching move", move("me", "n2", meta.MoveSwitching, ""), leaveOpen},
		{"the source of a move a forced takeover failed", move("me", "n2", meta.MoveFailed, meta.ReasonTakenOverByForce), leaveClose},
		{"the target of a switching move", move("n1", "me", meta.MoveSwitching, ""), leaveClose},
		{"a move of another incarnation", meta.Move{ID: 1, Topic: "t", Incarnation: 6, From: "n1", To: "me", Status: meta.MoveCancelled}, leaveClose},
	} {
		if _, got := leftBy([]meta.Move{tc.mv}, "me", tp, 0); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, names[got], names[tc.want])
		}
	}
}
