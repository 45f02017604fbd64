package check

import (
	"math"
	"sort"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// never is a time after every history.
const never = int64(1) << 62

// A topic the workload deletes and recreates (history.TopicInfo.Recreated) lives as a
// series of incarnations. Only the workload's recycler creates and deletes it, one call
// at a time, so each incarnation's life can be bounded from the history alone:
//
//   - it was seen: a 201 naming it, or a stats sample (GET /v1/topics/{t}) showing it,
//     proves it existed at some moment of that call; the first such answer is bornSure;
//   - it was made by a create attempt that started by then and ended after the previous
//     incarnation may have begun to die: the earliest such call is bornMin;
//   - a delete that took effect after it was last seen ended it; the earliest call of a
//     delete attempt that could still take effect when the last sight of it began is
//     diedMin (never: it was not deleted). An attempt can take effect until its answer
//     or, with its outcome unknown (no answer, a 5xx other than 503 unavailable), later:
//     its command may wait in the controller's log and be committed by the next
//     controller once one is elected (landsBy);
//   - a delete answered 204 or 404 that started after it was seen, or a sight of a newer
//     incarnation, proves it gone: the earliest such answer is diedSure.
//
// So it surely existed during [bornSure, diedMin] and may have existed during
// [bornMin, diedSure]; everything else follows from that.
type incWin struct {
	inc               int64
	bornMin, bornSure int64
	diedMin, diedSure int64
	lastSeenCall      int64 // the latest call of an answer that showed it
}

// incSet is one recreated topic's incarnations, by incarnation (which the broker makes
// increasing: it is the index of the metadata command that created the topic).
type incSet struct {
	wins  []*incWin
	byInc map[int64]*incWin
}

// buildIncarnations bounds the lives of topic's incarnations from the history (see
// incWin). landsBy is the last moment a delete attempt whose outcome is unknown may
// take effect, given its answer's time.
func buildIncarnations(es []history.Entry, topic string, landsBy func(ret int64) int64) *incSet {
	type call struct {
		call, ret int64
		status    int
		code      string
	}
	var creates, deletes []call
	seen := map[int64]*incWin{}
	saw := func(inc, c, r int64) {
		if inc == 0 {
			return
		}
		w := seen[inc]
		if w == nil {
			w = &incWin{inc: inc, bornSure: r, lastSeenCall: c}
			seen[inc] = w
		}
		w.bornSure, w.lastSeenCall = min(w.bornSure, r), max(w.lastSeenCall, c)
	}
	for _, e := range es {
		if e.Topic != topic {
			continue
		}
		switch {
		case e.Kind == history.KindOp && e.Op == history.OpCreateTopic:
			creates = append(creates, call{e.Call, e.Return, e.Status, e.Code})
			if e.Status == 201 {
				saw(e.Incarnation, e.Call, e.Return)
			}
		case e.Kind == history.KindOp && e.Op == history.OpDeleteTopic:
			deletes = append(deletes, call{e.Call, e.Return, e.Status, e.Code})
		case e.Kind == history.KindStats && e.Status == 200:
			saw(e.Incarnation, e.Call, e.Return)
		}
	}
	s := &incSet{byInc: seen}
	for _, w := range seen {
		s.wins = append(s.wins, w)
	}
	sort.Slice(s.wins, func(i, j int) bool { return s.wins[i].inc < s.wins[j].inc })
	prevDiedMin := int64(-1) << 62
	for i, w := range s.wins {
		w.bornMin = w.bornSure
		for _, c := range creates {
			if c.call <= w.bornSure && c.ret >= prevDiedMin && c.call < w.bornMin {
				w.bornMin = c.call
			}
		}
		w.diedMin, w.diedSure = never, never
		for _, d := range deletes {
			lands := d.ret
			if d.status == 0 || d.status >= 500 && d.code != "unavailable" {
				lands = landsBy(d.ret)
			}
			if lands >= w.lastSeenCall && d.call < w.diedMin {
				w.diedMin = d.call
			}
			if (d.status == 204 || d.status == 404) && d.call >= w.bornSure && d.ret < w.diedSure {
				w.diedSure = d.ret
			}
		}
		for _, later := range s.wins[i+1:] {
			if later.bornSure < w.diedSure {
				w.diedSure = later.bornSure
			}
		}
		prevDiedMin = w.diedMin
	}
	return s
}

// during returns the incarnations that may have existed at some moment of [a, b].
func (s *incSet) during(a, b int64) []int64 {
	var out []int64
	for _, w := range s.wins {
		if w.bornMin <= b && w.diedSure >= a {
			out = append(out, w.inc)
		}
	}
	return out
}

// surely reports whether one incarnation surely existed all through [a, b].
func (s *incSet) surely(a, b int64) bool {
	for _, w := range s.wins {
		if w.bornSure <= a && w.diedMin >= b {
			return true
		}
	}
	return false
}

// clockLine is a clock fault: from at on, node (the single node's lines say "node")
// starts with the wall clock shifted by off.
type clockLine struct {
	at, off int64
	node    string
	// drift is how many seconds a second the node's clock gains from at on.
	drift float64
}

// offAt is the line's offset at t (not before its own time): what it set, plus what
// its drift gained since.
func (l clockLine) offAt(t int64) int64 {
	return l.off + int64(l.drift*float64(max(t, l.at)-l.at))
}

// clockTimeline is the history's clock faults in time order; before a node's first the
// offset is zero. A restart's clock line is written before that node starts, after the
// previous process died, so every process ran with its node's offset in effect at its
// start. In a cluster each node has its own offset, and a node no line names runs
// with none.
type clockTimeline []clockLine

// span returns the lowest and highest offset any node ran with during [a, b]. A
// drifting line counts at both ends of the time it may cover in [a, b] (its offset
// moves one way), even where a later line of its node replaced it: wider, never
// narrower.
func (c clockTimeline) span(a, b int64) (lo, hi int64) {
	cur := map[string]clockLine{}
	cluster := false
	for _, l := range c {
		cluster = cluster || l.node != "node" && l.node != ""
	}
	i := 0
	for ; i < len(c) && c[i].at <= a; i++ {
		cur[c[i].node] = c[i]
	}
	if len(cur) == 0 || cluster {
		// The nodes no line named yet (all of them, before the first). In a cluster 0
		// stays in even when every node was shifted (the timeline does not know how
		// many nodes there are): the allowance is then wider than it could be, never
		// narrower, so it never flags a legal history.
		cur["\x00unnamed"] = clockLine{}
	}
	first := true
	see := func(off int64) {
		if first {
			lo, hi, first = off, off, false
		}
		lo, hi = min(lo, off), max(hi, off)
	}
	// A drifting line is written before its process starts, and the process's clock
	// drifts from its own start, up to startSlack later: its offset is within
	// |drift| × startSlack of the line's at any moment.
	seeLine := func(l clockLine, t int64) {
		o := l.offAt(t)
		if l.drift != 0 {
			slack := int64(math.Abs(l.drift) * float64(startSlack))
			see(o - slack)
			see(o + slack)
			return
		}
		see(o)
	}
	for _, l := range cur {
		seeLine(l, a)
		seeLine(l, b)
	}
	for ; i < len(c) && c[i].at <= b; i++ {
		seeLine(c[i], c[i].at)
		seeLine(c[i], b)
	}
	return lo, hi
}

// startSlack bounds how long after its clock line a node's process starts.
const startSlack = int64(2 * time.Second)

// early is how much earlier than by the run's own clock a node may see a message reach
// an age (its delay, its retention), when the message was stamped during
// [stampFrom, stampTo] and the node acted on it by effectTo. The broker stamps a record
// with its wall clock (never below the partition's last stamp) and compares the stamp
// with its wall clock when it acts; a node whose clock is S ahead of the one that stamped
// the record sees it S older. On one node that happens only when the offset went up
// between the two, by a forward step across a restart — indistinguishable from the node
// having been down that long; in a cluster also when the node that acts runs ahead of
// the one that stamped. With no offset higher than the stamper's, early is 0.
func (c clockTimeline) early(stampFrom, stampTo, effectTo int64) int64 {
	lo, _ := c.span(stampFrom, stampTo)
	_, hi := c.span(stampFrom, effectTo)
	return max(0, hi-lo)
}
