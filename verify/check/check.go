// Package check decides whether a recorded history obeys the delivery contract
// (DESIGN.md §3). A porcupine model checks every message copy's leases and settles (a
// delivery after a 204 ack is legal only if a kill raced that ack; a second delivery
// under a live lease is illegal; a 410 on a surely live lease is a bug); linear checks
// count lost and unexpected messages, classify every duplicate by its cause, and check
// the markers, fan-out, delays, retention, log order and operation bounds.
package check

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// Duplicate causes.
const (
	CauseLeaseLapse = "lease-lapse"
	CauseNack       = "nack"
	CauseAmbiguous  = "ambiguous-produce"
	CauseKill       = "kill-window"
	CauseNone       = "none"
)

// opBound is the longest an answered operation may take outside fault windows (the
// long poll's wait is added for consumes).
const opBound = 10 * time.Second

// Violation is one broken rule.
type Violation struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Report is the checker's answer.
type Report struct {
	Seed             int64                `json:"seed"`
	Messages         int                  `json:"messages"` // distinct message ids answered 202
	MessagesByTopic  map[string]int       `json:"messages_by_topic"`
	Produced         int                  `json:"produce_attempts"`
	Deliveries       int                  `json:"deliveries"`
	Faults           map[string]int       `json:"faults"`
	FailpointKills   map[string]int       `json:"failpoint_kills"`
	Lost             map[string]int       `json:"lost"` // by topic
	LostIDs          []string             `json:"lost_ids,omitempty"`
	AgedOut          int                  `json:"aged_out"`
	Unexpected       int                  `json:"unexpected"`
	Duplicates       map[string]int       `json:"duplicates"`
	AckedRedelivered int                  `json:"acked_redelivered_in_kill_window"`
	Violations       map[string]int       `json:"violations"`
	Examples         []Violation          `json:"examples,omitempty"` // the first few of each kind
	Latency          map[string][2]string `json:"latency_p50_p99"`
	Drained          bool                 `json:"drained"`
}

// OK reports whether nothing was lost or unexpected and no rule was broken.
func (r *Report) OK() bool {
	n := r.Unexpected
	for _, v := range r.Lost {
		n += v
	}
	for _, v := range r.Violations {
		n += v
	}
	return n == 0
}

func (r *Report) violate(kind, format string, args ...any) {
	r.Violations[kind]++
	if r.Violations[kind] <= 5 {
		r.Examples = append(r.Examples, Violation{kind, fmt.Sprintf(format, args...)})
	}
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "seed:              %d\n", r.Seed)
	fmt.Fprintf(w, "messages:          %d (202'd ids: %s; %d produce attempts, %d deliveries)\n", r.Messages, kv(r.MessagesByTopic), r.Produced, r.Deliveries)
	fmt.Fprintf(w, "faults:            %s\n", kv(r.Faults))
	fmt.Fprintf(w, "failpoint kills:   %s\n", kv(r.FailpointKills))
	fmt.Fprintf(w, "lost:              %s (aged out by retention, legal: %d)\n", kv(r.Lost), r.AgedOut)
	fmt.Fprintf(w, "unexpected:        %d\n", r.Unexpected)
	fmt.Fprintf(w, "duplicates:        %s\n", kv(r.Duplicates))
	fmt.Fprintf(w, "acked, redelivered inside a kill window (legal by the rule): %d\n", r.AckedRedelivered)
	fmt.Fprintf(w, "violations:        %s\n", kv(r.Violations))
	for _, v := range r.Examples {
		fmt.Fprintf(w, "  %s: %s\n", v.Kind, v.Detail)
	}
	fmt.Fprintf(w, "latency p50/p99:   %s\n", kv2(r.Latency))
	fmt.Fprintf(w, "drained:           %v\n", r.Drained)
	if r.OK() {
		fmt.Fprintln(w, "verdict:           OK")
	} else {
		fmt.Fprintln(w, "verdict:           FAILED")
	}
}

func kv(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	total := 0
	for k, v := range m {
		keys = append(keys, k)
		total += v
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d (", total)
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	b.WriteString(")")
	return b.String()
}

func kv2(m map[string][2]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s/%s", k, m[k][0], m[k][1]))
	}
	return strings.Join(parts, ", ")
}

type copyKey struct {
	topic     string
	partition int32
	offset    int64
}

func (k copyKey) String() string { return fmt.Sprintf("%s/%d@%d", k.topic, k.partition, k.offset) }

type window struct{ start, end int64 }

// Check checks a history.
func Check(es []history.Entry) *Report {
	r := &Report{MessagesByTopic: map[string]int{}, Faults: map[string]int{}, FailpointKills: map[string]int{}, Lost: map[string]int{},
		Duplicates: map[string]int{}, Violations: map[string]int{}, Latency: map[string][2]string{}}
	var run history.RunInfo
	topics := map[string]history.TopicInfo{}
	var ks kills
	var faultWins []window // every fault's window, kills reaching to the next ready node
	var lastKill *window
	drainAt, doneAt := int64(-1), int64(-1)
	for _, e := range es {
		switch e.Kind {
		case history.KindRun:
			if e.Run != nil {
				run = *e.Run
			}
		case history.KindPhase:
			switch e.Detail {
			case "drain":
				drainAt = e.Call
			case "done":
				doneAt = e.Call
			}
		case history.KindFault:
			r.Faults[e.Fault]++
			switch e.Fault {
			case history.FaultKill, history.FaultFailpointKill, history.FaultCrash:
				ks = append(ks, [2]int64{e.Call, e.Return})
				faultWins = append(faultWins, window{e.Call, e.Return})
				lastKill = &faultWins[len(faultWins)-1]
				if e.Fault == history.FaultFailpointKill {
					r.FailpointKills[e.Target]++
				}
				if e.Fault == history.FaultCrash {
					r.violate("node-crashed", "the node exited by itself at %s: %s", ms(e.Call), e.Detail)
				}
			case history.FaultRestart:
				if lastKill != nil && e.Return > lastKill.end {
					lastKill.end = e.Return
				}
				faultWins = append(faultWins, window{e.Call, e.Return})
			default:
				faultWins = append(faultWins, window{e.Call, e.Return})
			}
		}
	}
	r.Seed = run.Seed
	for _, t := range run.Topics {
		topics[t.Name] = t
	}
	r.Drained = doneAt >= 0
	inFault := func(a, b int64) bool {
		for _, w := range faultWins {
			if w.end+int64(time.Second) >= a && w.start <= b {
				return true
			}
		}
		return false
	}

	// Produces.
	type prodInfo struct {
		attempts  int
		firstCall int64
		ok        []copyKey // 202'd places
		okRet     int64
		client    string
		batch     bool
		key       string
	}
	prods := map[string]map[string]*prodInfo{} // topic → id → info
	place := map[copyKey]string{}              // one payload per (topic, partition, offset)
	var lat = map[string][]int64{}
	for i, e := range es {
		if e.Kind != history.KindOp {
			continue
		}
		if e.Status != 0 {
			lat[e.Op] = append(lat[e.Op], e.Return-e.Call)
			bound := int64(opBound)
			if e.Op == history.OpConsume {
				bound += int64(time.Second)
			}
			if e.Return-e.Call > bound && !inFault(e.Call, e.Return) {
				r.violate("op-past-bound", "line %d: %s %s took %s outside any fault", i+1, e.Op, e.Topic, ms(e.Return-e.Call))
			}
		} else if e.Return-e.Call > int64(opBound) && !inFault(e.Call, e.Return) {
			r.violate("op-past-bound", "line %d: %s %s had no answer after %s outside any fault (%s)", i+1, e.Op, e.Topic, ms(e.Return-e.Call), e.Err)
		}
		if e.Status >= 500 && e.Status != 503 || e.Code == "no_json_error_body" {
			r.violate("5xx-or-bad-error", "line %d: %s %s answered %d %s", i+1, e.Op, e.Topic, e.Status, e.Err)
		}
		if e.Status == 503 && e.Code == "storage_failed" && !inFault(e.Call, e.Return) {
			r.violate("storage-failed-without-disk-fault", "line %d: %s %s: %s", i+1, e.Op, e.Topic, e.Err)
		}
		if e.Status >= 400 && e.Status < 500 && e.Status != 410 && e.Op != history.OpAdmin {
			r.violate("unexpected-4xx", "line %d: %s %s answered %s", i+1, e.Op, e.Topic, e.Err)
		}
		if e.Op != history.OpProduce {
			continue
		}
		r.Produced++
		m := prods[e.Topic]
		if m == nil {
			m = map[string]*prodInfo{}
			prods[e.Topic] = m
		}
		p := m[e.Msg]
		if p == nil {
			p = &prodInfo{firstCall: e.Call, client: e.Client, batch: e.Batch, key: e.Key}
			m[e.Msg] = p
		}
		p.attempts++
		if e.Status == 202 {
			k := copyKey{e.Topic, e.Partition, e.Offset}
			if prev, ok := place[k]; ok && prev != e.Msg {
				r.violate("two-payloads-at-one-offset", "%s answered 202 for %s and for %s", k, prev, e.Msg)
			}
			place[k] = e.Msg
			p.ok = append(p.ok, k)
			p.okRet = e.Return
			if len(p.ok) == 1 {
				r.Messages++
				r.MessagesByTopic[e.Topic]++
			}
		}
	}
	for op, l := range lat {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		r.Latency[op] = [2]string{ms(l[len(l)/2]), ms(l[len(l)*99/100])}
	}

	// Deliveries and settles, per copy.
	type deliv struct {
		e    history.Entry
		line int
	}
	delivs := map[string]map[string][]deliv{} // topic → id → deliveries
	copyOps := map[copyKey][]opIn{}
	parentTS := map[string]int64{} // id → smallest parent timestamp seen
	for i, e := range es {
		if e.Kind != history.KindOp {
			continue
		}
		k := copyKey{e.Topic, e.Partition, e.Offset}
		switch e.Op {
		case history.OpConsume:
			if e.Msg == "" || e.Status != 200 {
				continue
			}
			r.Deliveries++
			if delivs[e.Topic] == nil {
				delivs[e.Topic] = map[string][]deliv{}
			}
			delivs[e.Topic][e.Msg] = append(delivs[e.Topic][e.Msg], deliv{e, i + 1})
			if prev, ok := place[k]; ok && prev != e.Msg {
				r.violate("two-payloads-at-one-offset", "line %d: %s delivered %s, but it holds %s", i+1, k, e.Msg, prev)
			}
			place[k] = e.Msg
			copyOps[k] = append(copyOps[k], opIn{kind: kDeliver, handle: e.Handle, call: e.Call, ret: e.Return, line: i + 1, client: e.Client})
			if e.Topic == "orders" {
				if ts, ok := parentTS[e.Msg]; !ok || e.Timestamp < ts {
					parentTS[e.Msg] = e.Timestamp
				}
			}
		case history.OpAck, history.OpNack, history.OpExtend:
			in := opIn{handle: e.Handle, call: e.Call, ret: e.Return, line: i + 1, client: e.Client}
			in.kind = map[string]opKind{history.OpAck: kAck, history.OpNack: kNack, history.OpExtend: kExtend}[e.Op]
			switch {
			case e.Status == 204:
				in.out = oOK
			case e.Status == 410:
				in.out = oGone
			case e.Status == 0 || e.Code == "timeout" || e.Code == "unavailable":
				in.out = oUnknown
			case e.Status == 503 && e.Code == "storage_failed":
				in.out = oFailed
			default:
				in.out = oOther
			}
			copyOps[k] = append(copyOps[k], in)
		}
	}

	// The porcupine model, copy by copy.
	keys := make([]copyKey, 0, len(copyOps))
	for k := range copyOps {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.topic != b.topic {
			return a.topic < b.topic
		}
		if a.partition != b.partition {
			return a.partition < b.partition
		}
		return a.offset < b.offset
	})
	for _, k := range keys {
		t := topics[k.topic]
		m := &model{vis: t.VisibilityMs * int64(time.Millisecond), kills: ks, agedAt: 1 << 62}
		src := k.topic
		if t.Parent != "" {
			src = t.Parent
		}
		if p := prods[src][place[k]]; p != nil {
			m.agedAt = p.firstCall + t.RetentionMs*int64(time.Millisecond)
		}
		if ok, bad, why := m.checkCopy(copyOps[k]); !ok {
			kind := "lease-model"
			switch {
			case strings.Contains(why, "after a 204 ack"):
				kind = "acked-redelivered"
			case strings.Contains(why, "surely alive") && bad.kind == kDeliver:
				kind = "delivered-under-live-lease"
			case strings.HasPrefix(why, "410"):
				kind = "410-on-live-lease"
			case strings.HasPrefix(why, "204"):
				kind = "204-on-dead-lease"
			}
			r.violate(kind, "%s (%s): line %d %s by %s: %s", k, place[k], bad.line, bad.kind, bad.client, why)
		}
	}

	// Duplicates by cause.
	acked := map[string]*opIn{} // handle → its first 204 ack
	nacked := map[string]bool{}
	for _, ops := range copyOps {
		for i := range ops {
			o := &ops[i]
			switch {
			case o.kind == kAck && o.out == oOK:
				if acked[o.handle] == nil {
					acked[o.handle] = o
				}
			case o.kind == kNack && (o.out == oOK || o.out == oUnknown), o.kind == kAck && o.out == oFailed:
				nacked[o.handle] = true
			}
		}
	}
	anyKillBefore := func(t int64) bool {
		for _, w := range ks {
			if w[0] <= t {
				return true
			}
		}
		return false
	}
	for topic, byID := range delivs {
		t := topics[topic]
		vis := t.VisibilityMs * int64(time.Millisecond)
		src := topic
		if t.Parent != "" {
			src = t.Parent
		}
		for id, ds := range byID {
			sort.Slice(ds, func(i, j int) bool { return ds[i].e.Return < ds[j].e.Return })
			for j := 1; j < len(ds); j++ {
				cur := ds[j].e
				var prev *history.Entry
				for q := j - 1; q >= 0; q-- {
					if ds[q].e.Partition == cur.Partition && ds[q].e.Offset == cur.Offset {
						prev = &ds[q].e
						break
					}
				}
				cause := CauseNone
				switch {
				case prev == nil:
					p := prods[src][id]
					switch {
					case p != nil && p.attempts > 1:
						cause = CauseAmbiguous
					case t.Parent != "" && anyKillBefore(cur.Return):
						cause = CauseKill // a fan-out batch copied again after a crash
					}
				case acked[prev.Handle] != nil && acked[prev.Handle].ret < cur.Call:
					if a := acked[prev.Handle]; ks.between(a.call, a.ret) {
						cause = CauseKill
						r.AckedRedelivered++
					}
				case nacked[prev.Handle]:
					cause = CauseNack
				case ks.between(prev.Call, cur.Return):
					cause = CauseKill
				case cur.Return+tolerance >= prev.Call+vis:
					cause = CauseLeaseLapse
				}
				r.Duplicates[cause]++
				if cause == CauseNone {
					r.violate("duplicate-without-cause", "line %d: %s delivered %s again (%s/%d@%d) with no lapse, nack, retry or kill to explain it", ds[j].line, topic, id, topic, cur.Partition, cur.Offset)
				}
			}
		}
	}

	// Unexpected: a delivery of something never produced there.
	for topic, byID := range delivs {
		t := topics[topic]
		src := topic
		if t.Parent != "" {
			src = t.Parent
		}
		for id, ds := range byID {
			if prods[src][id] == nil {
				r.Unexpected++
				if r.Unexpected <= 5 {
					r.Examples = append(r.Examples, Violation{"unexpected", fmt.Sprintf("line %d: %s delivered %q, never produced to %s", ds[0].line, topic, id, src)})
				}
			}
		}
	}

	// Delays never early.
	for _, t := range run.Topics {
		if t.DelayMs <= 0 {
			continue
		}
		d := t.DelayMs * int64(time.Millisecond)
		for id, ds := range delivs[t.Name] {
			p := prods[t.Parent][id]
			if p == nil {
				continue
			}
			for _, x := range ds {
				if x.e.Return+tolerance < p.firstCall+d {
					r.violate("delay-early", "line %d: %s delivered %s %s after its first produce was sent, before its %s delay", x.line, t.Name, id, ms(x.e.Return-p.firstCall), ms(d))
				}
				if ts, ok := parentTS[id]; ok && x.e.Timestamp+2 < ts+t.DelayMs {
					r.violate("delay-early", "line %d: %s copy of %s stamped %d, parent stamped %d: %d ms apart, delay %d ms", x.line, t.Name, id, x.e.Timestamp, ts, x.e.Timestamp-ts, t.DelayMs)
				}
			}
		}
	}

	// Markers: per partition, never backwards; high watermark past every 202'd offset;
	// nothing deleted younger than the retention.
	type pkey struct {
		topic string
		p     int32
	}
	samples := map[pkey][]history.Entry{}
	for _, e := range es {
		if e.Kind == history.KindStats {
			k := pkey{e.Topic, e.Partition}
			samples[k] = append(samples[k], e)
		}
	}
	for k, ss := range samples {
		// Sorted by return; every sample must show markers at least as high as the
		// highest of the samples that finished before it was sent.
		sort.Slice(ss, func(i, j int) bool { return ss[i].Return < ss[j].Return })
		byCall := append([]history.Entry(nil), ss...)
		sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
		var hw, fr, old history.Entry
		seen := false
		q := 0
		for _, s := range byCall {
			for ; q < len(ss) && ss[q].Return < s.Call; q++ {
				if !seen || ss[q].HighWatermark > hw.HighWatermark {
					hw = ss[q]
				}
				if !seen || ss[q].Frontier > fr.Frontier {
					fr = ss[q]
				}
				if !seen || ss[q].Oldest > old.Oldest {
					old = ss[q]
				}
				seen = true
			}
			if seen {
				if s.HighWatermark < hw.HighWatermark {
					r.violate("high-watermark-backwards", "%s/%d: %d at %s after %d at %s", k.topic, k.p, s.HighWatermark, ms(s.Call), hw.HighWatermark, ms(hw.Return))
				}
				if s.Frontier < fr.Frontier {
					r.violate("frontier-backwards", "%s/%d: %d at %s after %d at %s", k.topic, k.p, s.Frontier, ms(s.Call), fr.Frontier, ms(fr.Return))
				}
				if s.Oldest < old.Oldest {
					r.violate("oldest-backwards", "%s/%d: %d at %s after %d at %s", k.topic, k.p, s.Oldest, ms(s.Call), old.Oldest, ms(old.Return))
				}
			}
			if s.HighWatermark > s.Offset {
				r.violate("high-watermark-past-log-end", "%s/%d: high watermark %d, next offset %d", k.topic, k.p, s.HighWatermark, s.Offset)
			}
		}
		samples[k] = byCall
	}
	// firstAfter returns the first sample of a partition sent after t.
	firstAfter := func(k pkey, t int64) (history.Entry, bool) {
		ss := samples[k]
		i := sort.Search(len(ss), func(i int) bool { return ss[i].Call > t })
		if i == len(ss) {
			return history.Entry{}, false
		}
		return ss[i], true
	}
	// deletedBy returns the first sample showing offset off deleted (oldest past it).
	deletedBy := func(k pkey, off int64) (history.Entry, bool) {
		ss := samples[k] // oldest never goes back (checked above), so search
		i := sort.Search(len(ss), func(i int) bool { return ss[i].Oldest > off })
		if i == len(ss) {
			return history.Entry{}, false
		}
		return ss[i], true
	}
	for topic, m := range prods {
		ret := topics[topic].RetentionMs * int64(time.Millisecond)
		for id, p := range m {
			for _, c := range p.ok {
				k := pkey{topic, c.partition}
				if s, ok := firstAfter(k, p.okRet); ok && s.HighWatermark <= c.offset {
					r.violate("202-not-below-high-watermark", "%s at %s answered 202 at %s; high watermark %d at %s", id, c, ms(p.okRet), s.HighWatermark, ms(s.Call))
				}
				if s, ok := deletedBy(k, c.offset); ok && s.Return+tolerance < p.firstCall+ret {
					r.violate("retention-early", "%s at %s was deleted by %s, %s after its produce; retention %s", id, c, ms(s.Return), ms(s.Return-p.firstCall), ms(ret))
				}
			}
		}
	}

	// Lost: every 202'd message delivered in its topic and in every child of it.
	deletedBelow := func(topic string, c copyKey) bool {
		_, ok := deletedBy(pkey{topic, c.partition}, c.offset)
		return ok
	}
	for _, t := range run.Topics {
		src := t.Name
		if t.Parent != "" {
			src = t.Parent
		}
		for id, p := range prods[src] {
			if len(p.ok) == 0 || len(delivs[t.Name][id]) > 0 {
				continue
			}
			if t.Parent == "" && len(p.ok) > 0 && deletedBelow(t.Name, p.ok[0]) {
				r.AgedOut++
				continue
			}
			r.Lost[t.Name]++
			if len(r.LostIDs) < 20 {
				r.LostIDs = append(r.LostIDs, t.Name+":"+id)
			}
			if r.Lost[t.Name] <= 5 {
				kind := "lost"
				if t.Parent != "" {
					kind = "fan-out-gap"
				}
				r.Examples = append(r.Examples, Violation{kind, fmt.Sprintf("%s never delivered %s (202 at %s for %v)", t.Name, id, ms(p.okRet), p.ok)})
			}
		}
	}
	if drainAt < 0 || doneAt < 0 {
		r.violate("incomplete-history", "the history has no drain or no end: the run stopped early")
	}

	// Log order: one producer's single produces of one key land in its partition in order.
	type order struct {
		client, key string
		p           int32
	}
	last := map[order]int64{}
	for _, e := range es {
		if e.Kind == history.KindOp && e.Op == history.OpProduce && e.Status == 202 && !e.Batch && e.Key != "" {
			o := order{e.Client, e.Key, e.Partition}
			if prev, ok := last[o]; ok && e.Offset <= prev && len(prods[e.Topic][e.Msg].ok) == 1 {
				r.violate("log-order", "%s's %s (key %s) got offset %d after an earlier message got %d", e.Client, e.Msg, e.Key, e.Offset, prev)
			}
			last[o] = e.Offset
		}
	}
	return r
}
