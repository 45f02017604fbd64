package broker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
)

// TestNodeStats: the node reports its data volume and, in group sync mode, the shared
// sync rounds of the last interval: none before the first sample, the produces' rounds
// after it, and an empty interval after a quiet one. In file sync mode there are no
// rounds to report.
func TestNodeStats(t *testing.T) {
	t.Parallel()
	b, err := Open(Options{DataDir: t.TempDir(), NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StatsInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ns := b.NodeStats()
	if ns.NodeID != "n1" || !ns.Ready || ns.SyncMode != "group" {
		t.Fatalf("node stats %+v, want n1, ready, group sync", ns)
	}
	if !ns.DiskKnown || ns.DiskSizeBytes == 0 || ns.DiskFreeBytes > ns.DiskSizeBytes {
		t.Errorf("disk free %d of %d bytes (known %v), want a size and free within it", ns.DiskFreeBytes, ns.DiskSizeBytes, ns.DiskKnown)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "s", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	// The sampler takes its first sample as it starts (its next is an hour away): wait
	// for it, so that it cannot land between the test's own samples below.
	waitFirstSample(t, b)
	t0 := partition.WallMillis() + 60_000
	b.sampleStats(t0)
	produceN(t, b, "s", 5)
	b.sampleStats(t0 + 2000)
	s := b.NodeStats().Sync
	if s == nil {
		t.Fatal("no sync sample after two samples")
	}
	if s.AtMs != t0+2000 || s.IntervalMs != 2000 || s.Rounds == 0 || s.Rounds > 5 || s.Files < s.Rounds {
		t.Errorf("sync sample %+v, want 1 to 5 rounds (5 produces, each synced) over 2000 ms", s)
	}
	if s.RoundsHz != float64(s.Rounds)/2 || s.Max <= 0 || s.Mean <= 0 || s.Mean > s.Max {
		t.Errorf("sync sample %+v, want rounds/2 per second and 0 < mean <= max", s)
	}
	b.sampleStats(t0 + 3000)
	if s := b.NodeStats().Sync; s == nil || s.Rounds != 0 || s.Max != 0 || s.Mean != 0 || s.RoundsHz != 0 || s.IntervalMs != 1000 {
		t.Errorf("sync sample of a quiet second: %+v, want no rounds", s)
	}
}

// TestNodeStatsFileSync: each write syncs its own file, so there are no shared rounds
// to report, and the disk figures are still there.
func TestNodeStatsFileSync(t *testing.T) {
	t.Parallel()
	b, err := Open(Options{DataDir: t.TempDir(), NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StatsInterval: time.Hour, Syncer: FileSync})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.sampleStats(partition.WallMillis() + 60_000)
	if ns := b.NodeStats(); ns.SyncMode != "file" || ns.Sync != nil || !ns.DiskKnown || ns.DiskSizeBytes == 0 {
		t.Errorf("node stats in file sync mode %+v, want no sync sample and the disk", ns)
	}
}
