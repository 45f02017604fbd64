package httpapi

import (
	"context"
	"math"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// The routes of partition moves and the operations made of them: rebalance and a
// forced takeover. All are admin only (authz.go); the broker decides what is possible
// (409 with its reason) and this file only checks the input and shapes the answer.

func apiMove(m broker.MoveInfo) apigen.Move {
	// The spec bounds progress to 0..1; a NaN would not even encode as JSON.
	progress := m.Progress
	switch {
	case math.IsNaN(progress) || progress < 0:
		progress = 0
	case progress > 1:
		progress = 1
	}
	out := apigen.Move{Id: m.ID, Topic: m.Topic, Partition: m.Partition, From: m.From, To: m.To,
		Status: apigen.MoveStatus(m.Status), Cause: apigen.MoveCause(m.Cause), Progress: progress,
		CreatedAtMs: m.CreatedAtMs, UpdatedAtMs: m.UpdatedAtMs}
	if m.Reason != "" {
		reason := m.Reason
		out.Reason = &reason
	}
	if m.Status == broker.MoveCopying {
		lag := int64(min(m.Lag, math.MaxInt64))
		out.Lag = &lag
	}
	return out
}

func apiMoves(ms []broker.MoveInfo) apigen.MoveList {
	out := apigen.MoveList{Moves: make([]apigen.Move, len(ms))}
	for i, m := range ms {
		out.Moves[i] = apiMove(m)
	}
	return out
}

func (h *handlers) ListMoves(ctx context.Context, _ apigen.ListMovesRequestObject) (apigen.ListMovesResponseObject, error) {
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	ms, err := cb.Moves(ctx)
	if err != nil {
		return nil, err
	}
	return apigen.ListMoves200JSONResponse(apiMoves(ms)), nil
}

// MovePartition starts a move of one replica. The broker answers an identical move
// under way with that move, so a retried request gets the same id and starts nothing.
func (h *handlers) MovePartition(ctx context.Context, req apigen.MovePartitionRequestObject) (apigen.MovePartitionResponseObject, error) {
	b := req.Body
	if b == nil {
		return nil, badParam(`send a JSON body {"topic","partition","from","to"}: the partition's replica on node from moves to node to`)
	}
	if b.Partition < 0 {
		return nil, badParam("partition must be 0 or more")
	}
	if b.From == b.To {
		return nil, badParam("from and to are the same node (" + clip(b.From, maxEcho) + "); to names the node that gets the replica, which must hold none of the partition")
	}
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	m, err := cb.StartMove(ctx, b.Topic, b.Partition, b.From, b.To)
	if err != nil {
		return nil, err
	}
	return apigen.MovePartition202JSONResponse(apiMove(m)), nil
}

func (h *handlers) CancelMove(ctx context.Context, req apigen.CancelMoveRequestObject) (apigen.CancelMoveResponseObject, error) {
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	if err := cb.CancelMove(ctx, req.Id); err != nil {
		return nil, err
	}
	return apigen.CancelMove204Response{}, nil
}

func (h *handlers) Rebalance(ctx context.Context, _ apigen.RebalanceRequestObject) (apigen.RebalanceResponseObject, error) {
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	ms, err := cb.Rebalance(ctx)
	if err != nil {
		return nil, err
	}
	return apigen.Rebalance202JSONResponse(apiMoves(ms)), nil
}

// ForceLeader makes the replica on the body's node the partition's only member, for a
// partition that lost its quorum for good.
func (h *handlers) ForceLeader(ctx context.Context, req apigen.ForceLeaderRequestObject) (apigen.ForceLeaderResponseObject, error) {
	if req.Partition < 0 {
		return nil, badParam("partition must be 0 or more")
	}
	if req.Body == nil {
		return nil, badParam(`send a JSON body {"node": "<id>"} naming the live node whose replica takes the partition over`)
	}
	cb, err := h.cluster()
	if err != nil {
		return nil, err
	}
	res, err := cb.ForceLeader(ctx, req.Topic, req.Partition, req.Body.Node)
	if err != nil {
		return nil, err
	}
	replicas := res.Replicas
	if replicas == nil {
		replicas = []string{}
	}
	return apigen.ForceLeader200JSONResponse{PossiblyLostAtLeast: int64(min(res.PossiblyLostAtLeast, math.MaxInt64)), Replicas: replicas}, nil
}
