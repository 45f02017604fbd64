package transport

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
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
	defer reportCPU(b)()
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

// BenchmarkStreamRoundTrip measures what BenchmarkCall does (a small message and its
// answer) over two raft streams kept open, one each way, each message a length-prefixed
// frame: the cost of a call's own stream (opened, half-closed and freed per call)
// against frames on a stream that stays, which replication messages could use.
func BenchmarkStreamRoundTrip(b *testing.B) {
	x := mustStartNode(b, "x", nil)
	y := mustStartNode(b, "y", nil)
	frame := binary.BigEndian.AppendUint32(nil, 64)
	frame = append(frame, make([]byte, 64)...)
	xOut, yIn := openRaftStream(b, x, y, frame)
	yOut, xIn := openRaftStream(b, y, x, frame)
	go func() { // y answers every frame on its own stream
		buf := make([]byte, len(frame))
		for {
			if _, err := io.ReadFull(yIn, buf); err != nil {
				return
			}
			if _, err := yOut.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, len(frame))
	b.ReportAllocs()
	defer reportCPU(b)()
	for range b.N {
		if _, err := xOut.Write(frame); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(xIn, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// openRaftStream opens a raft stream from a to b and returns both ends, once a first
// frame crossed it.
func openRaftStream(t testing.TB, a, b *testNode, frame []byte) (out, in net.Conn) {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := b.StreamLayer().Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	out, err := a.StreamLayer().Dial(raft.ServerAddress(b.Addr()), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write(frame); err != nil {
		t.Fatal(err)
	}
	in = <-accepted
	if in == nil {
		t.FailNow()
	}
	if _, err := io.ReadFull(in, make([]byte, len(frame))); err != nil {
		t.Fatal(err)
	}
	return out, in
}

// reportCPU resets the timer and returns a func that reports the process's CPU time
// (user and system, both nodes of the benchmark) per operation as cpu-µs/op: on a
// machine other work shares, the CPU a round trip costs is steadier than its latency.
func reportCPU(b *testing.B) func() {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	b.ResetTimer()
	return func() {
		b.StopTimer()
		b.ReportMetric(float64(cpu()-start)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	}
}
