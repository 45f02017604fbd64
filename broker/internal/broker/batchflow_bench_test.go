package broker

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
)

// BenchmarkBatchFlow is the batched flow without HTTP: each operation produces 100
// messages of 256 bytes to a topic of 6 partitions, consumes them in batches and acks
// every one in batches, in the write-ahead mode a node runs. Its data directory is on
// tmpfs when the machine has one (/dev/shm), where a sync costs nothing: the figure is
// the broker's CPU per 100 messages, not the disk's latency.
func BenchmarkBatchFlow(b *testing.B) {
	dir := b.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "narad-bench-")
		if err == nil {
			dir = d
			b.Cleanup(func() { _ = os.RemoveAll(d) })
		}
	}
	br, err := Open(Options{DataDir: dir, NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WAL: true})
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	ctx := context.Background()
	if err := br.Start(ctx); err != nil {
		b.Fatal(err)
	}
	parts := int32(6)
	if _, err := br.CreateTopic(ctx, TopicSpec{Name: "bench", Partitions: &parts}); err != nil {
		b.Fatal(err)
	}
	msgs := make([]Outgoing, 100)
	for i := range msgs {
		msgs[i] = Outgoing{Partition: -1, Value: make([]byte, 256)}
	}
	acks := make([]AckReq, 0, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := br.Produce(ctx, "bench", msgs); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < len(msgs); {
			ds, err := br.Consume(ctx, "bench", len(msgs)-got, 0)
			if err != nil {
				b.Fatal(err)
			}
			if len(ds) == 0 {
				b.Fatalf("consumed %d of %d messages", got, len(msgs))
			}
			got += len(ds)
			acks = acks[:0]
			for _, d := range ds {
				acks = append(acks, AckReq{Handle: d.Handle, Mode: Settle})
			}
			for j, err := range br.Ack("bench", acks) {
				if err != nil {
					b.Fatalf("ack %d: %v", j, err)
				}
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
}
