package broker

import (
	"context"
)

// Read replays up to max messages of one partition from an offset (or, with fromTime,
// from the first message at or after that Unix ms time) and returns where to continue.
func (b *Broker) Read(ctx context.Context, name string, part int32, from *uint64, fromTimeMs *int64, max int) (_ []Delivered, _ uint64, err error) {
	t, err := b.lookupForRead(name)
	if err != nil {
		return nil, 0, err
	}
	defer func() { err = b.notGoneIfRecreated(t, err) }()
	if part < 0 || int(part) >= len(t.parts()) {
		return nil, 0, ErrPartitionNotFound
	}
	start := uint64(0)
	if from != nil {
		start = *from
	}
	recs, start, st, err := b.readOn(ctx, t, int(part), start, fromTimeMs, max)
	if err != nil {
		return nil, 0, b.partitionErr(t, err, "read")
	}
	out := make([]Delivered, len(recs))
	next := start
	// next_offset never points before the oldest message nor past the end of the log,
	// so a client following the log from it never skips what is written later.
	if next < st.Oldest {
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
