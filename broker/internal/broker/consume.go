package broker

import (
	"context"
	"errors"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
)

// Delivered is a consumed or replayed message.
type Delivered struct {
	Partition int32
	Offset    uint64
	Key       []byte
	Value     []byte
	Attrs     uint16
	Timestamp int64
	Handle    string // empty on replay
	Attempt   uint32 // 0 on replay
}

// Consume leases up to max messages, waiting up to wait for the first. It returns no
// messages (and no error) when none arrived in time. The wait counts from the call,
// not from the end of the first look, which can be slow (a partition on another node
// still electing its leader): a client asking to wait 1 s gets its answer after about
// 1 s, and is never handed a delayed copy whose time came after that. While no
// partition of the topic can be asked (their leaders are electing, their holders
// unreachable), a consume that may wait keeps trying until its wait ends and only
// then answers the error: a short election is a slower answer, not a 503 the client
// must retry.
func (b *Broker) Consume(ctx context.Context, name string, max int, wait time.Duration) (_ []Delivered, err error) {
	arrived := time.Now()
	t, err := b.lookup(name)
	if err != nil {
		return nil, err
	}
	defer func() { err = b.notGoneIfRecreated(t, err) }()
	t.att.consuming()
	defer t.att.consumed()
	if wait > MaxWait {
		wait = MaxWait
	}
	var timer *time.Timer
	var recheck *time.Ticker
	waiting := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if recheck != nil {
			recheck.Stop()
		}
		if waiting {
			b.longPolls.Add(-1)
			b.metrics.ConsumeWaiting.Dec()
			t.waiting.Add(-1)
		}
	}()
	for {
		// A client that has gone gets nothing: a lease taken for it would hide the
		// message for a visibility timeout with nobody to process it. Checked before
		// every look (the first, and after each wake, which can race the cancel).
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Take the wake-up channel before looking, so a message arriving between the
		// look and the wait still wakes us.
		wake := t.sig.wait()
		got, down, err := b.leaseFrom(ctx, t, max)
		if len(got) > 0 && ctx.Err() != nil {
			// The client went while we leased: hand the messages back at once.
			b.handBack(t, got)
			return nil, ctx.Err()
		}
		if len(got) > 0 {
			return got, nil
		}
		left := wait - time.Since(arrived)
		if err != nil && (!down || left <= 0) {
			return nil, err
		}
		if left <= 0 {
			return nil, nil
		}
		var retry <-chan time.Time
		if down {
			// Nothing could be asked: try again soon (each try of a partition that
			// is electing waits a moment for its leader already).
			retry = time.After(min(left, downRetry))
		}
		if timer == nil {
			if b.longPolls.Add(1) > int64(b.opts.MaxLongPolls) {
				b.longPolls.Add(-1)
				return nil, errors.Join(ErrUnavailable, ErrTooManyLongPolls)
			}
			timer = time.NewTimer(left)
			waiting = true
			b.metrics.ConsumeWaiting.Inc()
			t.waiting.Add(1)
			if t.hasRemote() {
				// A message on a partition another node holds wakes this consume
				// through that node's watch; the recheck covers a watch that could
				// not run.
				b.watchRemote(t)
				recheck = time.NewTicker(remoteRecheck)
			}
		}
		select {
		case <-wake:
		case <-tickC(recheck):
		case <-retry:
		case <-timer.C:
			if down {
				return nil, err // still nothing could be asked
			}
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.done:
			return nil, ErrTopicNotFound
		case <-b.draining:
			return nil, ErrUnavailable
		}
	}
}

// tickC is t's channel, or nil (never ready) for no ticker.
func tickC(t *time.Ticker) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// handBack ends leases taken for a client that has gone, so the messages are
// deliverable again now rather than after the visibility timeout. They were never
// sent, so they count as no delivery attempt.
func (b *Broker) handBack(t *topic, ds []Delivered) {
	for _, d := range ds {
		h, err := queue.DecodeHandle(d.Handle)
		if err != nil {
			continue
		}
		err = b.extendOn(t, int(d.Partition), h.Offset, h.Nonce, 0, dataHandBack)
		switch {
		case err == nil, errors.Is(err, queue.ErrLeaseLost):
		case errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, partition.ErrOutcomeUnknown):
			b.log.Warn("handing back a lease of a gone client: its outcome is unknown (the partition's leader changed, or its node did not answer); the message is delivered again at once if the hand-back took effect, else after its visibility timeout",
				"topic", t.name, "partition", d.Partition, "offset", d.Offset, "err", err)
		default:
			b.log.Warn("handing back a lease of a gone client failed; the message is delivered again after its visibility timeout",
				"topic", t.name, "partition", d.Partition, "offset", d.Offset, "err", err)
		}
	}
}

// handBackLate hands back, in the background, leases of partition i that came too late
// to hand out.
func (b *Broker) handBackLate(t *topic, i int, ds []partition.Delivery, took time.Duration) {
	late := make([]Delivered, 0, len(ds))
	for _, d := range ds {
		h := queue.Handle{Incarnation: t.incarnation, Partition: uint32(i), Offset: d.Record.Offset, Nonce: d.Nonce}
		late = append(late, Delivered{Partition: int32(i), Offset: d.Record.Offset, Handle: h.Encode()})
	}
	t.metrics.tooLate.Add(float64(len(ds)))
	b.log.Warn("leases answered too late to hand out are handed back", "topic", t.name, "partition", i, "leases", len(ds), "took", took)
	go b.handBack(t, late)
}

// downRetry is how soon a consume that could ask no partition tries again.
const downRetry = 100 * time.Millisecond

// leaseBudget is how long one look over a topic's partitions may go on asking them once
// it holds messages: the leases it holds age from their grant, not from the answer.
// Past it (or a quarter of the topic's visibility timeout, when that is shorter) the
// look answers with what it holds, and a forwarded ask still under way is cut at that
// point, so a consume answers within about leaseBudget of its first lease however many
// holders are slow, and a 2 s lease is not handed out after it lapsed.
const leaseBudget = 3 * time.Second

// leaseFrom leases from the topic's partitions in turn, starting one further each call
// so every partition is served, wherever it lives; those whose holders' own consumers
// attend to them are asked last (attend.go). A partition whose holder cannot be
// reached is passed over while another answers: the consume is served from the
// partitions that are up (and waits on them), and fails only when none is. down
// reports that failure: no partition could be asked, so the error may pass.
func (b *Broker) leaseFrom(ctx context.Context, t *topic, max int) (_ []Delivered, down bool, _ error) {
	vis := time.Duration(t.cur.Load().VisibilityMs) * time.Millisecond
	n := len(t.parts())
	start := int(t.consume.Add(1) % uint32(n))
	var out []Delivered
	var firstErr, downErr error
	answered := false
	size := 0
	spend := min(leaseBudget, vis/4)
	var held time.Time // when the first lease held was asked for
	var buf [64]int
	order := t.att.order(buf[:0], n, start, t.leads, mono())
	for k := 0; k < n && len(out) < max && size < MaxConsumeBytes; k++ {
		if ctx.Err() != nil {
			break // the client went: lease nothing more (the caller hands back what was)
		}
		if len(out) > 0 && time.Since(held) > spend {
			// The leases held have aged by the consume's budget (holders slow or
			// stalled, each forwarded lease waiting up to remoteCallTimeout): answer
			// with them rather than ask the rest one after another. With nothing
			// yet, the others are still asked (a slow holder must not turn a consume
			// that healthy partitions can serve into a 503). The next consume starts
			// at another partition.
			break
		}
		i := order[k]
		budget := MaxConsumeBytes - size
		if len(out) == 0 {
			budget = MaxConsumeBytes
		}
		bound := remoteCallTimeout
		if len(out) > 0 { // (still within the budget: checked above)
			// A forwarded ask waits no longer than the budget of the leases held; a
			// lease its holder takes once it was cut is handed back there (serveData;
			// the next pass below ends the look).
			bound = min(bound, time.Until(held.Add(spend)))
		}
		asked := time.Now()
		ds, err := b.leaseOn(ctx, t, i, max-len(out), vis, budget, bound)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !t.leads(i) && (errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown)) {
				// The holder is down or busy: serve the others. A lease it takes
				// after the ask gave up is handed back there (serveData); one whose
				// answer was lost on its way comes back after the visibility timeout.
				if downErr == nil {
					downErr = err
				}
				continue
			}
			answered = true
			if firstErr == nil {
				firstErr = err // mapped only if it is the answer: mapping may ask the controller (closedErr), while leases taken age
			}
			continue
		}
		answered = true
		if len(ds) > 0 && time.Since(asked) > vis-vis/8 {
			// The answer came so late (a slow holder, or its way back; only the first
			// ask, which no budget bounds, can be this late) that these leases, granted
			// after asked, may have lapsed or be about to: hand them back (uncounted; a
			// lapsed one stays with whoever holds it now) rather than hand out a handle
			// dead, or nearly, on arrival.
			b.handBackLate(t, i, ds, time.Since(asked))
			continue
		}
		if len(out) == 0 && len(ds) > 0 {
			held = asked
		}
		for _, d := range ds {
			size += len(d.Record.Key) + len(d.Record.Value)
			h := queue.Handle{Incarnation: t.incarnation, Partition: uint32(i), Offset: d.Record.Offset, Nonce: d.Nonce}
			out = append(out, Delivered{
				Partition: int32(i), Offset: d.Record.Offset, Key: d.Record.Key, Value: d.Record.Value,
				Attrs: d.Record.Attrs, Timestamp: d.Record.Timestamp, Handle: h.Encode(), Attempt: d.Attempt,
			})
			if d.Attempt > 1 {
				t.metrics.redelivered.Inc()
			}
		}
	}
	if len(out) > 0 {
		t.metrics.delivered.Add(float64(len(out)))
		t.metrics.deliveredBytes.Add(float64(size))
		return out, false, nil
	}
	if firstErr == nil && !answered {
		return nil, downErr != nil, downErr // no partition could be asked
	}
	if firstErr != nil {
		firstErr = b.partitionErr(t, firstErr, "read")
	}
	return nil, false, firstErr
}
