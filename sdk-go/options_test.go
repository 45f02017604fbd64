package narad_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// logRecorder is a slog.Handler that keeps the messages it is given.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }
func (l *logRecorder) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// TestLoggerAndPoolWarning: the client logs through the given logger (retries, a
// consumer bigger than the pool), and is quiet otherwise.
func TestLoggerAndPoolWarning(t *testing.T) {
	rec := &logRecorder{}
	ft := &faultTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	var n atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if n.Add(1) == 1 {
			return unavailable("0"), nil
		}
		return nil, nil
	}, nil)
	c := newClient(t, narad.WithLogger(slog.New(rec)), narad.WithHTTPClient(&http.Client{Transport: ft}))
	if _, err := c.Topics(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !rec.has("retrying") {
		t.Fatalf("no retry logged: %v", rec.msgs)
	}
	small := newClient(t, narad.WithLogger(slog.New(rec)), narad.WithPoolSize(2))
	small.Consumer("any", func(context.Context, *narad.Message) error { return nil }, narad.WithConcurrency(8))
	if !rec.has("connection pool") {
		t.Fatalf("no pool warning: %v", rec.msgs)
	}
}

// TestRequestTimeoutBoundsEachAttempt: an attempt that hangs past the request timeout
// fails as a retryable, uncertain timeout and is retried; with NoDuplicates a produce
// is not retried and says its outcome is unknown.
func TestRequestTimeoutBoundsEachAttempt(t *testing.T) {
	ft := &faultTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	var hung atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce") && hung.Add(1) == 1 {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		return nil, nil
	}, nil)
	c := newClient(t, narad.WithRequestTimeout(500*time.Millisecond), narad.WithHTTPClient(&http.Client{Transport: ft}))
	ctx := ctxT(t)
	// The topics are made by a client with the default timeout: a create slower than
	// the short one (a loaded machine) would time out, be retried, and meet its own
	// first attempt's topic (409).
	admin := newClient(t)
	topic := mustTopic(t, admin, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "x"); err != nil {
		t.Fatalf("retried produce: %v", err)
	}
	hung.Store(0)
	_, err := c.Produce(ctx, topic, "y", narad.NoDuplicates())
	if !errors.Is(err, narad.ErrTimeout) || !narad.Uncertain(err) || !narad.Retryable(err) || hung.Load() != 1 {
		t.Fatalf("no-duplicates produce: %v (attempts %d)", err, hung.Load())
	}
	// A long poll is not cut by the request timeout: its deadline is its wait plus a margin.
	start := time.Now()
	msgs, err := c.Receive(ctx, mustTopic(t, admin, narad.TopicConfig{Partitions: 1}), narad.WithWait(time.Second))
	if err != nil || len(msgs) != 0 || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("long poll under a short request timeout: %v after %s", err, time.Since(start))
	}
}

// TestWithoutRenewalLeaseLapses: without renewal a handler that outlives the lease loses
// the message to another worker, and its late ack is reported as lost.
func TestWithoutRenewalLeaseLapses(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 400 * time.Millisecond})
	produceN(t, c, topic, 1)
	var deliveries atomic.Int32
	redelivered := make(chan struct{})
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		switch deliveries.Add(1) {
		case 1:
			select { // outlive the lease until the other worker has the message
			case <-redelivered:
			case <-time.After(10 * time.Second):
			}
		case 2:
			close(redelivered)
		}
		return nil
	}, narad.WithoutRenewal(), narad.WithConcurrency(2), narad.WithWait(200*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 20*time.Second, "one ack and one loss", func() bool {
		st := cs.Stats()
		return st.Acked == 1 && st.Lost == 1
	})
	stop()
	if st := cs.Stats(); st.Renewals != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestNackDelayOption(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceN(t, c, topic, 1)
	var first time.Time
	var gap atomic.Int64
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		if m.DeliveryAttempt == 1 {
			first = time.Now()
			return errors.New("later")
		}
		gap.Store(int64(time.Since(first)))
		return nil
	}, narad.WithNackDelay(500*time.Millisecond), narad.WithWait(200*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 20*time.Second, "the ack", func() bool { return cs.Stats().Acked == 1 })
	stop()
	if d := time.Duration(gap.Load()); d < 450*time.Millisecond {
		t.Fatalf("redelivered after %s, before the nack delay", d)
	}
}

func TestPublisherBatchesByBytes(t *testing.T) {
	var batches, largest atomic.Int32
	c := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventPublish {
			batches.Add(1)
			for {
				l := largest.Load()
				if int32(e.Messages) <= l || largest.CompareAndSwap(l, int32(e.Messages)) {
					break
				}
			}
		}
	}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	p := c.Publisher(topic, narad.WithBatchBytes(4000), narad.WithLinger(time.Hour), narad.WithInFlightBatches(2))
	for i := 0; i < 12; i++ {
		if _, err := p.Publish(ctx, strings.Repeat("x", 1000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// 1000 bytes travel as about 1400 of base64: at most two fit under 4000.
	if batches.Load() < 6 || largest.Load() > 2 {
		t.Fatalf("%d batches, largest %d", batches.Load(), largest.Load())
	}
	info, _ := c.Topic(ctx, topic)
	if info.Stats[0].NextOffset != 12 {
		t.Fatalf("stored %d", info.Stats[0].NextOffset)
	}
}

// TestPublisherNoDuplicates: a batch whose reply is lost is not sent again; its
// messages report an uncertain outcome.
func TestPublisherNoDuplicates(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	var sent atomic.Int32
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/produce-batch") {
			sent.Add(1)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil, errors.New("connection reset (injected)")
		}
		return resp, err
	})
	p := c.Publisher(topic, narad.WithPublisherNoDuplicates(), narad.WithLinger(0))
	r, err := p.Publish(ctx, "once")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Wait(ctx); !narad.Uncertain(err) || sent.Load() != 1 {
		t.Fatalf("result %v after %d sends", err, sent.Load())
	}
	p.Close(ctx)
	ft.set(nil, nil)
	info, _ := c.Topic(ctx, topic)
	if info.Stats[0].NextOffset != 1 {
		t.Fatalf("stored %d copies, want the one that was sent", info.Stats[0].NextOffset)
	}
}

func TestPositionClone(t *testing.T) {
	p := narad.FromOffsets(map[int32]int64{0: 5})
	q := p.Clone()
	q.Advance(&narad.Message{Partition: 0, Offset: 9})
	q.Advance(&narad.Message{Partition: 1, Offset: 2})
	if p.Offsets[0] != 5 || len(p.Offsets) != 1 || q.Offsets[0] != 10 || q.Offsets[1] != 3 {
		t.Fatalf("%+v %+v", p, q)
	}
	q.Advance(&narad.Message{Partition: 0, Offset: 3}) // never moves back
	if q.Offsets[0] != 10 {
		t.Fatalf("moved back: %+v", q)
	}
}
