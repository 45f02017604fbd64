package transport

import (
	"context"
	"testing"
)

// BenchmarkCall measures the round trip of a small Call over an established
// connection on loopback.
func BenchmarkCall(b *testing.B) {
	x := mustStartNode(b, "x", nil)
	y := mustStartNode(b, "y", nil)
	y.Handle(100, func(_ context.Context, _ string, req []byte) ([]byte, error) { return req, nil })
	req := make([]byte, 64)
	ctx := context.Background()
	if _, err := x.Call(ctx, y.Addr(), 100, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := x.Call(ctx, y.Addr(), 100, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallParallel measures calls in flight together on one connection.
func BenchmarkCallParallel(b *testing.B) {
	x := mustStartNode(b, "x", nil)
	y := mustStartNode(b, "y", nil)
	y.Handle(100, func(_ context.Context, _ string, req []byte) ([]byte, error) { return req, nil })
	req := make([]byte, 64)
	if _, err := x.Call(context.Background(), y.Addr(), 100, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := x.Call(context.Background(), y.Addr(), 100, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
