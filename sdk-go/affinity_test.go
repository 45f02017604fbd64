package narad_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// recordingHandler keeps the log records a client writes, for tests that check what it
// warns about.
type recordingHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) count(level slog.Level, contains string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, contains) {
			n++
		}
	}
	return n
}

// TestEndpointsTwoIndependentNodes gives a client two nodes that are not one cluster
// (each its own single-node broker) holding a topic of the same name. Every produced
// message must be consumed and acked: calls stick to the first node instead of rotating,
// so acks reach the node that issued the lease. The client warns once that its
// endpoints are not one cluster, and keeps working.
func TestEndpointsTwoIndependentNodes(t *testing.T) {
	second, err := startBroker(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.stop)
	logs := &recordingHandler{}
	c := newClientAt(t, []string{shared.url, second.url}, narad.WithLogger(slog.New(logs)))
	ctx := ctxT(t)
	topic := mustTopic(t, newClient(t), narad.TopicConfig{Partitions: 1})
	if _, err := newClientAt(t, []string{second.url}).CreateTopic(ctx, topic, narad.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	const n = 12
	for i := 0; i < n; i++ {
		if _, err := c.Produce(ctx, topic, []byte{byte(i)}); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	acked := 0
	for tries := 0; acked < n && tries < 3*n; tries++ {
		msgs, err := c.Receive(ctx, topic, narad.WithWait(time.Second))
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		for _, m := range msgs {
			if err := m.Ack(ctx); err != nil {
				t.Fatalf("ack of message %d: %v", m.Offset, err)
			}
			acked++
		}
	}
	if acked != n {
		t.Fatalf("acked %d of %d messages", acked, n)
	}
	eventually(t, 30*time.Second, "a warning that the endpoints are not one cluster", func() bool {
		return logs.count(slog.LevelWarn, "not one cluster") == 1
	})
	// More calls never warn again.
	if _, err := c.Topics(ctx); err != nil {
		t.Fatal(err)
	}
	if got := logs.count(slog.LevelWarn, "not one cluster"); got != 1 {
		t.Fatalf("warned %d times, want once", got)
	}
}

// TestLeaseCallsGoToTheLeasingNode: a message leased from the second endpoint (the
// first refused the poll) is acked at the second endpoint, although the first is the
// preferred one again by then.
func TestLeaseCallsGoToTheLeasingNode(t *testing.T) {
	// Both endpoints reach the shared broker: the first through a fault transport
	// keyed on a host alias, so the test can tell them apart.
	ft := &faultTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	alias := strings.Replace(shared.url, "127.0.0.1", "localhost", 1)
	var consumeFaults atomic.Int32
	consumeFaults.Store(1)
	var mu sync.Mutex
	var acksAt []string
	ft.set(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host == strings.TrimPrefix(shared.url, "http://") && strings.HasSuffix(r.URL.Path, "/consume") && consumeFaults.Add(-1) >= 0 {
			return unavailable(""), nil
		}
		if strings.HasSuffix(r.URL.Path, "/ack") {
			mu.Lock()
			acksAt = append(acksAt, r.URL.Host)
			mu.Unlock()
		}
		return nil, nil
	}, nil)
	c := newClientAt(t, []string{shared.url, alias}, narad.WithHTTPClient(&http.Client{Transport: ft}), narad.WithBreaker(5, time.Hour))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "x"); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Receive(ctx, topic, narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive: %d %v", len(msgs), err)
	}
	if err := msgs[0].Extend(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := msgs[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := strings.TrimPrefix(alias, "http://")
	if len(acksAt) != 2 || acksAt[0] != want || acksAt[1] != want {
		t.Fatalf("extend and ack went to %v; want both at %s, the node that leased the message", acksAt, want)
	}
}

// TestEndpointsOneClusterNoWarning: two names of the same node are one cluster; the
// check answers and nothing is logged at warn.
func TestEndpointsOneClusterNoWarning(t *testing.T) {
	alias := strings.Replace(shared.url, "127.0.0.1", "localhost", 1)
	logs := &recordingHandler{}
	var checked atomic.Int32
	ft := &faultTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if r.URL.Path == "/v1/cluster" && err == nil && resp.StatusCode == 200 {
			checked.Add(1)
		}
		return resp, err
	})
	c := newClientAt(t, []string{shared.url, alias}, narad.WithLogger(slog.New(logs)), narad.WithHTTPClient(&http.Client{Transport: ft}))
	if _, err := c.Topics(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "both endpoints to answer the cluster check", func() bool { return checked.Load() == 2 })
	c.Close() // waits for the check to finish
	if n := logs.count(slog.LevelWarn, "not one cluster"); n != 0 {
		t.Fatalf("warned %d times about one node under two names", n)
	}
}
