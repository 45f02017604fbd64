// Package queue is the pure queue logic of one partition: which offsets are leased,
// handed back, settled, and not yet delivered, and the ack frontier. It does no I/O and
// reads no clock: callers pass the monotonic time in, which makes every rule testable
// exhaustively. See DESIGN.md beside this file.
//
// Its costs (a lease and settle, a batch settled out of order, a receipt handle's round
// trip) are measured by make bench-go and kept, dated, in docs/performance.md.
package queue

import (
	"container/heap"
	"errors"
	"fmt"
	"time"
)

// ErrLeaseLost means the lease named by a handle is no longer held: it lapsed, was handed
// back, or the message was settled.
var ErrLeaseLost = errors.New("queue: lease lost")

// ErrAckedAheadFull means settling this offset would grow the set of messages settled past
// the frontier over its cap; the caller should retry after older messages settle.
var ErrAckedAheadFull = errors.New("queue: acked-ahead set full")

// ErrOutOfRange means the offset was never written, or has aged out of the log.
var ErrOutOfRange = errors.New("queue: offset out of range")

// Config holds the live-tunable settings of a partition's queue.
type Config struct {
	// Visibility is the lease length a consume takes.
	Visibility time.Duration
	// MaxInFlight caps the leases held at once; at the cap nothing new is handed out.
	MaxInFlight int
	// MaxAckedAhead caps the offsets settled past the frontier. It is also how far past
	// the frontier a new message is leased: every ack of a message leased under the cap
	// fits in the set, so none is refused for it (see Lease).
	MaxAckedAhead int
}

// Nonce names one lease. (Epoch, Seq) is never issued twice for a partition: the epoch
// grows at every open of the partition (later: every leader term) and Seq counts leases
// within it.
type Nonce struct {
	Epoch uint32
	Seq   uint64
}

// Grant is one message reserved by Lease.
type Grant struct {
	Offset   uint64
	Nonce    Nonce
	Attempt  uint32
	Deadline int64 // monotonic nanoseconds
}

type lease struct {
	offset   uint64
	nonce    Nonce
	attempt  uint32
	deadline int64
	settling bool // an ack is being made durable; the lease can no longer lapse
	index    int  // position in the expiry heap, -1 when not in it
}

// State is the queue of one partition. It is not safe for concurrent use; the partition
// serialises access.
//
// Every offset in [frontier, end) is in exactly one of: the acked-ahead set, leased,
// ready (handed back or lapsed, waiting for redelivery), or at or past cursor (never
// delivered since the partition opened).
type State struct {
	cfg Config

	epoch uint32
	seq   uint64

	oldest   uint64 // first offset still in the log
	end      uint64 // one past the last durable offset (the high watermark)
	frontier uint64 // every offset below it is settled or aged out
	cursor   uint64 // first offset never handed out since open

	ackedAhead map[uint64]struct{}
	leases     map[uint64]*lease
	expiry     expiryHeap
	ready      readyHeap
	attempts   map[uint64]uint32 // delivery count of ready offsets
	damaged    uint64            // offsets skipped by Skip since open
}

// New returns the queue state of a partition opened with lease epoch epoch, whose
// settled prefix ends at frontier and whose out-of-order settled offsets are ackedAhead.
// The log bounds are set with SetBounds.
func New(cfg Config, epoch uint32, frontier uint64, ackedAhead []uint64) *State {
	s := &State{
		cfg:        cfg,
		epoch:      epoch,
		frontier:   frontier,
		cursor:     frontier,
		ackedAhead: make(map[uint64]struct{}, len(ackedAhead)),
		leases:     make(map[uint64]*lease),
		attempts:   make(map[uint64]uint32),
	}
	for _, o := range ackedAhead {
		s.Settled(o)
	}
	return s
}

// SetConfig changes the settings; leases already granted keep their deadlines.
func (s *State) SetConfig(cfg Config) { s.cfg = cfg }

// Config returns the current settings.
func (s *State) Config() Config { return s.cfg }

// Epoch returns the lease epoch of this state.
func (s *State) Epoch() uint32 { return s.epoch }

// SetBounds tells the queue the log now holds offsets [oldest, end). end only grows;
// when oldest grows (retention), everything below it counts as settled and leases on it
// are dropped.
func (s *State) SetBounds(oldest, end uint64) {
	if end > s.end {
		s.end = end
	}
	if oldest <= s.oldest {
		return
	}
	s.oldest = oldest
	if s.frontier < oldest {
		s.frontier = oldest
	}
	if s.cursor < oldest {
		s.cursor = oldest
	}
	for o := range s.ackedAhead {
		if o < s.frontier {
			delete(s.ackedAhead, o)
		}
	}
	for o, l := range s.leases {
		if o < oldest && !l.settling {
			s.dropLease(l)
		}
	}
	for len(s.ready) > 0 && s.ready[0] < oldest {
		o := heap.Pop(&s.ready).(uint64)
		delete(s.attempts, o)
	}
	s.advance()
}

// Lease reserves up to max messages for the visibility timeout from now, redeliveries
// (lowest offset first) before new messages. It returns nil when nothing is available or
// the in-flight cap is reached.
func (s *State) Lease(now int64, max int) []Grant {
	return s.LeaseFor(now, max, s.cfg.Visibility)
}

// LeaseFor is Lease with an explicit lease length.
func (s *State) LeaseFor(now int64, max int, d time.Duration) []Grant {
	var out []Grant
	for len(out) < max && len(s.leases) < s.cfg.MaxInFlight {
		off, attempt, ok := s.nextAvailable()
		if !ok {
			break
		}
		s.seq++
		l := &lease{offset: off, nonce: Nonce{Epoch: s.epoch, Seq: s.seq}, attempt: attempt, deadline: now + int64(d)}
		s.leases[off] = l
		heap.Push(&s.expiry, l)
		out = append(out, Grant{Offset: off, Nonce: l.nonce, Attempt: attempt, Deadline: l.deadline})
	}
	return out
}

// nextAvailable picks the next offset to hand out and removes it from where it waited.
func (s *State) nextAvailable() (off uint64, attempt uint32, ok bool) {
	if s.readyInWindow() {
		off = heap.Pop(&s.ready).(uint64)
		attempt = s.attempts[off] + 1
		delete(s.attempts, off)
		return off, attempt, true
	}
	for s.cursor < s.end && s.cursor < s.windowEnd() {
		off = s.cursor
		s.cursor++
		if _, done := s.ackedAhead[off]; done || off < s.frontier {
			continue
		}
		return off, 1, true
	}
	return 0, 0, false
}

// windowEnd is the first offset a new lease may not reach: at most MaxAckedAhead past
// the frontier. The acked-ahead set then holds only offsets in (frontier, windowEnd),
// at most MaxAckedAhead, so an ack of a lease granted under the cap is never refused
// for it. Without the window, one slow message at the frontier let later acks fill the
// set; every ack after that was refused, each refused message waited out its lease,
// and a backlog moved on by one message a lease (the cluster chaos tier saw a drain of
// thousands stall so). ErrAckedAheadFull is left for leases granted under a higher cap.
func (s *State) windowEnd() uint64 { return s.frontier + uint64(s.cfg.MaxAckedAhead) + 1 }

// readyInWindow reports whether the lowest message waiting for redelivery is inside
// the window. Redeliveries keep to it as new messages do: a new leader of a replicated
// partition makes every unsettled message below the delivered-to mark ready (Reset),
// and that mark may run past the window (a leader under its lease reserves it 1,024
// messages ahead of its cursor). Leased past the window, their acks filled the set
// while offsets nearer the frontier were still out; every later ack was refused, and
// a drain moved on by about one message a lease (the cluster chaos tier, namespace
// run of 5 December, seed 5901: 4,657 messages of events/5 undelivered after its
// 5-minute drain). A ready message past the window waits until the frontier comes
// near; one lowered cap (SetConfig) makes others wait the same way.
func (s *State) readyInWindow() bool { return len(s.ready) > 0 && s.ready[0] < s.windowEnd() }

// Available reports whether Lease would grant something now.
func (s *State) Available() bool {
	if len(s.leases) >= s.cfg.MaxInFlight {
		return false
	}
	if s.readyInWindow() {
		return true
	}
	for c := s.cursor; c < s.end && c < s.windowEnd(); c++ {
		if _, done := s.ackedAhead[c]; !done && c >= s.frontier {
			return true
		}
		// Skipping settled offsets here is cheap: the acked-ahead set is capped.
	}
	return false
}

// InFlightFull reports whether the partition holds its maximum of leases.
func (s *State) InFlightFull() bool { return len(s.leases) >= s.cfg.MaxInFlight }

func (s *State) check(off uint64, n Nonce, now int64) (*lease, error) {
	l, ok := s.leases[off]
	if !ok || l.nonce != n || l.settling || l.deadline <= now {
		return nil, ErrLeaseLost
	}
	return l, nil
}

// Holds reports whether the lease (off, n) is held at now: granted, not lapsed, not
// handed back or being settled.
func (s *State) Holds(off uint64, n Nonce, now int64) bool {
	_, err := s.check(off, n, now)
	return err == nil
}

// BeginSettle checks that the lease (off, n) is held at now and marks it settling: it can
// no longer lapse or be extended, and a second settle of it gets ErrLeaseLost. The caller
// then makes the settlement durable and calls CommitSettle, or AbortSettle if that
// failed.
func (s *State) BeginSettle(off uint64, n Nonce, now int64) error {
	l, err := s.check(off, n, now)
	if err != nil {
		return err
	}
	if off != s.frontier && len(s.ackedAhead) >= s.cfg.MaxAckedAhead {
		return ErrAckedAheadFull
	}
	l.settling = true
	heap.Remove(&s.expiry, l.index)
	return nil
}

// CommitSettle finishes a settle begun with BeginSettle: the offset is done.
func (s *State) CommitSettle(off uint64) {
	if l, ok := s.leases[off]; ok && l.settling {
		delete(s.leases, off)
	}
	s.Settled(off)
}

// AbortSettle undoes BeginSettle after the settlement could not be made durable: the
// message is handed back for redelivery, since the caller was told nothing settled.
func (s *State) AbortSettle(off uint64) {
	l, ok := s.leases[off]
	if !ok || !l.settling {
		return
	}
	delete(s.leases, off)
	s.makeReady(off, l.attempt)
}

// AbortSettleOf is AbortSettle for the lease (off, n) only: a settle that gave up
// after the queue started a new epoch (its replica lost the leadership and won it
// back) must not hand back a newer lease of the offset that another ack pinned.
func (s *State) AbortSettleOf(off uint64, n Nonce) {
	if l, ok := s.leases[off]; ok && l.nonce == n {
		s.AbortSettle(off)
	}
}

// UnpinSettle undoes BeginSettle of the lease (off, n) when the settlement certainly
// was not made anywhere (a replicated settle refused before it entered the group's
// log): the lease is held again as it was, with its deadline, and the holder may ack it
// again. Handing it back (AbortSettle) would redeliver a message whose lease nothing
// ended, and answer the ack sent again 410.
func (s *State) UnpinSettle(off uint64, n Nonce) {
	l, ok := s.leases[off]
	if !ok || !l.settling || l.nonce != n {
		return
	}
	l.settling = false
	heap.Push(&s.expiry, l)
}

// Skip settles off without a consumer because its record is damaged and can never be
// served: it is counted, and it stops pinning the frontier. A damaged record is the one
// way an offset becomes done without an ack (see docs/delivery-contract.md).
func (s *State) Skip(off uint64) {
	if off < s.frontier {
		return
	}
	if _, done := s.ackedAhead[off]; done {
		return
	}
	s.damaged++
	s.Settled(off)
}

// Settled records that off is done (from a commit or from replaying the journal).
// Settling an offset twice, or one below the frontier, changes nothing: the frontier
// never moves back.
func (s *State) Settled(off uint64) {
	if off < s.frontier {
		return
	}
	if l, ok := s.leases[off]; ok {
		s.dropLease(l)
	}
	if _, ready := s.attempts[off]; ready {
		// Waiting for redelivery, and settled all the same: a settle whose outcome
		// was unknown handed the message back (AbortSettle), then committed. Left in
		// the heap it was leased again although settled, below the frontier once that
		// moved past it, and the ack of that lease found the offset settled and never
		// ended the lease, which then held an in-flight slot until the next leader.
		s.removeReady(off)
	}
	s.ackedAhead[off] = struct{}{}
	s.advance()
}

// removeReady takes off out of the messages waiting for redelivery (a linear search:
// only a settle that commits after it was given up on gets here).
func (s *State) removeReady(off uint64) {
	for i, o := range s.ready {
		if o == off {
			heap.Remove(&s.ready, i)
			break
		}
	}
	delete(s.attempts, off)
}

func (s *State) advance() {
	for {
		if _, ok := s.ackedAhead[s.frontier]; !ok {
			break
		}
		delete(s.ackedAhead, s.frontier)
		s.frontier++
	}
	if s.cursor < s.frontier {
		s.cursor = s.frontier
	}
}

// IsSettled reports whether off is done (below the frontier or settled ahead of it).
func (s *State) IsSettled(off uint64) bool {
	if off < s.frontier {
		return true
	}
	_, ok := s.ackedAhead[off]
	return ok
}

// Reset starts a new lease epoch, as a replica that begins or stops leading its
// partition does: every lease is forgotten (they were the previous leader's memory),
// so every unsettled message is ready at once, and handles of older epochs are lost.
// Messages below deliveredTo were delivered before (by an earlier leader): they count
// as delivered at least once.
func (s *State) Reset(epoch uint32, deliveredTo uint64, handed ...Grant) {
	s.epoch = epoch
	s.seq = 0
	s.leases = make(map[uint64]*lease)
	s.expiry = s.expiry[:0]
	s.ready = s.ready[:0]
	s.attempts = make(map[uint64]uint32)
	s.cursor = s.frontier
	// Leases a leader handed over before a planned change of leader stay leases, with
	// their nonces and deadlines: their receipt handles keep working.
	for _, g := range handed {
		if g.Offset < s.frontier || g.Offset >= s.end || g.Offset < s.oldest {
			continue
		}
		if _, done := s.ackedAhead[g.Offset]; done {
			continue
		}
		l := &lease{offset: g.Offset, nonce: g.Nonce, attempt: g.Attempt, deadline: g.Deadline}
		s.leases[g.Offset] = l
		heap.Push(&s.expiry, l)
		deliveredTo = max(deliveredTo, g.Offset+1)
	}
	for o := s.frontier; o < deliveredTo && o < s.end; o++ {
		if _, done := s.ackedAhead[o]; done {
			continue
		}
		if _, leased := s.leases[o]; !leased {
			s.makeReady(o, 1)
		}
	}
	if s.cursor < deliveredTo {
		s.cursor = min(deliveredTo, s.end)
	}
}

// RaiseAttempts makes the delivery counts of ready messages at least those in m
// (offset → deliveries so far): a new leader of a replicated partition learns from its
// group how often the old leaders delivered them, so delivery_attempt counts on.
func (s *State) RaiseAttempts(m map[uint64]uint32) {
	for o, a := range m {
		if cur, ok := s.attempts[o]; ok && a > cur {
			s.attempts[o] = a
		}
	}
}

// Live returns the leases held at now, to hand them over: those being settled too, as
// their settle may still fail (the handover's transfer drops it), and the holder's ack
// sent again to the next leader must then find its lease there. A settle that commits
// is applied after or before the handed leases, and settles the offset either way.
func (s *State) Live(now int64) []Grant {
	out := make([]Grant, 0, len(s.leases))
	for _, l := range s.leases {
		if l.deadline > now {
			out = append(out, Grant{Offset: l.offset, Nonce: l.nonce, Attempt: l.attempt, Deadline: l.deadline})
		}
	}
	return out
}

// Cursor returns the first offset never handed out in this epoch (and not made ready
// by Reset): everything below it, settled or not, was delivered at least once.
func (s *State) Cursor() uint64 { return s.cursor }

// Extend renews the lease (off, n) to end d from now. With d == 0 the message is handed
// back at once (a nack) and the handle is spent.
func (s *State) Extend(off uint64, n Nonce, now int64, d time.Duration) error {
	l, err := s.check(off, n, now)
	if err != nil {
		return err
	}
	if d <= 0 {
		s.dropLease(l)
		s.makeReady(off, l.attempt)
		return nil
	}
	l.deadline = now + int64(d)
	heap.Fix(&s.expiry, l.index)
	return nil
}

// Expire hands back every lease whose deadline is at or before now and returns how many
// it released.
func (s *State) Expire(now int64) int {
	n := 0
	for len(s.expiry) > 0 && s.expiry[0].deadline <= now {
		l := s.expiry[0]
		s.dropLease(l)
		s.makeReady(l.offset, l.attempt)
		n++
	}
	return n
}

// NextDeadline returns the earliest lease deadline, and false when no lease can lapse.
func (s *State) NextDeadline() (int64, bool) {
	if len(s.expiry) == 0 {
		return 0, false
	}
	return s.expiry[0].deadline, true
}

// Unlease hands back the lease (off, n) of a message leased but never sent (its
// response had no room for it, or its replicas did not confirm it), as if it had not
// been handed out: the attempt is not counted. Only that lease: the read or the
// confirmation before it can outlast it, and another consumer may hold the message
// under a new lease by then, which must go on (a review, 6 December: the hand-back by
// offset alone ended that lease, and the message was delivered again at once).
func (s *State) Unlease(off uint64, n Nonce) {
	if l, ok := s.leases[off]; ok && !l.settling && l.nonce == n {
		s.dropLease(l)
		s.makeReady(off, l.attempt-1)
	}
}

// HandBack ends the lease (off, n) of a message that was leased but never sent (its
// client went while it was being leased), as if it had not been handed out: the attempt
// is not counted. Unlike Unlease it checks the nonce, because the lease may by then
// have lapsed and another consumer hold the message under a new one.
func (s *State) HandBack(off uint64, n Nonce, now int64) error {
	l, err := s.check(off, n, now)
	if err != nil {
		return err
	}
	s.dropLease(l)
	s.makeReady(off, l.attempt-1)
	return nil
}

func (s *State) dropLease(l *lease) {
	if l.index >= 0 {
		heap.Remove(&s.expiry, l.index)
	}
	delete(s.leases, l.offset)
}

func (s *State) makeReady(off uint64, attempt uint32) {
	if off < s.frontier || off < s.oldest {
		return
	}
	if _, done := s.ackedAhead[off]; done {
		return
	}
	s.attempts[off] = attempt
	heap.Push(&s.ready, off)
}

// Stats is a snapshot of the queue's counters.
type Stats struct {
	Oldest, End, Frontier uint64
	AckedAhead, InFlight  int
	Backlog               uint64
	Damaged               uint64 // offsets skipped as damaged since the partition opened
}

// Stats returns the queue's counters.
func (s *State) Stats() Stats {
	backlog := uint64(0)
	if s.end > s.frontier {
		// Only settled offsets below the end count: a state restored over a log that
		// came back shorter may hold some past it (the partition drops them on open).
		settled := uint64(0)
		for o := range s.ackedAhead {
			if o < s.end {
				settled++
			}
		}
		backlog = s.end - s.frontier - settled
	}
	return Stats{Oldest: s.oldest, End: s.end, Frontier: s.frontier, AckedAhead: len(s.ackedAhead), InFlight: len(s.leases), Backlog: backlog, Damaged: s.damaged}
}

// Frontier returns the ack frontier.
func (s *State) Frontier() uint64 { return s.frontier }

// AckedAhead returns the offsets settled past the frontier, in no order.
func (s *State) AckedAhead() []uint64 {
	out := make([]uint64, 0, len(s.ackedAhead))
	for o := range s.ackedAhead {
		out = append(out, o)
	}
	return out
}

// CheckInvariants verifies the partition invariant stated on State; tests call it after
// every step.
func (s *State) CheckInvariants() error {
	if s.cursor < s.frontier {
		return fmt.Errorf("cursor %d below frontier %d", s.cursor, s.frontier)
	}
	if _, ok := s.ackedAhead[s.frontier]; ok {
		return fmt.Errorf("frontier %d is in the acked-ahead set", s.frontier)
	}
	seen := make(map[uint64]string)
	mark := func(o uint64, what string) error {
		if prev, ok := seen[o]; ok {
			return fmt.Errorf("offset %d is both %s and %s", o, prev, what)
		}
		seen[o] = what
		return nil
	}
	for o := range s.ackedAhead {
		if o < s.frontier {
			return fmt.Errorf("acked-ahead offset %d below frontier %d", o, s.frontier)
		}
		if err := mark(o, "acked"); err != nil {
			return err
		}
	}
	for o, l := range s.leases {
		if o != l.offset || o < s.frontier || o >= s.cursor {
			return fmt.Errorf("lease %d outside [frontier %d, cursor %d)", o, s.frontier, s.cursor)
		}
		if err := mark(o, "leased"); err != nil {
			return err
		}
	}
	for _, o := range s.ready {
		if o < s.frontier || o >= s.cursor {
			return fmt.Errorf("ready %d outside [frontier %d, cursor %d)", o, s.frontier, s.cursor)
		}
		if err := mark(o, "ready"); err != nil {
			return err
		}
	}
	for o := s.frontier; o < s.cursor && o < s.end; o++ {
		if _, ok := seen[o]; !ok {
			return fmt.Errorf("offset %d below cursor %d is neither settled, leased nor ready", o, s.cursor)
		}
	}
	n := 0
	for _, l := range s.leases {
		if !l.settling {
			n++
		}
	}
	if n != len(s.expiry) {
		return fmt.Errorf("%d lapsable leases but %d in the expiry heap", n, len(s.expiry))
	}
	return nil
}

type expiryHeap []*lease

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *expiryHeap) Push(x any) {
	l := x.(*lease)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *expiryHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.index = -1
	*h = old[:len(old)-1]
	return l
}

type readyHeap []uint64

func (h readyHeap) Len() int           { return len(h) }
func (h readyHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h readyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *readyHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *readyHeap) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}
