package httpapi

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// benchBroker answers at once, so the benchmarks below measure the HTTP layer alone:
// routing, checks, JSON decoding and encoding. Methods it does not override panic
// (the embedded interface is nil): a benchmark that reaches one is wrong.
type benchBroker struct {
	Broker
	payload []byte
}

func (benchBroker) Ready() bool              { return true }
func (benchBroker) Clustered() bool          { return false }
func (benchBroker) Exists(name string) error { return nil }

func (benchBroker) Produce(_ context.Context, _ string, msgs []broker.Outgoing) ([]broker.Produced, error) {
	out := make([]broker.Produced, len(msgs))
	for i := range out {
		out[i] = broker.Produced{Partition: int32(i % 6), Offset: uint64(1_000_000 + i)}
	}
	return out, nil
}

func (b benchBroker) Consume(_ context.Context, _ string, max int, _ time.Duration) ([]broker.Delivered, error) {
	out := make([]broker.Delivered, max)
	for i := range out {
		out[i] = broker.Delivered{Partition: int32(i % 6), Offset: uint64(1_000_000 + i), Value: b.payload, Attrs: kindBinary,
			Timestamp: 1_764_000_000_000, Handle: "3.1.2.1000000.77777777." + strconv.Itoa(i), Attempt: 1}
	}
	return out, nil
}

func (benchBroker) Ack(_ string, reqs []broker.AckReq) []error {
	return make([]error, len(reqs))
}

func benchHandler(b *testing.B) http.Handler {
	b.Helper()
	h, err := New(benchBroker{payload: bytes.Repeat([]byte{0xab}, 256)}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: broker.NewMetrics(), AllowedHosts: []string{"example.com"}})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

func serveBench(b *testing.B, h http.Handler, method, target, ctype string, body []byte, want int) {
	b.Helper()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := httptest.NewRequest(method, target, bytes.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			b.Fatalf("%s %s: %d %s", method, target, rec.Code, rec.Body)
		}
	}
}

// BenchmarkHTTPProduce is one 256-byte binary produce through the whole handler stack.
func BenchmarkHTTPProduce(b *testing.B) {
	serveBench(b, benchHandler(b), "POST", "/v1/topics/bench/produce", "application/octet-stream", bytes.Repeat([]byte{0xab}, 256), 202)
}

// BenchmarkHTTPProduceBatch is a produce-batch of 100 base64 payloads of 256 bytes.
func BenchmarkHTTPProduceBatch(b *testing.B) {
	body, _ := benchBatchBodies()
	serveBench(b, benchHandler(b), "POST", "/v1/topics/bench/produce-batch", "application/json", body, 202)
}

// BenchmarkHTTPConsumeBatch leases 100 messages of 256 bytes and encodes them.
func BenchmarkHTTPConsumeBatch(b *testing.B) {
	serveBench(b, benchHandler(b), "GET", "/v1/topics/bench/consume-batch?max=100", "", nil, 200)
}

// BenchmarkHTTPAckBatch settles 100 receipt handles in one request.
func BenchmarkHTTPAckBatch(b *testing.B) {
	_, body := benchBatchBodies()
	serveBench(b, benchHandler(b), "POST", "/v1/topics/bench/ack-batch", "application/json", body, 200)
}

// BenchmarkHTTPAck is one ack by query parameter.
func BenchmarkHTTPAck(b *testing.B) {
	serveBench(b, benchHandler(b), "POST", "/v1/topics/bench/ack?receipt_handle=3.1.2.1000000.77777777.1", "", nil, 204)
}
