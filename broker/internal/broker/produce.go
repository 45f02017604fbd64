package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/jsondepth"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

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
	// Timestamp is when the message was first written, Unix ms (a copy from another
	// cluster keeps its source's); 0: now. The partition keeps it no later than now.
	Timestamp int64
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

// keylessPartition picks the partition of a request's keyless messages (no key, no
// partition named): they may go to any partition, so they go to one this node leads
// when it leads some, each request to the next of those in turn. One written here
// skips the forward to the node that leads it: a node-plane round trip, the larger part
// of a replicated produce's time when the nodes are busy (docs/performance.md). A node
// that leads none (a node that holds no replica, or while its groups elect) sends them
// round every partition whose holder is up; a single node leads all of its own.
func (b *Broker) keylessPartition(t *topic) int {
	n := len(t.parts())
	c := t.produce.Add(1)
	turn := int(c % uint32(n))
	led := 0
	for i := range n {
		if t.leads(i) {
			led++
		}
	}
	if led == 0 || led == n {
		return b.upPartition(t, turn)
	}
	k := int(c % uint32(led))
	for i := range n {
		if t.leads(i) {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return b.upPartition(t, turn) // leadership moved while we counted
}

// upPartition returns the first partition from p on (in turn) whose holder is worth
// asking now, or p when none is.
func (b *Broker) upPartition(t *topic, p int) int {
	n := len(t.parts())
	for k := range n {
		i := (p + k) % n
		if t.leads(i) {
			return i
		}
		if node := b.holderOf(t, i); node != "" && b.peerUp(node) {
			return i
		}
	}
	return p
}

// Produce stores messages durably: every message is fsynced before it returns. Messages
// for one partition are written in one append (one fsync, shared with concurrent
// producers); partitions are written in parallel. When some partitions' writes failed
// and others' succeeded, the error also wraps ErrPartlyStored: the messages of the
// partitions that succeeded are stored and will be delivered.
//
// ctx bounds the checks before the write (the topic's schema, whose budget a gone
// client need not spend), never the write itself: an append once begun runs to its
// fsync, so a cancelled request cannot leave part of a partition's batch stored.
func (b *Broker) Produce(ctx context.Context, name string, msgs []Outgoing) ([]Produced, error) {
	return b.ProduceChecked(ctx, name, ProduceCheck{}, msgs)
}

// ProduceChecked is Produce with the checks of a produce-batch request that names the
// topic's incarnation, carries copies from another cluster, or only validates (see
// ProduceCheck).
func (b *Broker) ProduceChecked(ctx context.Context, name string, chk ProduceCheck, msgs []Outgoing) (_ []Produced, err error) {
	t, err := b.lookup(name)
	if err != nil {
		return nil, err
	}
	if inc, perr := strconv.ParseUint(chk.Incarnation, 10, 64); perr == nil && inc > t.incarnation && b.opts.Peers != nil {
		// The batch names an incarnation newer than the one this node has open: it
		// is behind (the topic was deleted and created again and it has not applied
		// that yet). It catches up before it answers, as an ack does; answered at
		// once, a batch for the topic as it is now was refused as one for a deleted
		// topic (409, "nothing was written": a remote child's copier then stops and
		// asks to be attached again; a review, 5 December).
		if t, err = b.catchUpToIncarnation(ctx, t, inc); err != nil {
			return nil, err
		}
	}
	if chk.Incarnation == "" {
		// (A batch naming its incarnation is answered for that incarnation.)
		defer func() { err = b.notGoneIfRecreated(t, err) }()
	}
	if err := b.checkProduce(t, chk); err != nil || chk.ValidateOnly {
		return nil, err
	}
	n := len(t.parts())
	for i, m := range msgs {
		if m.Partition >= int32(n) {
			return nil, invalid(apigen.ErrorCodeInvalidParameter, "message %d: partition %d does not exist; topic %q has partitions 0 to %d", i, m.Partition, name, n-1)
		}
		if len(m.Key) > MaxKeyBytes {
			return nil, invalid(apigen.ErrorCodeInvalidParameter, "message %d: key is %d bytes; the limit is %d", i, len(m.Key), MaxKeyBytes)
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
				return nil, invalid(apigen.ErrorCodeInvalidPayload, "message %d: the payload is JSON nested more than %d levels deep; flatten it", i, MaxPayloadDepth)
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
	// the next (of those this node leads, when it leads some: keylessPartition): one
	// append (one commit group, one file to sync) per request instead of one per
	// partition touched, and the partitions still take turns.
	sticky := -1
	for i, m := range msgs {
		p := int(m.Partition)
		switch {
		case m.Partition >= 0:
		case m.Key != nil:
			p = PartitionForKey(m.Key, n)
		default:
			if sticky < 0 {
				sticky = b.keylessPartition(t)
			}
			p = sticky
		}
		byPart[p] = append(byPart[p], i)
	}
	write := func(p int, idx []int) error {
		recs := make([]segment.Record, len(idx))
		keyless := true
		for j, i := range idx {
			recs[j] = segment.Record{Key: msgs[i].Key, Value: msgs[i].Value, Attrs: msgs[i].Attrs, Timestamp: msgs[i].Timestamp}
			keyless = keyless && msgs[i].Key == nil && msgs[i].Partition < 0
		}
		first, err := b.appendTo(ctx, t, p, recs)
		// Messages that chose no partition may go to any: when the holder certainly
		// did not get them, they go to the next partition whose holder is up. A write
		// whose outcome is unknown is never sent again (it may be stored).
		for tried := 1; err != nil && keyless && tried < n && errors.Is(err, ErrPartitionDown); tried++ {
			next := b.upPartition(t, (p+1)%n)
			if next == p {
				break
			}
			p = next
			first, err = b.appendTo(ctx, t, p, recs)
		}
		if err != nil {
			return b.partitionErr(t, err, "produce")
		}
		for j, i := range idx {
			out[i] = Produced{Partition: int32(p), Offset: first + uint64(j)}
		}
		return nil
	}
	var mu sync.Mutex
	part := &PartlyStoredError{}
	forEachPartition(byPart, func(p int, idx []int) {
		e := write(p, idx)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case e == nil:
			part.Stored += len(idx)
		case err == nil:
			err = e
			part.Failed = append(part.Failed, int32(p))
		default:
			err = errors.Join(err, e)
			part.Failed = append(part.Failed, int32(p))
		}
	})
	if err != nil && part.Stored > 0 {
		// What was stored stays stored and is delivered: say so, and which
		// partitions failed, rather than let the error read as "nothing stored".
		slices.Sort(part.Failed)
		t.metrics.produced.Add(float64(part.Stored))
		return nil, errors.Join(part, err)
	}
	if err != nil {
		return nil, err
	}
	t.metrics.produced.Add(float64(len(msgs)))
	bytes := 0
	for _, m := range msgs {
		bytes += len(m.Key) + len(m.Value)
	}
	t.metrics.producedBytes.Add(float64(bytes))
	return out, nil
}
