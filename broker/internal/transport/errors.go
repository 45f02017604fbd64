package transport

import (
	"context"
	"errors"
	"fmt"
)

// ErrUnknownOp means the peer has no handler for the operation: a caller newer than
// the peer, or a typo. It is not worth retrying against the same peer.
var ErrUnknownOp = errors.New("transport: unknown operation")

// ErrUnsupportedVersion means the peer does not speak this frame or handshake version.
var ErrUnsupportedVersion = errors.New("transport: unsupported protocol version")

// ErrUnknownKind means the peer does not know the kind of stream that was opened.
var ErrUnknownKind = errors.New("transport: unknown stream kind")

// ErrUnauthenticated means the connection failed the cluster-secret handshake, in
// either direction: the peer does not hold a secret this node holds, or is not a node.
var ErrUnauthenticated = errors.New("transport: peer failed authentication")

// ErrPeerUnavailable means no authenticated connection to the peer could be had or
// kept: it is down, unreachable, shutting down, or refusing connections for now.
var ErrPeerUnavailable = errors.New("transport: peer unavailable")

// ErrTimeout means the call's deadline passed before the answer arrived. The request
// may or may not have been handled by the peer.
var ErrTimeout = errors.New("transport: deadline exceeded")

// ErrFrameTooLarge means a request or response is larger than the receiver accepts
// (Options.MaxFrameSize, on whichever side refused it).
var ErrFrameTooLarge = errors.New("transport: frame too large")

// ErrBusy means the peer already serves its maximum of concurrent requests on this
// connection and refused the request without running it; it is safe to retry later.
var ErrBusy = errors.New("transport: peer busy")

// ErrBadFrame means a frame could not be decoded: a truncated or corrupt header.
var ErrBadFrame = errors.New("transport: malformed frame")

// ErrNotSent is matched, besides the error's own sentinel, by every Call error that
// arose before the request's stream existed (no connection, a closed node, a stream
// that could not be opened): the peer certainly never saw the request, so even a
// request that is not idempotent may be sent again. Errors without it leave the
// outcome unknown.
var ErrNotSent = errors.New("transport: request not sent")

// ErrClosed means this node's transport was closed.
var ErrClosed = errors.New("transport: closed")

// ErrSecretTooShort means a configured cluster secret is shorter than MinSecretLen.
var ErrSecretTooShort = errors.New("transport: cluster secret too short")

// ErrRemote is matched by every error a peer's handler returned; the *RemoteError
// carries its code and message.
var ErrRemote = errors.New("transport: remote handler error")

// Status codes carried in a response frame. Codes below CodeFirstApp belong to the
// transport; handlers may use CodeFirstApp and above through *RemoteError.
const (
	CodeOK                 uint16 = 0
	CodeUnknownOp          uint16 = 1
	CodeUnsupportedVersion uint16 = 2
	CodeFrameTooLarge      uint16 = 3
	CodeBusy               uint16 = 4
	CodeTimeout            uint16 = 5
	CodeBadFrame           uint16 = 6
	CodeUnknownKind        uint16 = 7
	CodeShuttingDown       uint16 = 8
	// CodeHandler is a handler error that carried no code of its own.
	CodeHandler uint16 = 9
	// CodeFirstApp is the first code free for handlers' own errors.
	CodeFirstApp uint16 = 256
)

// maxErrorMessage bounds the text of an error sent over the wire.
const maxErrorMessage = 1024

// RemoteError is an error answered by a peer: a transport refusal (unknown op, busy,
// too large...) or a handler's error. errors.Is matches it to the sentinel of its code,
// so callers can test errors.Is(err, ErrUnknownOp) without caring where it arose.
type RemoteError struct {
	// Code is the status code from the response frame (never CodeOK).
	Code uint16
	// Message is the peer's human-readable text (at most 1 KiB).
	Message string
}

// Error implements error.
func (e *RemoteError) Error() string {
	return fmt.Sprintf("transport: remote error %d: %s", e.Code, e.Message)
}

// Is matches the sentinel that stands for the code, and ErrRemote for handler codes.
func (e *RemoteError) Is(target error) bool {
	return codeSentinel(e.Code) == target
}

func codeSentinel(code uint16) error {
	switch code {
	case CodeUnknownOp:
		return ErrUnknownOp
	case CodeUnsupportedVersion:
		return ErrUnsupportedVersion
	case CodeFrameTooLarge:
		return ErrFrameTooLarge
	case CodeBusy:
		return ErrBusy
	case CodeTimeout:
		return ErrTimeout
	case CodeBadFrame:
		return ErrBadFrame
	case CodeUnknownKind:
		return ErrUnknownKind
	case CodeShuttingDown:
		return ErrPeerUnavailable
	default:
		return ErrRemote
	}
}

// errorCode picks the wire code for a handler's error: its own when it is a
// *RemoteError, else the code of a transport sentinel it wraps, else CodeHandler.
func errorCode(err error) (uint16, string) {
	var re *RemoteError
	if errors.As(err, &re) && re.Code != CodeOK {
		return re.Code, re.Message
	}
	msg := err.Error()
	switch {
	case errors.Is(err, ErrUnknownOp):
		return CodeUnknownOp, msg
	case errors.Is(err, ErrBusy):
		return CodeBusy, msg
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return CodeTimeout, msg
	}
	return CodeHandler, msg
}

func truncateMessage(s string) string {
	if len(s) > maxErrorMessage {
		return s[:maxErrorMessage]
	}
	return s
}
