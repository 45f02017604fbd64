package check

import (
	"regexp"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

const msec = int64(time.Millisecond)

// h builds small histories: one parent topic with a 1 s lease.
type h struct{ es []history.Entry }

func newH() *h {
	return &h{es: []history.Entry{
		{Kind: history.KindRun, Run: &history.RunInfo{Seed: 1, Topics: []history.TopicInfo{{Name: "orders", Partitions: 1, VisibilityMs: 1000, RetentionMs: 1 << 40}}}},
		{Kind: history.KindPhase, Detail: "drain", Call: 1e12},
		{Kind: history.KindPhase, Detail: "done", Call: 1e12 + 1},
	}}
}

func (x *h) produce(id string, off int64, at int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindOp, Op: history.OpProduce, Topic: "orders", Msg: id, Offset: off, Call: at, Return: at + msec, Status: 202})
	return x
}

func (x *h) deliver(id string, off int64, handle string, at int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindOp, Op: history.OpConsume, Topic: "orders", Msg: id, Offset: off, Handle: handle, Call: at, Return: at + msec, Status: 200})
	return x
}

func (x *h) settle(op, id string, off int64, handle string, at int64, status int) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindOp, Op: op, Topic: "orders", Msg: id, Offset: off, Handle: handle, Call: at, Return: at + msec, Status: status})
	return x
}

// spans makes the last entry's call and return these.
func (x *h) spans(call, ret int64) *h {
	x.es[len(x.es)-1].Call, x.es[len(x.es)-1].Return = call, ret
	return x
}

func (x *h) kill(start, end int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindFault, Fault: history.FaultKill, Call: start, Return: end})
	return x
}

func (x *h) stats(at, hw, frontier int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindStats, Topic: "orders", Call: at, Return: at + msec, HighWatermark: hw, Frontier: frontier, Offset: hw})
	return x
}

func TestCheckerCases(t *testing.T) {
	s := int64(time.Second)
	cases := []struct {
		name string
		h    *h
		want string // a violation kind, "lost", or "" for a legal history
		dup  string // the cause the one duplicate must get
	}{
		{"clean", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204), "", ""},
		{"lost", newH().produce("a", 0, 0), "lost", ""},
		// The second delivery is called before the nack that freed the message and
		// returns after it: legal. A redelivery after the ack must be blamed, not that
		// delivery (the first one in call order no state takes).
		{"delivered again as a nack of it ran", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).deliver("a", 0, "h2", 0).spans(12*msec, 30*msec).settle(history.OpNack, "a", 0, "h1", 20*msec, 204).settle(history.OpAck, "a", 0, "h2", 40*msec, 204), "", "nack"},
		{"acked redelivered, a delivery before it overlapping a nack", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).deliver("a", 0, "h2", 0).spans(12*msec, 30*msec).settle(history.OpNack, "a", 0, "h1", 20*msec, 204).settle(history.OpAck, "a", 0, "h2", 40*msec, 204).deliver("a", 0, "h3", 5*s), "acked-redelivered", ""},
		{"acked redelivered", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).deliver("a", 0, "h2", 5*s), "acked-redelivered", ""},
		{"acked redelivered, ack raced a kill", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).kill(20*msec, 100*msec).deliver("a", 0, "h2", 5*s), "", CauseKill},
		{"acked, kill long before", newH().kill(0, msec).produce("a", 0, 2*msec).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).deliver("a", 0, "h2", 5*s), "acked-redelivered", ""},
		{"second delivery under a live lease", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).deliver("a", 0, "h2", 500*msec), "delivered-under-live-lease", ""},
		{"lease lapse", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).deliver("a", 0, "h2", 1200*msec).settle(history.OpAck, "a", 0, "h2", 1300*msec, 204), "", CauseLeaseLapse},
		{"nack", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpNack, "a", 0, "h1", 20*msec, 204).deliver("a", 0, "h2", 30*msec), "", CauseNack},
		{"restart drops the lease", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).kill(50*msec, 60*msec).deliver("a", 0, "h2", 300*msec), "", CauseKill},
		{"410 on a live lease", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 410).deliver("a", 0, "h2", 2*s), "410-on-live-lease", ""},
		{"204 after the lease surely lapsed", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 3*s, 204), "204-on-dead-lease", ""},
		{"204 on a handle from before a restart", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).kill(50*msec, 60*msec).settle(history.OpAck, "a", 0, "h1", 100*msec, 204), "204-on-dead-lease", ""},
		{"410 once retention may have deleted it", func() *h {
			x := newH()
			x.es[0].Run.Topics[0].RetentionMs = 1000
			return x.produce("a", 0, 0).deliver("a", 0, "h1", 900*msec).settle(history.OpAck, "a", 0, "h1", 1100*msec, 410).stats(2*s, 1, 1)
		}(), "", ""},
		{"frontier backwards", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).stats(30*msec, 1, 1).stats(40*msec, 1, 0), "frontier-backwards", ""},
		{"202 above the high watermark", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).stats(30*msec, 0, 0), "202-not-below-high-watermark", ""},
		{"two payloads at one offset", newH().produce("a", 0, 0).produce("b", 0, 5*msec).deliver("a", 0, "h1", 10*msec).deliver("b", 0, "h2", 2*s), "two-payloads-at-one-offset", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.h.es)
			switch {
			case c.want == "" && !r.OK():
				t.Fatalf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
			case c.want == "lost" && r.Lost["orders"] != 1:
				t.Fatalf("lost %v, want orders 1", r.Lost)
			case c.want != "" && c.want != "lost" && r.Violations[c.want] == 0:
				t.Fatalf("violations %v, want %s (%v)", r.Violations, c.want, r.Examples)
			}
			if c.dup != "" && r.Duplicates[c.dup] != 1 {
				t.Fatalf("duplicates %v, want one %s", r.Duplicates, c.dup)
			}
		})
	}
}

// op appends one operation line.
func (x *h) op(e history.Entry) *h {
	e.Kind = history.KindOp
	if e.Return == 0 {
		e.Return = e.Call + msec
	}
	x.es = append(x.es, e)
	return x
}

func (x *h) clockStep(at, offset int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: at, Return: at, ClockOffset: offset})
	return x
}

// nodeClock is a cluster's clock fault: node runs with offset from at on.
func (x *h) nodeClock(at int64, node string, offset int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: at, Return: at, Target: node, ClockOffset: offset})
	return x
}

// nodeDrift is nodeClock with a clock that gains drift seconds a second from at on.
func (x *h) nodeDrift(at int64, node string, offset int64, drift float64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: at, Return: at, Target: node, ClockOffset: offset, ClockDrift: drift})
	return x
}

// delayH is a parent orders with a delay child orders.later (1 s): message a produced at
// 0, stamped 1000 in the parent, delivered and acked there; its copy is delivered at
// copyAt, stamped copyTS.
func delayH(copyAt, copyTS int64) *h {
	x := newH()
	x.es[0].Run.Topics = append(x.es[0].Run.Topics, history.TopicInfo{Name: "orders.later", Partitions: 1, VisibilityMs: 1000, RetentionMs: 1 << 40, Parent: "orders", DelayMs: 1000})
	x.produce("a", 0, 0)
	x.op(history.Entry{Op: history.OpConsume, Topic: "orders", Msg: "a", Handle: "h1", Call: 10 * msec, Status: 200, Timestamp: 1000})
	x.op(history.Entry{Op: history.OpAck, Topic: "orders", Msg: "a", Handle: "h1", Call: 20 * msec, Status: 204})
	x.op(history.Entry{Op: history.OpConsume, Topic: "orders.later", Msg: "a", Handle: "c1", Call: copyAt, Status: 200, Timestamp: copyTS})
	x.op(history.Entry{Op: history.OpAck, Topic: "orders.later", Msg: "a", Handle: "c1", Call: copyAt + 10*msec, Status: 204})
	return x
}

// TestClockSteps: a delay copy may come early (by the run's clock) only by what a
// forward clock step across a restart between the parent's stamp and the copy explains;
// stamps never go back within a partition.
func TestClockSteps(t *testing.T) {
	s := int64(time.Second)
	cases := []struct {
		name string
		h    *h
		want string
	}{
		{"delay kept", delayH(1100*msec, 2100), ""},
		{"delay early, no step", delayH(500*msec, 2100), "delay-early"},
		{"delay early after a forward step", delayH(500*msec, 11000).kill(50*msec, 60*msec).clockStep(70*msec, 10*s), ""},
		{"delay early after a backward step", delayH(500*msec, 2100).kill(50*msec, 60*msec).clockStep(70*msec, -10*s), "delay-early"},
		{"delay early by more than the forward step", delayH(500*msec, 2100).kill(50*msec, 60*msec).clockStep(70*msec, 200*msec), "delay-early"},
		{"stamped after a step back, copied after the step forward again", delayH(500*msec, 2100).clockStep(-100*msec, -s).kill(150*msec, 160*msec).clockStep(170*msec, 0), ""},
		{"stamped before a step back and forward again", delayH(500*msec, 2100).kill(50*msec, 60*msec).clockStep(70*msec, -s).kill(150*msec, 160*msec).clockStep(170*msec, 0), "delay-early"},
		{"forward step before the produce does not count", delayH(500*msec, 2100).clockStep(-s, 10*s), "delay-early"},
		{"copy stamped before the parent's stamp plus the delay", delayH(1100*msec, 1500), "delay-early"},
		// In a cluster each node has its own offset and the others run with none: a node
		// ahead decides a copy early, or a node behind stamps the parent early.
		{"cluster: a node ahead copies early, by its offset", delayH(500*msec, 1500).nodeClock(-s, "n2", s), ""},
		{"cluster: a node behind stamped the parent", delayH(500*msec, 1500).nodeClock(-s, "n2", -s), ""},
		{"cluster: early by more than the nodes' offsets differ", delayH(500*msec, 2100).nodeClock(-s, "n2", 200*msec), "delay-early"},
		{"cluster: copy stamped early by more than the offsets differ", delayH(1100*msec, 1500).nodeClock(-s, "n2", 200*msec), "delay-early"},
		// The copy's stamper went further behind after the parent was stamped (here a
		// step back; a clock drifting back does it too): it stamps the copy by its
		// offset then, not by its offset during the parent's stamping.
		{"cluster: the copy's stamper stepped back after the parent's stamp", delayH(2500*msec, 1200).nodeClock(1500*msec, "n2", -s), ""},
		{"cluster: copy stamped early by more than that step back", delayH(2500*msec, 800).nodeClock(1500*msec, "n2", -s), "delay-early"},
		// A drifting node's offset grows: 0 at -1 s, gaining 1 s a second, it is 1.5 s
		// ahead at 0.5 s; gaining 0.1 s a second, 0.15 s.
		{"cluster: a drifting node ahead copies early, by what it gained", delayH(500*msec, 1500).nodeDrift(-s, "n2", 0, 1), ""},
		{"cluster: early by more than a drift gained", delayH(500*msec, 1500).nodeDrift(-s, "n2", 0, 0.1), "delay-early"},
		// The drifting process started after its line: 4 % of up to 2 s is 80 ms either
		// way. 440 ms ahead at -1 s and gaining 40 ms a second, n2 is at most 500 ms
		// ahead by 0.5 s, 580 ms with the slack: a copy stamped 568 ms early is legal
		// only with it; one stamped 698 ms early is not.
		{"cluster: a drifting node's start slack", delayH(500*msec, 1430).nodeDrift(-s, "n2", 440*msec, 0.04), ""},
		{"cluster: early by more than a drift's start slack", delayH(500*msec, 1300).nodeDrift(-s, "n2", 440*msec, 0.04), "delay-early"},
		{"timestamps back within a partition", newH().produce("a", 0, 0).produce("b", 1, msec).
			op(history.Entry{Op: history.OpConsume, Topic: "orders", Msg: "a", Offset: 0, Handle: "h1", Call: 10 * msec, Status: 200, Timestamp: 5000}).
			op(history.Entry{Op: history.OpConsume, Topic: "orders", Msg: "b", Offset: 1, Handle: "h2", Call: 10 * msec, Status: 200, Timestamp: 4000}), "timestamp-backwards"},
		{"one offset, two stamps", newH().produce("a", 0, 0).
			op(history.Entry{Op: history.OpConsume, Topic: "orders", Msg: "a", Handle: "h1", Call: 10 * msec, Status: 200, Timestamp: 5000}).
			kill(20*msec, 30*msec).
			op(history.Entry{Op: history.OpConsume, Topic: "orders", Msg: "a", Handle: "h2", Call: 40 * msec, Status: 200, Timestamp: 5001}), "timestamp-changed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.h.es)
			if c.want == "" && !r.OK() {
				t.Fatalf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
			}
			if c.want != "" && r.Violations[c.want] == 0 {
				t.Fatalf("violations %v, want %s (%v)", r.Violations, c.want, r.Examples)
			}
		})
	}
}

// recH is a recreated topic: incarnation 10 created at 0, deleted from 1 s to 1.01 s,
// incarnation 20 created from 1.1 s to 1.11 s. Message a is written to incarnation 10
// at offset 0 (100 ms), message b to incarnation 20 at offset 0 (1.2 s).
func recH() *h {
	x := &h{es: []history.Entry{
		{Kind: history.KindRun, Run: &history.RunInfo{Seed: 1, Topics: []history.TopicInfo{{Name: "recycled", Partitions: 1, VisibilityMs: 1000, RetentionMs: 1 << 40, Recreated: true}}}},
		{Kind: history.KindPhase, Detail: "drain", Call: 1e12},
		{Kind: history.KindPhase, Detail: "done", Call: 1e12 + 1},
	}}
	return x.op(history.Entry{Op: history.OpCreateTopic, Topic: "recycled", Call: 0, Status: 201, Incarnation: 10}).
		op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "a", Call: 100 * msec, Status: 202}).
		op(history.Entry{Op: history.OpDeleteTopic, Topic: "recycled", Call: 1000 * msec, Return: 1010 * msec, Status: 204}).
		op(history.Entry{Op: history.OpCreateTopic, Topic: "recycled", Call: 1100 * msec, Return: 1110 * msec, Status: 201, Incarnation: 20}).
		op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "b", Call: 1200 * msec, Status: 202})
}

func (x *h) rdeliver(id string, inc int64, handle string, at int64) *h {
	return x.op(history.Entry{Op: history.OpConsume, Topic: "recycled", Msg: id, Incarnation: inc, Handle: handle, Call: at, Status: 200, Timestamp: 1000})
}

func (x *h) rsettle(op string, inc int64, handle string, at int64, status int) *h {
	return x.op(history.Entry{Op: op, Topic: "recycled", Incarnation: inc, Handle: handle, Call: at, Status: status})
}

// TestIncarnations: nothing of a deleted incarnation appears in the next one, old
// handles never settle anything, and messages deleted with their topic are not lost.
func TestIncarnations(t *testing.T) {
	cases := []struct {
		name    string
		h       *h
		want    string // a violation kind, "lost", or "" for a legal history
		dropped int
	}{
		{"each in its own", recH().rdeliver("a", 10, "h1", 200*msec).rsettle(history.OpAck, 10, "h1", 210*msec, 204).
			rdeliver("b", 20, "h2", 1300*msec).rsettle(history.OpAck, 20, "h2", 1310*msec, 204), "", 0},
		{"a deleted with its incarnation", recH().rdeliver("b", 20, "h2", 1300*msec).rsettle(history.OpAck, 20, "h2", 1310*msec, 204), "", 1},
		{"b never delivered", recH().rdeliver("a", 10, "h1", 200*msec).rsettle(history.OpAck, 10, "h1", 210*msec, 204), "lost", 0},
		{"old message in the new incarnation", recH().rdeliver("a", 20, "h1", 1300*msec).rdeliver("b", 20, "h2", 1300*msec), "old-incarnation-delivered", 0},
		{"new message from the dead incarnation", recH().rdeliver("b", 10, "h2", 1300*msec), "delivery-from-dead-incarnation", 1},
		{"new message under the old incarnation's handle", recH().rdeliver("b", 10, "h2", 1300*msec), "incarnation-crossed", 1},
		{"old handle acked: 410", recH().rdeliver("a", 10, "h1", 200*msec).rsettle(history.OpAck, 10, "h1", 1500*msec, 410).
			rdeliver("b", 20, "h2", 1300*msec).rsettle(history.OpAck, 20, "h2", 1310*msec, 204), "", 0},
		{"old handle acked between delete and create: 404", recH().rdeliver("a", 10, "h1", 200*msec).rsettle(history.OpAck, 10, "h1", 1050*msec, 404).
			rdeliver("b", 20, "h2", 1300*msec).rsettle(history.OpAck, 20, "h2", 1310*msec, 204), "", 0},
		{"old handle acked: 204", recH().rdeliver("a", 10, "h1", 200*msec).rsettle(history.OpAck, 10, "h1", 1500*msec, 204).
			rdeliver("b", 20, "h2", 1300*msec), "stale-handle-settled", 0},
		{"old handle renewed: 204", recH().rdeliver("a", 10, "h1", 200*msec).rsettle(history.OpExtend, 10, "h1", 1500*msec, 204).
			rdeliver("b", 20, "h2", 1300*msec), "stale-handle-settled", 0},
		{"404 while no topic", recH().op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "c", Call: 1050 * msec, Status: 404}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec), "", 0},
		{"404 while the topic surely exists", recH().op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "c", Call: 1500 * msec, Status: 404}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec), "404-while-topic-exists", 0},
		{"a produce racing the delete may be in either", recH().op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "r", Offset: 1, Call: 900 * msec, Return: 1150 * msec, Status: 202}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec).
			op(history.Entry{Op: history.OpConsume, Topic: "recycled", Msg: "r", Offset: 1, Incarnation: 20, Handle: "h3", Call: 1300 * msec, Status: 200, Timestamp: 1000}), "", 0},
		{"a produce started after the create returned is pinned", recH().op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "r", Offset: 1, Call: 1120 * msec, Status: 202}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec).
			op(history.Entry{Op: history.OpConsume, Topic: "recycled", Msg: "r", Offset: 1, Incarnation: 10, Handle: "h3", Call: 1300 * msec, Status: 200, Timestamp: 1000}), "incarnation-crossed", 0},
		{"an unanswered create, then 409: the read names the incarnation", func() *h {
			x := recH()
			x.es = x.es[:len(x.es)-2] // no create of 20, no b
			return x.op(history.Entry{Op: history.OpCreateTopic, Topic: "recycled", Call: 1100 * msec, Return: 1150 * msec, Status: 0}).
				op(history.Entry{Op: history.OpCreateTopic, Topic: "recycled", Call: 1300 * msec, Status: 409}).
				op(history.Entry{Kind: history.KindStats, Topic: "recycled", Call: 1400 * msec, Status: 200, Incarnation: 20}).
				op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "b", Call: 1500 * msec, Status: 202}).
				rdeliver("b", 20, "h2", 1600*msec)
		}(), "", 1},
		// A delete of incarnation 20 answered 503 timeout at 1.5 s, a stats sample showing
		// 20 after it, then 404s: the delete's command was committed by the next
		// controller later (a soak, seed 2222226017), legal within the bound; a 404
		// beyond it still counts.
		{"a delete of unknown outcome may take effect after its answer", recH().
			op(history.Entry{Op: history.OpDeleteTopic, Topic: "recycled", Call: 1500 * msec, Return: 1600 * msec, Status: 503, Code: "timeout"}).
			op(history.Entry{Kind: history.KindStats, Topic: "recycled", Call: 1700 * msec, Status: 200, Incarnation: 20, HighWatermark: 1, Offset: 1}).
			op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "c", Call: 2800 * msec, Status: 404}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec), "", 0},
		{"a delete refused as unavailable took no effect", recH().
			op(history.Entry{Op: history.OpDeleteTopic, Topic: "recycled", Call: 1500 * msec, Return: 1600 * msec, Status: 503, Code: "unavailable"}).
			op(history.Entry{Kind: history.KindStats, Topic: "recycled", Call: 1700 * msec, Status: 200, Incarnation: 20, HighWatermark: 1, Offset: 1}).
			op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "c", Call: 2800 * msec, Status: 404}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec), "404-while-topic-exists", 0},
		{"a delete of unknown outcome lands within its bound", recH().
			op(history.Entry{Op: history.OpDeleteTopic, Topic: "recycled", Call: 1500 * msec, Return: 1600 * msec, Status: 503, Code: "timeout"}).
			op(history.Entry{Kind: history.KindStats, Topic: "recycled", Call: 20_000 * msec, Status: 200, Incarnation: 20, HighWatermark: 1, Offset: 1}).
			op(history.Entry{Op: history.OpProduce, Topic: "recycled", Msg: "c", Call: 21_000 * msec, Status: 404}).
			rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec), "404-while-topic-exists", 0},
		{"an unreadable handle", recH().rdeliver("a", 0, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec), "handle-incarnation-unreadable", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The stats case appended a KindStats through op; restore its kind.
			for i := range c.h.es {
				if c.h.es[i].Incarnation != 0 && c.h.es[i].Op == "" && c.h.es[i].Kind == history.KindOp {
					c.h.es[i].Kind = history.KindStats
				}
			}
			r := Check(c.h.es)
			switch {
			case c.want == "" && !r.OK():
				t.Fatalf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
			case c.want == "lost" && r.Lost["recycled"] != 1:
				t.Fatalf("lost %v, want recycled 1 (%v)", r.Lost, r.Examples)
			case c.want != "" && c.want != "lost" && r.Violations[c.want] == 0:
				t.Fatalf("violations %v, want %s (%v)", r.Violations, c.want, r.Examples)
			}
			if r.DroppedWithTopic != c.dropped {
				t.Fatalf("dropped with a deleted incarnation: %d, want %d", r.DroppedWithTopic, c.dropped)
			}
		})
	}
}

// The error messages a 503 storage_failed carries (as the workload records them).
const (
	errUndone    = `503 {"error":{"code":"storage_failed","message":"a disk write failed and the request was not stored; retry later"}}`
	errPartly    = `503 {"error":{"code":"storage_failed","message":"a disk write failed and only part of the batch was stored: 2 messages went to partitions whose writes succeeded and will be delivered; the messages for partition(s) 1 were not stored."}}`
	errNotUndone = `503 {"error":{"code":"maybe_stored","message":"a disk write failed and the broker could not undo it: the request was not acknowledged, but it may be found stored after the node restarts"}}`
)

// codeIn reads the error code of an answer as the workload records it.
func codeIn(errText string) string {
	m := regexp.MustCompile(`"code":"([a-z_]+)"`).FindStringSubmatch(errText)
	if m == nil {
		return ""
	}
	return m[1]
}

func (x *h) failedProduce(id string, at int64, errText string, batch bool) *h {
	return x.op(history.Entry{Op: history.OpProduce, Topic: "orders", Msg: id, Offset: -1, Call: at, Status: 503, Code: codeIn(errText), Err: errText, Batch: batch})
}

func (x *h) failedAck(id string, off int64, handle string, at int64, errText string) *h {
	return x.op(history.Entry{Op: history.OpAck, Topic: "orders", Msg: id, Offset: off, Handle: handle, Call: at, Status: 503, Code: codeIn(errText), Err: errText})
}

// TestStorageFailed: a 503 storage_failed whose write was undone stored nothing (a single
// produce's message never appears, an ack settled nothing); one that says the broker could
// not undo the write is an unknown outcome: the message may appear after a restart, the
// ack may turn out settled.
func TestStorageFailed(t *testing.T) {
	cases := []struct {
		name string
		h    *h
		bad  bool
	}{
		{"undone produce, delivered", newH().failedProduce("a", 0, errUndone, false).kill(50*msec, 60*msec).
			deliver("a", 0, "h1", 100*msec).settle(history.OpAck, "a", 0, "h1", 110*msec, 204), true},
		{"undone produce, not delivered", newH().failedProduce("a", 0, errUndone, false).kill(50*msec, 60*msec), false},
		{"not undone produce, found after the restart", newH().failedProduce("a", 0, errNotUndone, false).kill(50*msec, 60*msec).
			deliver("a", 0, "h1", 100*msec).settle(history.OpAck, "a", 0, "h1", 110*msec, 204), false},
		{"batch produce stored in part, delivered", newH().failedProduce("a", 0, errPartly, true).
			deliver("a", 0, "h1", 100*msec).settle(history.OpAck, "a", 0, "h1", 110*msec, 204), false},
		{"undone batch produce, delivered", newH().failedProduce("a", 0, errUndone, true).
			deliver("a", 0, "h1", 100*msec).settle(history.OpAck, "a", 0, "h1", 110*msec, 204), true},
		{"undone batch produce, not delivered", newH().failedProduce("a", 0, errUndone, true).kill(50*msec, 60*msec), false},
		{"a 4xx produce, delivered", newH().op(history.Entry{Op: history.OpProduce, Topic: "orders", Msg: "a", Offset: -1, Call: 0, Status: 404, Code: "topic_not_found"}).
			deliver("a", 0, "h1", 100*msec), true},
		{"undone ack: handed back and delivered again", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).
			failedAck("a", 0, "h1", 20*msec, errUndone).deliver("a", 0, "h2", 30*msec).settle(history.OpAck, "a", 0, "h2", 40*msec, 204), false},
		{"not undone ack: handed back and delivered again", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).
			failedAck("a", 0, "h1", 20*msec, errNotUndone).deliver("a", 0, "h2", 30*msec).settle(history.OpAck, "a", 0, "h2", 40*msec, 204), false},
		{"not undone ack: settled after the restart", newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).
			failedAck("a", 0, "h1", 20*msec, errNotUndone).kill(50*msec, 60*msec), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The injected disk error the 503s answer.
			es := append(c.h.es, history.Entry{Kind: history.KindFault, Fault: history.FaultDisk, Target: "segment-after-write", Call: 0, Return: 30 * msec})
			r := Check(es)
			switch {
			case !c.bad && !r.OK():
				t.Fatalf("flagged a legal history: violations %v lost %v unexpected %d %v", r.Violations, r.Lost, r.Unexpected, r.Examples)
			case c.bad && r.Unexpected != 1:
				t.Fatalf("unexpected %d, want 1: a message no attempt stored was delivered (%v)", r.Unexpected, r.Examples)
			}
		})
	}
}

func (x *h) damaged(target, id string, off int64, at int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindFault, Fault: history.FaultDamaged, Target: target, Topic: "orders", Msg: id, Offset: off, Call: at, Return: at + msec})
	return x
}

func (x *h) skipped(target string, off int64, at int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindFault, Fault: history.FaultSkipped, Target: target, Topic: "orders", Offset: off, Call: at, Return: at})
	return x
}

// TestCheckerDamage: a message the harness damaged may stay undelivered only if the node
// reported skipping it; an acked message may come back only if the harness damaged the
// settle record of its ack and the node reported skipping one there. Nothing else.
func TestCheckerDamage(t *testing.T) {
	s := int64(time.Second)
	acked := func() *h {
		return newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204)
	}
	cases := []struct {
		name string
		h    *h
		want string // a violation kind, "lost", or "" for legal
	}{
		{"damaged and skipped", newH().produce("a", 0, 0).kill(s, s+msec).damaged("log", "a", 0, 2*s).skipped("log", 0, 3*s), ""},
		{"damaged, never reported", newH().produce("a", 0, 0).kill(s, s+msec).damaged("log", "a", 0, 2*s), "lost"},
		{"skipped, never damaged", newH().produce("a", 0, 0).skipped("log", 0, 3*s), "skipped-undamaged"},
		{"damaged another message, this one skipped", newH().produce("a", 0, 0).produce("b", 1, 0).damaged("log", "b", 1, 2*s).skipped("log", 0, 3*s), "skipped-undamaged"},
		{"settle damaged and reported", acked().kill(s, s+msec).damaged("journal", "a", 0, 2*s).skipped("journal", -1, 3*s).deliver("a", 0, "h2", 4*s).settle(history.OpAck, "a", 0, "h2", 4*s+10*msec, 204), ""},
		{"settle damaged, never reported", acked().kill(s, s+msec).damaged("journal", "a", 0, 2*s).deliver("a", 0, "h2", 4*s), "acked-redelivered"},
		{"settle skip reported, never damaged", acked().kill(s, s+msec).skipped("journal", -1, 3*s).deliver("a", 0, "h2", 4*s), "skipped-undamaged"},
		{"frontier back to a damaged settle's message", acked().stats(30*msec, 1, 1).kill(s, s+msec).damaged("journal", "a", 0, 2*s).skipped("journal", -1, 3*s).stats(4*s, 1, 0).deliver("a", 0, "h2", 5*s).settle(history.OpAck, "a", 0, "h2", 5*s+10*msec, 204), ""},
		{"frontier back, settle damaged elsewhere", newH().produce("a", 0, 0).produce("b", 1, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).deliver("b", 1, "g1", 10*msec).settle(history.OpAck, "b", 1, "g1", 20*msec, 204).stats(30*msec, 2, 2).kill(s, s+msec).damaged("journal", "b", 1, 2*s).skipped("journal", -1, 3*s).stats(4*s, 2, 0).deliver("b", 1, "g2", 5*s).settle(history.OpAck, "b", 1, "g2", 5*s+10*msec, 204), "frontier-backwards"},
		// The seed 15225761 shape (5 December): a redelivery that overlapped the nack
		// of the lease before it, then the ack of that redelivery undone by a damaged
		// settle record. The damage excuses the last delivery; the explanation of the
		// illegal history blamed the overlapping (legal) one, and the run failed.
		{"settle damaged after a redelivery that overlapped a nack", newH().produce("a", 0, 0).
			deliver("a", 0, "h1", 10*msec).
			op(history.Entry{Kind: history.KindOp, Op: history.OpConsume, Topic: "orders", Msg: "a", Offset: 0, Handle: "h2", Call: 5 * msec, Return: 22 * msec, Status: 200}).
			op(history.Entry{Kind: history.KindOp, Op: history.OpNack, Topic: "orders", Msg: "a", Offset: 0, Handle: "h1", Call: 20 * msec, Return: 23 * msec, Status: 204}).
			settle(history.OpAck, "a", 0, "h2", 25*msec, 204).
			kill(s, s+msec).damaged("journal", "a", 0, 2*s).skipped("journal", -1, 3*s).
			deliver("a", 0, "h3", 4*s).settle(history.OpAck, "a", 0, "h3", 4*s+10*msec, 204), ""},
		// The damage excuses the delivery after it, not everything after that: the
		// redelivery's ack answered 204 once its lease had surely lapsed (visibility
		// 1 s) is still a violation.
		{"settle damaged, then the redelivery acked after its lease", acked().kill(s, s+msec).damaged("journal", "a", 0, 2*s).skipped("journal", -1, 3*s).deliver("a", 0, "h2", 4*s).settle(history.OpAck, "a", 0, "h2", 7*s, 204), "204-on-dead-lease"},
		// The damage undoes the ack it hit, not the ack of the redelivery after it,
		// which wrote a record of its own: a delivery after that one is a violation
		// (the checker passed it: the kill loop's self-test, seed 285561323).
		{"settle damaged, the redelivery acked, then delivered again", acked().kill(s, s+msec).damaged("journal", "a", 0, 2*s).skipped("journal", -1, 3*s).deliver("a", 0, "h2", 4*s).settle(history.OpAck, "a", 0, "h2", 4*s+10*msec, 204).deliver("a", 0, "h3", 6*s), "acked-redelivered"},
		{"settle damaged before the ack", newH().produce("a", 0, 0).damaged("journal", "a", 0, 5*msec).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).skipped("journal", -1, 3*s).deliver("a", 0, "h2", 4*s), "acked-redelivered"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.h.es)
			switch {
			case c.want == "" && !r.OK():
				t.Fatalf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
			case c.want == "lost" && r.Lost["orders"] != 1:
				t.Fatalf("lost %v, want orders 1", r.Lost)
			case c.want != "" && c.want != "lost" && r.Violations[c.want] == 0:
				t.Fatalf("violations %v, want %s (%v)", r.Violations, c.want, r.Examples)
			}
		})
	}
}

// TestReplays: a replay shows the message stored at an offset, written by an attempt
// sent before the read answered; anything else is flagged.
func TestReplays(t *testing.T) {
	read := func(x *h, id string, off, at int64) *h {
		return x.op(history.Entry{Op: history.OpRead, Topic: "orders", Msg: id, Offset: off, Call: at, Status: 200, Timestamp: 1000})
	}
	acked := func() *h {
		return newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204)
	}
	cases := []struct {
		name string
		h    *h
		want string
	}{
		{"replayed after its ack", read(acked(), "a", 0, 30*msec), ""},
		{"another payload at its offset", read(acked(), "b", 0, 30*msec), "two-payloads-at-one-offset"},
		{"never produced", read(acked(), "z", 1, 30*msec), "unexpected"},
		{"before its produce was sent", read(newH().produce("a", 0, 100*msec).deliver("a", 0, "h1", 110*msec).settle(history.OpAck, "a", 0, "h1", 120*msec, 204), "a", 0, 10*msec), "replayed-before-produced"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.h.es)
			switch {
			case c.want == "" && !r.OK():
				t.Fatalf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
			case c.want == "unexpected" && r.Unexpected != 1:
				t.Fatalf("unexpected %d, want 1 (%v)", r.Unexpected, r.Examples)
			case c.want != "" && c.want != "unexpected" && r.Violations[c.want] == 0:
				t.Fatalf("violations %v, want %s (%v)", r.Violations, c.want, r.Examples)
			}
			if c.want == "" && r.Replayed != 1 {
				t.Fatalf("replayed %d, want 1", r.Replayed)
			}
		})
	}
}

// TestBatchPartlyStoredBeforeItsTopicWasDeleted: a batch answered 404 because its topic
// was deleted while it was written, saying part of it was stored, may have stored any
// of its messages (and they may be delivered before the delete); a plain 404 stored
// nothing.
func TestBatchPartlyStoredBeforeItsTopicWasDeleted(t *testing.T) {
	const partly = `404 {"error":{"code":"topic_not_found","message":"the topic was deleted while the batch was written and only part of the batch was stored: 2 messages went to partitions whose writes succeeded and will be delivered; the messages for partition(s) 1 were not stored (the stored ones may have been delivered before the delete, and are deleted with the topic)."}}`
	for _, c := range []struct {
		errText string
		want    int // unexpected deliveries
	}{{partly, 0}, {`404 {"error":{"code":"topic_not_found","message":"no such topic; create it with POST /v1/topics"}}`, 1}} {
		x := newH().op(history.Entry{Op: history.OpProduce, Topic: "orders", Msg: "a", Offset: -1, Call: 0, Return: 50 * msec, Status: 404, Code: "topic_not_found", Err: c.errText, Batch: true}).
			deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204)
		if r := Check(x.es); r.Unexpected != c.want {
			t.Errorf("%.60s…: unexpected %d, want %d (%v)", c.errText, r.Unexpected, c.want, r.Examples)
		}
	}
}

// TestIntentWithoutAnAnswer: a produce whose intent line is in the history but whose
// answer is not (the run died with it on its way) was sent without an answer: its
// message may be delivered, and is not lost if it never is.
func TestIntentWithoutAnAnswer(t *testing.T) {
	intent := history.Entry{Kind: history.KindIntent, Client: "p0", Op: history.OpProduce, Topic: "orders", Msg: "a", Attempt: 1, Call: 0}
	delivered := newH()
	delivered.es = append(delivered.es, intent)
	delivered.deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204)
	if r := Check(delivered.es); r.Unexpected != 0 {
		t.Errorf("a message sent without a recorded answer and delivered counted unexpected (%v)", r.Examples)
	}
	silent := newH()
	silent.es = append(silent.es, intent)
	if r := Check(silent.es); len(r.Lost) != 0 || r.Produced != 1 {
		t.Errorf("a message sent without a recorded answer, never delivered: lost %v, attempts %d; want none lost, one attempt", r.Lost, r.Produced)
	}
	answered := newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204)
	answered.es = append(answered.es, history.Entry{Kind: history.KindIntent, Client: answered.es[len(answered.es)-3].Client, Op: history.OpProduce, Topic: "orders", Msg: "a", Call: 0})
	if r := Check(answered.es); r.Produced != 1 || !r.OK() {
		t.Errorf("an answered intent added an attempt (%d) or a finding (%v)", r.Produced, r.Violations)
	}
}
