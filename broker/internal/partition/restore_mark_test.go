package partition

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestARestoredSnapshotReplacesTheDeliveredMark: a replica behind the leader's
// compacted log takes the leader's snapshot, the group's state at that index, and its
// delivered-to mark with it, even when that is lower than the one this replica applied
// before it fell behind (a new leader's M, or a handover's L, replaces the mark). On
// the old code the restore only raised the mark: leading, the replica counted messages
// below its stale mark as delivered once (delivery_attempt 2 at their first delivery,
// counted against max_deliveries).
func TestARestoredSnapshotReplacesTheDeliveredMark(t *testing.T) {
	g := &fakeGroup{}
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 0} })
	t.Cleanup(func() { _ = p.Close() })
	g.replicas = []*Partition{p}
	recs := make([]segment.Record, 50)
	for i := range recs {
		recs[i] = segment.Record{Value: []byte("m"), Timestamp: 1}
	}
	if res := p.Apply(1, encodeAppendCmd(0, recs)).(appliedAppend); !res.ok {
		t.Fatal("append not applied")
	}
	// An earlier leader reserved its mark ahead under its lease: D with mark 40.
	d := append([]byte{cmdDelivered}, binary.BigEndian.AppendUint64(nil, 40)...)
	d = binary.BigEndian.AppendUint32(d, 0)
	p.Apply(2, d)
	if got := p.repl.deliveredTo.Load(); got != 40 {
		t.Fatalf("mark after D: %d", got)
	}
	// This replica falls behind; meanwhile a new leader commits M(10) (its mark cut back:
	// messages 10..39 were never delivered) and the log is compacted past it. The leader's
	// snapshot at S says: log [0,50), delivered-to 10.
	snap := snapState{oldest: 0, end: 50, deliveredTo: 10}.encode()
	if err := p.RestoreSnapshot(context.Background(), 100, snap, func(context.Context, uint64) ([]segment.Record, error) {
		t.Fatal("nothing should be fetched")
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := p.repl.deliveredTo.Load(); got != 10 {
		t.Errorf("after restoring a snapshot whose delivered-to mark is 10, this replica's mark is %d: messages 10..%d count as delivered once here", got, got-1)
	}
}
