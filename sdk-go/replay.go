package narad

import (
	"context"
	"encoding/json"
	"iter"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Position is where a replay starts, per partition: Offsets holds the next offset to
// read of each partition named; partitions not named start at the first message written
// at or after Time, or at the oldest retained message when Time is zero. Positions are
// plain data: store them (as JSON, say) and resume from them later.
type Position struct {
	Offsets map[int32]int64 `json:"offsets,omitempty"`
	Time    time.Time       `json:"time,omitzero"`
}

// FromStart is the position of the oldest retained message of every partition.
func FromStart() Position { return Position{} }

// FromTime is the position of the first message written at or after t, per partition.
func FromTime(t time.Time) Position { return Position{Time: t} }

// FromOffsets starts each named partition at its offset (others at the oldest).
func FromOffsets(offsets map[int32]int64) Position {
	return Position{Offsets: maps.Clone(offsets)}
}

// Advance moves the position past m, so that a replay from it resumes after m.
func (p *Position) Advance(m *Message) {
	if p.Offsets == nil {
		p.Offsets = make(map[int32]int64)
	}
	if m.Offset+1 > p.Offsets[m.Partition] {
		p.Offsets[m.Partition] = m.Offset + 1
	}
}

// Clone returns an independent copy.
func (p Position) Clone() Position {
	return Position{Offsets: maps.Clone(p.Offsets), Time: p.Time}
}

// ReplayOption configures Replay.
type ReplayOption func(*replayConfig)

type replayConfig struct {
	follow     bool
	partitions []int32
	batch      int
	interval   time.Duration
}

// Follow keeps the replay going after it reaches the end: it waits for new messages
// (polling every WithFollowInterval) until ctx ends or the loop breaks.
func Follow() ReplayOption { return func(c *replayConfig) { c.follow = true } }

// OnlyPartitions limits the replay to the given partitions.
func OnlyPartitions(ps ...int32) ReplayOption {
	return func(c *replayConfig) { c.partitions = slices.Clone(ps) }
}

// WithReplayBatch reads up to n messages per request (default 100, at most 1000).
func WithReplayBatch(n int) ReplayOption {
	return func(c *replayConfig) { c.batch = min(max(n, 1), MaxBatchMessages) }
}

// WithFollowInterval sets how long a following replay waits after finding nothing new
// (default 500 ms).
func WithFollowInterval(d time.Duration) ReplayOption {
	return func(c *replayConfig) { c.interval = max(d, time.Millisecond) }
}

// Replay reads topic's log from a Position without taking leases, in log order within
// each partition. Without Follow it stops at the end each partition had when the replay
// began; with Follow it goes on waiting for new messages. Advance a Position with each
// message to resume later. Messages hold no lease: Ack fails with ErrNoLease.
//
// A failure is yielded as (nil, err). After a terminal one (the topic not found, say)
// the sequence ends; after a transient one it goes on, after a backoff, if the loop
// continues.
func (c *Client) Replay(ctx context.Context, topic string, from Position, opts ...ReplayOption) iter.Seq2[*Message, error] {
	cfg := replayConfig{batch: 100, interval: 500 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	return func(yield func(*Message, error) bool) {
		bo := c.cfg.retry.Backoff()
		var info *TopicInfo
		for {
			var err error
			info, err = c.Topic(ctx, topic)
			if err == nil {
				break
			}
			if !yield(nil, err) || terminal(err) || ctx.Err() != nil || !sleepCtx(ctx, bo.NextBackOff()) {
				return
			}
		}
		parts := cfg.partitions
		if parts == nil {
			for _, s := range info.Stats {
				parts = append(parts, s.Partition)
			}
		}
		end := make(map[int32]int64, len(info.Stats))
		for _, s := range info.Stats {
			end[s.Partition] = s.NextOffset
		}
		next := make(map[int32]int64, len(parts))
		known := make(map[int32]bool, len(parts))
		for _, p := range parts {
			if o, ok := from.Offsets[p]; ok {
				next[p], known[p] = o, true
			}
		}
		active := slices.Clone(parts)
		for len(active) > 0 {
			progressed := false
			for i := 0; i < len(active); i++ {
				p := active[i]
				if !cfg.follow && known[p] && next[p] >= end[p] {
					active = slices.Delete(active, i, i+1)
					i--
					continue
				}
				msgs, nextOff, err := c.readRange(ctx, topic, p, next[p], known[p], from.Time, cfg.batch)
				if err != nil {
					if !yield(nil, err) || terminal(err) || ctx.Err() != nil || !sleepCtx(ctx, bo.NextBackOff()) {
						return
					}
					continue
				}
				bo.Reset()
				for _, m := range msgs {
					if !cfg.follow && m.Offset >= end[p] {
						break
					}
					if !yield(m, nil) {
						return
					}
				}
				stalled := len(msgs) == 0 && known[p] && nextOff <= next[p]
				if nextOff > next[p] || !known[p] {
					next[p], known[p] = nextOff, true
				}
				if len(msgs) > 0 {
					progressed = true
				}
				if !cfg.follow && (stalled || next[p] >= end[p]) {
					active = slices.Delete(active, i, i+1)
					i--
				}
			}
			if cfg.follow && !progressed && !sleepCtx(ctx, cfg.interval) {
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
	}
}

func (c *Client) readRange(ctx context.Context, topic string, part int32, from int64, useFrom bool, t time.Time, max int) ([]*Message, int64, error) {
	params := &api.ReadMessagesParams{Max: ptr(int32(max)), PayloadEncoding: ptr(api.ReadMessagesParamsPayloadEncodingBase64)}
	switch {
	case useFrom:
		params.From = &from
	case !t.IsZero():
		params.FromTime = ptr(strconv.FormatInt(t.UnixMilli(), 10))
	}
	rep, err := c.do(ctx, &call{op: "read-messages", topic: topic,
		build: func(s string) (*http.Request, error) { return api.NewReadMessagesRequest(s, topic, part, params) }})
	if err != nil {
		return nil, 0, err
	}
	var out api.MessageRange
	if err := json.Unmarshal(rep.body, &out); err != nil {
		return nil, 0, &Error{Op: "read-messages", Topic: topic, Node: rep.node, Err: err, Message: "the broker's answer is not a message range", kind: ErrInternal}
	}
	msgs := make([]*Message, 0, len(out.Messages))
	for i := range out.Messages {
		m, err := c.newMessage(&out.Messages[i], nil)
		if err != nil {
			return nil, 0, &Error{Op: "read-messages", Topic: topic, Node: rep.node, Err: err, Message: "a payload is not valid base64", kind: ErrInternal}
		}
		msgs = append(msgs, m)
	}
	return msgs, out.NextOffset, nil
}
