package narad

import (
	"context"
	"net/http"

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

// Move is a partition replica move the broker has started.
type Move struct {
	Topic     string
	Partition int32
	From, To  string
	// Status is "started", "copying", "switching", "done" or "failed".
	Status string
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

// Decommission starts moving a member's partitions elsewhere and then removes it
// (admin only). It returns once the broker has started; a broker that does not offer
// it yet fails with an error wrapping ErrNotImplemented, an unknown node ErrNotFound.
func (c *Client) Decommission(ctx context.Context, node string) (*Member, error) {
	var out api.Member
	if err := c.doJSON(ctx, &call{op: "decommission-member",
		build: func(s string) (*http.Request, error) { return api.NewDecommissionMemberRequest(s, node) }}, &out); err != nil {
		return nil, err
	}
	m := memberOf(out)
	return &m, nil
}

// MovePartition starts moving one replica of a partition from one node to another
// (admin only) and returns once the broker has started it. A broker that does not offer
// it yet fails with an error wrapping ErrNotImplemented.
func (c *Client) MovePartition(ctx context.Context, topic string, partition int32, from, to string) (*Move, error) {
	req := api.MoveRequest{Topic: topic, Partition: partition, From: from, To: to}
	var out api.Move
	if err := c.doJSON(ctx, &call{op: "move-partition", topic: topic,
		build: func(s string) (*http.Request, error) { return api.NewMovePartitionRequest(s, req) }}, &out); err != nil {
		return nil, err
	}
	return &Move{Topic: out.Topic, Partition: out.Partition, From: out.From, To: out.To, Status: string(out.Status)}, nil
}
