package broker

import (
	"context"
	"errors"
)

// ErrMoveNotFound: no move of that id.
var ErrMoveNotFound = errors.New("move not found")

// ErrMemberNotFound: no member of that node id.
var ErrMemberNotFound = errors.New("member not found")

// Move statuses, in the order a move goes through them. A move can be cancelled
// only while copying; once switching, it finishes.
const (
	MoveCopying   = "copying"   // the new replica is being added and caught up
	MoveSwitching = "switching" // the replica set is switched in the control plane; the partition's group follows
	MoveRemoving  = "removing"  // the group runs on the new set; the old replica deletes its copy
	MoveDone      = "done"
	MoveCancelled = "cancelled"
	MoveFailed    = "failed"
)

// MoveInfo is one move of a partition replica.
type MoveInfo struct {
	ID        string
	Topic     string
	Partition int32
	// From is the node whose replica goes ("" when a replica is only added: a raised
	// replication factor); To the node that gets one ("" when a replica is only
	// removed: a lowered replication factor).
	From, To string
	Status   string
	// Reason says why a move failed or was cancelled ("" otherwise).
	Reason string
	// Cause is what started it: request, decommission, replace, rebalance or
	// replication_factor.
	Cause string
	// Progress is the share (0 to 1) of the partition's log the new replica holds;
	// Lag the messages it is behind while copying.
	Progress float64
	Lag      uint64
	// CreatedAtMs and UpdatedAtMs are when the move started and last changed status.
	CreatedAtMs, UpdatedAtMs int64
}

// ForceLeaderResult is the answer of a forced takeover.
type ForceLeaderResult struct {
	// PossiblyLostAtLeast is the highest high watermark any replica reported to the
	// control plane minus the survivor's log end: a lower bound of the messages lost.
	PossiblyLostAtLeast uint64
	// Replicas is the partition's replica set right after the takeover.
	Replicas []string
}

// StartMove moves the replica of partition p of topic from node from to node to. An
// identical move already under way is returned as it is (a retry). Errors:
// ErrTopicNotFound, ErrPartitionNotFound, ErrMemberNotFound (from or to unknown),
// *ConflictError (to dead or already a replica, from not a replica, another move of
// the partition under way, the cluster version too old), ErrUnavailable.
func (b *Broker) StartMove(ctx context.Context, topic string, p int32, from, to string) (MoveInfo, error) {
	return MoveInfo{}, ErrNotImplemented
}

// Moves lists every move the control plane holds, newest first.
func (b *Broker) Moves(ctx context.Context) ([]MoveInfo, error) {
	return nil, ErrNotImplemented
}

// CancelMove cancels move id while it is copying. Errors: ErrMoveNotFound;
// *ConflictError once it switched (or ended).
func (b *Broker) CancelMove(ctx context.Context, id string) error {
	return ErrNotImplemented
}

// Decommission starts moving every replica off node and removes it once it holds
// nothing; a dead node's replicas are re-replicated from the survivors. A repeat
// returns the member as it is. Errors: ErrMemberNotFound; *ConflictError (the last
// node, or no live node to take a replica).
func (b *Broker) Decommission(ctx context.Context, node string) (MemberInfo, error) {
	return MemberInfo{}, ErrNotImplemented
}

// Rebalance starts the moves that even out replicas and leaders over the members
// (a bounded number at once; the controller starts the rest as those finish) and
// returns those it started.
func (b *Broker) Rebalance(ctx context.Context) ([]MoveInfo, error) {
	return nil, ErrNotImplemented
}

// ForceLeader makes the replica on node the only member of partition p's new
// replica set (then grown back to the topic's replication factor), for a partition
// that lost its quorum for good. Errors: ErrTopicNotFound, ErrPartitionNotFound,
// ErrMemberNotFound, *ConflictError (node holds no replica of it, or is not live).
func (b *Broker) ForceLeader(ctx context.Context, topic string, p int32, node string) (ForceLeaderResult, error) {
	return ForceLeaderResult{}, ErrNotImplemented
}
