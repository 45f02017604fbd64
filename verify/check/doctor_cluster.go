package check

import (
	"fmt"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// ClusterDoctorKinds lists the ways DoctorCluster edits a cluster run's history, and the
// violation each must raise:
//
//   - acked-in-kill-window: a message acked with 204 is delivered again 10 ms after
//     the ack returned, and a kill -9 of a node is added spanning the ack: on one node
//     that kill would excuse the redelivery; in a cluster the ack was committed on a
//     quorum and nothing does;
//   - second-copy: a message produced once (one attempt, answered 202) is delivered
//     again at another offset of its partition: a second stored copy with no ambiguous
//     produce to explain it;
//   - unavailable-stored: a produce answered 202 on its second attempt gets a first
//     attempt answered 503 unavailable (which stores nothing), and the message is
//     delivered at a second offset;
//   - replica-differs: one node's replica holds another id at one offset;
//   - replica-short: every replica of a partition lacks its last record, which was
//     answered 202.
var ClusterDoctorKinds = map[string]string{
	"acked-in-kill-window": "acked-redelivered",
	"second-copy":          "duplicate-without-cause",
	"unavailable-stored":   "duplicate-without-cause",
	"replica-differs":      "replicas-differ",
	"replica-short":        "202-not-in-replica",
}

// DoctorCluster edits a cluster run's history the way ClusterDoctorKinds says.
func DoctorCluster(es []history.Entry, kind string) ([]history.Entry, string, error) {
	out := append([]history.Entry(nil), es...)
	firstID := ""
	for _, e := range es {
		if e.Kind == history.KindRun && e.Run != nil && len(e.Run.Nodes) > 0 {
			firstID = e.Run.Nodes[0]
		}
	}
	attempts := map[string]int{}
	for _, e := range es {
		if e.Kind == history.KindOp && e.Op == history.OpProduce {
			attempts[e.Topic+"/"+e.Msg]++
		}
	}
	maxOff := map[[2]any]int64{}
	for _, e := range es {
		if e.Kind == history.KindOp && e.Offset >= 0 {
			k := [2]any{e.Topic, e.Partition}
			maxOff[k] = max(maxOff[k], e.Offset)
		}
	}
	switch kind {
	case "acked-in-kill-window":
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpAck && e.Status == 204 && e.Topic == "orders" && e.Return-e.Call > int64(time.Millisecond) {
				k := history.Entry{Kind: history.KindFault, Fault: history.FaultKill, Target: firstID, Call: e.Call, Return: e.Return, Detail: "doctored", Partition: -1, Offset: -1}
				d := history.Entry{Kind: history.KindOp, Client: "doctor", Op: history.OpConsume, Topic: e.Topic, Partition: e.Partition,
					Offset: e.Offset, Msg: e.Msg, Status: 200, Handle: "doctored", Call: e.Return + int64(10*time.Millisecond)}
				d.Return = d.Call + int64(time.Millisecond)
				out = append(out, k, d)
				return out, fmt.Sprintf("%s (orders/%d@%d) acked at %s under a kill of %s, delivered again at %s", e.Msg, e.Partition, e.Offset, ms(e.Return), firstID, ms(d.Call)), nil
			}
		}
	case "second-copy", "unavailable-stored":
		for i, e := range es {
			if e.Kind != history.KindOp || e.Op != history.OpProduce || e.Status != 202 || e.Topic != "orders" {
				continue
			}
			if kind == "second-copy" && attempts[e.Topic+"/"+e.Msg] != 1 {
				continue
			}
			if kind == "unavailable-stored" && (attempts[e.Topic+"/"+e.Msg] != 1 || e.Batch) {
				continue
			}
			k := [2]any{e.Topic, e.Partition}
			maxOff[k]++
			d := history.Entry{Kind: history.KindOp, Client: "doctor", Op: history.OpConsume, Topic: e.Topic, Partition: e.Partition,
				Offset: maxOff[k], Msg: e.Msg, Status: 200, Handle: "doctored", Call: e.Return + int64(time.Second)}
			d.Return = d.Call + int64(time.Millisecond)
			what := fmt.Sprintf("%s, produced once (orders/%d@%d), delivered again at orders/%d@%d", e.Msg, e.Partition, e.Offset, e.Partition, d.Offset)
			if kind == "unavailable-stored" {
				u := e
				u.Status, u.Code, u.Partition, u.Offset = 503, "unavailable", -1, -1
				u.Err = `503 {"error":{"code":"unavailable","message":"doctored"}}`
				u.Return = u.Call + (e.Return-e.Call)/2
				out[i].Attempt = 2
				out = append(out, u)
				what = fmt.Sprintf("%s: a first attempt answered 503 unavailable, and a second copy at orders/%d@%d", e.Msg, e.Partition, d.Offset)
			}
			out = append(out, d)
			return out, what, nil
		}
	case "replica-differs":
		for i, e := range es {
			if e.Kind == history.KindReplica && len(e.IDs) > 1 {
				ids := append([]string(nil), e.IDs...)
				ids[len(ids)/2] = "doctored-id"
				out[i].IDs = ids
				return out, fmt.Sprintf("%s's replica of %s/%d holds another id at offset %d", e.Node, e.Topic, e.Partition, e.Offset+int64(len(ids)/2)), nil
			}
		}
	case "replica-short":
		var topic string
		var part int32 = -1
		for i, e := range es {
			if e.Kind != history.KindReplica || e.Topic != "orders" || len(e.IDs) == 0 {
				continue
			}
			if part < 0 {
				topic, part = e.Topic, e.Partition
			}
			if e.Topic == topic && e.Partition == part {
				out[i].IDs = e.IDs[:len(e.IDs)-1]
			}
		}
		if part >= 0 {
			return out, fmt.Sprintf("every replica of %s/%d lost its last record", topic, part), nil
		}
	}
	return nil, "", errNothing
}
