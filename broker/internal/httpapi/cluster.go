package httpapi

import (
	"context"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// ClusterBroker is what the cluster routes need of the broker. It is kept apart from
// Broker (handlers.go) until the two are merged; a Broker without it answers 501.
type ClusterBroker interface {
	ClusterID() string
	ClusterVersion() int
	Controller() string
	Members() ([]broker.MemberInfo, error)
	AddMember(ctx context.Context, nodeID, addr string) error
	Decommission(ctx context.Context, node string) (broker.MemberInfo, error)
	// Partition moves and the operations made of them (moves.go).
	StartMove(ctx context.Context, topic string, p int32, from, to string) (broker.MoveInfo, error)
	Moves(ctx context.Context) ([]broker.MoveInfo, error)
	CancelMove(ctx context.Context, id string) error
	Rebalance(ctx context.Context) ([]broker.MoveInfo, error)
	ForceLeader(ctx context.Context, topic string, p int32, node string) (broker.ForceLeaderResult, error)
}

var _ ClusterBroker = (*broker.Broker)(nil)

func (h *handlers) cluster() (ClusterBroker, error) {
	cb, ok := h.b.(ClusterBroker)
	if !ok {
		return nil, notYet("clustering")
	}
	return cb, nil
}

func apiMember(m broker.MemberInfo) apigen.Member {
	voter := m.Voter
	held, led := int32(m.PartitionsHeld), int32(m.PartitionsLed)
	lo, hi := m.Versions()
	minV, maxV := int32(lo), int32(hi)
	out := apigen.Member{Id: m.ID, Address: m.ClusterAddr, Status: apigen.MemberStatus(m.Status), Voter: &voter, PartitionsHeld: &held, PartitionsLed: &led,
		MinVersion: &minV, MaxVersion: &maxV}
	if m.HTTPAddr != "" {
		addr := m.HTTPAddr
		out.HttpAddress = &addr
	}
	return out
}

func (h *handlers) members() ([]apigen.Member, error) {
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	ms, err := cb.Members()
	if err != nil {
		return nil, err
	}
	out := make([]apigen.Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, apiMember(m))
	}
	return out, nil
}

// GetCluster describes the cluster as this node's replica of the metadata knows it.
func (h *handlers) GetCluster(ctx context.Context, _ apigen.GetClusterRequestObject) (apigen.GetClusterResponseObject, error) {
	ms, err := h.members()
	if err != nil {
		return nil, err
	}
	cb, _ := h.cluster()
	v := int32(cb.ClusterVersion())
	resp := apigen.GetCluster200JSONResponse{NodeId: h.b.NodeID(), Controller: cb.Controller(), Members: ms, Version: &v}
	if id := cb.ClusterID(); id != "" {
		resp.ClusterId = &id
	}
	return resp, nil
}

func (h *handlers) ListMembers(ctx context.Context, _ apigen.ListMembersRequestObject) (apigen.ListMembersResponseObject, error) {
	ms, err := h.members()
	if err != nil {
		return nil, err
	}
	return apigen.ListMembers200JSONResponse{Members: ms}, nil
}

// JoinMember admits the node at the body's address through the controller (admin only,
// see authz.go).
func (h *handlers) JoinMember(ctx context.Context, req apigen.JoinMemberRequestObject) (apigen.JoinMemberResponseObject, error) {
	if req.Body == nil || req.Body.Id == "" || req.Body.Address == "" {
		return nil, badParam("send a JSON body with the node's id and its node-plane address")
	}
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	if err := cb.AddMember(ctx, req.Body.Id, req.Body.Address); err != nil {
		return nil, err
	}
	ms, err := cb.Members()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.ID == req.Body.Id {
			return apigen.JoinMember201JSONResponse(apiMember(m)), nil
		}
	}
	// Admitted, but this node's replica has not applied the record yet.
	return apigen.JoinMember201JSONResponse(apigen.Member{Id: req.Body.Id, Address: req.Body.Address, Status: apigen.Joining}), nil
}

// DecommissionMember starts moving every replica off the node and removing it (admin
// only). A repeat answers the member as it is, so a client may retry it freely.
func (h *handlers) DecommissionMember(ctx context.Context, req apigen.DecommissionMemberRequestObject) (apigen.DecommissionMemberResponseObject, error) {
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	m, err := cb.Decommission(ctx, req.Node)
	if err != nil {
		return nil, err
	}
	return apigen.DecommissionMember202JSONResponse(apiMember(m)), nil
}
