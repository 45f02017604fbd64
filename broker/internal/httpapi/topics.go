package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/meta"
)

func topicJSON(t meta.Topic) apigen.Topic {
	out := apigen.Topic{
		Name:                      t.Name,
		Incarnation:               strconv.FormatUint(t.Incarnation, 10),
		Partitions:                t.Partitions,
		RetentionMs:               t.RetentionMs,
		VisibilityTimeoutMs:       t.VisibilityMs,
		MaxInFlightPerPartition:   t.MaxInFlight,
		MaxAckedAheadPerPartition: t.MaxAckedAhead,
		ReplicationFactor:         t.ReplicationFactor,
		CreatedAt:                 time.UnixMilli(t.CreatedAtMs).UTC(),
	}
	if len(t.Schema) > 0 {
		s := json.RawMessage(t.Schema)
		out.Schema = &s
	}
	if t.Parent != "" {
		p := t.Parent
		out.Parent = &p
		d := t.FanoutDelayMs
		out.FanoutDelayMs = &d
	}
	return out
}

func (h *handlers) CreateTopic(ctx context.Context, r apigen.CreateTopicRequestObject) (apigen.CreateTopicResponseObject, error) {
	body := r.Body
	spec := broker.TopicSpec{
		Name:              body.Name,
		OwnerID:           ownerID(ctx),
		Partitions:        body.Partitions,
		RetentionMs:       body.RetentionMs,
		VisibilityMs:      body.VisibilityTimeoutMs,
		MaxInFlight:       body.MaxInFlightPerPartition,
		MaxAckedAhead:     body.MaxAckedAheadPerPartition,
		ReplicationFactor: body.ReplicationFactor,
		Parent:            body.Parent,
		FanoutDelayMs:     body.FanoutDelayMs,
	}
	if body.Schema != nil {
		spec.Schema = *body.Schema
	}
	t, err := h.b.CreateTopic(ctx, spec)
	if err != nil {
		return nil, err
	}
	return apigen.CreateTopic201JSONResponse(topicJSON(t)), nil
}

func (h *handlers) ListTopics(ctx context.Context, _ apigen.ListTopicsRequestObject) (apigen.ListTopicsResponseObject, error) {
	ts, err := h.b.Topics()
	if err != nil {
		return nil, err
	}
	out := apigen.ListTopics200JSONResponse{Topics: make([]apigen.Topic, 0, len(ts))}
	u := principal(ctx)
	for _, t := range ts {
		if u == nil || u.IsAdmin() || h.canSee(u, t) {
			out.Topics = append(out.Topics, topicJSON(t))
		}
	}
	return out, nil
}

func (h *handlers) GetTopic(ctx context.Context, r apigen.GetTopicRequestObject) (apigen.GetTopicResponseObject, error) {
	t, parts, err := h.b.Topic(r.Topic)
	if err != nil {
		return nil, err
	}
	tj := topicJSON(t)
	out := apigen.GetTopic200JSONResponse{
		Name: tj.Name, Incarnation: tj.Incarnation, Partitions: tj.Partitions, RetentionMs: tj.RetentionMs,
		VisibilityTimeoutMs: tj.VisibilityTimeoutMs, MaxInFlightPerPartition: tj.MaxInFlightPerPartition,
		MaxAckedAheadPerPartition: tj.MaxAckedAheadPerPartition, ReplicationFactor: tj.ReplicationFactor,
		CreatedAt: tj.CreatedAt, Schema: tj.Schema, Parent: tj.Parent, FanoutDelayMs: tj.FanoutDelayMs,
		PartitionStats: make([]apigen.PartitionStats, len(parts)),
	}
	for i, p := range parts {
		s := p.Stats
		out.PartitionStats[i] = apigen.PartitionStats{
			Partition:     p.Index,
			OldestOffset:  int64(s.Oldest),
			NextOffset:    int64(s.End),
			HighWatermark: int64(s.End),
			AckFrontier:   int64(s.Frontier),
			AckedAhead:    int64(s.AckedAhead),
			InFlight:      int64(s.InFlight),
			Backlog:       int64(s.Backlog),
			Leader:        p.Leader,
			Replicas:      p.Replicas,
			Available:     &p.Available,
		}
		if ri := p.Replication; ri != nil {
			epoch := int64(ri.Epoch)
			fs := make([]apigen.FollowerStats, len(ri.Followers))
			for j, f := range ri.Followers {
				fs[j] = apigen.FollowerStats{Node: f.Node, MatchOffset: int64(f.MatchOffset), Lag: int64(f.Lag)}
			}
			out.PartitionStats[i].Epoch, out.PartitionStats[i].Followers = &epoch, &fs
		}
	}
	return out, nil
}

func (h *handlers) AlterTopic(ctx context.Context, r apigen.AlterTopicRequestObject) (apigen.AlterTopicResponseObject, error) {
	a := broker.TopicAlter{
		RetentionMs:   r.Body.RetentionMs,
		VisibilityMs:  r.Body.VisibilityTimeoutMs,
		MaxInFlight:   r.Body.MaxInFlightPerPartition,
		MaxAckedAhead: r.Body.MaxAckedAheadPerPartition,
		Schema:        r.Body.Schema,
		Incarnation:   authorizedIncarnation(ctx),
		// The broker checks it against the cluster's nodes and reaches it by moves.
		ReplicationFactor: r.Body.ReplicationFactor,
	}
	t, err := h.b.AlterTopic(ctx, r.Topic, a)
	if err != nil {
		return nil, err
	}
	return apigen.AlterTopic200JSONResponse(topicJSON(t)), nil
}

func (h *handlers) DeleteTopic(ctx context.Context, r apigen.DeleteTopicRequestObject) (apigen.DeleteTopicResponseObject, error) {
	inc := authorizedIncarnation(ctx)
	if r.Params.Incarnation != nil {
		asked, err := strconv.ParseUint(*r.Params.Incarnation, 10, 64)
		if err != nil || asked == 0 {
			return nil, badParam("incarnation must be a topic's incarnation, as GET /v1/topics/{topic} gives it (digits)")
		}
		// Another incarnation than the one the name has now (as this node knows it),
		// or than the one the caller's rights were checked on, is a mismatch rather
		// than a topic not found. The delete is pinned to the one asked for, which the
		// control plane checks again as it commits.
		m, err := h.b.TopicMeta(r.Topic)
		if err == nil && m.Incarnation != asked && (inc == 0 || inc == noTopic) {
			// This node may not have seen the topic created again yet (through
			// another node, a moment ago): ask after catching up with the controller.
			if cerr := h.b.CatchUp(ctx); cerr == nil {
				m, err = h.b.TopicMeta(r.Topic)
			}
		}
		if err == nil && m.Incarnation != asked || inc != 0 && inc != noTopic && inc != asked {
			return nil, newErr(http.StatusConflict, apigen.ErrorCodeIncarnationMismatch,
				"topic "+r.Topic+" is not incarnation "+*r.Params.Incarnation+": it was deleted and created again since; nothing was deleted (read the topic again to delete the one it is now)")
		}
		if inc != noTopic {
			inc = asked
		}
	}
	if err := h.b.DeleteTopic(ctx, r.Topic, inc); err != nil {
		if r.Params.Incarnation == nil && errors.Is(err, broker.ErrIncarnationMismatch) {
			// The caller named no incarnation: the one its rights were checked on (or the
			// one the name had as it came) is gone, which is a topic not found to it.
			return nil, fmt.Errorf("%w: topic %s was deleted while the delete was on its way (a topic of that name was created since, and stays)", broker.ErrTopicNotFound, r.Topic)
		}
		return nil, err
	}
	return apigen.DeleteTopic204Response{}, nil
}
