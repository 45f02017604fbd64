package partition

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// ErrNotLeader means this replica of a replicated partition does not lead it: the
// request goes to the leader (or waits for one). Nothing was done.
var ErrNotLeader = errors.New("partition: this replica does not lead the partition")

// ErrOutcomeUnknown means a replicated write was proposed but its commit was not seen
// in time: it may or may not have been stored.
var ErrOutcomeUnknown = errors.New("partition: the write's outcome is unknown")

// Group is the consensus group one replicated partition belongs to (one Raft group per
// partition; the broker implements it over raftetcd). Every replica opens its
// partition with the same group; the group applies committed commands to each
// replica's partition through Apply, in log order.
type Group interface {
	// Propose replicates cmd and returns what this replica's Apply returned for it,
	// once it is committed and applied here. It fails with an error wrapping
	// ErrNotLeader when this replica does not lead. submitted, when not nil, is called
	// once cmd is in the leader's log, before it commits: commands proposed one after
	// another's submitted call follow it in the log.
	Propose(ctx context.Context, cmd []byte, submitted func()) (any, error)
	// Confirm returns nil once a quorum confirmed, after the call, that this replica
	// still leads.
	Confirm(ctx context.Context) error
}

// appendAger is a Group that knows when an entry reached this replica's log.
type appendAger interface {
	// AppendedAgo returns how long ago the entry at index reached this replica's
	// log; false when not known (then the entry counts as arriving now).
	AppendedAgo(index uint64) (time.Duration, bool)
}

// committer is a Group that can answer a proposal once it commits, before this
// replica applies it (raftetcd: a leader applies only what its own log holds durably).
type committer interface {
	// ProposeCommitted replicates cmd and returns once it is committed; an error
	// wrapping ErrNotLeader when this replica does not lead or stops leading first.
	ProposeCommitted(ctx context.Context, cmd []byte) error
}

// replicateTimeout bounds one replicated write: past it the caller gets
// ErrOutcomeUnknown (the write may still commit).
const replicateTimeout = 5 * time.Second

// Command kinds of a replicated partition (the first byte of a command).
const (
	cmdAppend byte = 'A' // u64 first offset | u32 n | n × (u16 attrs, i64 timestamp, key?, value)
	cmdSettle byte = 'S' // u64 delivered-to | settle record value
	cmdLeases byte = 'L' // u64 delivered-to | u32 n | n × (u64 offset, u32 epoch, u64 seq, u32 attempt, u32 ms left) | u64 term
	cmdFanout byte = 'F' // u64 attach id | u64 next offset: a fan-out child's copy cursor
	// cmdDelivered is a leader's deliveries, committed before the leases are served:
	// u64 delivered-to | u32 n | n × (u64 offset, u32 deliveries) for the messages
	// delivered more than once.
	cmdDelivered byte = 'D'
	// cmdMark replaces the delivered-to mark: u64 delivered-to. Under leader leases a
	// new leader commits it before anything of its own, cut back to its log's end, so
	// that a mark an earlier leader reserved ahead covers none of its appends.
	cmdMark byte = 'M'
)

// replica is the replication state of a partition opened with a Group.
type replica struct {
	group   Group
	leading atomic.Bool
	term    atomic.Uint64

	mu   sync.Mutex
	next uint64 // the offset the next proposed append starts at (0: the log's end)

	// vend is where the group's history puts the log's end after the last applied
	// entry (vendUnknown until a snapshot's state was taken, at open or from the
	// leader): an append command is the group's next one only when it starts there.
	// Apply tells by it a command applied before this start, whose records the log
	// may hold in part (written without sync), from a stale one (proposed at an
	// offset another command took), which it cannot tell by the log's end alone.
	vend atomic.Uint64
	// retainable is set once, with vend unknown, an append command reaching the log's
	// end was applied (again), or a snapshot's restore began (the entries before it are
	// never applied again): until then the log's last records may be the first ones of
	// a torn command, which Apply tells from a stale one only by reading them, so
	// retention leaves the log alone (EnforceRetention).
	retainable atomic.Bool
	// replaying is set, with vend unknown and before retainable, when an append
	// command applied ended before the log's end: the log may hold records of entries
	// not applied again yet (a restart replaying the group's log from its first
	// entry), so the log's end is not the group's end at the applied index, and no
	// snapshot is taken until an append command reaching the log's end was applied
	// (retainable; SnapshotState).
	replaying atomic.Bool

	deliveredTo atomic.Uint64 // the highest delivered-to mark applied (see Reset)
	failed      atomic.Bool   // an apply failed: this replica stopped applying
	// skipped is set once this replica skipped a damaged message in memory only
	// (skipDamaged): its queue counts that message settled though no consumer acked
	// it, so it takes no snapshot until it is rebuilt (see SnapshotState).
	skipped atomic.Bool

	marksMu sync.Mutex
	marks   []indexMark // the log's end after recent group entries, oldest first

	handingOver atomic.Bool // HandOver ran: this leader leases nothing more
	// handoverReads counts HandOver's reads of the live leases (under p.mu), and
	// handoverCommitted is the number of the last read whose L command committed: a
	// hand-back that saw fewer reads came before a handover the successor holds.
	handoverReads     atomic.Uint64
	handoverCommitted atomic.Uint64

	handMu     sync.Mutex
	handed     []queue.Grant // leases the last leader handed over, deadlines on this clock
	handedTerm uint64        // the term of the leader that handed them over

	fanMu  sync.Mutex
	fanout map[uint64]uint64 // fan-out child attach id → next parent offset to copy, as committed

	attMu    sync.Mutex
	attempts map[uint64]uint32 // committed deliveries of messages delivered more than once (D), unsettled

	reserving atomic.Bool // a D command reserving marks ahead is being committed (reserveAhead)
	// confirming counts the consumes between their grant and the end of their
	// confirmation (a D command may be on its way): HandOver waits for them.
	confirming atomic.Int32
	// noLeaseTerm is a term in which this leader could not put its mark command first
	// (commitMarkFirst): it serves no consume under its lease in that term.
	noLeaseTerm atomic.Uint64
}

// leaseHolder is a Group that can tell whether this replica leads under a leader lease
// now (raftetcd.Host.LeaseHeld): no other replica can be elected before it ends.
type leaseHolder interface {
	LeaseHeld() bool
}

// leaseValidator is a leaseHolder that can also be asked without the answer counting
// as a consume served under the lease.
type leaseValidator interface {
	LeaseValid() bool
}

// reserveMessages is how far past its cursor a leader under a lease commits its
// delivered-to mark, so that its consumes need no commit of their own: after a change
// of leader, a message below the mark that was never delivered counts one delivery.
const reserveMessages = 1024

// indexMark is the message log's end once the group entry at index was applied.
type indexMark struct{ index, end uint64 }

// maxMarks bounds the marks kept: a follower further behind shows its lag from the
// oldest mark kept (it is at least that far behind).
const maxMarks = 4096

func (r *replica) mark(index, end uint64) {
	r.marksMu.Lock()
	defer r.marksMu.Unlock()
	if n := len(r.marks); n > 0 && r.marks[n-1].end == end {
		return // the end is known from the first index that reached it
	}
	if len(r.marks) >= maxMarks {
		r.marks = append(r.marks[:0], r.marks[maxMarks/2:]...)
	}
	r.marks = append(r.marks, indexMark{index: index, end: end})
}

// ForgetIndexes drops what the replica knows of where the group's entries put its
// message log (OffsetAtIndex). A forced takeover's survivor applies the replaced
// group's log, at that group's indexes, before the new group starts counting from 1:
// left in place, those marks would read as the new group's (a follower's lag and
// caught-up check from them, wrong until they aged out).
func (p *Partition) ForgetIndexes() {
	if r := p.repl; r != nil {
		r.marksMu.Lock()
		r.marks = nil
		r.marksMu.Unlock()
	}
}

// OffsetAtIndex returns the message log's end once the group's entries up to index
// were applied: how far a follower whose log matches up to index holds the messages.
func (p *Partition) OffsetAtIndex(index uint64) uint64 {
	r := p.repl
	if r == nil {
		return 0
	}
	r.marksMu.Lock()
	defer r.marksMu.Unlock()
	i := sort.Search(len(r.marks), func(i int) bool { return r.marks[i].index > index })
	if i == 0 {
		return 0
	}
	return r.marks[i-1].end
}

// appliedAppend is Apply's answer to an append command.
type appliedAppend struct {
	ok  bool // false: the command named an offset that was not the log's end, nothing written
	err error
}

// appliedSettle is Apply's answer to a settle command.
type appliedSettle struct{ err error }

// Replicated reports whether the partition is one replica of a group.
func (p *Partition) Replicated() bool { return p.repl != nil }

// Leading reports whether this partition serves requests here: always for a partition
// of its own, and for a replica only while it leads its group.
func (p *Partition) Leading() bool { return p.repl == nil || p.repl.leading.Load() }

// Failed reports whether this replica stopped applying after a failed write: its
// state stopped there, so it must not lead, and its counters are no markers.
func (p *Partition) Failed() bool { return p.repl != nil && p.repl.failed.Load() }

// Term returns the group term this replica leads in (0 when it does not lead).
func (p *Partition) Term() uint64 {
	if p.repl == nil || !p.repl.leading.Load() {
		return 0
	}
	return p.repl.term.Load()
}

// SetRole is called by the group when this replica starts leading (lead, in term term;
// everything committed before is applied) or stops. A new leader starts a lease epoch
// of its own: leases were the old leader's memory, so every unsettled message is ready
// again at once, and messages the old leaders had delivered count as delivered.
//
// handedOver reports that this replica starts leading by its predecessor's handover
// (a planned change: the leases it committed are honoured), not by an election after a
// failure, which loses the leases.
func (p *Partition) SetRole(lead bool, term uint64) (handedOver bool) {
	r := p.repl
	if r == nil {
		return false
	}
	r.handMu.Lock()
	handed := r.handed
	if r.handedTerm != 0 && r.handedTerm+1 != term {
		// Handed over by a leader before the last one (an old L applied again at a
		// restart, or a transfer whose election took more than one term): those leases
		// may have been given out again since. Only the direct successor takes them
		// (an L of the version-1 form names no term and is taken as version 1 did).
		handed = nil
	}
	r.handed, r.handedTerm = nil, 0
	r.handMu.Unlock()
	handedOver = lead && handed != nil
	p.mu.Lock()
	if lead {
		now := p.opts.Clock()
		live := handed[:0]
		for _, g := range handed {
			if g.Deadline > now {
				live = append(live, g)
			}
		}
		// Never past its own log end: a replica that leads what it holds (a forced
		// takeover of a partition whose other replicas are gone) must count every
		// message written from its end on as never delivered, whatever mark an earlier
		// history reached. The mark itself is cut back, not only this use of it, or the
		// next change of leader would count those messages as delivered.
		if end := p.log.Next(); r.deliveredTo.Load() > end {
			r.deliveredTo.Store(end)
		}
		p.q.Reset(uint32(term), max(r.deliveredTo.Load(), p.q.Cursor()), live...)
		r.attMu.Lock()
		for o := range r.attempts {
			if p.q.IsSettled(o) {
				delete(r.attempts, o)
			}
		}
		p.q.RaiseAttempts(r.attempts)
		r.attMu.Unlock()
		r.term.Store(term)
		r.handingOver.Store(false)
		p.leadEnd.Store(p.log.Next()) // everything committed before is applied
	} else {
		// The leases die with the leadership; a later leader starts its own epoch.
		p.q.Reset(0, p.q.Cursor())
	}
	mark := r.deliveredTo.Load()
	p.mu.Unlock()
	r.mu.Lock()
	r.next = 0
	r.mu.Unlock()
	if lead && p.marksReserved() && !p.commitMarkFirst(mark) {
		// Not in the log (raft refused it: a transfer under way, or the leadership
		// lost again). It serves, but not under its lease in this term: a mark an
		// earlier leader reserved may count some of its appends as delivered once
		// more after a later failure, never fewer.
		r.noLeaseTerm.Store(term)
		p.opts.Logger.Warn("a new leader could not put its delivered-to mark first; it serves no consume under its lease this term", "partition", p.opts.Index, "term", term)
	}
	r.leading.Store(lead)
	p.notify()
	return handedOver
}

func (p *Partition) groupErr(err error) error {
	switch {
	case errors.Is(err, ErrOutcomeUnknown), errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed):
		// As they are: an unknown outcome must not become "not the leader", on which a
		// caller would send the write again.
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("%w: %w", ErrNotLeader, err)
}

// appendReplicated proposes recs at the offset after every append proposed before
// it. Apply writes a command only at the log's end, so one that names another offset
// (a proposal before it was lost with a change of leader) changes nothing and is
// proposed again at the right one.
func (p *Partition) appendReplicated(recs []segment.Record) (uint64, error) {
	r := p.repl
	ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
	defer cancel()
	// The leader stamps the records before proposing (a copy from another cluster keeps
	// its source's timestamp when it is not in the future), so every replica stores
	// the same ones.
	now := p.opts.WallClock()
	for i := range recs {
		if ts := recs[i].Timestamp; ts <= 0 || ts > now {
			recs[i].Timestamp = now
		}
	}
	for range 4 {
		if !r.leading.Load() {
			return 0, ErrNotLeader
		}
		// The offset is chosen and the command submitted under r.mu, so concurrent
		// appends reach the log in the order of their offsets; the commit is awaited
		// without it.
		r.mu.Lock()
		first := max(r.next, p.log.Next())
		r.next = first + uint64(len(recs))
		var once sync.Once
		release := func() { once.Do(r.mu.Unlock) }
		res, err := r.group.Propose(ctx, encodeAppendCmd(first, recs), release)
		release()
		if err != nil {
			r.mu.Lock()
			r.next = 0
			r.mu.Unlock()
			return 0, p.groupErr(err)
		}
		a, _ := res.(appliedAppend)
		if a.err != nil {
			// Committed, so the partition's other replicas apply it: only this one's
			// write failed, and it cannot tell whether the batch landed at first.
			return 0, committedUnapplied(a.err)
		}
		if a.ok {
			return first, nil
		}
		r.mu.Lock()
		r.next = 0
		r.mu.Unlock()
	}
	return 0, fmt.Errorf("%w: the partition's appends kept racing a change of leader", ErrNotLeader)
}

// settleReplicated settles leases once the settlement is committed on a quorum: the
// leases are pinned (BeginSettle) while the command replicates.
func (p *Partition) settleReplicated(reqs []SettleReq) []error {
	r := p.repl
	if !r.leading.Load() || p.handingOver() { // handing over: see beginSettles
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = ErrNotLeader
		}
		return errs
	}
	if slices.ContainsFunc(reqs, func(rq SettleReq) bool { return p.epochAbove(rq.Nonce) }) && p.confirmLeader() != nil {
		// Maybe a handle of a later leader: this one was deposed and has not heard
		// yet. Its "lease lost" would be a lie; the request goes to the leader. (One
		// confirmation serves the whole batch; see laterLeader.)
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = ErrNotLeader
		}
		return errs
	}
	errs, begun, delivered, expired := p.beginSettles(reqs)
	if expired {
		defer p.notify()
	}
	if len(begun) == 0 {
		return errs
	}
	ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
	defer cancel()
	res, err := r.group.Propose(ctx, encodeSettleCmd(delivered, begun), nil)
	if err == nil {
		if s, ok := res.(appliedSettle); ok && s.err != nil {
			err = committedUnapplied(s.err)
		}
	} else {
		err = p.groupErr(err)
	}
	if err != nil {
		// Not known to be settled: the leases go back (a settle the group commits later
		// still settles them then). Only the leases this settle pinned: the queue may
		// have started a new epoch meanwhile (the leadership lost and won back), whose
		// leases of the same offsets are others'. A settle refused as not-leader was
		// never proposed (raft dropped it: a leadership transfer began, or the leader
		// stepped down): nothing was done, and the lease is held again as it was, so
		// the ack sent again (to the successor, which holds it from a handover, or here
		// when the transfer was called off) settles it instead of meeting 410.
		refused := errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrOutcomeUnknown)
		p.mu.Lock()
		for i, r := range reqs {
			if errs[i] != nil {
				continue
			}
			if refused {
				p.q.UnpinSettle(r.Offset, r.Nonce)
			} else {
				p.q.AbortSettleOf(r.Offset, r.Nonce)
			}
		}
		p.armTimerLocked()
		p.mu.Unlock()
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	p.notify()
	return errs
}

// Apply applies a committed command of the partition's group, on every replica in the
// same order. An append is written only at the log's end, so a command applied again
// (a restart replays the group's log) or one that names a stale offset changes
// nothing. A settle of an offset already settled changes nothing.
func (p *Partition) Apply(index uint64, cmd []byte) any {
	r := p.repl
	if r == nil || len(cmd) == 0 {
		return nil
	}
	if r.failed.Load() {
		if cmd[0] == cmdAppend {
			return appliedAppend{err: errReplicaFailed}
		}
		return appliedSettle{err: errReplicaFailed}
	}
	switch cmd[0] {
	case cmdAppend:
		first, recs, err := decodeAppendCmd(cmd)
		if err != nil {
			return p.applyFailed(err)
		}
		end, n := p.log.Next(), uint64(len(recs))
		if r.vend.Load() == vendUnknown {
			if first+n >= end {
				// Set once this command is applied: a torn command ends past the log's end.
				defer r.retainable.Store(true)
			} else if !r.retainable.Load() {
				// Applied before this start (or stale): the log may hold records of
				// later entries, up to a torn command (see replaying).
				r.replaying.Store(true)
			}
		}
		if v := r.vend.Load(); v != vendUnknown {
			if first != v {
				// Stale: proposed at an offset another command took. It changes
				// nothing, and its proposer proposes it again at the right one.
				return appliedAppend{}
			}
			r.vend.Store(v + n)
			switch {
			case end >= first+n:
				// Applied before this start: its messages end where it put them.
				r.mark(index, first+n)
				return appliedAppend{}
			case end > first:
				// Applied before this start, and only part of it is in the log now: the
				// log is written without sync, and a power loss (or a kill in the middle
				// of a write of several pages) kept the first records of the command's
				// write and not the rest. The command is the group's, so the rest is
				// written now. Skipped, this replica held none of the group's later
				// messages again, and leading, it stored new ones at offsets where the
				// others held other messages (a review, 5 December). Told by the log's
				// end alone, a stale command was taken for a torn one, and its tail
				// written over the offsets of the next (a review of that fix).
				recs, first = recs[end-first:], end
			case end < first:
				// The log lost records before this command's (below the snapshot's
				// end, which was made durable): it cannot be written in place.
				return p.applyFailed(fmt.Errorf("%w: the group's next append starts at offset %d and this replica's log ends at %d", ErrCorrupt, first, end))
			}
		} else if first < end && end < first+n && p.holdsPrefix(first, end, recs) {
			// The group's history is not known here yet (no snapshot was taken or
			// restored since this start): a command the log holds only the first
			// records of, those records this command's own, is taken as applied before
			// this start and torn (above); a stale one holds other messages there.
			recs, first = recs[end-first:], end
		}
		if first != end {
			if first < end {
				// Applied before this start: its messages end where it put them, not
				// at the log's end now (a follower matching this entry holds that far).
				// Or stale, and then it wrote nothing: never past the log's end (a
				// follower matching it was reported holding what no replica held).
				r.mark(index, min(first+uint64(len(recs)), end))
			}
			return appliedAppend{}
		}
		if _, err := p.log.Append(recs); err != nil {
			return p.applyFailed(storageErr(err))
		}
		failpoint.Inject(failpoint.PartitionAfterAppend)
		r.mark(index, p.log.Next())
		p.mu.Lock()
		p.q.SetBounds(p.log.Oldest(), p.log.Next())
		p.mu.Unlock()
		p.notify()
		return appliedAppend{ok: true}
	case cmdLeases:
		// The leases' time left was read when the leader proposed the command: count it
		// from the moment the command reached this replica's log, which is one trip
		// after, not from now: a replica catching up (or one whose apply waits behind
		// its writes) applies it later, and counting from now extended the leases past
		// what their holders were told (the soak of 3 December: acks answered 204 up to
		// 0.87 s after their lease lapsed, with the Raft logs written asynchronously).
		now := p.opts.Clock()
		if a, ok := r.group.(appendAger); ok {
			if ago, ok := a.AppendedAgo(index); ok && ago > 0 {
				now -= int64(ago)
			}
		}
		d, term, handed, err := decodeLeasesCmd(cmd, now)
		if err != nil {
			return p.applyFailed(err)
		}
		// A handover's mark is exact (its leader leases nothing more): it replaces a
		// mark reserved ahead under a leader lease, so the successor counts as
		// delivered only what was.
		r.deliveredTo.Store(d)
		r.handMu.Lock()
		if len(handed) == 0 && term != 0 && term == r.handedTerm {
			// The same leader calling its handover off (ResumeAfterHandOver): nothing
			// is handed, and a successor counts as elected.
			r.handed, r.handedTerm = nil, 0
		} else {
			r.handed, r.handedTerm = handed, term
		}
		r.handMu.Unlock()
		return appliedSettle{}
	case cmdDelivered:
		d, att, err := decodeDeliveredCmd(cmd)
		if err != nil {
			return p.applyFailed(err)
		}
		if d > r.deliveredTo.Load() {
			r.deliveredTo.Store(d)
		}
		if len(att) > 0 {
			oldest := p.log.Oldest() // a count of a message aged out here is never needed
			r.attMu.Lock()
			if r.attempts == nil {
				r.attempts = map[uint64]uint32{}
			}
			for o, a := range att {
				if o >= oldest {
					r.attempts[o] = max(r.attempts[o], a)
				}
			}
			r.attMu.Unlock()
		}
		return appliedSettle{}
	case cmdMark:
		if len(cmd) != 9 {
			return p.applyFailed(fmt.Errorf("%w: mark command of %d bytes", ErrCorrupt, len(cmd)))
		}
		r.deliveredTo.Store(binary.BigEndian.Uint64(cmd[1:]))
		return appliedSettle{}
	case cmdFanout:
		if len(cmd) != 17 {
			return p.applyFailed(fmt.Errorf("%w: fan-out cursor command of %d bytes", ErrCorrupt, len(cmd)))
		}
		r.setFanout(binary.BigEndian.Uint64(cmd[1:]), binary.BigEndian.Uint64(cmd[9:]))
		return appliedSettle{}
	case cmdSettle:
		if len(cmd) < 9 {
			return p.applyFailed(fmt.Errorf("%w: short settle command", ErrCorrupt))
		}
		if d := binary.BigEndian.Uint64(cmd[1:9]); d > r.deliveredTo.Load() {
			r.deliveredTo.Store(d)
		}
		offs, err := decodeSettle(cmd[9:])
		if err != nil {
			return p.applyFailed(err)
		}
		return appliedSettle{err: p.applySettle(offs)}
	}
	return p.applyFailed(fmt.Errorf("%w: unknown command %q (from a newer version?)", ErrCorrupt, cmd[0]))
}

// applyFailed stops this replica from applying: the entries after a failed one must
// not be applied over a gap. A restart replays the group's log from the start.
// errReplicaFailed answers what reaches a replica that stopped applying.
var errReplicaFailed = fmt.Errorf("%w: this replica stopped applying after a failed write; restart the node", ErrStorage)

// committedUnapplied is the answer to a command the group committed but this replica
// could not apply (its write failed, or it stopped applying before): the other
// replicas apply it, so it is not "not done"; this one cannot say what it did.
func committedUnapplied(err error) error {
	return fmt.Errorf("%w: it was committed by the partition's replicas but this node could not apply it (%v); the other replicas do", ErrOutcomeUnknown, err)
}

func (p *Partition) applyFailed(err error) any {
	if !p.repl.failed.Swap(true) {
		p.opts.Logger.Error("a replicated command could not be applied; this replica stops applying until it is opened again", "partition", p.opts.Index, "err", err)
		if p.opts.OnFailed != nil {
			p.opts.OnFailed()
		}
	}
	return appliedAppend{err: err}
}

// applySettle makes a committed settlement durable in this replica's journal (under
// the gate, as Settle does) and settles the offsets: a lease pinned by the settle
// that proposed it, or any other, ends.
func (p *Partition) applySettle(offs []uint64) error {
	p.gate.RLock()
	defer p.gate.RUnlock()
	p.mu.Lock()
	end := p.log.Next()
	todo := offs[:0:0]
	for _, o := range offs {
		switch {
		case o >= end:
		case !p.q.IsSettled(o):
			todo = append(todo, o)
		default:
			// Settled already: aged out while its ack was being committed (retention
			// raised the frontier past it, and left the lease the ack pinned). The
			// lease ends here all the same: left, it held an in-flight slot until the
			// next change of leader, and enough of them stopped all delivery.
			p.q.CommitSettle(o)
		}
	}
	p.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if _, err := p.journal.Append([]segment.Record{{Value: encodeSettle(todo), Timestamp: p.opts.WallClock()}}); err != nil {
		p.applyFailed(storageErr(err))
		return storageErr(err)
	}
	failpoint.Inject(failpoint.PartitionAfterSettle)
	if r := p.repl; r != nil {
		r.attMu.Lock()
		for _, o := range todo {
			delete(r.attempts, o)
		}
		r.attMu.Unlock()
	}
	p.mu.Lock()
	for _, o := range todo {
		p.q.CommitSettle(o)
	}
	p.sinceCkpt++
	wantCkpt := p.sinceCkpt >= p.opts.CheckpointEvery && !p.ckptRunning
	if wantCkpt {
		p.ckptRunning = true
	}
	p.armTimerLocked()
	p.mu.Unlock()
	if wantCkpt {
		go func() {
			if err := p.Checkpoint(); err != nil && !errors.Is(err, ErrClosed) {
				p.opts.Logger.Error("queue checkpoint failed", "partition", p.opts.Index, "err", err)
			}
		}()
	}
	p.notify()
	return nil
}

// laterLeader reports whether a receipt handle may have been issued by a leader of a
// later term than the one this replica leads in: then this replica was deposed without
// knowing it, and must send the request on instead of answering for a lease it never
// had. An epoch above this leader's term is not proof of that: a handle of the
// partition's earlier life (its lone copy before its replication factor was raised, or
// a group a forced takeover replaced, whose terms started again) carries one too. So a
// quorum is asked: if this replica still leads, no later leader exists, the handle's
// lease is gone with that earlier life, and the queue answers ErrLeaseLost (410).
func (p *Partition) laterLeader(n queue.Nonce) bool {
	return p.epochAbove(n) && p.confirmLeader() != nil
}

// epochAbove reports whether a handle's epoch is above the term this replica leads in.
func (p *Partition) epochAbove(n queue.Nonce) bool {
	return p.repl != nil && uint64(n.Epoch) > p.repl.term.Load()
}

// confirmLeader returns nil once a quorum confirmed this replica still leads, or an
// error wrapping ErrNotLeader (or ErrOutcomeUnknown past the timeout).
func (p *Partition) confirmLeader() error {
	ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
	defer cancel()
	if err := p.repl.group.Confirm(ctx); err != nil {
		return p.groupErr(err)
	}
	return nil
}

// confirmHandBack answers a hand-back (a nack, or HandBack) that took effect here,
// while this replica led and was not handing over, after handover reads of the live
// leases: it confirms the leadership as every answer of a replicated partition does.
//
// When that fails as not-leader, the hand-back is not to be sent on: the successor
// does not hold the lease (the handover read the leases after the hand-back, or an
// election lost them), and answered 410 to a nack that took effect (a chaos run in
// namespaces, seed 2974028836: a stall's handover began while a nack waited for its
// confirmation). If a handover's L command read after the hand-back committed, that
// commit in this leader's term proves it led after the hand-back, and the successor
// holds the leases without this one: the hand-back stands. Otherwise its outcome is
// unknown: a leader deposed before it, unaware, handed back a lease of its own only.
func (p *Partition) confirmHandBack(reads uint64) error {
	err := p.confirmLeader()
	if err == nil || !errors.Is(err, ErrNotLeader) {
		return err
	}
	if p.repl.handoverCommitted.Load() > reads {
		return nil
	}
	return fmt.Errorf("%w: the lease was handed back on a leader that could not confirm it still led (%v)", ErrOutcomeUnknown, err)
}

// confirmLeases checks, after leases were granted, that this replica still leads: a
// leader paused past its election timeout and resumed must not hand out messages its
// successor hands out too.
//
// Where every replica reads it, the confirmation is the commit of a D command naming
// the deliveries (delivered-to, and the count of each message delivered more than
// once): a commit in this leader's term proves it led after the grant as a read index
// does, and a later leader counts delivery_attempt on from it instead of from 1.
//
// Under a leader lease (raftetcd's: no other replica can be elected before it ends),
// first deliveries below the committed mark need neither: the lease proves this
// replica leads, and the mark, committed ahead of the cursor (reserveAhead), already
// counts them as delivered for a later leader. A redelivery still commits its count.
func (p *Partition) confirmLeases(grants []queue.Grant) error {
	newCmds := p.opts.NewCommands == nil || p.opts.NewCommands()
	leases := newCmds && p.leasesAllowed()
	if leases && p.leaseServes(grants) {
		p.reserveAhead()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
	defer cancel()
	var err error
	if newCmds {
		p.mu.Lock()
		delivered := p.q.Cursor()
		p.mu.Unlock()
		if leases {
			delivered += reserveMessages
		}
		_, err = p.repl.group.Propose(ctx, encodeDeliveredCmd(delivered, grants), nil)
	} else {
		err = p.repl.group.Confirm(ctx)
	}
	if err != nil {
		p.unleaseGrants(grants)
		return p.groupErr(err)
	}
	return nil
}

// ConfirmLeading returns nil when this replica may answer now as its partition's
// leader for what it holds in memory (its counters): it leads under a leader lease,
// or a read index round confirmed it still leads. Otherwise an error wrapping
// ErrNotLeader: a leader paused past its election timeout (a SIGSTOP, a starved
// process) still believes it leads when it resumes, and its counters are its old
// term's, behind what its successor already answered. Read the counters first, then
// confirm: a confirmation proves they were current when read. A partition that is not
// replicated leads for ever.
func (p *Partition) ConfirmLeading(ctx context.Context) error {
	if p.repl == nil {
		return nil
	}
	if !p.repl.leading.Load() {
		return ErrNotLeader
	}
	if p.leasesAllowed() {
		if lv, ok := p.repl.group.(leaseValidator); ok && lv.LeaseValid() {
			return nil
		}
	}
	if err := p.repl.group.Confirm(ctx); err != nil {
		if errors.Is(err, ErrNotLeader) {
			return err
		}
		return fmt.Errorf("%w: it could not confirm that it still leads: %w", ErrNotLeader, err)
	}
	return nil
}

// leasesAllowed: the group can hold leader leases and every replica holds its vote
// for one.
func (p *Partition) leasesAllowed() bool {
	return !p.opts.NoLeaderLease && p.repl.noLeaseTerm.Load() != p.repl.term.Load() && p.marksReserved()
}

// marksReserved: the group's leaders may reserve delivered-to marks ahead (some
// replica may serve under a lease), so a new leader cuts the mark back (cmdMark).
func (p *Partition) marksReserved() bool {
	if _, ok := p.repl.group.(leaseHolder); !ok {
		return false
	}
	return (p.opts.NewCommands == nil || p.opts.NewCommands()) && (p.opts.LeaderLeases == nil || p.opts.LeaderLeases())
}

// commitMarkFirst puts a command replacing the delivered-to mark with d into the
// group's log before anything else this new leader proposes (it returns once the
// command is in the log; its commit is not awaited), and reports whether it did.
func (p *Partition) commitMarkFirst(d uint64) bool {
	cmd := make([]byte, 0, 9)
	cmd = append(cmd, cmdMark)
	cmd = binary.BigEndian.AppendUint64(cmd, d)
	in := make(chan struct{})
	failed := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
		defer cancel()
		if _, err := p.repl.group.Propose(ctx, cmd, func() { close(in) }); err != nil {
			close(failed)
		}
	}()
	select {
	case <-in:
		return true
	case <-failed:
		select {
		case <-in: // in the log, then the wait for its commit failed
			return true
		default:
			return false
		}
	case <-time.After(replicateTimeout):
		return false
	}
}

// leaseServes reports whether grants may be served under this replica's leader lease
// without a commit: every one a first delivery below the committed delivered-to mark,
// and the lease held now, after the grant.
func (p *Partition) leaseServes(grants []queue.Grant) bool {
	lh, ok := p.repl.group.(leaseHolder)
	if !ok {
		return false
	}
	mark := p.repl.deliveredTo.Load()
	for _, g := range grants {
		if g.Attempt > 1 || g.Offset >= mark {
			return false
		}
	}
	return lh.LeaseHeld()
}

// reserveAhead commits the delivered-to mark reserveMessages past the cursor, in the
// background, once the cursor has used half of the last reservation, so that the
// consumes under the lease rarely meet its end.
func (p *Partition) reserveAhead() {
	r := p.repl
	p.mu.Lock()
	cur := p.q.Cursor()
	p.mu.Unlock()
	if cur+reserveMessages/2 < r.deliveredTo.Load() || !r.reserving.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.reserving.Store(false)
		if p.handingOver() {
			return // the handover's exact mark must come last
		}
		ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
		defer cancel()
		// A failure leaves the mark where it was: the consumes past it commit their own.
		_, _ = r.group.Propose(ctx, encodeDeliveredCmd(cur+reserveMessages, nil), nil)
	}()
}

func encodeDeliveredCmd(deliveredTo uint64, grants []queue.Grant) []byte {
	b := make([]byte, 0, 13+12*len(grants))
	b = append(b, cmdDelivered)
	b = binary.BigEndian.AppendUint64(b, deliveredTo)
	n := 0
	for _, g := range grants {
		if g.Attempt > 1 {
			n++
		}
	}
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	for _, g := range grants {
		if g.Attempt > 1 {
			b = binary.BigEndian.AppendUint64(b, g.Offset)
			b = binary.BigEndian.AppendUint32(b, g.Attempt)
		}
	}
	return b
}

func decodeDeliveredCmd(b []byte) (uint64, map[uint64]uint32, error) {
	if len(b) < 13 {
		return 0, nil, errBadCommand
	}
	d := binary.BigEndian.Uint64(b[1:9])
	n := binary.BigEndian.Uint32(b[9:13])
	b = b[13:]
	if uint64(len(b)) != 12*uint64(n) {
		return 0, nil, errBadCommand
	}
	var att map[uint64]uint32
	if n > 0 {
		att = make(map[uint64]uint32, n)
	}
	for i := range int(n) {
		att[binary.BigEndian.Uint64(b[12*i:])] = binary.BigEndian.Uint32(b[12*i+8:])
	}
	return d, att, nil
}

func encodeAppendCmd(first uint64, recs []segment.Record) []byte {
	n := 1 + 8 + 4
	for _, r := range recs {
		n += 2*binary.MaxVarintLen64 + 2 + 8 + len(r.Key) + len(r.Value) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, cmdAppend)
	b = binary.BigEndian.AppendUint64(b, first)
	b = binary.BigEndian.AppendUint32(b, uint32(len(recs)))
	for _, r := range recs {
		b = binary.BigEndian.AppendUint16(b, r.Attrs)
		b = binary.BigEndian.AppendUint64(b, uint64(r.Timestamp))
		if r.Key == nil {
			b = append(b, 0)
		} else {
			b = append(b, 1)
			b = binary.AppendUvarint(b, uint64(len(r.Key)))
			b = append(b, r.Key...)
		}
		b = binary.AppendUvarint(b, uint64(len(r.Value)))
		b = append(b, r.Value...)
	}
	return b
}

var errBadCommand = fmt.Errorf("%w: malformed replicated command", ErrCorrupt)

// holdsPrefix reports whether the log holds, from offset first to end, the first
// records of recs (key, value and attributes; the stored timestamp never older).
func (p *Partition) holdsPrefix(first, end uint64, recs []segment.Record) bool {
	got, err := p.log.Read(first, int(end-first), 64<<20)
	if err != nil || uint64(len(got)) != end-first {
		return false
	}
	for i, g := range got {
		w := recs[i]
		if g.Offset != first+uint64(i) || g.Attrs != w.Attrs || g.Timestamp < w.Timestamp || !bytes.Equal(g.Value, w.Value) ||
			(g.Key == nil) != (w.Key == nil) || !bytes.Equal(g.Key, w.Key) {
			return false
		}
	}
	return true
}

// vendUnknown marks a replica's vend before it is known.
const vendUnknown = math.MaxUint64

func decodeAppendCmd(b []byte) (uint64, []segment.Record, error) {
	if len(b) < 13 {
		return 0, nil, errBadCommand
	}
	first := binary.BigEndian.Uint64(b[1:9])
	n := binary.BigEndian.Uint32(b[9:13])
	b = b[13:]
	if uint64(n) > uint64(len(b)) {
		return 0, nil, errBadCommand
	}
	recs := make([]segment.Record, n)
	bytesOf := func() ([]byte, bool) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, false
		}
		v := b[k : k+int(l) : k+int(l)]
		b = b[k+int(l):]
		return v, true
	}
	for i := range recs {
		if len(b) < 11 {
			return 0, nil, errBadCommand
		}
		recs[i].Attrs = binary.BigEndian.Uint16(b)
		recs[i].Timestamp = int64(binary.BigEndian.Uint64(b[2:]))
		hasKey := b[10]
		b = b[11:]
		if hasKey == 1 {
			k, ok := bytesOf()
			if !ok {
				return 0, nil, errBadCommand
			}
			recs[i].Key = k
		}
		v, ok := bytesOf()
		if !ok {
			return 0, nil, errBadCommand
		}
		recs[i].Value = v
	}
	if len(b) != 0 {
		return 0, nil, errBadCommand
	}
	return first, recs, nil
}

func encodeSettleCmd(deliveredTo uint64, offs []uint64) []byte {
	b := make([]byte, 0, 9+len(offs)*2)
	b = append(b, cmdSettle)
	b = binary.BigEndian.AppendUint64(b, deliveredTo)
	return append(b, encodeSettle(offs)...)
}

// HandOver prepares a planned change of leader (a node stopping, a leadership
// transfer): this leader leases nothing more, and commits its live leases (handle
// nonces, attempts, time left) so the next leader honours them and the change
// redelivers nothing. Call it, then transfer the leadership.
func (p *Partition) HandOver(ctx context.Context) error {
	r := p.repl
	if r == nil || !r.leading.Load() {
		return nil
	}
	// Set under p.mu, where leases are given and renewed and checked for it again: no
	// lease is given or renewed after the read below.
	p.mu.Lock()
	r.handingOver.Store(true)
	read := r.handoverReads.Add(1)
	now := p.opts.Clock()
	leases := p.q.Live(now)
	delivered := p.q.Cursor()
	p.mu.Unlock()
	var term uint64 // 0: the version-1 form, which a version-1 replica can read
	if p.opts.NewCommands == nil || p.opts.NewCommands() {
		term = r.term.Load()
	}
	// A reservation or a consume's D command being proposed goes into the log before
	// this command, whose exact mark replaces it (neither starts once handingOver is
	// set).
	for r.reserving.Load() || r.confirming.Load() > 0 {
		if ctx.Err() != nil {
			return p.groupErr(ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
	// The leases' time left is read now, not when they were read above: the wait may
	// have been long (seconds on a stalling disk, whose leader hands over for that
	// reason), and each replica counts the time left from the moment the command
	// reaches it. Counted from the read above, the cluster chaos run of 5 December
	// (slowdisk steps, seed 5801) answered 18 acks 204 up to 3.8 s after their lease
	// had lapsed. No lease was given or renewed since (handingOver), so only the time
	// left moves; a lease that lapsed meanwhile goes with none and is not honoured.
	//
	// It returns once the command is committed, not applied here: the successor must
	// hold it (a transfer goes only to a replica whose log holds everything the
	// leader's does), and applies it before it leads, as everything committed in
	// earlier terms. A leader whose disk stalls, which hands over for that reason,
	// would apply it only after its own slow syncs (seconds), while its followers
	// commit it at once.
	if err := p.proposeCommitted(ctx, encodeLeasesCmd(delivered, leases, p.opts.Clock(), term)); err != nil {
		return p.groupErr(err)
	}
	for {
		c := r.handoverCommitted.Load()
		if c >= read || r.handoverCommitted.CompareAndSwap(c, read) {
			return nil
		}
	}
}

// proposeCommitted replicates cmd and returns once it is committed, applied here or
// not yet (committer), or applied where the group cannot tell.
func (p *Partition) proposeCommitted(ctx context.Context, cmd []byte) error {
	if c, ok := p.repl.group.(committer); ok {
		return c.ProposeCommitted(ctx, cmd)
	}
	_, err := p.repl.group.Propose(ctx, cmd, nil)
	return err
}

// ResumeAfterHandOver lets a leader whose handover did not happen (its leadership did
// not move: the chosen replica could not take it) lease again, instead of serving
// nothing until an election. The leases it committed for the handover stay its own.
//
// It first commits an L command that hands over nothing, in its term: every replica
// then forgets the leases of the handover called off. Without it, a replica elected
// in the next term after a crash of this leader (or by a late MsgTimeoutNow of the
// abandoned transfer) took those leases as handed to it, although this leader had
// served on meanwhile: a message nacked here was held under the nacked handle there,
// a renewal answered 204 here was cut short there and the message leased to another
// consumer, and delivery_attempt went back to the count of the handover. Until the
// command commits it leases nothing; on an error it stays so (the caller tries
// again while it leads).
func (p *Partition) ResumeAfterHandOver(ctx context.Context) error {
	r := p.repl
	if r == nil || !r.leading.Load() || !r.handingOver.Load() {
		return nil
	}
	var term uint64 // the version-1 form: the empty list replaces the handed leases all the same
	if p.opts.NewCommands == nil || p.opts.NewCommands() {
		term = r.term.Load()
	}
	p.mu.Lock()
	delivered := max(r.deliveredTo.Load(), p.q.Cursor())
	p.mu.Unlock()
	// Committed is enough: a successor holds it and applies it before it leads.
	if err := p.proposeCommitted(ctx, encodeLeasesCmd(delivered, nil, p.opts.Clock(), term)); err != nil {
		return p.groupErr(err)
	}
	r.handingOver.Store(false)
	p.notify()
	return nil
}

// handingOver reports whether this replica is handing its leadership over.
func (p *Partition) handingOver() bool { return p.repl != nil && p.repl.handingOver.Load() }

func encodeLeasesCmd(deliveredTo uint64, gs []queue.Grant, now int64, term uint64) []byte {
	b := make([]byte, 0, 13+len(gs)*28+8)
	b = append(b, cmdLeases)
	b = binary.BigEndian.AppendUint64(b, deliveredTo)
	b = binary.BigEndian.AppendUint32(b, uint32(len(gs)))
	for _, g := range gs {
		left := max(0, (g.Deadline-now)/int64(time.Millisecond))
		b = binary.BigEndian.AppendUint64(b, g.Offset)
		b = binary.BigEndian.AppendUint32(b, g.Nonce.Epoch)
		b = binary.BigEndian.AppendUint64(b, g.Nonce.Seq)
		b = binary.BigEndian.AppendUint32(b, g.Attempt)
		b = binary.BigEndian.AppendUint32(b, uint32(min(left, 1<<32-1)))
	}
	if term == 0 {
		return b
	}
	return binary.BigEndian.AppendUint64(b, term)
}

// decodeLeasesCmd returns the delivered-to mark, the handing leader's term (0 in the
// version-1 form, which names none: its leases are taken by whoever leads next, as
// version 1 did) and the handed-over leases
// with deadlines on this replica's
// clock, counted from now (the command's apply here, a moment after the old leader
// proposed it: the lease lasts that moment longer, never shorter).
func decodeLeasesCmd(b []byte, now int64) (uint64, uint64, []queue.Grant, error) {
	if len(b) < 13 {
		return 0, 0, nil, errBadCommand
	}
	d := binary.BigEndian.Uint64(b[1:9])
	n := binary.BigEndian.Uint32(b[9:13])
	b = b[13:]
	var term uint64
	switch uint64(len(b)) {
	case uint64(n) * 28:
	case uint64(n)*28 + 8:
		term = binary.BigEndian.Uint64(b[n*28:])
	default:
		return 0, 0, nil, errBadCommand
	}
	gs := make([]queue.Grant, n)
	for i := range gs {
		e := b[i*28:]
		gs[i] = queue.Grant{
			Offset:   binary.BigEndian.Uint64(e),
			Nonce:    queue.Nonce{Epoch: binary.BigEndian.Uint32(e[8:]), Seq: binary.BigEndian.Uint64(e[12:])},
			Attempt:  binary.BigEndian.Uint32(e[20:]),
			Deadline: now + int64(binary.BigEndian.Uint32(e[24:]))*int64(time.Millisecond),
		}
	}
	return d, term, gs, nil
}

func (r *replica) setFanout(attachID, next uint64) {
	r.fanMu.Lock()
	defer r.fanMu.Unlock()
	if r.fanout == nil {
		r.fanout = map[uint64]uint64{}
	}
	if next > r.fanout[attachID] {
		r.fanout[attachID] = next
	}
}

// FanoutCursor returns the next parent offset a fan-out child (by attach id) must be
// copied from, as committed in this replica's group (0: none committed, or not a
// replica). A new leader resumes the copy there instead of from its own cursor file,
// which it last wrote when it last led, if ever.
func (p *Partition) FanoutCursor(attachID uint64) uint64 {
	r := p.repl
	if r == nil {
		return 0
	}
	r.fanMu.Lock()
	defer r.fanMu.Unlock()
	return r.fanout[attachID]
}

// CommitFanoutCursor commits, through the group, that a fan-out child (by attach id)
// holds every message of this partition below next. Only the leader commits.
func (p *Partition) CommitFanoutCursor(ctx context.Context, attachID, next uint64) error {
	r := p.repl
	if r == nil {
		return nil
	}
	if !r.leading.Load() {
		return ErrNotLeader
	}
	cmd := make([]byte, 0, 17)
	cmd = append(cmd, cmdFanout)
	cmd = binary.BigEndian.AppendUint64(cmd, attachID)
	cmd = binary.BigEndian.AppendUint64(cmd, next)
	_, err := r.group.Propose(ctx, cmd, nil)
	if err != nil {
		return p.groupErr(err)
	}
	return nil
}

// fanoutCursors returns a copy of the committed fan-out cursors, sorted by attach id.
func (r *replica) fanoutCursors() [][2]uint64 {
	r.fanMu.Lock()
	defer r.fanMu.Unlock()
	return sortedPairs(r.fanout)
}

// committedAttempts returns the committed delivery counts, sorted by offset.
func (r *replica) committedAttempts() [][2]uint64 {
	r.attMu.Lock()
	defer r.attMu.Unlock()
	return sortedPairs(r.attempts)
}

// sortedPairs returns m's entries as (key, value) pairs sorted by key, as snapshots
// write them.
func sortedPairs[V uint32 | uint64](m map[uint64]V) [][2]uint64 {
	out := make([][2]uint64, 0, len(m))
	for k, v := range m {
		out = append(out, [2]uint64{k, uint64(v)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// raceHook, when testHooks.race is set, runs between a lease's (or renewal's) first
// check for a handover and its taking of p.mu: tests start a handover there. It also
// runs as a close begins ("close"), and in a checkpoint once it copied the state
// ("checkpoint").
func raceHook(op string) {
	if h := testHooks.race; h != nil {
		h(op)
	}
}

// testHooks are set by tests only.
var testHooks struct {
	race func(op string)
}
