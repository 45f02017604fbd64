package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The per-message model: one copy of a message (a topic, partition and offset) goes
// through leases and settles. Times are the run's monotonic nanoseconds; the broker's
// lease clock is the same CLOCK_MONOTONIC, so "surely alive" and "surely lapsed" can be
// decided from call and return times with a small tolerance.

const tolerance = int64(5 * time.Millisecond)

type opKind uint8

const (
	kDeliver opKind = iota
	kAck
	kNack
	kExtend
)

func (k opKind) String() string { return [...]string{"deliver", "ack", "nack", "extend"}[k] }

// outcome of a settle attempt.
type outcome uint8

const (
	oOK      outcome = iota // 204
	oGone                   // 410
	oUnknown                // no answer, or 503 timeout: it may or may not have happened
	oFailed                 // 503 storage_failed: not stored, the lease may have been handed back
	oOther                  // 4xx other than 410: nothing happened
	// oNotUndone is a 503 maybe_stored: the broker could not undo the failed write,
	// refused and handed back while the node runs, but the record stayed in the
	// journal, so after a restart the settle may have taken effect.
	oNotUndone
)

type opIn struct {
	kind      opKind
	handle    string
	call, ret int64
	out       outcome
	line      int // history line, for reports
	client    string
}

// copyState is a copy's state; a plain value, so porcupine compares it with ==.
type copyState struct {
	has        bool   // a lease was ever granted
	handle     string // the newest lease's handle
	leaseCall  int64  // call time of the delivery that granted it
	leaseRet   int64
	minExp     int64 // the lease is surely alive before this
	maxExp     int64 // and surely lapsed after this
	handedBack bool  // nacked (or handed back by a failed settle)
	acked      bool  // settled
	ackRaced   bool  // the settling ack overlapped a kill
	ackCall    int64 // call time of the settling ack
}

// kills are the windows in which the node may have died: [start, end].
type kills [][2]int64

// between reports whether a crash may have happened inside [a, b].
func (k kills) between(a, b int64) bool {
	for _, w := range k {
		if w[1] >= a && w[0] <= b {
			return true
		}
	}
	return false
}

// surelyBetween reports whether a crash surely happened after a and before b.
func (k kills) surelyBetween(a, b int64) bool {
	for _, w := range k {
		if w[0] > a && w[1] < b {
			return true
		}
	}
	return false
}

type model struct {
	vis   int64
	kills kills
	// In a cluster run: strictAck — an ack answered 204 is committed on a quorum, so no
	// crash excuses a delivery after it; changes — the windows in which this copy's
	// partition surely changed leader (its epoch rose between two samples) other than by
	// handovers alone, after which a handle of the old leader must not settle. kills then holds every window in which
	// the partition may have changed leader (any kill, pause or network fault, and the
	// epoch changes), which excuses a lost lease.
	strictAck bool
	changes   kills
	// agedAt is the earliest time retention may delete the copy (its first produce was
	// sent then plus the retention); a lease may end by deletion from then on.
	agedAt int64
	// ackUndoneAt, when not 0, is when the harness damaged the settle record of this
	// copy's ack (and the node reported skipping it): a delivery sent after it may
	// follow a 204 ack sent before it.
	ackUndoneAt int64
}

// step returns the states the copy may be in after op, or none and why not.
func (m *model) step(s copyState, in opIn) ([]copyState, string) {
	switch in.kind {
	case kDeliver:
		// Only an ack sent before the damage may be the one it undid: a later ack
		// wrote a record of its own.
		if s.acked && m.ackUndoneAt != 0 && in.call >= m.ackUndoneAt && s.ackCall < m.ackUndoneAt {
			return []copyState{{has: true, handle: in.handle, leaseCall: in.call, leaseRet: in.ret, minExp: in.call + m.vis, maxExp: in.ret + m.vis}}, ""
		}
		if s.acked && m.strictAck {
			return nil, "delivered again after a 204 ack (in a cluster, committed on a quorum: no crash excuses it)"
		}
		if s.acked && !s.ackRaced {
			return nil, "delivered again after a 204 ack that raced no kill"
		}
		if s.has && !s.acked && !s.handedBack && in.ret+tolerance < s.minExp && !m.kills.between(s.leaseCall, in.ret) {
			return nil, fmt.Sprintf("delivered again while the previous lease (delivered at %s) was surely alive: %s before it could lapse", ms(s.leaseRet), ms(s.minExp-in.ret))
		}
		return []copyState{{has: true, handle: in.handle, leaseCall: in.call, leaseRet: in.ret, minExp: in.call + m.vis, maxExp: in.ret + m.vis}}, ""
	}
	// A settle: ack, nack or extend.
	applied, why := m.settled(s, in)
	switch in.out {
	case oOK:
		if why != "" {
			return nil, fmt.Sprintf("204 on %s: %s", in.kind, why)
		}
		return []copyState{applied}, ""
	case oGone:
		if in.handle == s.handle && s.has && !s.acked && !s.handedBack && in.ret+tolerance < s.minExp && !m.kills.between(s.leaseCall, in.ret) && in.ret+tolerance < m.agedAt {
			return nil, fmt.Sprintf("410 on %s while the lease was surely alive (%s left)", in.kind, ms(s.minExp-in.ret))
		}
		return []copyState{s}, ""
	case oUnknown:
		if why != "" {
			return []copyState{s}, ""
		}
		return []copyState{s, applied}, ""
	case oFailed, oNotUndone:
		next := []copyState{s}
		if in.kind == kAck && in.handle == s.handle && !s.acked {
			hb := s
			hb.handedBack = true
			next = append(next, hb)
		}
		if in.out == oNotUndone && why == "" {
			next = append(next, applied)
		}
		return next, ""
	default:
		return []copyState{s}, ""
	}
}

// settled is the state after the settle took effect, or why it could not have.
func (m *model) settled(s copyState, in opIn) (copyState, string) {
	switch {
	case !s.has || in.handle != s.handle:
		return s, "the handle is not the copy's newest lease"
	case s.acked:
		return s, "the lease was settled already"
	case s.handedBack:
		return s, "the lease was handed back already"
	case !m.strictAck && m.kills.surelyBetween(s.leaseRet, in.call):
		return s, "the handle was issued before a restart"
	case m.strictAck && m.changes.surelyBetween(s.leaseRet, in.call):
		return s, "the handle was issued before a change of the partition's leader"
	case in.call > s.maxExp+tolerance:
		return s, fmt.Sprintf("the lease had surely lapsed %s before", ms(in.call-s.maxExp))
	}
	switch in.kind {
	case kAck:
		s.acked, s.ackRaced, s.ackCall = true, !m.strictAck && m.kills.between(in.call, in.ret), in.call
	case kNack:
		s.handedBack = true
	case kExtend:
		s.minExp, s.maxExp = in.call+m.vis, in.ret+m.vis
	}
	return s, ""
}

func ms(ns int64) string { return time.Duration(ns).Round(time.Millisecond).String() }

func (m *model) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{copyState{}} },
		Step: func(state, input, _ interface{}) []interface{} {
			next, _ := m.step(state.(copyState), input.(opIn))
			out := make([]interface{}, len(next))
			for i, n := range next {
				out[i] = n
			}
			return out
		},
		DescribeOperation: func(input, _ interface{}) string {
			in := input.(opIn)
			return fmt.Sprintf("%s %s", in.kind, in.handle)
		},
	}
	return nm.ToModel()
}

// checkCopy checks one copy's operations with porcupine; when they are illegal it
// says which operation no state could take, and why: the first one (by return) that
// cannot follow the longest legal order porcupine found, or, failing that, the first
// that cannot follow the operations before it in call order.
func (m *model) checkCopy(ops []opIn) (ok bool, bad opIn, why string) {
	hist := make([]porcupine.Operation, len(ops))
	for i, o := range ops {
		hist[i] = porcupine.Operation{ClientId: 0, Input: o, Call: o.call, Return: o.ret}
	}
	res := porcupine.CheckOperationsTimeout(m.porcupine(), hist, 10*time.Second)
	if res != porcupine.Illegal {
		return true, opIn{}, ""
	}
	if bad, why, found := m.blame(ops, hist); found {
		return false, bad, why
	}
	sorted := append([]opIn(nil), ops...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].call < sorted[j].call })
	states := []copyState{{}}
	for _, o := range sorted {
		next, reason := m.stepAll(states, o)
		if len(next) == 0 {
			return false, o, reason
		}
		states = dedupe(next)
	}
	return false, sorted[len(sorted)-1], "no order of these operations is legal (overlapping operations)"
}

// blame finds the operation of an illegal copy's history that no state reached by
// the longest legal order of its other operations can take. A walk in call order
// would blame an operation that overlaps a later one it may follow (a delivery whose
// call came before the nack that freed its message), however legal, whenever
// anything later in the history is wrong.
func (m *model) blame(ops []opIn, hist []porcupine.Operation) (opIn, string, bool) {
	_, info := porcupine.CheckOperationsVerbose(m.porcupine(), hist, 10*time.Second)
	parts := info.PartialLinearizations()
	if len(parts) != 1 {
		return opIn{}, "", false
	}
	var longest []int
	for _, l := range parts[0] {
		if len(l) > len(longest) {
			longest = l
		}
	}
	states := []copyState{{}}
	in := make([]bool, len(ops))
	for _, i := range longest {
		next, _ := m.stepAll(states, ops[i])
		if len(next) == 0 {
			return opIn{}, "", false // not the order porcupine found: the walk in call order says
		}
		states, in[i] = dedupe(next), true
	}
	var rest []opIn
	for i, o := range ops {
		if !in[i] {
			rest = append(rest, o)
		}
	}
	sort.SliceStable(rest, func(i, j int) bool {
		if rest[i].ret != rest[j].ret {
			return rest[i].ret < rest[j].ret
		}
		return rest[i].call < rest[j].call
	})
	for _, o := range rest {
		if next, reason := m.stepAll(states, o); len(next) == 0 {
			return o, reason, true
		}
	}
	return opIn{}, "", false
}

// stepAll steps every state in states with o: the states it may lead to, and the
// first reason a state could not take it.
func (m *model) stepAll(states []copyState, o opIn) ([]copyState, string) {
	var next []copyState
	var reason string
	for _, s := range states {
		n, r := m.step(s, o)
		next = append(next, n...)
		if reason == "" {
			reason = r
		}
	}
	return next, reason
}

func dedupe(ss []copyState) []copyState {
	out := ss[:0:0]
	seen := map[copyState]bool{}
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// nextEnd returns the end of the first kill window that ends at or after t (never: none).
func (k kills) nextEnd(t int64) int64 {
	end := never
	for _, w := range k {
		if w[1] >= t && w[1] < end {
			end = w[1]
		}
	}
	return end
}
