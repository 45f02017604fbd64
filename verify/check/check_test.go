package check

import (
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
