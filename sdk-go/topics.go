package narad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// TopicConfig is what CreateTopic sets. Zero fields take the broker's defaults.
type TopicConfig struct {
	// Partitions is the partition count (1 to 256), fixed after create.
	Partitions int
	// Retention is how long messages are kept (at least 1 s).
	Retention time.Duration
	// VisibilityTimeout is the lease length of consumed messages (100 ms to 12 h).
	VisibilityTimeout time.Duration
	// MaxInFlightPerPartition caps unacked leases per partition.
	MaxInFlightPerPartition int
	// MaxAckedAheadPerPartition caps messages settled out of order past the ack frontier.
	MaxAckedAheadPerPartition int
	// ReplicationFactor is the number of replicas per partition.
	ReplicationFactor int
	// Schema is a JSON Schema (draft 2020-12) every produced payload must match; a
	// payload that does not is refused with code schema_violation (ErrBadRequest).
	Schema json.RawMessage
	// Parent, when not "", creates the topic as a child of Parent (fan-out), receiving a
	// copy of every message committed there from now on; FanoutDelay delays those copies
	// (a delay child), atomically: if the attach is refused, the topic is not created.
	Parent      string
	FanoutDelay time.Duration
}

// TopicUpdate is what AlterTopic changes; nil fields keep their value.
type TopicUpdate struct {
	Retention                 *time.Duration
	VisibilityTimeout         *time.Duration
	MaxInFlightPerPartition   *int
	MaxAckedAheadPerPartition *int
	// Schema replaces the topic's JSON Schema; `{}` removes it.
	Schema json.RawMessage
	// ReplicationFactor is the copies each partition should have (1 to 7); the broker
	// adds or removes replicas through moves (see Moves) until each has that many.
	ReplicationFactor *int
}

// TopicInfo describes a topic. Stats is filled by Topic, not by Topics.
type TopicInfo struct {
	Name string
	// Incarnation identifies this life of the name; a topic deleted and created again
	// under the same name gets a new one.
	Incarnation               string
	Partitions                int
	Retention                 time.Duration
	VisibilityTimeout         time.Duration
	MaxInFlightPerPartition   int
	MaxAckedAheadPerPartition int
	ReplicationFactor         int
	Schema                    json.RawMessage
	Parent                    string
	FanoutDelay               time.Duration
	CreatedAt                 time.Time
	Stats                     []PartitionStats
}

// PartitionStats is one partition's offsets and queue state.
type PartitionStats struct {
	Partition int32
	// OldestOffset is the first offset still stored; NextOffset the one the next message gets.
	OldestOffset, NextOffset int64
	// HighWatermark: messages below it are durable and deliverable.
	HighWatermark int64
	// AckFrontier: every message below it is settled (or aged out).
	AckFrontier int64
	// AckedAhead counts messages at or past the frontier already settled.
	AckedAhead int64
	// InFlight counts messages under a lease now.
	InFlight int64
	// Backlog counts messages not yet settled.
	Backlog  int64
	Leader   string
	Replicas []string
	// Available is false when the node holding the partition could not be reached (or
	// is handing its leadership over): the partition answers 503 for now, and its
	// counters above are unknown and given as 0.
	Available bool
}

func ms(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	v := d.Milliseconds()
	return &v
}

func i32(n int) *int32 {
	if n <= 0 {
		return nil
	}
	v := int32(n)
	return &v
}

// CreateTopic creates a topic and returns it; it is usable at once. A name that exists
// fails with an error wrapping ErrConflict (code topic_exists).
func (c *Client) CreateTopic(ctx context.Context, name string, cfg TopicConfig) (*TopicInfo, error) {
	req := api.CreateTopicRequest{
		Name:                      name,
		Partitions:                i32(cfg.Partitions),
		RetentionMs:               ms(cfg.Retention),
		VisibilityTimeoutMs:       ms(cfg.VisibilityTimeout),
		MaxInFlightPerPartition:   i32(cfg.MaxInFlightPerPartition),
		MaxAckedAheadPerPartition: i32(cfg.MaxAckedAheadPerPartition),
		ReplicationFactor:         i32(cfg.ReplicationFactor),
	}
	if len(cfg.Schema) > 0 {
		s := cfg.Schema
		req.Schema = &s
	}
	if cfg.Parent != "" {
		p := cfg.Parent
		req.Parent = &p
		d := cfg.FanoutDelay.Milliseconds()
		req.FanoutDelayMs = &d
	}
	var out api.Topic
	if err := c.doJSON(ctx, &call{op: "create-topic", topic: name,
		build: func(s string) (*http.Request, error) { return api.NewCreateTopicRequest(s, req) }}, &out); err != nil {
		return nil, err
	}
	return topicInfo(out), nil
}

// EnsureTopic creates the topic with cfg unless it exists, and returns it either way
// (an existing topic keeps its own settings).
func (c *Client) EnsureTopic(ctx context.Context, name string, cfg TopicConfig) (*TopicInfo, error) {
	t, err := c.CreateTopic(ctx, name, cfg)
	if errors.Is(err, ErrConflict) {
		return c.Topic(ctx, name)
	}
	return t, err
}

// Topic returns a topic's settings and per-partition stats. A missing topic fails with an
// error wrapping ErrNotFound.
func (c *Client) Topic(ctx context.Context, name string) (*TopicInfo, error) {
	var out api.TopicDetail
	if err := c.doJSON(ctx, &call{op: "get-topic", topic: name,
		build: func(s string) (*http.Request, error) { return api.NewGetTopicRequest(s, name) }}, &out); err != nil {
		return nil, err
	}
	t := topicInfo(api.Topic{
		CreatedAt: out.CreatedAt, FanoutDelayMs: out.FanoutDelayMs, Incarnation: out.Incarnation,
		MaxAckedAheadPerPartition: out.MaxAckedAheadPerPartition, MaxInFlightPerPartition: out.MaxInFlightPerPartition,
		Name: out.Name, Parent: out.Parent, Partitions: out.Partitions, ReplicationFactor: out.ReplicationFactor,
		RetentionMs: out.RetentionMs, Schema: out.Schema, VisibilityTimeoutMs: out.VisibilityTimeoutMs,
	})
	t.Stats = make([]PartitionStats, len(out.PartitionStats))
	for i, p := range out.PartitionStats {
		t.Stats[i] = PartitionStats{
			Partition: p.Partition, OldestOffset: p.OldestOffset, NextOffset: p.NextOffset,
			HighWatermark: p.HighWatermark, AckFrontier: p.AckFrontier, AckedAhead: p.AckedAhead,
			InFlight: p.InFlight, Backlog: p.Backlog, Leader: p.Leader, Replicas: p.Replicas,
			Available: p.Available == nil || *p.Available,
		}
	}
	return t, nil
}

// Topics lists every topic, sorted by name, without stats.
func (c *Client) Topics(ctx context.Context) ([]TopicInfo, error) {
	var out api.TopicList
	if err := c.doJSON(ctx, &call{op: "list-topics", build: api.NewListTopicsRequest}, &out); err != nil {
		return nil, err
	}
	ts := make([]TopicInfo, len(out.Topics))
	for i, t := range out.Topics {
		ts[i] = *topicInfo(t)
	}
	return ts, nil
}

// AlterTopic changes a topic's live-tunable settings and returns the topic as it now is.
func (c *Client) AlterTopic(ctx context.Context, name string, u TopicUpdate) (*TopicInfo, error) {
	var req api.AlterTopicRequest
	if u.Retention != nil {
		req.RetentionMs = ms(*u.Retention)
	}
	if u.VisibilityTimeout != nil {
		req.VisibilityTimeoutMs = ms(*u.VisibilityTimeout)
	}
	if u.MaxInFlightPerPartition != nil {
		req.MaxInFlightPerPartition = i32(*u.MaxInFlightPerPartition)
	}
	if u.MaxAckedAheadPerPartition != nil {
		req.MaxAckedAheadPerPartition = i32(*u.MaxAckedAheadPerPartition)
	}
	if len(u.Schema) > 0 {
		s := u.Schema
		req.Schema = &s
	}
	if u.ReplicationFactor != nil {
		req.ReplicationFactor = i32(*u.ReplicationFactor)
	}
	var out api.Topic
	if err := c.doJSON(ctx, &call{op: "alter-topic", topic: name,
		build: func(s string) (*http.Request, error) { return api.NewAlterTopicRequest(s, name, req) }}, &out); err != nil {
		return nil, err
	}
	return topicInfo(out), nil
}

// DeleteTopicOption configures one DeleteTopic call.
type DeleteTopicOption func(*deleteTopicConfig)

type deleteTopicConfig struct {
	incarnation    string
	hasIncarnation bool
}

// WithDeleteIncarnation makes DeleteTopic delete the topic only while it is that
// incarnation (TopicInfo.Incarnation, as Topic, Topics or CreateTopic gave it). When
// the name is another topic now, deleted and created again since, the call fails with
// an error wrapping ErrConflict with code CodeIncarnationMismatch and nothing is
// deleted. An empty incarnation names none: the call fails with ErrInvalidOption and
// sends nothing.
func WithDeleteIncarnation(incarnation string) DeleteTopicOption {
	return func(d *deleteTopicConfig) { d.incarnation, d.hasIncarnation = incarnation, true }
}

// DeleteTopic deletes a topic's data and metadata. Its receipt handles stop working; a
// topic created later under the name is a new, empty topic. A name with no topic fails
// with an error wrapping ErrNotFound.
//
// With WithDeleteIncarnation it deletes only that incarnation of the topic: if the name
// was deleted and created again since the incarnation was read, the call fails with an
// error wrapping ErrConflict, code CodeIncarnationMismatch (not retryable), and the
// topic now under the name stays.
//
// Retries: an attempt whose reply is lost (a connection reset, a timeout, 503 timeout)
// may have deleted the topic. Without an incarnation the call is not sent again (a
// resend would delete whatever topic has the name by then, one created again meanwhile
// included): it fails with the attempt's error, Uncertain. With one, it is sent again,
// as the resend cannot delete another topic: it fails with ErrConflict
// (CodeIncarnationMismatch), or with ErrNotFound when the name has no topic. After a
// lost reply either error is Uncertain, and either way the incarnation named is gone,
// deleted by this call or by another.
func (c *Client) DeleteTopic(ctx context.Context, name string, opts ...DeleteTopicOption) error {
	var cfg deleteTopicConfig
	for _, o := range opts {
		o(&cfg)
	}
	var params *api.DeleteTopicParams
	if cfg.hasIncarnation {
		if cfg.incarnation == "" {
			return fmt.Errorf("narad: delete-topic %s: WithDeleteIncarnation(\"\") names no incarnation; nothing was deleted: %w", name, ErrInvalidOption)
		}
		inc := cfg.incarnation
		params = &api.DeleteTopicParams{Incarnation: &inc}
	}
	// Resent after a lost reply only when it names an incarnation: a resend without one
	// deletes whatever topic has the name by then.
	return c.doJSON(ctx, &call{op: "delete-topic", topic: name, unsafe: params == nil,
		build: func(s string) (*http.Request, error) { return api.NewDeleteTopicRequest(s, name, params) }}, nil)
}

func topicInfo(t api.Topic) *TopicInfo {
	out := &TopicInfo{
		Name:                      t.Name,
		Incarnation:               t.Incarnation,
		Partitions:                int(t.Partitions),
		Retention:                 time.Duration(t.RetentionMs) * time.Millisecond,
		VisibilityTimeout:         time.Duration(t.VisibilityTimeoutMs) * time.Millisecond,
		MaxInFlightPerPartition:   int(t.MaxInFlightPerPartition),
		MaxAckedAheadPerPartition: int(t.MaxAckedAheadPerPartition),
		ReplicationFactor:         int(t.ReplicationFactor),
		CreatedAt:                 t.CreatedAt,
	}
	if t.Schema != nil {
		out.Schema = *t.Schema
	}
	if t.Parent != nil {
		out.Parent = *t.Parent
	}
	if t.FanoutDelayMs != nil {
		out.FanoutDelay = time.Duration(*t.FanoutDelayMs) * time.Millisecond
	}
	return out
}
