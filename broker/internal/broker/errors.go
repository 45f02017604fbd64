package broker

import (
	"errors"
	"fmt"
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

// ErrOffsetOutOfRange means the offset has aged out of the partition.
var ErrOffsetOutOfRange = errors.New("offset out of range")

// ErrNotImplemented means this version does not offer the feature yet.
var ErrNotImplemented = errors.New("not implemented")

// InvalidError is a request the broker refuses as malformed; Code is the API error code
// and the message says what to change.
type InvalidError struct {
	Code string
	Msg  string
}

func (e *InvalidError) Error() string { return e.Msg }

func invalid(code, format string, args ...any) error {
	return &InvalidError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// ConflictError is a request that conflicts with the current state (other than an
// existing topic); the message says what.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }
