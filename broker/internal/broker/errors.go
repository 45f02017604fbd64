package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// ErrTopicNotFound means no topic of that name exists.
var ErrTopicNotFound = errors.New("topic not found")

// ErrTopicExists means a topic of that name exists already.
var ErrTopicExists = errors.New("topic exists")

// ErrPartitionNotFound means the topic has no partition of that index.
var ErrPartitionNotFound = errors.New("partition not found")

// ErrLeaseLost means the lease behind a receipt handle is no longer held.
var ErrLeaseLost = errors.New("lease lost")

// ErrBadHandle means a receipt handle is not one this broker issued for this topic.
var ErrBadHandle = errors.New("malformed receipt handle")

// ErrAckedAheadFull means too many messages past the ack frontier are settled.
var ErrAckedAheadFull = errors.New("acked-ahead set full")

// ErrUnavailable means the broker cannot serve the request now; retry later.
var ErrUnavailable = errors.New("unavailable")

// ErrTooManyLongPolls means the node holds its maximum of parked consumes; retry later.
var ErrTooManyLongPolls = errors.New("too many long polls")

// ErrDiskFull means the disk is full: nothing was stored; writes resume when space
// returns.
var ErrDiskFull = errors.New("disk full")

// ErrCorrupt means a stored message is damaged and is never served.
var ErrCorrupt = errors.New("stored message damaged")

// ErrStorage means a disk write failed and nothing was stored.
var ErrStorage = errors.New("storage failed")

// ErrMaybeStored goes with ErrStorage when the failed write could not be undone: the
// request was not acknowledged nor served, but may be found stored after a restart.
var ErrMaybeStored = errors.New("a failed write could not be undone")

// ErrTopicRecreated goes with the ErrUnavailable of a request for an incarnation of a
// topic that was deleted and created again while it ran, or before the node it came
// through caught up: the name exists, so the answer is "retry", not "not found".
var ErrTopicRecreated = errors.New("the topic was deleted and created again")

// ErrTopicGoneUnconfirmed goes with the ErrUnavailable of a request whose topic was not
// found where the node looked (deleted, or recreated as a newer incarnation) when the
// node could not ask the controller which: neither "not found" nor "retry" is known.
var ErrTopicGoneUnconfirmed = errors.New("the topic was not found where this node looked, and the controller could not be asked whether it exists again")

// ErrPartlyStored goes with the error of a produce whose messages spanned partitions
// when some partitions' writes failed and others' succeeded: the messages of the
// partitions that succeeded are stored and will be delivered, so a retry of the whole
// request stores them twice.
var ErrPartlyStored = errors.New("part of the request was stored")

// PartlyStoredError is the ErrPartlyStored of one produce: Failed lists the partitions
// whose writes failed (in order), Stored counts the messages that were stored.
type PartlyStoredError struct {
	Failed []int32
	Stored int
}

func (e *PartlyStoredError) Error() string {
	return fmt.Sprintf("%v: %d messages stored; the writes to partitions %v failed", ErrPartlyStored, e.Stored, e.Failed)
}

// Is makes errors.Is(err, ErrPartlyStored) hold.
func (e *PartlyStoredError) Is(target error) bool { return target == ErrPartlyStored }

// ErrOffsetOutOfRange means the offset has aged out of the partition.
var ErrOffsetOutOfRange = errors.New("offset out of range")

// ErrNotImplemented means this version does not offer the feature yet.
var ErrNotImplemented = errors.New("not implemented")

// InvalidError is a request the broker refuses as malformed; Code is the API error code
// and the message says what to change.
type InvalidError struct {
	Code apigen.ErrorCode
	Msg  string
}

func (e *InvalidError) Error() string { return e.Msg }

func invalid(code apigen.ErrorCode, format string, args ...any) error {
	return &InvalidError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// ConflictError is a request that conflicts with the current state (other than an
// existing topic); Msg says what. It is the control plane's type, so a conflict the
// control plane finds reaches the caller as it is, chain and all.
type ConflictError = meta.ConflictError

// partitionErr answers for err, met by a request of topic t in one of its partitions
// (on this node or forwarded to its holder).
func (b *Broker) partitionErr(t *topic, err error, op string) error {
	switch {
	case errors.Is(err, partition.ErrOutcomeUnknown):
		return errors.Join(ErrOutcomeUnknown, err)
	case errors.Is(err, partition.ErrNotLeader):
		return errors.Join(ErrUnavailable, err)
	case errors.Is(err, partition.ErrClosed):
		return b.closedErr(t)
	case errors.Is(err, partition.ErrCorrupt):
		b.metrics.StorageErrors.WithLabelValues("corrupt_record").Inc()
		return errors.Join(ErrCorrupt, err)
	case errors.Is(err, partition.ErrDiskFull):
		b.metrics.StorageErrors.WithLabelValues(op + "_disk_full").Inc()
		b.log.Error("disk full: a write was refused; free space on the data volume", "op", op)
		return errors.Join(ErrDiskFull, err)
	case errors.Is(err, partition.ErrStorage):
		b.metrics.StorageErrors.WithLabelValues(op).Inc()
		if errors.Is(err, segment.ErrNotUndone) {
			b.log.Error("a failed write could not be undone; its records may reappear after a restart", "op", op, "err", err)
			return errors.Join(ErrStorage, ErrMaybeStored, err)
		}
		return errors.Join(ErrStorage, err)
	}
	return err
}

// closedErr answers for a partition of t that was closed under a request which had
// picked it up (here, or on the node holding it, which answers "closed"). Nothing was
// done in it. Either t was deleted while the request ran (404), or the partition was
// closed while the topic stays: reopened in a new group (the replication factor raised
// from 1, a forced takeover), moved off the node, or rebuilt after damage. That is a
// 503 to retry, which finds the partition where it is now: a 404 would tell the client
// that a topic it may use is gone, and its producer drops the message, its consumer
// stops. Which of the two this node learns after catching up with the controller (the
// holder may have closed the partition for a delete this node has not applied yet); if
// it cannot, the answer is 503 too. A delete takes a topic out of this node's metadata
// before it closes any of its partitions, so a deleted incarnation is never taken for
// one that stays.
func (b *Broker) closedErr(t *topic) error {
	if b.closing.Load() {
		return ErrUnavailable
	}
	if b.opts.Peers != nil {
		ctx, cancel := context.WithTimeout(context.Background(), syncBound)
		defer cancel()
		if serr := b.meta.Sync(ctx); serr != nil {
			return fmt.Errorf("%w: a partition of topic %q was closed while the request ran, and the controller could not be asked whether the topic was deleted: %w", ErrUnavailable, t.name, serr)
		}
	}
	if m, ok := b.meta.Topic(t.name); ok && m.Incarnation == t.incarnation {
		return fmt.Errorf("%w: a partition of topic %q was closed while the request ran (moved, reopened in a new group, or rebuilt) and nothing was done in it; retry", ErrUnavailable, t.name)
	}
	return ErrTopicNotFound // deleted while the request ran
}
