package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
)

// TestStatsSamples drives the sampler by hand: the first sample of a topic only records
// its counters, later ones carry what was produced and acked in between and the
// backlog; the ring keeps StatsSamples samples, oldest first; a deleted topic's ring is
// dropped and a topic created again under its name starts empty.
func TestStatsSamples(t *testing.T) {
	t.Parallel()
	// An hour between the sampler's own ticks: the samples below are the test's.
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
	// The sampler takes its first sample as it starts (its next is an hour away): wait
	// for it before the topic opens. Taken late on a loaded machine, after the create,
	// it was a sample of the test's topic before the test's own, with every count 0.
	waitFirstSample(t, b)
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "s", Partitions: ptr[int32](2)}); err != nil {
		t.Fatal(err)
	}
	// Messages produced before the first tick count in the first sample: the ring starts
	// when the topic opens.
	produceN(t, b, "s", 5)
	t0 := partition.WallMillis() + 60_000 // ahead of the clock, so the samples below keep their order
	b.sampleStats(t0)
	ds, err := b.Consume(ctx, "s", 2, 0)
	if err != nil || len(ds) != 2 {
		t.Fatalf("consume: %d messages, %v", len(ds), err)
	}
	for _, d := range ds {
		if errs := b.Ack("s", []AckReq{{Handle: d.Handle, Mode: Settle}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	b.sampleStats(t0 + 2000)
	st, err := b.TopicStats("s")
	if err != nil {
		t.Fatal(err)
	}
	if st.IntervalMs != time.Hour.Milliseconds() {
		t.Errorf("interval %d ms, want an hour's", st.IntervalMs)
	}
	if len(st.Samples) != 2 {
		t.Fatalf("samples: %+v, want 2", st.Samples)
	}
	first, second := st.Samples[0], st.Samples[1]
	if first.AtMs != t0 || first.Produced != 5 || first.Acked != 0 || first.Backlog != 5 || first.ProduceHz <= 0 || first.ProduceHz > 5.0/60 {
		t.Errorf("first sample %+v, want 5 produced over the minute since the topic opened, a backlog of 5", first)
	}
	if first.OldestAgeMs < 60_000 {
		t.Errorf("first sample's oldest unacked age %d ms, want at least the minute the sample is ahead", first.OldestAgeMs)
	}
	if want := (StatsSample{AtMs: t0 + 2000, Acked: 2, AckHz: 1, Backlog: 3, OldestAgeMs: second.OldestAgeMs}); second != want {
		t.Errorf("second sample %+v, want %+v", second, want)
	}

	for i := 0; i < StatsSamples+7; i++ {
		b.sampleStats(t0 + 4000 + int64(i)*1000)
	}
	st, _ = b.TopicStats("s")
	if len(st.Samples) != StatsSamples {
		t.Fatalf("%d samples kept, want the ring's %d", len(st.Samples), StatsSamples)
	}
	for i := 1; i < len(st.Samples); i++ {
		if st.Samples[i].AtMs <= st.Samples[i-1].AtMs {
			t.Fatalf("samples out of order at %d: %d after %d", i, st.Samples[i].AtMs, st.Samples[i-1].AtMs)
		}
	}
	if last := st.Samples[len(st.Samples)-1]; last.AtMs != t0+4000+int64(StatsSamples+6)*1000 || last.Backlog != 3 {
		t.Errorf("last sample %+v", last)
	}

	if err := b.DeleteTopic(ctx, "s", 0); err != nil {
		t.Fatal(err)
	}
	b.sampleStats(t0 + 999_000)
	b.stats.mu.Lock()
	rings := len(b.stats.rings)
	b.stats.mu.Unlock()
	if rings != 0 {
		t.Errorf("%d rings after the topic was deleted, want 0", rings)
	}
	if _, err := b.TopicStats("s"); !errors.Is(err, ErrTopicNotFound) {
		t.Errorf("stats of a deleted topic: %v, want ErrTopicNotFound", err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "s", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.TopicStats("s"); len(st.Samples) != 0 {
		t.Errorf("the topic created again: %+v, want no samples yet", st.Samples)
	}
	produceN(t, b, "s", 1)
	b.sampleStats(t0 + 1_000_000)
	if st, _ := b.TopicStats("s"); len(st.Samples) != 1 || st.Samples[0].Backlog != 1 || st.Samples[0].Produced != 1 {
		t.Errorf("the topic created again: %+v, want one sample of its own message only", st.Samples)
	}
}

// waitFirstSample waits for the sample the stats loop takes as it starts, so that it
// cannot land among a test's own.
func waitFirstSample(t *testing.T, b *Broker) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); b.NodeStats().Sync == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the sampler's first sample did not come within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
