package queue

import (
	"testing"
	"time"
)

// BenchmarkLeaseSettle is the queue state's share of one message's life: lease it,
// begin and commit its settle, in order (the frontier advances every time).
func BenchmarkLeaseSettle(b *testing.B) {
	s := New(Config{Visibility: 30 * time.Second, MaxInFlight: 1 << 20, MaxAckedAhead: 1 << 20}, 1, 0, nil)
	s.SetBounds(0, uint64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g := s.Lease(int64(i), 1)
		if len(g) != 1 {
			b.Fatalf("lease %d: %d grants", i, len(g))
		}
		if err := s.BeginSettle(g[0].Offset, g[0].Nonce, int64(i)); err != nil {
			b.Fatal(err)
		}
		s.CommitSettle(g[0].Offset)
	}
}

// BenchmarkLeaseSettleBatch leases 100 at a time and settles them out of order (the
// acked-ahead set grows and drains), as consume-batch and ack-batch do.
func BenchmarkLeaseSettleBatch(b *testing.B) {
	s := New(Config{Visibility: 30 * time.Second, MaxInFlight: 1 << 20, MaxAckedAhead: 1 << 20}, 1, 0, nil)
	s.SetBounds(0, uint64(b.N)*100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		gs := s.Lease(int64(i), 100)
		for j := len(gs) - 1; j >= 0; j-- {
			if err := s.BeginSettle(gs[j].Offset, gs[j].Nonce, int64(i)); err != nil {
				b.Fatal(err)
			}
			s.CommitSettle(gs[j].Offset)
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkHandleRoundTrip encodes a receipt handle and decodes it, as every consume
// and ack do.
func BenchmarkHandleRoundTrip(b *testing.B) {
	h := Handle{Incarnation: 12, Partition: 3, Offset: 1_234_567, Nonce: Nonce{Epoch: 90_000_000, Seq: 987_654}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := DecodeHandle(h.Encode()); err != nil {
			b.Fatal(err)
		}
	}
}
