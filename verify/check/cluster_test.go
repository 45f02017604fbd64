package check

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// newCH is newH for a cluster run of three nodes.
func newCH() *h {
	x := newH()
	x.es[0].Run.Nodes = []string{"n1", "n2", "n3"}
	return x
}

// replicas adds every node's replica of orders/0 holding ids from offset 0, and the
// quiesce's last stats reading (high watermark len(ids)).
func (x *h) replicas(ids ...string) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindQuiesce, Detail: "ok", Call: 1e12 + 2, Return: 1e12 + 2})
	x.es = append(x.es, history.Entry{Kind: history.KindStats, Client: "quiesce", Topic: "orders", Call: 1e12 + 2, Return: 1e12 + 3, HighWatermark: int64(len(ids)), Offset: int64(len(ids))})
	for _, n := range []string{"n1", "n2", "n3"} {
		x.es = append(x.es, history.Entry{Kind: history.KindReplica, Node: n, Topic: "orders", Offset: 0, IDs: ids, Detail: "same", Call: 1e12 + 4, Return: 1e12 + 4})
	}
	return x
}

// onFive makes the run five nodes with orders at replication factor 3, and adds an
// empty replica of events (replication factor 2) on n4 and n5, so the replica lines
// name five nodes.
func (x *h) onFive() *h {
	x.es[0].Run.Nodes = []string{"n1", "n2", "n3", "n4", "n5"}
	x.es[0].Run.Topics[0].Replication = 3
	x.es[0].Run.Topics = append(x.es[0].Run.Topics, history.TopicInfo{Name: "events", Partitions: 1, VisibilityMs: 1000, RetentionMs: 1 << 40, Replication: 2})
	for _, n := range []string{"n4", "n5"} {
		x.es = append(x.es, history.Entry{Kind: history.KindReplica, Node: n, Topic: "events", Offset: 0, Detail: "same", Call: 1e12 + 4, Return: 1e12 + 4})
	}
	return x
}

func (x *h) producedWith(id string, status int, code string, at int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindOp, Op: history.OpProduce, Topic: "orders", Msg: id, Partition: -1, Offset: -1, Call: at, Return: at + msec, Status: status, Code: code})
	return x
}

// attempt sets the delivery attempt of the last entry.
func (x *h) attempt(n int) *h {
	x.es[len(x.es)-1].Attempt = n
	return x
}

// deliverSpan is deliver with a consume that took from call to ret.
func (x *h) deliverSpan(id string, off int64, handle string, call, ret int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindOp, Op: history.OpConsume, Topic: "orders", Msg: id, Offset: off, Handle: handle, Call: call, Return: ret, Status: 200})
	return x
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// realHandle is a receipt handle as a broker encodes it, of orders/0 (incarnation 0),
// with lease epoch epoch and sequence seq.
func realHandle(epoch uint32, seq uint64) string {
	b := []byte{1}
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint32(b, epoch)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	return base64.RawURLEncoding.EncodeToString(b)
}

func (x *h) epoch(at, epoch int64) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindStats, Topic: "orders", Call: at, Return: at + msec, HighWatermark: 1, Offset: 1, Epoch: epoch, Node: "n1", Target: "n1"})
	return x
}

// took adds a node's leader line for orders/0: how ("handover" or "election") it took
// the leadership at term.
func (x *h) took(term int64, how string) *h { return x.tookOn(0, term, how) }

// tookOn is took for partition p of orders.
func (x *h) tookOn(p int32, term int64, how string) *h {
	x.es = append(x.es, history.Entry{Kind: history.KindLeader, Node: "n2", Topic: "orders", Partition: p, Epoch: term, Detail: how, Call: 1e12 + 1, Return: 1e12 + 1, Offset: -1})
	return x
}

// TestClusterRules: a history of a cluster run is held to the cluster's contract, which
// is stricter than a single node's where a quorum makes it so.
func TestClusterRules(t *testing.T) {
	s := int64(time.Second)
	acked := func(x *h) *h {
		return x.produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204)
	}
	cases := []struct {
		name string
		h    *h
		want string
		dup  string
	}{
		{"clean", acked(newCH()).replicas("a"), "", ""},
		// On one node a kill racing the ack excuses it; a quorum committed this one.
		{"acked, redelivered after a kill that raced the ack", acked(newCH()).kill(20*msec, 100*msec).deliver("a", 0, "h2", 5*s).replicas("a"), "acked-redelivered", ""},
		{"lease lost with a change of leader", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 3).
			deliver("a", 0, "h2", 400*msec).settle(history.OpAck, "a", 0, "h2", 500*msec, 204).replicas("a"), "", CauseLeaderChange},
		{"redelivered under a live lease by the same leader", newCH().produce("a", 0, 0).
			deliverSpan("a", 0, realHandle(2, 7), 10*msec, 400*msec).
			deliver("a", 0, realHandle(2, 8), 450*msec).settle(history.OpAck, "a", 0, realHandle(2, 8), 500*msec, 204).
			replicas("a"), "delivered-under-live-lease", ""},
		// A lease handed out after it lapsed (attempt 1 answered after attempt 2 was
		// leased to another consumer and acked) is a broker defect, not a lapse the
		// consumer could see coming: the consume that held it answered too late.
		{"an earlier attempt answered after a later one", newCH().produce("a", 0, 0).
			deliverSpan("a", 0, realHandle(2, 7), 10*msec, 1600*msec).attempt(1).
			deliver("a", 0, realHandle(2, 8), 1200*msec).attempt(2).settle(history.OpAck, "a", 0, realHandle(2, 8), 1300*msec, 204).
			settle(history.OpAck, "a", 0, realHandle(2, 7), 1610*msec, 410).replicas("a"), "duplicate-without-cause", ""},
		{"a handle of the old leader settles", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 3).
			settle(history.OpAck, "a", 0, "h1", 400*msec, 204).replicas("a"), "204-on-old-leader-handle", ""},
		// A handover hands the live leases to the new leader, which honours their handles.
		{"a handle settles after a handover", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 3).
			settle(history.OpAck, "a", 0, "h1", 400*msec, 204).took(3, "handover").replicas("a"), "", ""},
		{"a handle settles after a handover and an election", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 4).
			settle(history.OpAck, "a", 0, "h1", 400*msec, 204).took(3, "handover").took(4, "election").replicas("a"), "204-on-old-leader-handle", ""},
		{"a handle settles after a handover and a term with no leader", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 4).
			settle(history.OpAck, "a", 0, "h1", 400*msec, 204).took(4, "handover").replicas("a"), "204-on-old-leader-handle", ""},
		{"a handle settles after a handover of another partition", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 3).
			settle(history.OpAck, "a", 0, "h1", 400*msec, 204).tookOn(1, 3, "handover").replicas("a"), "204-on-old-leader-handle", ""},
		// Nor does it lose one: delivered again while the lease lives is a defect.
		{"redelivered under a live lease across a handover", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 3).
			deliver("a", 0, "h2", 400*msec).settle(history.OpAck, "a", 0, "h2", 500*msec, 204).took(3, "handover").replicas("a"), "delivered-under-live-lease", ""},
		{"redelivered under a live lease across an election", newCH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).epoch(20*msec, 2).epoch(300*msec, 3).
			deliver("a", 0, "h2", 400*msec).settle(history.OpAck, "a", 0, "h2", 500*msec, 204).took(3, "election").replicas("a"), "", CauseLeaderChange},
		{"second copy after a 503 timeout", newCH().producedWith("a", 503, "timeout", 0).produce("a", 1, 10*msec).
			deliver("a", 0, "h1", 20*msec).settle(history.OpAck, "a", 0, "h1", 30*msec, 204).deliver("a", 1, "h2", 40*msec).settle(history.OpAck, "a", 1, "h2", 50*msec, 204).replicas("a", "a"), "", CauseAmbiguous},
		{"second copy after a 503 unavailable", newCH().producedWith("a", 503, "unavailable", 0).produce("a", 1, 10*msec).
			deliver("a", 0, "h1", 20*msec).settle(history.OpAck, "a", 0, "h1", 30*msec, 204).deliver("a", 1, "h2", 40*msec).settle(history.OpAck, "a", 1, "h2", 50*msec, 204).replicas("a", "a"), "duplicate-without-cause", ""},
		{"a replica differs", func() *h {
			x := acked(newCH()).replicas("a")
			x.es[len(x.es)-1].IDs = []string{"b"}
			return x
		}(), "replicas-differ", ""},
		{"a 202'd message on no replica", acked(newCH()).replicas(), "202-not-in-replica", ""},
		{"replicas never read", acked(newCH()), "replicas-unread", ""},
		{"replication factor 3 on five nodes", acked(newCH()).replicas("a").onFive(), "", ""},
		{"replication factor 3 on five nodes, one replica short", func() *h {
			x := acked(newCH()).replicas("a").onFive()
			for i, e := range x.es {
				if e.Kind == history.KindReplica && e.Node == "n3" {
					x.es = append(x.es[:i], x.es[i+1:]...)
					break
				}
			}
			return x
		}(), "replica-missing", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.h.es)
			switch {
			case c.want == "" && !r.OK():
				t.Fatalf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
			case c.want != "" && r.Violations[c.want] == 0:
				t.Fatalf("violations %v, want %s (%v)", r.Violations, c.want, r.Examples)
			}
			if c.dup != "" && r.Duplicates[c.dup] != 1 {
				t.Fatalf("duplicates %v, want one %s", r.Duplicates, c.dup)
			}
		})
	}
}

// TestClusterReplicasOfARecreatedTopic: a recreated topic's replicas are its last
// incarnation's. A message written to a deleted incarnation is not looked for in them;
// one that can only be in the last one must be there, at its offset.
func TestClusterReplicasOfARecreatedTopic(t *testing.T) {
	onThree := func(x *h, ids ...string) *h {
		x.es[0].Run.Nodes = []string{"n1", "n2", "n3"}
		x.es[0].Run.Topics[0].Replication = 3
		for _, n := range []string{"n1", "n2", "n3"} {
			x.es = append(x.es, history.Entry{Kind: history.KindReplica, Node: n, Topic: "recycled", Incarnation: 20, Offset: 0, IDs: ids, Detail: "same", Call: 1e12 + 4, Return: 1e12 + 4})
		}
		return x
	}
	delivered := func() *h { return recH().rdeliver("a", 10, "h1", 200*msec).rdeliver("b", 20, "h2", 1300*msec) }
	if r := Check(onThree(delivered(), "b").es); !r.OK() {
		t.Errorf("flagged a legal history: violations %v lost %v %v", r.Violations, r.Lost, r.Examples)
	}
	if r := Check(onThree(delivered()).es); r.Violations["202-not-in-replica"] != 1 {
		t.Errorf("b, answered 202 in the last incarnation, is on no replica: violations %v; want one 202-not-in-replica", r.Violations)
	}
	if r := Check(onThree(delivered(), "a").es); r.Violations["two-payloads-at-one-offset"] == 0 {
		t.Errorf("the last incarnation's replicas hold a at b's offset: violations %v; want two-payloads-at-one-offset", r.Violations)
	}
}
