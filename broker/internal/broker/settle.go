package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
)

// liveIncarnation reports whether some existing topic has this incarnation.
func (b *Broker) liveIncarnation(inc uint64) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, t := range b.topics {
		if t.incarnation == inc {
			return true
		}
	}
	return false
}

// catchUpTo returns the topic name as of the newest incarnation a handle of reqs names.
// In a cluster a handle may come from an incarnation created through another node that
// this node has not applied yet (the topic was deleted and created again): it catches
// up with the controller rather than call a live lease lost. Incarnations are the
// indexes of the commands that made them, so a newer one is a larger number.
func (b *Broker) catchUpTo(t *topic, name string, reqs []AckReq) (*topic, error) {
	if b.opts.Peers == nil {
		return t, nil
	}
	newest := t.incarnation
	for _, r := range reqs {
		if h, err := queue.DecodeHandle(r.Handle); err == nil && h.Incarnation > newest {
			newest = h.Incarnation
		}
	}
	if newest == t.incarnation {
		return t, nil
	}
	return b.catchUpToIncarnation(context.Background(), t, newest)
}

// catchUpToIncarnation returns topic t as this node has it open once it has applied
// the metadata through incarnation inc of it, which a request named (the node is
// behind: the topic was deleted and created again), asking the controller first.
func (b *Broker) catchUpToIncarnation(ctx context.Context, t *topic, inc uint64) (*topic, error) {
	ctx, cancel := context.WithTimeout(ctx, syncBound)
	defer cancel()
	if b.meta.AppliedIndex() < inc {
		if err := b.meta.Sync(ctx); err != nil {
			b.log.Warn("a request names a newer incarnation of a topic than this node knows and the controller could not be asked", "topic", t.name, "err", err)
			return nil, fmt.Errorf("%w: the request names an incarnation of topic %q this node has not caught up with: %w", ErrUnavailable, t.name, err)
		}
	}
	return b.openAsMeta(ctx, t.name)
}

// AckMode says what an ack does.
type AckMode int

const (
	// Settle marks the message done.
	Settle AckMode = iota
	// Renew extends the lease by the topic's visibility timeout.
	Renew
	// ExtendBy sets the lease to end Delay from now; a zero Delay hands it back.
	ExtendBy
)

// AckReq is one ack, extend or nack.
type AckReq struct {
	Handle string
	Mode   AckMode
	Delay  time.Duration
}

// Ack applies acks; the result has one error per request (nil: done). Settles are durable
// before it returns. A handle of another incarnation of the topic is ErrLeaseLost.
//
// Ack takes no context: a lease is settled or extended whole once asked for, whether
// or not the client waits for the answer (if it went, it retries and meets
// ErrLeaseLost or a redelivery, both of which the delivery contract allows).
func (b *Broker) Ack(name string, reqs []AckReq) []error {
	errs := make([]error, len(reqs))
	t, err := b.lookup(name)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if t, err = b.catchUpTo(t, name, reqs); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	vis := time.Duration(t.cur.Load().VisibilityMs) * time.Millisecond

	settles := make(map[uint32][]int)
	handles := make([]queue.Handle, len(reqs))
	var closed closedOnce
	// Settles are made durable together after the loop, extends and nacks in it. An
	// extend or nack of a lease an earlier entry settles waits for the settles, so
	// that each entry meets the lease as the entries before it left it: [ack H,
	// nack H] settles the message and answers the nack 410, as two calls in that
	// order would (the nack used to win, and the ack answered 410).
	// Only an extend or nack looks it up: a batch of settles alone (the common one)
	// builds no map (2 % of a node's CPU in the batched flow).
	var settling map[queue.Handle]bool
	for _, r := range reqs {
		if r.Mode != Settle {
			settling = make(map[queue.Handle]bool)
			break
		}
	}
	var after []int
	extend := func(i int) {
		r, h := reqs[i], handles[i]
		p := int(h.Partition)
		switch r.Mode {
		case Renew:
			errs[i] = b.extendOn(t, p, h.Offset, h.Nonce, vis, dataExtend)
		case ExtendBy:
			errs[i] = b.extendOn(t, p, h.Offset, h.Nonce, r.Delay, dataExtend)
			if r.Delay == 0 && errs[i] == nil {
				t.metrics.nacks.Inc()
			}
		}
		errs[i] = b.ackErr(t, errs[i], "extend", &closed)
	}
	for i, r := range reqs {
		h, err := queue.DecodeHandle(r.Handle)
		if err != nil || (h.Incarnation == t.incarnation && h.Partition >= uint32(len(t.parts()))) {
			errs[i] = ErrBadHandle
			continue
		}
		if h.Incarnation != t.incarnation {
			if b.liveIncarnation(h.Incarnation) {
				// Issued by another topic that exists: the caller mixed up topics.
				errs[i] = ErrBadHandle
			} else {
				// Issued for an earlier (deleted) topic of this name: that lease is gone.
				errs[i] = ErrLeaseLost
			}
			continue
		}
		handles[i] = h
		switch {
		case r.Mode == Settle:
			settles[h.Partition] = append(settles[h.Partition], i)
			if settling != nil {
				settling[h] = true
			}
		case settling[h]:
			after = append(after, i)
		default:
			extend(i)
		}
	}
	settle := func(pi uint32, idx []int) {
		sr := make([]partition.SettleReq, len(idx))
		for j, i := range idx {
			sr[j] = partition.SettleReq{Offset: handles[i].Offset, Nonce: handles[i].Nonce}
		}
		res := b.settleOn(t, int(pi), sr)
		settled := 0
		for j, i := range idx {
			errs[i] = b.ackErr(t, res[j], "settle", &closed)
			if res[j] == nil {
				settled++
			}
		}
		t.metrics.settled.Add(float64(settled))
	}
	forEachPartition(settles, settle)
	for _, i := range after {
		extend(i)
	}
	return errs
}

func (b *Broker) ackErr(t *topic, err error, op string, closed *closedOnce) error {
	outcome := op + "_ok"
	switch {
	case err == nil:
	case errors.Is(err, queue.ErrLeaseLost):
		err, outcome = ErrLeaseLost, "lease_lost"
	case errors.Is(err, queue.ErrAckedAheadFull):
		err, outcome = ErrAckedAheadFull, "acked_ahead_full"
	case errors.Is(err, partition.ErrClosed) && !errors.Is(err, partition.ErrOutcomeUnknown) && !errors.Is(err, partition.ErrNotLeader):
		err, outcome = closed.answer(b, t), "error"
	default:
		err, outcome = b.partitionErr(t, err, op), "error"
	}
	b.metrics.AckOutcomes.WithLabelValues(outcome).Inc()
	return err
}

// closedOnce is the answer for a closed partition, worked out once per request:
// finding it may ask the controller (closedErr), and an ack-batch of a thousand
// handles on a closed partition asked it once per handle, one after another (a
// review, 5 December).
type closedOnce struct {
	once sync.Once
	err  error
}

func (c *closedOnce) answer(b *Broker, t *topic) error {
	c.once.Do(func() { c.err = b.closedErr(t) })
	return c.err
}
