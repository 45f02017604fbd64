package partition

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestReplicaSnapshotDoesNotCountASkippedDamagedMessageAsSettled: a leader that meets a
// damaged record skips it in memory only (its peers hold it intact; it is handed over
// and rebuilt). A snapshot of its state taken before that must not count the message
// as settled: the group sends its latest snapshot to a replica that needs one, and the
// rebuilt replica restores its own, so the message would never be delivered by any of
// them although no consumer ever acked it.
func TestReplicaSnapshotDoesNotCountASkippedDamagedMessageAsSettled(t *testing.T) {
	g := &fakeGroup{}
	fss := []*vfs.Mem{vfs.NewMem(), vfs.NewMem()}
	for i, fs := range fss {
		p := mustOpen(t, fs, func(o *Options) {
			o.Group = member{g: g, i: i}
			o.SegmentBytes = 200 // five one-digit records per segment: offset 2 lies in a sealed one
		})
		t.Cleanup(func() { _ = p.Close() })
		g.replicas = append(g.replicas, p)
	}
	lead := g.replicas[0]
	lead.SetRole(true, 1)
	appendN(t, lead, 10)
	if err := fss[0].FlipByte("/p/log/00000000000000000000.log", 2*oneDigitFrame+20, 0x08); err != nil {
		t.Fatal(err)
	}
	ds := leaseAll(t, lead)
	if slices.Contains(offsets(ds), 2) || len(ds) != 9 {
		t.Fatalf("leased %v, want every offset but the damaged 2", offsets(ds))
	}
	for _, d := range ds {
		if err := settleOne(lead, d); err != nil {
			t.Fatalf("ack of offset %d: %v", d.Record.Offset, err)
		}
	}
	data, err := lead.SnapshotState()
	if err == nil {
		s, derr := decodeSnapState(data)
		if derr != nil {
			t.Fatal(derr)
		}
		t.Fatalf("a snapshot was taken of a state that counts offset 2, skipped as damaged on this replica only and never acked, as settled (frontier %d, acked ahead %v)", s.frontier, s.ackedAhead)
	}
	if !errors.Is(err, ErrStorage) || !strings.Contains(err.Error(), "rebuilt") {
		t.Fatalf("the snapshot was refused with %v; want ErrStorage saying the replica waits to be rebuilt", err)
	}
	// Its peer, which skipped nothing, still takes snapshots.
	if _, err := g.replicas[1].SnapshotState(); err != nil {
		t.Fatalf("the intact replica's snapshot: %v", err)
	}
}
