package check

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// epochChanges returns, per partition of a cluster run, the windows in which its leader
// surely changed: between two stats samples (in call order) of which the second shows a
// higher epoch than the first, the change happened after the first was sent and before
// the second returned. voiding holds the windows after which the old leader's receipt
// handles must not settle: all but those whose every term between the two samples was
// taken by a handover (its new leader honours the leases live at the handover, as the
// nodes' leader lines say; a term with no line, or won by an election, voids them).
func epochChanges(es []history.Entry, incOf func(history.Entry) int64) (all, voiding map[pkey]kills) {
	byPart := map[pkey][]history.Entry{}
	how := map[pkey]map[int64]string{}
	for _, e := range es {
		switch {
		case e.Kind == history.KindStats && e.Epoch > 0:
			k := pkey{e.Topic, incOf(e), e.Partition}
			byPart[k] = append(byPart[k], e)
		case e.Kind == history.KindLeader:
			k := pkey{e.Topic, incOf(e), e.Partition}
			if how[k] == nil {
				how[k] = map[int64]string{}
			}
			if how[k][e.Epoch] != "election" { // two lines for one term: the stricter
				how[k][e.Epoch] = e.Detail
			}
		}
	}
	handedOver := func(k pkey, lo, hi int64) bool {
		for t := lo + 1; t <= hi; t++ {
			if how[k][t] != "handover" {
				return false
			}
		}
		return true
	}
	all, voiding = map[pkey]kills{}, map[pkey]kills{}
	for k, ss := range byPart {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].Call < ss[j].Call })
		high := ss[0]
		for _, s := range ss[1:] {
			if s.Epoch > high.Epoch {
				w := [2]int64{high.Call, s.Return}
				all[k] = append(all[k], w)
				if !handedOver(k, high.Epoch, s.Epoch) {
					voiding[k] = append(voiding[k], w)
				}
				high = s
			}
		}
	}
	return all, voiding
}

// staleAfter is how long after a pause or network fault a node may still answer from
// its stale replica (a resumed old leader learns of the new term within an election
// timeout or two).
const staleAfter = int64(3 * time.Second)

// nodeWindows are, per node, the windows in which it was paused or cut off.
type nodeWindows map[string][]window

func hurtWindows(es []history.Entry) nodeWindows {
	out := nodeWindows{}
	for _, e := range es {
		if e.Kind != history.KindFault || (e.Fault != history.FaultPause && e.Fault != history.FaultNet) {
			continue
		}
		for _, id := range strings.Split(e.Target, ",") {
			out[id] = append(out[id], window{e.Call, e.Return + staleAfter})
		}
	}
	return out
}

// during reports whether node was hurt at some moment of [a, b].
func (nw nodeWindows) during(node string, a, b int64) bool {
	for _, w := range nw[node] {
		if w.end >= a && w.start <= b {
			return true
		}
	}
	return false
}

// clusterProduceMayHaveStored reports whether a produce attempt of a cluster run may have
// stored its message: a 202, no answer, a 503 timeout (the leader went silent after it
// was sent its share), a 503 saying part of a batch was stored, a 503 maybe_stored (a
// failed write that could not be undone), or a 5xx other than 503. Any other 503 (unavailable,
// overloaded, not leader) says nothing was done.
func clusterProduceMayHaveStored(e history.Entry) bool {
	switch {
	case e.Status == 0 || e.Status == 202:
		return true
	case e.Status == 503:
		return e.Code == "timeout" || e.Code == "maybe_stored" || partlyStored(e)
	case e.Status == 404:
		// A batch whose topic was deleted while it was written, part of it stored.
		return e.Batch && partlyStored(e)
	}
	return e.Status >= 500
}

// checkReplicas compares what every node of a cluster run held once it was stopped
// (KindReplica lines): each partition's replicas hold the same records, byte for byte
// (the same first offset, count and digest); no record holds an id other than the one
// the run saw at that offset (one payload per offset across everything observed); and
// every message answered 202 is held, at its offset, with its id. A recreated topic's
// replicas are its last incarnation's (the others' data is deleted with them): they are
// keyed by incarnation, and a 202 is looked for in them when the attempt can only have
// been written in that incarnation.
func checkReplicas(r *Report, es []history.Entry, place map[copyKey]string, recreated map[string]*incSet) {
	type part struct {
		topic string
		inc   int64
		p     int32
	}
	// incOf keys a replica line: by its directory's incarnation for a recreated topic.
	incOf := func(e history.Entry) int64 {
		if recreated[e.Topic] != nil {
			return e.Incarnation
		}
		return 0
	}
	// last is each recreated topic's newest incarnation any node holds.
	last := map[string]int64{}
	for _, e := range es {
		if e.Kind == history.KindReplica && recreated[e.Topic] != nil {
			last[e.Topic] = max(last[e.Topic], e.Incarnation)
		}
	}
	reps := map[part][]history.Entry{}
	nodes := map[string]bool{}
	rf := map[string]int{}
	for _, e := range es {
		if e.Kind == history.KindRun && e.Run != nil {
			for _, t := range e.Run.Topics {
				rf[t.Name] = t.Replication
			}
		}
	}
	// replicasOf is how many nodes hold each partition of topic: its replication factor
	// (every node when the run line does not say, or says more than there are).
	replicasOf := func(topic string, nodes int) int {
		if n := rf[topic]; n > 0 && n < nodes {
			return n
		}
		return nodes
	}
	for _, e := range es {
		if e.Kind != history.KindReplica {
			continue
		}
		nodes[e.Node] = true
		if recreated[e.Topic] != nil && e.Incarnation != last[e.Topic] {
			continue // a deleted incarnation's directory not removed yet
		}
		if e.Err != "" {
			r.violate("replica-unreadable", "%s/%d on %s: %s", e.Topic, e.Partition, e.Node, e.Err)
		}
		k := part{e.Topic, incOf(e), e.Partition}
		reps[k] = append(reps[k], e)
		for i, id := range e.IDs {
			ck := copyKey{e.Topic, k.inc, e.Partition, e.Offset + int64(i)}
			if prev, ok := place[ck]; ok && prev != id {
				r.violate("two-payloads-at-one-offset", "%s holds %q on %s's replica, but the run saw %q there", ck, id, e.Node, prev)
			}
		}
		r.ReplicaRecords += len(e.IDs)
	}
	if len(reps) == 0 {
		r.violate("replicas-unread", "the history has no replica lines: the run stopped before its nodes' logs were read")
		return
	}
	keys := make([]part, 0, len(reps))
	for k := range reps {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].topic != keys[j].topic {
			return keys[i].topic < keys[j].topic
		}
		return keys[i].p < keys[j].p
	})
	// The high watermark every node reported last, before the nodes were frozen.
	final := map[part]int64{}
	for _, e := range es {
		if e.Kind == history.KindStats && e.Client == "quiesce" {
			final[part{e.Topic, incOf(e), e.Partition}] = e.HighWatermark
		}
	}
	held := map[copyKey]string{}
	for _, k := range keys {
		rs := reps[k]
		if hw, ok := final[k]; ok {
			for _, e := range rs {
				if end := e.Offset + int64(len(e.IDs)); end != hw && !(len(e.IDs) == 0 && hw == 0) {
					r.violate("replica-not-at-high-watermark", "%s/%d on %s holds records up to offset %d; the high watermark was %d when the nodes were frozen", k.topic, k.p, e.Node, end, hw)
				}
			}
		}
		if want := replicasOf(k.topic, len(nodes)); len(rs) != want {
			var on []string
			for _, e := range rs {
				on = append(on, e.Node)
			}
			r.violate("replica-missing", "%s/%d is held by %s only; its replication factor is %d (%d nodes)", k.topic, k.p, strings.Join(on, ","), want, len(nodes))
		}
		a := rs[0]
		for _, b := range rs[1:] {
			if a.Offset != b.Offset || len(a.IDs) != len(b.IDs) || a.Detail != b.Detail || firstDiff(a, b) != "" {
				r.violate("replicas-differ", "%s/%d: %s holds %d records from offset %d (digest %s), %s holds %d from %d (digest %s)%s",
					k.topic, k.p, a.Node, len(a.IDs), a.Offset, a.Detail, b.Node, len(b.IDs), b.Offset, b.Detail, firstDiff(a, b))
			}
		}
		for i, id := range a.IDs {
			held[copyKey{k.topic, k.inc, k.p, a.Offset + int64(i)}] = id
		}
	}
	r.ReplicasCompared = len(keys)
	for _, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpProduce || e.Status != 202 {
			continue
		}
		var inc int64
		if rec := recreated[e.Topic]; rec != nil {
			// Only an attempt that can have been written in the last incarnation alone
			// must be held: an earlier one was deleted with its incarnation.
			cands := rec.during(e.Call, e.Return)
			if len(cands) != 1 || cands[0] != last[e.Topic] {
				continue
			}
			inc = cands[0]
		}
		ck := copyKey{e.Topic, inc, e.Partition, e.Offset}
		if got, ok := held[ck]; !ok || got != e.Msg {
			r.violate("202-not-in-replica", "%s answered 202 at %s; the replicas hold %q there (present: %v)", e.Msg, ck, got, ok)
		}
	}
}

// firstDiff names the first offset at which two replicas' ids differ.
func firstDiff(a, b history.Entry) string {
	for i := 0; i < len(a.IDs) && i < len(b.IDs); i++ {
		oa, ob := a.Offset+int64(i), b.Offset+int64(i)
		if oa != ob || a.IDs[i] != b.IDs[i] {
			return fmt.Sprintf("; first difference at offset %d: %q and %q", oa, a.IDs[i], b.IDs[i])
		}
	}
	return ""
}

// availability is, per operation, the share of attempts answered with no 5xx (and an
// answer at all), as text.
func availability(es []history.Entry) map[string]string {
	all, good := map[string]int{}, map[string]int{}
	for _, e := range es {
		if e.Kind != history.KindOp {
			continue
		}
		all[e.Op]++
		if e.Status != 0 && e.Status < 500 {
			good[e.Op]++
		}
	}
	out := map[string]string{}
	for op, n := range all {
		out[op] = fmt.Sprintf("%.2f%%", 100*float64(good[op])/float64(n))
	}
	return out
}
