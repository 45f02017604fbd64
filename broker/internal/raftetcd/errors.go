package raftetcd

import (
	"errors"

	"github.com/narad-mq/narad/broker/internal/raftstore"
)

// ErrNotLeader is returned by Propose on a node that does not lead the group; the
// caller should send the proposal to the leader.
var ErrNotLeader = errors.New("raftetcd: not the group's leader")

// ErrUnknownGroup is returned for a group this host does not serve.
var ErrUnknownGroup = errors.New("raftetcd: unknown group")

// ErrBadMessage is returned for a frame or record that does not parse.
var ErrBadMessage = errors.New("raftetcd: malformed message")

// ErrClosed is returned once the host was closed.
var ErrClosed = errors.New("raftetcd: closed")

// ErrSnapshotDeferred, wrapped in the error a GroupConfig.Snapshot returns, says the
// application cannot describe its state at this index for a reason it expects to
// pass by itself (a replicated partition applying its group's log again after a
// restart, its message log ahead of the entries applied so far). The group tries again
// later as after a failure, but logs it at debug level only, once until a snapshot
// succeeds, not as a failure at every try.
var ErrSnapshotDeferred = errors.New("raftetcd: the application defers its snapshot")

// errNoSnapshots is the spike's wal store's answer to a snapshot or compaction.
var errNoSnapshots = errors.New("raftetcd: the wal store keeps the whole log; it takes no snapshots")

// ErrCorrupt is returned by OpenGroup (wrapped) when the group's own log or state on
// this node fails its checks: the store's raftstore.ErrCorrupt, so that callers above
// need not know the store.
var ErrCorrupt = raftstore.ErrCorrupt
