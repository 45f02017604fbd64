package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// parkBroker holds every produce until release is closed, as a slow fsync does.
type parkBroker struct {
	benchBroker
	parked  *atomic.Int32
	release chan struct{}
}

func (p parkBroker) Produce(ctx context.Context, topic string, msgs []broker.Outgoing) ([]broker.Produced, error) {
	p.parked.Add(1)
	defer p.parked.Add(-1)
	<-p.release
	return p.benchBroker.Produce(ctx, topic, msgs)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loopbackRequest is httptest.NewRequest with a loopback Host: without security the
// server answers only loopback names (origin.go).
func loopbackRequest(method, target string, body io.Reader) *http.Request {
	req := httptest.NewRequest(method, target, body)
	req.Host = "127.0.0.1"
	return req
}

// TestBodyBudget: with produces held in the broker (a slow disk), request bodies past
// MaxInflightBytes are refused with 503 overloaded and Retry-After before they are read,
// the rest are served, and the bytes come back when each request ends.
func TestBodyBudget(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	var parked atomic.Int32
	pb := parkBroker{parked: &parked, release: make(chan struct{})}
	m := broker.NewMetrics()
	h, err := New(pb, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: m, MaxInflightBytes: 3 * mib})
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte{'x'}, mib)
	produce := func() *httptest.ResponseRecorder {
		req := loopbackRequest(http.MethodPost, "/v1/topics/t/produce", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}

	const n = 5
	answers := make(chan *httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers <- produce()
		}()
	}
	// 3 MiB hold three 1 MiB bodies; the other two are refused at once.
	var refused []*httptest.ResponseRecorder
	for len(refused) < n-3 {
		select {
		case w := <-answers:
			refused = append(refused, w)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d answers within 30 s while produces are held, want %d refusals", len(refused), n-3)
		}
	}
	waitUntil(t, "three produces held in the broker", func() bool { return parked.Load() == 3 })
	for _, w := range refused {
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
			t.Fatalf("excess request: status %d, Retry-After %q, body %s; want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code != "overloaded" || !strings.Contains(e.Error.Message, "--max-inflight-bytes") {
			t.Fatalf("excess request: body %s, want the JSON error overloaded naming the flag", w.Body)
		}
	}
	if got := promtest.ToFloat64(m.BodyBytesInFlight); got != 3*mib {
		t.Errorf("body bytes in flight %v while three 1 MiB produces are held, want %d", got, 3*mib)
	}
	if got := promtest.ToFloat64(m.BodiesRefused); got != n-3 {
		t.Errorf("refusals counted %v, want %d", got, n-3)
	}
	// A request without a body takes nothing: it is served while the budget is spent.
	w := httptest.NewRecorder()
	h.ServeHTTP(w, loopbackRequest(http.MethodGet, "/v1/topics/t/consume-batch?max=1", nil))
	if w.Code != http.StatusOK {
		t.Errorf("consume-batch while the body budget is spent: %d %s, want 200", w.Code, w.Body)
	}

	close(pb.release)
	wg.Wait()
	close(answers)
	for w := range answers {
		if w.Code != http.StatusAccepted {
			t.Errorf("held produce: %d %s, want 202", w.Code, w.Body)
		}
	}
	if got := promtest.ToFloat64(m.BodyBytesInFlight); got != 0 {
		t.Errorf("body bytes in flight %v after every request ended, want 0", got)
	}
	// The bytes came back: requests that would have been refused are served now.
	for i := 0; i < n; i++ {
		if w := produce(); w.Code != http.StatusAccepted {
			t.Fatalf("produce %d after the others ended: %d %s, want 202", i, w.Code, w.Body)
		}
	}
	// One body larger than the whole budget is served when nothing else holds it.
	big, _ := json.Marshal(map[string]any{"messages": []any{
		map[string]any{"payload": strings.Repeat("a", 900_000)}, map[string]any{"payload": strings.Repeat("b", 900_000)},
		map[string]any{"payload": strings.Repeat("c", 900_000)}, map[string]any{"payload": strings.Repeat("d", 900_000)},
	}})
	w = httptest.NewRecorder()
	h.ServeHTTP(w, loopbackRequest(http.MethodPost, "/v1/topics/t/produce-batch", bytes.NewReader(big)))
	if w.Code != http.StatusAccepted {
		t.Fatalf("a %d-byte batch over a 3 MiB budget with nothing else held: %d %s, want 202", len(big), w.Code, w.Body)
	}
	if got := promtest.ToFloat64(m.BodiesRefused); got != n-3 {
		t.Errorf("refusals counted %v at the end, want %d", got, n-3)
	}
}
