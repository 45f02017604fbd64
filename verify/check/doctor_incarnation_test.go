package check

import (
	"testing"

	"github.com/narad-mq/narad/verify/history"
)

// TestDoctorOldIncarnationAfterADeleteOfUnknownOutcome: the doctor took a delete of
// unknown outcome as landing at any time, so from the first such delete no later
// incarnation had a window it surely lived in, and a run with one early (TestKillLoop,
// seed 140717670: a kill cut the recycler's delete at 6.3 s) had nothing to doctor
// with old-incarnation, and the kill loop failed. The doctor now bounds such a delete
// as Check does (deleteLandsBy), and the checker flags what it doctored.
func TestDoctorOldIncarnationAfterADeleteOfUnknownOutcome(t *testing.T) {
	s := int64(1000 * msec)
	x := &h{es: []history.Entry{
		{Kind: history.KindRun, Run: &history.RunInfo{Seed: 1, Topics: []history.TopicInfo{{Name: "recycled", Partitions: 1, VisibilityMs: 1000, RetentionMs: 1 << 40, Recreated: true}}}},
		{Kind: history.KindPhase, Detail: "drain", Call: 1e12},
		{Kind: history.KindPhase, Detail: "done", Call: 1e12 + 1},
	}}
	x.op(history.Entry{Op: history.OpCreateTopic, Topic: "recycled", Call: 0, Status: 201, Incarnation: 10}).
		op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "a", Call: 100 * msec, Status: 202}).
		rdeliver("a", 10, "h1", 200*msec).
		// No answer: it may have deleted incarnation 10 then, or later.
		op(history.Entry{Op: history.OpDeleteTopic, Topic: "recycled", Call: 300 * msec, Return: 310 * msec, Status: 0}).
		op(history.Entry{Op: history.OpDeleteTopic, Topic: "recycled", Call: 11 * s, Return: 11*s + 10*msec, Status: 204}).
		op(history.Entry{Op: history.OpCreateTopic, Topic: "recycled", Call: 11*s + 100*msec, Return: 11*s + 110*msec, Status: 201, Incarnation: 20}).
		op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "b", Call: 11*s + 200*msec, Status: 202}).
		rdeliver("b", 20, "h2", 11*s+300*msec)
	doctored, what, err := Doctor(x.es, "old-incarnation")
	if err != nil {
		t.Fatalf("doctor old-incarnation: %v", err)
	}
	if r := Check(doctored); r.Violations["old-incarnation-delivered"] == 0 {
		t.Fatalf("doctored with old-incarnation (%s): flagged %v", what, r.Violations)
	}
}
