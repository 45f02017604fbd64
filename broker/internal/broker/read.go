package broker

import (
	"context"
	"fmt"
)

// ReadSpec is what a replay asks of one partition.
type ReadSpec struct {
	// From is the first offset to read (nil: the oldest held); with FromTimeMs, the
	// read starts at the first message written at or after that Unix ms time instead,
	// if that is later.
	From       *uint64
	FromTimeMs *int64
	Max        int
	// Incarnation, when not 0, is the incarnation of the topic the reader follows:
	// the name deleted and created again since answers ErrIncarnationMismatch, so
	// that a saved position is never carried over to another topic's offsets.
	Incarnation uint64
	// SkipDamaged reads past damaged records, naming them in ReadResult.Damaged,
	// instead of failing at the first one (which no retry can read).
	SkipDamaged bool
}

// ReadResult is a replay's answer: the messages, where to continue (Next), the
// offsets of the damaged records read past, and the incarnation of the topic read.
type ReadResult struct {
	Messages    []Delivered
	Next        uint64
	Damaged     []uint64
	Incarnation uint64
}

// Read replays up to spec.Max messages of one partition and says where to continue.
func (b *Broker) Read(ctx context.Context, name string, part int32, spec ReadSpec) (_ ReadResult, err error) {
	t, err := b.lookupForRead(name)
	if err != nil {
		return ReadResult{}, err
	}
	defer func() { err = b.notGoneIfRecreated(t, err) }()
	if spec.Incarnation != 0 && spec.Incarnation != t.incarnation {
		return ReadResult{}, fmt.Errorf("%w: topic %s is incarnation %d, not %d: it was deleted and created again since; read it from its start, or from a position taken from this incarnation", ErrIncarnationMismatch, t.name, t.incarnation, spec.Incarnation)
	}
	if part < 0 || int(part) >= len(t.parts()) {
		return ReadResult{}, ErrPartitionNotFound
	}
	start := uint64(0)
	if spec.From != nil {
		start = *spec.From
	}
	got, err := b.readOn(ctx, t, int(part), start, spec.FromTimeMs, spec.Max, spec.SkipDamaged)
	if err != nil {
		return ReadResult{}, b.partitionErr(t, err, "read")
	}
	out := make([]Delivered, len(got.recs))
	next := got.start
	// next_offset never points before the oldest message nor past the end of the log,
	// so a client following the log from it never skips what is written later.
	if next < got.st.Oldest {
		next = got.st.Oldest
	} else if next > got.st.End {
		next = got.st.End
	}
	for i, r := range got.recs {
		out[i] = Delivered{Partition: part, Offset: r.Offset, Key: r.Key, Value: r.Value, Attrs: r.Attrs, Timestamp: r.Timestamp}
		next = r.Offset + 1
	}
	return ReadResult{Messages: out, Next: next, Damaged: got.damaged, Incarnation: t.incarnation}, nil
}

// ReadOne replays the message at offset of a partition: nil when it is not written yet,
// ErrOffsetOutOfRange when it aged out. A damaged one is an error (ErrCorrupt).
func (b *Broker) ReadOne(ctx context.Context, name string, part int32, offset uint64) (*Delivered, error) {
	got, err := b.Read(ctx, name, part, ReadSpec{From: &offset, Max: 1})
	if err != nil {
		return nil, err
	}
	ds := got.Messages
	if len(ds) == 0 {
		t, err := b.lookupForRead(name)
		if err != nil {
			return nil, err
		}
		st, err := b.statsOf(ctx, t, int(part))
		if err != nil {
			return nil, err
		}
		if offset < st.Oldest {
			return nil, ErrOffsetOutOfRange
		}
		return nil, nil
	}
	if ds[0].Offset != offset {
		return nil, ErrOffsetOutOfRange
	}
	return &ds[0], nil
}

// lookupForRead is lookup for a replay. A node whose control plane has lost its
// majority (it no longer knows whether its metadata is current) still serves the
// replay of a topic it has open: reading committed messages cannot lose or
// misdeliver anything, and the replicas it holds are what a reader can still get.
func (b *Broker) lookupForRead(name string) (*topic, error) {
	if b.ready.Load() && !b.closing.Load() && !b.meta.Ready() {
		if err := checkName(name); err != nil {
			return nil, err
		}
		b.mu.RLock()
		t, ok := b.topics[name]
		b.mu.RUnlock()
		if ok {
			return t, nil
		}
	}
	return b.lookup(name)
}
