package httpapi

import (
	"context"
	"errors"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// GetTopicStats answers a topic's recent samples (see broker/stats.go). The grants are
// those of GetTopic: a user who may not see the topic gets the 404 of a missing one.
func (h *handlers) GetTopicStats(ctx context.Context, r apigen.GetTopicStatsRequestObject) (apigen.GetTopicStatsResponseObject, error) {
	st, err := h.b.TopicStats(r.Topic)
	if err != nil {
		return nil, err
	}
	return apigen.GetTopicStats200JSONResponse(topicStatsJSON(st, h.b.NodeID())), nil
}

// ListTopicStats answers the samples of every topic the caller may see, as ListTopics
// filters its list.
func (h *handlers) ListTopicStats(ctx context.Context, _ apigen.ListTopicStatsRequestObject) (apigen.ListTopicStatsResponseObject, error) {
	ts, err := h.b.Topics()
	if err != nil {
		return nil, err
	}
	node := h.b.NodeID()
	out := apigen.ListTopicStats200JSONResponse{Node: node, IntervalMs: h.b.StatsInterval().Milliseconds(), Topics: make([]apigen.TopicStats, 0, len(ts))}
	u := principal(ctx)
	for _, t := range ts {
		if u != nil && !u.IsAdmin() && !h.canSee(u, t) {
			continue
		}
		st, err := h.b.TopicStats(t.Name)
		if errors.Is(err, broker.ErrTopicNotFound) {
			continue // deleted since the list was read
		}
		if err != nil {
			return nil, err
		}
		out.Topics = append(out.Topics, topicStatsJSON(st, node))
	}
	// The node's disk and sync figures are what /metrics shows, so the same callers
	// see them: admins, or anyone with security off.
	if u == nil || u.IsAdmin() {
		out.NodeHealth = nodeHealthJSON(h.b.NodeStats())
	}
	return out, nil
}

func nodeHealthJSON(ns broker.NodeStats) *apigen.NodeHealth {
	out := &apigen.NodeHealth{Id: ns.NodeID, Ready: ns.Ready, SyncMode: apigen.NodeHealthSyncMode(ns.SyncMode)}
	if ns.DiskKnown {
		free, size := int64(ns.DiskFreeBytes), int64(ns.DiskSizeBytes)
		out.DiskFreeBytes, out.DiskSizeBytes = &free, &size
	}
	if s := ns.Sync; s != nil {
		out.Sync = &apigen.SyncRounds{
			AtMs: s.AtMs, IntervalMs: s.IntervalMs, Rounds: int64(s.Rounds), Files: int64(s.Files),
			RoundsPerSecond: s.RoundsHz, MeanMs: ms(s.Mean), MaxMs: ms(s.Max),
		}
	}
	return out
}

// ms is a duration in milliseconds, with the fraction (sync rounds take well under one).
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func topicStatsJSON(st broker.TopicStats, node string) apigen.TopicStats {
	out := apigen.TopicStats{Topic: st.Topic, Node: node, IntervalMs: st.IntervalMs, Samples: make([]apigen.StatsSample, len(st.Samples))}
	for i, s := range st.Samples {
		out.Samples[i] = apigen.StatsSample{
			AtMs: s.AtMs, Produced: int64(s.Produced), Acked: int64(s.Acked),
			ProduceRate: s.ProduceHz, AckRate: s.AckHz,
			Backlog: s.Backlog, InFlight: s.InFlight, OldestUnackedAgeMs: s.OldestAgeMs,
		}
	}
	return out
}
