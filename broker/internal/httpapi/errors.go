package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/jsonstr"
)

// apiError is an error as the API shows it: a status, a stable code from the ErrorCode
// list of openapi.yaml, and a message that says what to do.
type apiError struct {
	status     int
	code       apigen.ErrorCode
	msg        string
	retryAfter int // seconds, for 503
	// part, when set, is the part of a produce-batch that was stored: the body says
	// so in partly_stored, which clients read instead of the message.
	part *broker.PartlyStoredError
}

func (e *apiError) Error() string { return string(e.code) + ": " + e.msg }

func newErr(status int, code apigen.ErrorCode, msg string) *apiError {
	return &apiError{status: status, code: code, msg: msg}
}

// maxEcho is the most bytes of a client's own input that an error message repeats:
// enough to recognise it, never a megabyte of it back.
const maxEcho = 200

// clip shortens s to at most n bytes, on a character boundary, marking the cut with an
// ellipsis.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// maxMessageBytes bounds every error message. Messages echo the client's input (a
// value a schema refused, a key no schema allows, a library's description of a bad
// value), which can be a megabyte long; the bound keeps the answer small whichever
// part of the message carries it, and is far above any message's own text.
const maxMessageBytes = 1024

// elide shortens a message over n bytes by cutting out its middle (marked …), so both
// its start (what failed, where) and its end (why, what to do) survive; an echoed value
// is what usually makes a message long, and it sits in the middle.
func elide(s string, n int) string {
	if len(s) <= n {
		return s
	}
	head := n / 2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	tail := len(s) - (n - n/2)
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return s[:head] + " … " + s[tail:]
}

func badParam(msg string) *apiError {
	return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidParameter, msg)
}

// paramError is the answer to a parameter the generated router could not bind: it
// names the parameter and says what it takes, in place of the binder's own words
// ("error binding string parameter: strconv.ParseInt: …"), which told a caller how Go
// failed rather than what to send.
func paramError(err error) *apiError {
	var missing *apigen.RequiredParamError
	var many *apigen.TooManyValuesForParamError
	var format *apigen.InvalidParamFormatError
	switch {
	case errors.As(err, &missing):
		return badParam(fmt.Sprintf("the query parameter %s is required: add ?%s=… to the URL (openapi.yaml lists each operation's parameters)", missing.ParamName, missing.ParamName))
	case errors.As(err, &many):
		return badParam(fmt.Sprintf("the parameter %s was given %d times; give it once", many.ParamName, many.Count))
	case errors.As(err, &format):
		var num *strconv.NumError
		inner := format.Err.Error()
		switch {
		case errors.As(format.Err, &num) && errors.Is(num.Err, strconv.ErrSyntax):
			return badParam(fmt.Sprintf("the parameter %s must be a whole number, not %q", format.ParamName, num.Num))
		case errors.As(format.Err, &num) && errors.Is(num.Err, strconv.ErrRange), strings.Contains(inner, "overflows"):
			return badParam(fmt.Sprintf("the parameter %s is out of range; openapi.yaml gives the values it takes", format.ParamName))
		case strings.Contains(inner, "multiple values"):
			return badParam(fmt.Sprintf("the parameter %s was given more than once; give it once", format.ParamName))
		}
		return badParam(fmt.Sprintf("the parameter %s is not valid (%s); openapi.yaml gives the values it takes", format.ParamName, inner))
	}
	return badParam(err.Error())
}

// toAPIError maps a domain error to its API form. It is the one place where broker errors
// become HTTP statuses.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var inv *broker.InvalidError
	if errors.As(err, &inv) {
		return newErr(http.StatusBadRequest, inv.Code, inv.Msg)
	}
	var se *broker.SchemaError
	if errors.As(err, &se) {
		// The reason may quote the refused value (or key) whole: keep the start (which
		// message, where) and the end (why) of the text, about maxEcho bytes each.
		return newErr(http.StatusBadRequest, apigen.ErrorCodeSchemaViolation, elide(se.Error(), 2*maxEcho)+"; nothing was written")
	}
	var conflict *broker.ConflictError
	if errors.As(err, &conflict) {
		return newErr(http.StatusConflict, apigen.ErrorCodeConflict, conflict.Msg)
	}
	var part *broker.PartlyStoredError
	if errors.As(err, &part) && errors.Is(err, broker.ErrTopicNotFound) {
		// The topic was deleted while the batch was written: the stored part went with
		// it, but a consumer may have been given it before the delete, so the answer
		// says it was stored. Retrying cannot help: 404.
		a := partlyStoredAs(part, apigen.ErrorCodeTopicNotFound, 0, "the topic was deleted while the batch was written",
			"were not stored (the stored ones may have been delivered before the delete, and are deleted with the topic)")
		a.status = http.StatusNotFound
		return a
	}
	if errors.As(err, &part) {
		switch {
		case errors.Is(err, broker.ErrTopicRecreated):
			// The topic was deleted while the batch was written, and created again
			// before the answer: the name exists, so retry (503), but the stored part
			// went to the deleted incarnation, where a consumer may have been given it.
			return partlyStoredAs(part, apigen.ErrorCodeUnavailable, 1, "the topic was deleted and created again while the batch was written",
				"were not stored (the stored ones went to the deleted topic: they may have been delivered before the delete, and are deleted with it)")
		case errors.Is(err, broker.ErrTopicGoneUnconfirmed):
			// The topic was not found where the node looked while the batch was written,
			// and whether it exists again is unknown (no controller to ask): retry, and
			// the stored part must still be said.
			return partlyStoredAs(part, apigen.ErrorCodeUnavailable, 1,
				"the topic was not found while the batch was written, and the controller could not be asked whether it exists again", "may or may not be stored")
		case errors.Is(err, broker.ErrOutcomeUnknown):
			// In a cluster: the holder of a failed partition went silent after it was sent
			// its share, which may be stored (once, there). First: with another partition's
			// disk full, "were not stored" would name this one too.
			return partlyStoredAs(part, apigen.ErrorCodeTimeout, 1,
				"the node holding a partition did not answer in time", "may or may not be stored (the outcome is unknown)")
		case (errors.Is(err, broker.ErrStorage) || errors.Is(err, broker.ErrDiskFull)) && !errors.Is(err, broker.ErrUnavailable):
			return partlyStored(err, part)
		case errors.Is(err, broker.ErrPartitionDown) || errors.Is(err, broker.ErrPeerSaturated):
			// In a cluster: the holder of a failed partition could not be reached (or
			// this node has its limit of requests to it); its share was not sent.
			return partlyStoredAs(part, apigen.ErrorCodeUnavailable, 1,
				"the node holding a partition could not be reached (or has --max-peer-inflight requests from this node)", "were not sent to it and not stored")
		case errors.Is(err, broker.ErrUnavailable) && !errors.Is(err, broker.ErrStorage):
			// In a cluster: a failed partition had no leader this node could reach (an
			// election, or too few of its replicas up); its share was not stored.
			return partlyStoredAs(part, apigen.ErrorCodeUnavailable, 1,
				"a partition had no leader this node could reach (an election may be running, or too few of its replicas are up)", "were not stored")
		default:
			// Whatever else failed, the stored part must be said: "nothing was done"
			// would make the client send the whole batch again. The status and code stay
			// those of the failure.
			status, code, why := http.StatusServiceUnavailable, apigen.ErrorCodeInternal, "a partition's share failed"
			var again *broker.PartlyStoredError
			if rest := withoutPart(err); rest != nil && !errors.As(rest, &again) {
				a := toAPIError(rest)
				status, code, why = a.status, a.code, "a partition's share failed ("+a.msg+")"
			}
			a := partlyStoredAs(part, code, 1, why, "may or may not be stored")
			a.status = status
			return a
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return newErr(http.StatusRequestEntityTooLarge, apigen.ErrorCodePayloadTooLarge, "the body is over its limit of "+strconv.FormatInt(mbe.Limit, 10)+" bytes; send less")
	case errors.Is(err, broker.ErrTopicNotFound):
		if detail, ok := strings.CutPrefix(err.Error(), broker.ErrTopicNotFound.Error()+": "); ok && detail != "" {
			return newErr(http.StatusNotFound, apigen.ErrorCodeTopicNotFound, detail) // which topic, and why
		}
		return newErr(http.StatusNotFound, apigen.ErrorCodeTopicNotFound, "no such topic; create it with POST /v1/topics")
	case errors.Is(err, broker.ErrUserNotFound):
		return newErr(http.StatusNotFound, apigen.ErrorCodeUserNotFound, "no such user; list users with GET /v1/users")
	case errors.Is(err, broker.ErrUserExists):
		return newErr(http.StatusConflict, apigen.ErrorCodeUserExists, "a user of this name exists (names are compared regardless of case); choose another name or change that user's grants")
	case errors.Is(err, broker.ErrRemoteRefused):
		return newErr(http.StatusConflict, apigen.ErrorCodeConflict, err.Error())
	case errors.Is(err, broker.ErrIncarnationMismatch):
		return newErr(http.StatusConflict, apigen.ErrorCodeIncarnationMismatch, err.Error())
	case errors.Is(err, broker.ErrChildNotFound):
		return newErr(http.StatusNotFound, apigen.ErrorCodeChildNotFound, "that topic is not a child of this one; list them with GET /v1/topics/{topic}/children")
	case errors.Is(err, broker.ErrTopicExists):
		return newErr(http.StatusConflict, apigen.ErrorCodeTopicExists, "a topic of this name exists; delete it first or choose another name")
	case errors.Is(err, broker.ErrMemberNotFound):
		return newErr(http.StatusNotFound, apigen.ErrorCodeNodeNotFound, "no member has that node id; list the members with GET /v1/cluster/members")
	case errors.Is(err, broker.ErrMoveNotFound):
		return newErr(http.StatusNotFound, apigen.ErrorCodeMoveNotFound, "no partition move has that id; list the moves with GET /v1/cluster/moves")
	case errors.Is(err, broker.ErrPartitionNotFound):
		return newErr(http.StatusNotFound, apigen.ErrorCodePartitionNotFound, "no such partition; partitions count from 0 to the topic's partitions - 1")
	case errors.Is(err, broker.ErrLeaseLost):
		return newErr(http.StatusGone, apigen.ErrorCodeLeaseLost, "the lease is no longer held: it lapsed or was handed back (the message is, or was, delivered again), or the message is settled already; do not ack it again")
	case errors.Is(err, broker.ErrBadHandle):
		return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidReceiptHandle, "the receipt handle is not one this broker issued for this topic; pass it exactly as received")
	case errors.Is(err, broker.ErrOffsetOutOfRange):
		return newErr(http.StatusBadRequest, apigen.ErrorCodeOffsetOutOfRange, "that offset has aged out of the partition; read from the partition's oldest_offset")
	case errors.Is(err, broker.ErrAckedAheadFull):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeAckedAheadFull, retryAfter: 1,
			msg: "too many messages past the ack frontier are settled; ack the oldest in-flight message of this partition first, or retry later"}
	case errors.Is(err, broker.ErrNotImplemented):
		return newErr(http.StatusNotImplemented, apigen.ErrorCodeNotImplemented, err.Error())
	case errors.Is(err, broker.ErrCorrupt):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeStorageFailed, retryAfter: 5,
			msg: "a stored message failed its checksum and is never served; read past it, or ask the operator to restore the partition from a backup (narad_storage_errors_total{op=\"corrupt_record\"})"}
	case errors.Is(err, broker.ErrOutcomeUnknown):
		// Before the disk and storage failures: a produce over several partitions joins
		// their errors, and "nothing was stored" must not cover one that may be.
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeTimeout, retryAfter: 1,
			msg: "the node holding the partition did not answer in time: the outcome is unknown (a write may be stored), retry if duplicates are acceptable"}
	case errors.Is(err, broker.ErrDiskFull):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeDiskFull, retryAfter: 5,
			msg: "the broker's disk is full and nothing was stored; retry after Retry-After seconds (the operator must free space)"}
	case errors.Is(err, broker.ErrMaybeStored):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeMaybeStored, retryAfter: 1,
			msg: "a disk write failed and the broker could not undo it: the request was not acknowledged, but it may be found stored after the node restarts, so a retry may store it twice (the operator is alerted by the narad_storage_errors_total metric)"}
	case errors.Is(err, broker.ErrStorage):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeStorageFailed, retryAfter: 1,
			msg: "a disk write failed and the request was not stored; retry later (the operator is alerted by the narad_storage_errors_total metric)"}
	case errors.Is(err, broker.ErrTooManyLongPolls):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
			msg: "the node holds its maximum of waiting consumes; retry after Retry-After seconds, or consume with a shorter wait"}
	case errors.Is(err, broker.ErrPeerSaturated):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
			msg: "this node has its limit of requests in flight to the node holding the partition (--max-peer-inflight) and did not send this one; retry after Retry-After seconds"}
	case errors.Is(err, broker.ErrPartitionDown):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
			msg: "the node holding the partition cannot be reached now and nothing was done; retry after Retry-After seconds (other partitions, and produces without a key or partition, are served)"}
	case errors.Is(err, broker.ErrUnavailable):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
			msg: "the broker cannot serve this now (starting, stopping or failing over); retry after Retry-After seconds"}
	case errors.Is(err, context.Canceled):
		// The client hung up (a long poll it gave up on); nobody reads this answer. 499
		// keeps it apart from server faults in the request metrics.
		return newErr(499, apigen.ErrorCodeTimeout, "the client closed the request")
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeTimeout, retryAfter: 1,
			msg: "the operation did not finish in time; its outcome is unknown, retry if duplicates are acceptable"}
	}
	return newErr(http.StatusInternalServerError, apigen.ErrorCodeInternal, "an unexpected error happened; please report it with the broker's log: "+err.Error())
}

// partlyStored answers a produce-batch that spanned partitions when some partitions'
// writes failed and others' succeeded. The produce-batch reply has no per-message
// results, so the message must say that part of the batch was stored: a client that
// read "not stored" would retry the whole batch believing nothing could be duplicated.
// The code stays that of the failure (storage_failed; maybe_stored when a failed write
// could not be undone; disk_full when only the disk was full) so clients keep their
// handling of it.
func partlyStored(err error, part *broker.PartlyStoredError) *apiError {
	code, retry, why := apigen.ErrorCodeStorageFailed, 1, "a disk write failed"
	if !errors.Is(err, broker.ErrStorage) {
		code, retry, why = apigen.ErrorCodeDiskFull, 5, "the broker's disk is full"
	}
	rest := "were not stored"
	if errors.Is(err, broker.ErrMaybeStored) {
		code = apigen.ErrorCodeMaybeStored
		rest = "were not acknowledged, but the broker could not undo the failed write, so they may be found stored after the node restarts"
	}
	a := partlyStoredAs(part, code, retry, why, rest)
	a.msg += " (the operator is alerted by the narad_storage_errors_total metric)"
	return a
}

// withoutPart returns err without the PartlyStoredError a batch's failure joins to the
// failed partitions' errors (nil when nothing else is left).
func withoutPart(err error) error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return nil
	}
	var rest []error
	for _, e := range j.Unwrap() {
		var p *broker.PartlyStoredError
		if !errors.As(e, &p) {
			rest = append(rest, e)
		}
	}
	return errors.Join(rest...)
}

// partlyStoredAs is the answer to a produce-batch of which part was stored: code and
// retry are those of the failure, why says what failed and rest what became of the
// failed partitions' messages.
func partlyStoredAs(part *broker.PartlyStoredError, code apigen.ErrorCode, retry int, why, rest string) *apiError {
	failed := make([]string, len(part.Failed))
	for i, p := range part.Failed {
		failed[i] = strconv.Itoa(int(p))
	}
	return &apiError{status: http.StatusServiceUnavailable, code: code, retryAfter: retry, part: part,
		msg: why + " and only part of the batch was stored: " + strconv.Itoa(part.Stored) +
			" messages went to partitions whose writes succeeded and will be delivered; the messages for partition(s) " +
			strings.Join(failed, ", ") + " " + rest + ". Retrying the whole batch stores the delivered part twice; " +
			"resend only the messages of the failed partition(s) if duplicates matter"}
}

// writeError writes err as the JSON error body.
// isFault reports whether an error answer is the node's fault, worth a warning every
// time, rather than a refusal (bad input, back-pressure, starting up, 501).
func isFault(code apigen.ErrorCode, status int) bool {
	return code == apigen.ErrorCodeInternal || code == apigen.ErrorCodeStorageFailed || code == apigen.ErrorCodeMaybeStored || code == apigen.ErrorCodeDiskFull || (code == apigen.ErrorCodeTimeout && status != 499) ||
		(code == "" && status >= 500 && status != http.StatusServiceUnavailable)
}

// findStatusWriter finds the server's statusWriter under w's wrappers, or nil.
func findStatusWriter(w http.ResponseWriter) *statusWriter {
	for {
		switch x := w.(type) {
		case *statusWriter:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

func writeError(w http.ResponseWriter, err error) {
	if sw, ok := w.(*statusWriter); ok && sw.status != 0 {
		// The answer is already on its way: writing it failed, nearly always because
		// the client hung up. Nothing more can reach the client; a second header would
		// only log "superfluous WriteHeader" and count a 500 that nobody received.
		slog.Debug("writing the response failed", "status", sw.status, "err", err)
		return
	}
	ae := toAPIError(err)
	if sw := findStatusWriter(w); sw != nil {
		// The server's wrapper writes the request's one log line (logOutcome), with
		// its request id.
		sw.code, sw.err = ae.code, err
	} else if isFault(ae.code, ae.status) {
		slog.Warn("request failed", "status", ae.status, "code", ae.code, "err", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if ae.status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Basic realm="narad", charset="UTF-8"`)
	}
	if ae.status == http.StatusServiceUnavailable {
		ra := ae.retryAfter
		if ra <= 0 {
			ra = 1
		}
		h.Set("Retry-After", strconv.Itoa(ra))
	}
	w.WriteHeader(ae.status)
	msg := elide(ae.msg, maxMessageBytes)
	b := make([]byte, 0, 64+len(msg))
	b = append(b, `{"error":{"code":`...)
	b = jsonstr.Append(b, string(ae.code))
	b = append(b, `,"message":`...)
	b = jsonstr.Append(b, msg)
	if p := ae.part; p != nil && p.Stored > 0 {
		b = append(b, `,"partly_stored":{"stored":`...)
		b = strconv.AppendInt(b, int64(p.Stored), 10)
		b = append(b, `,"failed_partitions":[`...)
		for i, fp := range p.Failed {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(fp), 10)
		}
		b = append(b, "]}"...)
	}
	b = append(b, "}}\n"...)
	_, _ = w.Write(b) // the status line is sent; a client gone away cannot be told more
}
