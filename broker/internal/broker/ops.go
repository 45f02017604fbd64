package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/jsondepth"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// Limits of the API.
const (
	MaxTopicNameLen  = 249
	MaxPartitions    = 256
	MaxKeyBytes      = 1024
	MaxPayloadDepth  = 128 // nesting of a JSON payload's arrays and objects
	MaxVisibility    = 12 * time.Hour
	MinVisibility    = 100 * time.Millisecond
	MaxWait          = 20 * time.Second
	MaxBatch         = 1000
	MinRetentionMs   = 1000
	MaxRetentionMs   = 10 * 365 * 24 * 3600 * 1000
	MaxCapPerPartion = 1_000_000
	// MaxConsumeBytes bounds the key and payload bytes one consume-batch answer carries
	// (the first message always goes, whatever its size); messages past it stay queued.
	MaxConsumeBytes = 8 << 20
)

// ValidTopicName reports whether name follows the naming rules: 1 to 249 characters of
// a-z A-Z 0-9 . _ -, and not "." or "..".
func ValidTopicName(name string) bool {
	if len(name) == 0 || len(name) > MaxTopicNameLen || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func checkName(name string) error {
	if !ValidTopicName(name) {
		return invalid("invalid_name", "topic name %q is invalid: use 1 to 249 characters of a-z A-Z 0-9 . _ - (not . or ..)", truncate(name, 64))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// TopicSpec is a create request; nil fields take the defaults.
type TopicSpec struct {
	Name              string
	OwnerID           uint64 // the creating user's ID; 0 when security is off
	Partitions        *int32
	RetentionMs       *int64
	VisibilityMs      *int64
	MaxInFlight       *int32
	MaxAckedAhead     *int32
	ReplicationFactor *int32
	Schema            json.RawMessage
	Parent            *string
	FanoutDelayMs     *int64
}

// TopicAlter is a PATCH request; nil fields stay.
type TopicAlter = meta.Alter

func checkRange[T int32 | int64](field string, v *T, lo, hi T) error {
	if v != nil && (*v < lo || *v > hi) {
		return invalid("invalid_parameter", "%s must be between %d and %d, got %d", field, lo, hi, *v)
	}
	return nil
}

func checkSettings(retention, visibility *int64, inFlight, ackedAhead *int32) error {
	return errors.Join(
		checkRange("retention_ms", retention, MinRetentionMs, MaxRetentionMs),
		checkRange("visibility_timeout_ms", visibility, int64(MinVisibility/time.Millisecond), int64(MaxVisibility/time.Millisecond)),
		checkRange("max_in_flight_per_partition", inFlight, 1, MaxCapPerPartion),
		checkRange("max_acked_ahead_per_partition", ackedAhead, 1, MaxCapPerPartion),
	)
}

func firstInvalid(err error) error {
	if err == nil {
		return nil
	}
	var inv *InvalidError
	if errors.As(err, &inv) {
		return inv
	}
	return err
}

func orDefault[T any](p *T, d T) T {
	if p != nil {
		return *p
	}
	return d
}

func (b *Broker) ensureReady() error {
	if !b.Ready() {
		return ErrUnavailable
	}
	return nil
}

// CreateTopic creates a topic; it is usable when this returns.
func (b *Broker) CreateTopic(ctx context.Context, s TopicSpec) (meta.Topic, error) {
	if err := b.ensureReady(); err != nil {
		return meta.Topic{}, err
	}
	if err := checkName(s.Name); err != nil {
		return meta.Topic{}, err
	}
	if err := firstInvalid(errors.Join(
		checkRange("partitions", s.Partitions, 1, MaxPartitions),
		checkSettings(s.RetentionMs, s.VisibilityMs, s.MaxInFlight, s.MaxAckedAhead),
		checkRange("replication_factor", s.ReplicationFactor, 1, 1),
	)); err != nil {
		var inv *InvalidError
		if errors.As(err, &inv) && s.ReplicationFactor != nil && *s.ReplicationFactor != 1 {
			inv.Msg = "replication_factor must be 1: this node runs alone"
		}
		return meta.Topic{}, err
	}
	if len(s.Schema) > 0 {
		if _, err := compileSchema(s.Schema); err != nil {
			return meta.Topic{}, err
		}
		if isEmptySchema(s.Schema) {
			s.Schema = nil
		}
	}
	var start []uint64
	var parentInc uint64
	if s.Parent != nil {
		if err := checkName(*s.Parent); err != nil {
			return meta.Topic{}, err
		}
		var err error
		if start, parentInc, err = b.parentStart(*s.Parent); err != nil {
			return meta.Topic{}, err
		}
	} else if s.FanoutDelayMs != nil {
		return meta.Topic{}, invalid("invalid_parameter", "fanout_delay_ms goes with parent")
	}
	if err := checkDelay(orDefault(s.FanoutDelayMs, 0)); err != nil {
		return meta.Topic{}, err
	}
	d := b.opts.Defaults
	m := meta.Topic{
		Name:        s.Name,
		OwnerID:     s.OwnerID,
		CreatedAtMs: partition.WallMillis(),
		TopicConfig: meta.TopicConfig{
			Partitions:        orDefault(s.Partitions, d.Partitions),
			RetentionMs:       orDefault(s.RetentionMs, d.RetentionMs),
			VisibilityMs:      orDefault(s.VisibilityMs, d.VisibilityMs),
			MaxInFlight:       orDefault(s.MaxInFlight, d.MaxInFlight),
			MaxAckedAhead:     orDefault(s.MaxAckedAhead, d.MaxAckedAhead),
			ReplicationFactor: 1,
			Schema:            s.Schema,
			Parent:            orDefault(s.Parent, ""),
			ParentIncarnation: parentInc, // the incarnation start was read from
			FanoutDelayMs:     orDefault(s.FanoutDelayMs, 0),
		},
	}
	t, err := b.meta.CreateTopic(m, start...)
	if err != nil {
		return meta.Topic{}, mapMetaErr(err)
	}
	if err := b.reconcile(false); err != nil {
		return meta.Topic{}, errors.Join(ErrStorage, err)
	}
	return t, nil
}

func mapMetaErr(err error) error {
	var ce *meta.ConflictError
	if errors.As(err, &ce) {
		return &ConflictError{Msg: ce.Msg}
	}
	switch {
	case errors.Is(err, meta.ErrChildNotFound):
		return ErrChildNotFound
	case errors.Is(err, meta.ErrTopicExists):
		return ErrTopicExists
	case errors.Is(err, meta.ErrTopicNotFound):
		return ErrTopicNotFound
	case errors.Is(err, meta.ErrUnavailable):
		return errors.Join(ErrUnavailable, err)
	}
	return err
}

// Topics lists every topic.
func (b *Broker) Topics() ([]meta.Topic, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	return b.meta.Topics(), nil
}

// PartitionInfo describes one partition for inspect.
type PartitionInfo struct {
	Index  int32
	Stats  queue.Stats
	Leader string
}

// Topic returns a topic and its partitions' state.
func (b *Broker) Topic(name string) (meta.Topic, []PartitionInfo, error) {
	t, err := b.lookup(name)
	if err != nil {
		return meta.Topic{}, nil, err
	}
	infos := make([]PartitionInfo, len(t.parts))
	for i, p := range t.parts {
		infos[i] = PartitionInfo{Index: int32(i), Stats: p.Stats(), Leader: b.opts.NodeID}
	}
	return *t.cur.Load(), infos, nil
}

// AlterTopic changes a topic's live-tunable settings; of a.Incarnation only, when set.
func (b *Broker) AlterTopic(ctx context.Context, name string, a TopicAlter) (meta.Topic, error) {
	if err := b.ensureReady(); err != nil {
		return meta.Topic{}, err
	}
	if err := checkName(name); err != nil {
		return meta.Topic{}, err
	}
	if err := firstInvalid(checkSettings(a.RetentionMs, a.VisibilityMs, a.MaxInFlight, a.MaxAckedAhead)); err != nil {
		return meta.Topic{}, err
	}
	if a.Schema != nil {
		if _, err := compileSchema(*a.Schema); err != nil {
			return meta.Topic{}, err
		}
		if isEmptySchema(*a.Schema) {
			a.Schema, a.ClearSchema = nil, true
		}
	}
	t, err := b.meta.AlterTopic(name, a)
	if err != nil {
		return meta.Topic{}, mapMetaErr(err)
	}
	if err := b.reconcile(false); err != nil {
		return meta.Topic{}, errors.Join(ErrStorage, err)
	}
	return t, nil
}

// DeleteTopic deletes a topic's metadata and data. With incarnation != 0 it deletes
// only that incarnation (ErrTopicNotFound if the name now has another, or none).
func (b *Broker) DeleteTopic(ctx context.Context, name string, incarnation uint64) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	if _, err := b.meta.DeleteTopic(name, incarnation); err != nil {
		return mapMetaErr(err)
	}
	return b.reconcile(false)
}

// Exists returns nil when the topic exists, ErrTopicNotFound (or why it cannot tell)
// otherwise.
func (b *Broker) Exists(name string) error {
	_, err := b.lookup(name)
	return err
}

func (b *Broker) lookup(name string) (*topic, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	b.mu.RLock()
	t, ok := b.topics[name]
	b.mu.RUnlock()
	if !ok {
		return nil, ErrTopicNotFound
	}
	return t, nil
}

// Payload kinds in a record's attrs (low two bits), set by the HTTP layer: how a payload
// was sent and how it is shown again.
const (
	PayloadKindBinary uint16 = 0
	PayloadKindJSON   uint16 = 1
	PayloadKindText   uint16 = 2
	PayloadKindMask   uint16 = 0x3
)

// Outgoing is one message to produce.
type Outgoing struct {
	Key       []byte // nil: no key
	Partition int32  // -1: chosen by key or in turn
	Value     []byte
	Attrs     uint16
}

// Produced says where a message was stored.
type Produced struct {
	Partition int32
	Offset    uint64
}

// PartitionForKey is the partition a key hashes to (FNV-1a, 32 bits, modulo the count).
func PartitionForKey(key []byte, n int) int {
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// Produce stores messages durably: every message is fsynced before it returns. Messages
// for one partition are written in one append (one fsync, shared with concurrent
// producers); partitions are written in parallel. When some partitions' writes failed
// and others' succeeded, the error also wraps ErrPartlyStored: the messages of the
// partitions that succeeded are stored and will be delivered.
func (b *Broker) Produce(ctx context.Context, name string, msgs []Outgoing) ([]Produced, error) {
	t, err := b.lookup(name)
	if err != nil {
		return nil, err
	}
	n := len(t.parts)
	for i, m := range msgs {
		if m.Partition >= int32(n) {
			return nil, invalid("invalid_parameter", "message %d: partition %d does not exist; topic %q has partitions 0 to %d", i, m.Partition, name, n-1)
		}
		if len(m.Key) > MaxKeyBytes {
			return nil, invalid("invalid_parameter", "message %d: key is %d bytes; the limit is %d", i, len(m.Key), MaxKeyBytes)
		}
	}
	if m := t.cur.Load(); m.Parent != "" && m.FanoutDelayMs > 0 {
		return nil, &ConflictError{Msg: "topic " + name + " is a delay child of " + m.Parent + ": produce to the parent, and the message arrives here after the delay"}
	}
	if cs := t.schema.Load(); cs != nil && cs.err != nil {
		return nil, &ConflictError{Msg: fmt.Sprintf("the stored schema in effect for topic %q is refused by this version of the broker (%v); set a new one with PATCH /v1/topics/%s ({} for none) to produce to it again; nothing was written", name, cs.err, name)}
	} else if cs != nil && cs.schema != nil {
		// A topic with a schema holds JSON, so the bytes decide, not the content type:
		// clients of older versions send JSON as octet-stream (and base64 in a batch).
		// What passes is stored as JSON and comes back as JSON, so it must also keep
		// within the nesting every consumer can decode.
		cloned := false
		for i, m := range msgs {
			if m.Attrs&PayloadKindMask == PayloadKindJSON || !json.Valid(m.Value) || !utf8.Valid(m.Value) {
				continue
			}
			if jsondepth.Exceeds(m.Value, MaxPayloadDepth) {
				return nil, invalid("invalid_payload", "message %d: the payload is JSON nested more than %d levels deep; flatten it", i, MaxPayloadDepth)
			}
			if !cloned {
				msgs, cloned = slices.Clone(msgs), true
			}
			msgs[i].Attrs = m.Attrs&^PayloadKindMask | PayloadKindJSON
		}
		if err := cs.schema.checkAll(ctx, msgs); err != nil {
			return nil, err
		}
	}
	out := make([]Produced, len(msgs))
	byPart := make(map[int][]int, 1)
	// Keyless messages of one request all go to one partition, the next request's to
	// the next: one append (one commit group, one file to sync) per request instead of
	// one per partition touched, and the partitions still take turns.
	sticky := -1
	for i, m := range msgs {
		p := int(m.Partition)
		switch {
		case m.Partition >= 0:
		case m.Key != nil:
			p = PartitionForKey(m.Key, n)
		default:
			if sticky < 0 {
				sticky = int(t.produce.Add(1) % uint32(n))
			}
			p = sticky
		}
		byPart[p] = append(byPart[p], i)
	}
	write := func(p int, idx []int) error {
		recs := make([]segment.Record, len(idx))
		for j, i := range idx {
			recs[j] = segment.Record{Key: msgs[i].Key, Value: msgs[i].Value, Attrs: msgs[i].Attrs}
		}
		first, err := t.parts[p].Append(recs)
		if err != nil {
			return b.partitionErr(err, "produce")
		}
		for j, i := range idx {
			out[i] = Produced{Partition: int32(p), Offset: first + uint64(j)}
		}
		return nil
	}
	if len(byPart) == 1 {
		for p, idx := range byPart {
			err = write(p, idx)
		}
	} else {
		var wg sync.WaitGroup
		var mu sync.Mutex
		part := &PartlyStoredError{}
		for p, idx := range byPart {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e := write(p, idx)
				mu.Lock()
				defer mu.Unlock()
				if e != nil {
					err = errors.Join(err, e)
					part.Failed = append(part.Failed, int32(p))
				} else {
					part.Stored += len(idx)
				}
			}()
		}
		wg.Wait()
		if err != nil && part.Stored > 0 {
			// What was stored stays stored and is delivered: say so, and which
			// partitions failed, rather than let the error read as "nothing stored".
			slices.Sort(part.Failed)
			b.metrics.Produced.WithLabelValues(name).Add(float64(part.Stored))
			return nil, errors.Join(part, err)
		}
	}
	if err != nil {
		return nil, err
	}
	b.metrics.Produced.WithLabelValues(name).Add(float64(len(msgs)))
	return out, nil
}

func (b *Broker) partitionErr(err error, op string) error {
	switch {
	case errors.Is(err, partition.ErrClosed):
		if b.closing.Load() {
			return ErrUnavailable
		}
		return ErrTopicNotFound // deleted while the request ran
	case errors.Is(err, partition.ErrCorrupt):
		b.metrics.StorageErrors.WithLabelValues("corrupt_record").Inc()
		return errors.Join(ErrCorrupt, err)
	case errors.Is(err, partition.ErrDiskFull):
		b.metrics.StorageErrors.WithLabelValues(op + "_disk_full").Inc()
		b.log.Error("disk full: a write was refused; free space on the data volume", "op", op)
		return errors.Join(ErrDiskFull, err)
	case errors.Is(err, partition.ErrStorage):
		b.metrics.StorageErrors.WithLabelValues(op).Inc()
		if errors.Is(err, segment.ErrNotUndone) {
			b.log.Error("a failed write could not be undone; its records may reappear after a restart", "op", op, "err", err)
			return errors.Join(ErrStorage, ErrMaybeStored, err)
		}
		return errors.Join(ErrStorage, err)
	}
	return err
}

// Delivered is a consumed or replayed message.
type Delivered struct {
	Partition int32
	Offset    uint64
	Key       []byte
	Value     []byte
	Attrs     uint16
	Timestamp int64
	Handle    string // empty on replay
	Attempt   uint32 // 0 on replay
}

// Consume leases up to max messages, waiting up to wait for the first. It returns no
// messages (and no error) when none arrived in time.
func (b *Broker) Consume(ctx context.Context, name string, max int, wait time.Duration) ([]Delivered, error) {
	t, err := b.lookup(name)
	if err != nil {
		return nil, err
	}
	if wait > MaxWait {
		wait = MaxWait
	}
	var timer *time.Timer
	waiting := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if waiting {
			b.longPolls.Add(-1)
			b.metrics.ConsumeWaiting.Dec()
		}
	}()
	for {
		// A client that has gone gets nothing: a lease taken for it would hide the
		// message for a visibility timeout with nobody to process it. Checked before
		// every look (the first, and after each wake, which can race the cancel).
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Take the wake-up channel before looking, so a message arriving between the
		// look and the wait still wakes us.
		wake := t.sig.wait()
		got, err := b.leaseFrom(t, max)
		if len(got) > 0 && ctx.Err() != nil {
			// The client went while we leased: hand the messages back at once.
			b.handBack(t, got)
			return nil, ctx.Err()
		}
		if err != nil || len(got) > 0 {
			return got, err
		}
		if wait <= 0 {
			return nil, nil
		}
		if timer == nil {
			if b.longPolls.Add(1) > int64(b.opts.MaxLongPolls) {
				b.longPolls.Add(-1)
				return nil, errors.Join(ErrUnavailable, ErrTooManyLongPolls)
			}
			timer = time.NewTimer(wait)
			waiting = true
			b.metrics.ConsumeWaiting.Inc()
		}
		select {
		case <-wake:
		case <-timer.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.done:
			return nil, ErrTopicNotFound
		case <-b.draining:
			return nil, ErrUnavailable
		}
	}
}

// handBack ends leases taken for a client that has gone, so the messages are
// deliverable again now rather than after the visibility timeout.
func (b *Broker) handBack(t *topic, ds []Delivered) {
	for _, d := range ds {
		h, err := queue.DecodeHandle(d.Handle)
		if err != nil {
			continue
		}
		if err := t.parts[d.Partition].Extend(h.Offset, h.Nonce, 0); err != nil && !errors.Is(err, queue.ErrLeaseLost) {
			b.log.Warn("handing back a lease of a gone client failed; the message is delivered again after its visibility timeout",
				"topic", t.name, "partition", d.Partition, "offset", d.Offset, "err", err)
		}
	}
}

// leaseFrom leases from the topic's partitions in turn, starting one further each call
// so every partition is served.
func (b *Broker) leaseFrom(t *topic, max int) ([]Delivered, error) {
	vis := time.Duration(t.cur.Load().VisibilityMs) * time.Millisecond
	n := len(t.parts)
	start := int(t.consume.Add(1) % uint32(n))
	var out []Delivered
	var firstErr error
	size := 0
	for k := 0; k < n && len(out) < max && size < MaxConsumeBytes; k++ {
		i := (start + k) % n
		budget := MaxConsumeBytes - size
		if len(out) == 0 {
			budget = MaxConsumeBytes
		}
		ds, err := t.parts[i].Lease(max-len(out), vis, budget)
		if err != nil {
			if firstErr == nil {
				firstErr = b.partitionErr(err, "read")
			}
			continue
		}
		for _, d := range ds {
			size += len(d.Record.Key) + len(d.Record.Value)
			h := queue.Handle{Incarnation: t.incarnation, Partition: uint32(i), Offset: d.Record.Offset, Nonce: d.Nonce}
			out = append(out, Delivered{
				Partition: int32(i), Offset: d.Record.Offset, Key: d.Record.Key, Value: d.Record.Value,
				Attrs: d.Record.Attrs, Timestamp: d.Record.Timestamp, Handle: h.Encode(), Attempt: d.Attempt,
			})
			if d.Attempt > 1 {
				b.metrics.Redelivered.WithLabelValues(t.name).Inc()
			}
		}
	}
	if len(out) > 0 {
		b.metrics.Delivered.WithLabelValues(t.name).Add(float64(len(out)))
		return out, nil
	}
	return nil, firstErr
}

// liveIncarnation reports whether some existing topic has this incarnation.
func (b *Broker) liveIncarnation(inc uint64) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, t := range b.topics {
		if t.incarnation == inc {
			return true
		}
	}
	return false
}

// AckMode says what an ack does.
type AckMode int

const (
	// Settle marks the message done.
	Settle AckMode = iota
	// Renew extends the lease by the topic's visibility timeout.
	Renew
	// ExtendBy sets the lease to end Delay from now; a zero Delay hands it back.
	ExtendBy
)

// AckReq is one ack, extend or nack.
type AckReq struct {
	Handle string
	Mode   AckMode
	Delay  time.Duration
}

// Ack applies acks; the result has one error per request (nil: done). Settles are durable
// before it returns. A handle of another incarnation of the topic is ErrLeaseLost.
func (b *Broker) Ack(ctx context.Context, name string, reqs []AckReq) []error {
	errs := make([]error, len(reqs))
	t, err := b.lookup(name)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	vis := time.Duration(t.cur.Load().VisibilityMs) * time.Millisecond

	settles := make(map[uint32][]int)
	handles := make([]queue.Handle, len(reqs))
	for i, r := range reqs {
		h, err := queue.DecodeHandle(r.Handle)
		if err != nil || (h.Incarnation == t.incarnation && h.Partition >= uint32(len(t.parts))) {
			errs[i] = ErrBadHandle
			continue
		}
		if h.Incarnation != t.incarnation {
			if b.liveIncarnation(h.Incarnation) {
				// Issued by another topic that exists: the caller mixed up topics.
				errs[i] = ErrBadHandle
			} else {
				// Issued for an earlier (deleted) topic of this name: that lease is gone.
				errs[i] = ErrLeaseLost
			}
			continue
		}
		handles[i] = h
		p := t.parts[h.Partition]
		switch r.Mode {
		case Settle:
			settles[h.Partition] = append(settles[h.Partition], i)
			continue
		case Renew:
			errs[i] = p.Extend(h.Offset, h.Nonce, vis)
		case ExtendBy:
			errs[i] = p.Extend(h.Offset, h.Nonce, r.Delay)
		}
		errs[i] = b.ackErr(errs[i], "extend")
	}
	settle := func(pi uint32, idx []int) {
		sr := make([]partition.SettleReq, len(idx))
		for j, i := range idx {
			sr[j] = partition.SettleReq{Offset: handles[i].Offset, Nonce: handles[i].Nonce}
		}
		res := t.parts[pi].Settle(sr)
		settled := 0
		for j, i := range idx {
			errs[i] = b.ackErr(res[j], "settle")
			if res[j] == nil {
				settled++
			}
		}
		b.metrics.Settled.WithLabelValues(name).Add(float64(settled))
	}
	if len(settles) == 1 {
		for pi, idx := range settles {
			settle(pi, idx)
		}
	} else if len(settles) > 1 {
		var wg sync.WaitGroup
		for pi, idx := range settles {
			wg.Add(1)
			go func() { defer wg.Done(); settle(pi, idx) }()
		}
		wg.Wait()
	}
	return errs
}

func (b *Broker) ackErr(err error, op string) error {
	outcome := op + "_ok"
	switch {
	case err == nil:
	case errors.Is(err, queue.ErrLeaseLost):
		err, outcome = ErrLeaseLost, "lease_lost"
	case errors.Is(err, queue.ErrAckedAheadFull):
		err, outcome = ErrAckedAheadFull, "acked_ahead_full"
	default:
		err, outcome = b.partitionErr(err, op), "error"
	}
	b.metrics.AckOutcomes.WithLabelValues(outcome).Inc()
	return err
}

// Read replays up to max messages of one partition from an offset (or, with fromTime,
// from the first message at or after that Unix ms time) and returns where to continue.
func (b *Broker) Read(ctx context.Context, name string, part int32, from *uint64, fromTimeMs *int64, max int) ([]Delivered, uint64, error) {
	t, err := b.lookup(name)
	if err != nil {
		return nil, 0, err
	}
	if part < 0 || int(part) >= len(t.parts) {
		return nil, 0, ErrPartitionNotFound
	}
	p := t.parts[part]
	start := uint64(0)
	if from != nil {
		start = *from
	}
	if fromTimeMs != nil {
		o, err := p.OffsetForTime(*fromTimeMs)
		if err != nil {
			return nil, 0, b.partitionErr(err, "read")
		}
		if o > start {
			start = o
		}
	}
	recs, err := p.Read(start, max)
	if err != nil {
		return nil, 0, b.partitionErr(err, "read")
	}
	out := make([]Delivered, len(recs))
	next := start
	// next_offset never points before the oldest message nor past the end of the log,
	// so a client following the log from it never skips what is written later.
	if st := p.Stats(); next < st.Oldest {
		next = st.Oldest
	} else if next > st.End {
		next = st.End
	}
	for i, r := range recs {
		out[i] = Delivered{Partition: part, Offset: r.Offset, Key: r.Key, Value: r.Value, Attrs: r.Attrs, Timestamp: r.Timestamp}
		next = r.Offset + 1
	}
	return out, next, nil
}

// ReadOne replays the message at offset of a partition: nil when it is not written yet,
// ErrOffsetOutOfRange when it aged out.
func (b *Broker) ReadOne(ctx context.Context, name string, part int32, offset uint64) (*Delivered, error) {
	ds, _, err := b.Read(ctx, name, part, &offset, nil, 1)
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		t, err := b.lookup(name)
		if err != nil {
			return nil, err
		}
		if offset < t.parts[part].Stats().Oldest {
			return nil, ErrOffsetOutOfRange
		}
		return nil, nil
	}
	if ds[0].Offset != offset {
		return nil, ErrOffsetOutOfRange
	}
	return &ds[0], nil
}
