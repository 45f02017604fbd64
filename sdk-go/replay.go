package narad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Position is where a replay starts, per partition: Offsets holds the next offset to
// read of each partition named; partitions not named start at the first message written
// at or after Time, or (AtEnd) at their end as the replay starts, or at the oldest
// retained message when Time is zero and AtEnd false. Incarnation is the topic
// incarnation the offsets belong to: a replay from a position that names one fails with
// ErrConflict (code incarnation_mismatch) once the topic has been deleted and created
// again, instead of reading the new topic at offsets that meant other messages. A
// position without one (FromStart, or one saved by an older SDK) reads the topic's
// current incarnation, which Advance then records.
//
// Positions are plain data: store them and resume from them later. Their JSON is the one
// every Narad SDK writes and reads (docs/sdk/contract.md, Replay), so a Go service can
// resume from a position a Python or TypeScript one saved:
// {"offsets":{"0":12},"time_ms":1733500000000,"start":"latest","incarnation":"42"}, with
// time_ms only for a Time and "start":"latest" only for AtEnd. UnmarshalJSON also reads
// the form this package wrote before ("time" as RFC 3339), and refuses malformed input
// (an offset that is not a non-negative integer, say) with an error saying what is wrong.
type Position struct {
	Offsets     map[int32]int64
	Time        time.Time
	AtEnd       bool
	Incarnation string
}

// FromStart is the position of the oldest retained message of every partition.
func FromStart() Position { return Position{} }

// FromTime is the position of the first message written at or after t, per partition.
func FromTime(t time.Time) Position { return Position{Time: t} }

// FromEnd is the position of every partition's end as a replay from it starts: the
// replay reads only messages written after that. Advance with the first message it
// yields names every partition the replay read at the offset it started at, so a replay
// resumed from the position misses nothing written since; a FromEnd position no message
// has advanced still means the end as of the next replay's start.
func FromEnd() Position { return Position{AtEnd: true} }

// FromOffsets starts each named partition at its offset (others at the oldest).
func FromOffsets(offsets map[int32]int64) Position {
	return Position{Offsets: maps.Clone(offsets)}
}

// Advance moves the position past m, so that a replay from it resumes after m. A
// position without an incarnation takes that of the replay m came from. An AtEnd
// position takes the offset each partition of that replay started at (for the
// partitions it does not name yet) and is no longer AtEnd.
func (p *Position) Advance(m *Message) {
	if p.Offsets == nil {
		p.Offsets = make(map[int32]int64)
	}
	if p.AtEnd && m.startedAt != nil {
		for part, o := range m.startedAt {
			if _, ok := p.Offsets[part]; !ok {
				p.Offsets[part] = o
			}
		}
		p.AtEnd = false
	}
	if m.Offset+1 > p.Offsets[m.Partition] {
		p.Offsets[m.Partition] = m.Offset + 1
	}
	if p.Incarnation == "" {
		p.Incarnation = m.incarnation
	}
}

// Clone returns an independent copy.
func (p Position) Clone() Position {
	return Position{Offsets: maps.Clone(p.Offsets), Time: p.Time, AtEnd: p.AtEnd, Incarnation: p.Incarnation}
}

// MarshalJSON writes the one position form of every Narad SDK: "offsets" always (in
// partition order), then "time_ms" (Time in Unix milliseconds) when Time is set,
// "start":"latest" when AtEnd, and "incarnation" when known. A position with both Time
// and AtEnd says two things at once and is refused.
func (p Position) MarshalJSON() ([]byte, error) {
	if p.AtEnd && !p.Time.IsZero() {
		return nil, errors.New("narad: a Position cannot have both Time and AtEnd: partitions not named start at one of them")
	}
	b := []byte(`{"offsets":{`)
	for i, part := range slices.Sorted(maps.Keys(p.Offsets)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = strconv.AppendInt(b, int64(part), 10)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, p.Offsets[part], 10)
	}
	b = append(b, '}')
	if !p.Time.IsZero() {
		b = append(b, `,"time_ms":`...)
		b = strconv.AppendInt(b, p.Time.UnixMilli(), 10)
	}
	if p.AtEnd {
		b = append(b, `,"start":"latest"`...)
	}
	if p.Incarnation != "" {
		inc, err := json.Marshal(p.Incarnation)
		if err != nil {
			return nil, err
		}
		b = append(append(b, `,"incarnation":`...), inc...)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads the one position form (see MarshalJSON), and the forms the SDKs
// wrote before it: Go's "time" (RFC 3339), TypeScript's "otherwise" ("earliest",
// "latest" or {"time": ms}); Python's was already the one form. A key given as null is
// taken as absent; other keys are ignored. Anything else malformed is refused: a
// partition that is not a decimal int32 at or above 0, an offset that is not an integer
// at or above 0, a time_ms that is not an integer, a start other than "latest", or two
// keys that say where unnamed partitions start.
func (p *Position) UnmarshalJSON(data []byte) error {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil || doc == nil {
		return errors.New("narad: a saved position must be a JSON object, like {\"offsets\":{\"0\":12}}")
	}
	for k, v := range doc {
		if string(v) == "null" {
			delete(doc, k)
		}
	}
	var out Position
	if raw, ok := doc["offsets"]; ok {
		var offs map[string]json.RawMessage
		if err := json.Unmarshal(raw, &offs); err != nil {
			return fmt.Errorf("narad: a saved position's offsets must be an object of partition to offset, not %s", raw)
		}
		out.Offsets = make(map[int32]int64, len(offs))
		for k, v := range offs {
			part, err := strconv.ParseInt(k, 10, 32)
			if err != nil || part < 0 || strconv.FormatInt(part, 10) != k {
				return fmt.Errorf("narad: a saved position names partition %q: a partition is a decimal number from 0", k)
			}
			o, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || o < 0 {
				return fmt.Errorf("narad: a saved position gives partition %s the offset %s: an offset is an integer from 0", k, v)
			}
			out.Offsets[int32(part)] = o
		}
	}
	var starts []string
	for _, k := range []string{"time_ms", "start", "time", "otherwise"} {
		if _, ok := doc[k]; ok {
			starts = append(starts, strconv.Quote(k))
		}
	}
	if len(starts) > 1 {
		return fmt.Errorf("narad: a saved position has both %s: partitions not named start at one place", strings.Join(starts, " and "))
	}
	if raw, ok := doc["time_ms"]; ok {
		ms, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			return fmt.Errorf("narad: a saved position's time_ms is %s: it is an integer, Unix milliseconds", raw)
		}
		out.Time = time.UnixMilli(ms)
	}
	if raw, ok := doc["start"]; ok {
		if string(raw) != `"latest"` {
			return fmt.Errorf(`narad: a saved position's start is %s: the only start is "latest" (absent: at time_ms, else the oldest message)`, raw)
		}
		out.AtEnd = true
	}
	if raw, ok := doc["time"]; ok {
		if err := json.Unmarshal(raw, &out.Time); err != nil {
			return fmt.Errorf("narad: a saved position's time is %s: it is an RFC 3339 time", raw)
		}
	}
	if raw, ok := doc["otherwise"]; ok {
		var ms struct {
			Time json.RawMessage `json:"time"`
		}
		switch {
		case string(raw) == `"earliest"`:
		case string(raw) == `"latest"`:
			out.AtEnd = true
		case json.Unmarshal(raw, &ms) == nil && ms.Time != nil:
			n, err := strconv.ParseInt(string(ms.Time), 10, 64)
			if err != nil {
				return fmt.Errorf("narad: a saved position's otherwise.time is %s: it is an integer, Unix milliseconds", ms.Time)
			}
			out.Time = time.UnixMilli(n)
		default:
			return fmt.Errorf(`narad: a saved position's otherwise is %s: it is "earliest", "latest" or {"time": Unix ms}`, raw)
		}
	}
	if raw, ok := doc["incarnation"]; ok {
		if err := json.Unmarshal(raw, &out.Incarnation); err != nil {
			return fmt.Errorf("narad: a saved position's incarnation is %s: it is a string", raw)
		}
	}
	*p = out
	return nil
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
// A bounded replay learns each partition's end from the topic's stats. While the node
// holding a partition cannot be reached its end is unknown, so the replay reads the
// topic again, with the client's retry policy, until the partition is available; if it
// is not within the policy's attempts (or ctx's deadline), the replay yields an error
// wrapping ErrUnavailable that names the partition. A replay from FromEnd (following
// or not) starts the partitions the position does not name at their end from the same
// stats, and waits for an unavailable one in the same way.
//
// Every read names the topic incarnation of the position (or, for a position without
// one, the incarnation the topic had when the replay began). If the topic has been
// deleted and created again, the replay yields an error wrapping ErrConflict with code
// incarnation_mismatch and ends: start again from a new position. Damaged messages the
// broker read past (their stored record failed its checksum) are reported to the
// Observer as EventReplayDamaged and logged as a warning; the replay goes on after them.
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
		// fail yields err and reports whether the replay goes on, after a backoff.
		fail := func(err error) bool {
			return yield(nil, err) && !terminal(err) && ctx.Err() == nil && sleepCtx(ctx, bo.NextBackOff())
		}
		var info *TopicInfo
		for {
			var err error
			info, err = c.replayStart(ctx, topic, from.Incarnation, func(p int32) bool {
				// A bounded replay needs every end; a following one those an AtEnd
				// position starts at.
				read := cfg.partitions == nil || slices.Contains(cfg.partitions, p)
				_, named := from.Offsets[p]
				return read && (!cfg.follow || from.AtEnd && !named)
			})
			if err == nil {
				break
			}
			if !fail(err) {
				return
			}
		}
		inc := from.Incarnation
		if inc == "" {
			inc = info.Incarnation
		}
		parts := cfg.partitions
		if parts == nil {
			for _, s := range info.Stats {
				parts = append(parts, s.Partition)
			}
		}
		// replayStart returned only once every partition read is available, so each
		// end is a real one.
		end := make(map[int32]int64, len(info.Stats))
		for _, s := range info.Stats {
			end[s.Partition] = s.NextOffset
		}
		next := make(map[int32]int64, len(parts))
		known := make(map[int32]bool, len(parts))
		for _, p := range parts {
			if o, ok := from.Offsets[p]; ok {
				next[p], known[p] = o, true
			} else if from.AtEnd {
				next[p], known[p] = end[p], true
			}
		}
		// Messages of an AtEnd replay tell Advance where each partition started.
		var startedAt map[int32]int64
		if from.AtEnd {
			startedAt = maps.Clone(next)
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
				r, err := c.readRange(ctx, topic, p, next[p], known[p], from.Time, cfg.batch, inc)
				if err != nil {
					if !fail(err) {
						return
					}
					continue
				}
				bo.Reset()
				if inc == "" {
					inc = r.incarnation
				}
				for _, o := range r.damaged {
					c.log.Warn("narad: replay read past a damaged message, which can never be served", "topic", topic, "partition", p, "offset", o)
					c.observe(Event{Kind: EventReplayDamaged, Context: ctx, Op: "read-messages", Topic: topic, Partition: p, Offset: o, Node: r.node, Start: time.Now()})
				}
				for _, m := range r.msgs {
					if !cfg.follow && m.Offset >= end[p] {
						break
					}
					m.incarnation, m.startedAt = inc, startedAt
					if !yield(m, nil) {
						return
					}
				}
				// The cursor follows the answer's next_offset, lower ones included: the
				// broker answers a from past the end with the end, and following it
				// reads what is written there later instead of skipping it.
				stalled := len(r.msgs) == 0 && known[p] && r.next <= next[p]
				next[p], known[p] = r.next, true
				if len(r.msgs) > 0 {
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

// replayStart reads the topic a replay begins with. It fails with ErrConflict when the
// topic is no longer incarnation inc (when inc is not ""). While a partition whose end
// the replay needs (needEnd) is unavailable it reads the topic again, with the client's
// retry policy, since such a partition's offsets are given as 0 and its end is unknown;
// it fails with ErrUnavailable naming the partitions when they stay so.
func (c *Client) replayStart(ctx context.Context, topic, inc string, needEnd func(int32) bool) (*TopicInfo, error) {
	bo := c.cfg.retry.Backoff()
	for attempt := 1; ; attempt++ {
		info, err := c.Topic(ctx, topic)
		if err != nil {
			return nil, err
		}
		if inc != "" && info.Incarnation != "" && info.Incarnation != inc {
			return nil, incarnationMismatch(&Error{Op: "replay", Topic: topic, Status: http.StatusConflict, Code: CodeIncarnationMismatch, kind: ErrConflict}, inc)
		}
		var down []string
		for _, s := range info.Stats {
			if !s.Available && needEnd(s.Partition) {
				down = append(down, strconv.Itoa(int(s.Partition)))
			}
		}
		if len(down) == 0 {
			return info, nil
		}
		e := &Error{Op: "replay", Topic: topic, Code: CodeUnavailable, kind: ErrUnavailable}
		if len(down) == 1 {
			e.Message = "partition " + down[0] + " is unavailable (the node holding it cannot be reached), so the end the replay stops at is unknown"
		} else {
			e.Message = "partitions " + strings.Join(down, ", ") + " are unavailable (the nodes holding them cannot be reached), so the ends the replay stops at are unknown"
		}
		wait := bo.NextBackOff()
		if attempt >= c.cfg.retry.Attempts || wait == StopBackoff {
			return nil, e
		}
		if d, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(d) {
			return nil, e
		}
		c.log.Debug("narad: replay waits for an unavailable partition", "topic", topic, "partitions", down, "attempt", attempt, "wait", wait)
		c.observe(Event{Kind: EventRetry, Context: ctx, Op: "replay", Topic: topic, Attempt: attempt, Err: e, Start: time.Now(), Duration: wait})
		if !sleepCtx(ctx, wait) {
			e.Err = ctx.Err()
			return nil, e
		}
	}
}

// incarnationMismatch says in e what a replay refused for a topic no longer
// incarnation inc, and what to do.
func incarnationMismatch(e *Error, inc string) *Error {
	e.Message = "the topic was deleted and created again since the position was taken (it was incarnation " + inc +
		"); its offsets name other messages now: start again from a new position"
	return e
}

// replayPage is one read answer of a replay.
type replayPage struct {
	msgs        []*Message
	next        int64
	incarnation string
	damaged     []int64
	node        string
}

func (c *Client) readRange(ctx context.Context, topic string, part int32, from int64, useFrom bool, t time.Time, max int, inc string) (*replayPage, error) {
	params := &api.ReadMessagesParams{Max: ptr(int32(max)), PayloadEncoding: ptr(api.ReadMessagesParamsPayloadEncodingBase64)}
	switch {
	case useFrom:
		params.From = &from
	case !t.IsZero():
		params.FromTime = ptr(strconv.FormatInt(t.UnixMilli(), 10))
	}
	if inc != "" {
		params.Incarnation = &inc
	}
	rep, err := c.do(ctx, &call{op: "read-messages", topic: topic,
		build: func(s string) (*http.Request, error) { return api.NewReadMessagesRequest(s, topic, part, params) }})
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == CodeIncarnationMismatch {
			return nil, incarnationMismatch(e, inc)
		}
		return nil, err
	}
	var out api.MessageRange
	if err := json.Unmarshal(rep.body, &out); err != nil {
		return nil, &Error{Op: "read-messages", Topic: topic, Node: rep.node, Err: err, Message: "the broker's answer is not a message range", kind: ErrInternal}
	}
	page := &replayPage{next: out.NextOffset, node: rep.node, msgs: make([]*Message, 0, len(out.Messages))}
	if out.Incarnation != nil {
		page.incarnation = *out.Incarnation
	}
	if out.Damaged != nil {
		page.damaged = *out.Damaged
	}
	for i := range out.Messages {
		m, err := c.newMessage(&out.Messages[i], nil)
		if err != nil {
			return nil, &Error{Op: "read-messages", Topic: topic, Node: rep.node, Err: err, Message: "a payload is not valid base64", kind: ErrInternal}
		}
		page.msgs = append(page.msgs, m)
	}
	return page, nil
}
