package raftnet

import "errors"

// ErrBadMessage is returned for a request or answer that does not parse.
var ErrBadMessage = errors.New("raftnet: malformed message")

// ErrUnknownGroup is answered when the receiving node hosts no such group (yet, or any
// more); raft retries with its usual backoff.
var ErrUnknownGroup = errors.New("raftnet: unknown group")

// ErrRemote wraps an error the peer's raft answered for one request.
var ErrRemote = errors.New("raftnet: remote error")

// ErrSnapshotUnsupported is returned by InstallSnapshot: the spike streams no
// snapshots (see docs/internals/replication.md for the design that will).
var ErrSnapshotUnsupported = errors.New("raftnet: InstallSnapshot is not implemented")

// ErrClosed is returned once the mux or the group's transport was closed.
var ErrClosed = errors.New("raftnet: closed")

// ErrTimeout is returned when raft's RPC got no answer in time.
var ErrTimeout = errors.New("raftnet: timed out")
