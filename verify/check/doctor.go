package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// Doctor edits a real history the way a broker bug would show in it, so a test (or a
// person with the CLI) can see the checker catch it:
//
//   - acked-redelivery: a message acked with 204 is delivered once more, a second
//     after the end of the history's last fault (outside every kill window), one whose
//     settle record the harness did not damage;
//   - lost: every delivery of one 202'd parent message is removed, with its settles
//     (one whose record the harness did not damage);
//   - live-lease: a message is delivered to a second consumer 1 ms after the first
//     delivery returned, under the first one's live lease;
//   - delay-early: a delay child delivers a copy half its delay after the parent
//     message's produce, with no clock step in between;
//   - timestamp-backwards: the newest delivered offset of a partition of orders is
//     stamped a second before the offset below it;
//   - old-incarnation: a message of the recreated topic, written to an incarnation that
//     was then deleted, is delivered again under the next incarnation's handle;
//   - stale-ack: an ack with a handle of a deleted incarnation answers 204, not 404/410.
func Doctor(es []history.Entry, kind string) ([]history.Entry, string, error) {
	out := append([]history.Entry(nil), es...)
	lastFault, end := int64(0), int64(0)
	for _, e := range es {
		if e.Kind == history.KindFault && e.Return > lastFault {
			lastFault = e.Return
		}
		end = max(end, e.Return, e.Call)
	}
	switch kind {
	case "acked-redelivery":
		// Not a message whose settle record the harness damaged: the node may deliver
		// it again, legally (the checker excuses it).
		damaged := damagedInOrders(es, true)
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpAck && e.Status == 204 && e.Topic == "orders" && !damaged(e) {
				d := history.Entry{Kind: history.KindOp, Client: "doctor", Op: history.OpConsume, Topic: e.Topic, Partition: e.Partition,
					Offset: e.Offset, Msg: e.Msg, Status: 200, Handle: "doctored", Call: max(lastFault, e.Return) + int64(time.Second)}
				d.Return = d.Call + int64(time.Millisecond)
				out = append(out, d)
				return out, fmt.Sprintf("%s (orders/%d@%d), acked at %s, delivered again at %s", e.Msg, e.Partition, e.Offset, ms(e.Return), ms(d.Call)), nil
			}
		}
	case "lost":
		// Not a message whose record the harness damaged: the node may skip it,
		// legally (the checker excuses it).
		damaged := damagedInOrders(es, false)
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpProduce && e.Status == 202 && e.Topic == "orders" && !damaged(e) {
				kept := out[:0]
				for _, x := range out {
					if x.Kind == history.KindOp && x.Topic == "orders" && x.Msg == e.Msg && x.Op != history.OpProduce {
						continue
					}
					kept = append(kept, x)
				}
				return kept, fmt.Sprintf("every delivery of %s in orders removed (202 at orders/%d@%d)", e.Msg, e.Partition, e.Offset), nil
			}
		}
	case "live-lease":
		// A delivery whose lease nobody settles within 100 ms and no fault touches, so
		// the doctored second delivery falls inside a lease that is surely alive and
		// surely unsettled. (A lease can go unsettled because a kill came right after it
		// was handed out, and a redelivery after that kill is legal.)
		const quiet = 100 * int64(time.Millisecond)
		var faults [][2]int64
		for _, e := range es {
			if e.Kind == history.KindFault {
				faults = append(faults, [2]int64{e.Call, max(e.Call, e.Return)})
			}
		}
		touched := func(from, to int64) bool {
			for _, f := range faults {
				if f[0] <= to && f[1] >= from {
					return true
				}
			}
			return false
		}
		settled := map[string]int64{}
		for _, e := range es {
			if e.Kind == history.KindOp && e.Handle != "" && (e.Op == history.OpAck || e.Op == history.OpNack || e.Op == history.OpExtend) {
				if t, ok := settled[e.Handle]; !ok || e.Call < t {
					settled[e.Handle] = e.Call
				}
			}
		}
		var ds []history.Entry
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpConsume && e.Status == 200 && e.Msg != "" && e.Topic == "orders" {
				if t, ok := settled[e.Handle]; (!ok || t > e.Return+quiet) && !touched(e.Call, e.Return+quiet) {
					ds = append(ds, e)
				}
			}
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].Call < ds[j].Call })
		if len(ds) > 0 {
			e := ds[len(ds)/2]
			d := e
			d.Client, d.Handle, d.Call, d.Return = "doctor", "doctored", e.Return+int64(time.Millisecond), e.Return+2*int64(time.Millisecond)
			out = append(out, d)
			return out, fmt.Sprintf("%s (orders/%d@%d) delivered again 1 ms after its delivery at %s", e.Msg, e.Partition, e.Offset, ms(e.Return)), nil
		}
	case "delay-early":
		return doctorDelayEarly(es, out)
	case "timestamp-backwards":
		return doctorTimestamp(es, out)
	case "old-incarnation":
		return doctorOldIncarnation(es, out)
	case "stale-ack":
		return doctorStaleAck(es, out)
	default:
		return nil, "", fmt.Errorf("unknown kind %q", kind)
	}
	return nil, "", fmt.Errorf("the history has nothing to doctor for %s", kind)
}

// damagedInOrders reports whether the harness damaged a record of the message of e in
// orders (by its partition and offset, or its id): its settle record when journal is
// true, else its message record.
func damagedInOrders(es []history.Entry, journal bool) func(e history.Entry) bool {
	type key struct {
		partition int32
		offset    int64
	}
	at, ids := map[key]bool{}, map[string]bool{}
	for _, e := range es {
		if e.Kind == history.KindFault && e.Fault == history.FaultDamaged && (e.Target == "journal") == journal && e.Topic == "orders" {
			at[key{e.Partition, e.Offset}] = true
			if e.Msg != "" {
				ids[e.Msg] = true
			}
		}
	}
	return func(e history.Entry) bool { return at[key{e.Partition, e.Offset}] || (e.Msg != "" && ids[e.Msg]) }
}

// DoctorKinds lists the kinds Doctor knows and the violation each must raise ("" for
// lost: the message is counted lost).
var DoctorKinds = map[string]string{
	"acked-redelivery":    "acked-redelivered",
	"lost":                "",
	"live-lease":          "delivered-under-live-lease",
	"delay-early":         "delay-early",
	"timestamp-backwards": "timestamp-backwards",
	"old-incarnation":     "old-incarnation-delivered",
	"stale-ack":           "stale-handle-settled",
}

var errNothing = fmt.Errorf("the history has nothing to doctor for this kind")

func runInfo(es []history.Entry) history.RunInfo {
	for _, e := range es {
		if e.Kind == history.KindRun && e.Run != nil {
			return *e.Run
		}
	}
	return history.RunInfo{}
}

func clockOf(es []history.Entry) clockTimeline {
	var c clockTimeline
	for _, e := range es {
		if e.Kind == history.KindFault && e.Fault == history.FaultClock {
			c = append(c, clockLine{e.Call, e.ClockOffset, e.Target, e.ClockDrift})
		}
	}
	sort.SliceStable(c, func(i, j int) bool { return c[i].at < c[j].at })
	return c
}

func doctorDelayEarly(es, out []history.Entry) ([]history.Entry, string, error) {
	var child history.TopicInfo
	for _, t := range runInfo(es).Topics {
		if t.DelayMs > 0 {
			child = t
		}
	}
	if child.Name == "" {
		return nil, "", errNothing
	}
	d := child.DelayMs * int64(time.Millisecond)
	clock := clockOf(es)
	attempts := map[string]int{}
	maxTS := int64(0)
	for _, e := range es {
		if e.Kind == history.KindOp && e.Op == history.OpProduce && e.Topic == child.Parent {
			attempts[e.Msg]++
		}
		if e.Kind == history.KindOp && e.Op == history.OpConsume && e.Topic == child.Name && e.Partition == 0 {
			maxTS = max(maxTS, e.Timestamp)
		}
	}
	for _, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpProduce || e.Topic != child.Parent || e.Status != 202 || attempts[e.Msg] != 1 {
			continue
		}
		if lo, hi := clock.span(e.Call, e.Call+d); lo != hi {
			continue // a clock step nearby would excuse an early copy
		}
		x := history.Entry{Kind: history.KindOp, Client: "doctor", Op: history.OpConsume, Topic: child.Name, Partition: 0, Offset: 1 << 40,
			Msg: e.Msg, Status: 200, Handle: "doctored", Call: e.Call + d/2, Timestamp: maxTS + 1}
		x.Return = x.Call + int64(time.Millisecond)
		return append(out, x), fmt.Sprintf("%s's copy in %s delivered %s after its produce, before its %s delay", e.Msg, child.Name, ms(d/2), ms(d)), nil
	}
	return nil, "", errNothing
}

func doctorTimestamp(es, out []history.Entry) ([]history.Entry, string, error) {
	ts := map[int64]int64{}
	for _, e := range es {
		if e.Kind == history.KindOp && e.Op == history.OpConsume && e.Status == 200 && e.Topic == "orders" && e.Partition == 0 && e.Msg != "" {
			ts[e.Offset] = e.Timestamp
		}
	}
	top, below := int64(-1), int64(-1)
	for o := range ts {
		if o > top {
			top = o
		}
	}
	for o := range ts {
		if o < top && o > below {
			below = o
		}
	}
	if below < 0 {
		return nil, "", errNothing
	}
	stamp := ts[below] - 1000
	for i, e := range out {
		if e.Kind == history.KindOp && e.Op == history.OpConsume && e.Status == 200 && e.Topic == "orders" && e.Partition == 0 && e.Offset == top {
			out[i].Timestamp = stamp
		}
	}
	return out, fmt.Sprintf("orders/0@%d restamped %d, a second before orders/0@%d (%d)", top, stamp, below, ts[below]), nil
}

// recreatedTopic returns the history's recreated topic and its incarnations.
func recreatedTopic(es []history.Entry) (string, *incSet) {
	for _, t := range runInfo(es).Topics {
		if t.Recreated {
			// The incarnation lives Check works out: a delete of unknown outcome taken as
			// landing at any time left no incarnation after the first such delete a
			// window it surely lived in, and a run with one early had nothing to doctor
			// (TestKillLoop failed so, seed 140717670).
			return t.Name, buildIncarnations(es, t.Name, deleteLandsBy(faultKills(es)))
		}
	}
	return "", nil
}

// faultKills is the fault windows Check counts as kills: kills and crashes, and in a
// cluster's run also pauses, network faults and stops (each may change a leader).
func faultKills(es []history.Entry) kills {
	cluster := len(runInfo(es).Nodes) > 1
	var ks kills
	for _, e := range es {
		if e.Kind != history.KindFault {
			continue
		}
		switch e.Fault {
		case history.FaultKill, history.FaultFailpointKill, history.FaultCrash:
			ks = append(ks, [2]int64{e.Call, e.Return})
		case history.FaultPause, history.FaultNet, history.FaultStop:
			if cluster {
				ks = append(ks, [2]int64{e.Call, e.Return})
			}
		}
	}
	return ks
}

func doctorOldIncarnation(es, out []history.Entry) ([]history.Entry, string, error) {
	topic, rec := recreatedTopic(es)
	if rec == nil {
		return nil, "", errNothing
	}
	ks := faultKills(es)
	// Where each message may have been written, as Check works it out.
	incs := map[string]map[int64]bool{}
	for _, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpProduce || e.Topic != topic || !(e.Status == 0 || e.Status == 202 || e.Status >= 500) {
			continue
		}
		end := e.Return
		if e.Status != 202 {
			end = ks.nextEnd(e.Return)
		}
		if incs[e.Msg] == nil {
			incs[e.Msg] = map[int64]bool{}
		}
		for _, c := range rec.during(e.Call, end) {
			incs[e.Msg][c] = true
		}
	}
	for _, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpConsume || e.Topic != topic || e.Status != 200 || len(incs[e.Msg]) != 1 || !incs[e.Msg][e.Incarnation] {
			continue
		}
		w := rec.byInc[e.Incarnation]
		if w == nil || w.diedSure >= never {
			continue
		}
		for _, next := range rec.wins {
			if next.inc <= w.inc || next.bornSure+int64(time.Millisecond) >= next.diedMin {
				continue
			}
			x := e
			x.Client, x.Handle, x.Incarnation, x.Offset = "doctor", "doctored", next.inc, e.Offset+1<<40
			x.Call = next.bornSure + 1
			x.Return = x.Call + int64(time.Millisecond)/2
			return append(out, x), fmt.Sprintf("%s, written to %s incarnation %d (deleted by %s), delivered again at %s under incarnation %d",
				e.Msg, topic, w.inc, ms(w.diedSure), ms(x.Call), next.inc), nil
		}
	}
	return nil, "", errNothing
}

func doctorStaleAck(es, out []history.Entry) ([]history.Entry, string, error) {
	topic, rec := recreatedTopic(es)
	if rec == nil {
		return nil, "", errNothing
	}
	for i, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpAck || e.Topic != topic || (e.Status != 404 && e.Status != 410) {
			continue
		}
		if w := rec.byInc[e.Incarnation]; w != nil && e.Call > w.diedSure {
			out[i].Status, out[i].Code, out[i].Err = 204, "", ""
			return out, fmt.Sprintf("line %d: an ack with a handle of %s incarnation %d (deleted by %s) answered 204 instead of %d", i+1, topic, w.inc, ms(w.diedSure), e.Status), nil
		}
	}
	// No ack met a deleted incarnation in this run (whether one does depends on the
	// timing of the deletes): add one, a late copy of an ack of an incarnation deleted
	// since, answered 204.
	for i, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpAck || e.Topic != topic || e.Incarnation == 0 {
			continue
		}
		if w := rec.byInc[e.Incarnation]; w != nil && w.diedSure < never {
			d := e
			d.Client, d.Status, d.Code, d.Err = "doctor", 204, "", ""
			d.Call = w.diedSure + int64(time.Second)
			d.Return = d.Call + int64(time.Millisecond)
			out = append(out, d)
			return out, fmt.Sprintf("a copy of line %d: an ack with a handle of %s incarnation %d sent after it was deleted (by %s) answered 204", i+1, topic, w.inc, ms(w.diedSure)), nil
		}
	}
	return nil, "", errNothing
}
