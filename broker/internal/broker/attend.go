package broker

import (
	"sync/atomic"
	"time"
)

// A consume on a node of a cluster asks the topic's partitions in turn, and each one
// another node leads is a forwarded lease (and later a forwarded ack): in the RF 3
// flows two thirds of consumes and acks crossed the node plane, a third of the three
// nodes' CPU per acked message. Taking from the partitions this node leads first would
// end most of them, but a partition led by a node with no consumers of its own would
// then wait until every node that has consumers runs out of messages of its own.
//
// So a node takes its own partitions first only before those of nodes that attend to
// theirs: a holder answering a forwarded lease says whether consumers of the topic are
// asking it directly (one in progress, or one ended within attendWindow). A partition
// whose holder said so within attendTTL is asked after this node's own partitions and
// the unattended ones; every other partition keeps its place in the rotation, as
// before. An attended partition is asked first by one consume every attendRefresh, so
// that its holder says again whether it is attended: when its consumers go, the others
// go back to taking turns with it within attendWindow + attendTTL. A holder of an
// earlier version says nothing, and its partitions keep their turn.
const (
	attendWindow  = 2 * time.Second
	attendTTL     = 2 * time.Second
	attendRefresh = time.Second
)

// monoBase anchors mono: attendance times are monotonic clock readings.
var monoBase = time.Now()

// mono is the monotonic clock in nanoseconds since monoBase (never 0 once running:
// 0 means "never" below).
func mono() int64 { return int64(time.Since(monoBase)) + 1 }

// attendance is a topic's view of who consumes its partitions.
type attendance struct {
	// On the holder: consumes of the topic made to this node in progress, and when the
	// last one began or ended.
	local     atomic.Int32
	localLast atomic.Int64
	// On an entry node, per partition: when its holder last said it is attended (0: it
	// did not, or it was never asked), and when a consume last asked it first to hear
	// again. Sized by the topic's partitions when the topic opens.
	seen  []atomic.Int64
	asked []atomic.Int64
	// ttl and refresh are attendTTL and attendRefresh (a test stretches them).
	ttl, refresh int64
}

func newAttendance(parts int) *attendance {
	return &attendance{seen: make([]atomic.Int64, parts), asked: make([]atomic.Int64, parts),
		ttl: int64(attendTTL), refresh: int64(attendRefresh)}
}

// consuming notes the start of a consume of the topic made to this node; consumed
// its end.
func (a *attendance) consuming() {
	a.local.Add(1)
	a.localLast.Store(mono())
}

func (a *attendance) consumed() {
	a.localLast.Store(mono())
	a.local.Add(-1)
}

// attended reports whether consumers of the topic ask this node directly.
func (a *attendance) attended(now int64) bool {
	if a.local.Load() > 0 {
		return true
	}
	last := a.localLast.Load()
	return last != 0 && now-last < int64(attendWindow) // 0: no consume since the topic opened
}

// heard records a holder's answer about partition i.
func (a *attendance) heard(i int, attended bool, now int64) {
	if i >= len(a.seen) {
		return
	}
	if attended {
		a.seen[i].Store(now)
	} else {
		a.seen[i].Store(0)
	}
}

// Classes of a partition in a consume's order.
const (
	askFirst = iota // attended, and this consume asks its holder again
	askInTurn
	askLast // attended by its holder's own consumers
)

// order appends to buf the order in which a consume asks the topic's n partitions:
// the rotation from start, with the attended partitions another node leads moved to
// the end (one due to be asked again moved to the front, for this consume only).
// leads reports whether this node leads partition i.
func (a *attendance) order(buf []int, n, start int, leads func(int) bool, now int64) []int {
	var small [64]uint8
	cls := small[:0]
	if n > len(small) {
		cls = make([]uint8, 0, n)
	}
	counts := [3]int{}
	for k := range n {
		i := (start + k) % n
		c := uint8(askInTurn)
		if i < len(a.seen) {
			if s := a.seen[i].Load(); s != 0 && now-s < a.ttl && !leads(i) {
				c = askLast
				if now-s >= a.refresh {
					if q := a.asked[i].Load(); now-q >= a.refresh && a.asked[i].CompareAndSwap(q, now) {
						c = askFirst
					}
				}
			}
		}
		cls = append(cls, c)
		counts[c]++
	}
	if counts[askInTurn] == n {
		for k := range n {
			buf = append(buf, (start+k)%n)
		}
		return buf
	}
	for c := range uint8(3) {
		if counts[c] == 0 {
			continue
		}
		for k := range n {
			if cls[k] == c {
				buf = append(buf, (start+k)%n)
			}
		}
	}
	return buf
}
