package narad

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The sentinels below name the kinds of failure every Narad SDK shares. Match them with
// errors.Is; use errors.As with *Error for the status, code, node and operation.
var (
	// ErrBadRequest means the broker refused the request as malformed (400); fix it before retrying.
	ErrBadRequest = errors.New("narad: bad request")
	// ErrUnauthenticated means the credentials were missing or wrong (401).
	ErrUnauthenticated = errors.New("narad: unauthenticated")
	// ErrForbidden means the credentials do not allow the operation (403).
	ErrForbidden = errors.New("narad: forbidden")
	// ErrNotFound means the topic, partition, child or user does not exist (404).
	ErrNotFound = errors.New("narad: not found")
	// ErrConflict means the request conflicts with the broker's state, such as a topic that exists (409).
	ErrConflict = errors.New("narad: conflict")
	// ErrTooLarge means a body or message is over the broker's limit (413).
	ErrTooLarge = errors.New("narad: too large")
	// ErrLeaseLost means the lease behind a receipt handle is no longer held (410): it
	// lapsed or was handed back, and the message is (or was) delivered again, or the
	// message is settled already; either way the work must not count as acknowledged.
	ErrLeaseLost = errors.New("narad: lease lost")
	// ErrUnavailable means the node could not serve the request now (503 or a connection
	// failure); it is safe and useful to retry, after Retry-After when the broker sent one.
	ErrUnavailable = errors.New("narad: unavailable")
	// ErrThrottled means a proxy in front of the broker asked the client to slow down (429).
	ErrThrottled = errors.New("narad: throttled")
	// ErrTimeout means the operation did not finish within its deadline; its outcome is unknown.
	ErrTimeout = errors.New("narad: timeout")
	// ErrClosed means the Client, Publisher or Consumer was closed before the call.
	ErrClosed = errors.New("narad: closed")
	// ErrNotImplemented means this version of the broker does not offer the operation yet (501).
	ErrNotImplemented = errors.New("narad: not implemented")
	// ErrBufferFull means a non-blocking Publisher's buffer has no room for another message.
	ErrBufferFull = errors.New("narad: publisher buffer full")
	// ErrNoLease means the message was read without a lease (replay), so it cannot be settled.
	ErrNoLease = errors.New("narad: message has no lease")
	// ErrInternal means the broker hit a bug (500); the message says what to report.
	ErrInternal = errors.New("narad: internal broker error")
	// ErrDecode means a message body is not what Decode was asked to read (not JSON, or
	// JSON of another shape). It is about the message, not the broker.
	ErrDecode = errors.New("narad: the body does not decode")
	// ErrInvalidOption means options given to the SDK cannot work together; no request
	// was made.
	ErrInvalidOption = errors.New("narad: invalid option")
)

// Error codes of the broker's ErrorCode list that the SDK branches on. Clients branch on
// codes, never on messages.
const (
	CodeLeaseLost      = "lease_lost"
	CodeAckedAheadFull = "acked_ahead_full"
	CodeInFlightFull   = "in_flight_full"
	CodeUnavailable    = "unavailable"
	CodeStorageFailed  = "storage_failed"
	CodeMaybeStored    = "maybe_stored"
	CodeTimeout        = "timeout"
	CodeTopicNotFound  = "topic_not_found"
	CodeTopicExists    = "topic_exists"
	CodeNotImplemented = "not_implemented"
	// CodeIncarnationMismatch marks a replay from a Position taken from another
	// incarnation of the topic, or a DeleteTopic naming one (WithDeleteIncarnation): the
	// topic was deleted and created again since (ErrConflict).
	CodeIncarnationMismatch = "incarnation_mismatch"
)

// Error is a failed call: what was attempted (Op, Topic), where (Node, the endpoint that
// answered last), and what the broker said (Status, Code, Message). Status is 0 when no
// HTTP answer arrived (a connection failure or a timeout); Err then holds the cause.
type Error struct {
	// Op is the operation, such as "produce", "consume" or "ack".
	Op string
	// Topic is the topic the operation addressed, or "" for none.
	Topic string
	// Node is the endpoint (base URL) that answered or failed last.
	Node string
	// Status is the HTTP status, or 0 when no answer arrived.
	Status int
	// Code is the broker's stable error code (see openapi.yaml ErrorCode), or "".
	Code string
	// Message is the broker's message for people, or a description of the failure.
	Message string
	// RetryAfter is the wait the broker asked for (Retry-After), or 0.
	RetryAfter time.Duration
	// Err is the underlying transport or context error, if any.
	Err error
	// PartlyStored is set only on a failed ProduceBatch (or Publisher batch) request of
	// which part was stored: the broker wrote the messages of some partitions and not
	// those of others. Such a request is never resent by the SDK, whatever NoDuplicates
	// says, since resending it stores the stored part twice; the error is Uncertain and
	// not Retryable. Resend only the messages bound for PartlyStored.FailedPartitions if
	// duplicates matter.
	PartlyStored *PartlyStored

	kind      error
	uncertain bool
}

// PartlyStored says which part of a produce-batch request was stored when the request
// failed in part (the broker's error.partly_stored).
type PartlyStored struct {
	// Stored is how many messages of the request were stored; they will be delivered.
	Stored int
	// FailedPartitions are the partitions whose messages were not stored. When the
	// error's Code is "timeout" their messages may or may not be stored: that part of
	// the outcome is unknown.
	FailedPartitions []int32
}

// Error formats the failure for logs.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("narad: ")
	b.WriteString(e.Op)
	if e.Topic != "" {
		b.WriteString(" ")
		b.WriteString(e.Topic)
	}
	if e.Node != "" {
		b.WriteString(" at ")
		b.WriteString(e.Node)
	}
	b.WriteString(": ")
	if e.Status != 0 {
		fmt.Fprintf(&b, "%d ", e.Status)
	}
	if e.Code != "" {
		b.WriteString(e.Code)
		b.WriteString(": ")
	}
	if p := e.PartlyStored; p != nil {
		fmt.Fprintf(&b, "partly stored (%d message(s) stored; not stored in partition(s) %v", p.Stored, p.FailedPartitions)
		if e.Code == CodeTimeout {
			b.WriteString(", which may be stored")
		}
		b.WriteString("; not resent): ")
	}
	switch {
	case e.Message != "":
		b.WriteString(e.Message)
	case e.Err != nil:
		b.WriteString(e.Err.Error())
	case e.kind != nil:
		b.WriteString(strings.TrimPrefix(e.kind.Error(), "narad: "))
	}
	if e.uncertain {
		b.WriteString(" (outcome unknown)")
	}
	return b.String()
}

// Unwrap exposes the sentinel of the error's kind and the underlying cause, so that
// errors.Is(err, ErrUnavailable) and errors.Is(err, context.DeadlineExceeded) both work.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 2)
	if e.kind != nil {
		out = append(out, e.kind)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// Retryable reports whether retrying the same call is safe and useful. A produce-batch
// request that was partly stored (PartlyStored) is not: resending it whole stores the
// stored part twice.
func (e *Error) Retryable() bool {
	if e.PartlyStored != nil {
		return false
	}
	switch e.kind {
	case ErrUnavailable, ErrThrottled, ErrTimeout:
		return !errors.Is(e.Err, context.Canceled)
	}
	return false
}

// Uncertain reports whether the call may have taken effect although it failed: a
// produce whose reply was lost may have stored the message, and a produce-batch request
// that was partly stored (PartlyStored) did store some of its messages.
func (e *Error) Uncertain() bool { return e.uncertain }

// Retryable reports whether err is worth retrying unchanged: a 503, a 429, a timeout or a
// connection failure. Nil and any error that is not from this package answer false.
func Retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable()
	}
	var r interface{ Retryable() bool }
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return false
}

// Uncertain reports whether a failed call may have taken effect, such as a produce whose
// reply was lost. Nil and errors from outside this package answer false.
func Uncertain(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.uncertain
	}
	var u interface{ Uncertain() bool }
	if errors.As(err, &u) {
		return u.Uncertain()
	}
	return false
}

// kindOf maps an HTTP status and error code to the sentinel of its kind.
func kindOf(status int, code string) error {
	switch {
	case code == CodeTimeout:
		return ErrTimeout
	case status == http.StatusBadRequest:
		return ErrBadRequest
	case status == http.StatusUnauthorized:
		return ErrUnauthenticated
	case status == http.StatusForbidden:
		return ErrForbidden
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusConflict:
		return ErrConflict
	case status == http.StatusGone:
		return ErrLeaseLost
	case status == http.StatusRequestEntityTooLarge:
		return ErrTooLarge
	case status == http.StatusTooManyRequests:
		return ErrThrottled
	case status == http.StatusNotImplemented:
		return ErrNotImplemented
	case status == http.StatusServiceUnavailable, status == http.StatusBadGateway:
		return ErrUnavailable
	case status == http.StatusGatewayTimeout, status == http.StatusRequestTimeout:
		// 408 (a proxy or server gave up waiting) is a timeout like 504: retryable, and
		// the request may have taken effect.
		return ErrTimeout
	case status >= 500:
		return ErrInternal
	}
	return ErrBadRequest
}

// terminal reports whether err should stop a consume loop (contract rules 7 and 8):
// credentials refused (401, 403), the topic not found (deleted), a request the broker
// will never accept as sent (400, 409, 413), or the client closed. Everything else, a
// 500 or a 501 included, is reported and retried with backoff: the loop never stops
// on a failure that may pass.
func terminal(err error) bool {
	if err == nil || Retryable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, k := range []error{ErrUnauthenticated, ErrForbidden, ErrNotFound, ErrBadRequest, ErrConflict, ErrTooLarge, ErrClosed} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}
