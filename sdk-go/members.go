package narad

import (
	"context"
	"net/http"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Member is one node of the cluster as the controller sees it.
type Member struct {
	ID string
	// Address is the node-to-node address; HTTPAddress the API address ("" when the
	// node has not said).
	Address     string
	HTTPAddress string
	// Status is "alive", "suspect", "dead", "joining" or "decommissioning".
	Status string
	// Voter says whether the member votes in the control plane.
	Voter bool
	// PartitionsHeld and PartitionsLed count its replicas and the partitions it leads.
	PartitionsHeld, PartitionsLed int
	// MinVersion and MaxVersion are the cluster versions the member last reported it
	// speaks (0 from brokers that do not send them).
	MinVersion, MaxVersion int
}

// ClusterInfo is one node's view of its cluster.
type ClusterInfo struct {
	// ClusterID is "" from brokers that do not send one.
	ClusterID  string
	NodeID     string
	Controller string
	// Version is the cluster version the controller committed (0 from brokers that do
	// not send one); see the broker's docs on rolling upgrades.
	Version int
	Members []Member
}

// Move statuses, in the order a move goes through them. A move can be cancelled only
// while copying; once switching, it finishes.
const (
	MoveCopying   = "copying"   // the new replica is added and catches up
	MoveSwitching = "switching" // the replica set is switched in the control plane
	MoveRemoving  = "removing"  // the old replica deletes its copy
	MoveDone      = "done"
	MoveCancelled = "cancelled"
	MoveFailed    = "failed"
)

// Move is a move of one partition replica from one node to another.
type Move struct {
	// ID names the move, for CancelMove.
	ID        string
	Topic     string
	Partition int32
	// From is the node whose replica goes ("" when a replica is only added, by a raised
	// replication factor); To the node that gets one ("" when one is only removed).
	From, To string
	// Status is one of the Move* constants.
	Status string
	// Reason says why the move failed or was cancelled ("" otherwise).
	Reason string
	// Cause is what started it: "request", "decommission", "replace", "rebalance" or
	// "replication_factor".
	Cause string
	// Progress is the share (0 to 1) of the partition's log the new replica holds; Lag
	// how many messages it is behind while copying (0 otherwise).
	Progress float64
	Lag      int64
	// Created is when the move started, Updated when its status last changed.
	Created, Updated time.Time
}

// ForceLeaderResult is the outcome of ForceLeader.
type ForceLeaderResult struct {
	// PossiblyLostAtLeast is a lower bound of the messages lost: the highest high
	// watermark any replica reported to the control plane minus the log end of the
	// replica that took over. More may be lost; 0 proves nothing.
	PossiblyLostAtLeast int64
	// Replicas is the partition's replica set right after the takeover; the broker
	// grows it back to the topic's replication factor through moves.
	Replicas []string
}

func moveOf(m api.Move) Move {
	out := Move{ID: m.Id, Topic: m.Topic, Partition: m.Partition, From: m.From, To: m.To, Status: string(m.Status),
		Cause: string(m.Cause), Progress: m.Progress, Created: time.UnixMilli(m.CreatedAtMs), Updated: time.UnixMilli(m.UpdatedAtMs)}
	if m.Reason != nil {
		out.Reason = *m.Reason
	}
	if m.Lag != nil {
		out.Lag = *m.Lag
	}
	return out
}

func movesOf(ms []api.Move) []Move {
	out := make([]Move, len(ms))
	for i, m := range ms {
		out[i] = moveOf(m)
	}
	return out
}

func memberOf(m api.Member) Member {
	out := Member{ID: m.Id, Address: m.Address, Status: string(m.Status)}
	if m.HttpAddress != nil {
		out.HTTPAddress = *m.HttpAddress
	}
	if m.Voter != nil {
		out.Voter = *m.Voter
	}
	if m.PartitionsHeld != nil {
		out.PartitionsHeld = int(*m.PartitionsHeld)
	}
	if m.PartitionsLed != nil {
		out.PartitionsLed = int(*m.PartitionsLed)
	}
	if m.MinVersion != nil {
		out.MinVersion = int(*m.MinVersion)
	}
	if m.MaxVersion != nil {
		out.MaxVersion = int(*m.MaxVersion)
	}
	return out
}

// Cluster returns the answering node's view of the cluster: its id, the controller
// and the members. A single node is a cluster of one.
func (c *Client) Cluster(ctx context.Context) (*ClusterInfo, error) {
	var out api.Cluster
	if err := c.doJSON(ctx, &call{op: "get-cluster", build: api.NewGetClusterRequest}, &out); err != nil {
		return nil, err
	}
	info := &ClusterInfo{NodeID: out.NodeId, Controller: out.Controller, Members: make([]Member, len(out.Members))}
	if out.ClusterId != nil {
		info.ClusterID = *out.ClusterId
	}
	if out.Version != nil {
		info.Version = int(*out.Version)
	}
	for i, m := range out.Members {
		info.Members[i] = memberOf(m)
	}
	return info, nil
}

// Members lists the cluster's members.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	var out api.MemberList
	if err := c.doJSON(ctx, &call{op: "list-members", build: api.NewListMembersRequest}, &out); err != nil {
		return nil, err
	}
	ms := make([]Member, len(out.Members))
	for i, m := range out.Members {
		ms[i] = memberOf(m)
	}
	return ms, nil
}

// Decommission starts moving every replica off a member and removes it once it holds
// nothing (admin only); a dead member's replicas are copied again from the survivors.
// It returns the member, "decommissioning", once the broker has started; the member
// disappears from Members when it is done. A repeat returns the member as it is, so it
// is safe to retry. An unknown node fails with ErrNotFound; the last node, or one whose
// replicas no live node can take, with ErrConflict.
func (c *Client) Decommission(ctx context.Context, node string) (*Member, error) {
	var out api.Member
	if err := c.doJSON(ctx, &call{op: "decommission-member",
		build: func(s string) (*http.Request, error) { return api.NewDecommissionMemberRequest(s, node) }}, &out); err != nil {
		return nil, err
	}
	m := memberOf(out)
	return &m, nil
}

// MovePartition starts moving the replica of a partition on node from to node to
// (admin only) and returns the move once the broker has started it; Moves follows it.
// An identical move under way is returned as it is (the same ID), so it is safe to
// retry. ErrNotFound for an unknown topic, partition or node; ErrConflict, with the
// broker's reason, when the move is impossible (to is dead or holds a replica already,
// from holds none, another move of the partition is under way).
func (c *Client) MovePartition(ctx context.Context, topic string, partition int32, from, to string) (*Move, error) {
	req := api.MoveRequest{Topic: topic, Partition: partition, From: from, To: to}
	var out api.Move
	if err := c.doJSON(ctx, &call{op: "move-partition", topic: topic,
		build: func(s string) (*http.Request, error) { return api.NewMovePartitionRequest(s, req) }}, &out); err != nil {
		return nil, err
	}
	m := moveOf(out)
	return &m, nil
}

// Moves lists every partition move the cluster holds, newest first, with its status
// and progress (admin only).
func (c *Client) Moves(ctx context.Context) ([]Move, error) {
	var out api.MoveList
	if err := c.doJSON(ctx, &call{op: "list-moves", build: api.NewListMovesRequest}, &out); err != nil {
		return nil, err
	}
	return movesOf(out.Moves), nil
}

// CancelMove cancels a move that is still copying (admin only). ErrNotFound when no
// move has that ID; ErrConflict once it is switching (it finishes) or has ended.
func (c *Client) CancelMove(ctx context.Context, id string) error {
	return c.doJSON(ctx, &call{op: "cancel-move",
		build: func(s string) (*http.Request, error) { return api.NewCancelMoveRequest(s, id) }}, nil)
}

// Rebalance starts the moves that even out replicas and leaders over the members
// (admin only) and returns those it started now; the broker starts the rest as they
// finish. A repeat starts only what is still needed, so it is safe to retry.
func (c *Client) Rebalance(ctx context.Context) ([]Move, error) {
	var out api.MoveList
	if err := c.doJSON(ctx, &call{op: "rebalance", build: api.NewRebalanceRequest}, &out); err != nil {
		return nil, err
	}
	return movesOf(out.Moves), nil
}

// ForceLeader makes the replica on node the only member of a partition that lost a
// majority of its replicas for good, and leader of what it holds (admin only); the
// broker then grows the replica set back to the topic's replication factor. Messages
// only the lost replicas held are lost: see ForceLeaderResult.PossiblyLostAtLeast. The
// old members are refused as replicas of the partition until their data of it is
// wiped. An attempt whose outcome is unknown is not retried (the error is Uncertain):
// check the partition's replicas with Topic before asking again. ErrConflict when node
// holds no replica of the partition or is not live.
func (c *Client) ForceLeader(ctx context.Context, topic string, partition int32, node string) (*ForceLeaderResult, error) {
	req := api.ForceLeaderRequest{Node: node}
	var out api.ForceLeaderResult
	if err := c.doJSON(ctx, &call{op: "force-leader", topic: topic, unsafe: true,
		build: func(s string) (*http.Request, error) { return api.NewForceLeaderRequest(s, topic, partition, req) }}, &out); err != nil {
		return nil, err
	}
	return &ForceLeaderResult{PossiblyLostAtLeast: out.PossiblyLostAtLeast, Replicas: out.Replicas}, nil
}
