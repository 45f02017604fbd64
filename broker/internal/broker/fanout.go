package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// ErrChildNotFound means the topic is not a child of that parent.
var ErrChildNotFound = errors.New("child not found")

// copyBatch is the most parent messages one copy round moves per parent partition.
const copyBatch = 1000

// notReadyRetry is how often a copier looks again whether its node is ready.
const notReadyRetry = 250 * time.Millisecond

// copier copies every message committed to a parent, from the attach point on, into
// one child: in batches (one durable append per child partition per batch), advancing
// its durable per-partition cursor only after the copy is durable in the child. A crash
// between the two re-copies at most the last batch: duplicates are possible, loss is not.
// A batch whose appends failed in some child partitions only is retried in those only:
// sent remembers how far each child partition has the batch, so a child partition that
// stays failed does not make the healthy ones take the batch again on every retry.
// A delay child's copies are made no earlier than the parent's commit time plus the
// delay, so they are never consumable early.
type copier struct {
	b        *Broker
	parent   *topic
	child    *topic
	attachID uint64
	delayMs  int64
	dir      string // where the cursors live: inside the child's topic directory

	cursors []atomic.Uint64
	// sent[pp][cp] is the parent offset below which every record of parent partition pp
	// that maps to child partition cp is in cp, for the batch after cursors[pp] (it is
	// reset when the cursor moves). Only the run goroutine touches it. It lives in
	// memory: a restart re-copies the batch, as a crash would.
	sent   []map[int]uint64
	paused string        // why the copy is paused ("": it runs); only run touches it
	kick   chan struct{} // a metadata change (a grant, a user) to look at now
	rounds atomic.Uint64 // rounds run, for tests that must know a round happened
	stop   chan struct{}
	done   chan struct{}

	// A replicated parent partition's cursor is also committed in its group (one
	// proposal in flight per partition), so the next leader resumes the copy there.
	committing []atomic.Bool
	// led holds, per parent partition, the replica this node led at the last round
	// (nil: none; only run touches it): one it starts leading, or a replica that
	// replaced it (a group made anew), takes the group's cursor (round).
	led []*partition.Partition
	// waits holds, per parent partition of a delay child, the first message not yet
	// due: where its read started and when it is due (only run touches it). A round
	// wakes on every append of the parent, and the first waiting message of a
	// partition holds back every message after it (copies keep the parent's order), so
	// the partition is not read again until that message is due or the read start moves.
	waits       []delayWait
	reads       atomic.Uint64   // parent reads, for tests of what a round costs
	sleepsUntil atomic.Int64    // wall ms its timer is set for while it sleeps on one, else 0 (tests)
	ctx         context.Context // ends with close: proposals in flight stop
	cancel      context.CancelFunc
	wg          sync.WaitGroup
}

// delayWait is a parent partition's first message not yet due, read from offset from.
type delayWait struct {
	from uint64
	due  int64 // wall ms; 0: none known
}

type copierKey struct {
	child    string
	childInc uint64
	attachID uint64
}

func (b *Broker) startCopier(parent, child *topic, m meta.Topic) (*copier, error) {
	c := &copier{
		b: b, parent: parent, child: child, attachID: m.AttachID, delayMs: m.FanoutDelayMs,
		dir:     filepath.Join(child.dir, "fanout"),
		cursors: make([]atomic.Uint64, len(parent.parts())),
		sent:    make([]map[int]uint64, len(parent.parts())),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}), done: make(chan struct{}),
		committing: make([]atomic.Bool, len(parent.parts())),
		led:        make([]*partition.Partition, len(parent.parts())),
		waits:      make([]delayWait, len(parent.parts())),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	// Durable before the first cursor is written, and private like every data directory.
	if err := vfs.MkdirAllSync(vfs.OS{}, c.dir, 0o700); err != nil {
		return nil, err
	}
	c.removeStaleCursors()
	for i := range c.cursors {
		start := uint64(0)
		if i < len(m.FanoutStart) {
			start = m.FanoutStart[i]
		}
		cur, err := c.loadCursor(i)
		if err != nil {
			return nil, err
		}
		c.cursors[i].Store(max(start, cur))
	}
	go c.run()
	return c, nil
}

func (c *copier) close() {
	close(c.stop)
	<-c.done
	c.cancel()
	c.wg.Wait()
	c.b.metrics.FanoutPaused.DeleteLabelValues(c.child.name)
}

// poke makes the copier look at the metadata again (a grant may have changed).
func (c *copier) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// fanoutDenied says why a child must not receive its parent's messages now ("" when it
// may). Attaching needs consume on the parent; a child's owner reads what is copied, so
// with security on (the child has an owner) the copy runs only while its owner may
// still consume the parent: revoking that grant, or deleting the user, pauses it.
func (b *Broker) fanoutDenied(child meta.Topic, parent string) string {
	if child.OwnerID == 0 {
		return "" // created with security off
	}
	u, ok := b.meta.UserByID(child.OwnerID)
	if !ok {
		return "the child's owner no longer exists; detach the child, or recreate it under a user that may consume " + parent
	}
	if !u.Can(auth.Consume, parent) {
		return "the child's owner " + u.Name + " holds no consume grant on " + parent + ", which the copy needs; grant it to resume the copy, or detach the child"
	}
	return ""
}

// setPaused records whether the copy is paused, and on a change says so in the log and
// the narad_fanout_paused gauge.
func (c *copier) setPaused(why string) {
	if why == c.paused {
		return
	}
	if why != "" {
		c.b.log.Warn("fan-out paused: the child's owner may no longer read the parent", "parent", c.parent.name, "child", c.child.name, "reason", why)
		c.b.metrics.FanoutPaused.WithLabelValues(c.child.name).Set(1)
	} else {
		c.b.log.Info("fan-out resumed", "parent", c.parent.name, "child", c.child.name)
		c.b.metrics.FanoutPaused.WithLabelValues(c.child.name).Set(0)
	}
	c.paused = why
}

func (c *copier) cursorPath(pp int) string {
	return filepath.Join(c.dir, strconv.FormatUint(c.attachID, 10)+"-"+strconv.Itoa(pp)+".cursor")
}

// removeStaleCursors deletes cursors of earlier attachments: a re-attach starts fresh.
func (c *copier) removeStaleCursors() {
	entries, _ := os.ReadDir(c.dir)
	prefix := strconv.FormatUint(c.attachID, 10) + "-"
	for _, e := range entries {
		if len(e.Name()) < len(prefix) || e.Name()[:len(prefix)] != prefix {
			_ = os.Remove(filepath.Join(c.dir, e.Name())) // a stale cursor file of an earlier attach; left behind, it is never read
		}
	}
}

// A cursor file is the next parent offset to copy, u64 big-endian, then its CRC-32C.
func (c *copier) loadCursor(pp int) (uint64, error) {
	b, err := os.ReadFile(c.cursorPath(pp))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(b) != 12 || crc32.Checksum(b[:8], castagnoli) != binary.BigEndian.Uint32(b[8:]) {
		// A torn cursor only costs re-copying from the attach point: duplicates, never loss.
		c.b.log.Warn("fan-out cursor is damaged; copying again from the attach point", "file", c.cursorPath(pp))
		return 0, nil
	}
	return binary.BigEndian.Uint64(b), nil
}

func (c *copier) saveCursor(pp int, next uint64) error {
	b := binary.BigEndian.AppendUint64(nil, next)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	return vfs.WriteFileSync(c.cursorPath(pp), b)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (c *copier) run() {
	defer close(c.done)
	backoff := time.Duration(0)
	for {
		wake := c.parent.sig.wait()
		next, err := c.round()
		c.rounds.Add(1)
		if err != nil {
			if errors.Is(err, partition.ErrClosed) && (closed(c.parent.done) || closed(c.child.done)) {
				return // a topic was closed; reconcile replaces or ends this copier
			}
			// A closed partition of a topic still open was replaced on this node
			// meanwhile (a move, a group made again): retried below like any failure.
			// Ending here would end the copy for good: the copier stays registered, so
			// reconcile starts no other.
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			c.b.log.Error("fan-out copy failed; retrying", "parent", c.parent.name, "child", c.child.name, "err", err, "retry_in", backoff)
			next = backoff
		} else {
			backoff = 0
		}
		if next == 0 {
			select {
			case <-c.stop:
				return
			default:
				continue // more to copy right away
			}
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if next > 0 {
			timer = time.NewTimer(next)
			fire = timer.C
			c.sleepsUntil.Store(partition.WallMillis() + next.Milliseconds())
		}
		// A delay child's copier waiting for its timer wakes on the parent's appends
		// too: a message given an earlier timestamp (a batch's, a copy's from another
		// cluster) in a partition with nothing waiting may be due before the timer.
		// Asleep until the timer, such a message waited up to the whole delay (an
		// adversarial review, 6 December). The round reads only the partitions with
		// nothing waiting (waits), so the appends behind a waiting message cost no read.
		select {
		case <-c.stop:
		case <-c.parent.done:
		case <-c.child.done:
		case <-wake:
		case <-fire:
		case <-c.kick:
		}
		if timer != nil {
			timer.Stop()
			c.sleepsUntil.Store(0)
		}
		select {
		case <-c.stop:
			return
		case <-c.parent.done:
			return
		case <-c.child.done:
			return
		default:
		}
	}
}

// round copies one batch from every parent partition. It returns 0 when more is ready
// now, a positive wait until the next delayed message is due, or -1 to wait for new data.
// A parent partition whose copy fails does not hold up the others (their child
// partitions may be healthy); the errors are returned together after the round.
func (c *copier) round() (time.Duration, error) {
	// Checked before every batch, not only at attach: a revoked grant stops the copy
	// within one batch. Paused, the copier waits for new data or a metadata change.
	c.setPaused(c.b.fanoutDenied(*c.child.cur.Load(), c.parent.name))
	if c.paused != "" {
		return -1, nil
	}
	if !c.b.Ready() {
		// This node's metadata is not current (cut off from the controller, or
		// behind): the child may have been detached, and attached again as a delay
		// child whose copies must not come early. A detach answered while this node
		// could not confirm it relies on this (the detach fence, deletefence.go).
		return notReadyRetry, nil
	}
	wait := time.Duration(-1)
	now := partition.WallMillis()
	var errs error
	for pp, p := range c.parent.parts() {
		if p == nil || !p.Leading() {
			if pp < len(c.led) {
				c.led[pp] = nil
			}
			continue // the node serving this parent partition copies it
		}
		gained := pp < len(c.led) && c.led[pp] != p
		if pp < len(c.led) {
			c.led[pp] = p
		}
		from := c.cursors[pp].Load()
		if gained && pp < len(c.waits) {
			c.waits[pp] = delayWait{} // another history: what waits in it is read again
		}
		if gained {
			// What sent remembers was judged against the history this node led before:
			// a replica that replaced it, or a history that went back, may hold other
			// messages at those offsets, which the child partitions it lists would
			// never get (an adversarial review, 6 December). Forgotten: at most the
			// batch is copied again, as after any leader change.
			clear(c.sent[pp])
			if end := p.Stats().End; from > end {
				// A partition that leads holds every committed message, so its log went
				// back (a forced takeover onto a replica that lacked some, a restore of
				// an older copy): what is stored from its end on is new and must be
				// copied; those offsets' old messages were copied already.
				c.b.log.Warn("the parent partition's log ends before the fan-out cursor (it went back: a forced takeover, or a restore); copying from its end",
					"parent", c.parent.name, "partition", pp, "child", c.child.name, "end", end, "cursor", from)
				if err := c.saveCursor(pp, end); err != nil {
					return 0, fmt.Errorf("saving the fan-out cursor: %w", err)
				}
				from = end
				c.cursors[pp].Store(from)
				clear(c.sent[pp])
			}
		}
		committed := p.FanoutCursor(c.attachID)
		switch {
		case gained && p.Replicated() && committed > 0 && committed < from:
			// This node starts leading (or starts): the group's cursor is where the
			// copy stands in the partition's history as the group holds it now. This
			// node's own cursor may be past it for the batch whose cursor was still
			// being committed (copied again: allowed), or past a history that went
			// back (a forced takeover onto a replica that lacked messages this node
			// had copied): new messages were stored at those offsets since, and a
			// cursor kept past them never copied them (an adversarial review, 5
			// December).
			c.b.log.Info("fan-out resumes from the cursor committed in the partition's group, behind this node's own",
				"parent", c.parent.name, "partition", pp, "child", c.child.name, "from", committed, "own", from)
			from = committed
			c.cursors[pp].Store(from)
			clear(c.sent[pp])
		case committed > from:
			// Another replica led and copied since this node's cursor was written.
			from = committed
			c.cursors[pp].Store(from)
			clear(c.sent[pp])
		}
		if gained && committed == 0 && from > 0 {
			// No cursor committed in this group yet: a group made over a partition of
			// one replica (its replication factor raised, or a move) knew only this
			// node's file, and the next leader, elsewhere, would copy the whole
			// partition again. The group learns it now, not only after the next batch.
			c.commitCursor(pp, p)
		}
		if c.delayMs > 0 && pp < len(c.waits) {
			if w := c.waits[pp]; w.due > now && w.from == from {
				// Its first message not yet due holds back the rest: nothing to read.
				d := time.Duration(w.due-now) * time.Millisecond
				if wait < 0 || d < wait {
					wait = d
				}
				continue
			}
			c.waits[pp] = delayWait{}
		}
		c.reads.Add(1)
		recs, err := p.Read(from, copyBatch)
		if errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 && c.parent.damagedOnReplica(pp) {
			// Damaged on this replica only: retried (the error below) until this
			// replica handed its leadership over; the next leader copies it.
			errs = errors.Join(errs, fmt.Errorf("partition %d: the message at offset %d is damaged on this replica; it is copied by the next leader, from an intact replica: %w", pp, from, err))
			continue
		}
		if errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 && p.Stats().Oldest > from {
			// The read started at the oldest message held, past the cursor (retention
			// deleted the ones from the cursor on), and that one is damaged. The
			// cursor moves past what is gone; the next read, from the oldest, skips
			// the damaged one below. Skipped one offset at a time from the cursor,
			// each gone message cost a cursor sync, an error line and a count of a
			// damaged message (a review of the remote children, 6 December, found the
			// same in their copy).
			o := p.Stats().Oldest
			c.b.log.Warn("fan-out fell behind retention; messages aged out of the parent before they were copied",
				"parent", c.parent.name, "child", c.child.name, "partition", pp, "from", from, "to", o)
			if err := c.saveCursor(pp, o); err != nil {
				return 0, fmt.Errorf("saving the fan-out cursor: %w", err)
			}
			c.cursors[pp].Store(o)
			c.commitCursor(pp, p)
			wait = 0
			continue
		}
		if errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 {
			// The record at from is damaged and can never be copied; retrying would stop
			// this parent's fan-out for good. Skip it, as a lease does.
			c.b.log.Error("a damaged message is skipped by fan-out: it is never copied", "topic", c.parent.name,
				"partition", pp, "offset", from, "child", c.child.name, "err", err)
			c.b.metrics.Damaged.WithLabelValues(c.child.name, "fanout").Inc()
			if err := c.saveCursor(pp, from+1); err != nil {
				return 0, fmt.Errorf("saving the fan-out cursor: %w", err)
			}
			c.cursors[pp].Store(from + 1)
			c.commitCursor(pp, p)
			wait = 0
			continue
		}
		if err != nil {
			if errors.Is(err, partition.ErrClosed) {
				return 0, err
			}
			errs = errors.Join(errs, err)
			continue
		}
		if len(recs) == 0 {
			continue
		}
		if recs[0].Offset > from {
			c.b.log.Warn("fan-out fell behind retention; messages aged out of the parent before they were copied",
				"parent", c.parent.name, "child", c.child.name, "partition", pp, "from", from, "to", recs[0].Offset)
		}
		due := len(recs)
		if c.delayMs > 0 {
			for i, r := range recs {
				if r.Timestamp+c.delayMs > now {
					//lint:ignore SA4006 due is read below (due == 0, recs[:due]); staticcheck's SSA misses the break out of the range loop
					due = i
					d := time.Duration(r.Timestamp+c.delayMs-now) * time.Millisecond
					if wait < 0 || d < wait {
						wait = d
					}
					if pp < len(c.waits) {
						// The next read starts at from, or at r once the due ones before
						// it are copied (the cursor moves there only then).
						c.waits[pp] = delayWait{from: from, due: r.Timestamp + c.delayMs}
						if i > 0 {
							c.waits[pp].from = recs[i-1].Offset + 1
						}
					}
					break
				}
			}
		}
		if due == 0 {
			continue
		}
		if err := c.copy(pp, recs[:due]); err != nil {
			if errors.Is(err, partition.ErrClosed) {
				return 0, err
			}
			errs = errors.Join(errs, err)
			continue
		}
		next := recs[due-1].Offset + 1
		if err := c.saveCursor(pp, next); err != nil {
			// The batch is in every child partition (sent says so): the retry only saves.
			errs = errors.Join(errs, fmt.Errorf("saving the fan-out cursor: %w", err))
			continue
		}
		c.cursors[pp].Store(next)
		clear(c.sent[pp])
		c.commitCursor(pp, p)
		if due == copyBatch || (due == len(recs) && next < p.Stats().End) {
			// More to read now: a full batch, or one cut short by the byte budget or
			// by a damaged record (which the next read reports). Waiting for the
			// parent's next append would stop the copy there in a quiet topic.
			wait = 0
		}
	}
	if errs != nil {
		return 0, errs
	}
	return wait, nil
}

// commitCursor commits parent partition pp's cursor in its group when it is
// replicated, so a change of leader re-copies at most what was copied since the last
// commit instead of everything since the attach. One proposal is in flight per
// partition; it takes the newest cursor when it starts, and another follows while
// the cursor moved on meanwhile.
func (c *copier) commitCursor(pp int, p *partition.Partition) {
	if !p.Replicated() || !c.b.meta.Allows(meta.FeaturePartitionCommands) || !c.committing[pp].CompareAndSwap(false, true) {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			var err error
			if next := c.cursors[pp].Load(); next > p.FanoutCursor(c.attachID) {
				ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
				err = p.CommitFanoutCursor(ctx, c.attachID, next)
				cancel()
			}
			c.committing[pp].Store(false)
			if err != nil {
				if !errors.Is(err, partition.ErrNotLeader) && !errors.Is(err, partition.ErrClosed) && c.ctx.Err() == nil {
					c.b.log.Warn("committing a fan-out cursor in the partition's group failed; the next batch tries again",
						"parent", c.parent.name, "partition", pp, "child", c.child.name, "err", err)
				}
				return
			}
			if c.cursors[pp].Load() <= p.FanoutCursor(c.attachID) || !c.committing[pp].CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// copy appends records to the child: the same partition index when the partition
// counts match, the key's hash otherwise (keyless: the parent partition modulo the
// child's count), one append per child partition. Records a child partition already
// took (c.sent) are skipped; each append that succeeds is recorded there, so when
// another child partition's append fails, the retry appends only where it failed.
func (c *copier) copy(pp int, recs []segment.Record) error {
	n := len(c.child.parts())
	if c.sent[pp] == nil {
		c.sent[pp] = make(map[int]uint64, 1)
	}
	sent := c.sent[pp]
	groups := make(map[int][]segment.Record, 1)
	for _, r := range recs {
		cp := pp % n
		if len(c.parent.parts()) != n && r.Key != nil {
			cp = PartitionForKey(r.Key, n)
		}
		if r.Offset < sent[cp] {
			continue
		}
		groups[cp] = append(groups[cp], segment.Record{Key: r.Key, Value: r.Value, Attrs: r.Attrs})
	}
	next := recs[len(recs)-1].Offset + 1
	var mu sync.Mutex
	var firstErr error
	forEachPartition(groups, func(cp int, g []segment.Record) {
		_, err := c.b.appendFor(context.Background(), c.child, cp, g, c.attachID)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			firstErr = errors.Join(firstErr, err)
			return
		}
		sent[cp] = next
		c.b.metrics.FanoutCopied.WithLabelValues(c.child.name).Add(float64(len(g)))
	})
	return firstErr
}

// ChildInfo describes one attached child for listing.
type ChildInfo struct {
	Name    string
	DelayMs int64
	// Paused says why nothing is copied now ("" while the copy runs).
	Paused string
	Lag    []ChildLag
}

// ChildLag is how far a child's copy is behind one parent partition.
type ChildLag struct {
	Partition          int32
	ParentNext, Cursor uint64
}

// parentStart reads where a new child's copy starts (the parent's tail) and of which
// parent incarnation: the attach command carries both, so the control plane refuses it
// if the parent was deleted and created again before it committed.
func (b *Broker) parentStart(parent string) ([]uint64, uint64, error) {
	t, err := b.lookup(parent)
	if err != nil {
		return nil, 0, err
	}
	stats, errs := b.allStats(context.Background(), t)
	start := make([]uint64, len(t.parts()))
	for i := range t.parts() {
		if errs[i] != nil {
			return nil, 0, errs[i]
		}
		start[i] = stats[i].End
	}
	return start, t.incarnation, nil
}

// AttachChild links an existing topic as a child of parent: from now on every message
// committed to parent is copied to it (after delayMs, for a delay child).
func (b *Broker) AttachChild(ctx context.Context, parent, child string, delayMs int64) (ChildInfo, error) {
	if err := b.ensureReady(); err != nil {
		return ChildInfo{}, err
	}
	if err := errors.Join(checkName(parent), checkName(child)); err != nil {
		return ChildInfo{}, firstInvalid(err)
	}
	if err := checkDelay(delayMs); err != nil {
		return ChildInfo{}, err
	}
	if _, err := b.lookup(child); err != nil {
		if errors.Is(err, ErrTopicNotFound) {
			return ChildInfo{}, fmt.Errorf("%w: no topic %q to attach as a child; create it with POST /v1/topics, then attach it", ErrTopicNotFound, child)
		}
		return ChildInfo{}, err
	}
	start, parentInc, err := b.parentStart(parent)
	if err != nil {
		return ChildInfo{}, err
	}
	if attachHook != nil {
		attachHook()
	}
	if _, err := b.meta.AttachChild(parent, parentInc, child, delayMs, start); err != nil {
		return ChildInfo{}, mapMetaErr(err)
	}
	if err := b.reconcile(false); err != nil {
		return ChildInfo{}, errors.Join(ErrStorage, err)
	}
	infos, err := b.Children(parent)
	if err != nil {
		return ChildInfo{}, err
	}
	for _, ci := range infos {
		if ci.Name == child {
			return ci, nil
		}
	}
	return ChildInfo{Name: child, DelayMs: delayMs}, nil
}

// attachHook, set only by serial tests (never with t.Parallel), runs between reading
// the parent's start offsets and the attach command.
var attachHook func()

func checkDelay(delayMs int64) error {
	if delayMs < 0 || delayMs > MaxFanoutDelayMs {
		return invalid(apigen.ErrorCodeInvalidParameter, "fanout_delay_ms must be between 1 ms and 1 year (0 for no delay), got %d", delayMs)
	}
	return nil
}

// DetachChild stops copying parent's messages to child; both topics stay. It returns
// once no node copies for the attachment any more (fenceDetach).
func (b *Broker) DetachChild(ctx context.Context, parent, child string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if err := errors.Join(checkName(parent), checkName(child)); err != nil {
		return firstInvalid(err)
	}
	_, index, err := b.meta.DetachChild(parent, child)
	if err != nil {
		return mapMetaErr(err)
	}
	err = b.reconcile(false)
	b.fenceDetach(ctx, parent, child, index)
	return err
}

// Children lists parent's children with how far each is behind, per partition.
func (b *Broker) Children(parent string) ([]ChildInfo, error) {
	pt, err := b.lookup(parent)
	if err != nil {
		return nil, err
	}
	var out []ChildInfo
	for _, m := range b.meta.Topics() {
		if m.Parent != parent || m.ParentIncarnation != pt.incarnation {
			continue
		}
		ci := ChildInfo{Name: m.Name, DelayMs: m.FanoutDelayMs, Paused: b.fanoutDenied(m, parent)}
		for i := range pt.parts() {
			if !pt.leads(i) {
				l, err := b.remoteLag(pt, i, m)
				if err != nil {
					return nil, err
				}
				ci.Lag = append(ci.Lag, l)
				continue
			}
			ci.Lag = append(ci.Lag, b.localLag(pt, i, m))
		}
		out = append(out, ci)
	}
	return out, nil
}

// localLag is how far child m's copy is behind partition i of parent pt, which this
// node holds (and copies).
func (b *Broker) localLag(pt *topic, i int, m meta.Topic) ChildLag {
	b.copiersMu.Lock()
	c := b.copiers[copierKey{child: m.Name, childInc: m.Incarnation, attachID: m.AttachID}]
	b.copiersMu.Unlock()
	l := ChildLag{Partition: int32(i), ParentNext: pt.parts()[i].Stats().End}
	if c != nil {
		l.Cursor = c.cursors[i].Load()
	} else if i < len(m.FanoutStart) {
		l.Cursor = m.FanoutStart[i]
	}
	return l
}

// reconcileCopiers runs one copier per attached child and stops the rest.
func (b *Broker) reconcileCopiers(want []meta.Topic) {
	byName := make(map[string]meta.Topic, len(want))
	for _, m := range want {
		byName[m.Name] = m
	}
	live := make(map[copierKey]meta.Topic)
	for _, m := range want {
		if p, ok := byName[m.Parent]; ok && m.Parent != "" && p.Incarnation == m.ParentIncarnation {
			live[copierKey{child: m.Name, childInc: m.Incarnation, attachID: m.AttachID}] = m
		}
	}
	b.copiersMu.Lock()
	defer b.copiersMu.Unlock()
	for k, c := range b.copiers {
		if _, ok := live[k]; !ok {
			c.close()
			delete(b.copiers, k)
		}
	}
	for k, m := range live {
		if c, ok := b.copiers[k]; ok {
			c.poke() // the change may be a grant: look again now, not at the next message
			continue
		}
		b.mu.RLock()
		parent, child := b.topics[m.Parent], b.topics[m.Name]
		b.mu.RUnlock()
		if parent == nil || child == nil || parent.incarnation != m.ParentIncarnation || child.incarnation != m.Incarnation {
			continue
		}
		c, err := b.startCopier(parent, child, m)
		if err != nil {
			b.log.Error("starting fan-out failed", "parent", m.Parent, "child", m.Name, "err", err)
			continue
		}
		b.copiers[k] = c
	}
}

func (b *Broker) stopCopiers() {
	b.copiersMu.Lock()
	defer b.copiersMu.Unlock()
	for k, c := range b.copiers {
		c.close()
		delete(b.copiers, k)
	}
}
