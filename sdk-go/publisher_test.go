package narad_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestPublisherBatchesByCount(t *testing.T) {
	var batches atomic.Int32
	c := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventPublish {
			batches.Add(1)
		}
	}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	p := c.Publisher(topic, narad.WithBatchCount(10), narad.WithLinger(time.Hour))
	var pend []*narad.Pending
	for i := 0; i < 30; i++ {
		r, err := p.Publish(ctx, []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		pend = append(pend, r)
	}
	// An hour of linger: only the count can have sent these.
	for i, r := range pend {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// The observer hears of a batch just after its messages' results are given: wait
	// for the third one rather than read the count at once.
	for deadline := time.Now().Add(10 * time.Second); batches.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := batches.Load(); n != 3 {
		t.Fatalf("%d batches, want 3", n)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := p.Publish(ctx, "late"); !errors.Is(err, narad.ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
}

func TestPublisherLingerAndFlush(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	p := c.Publisher(topic, narad.WithLinger(100*time.Millisecond))
	defer p.Close(ctx)
	start := time.Now()
	r, err := p.Publish(ctx, "lingered", narad.WithKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Wait(ctx)
	if err != nil || got.Topic != topic {
		t.Fatalf("%+v %v", got, err)
	}
	if d := time.Since(start); d < 90*time.Millisecond {
		t.Fatalf("sent after %s, before the linger", d)
	}
	if _, err := r.Result(); err != nil {
		t.Fatal(err)
	}
	// Flush sends at once, without waiting for the linger.
	p2 := c.Publisher(topic, narad.WithLinger(time.Hour))
	r2, _ := p2.Publish(ctx, "flushed")
	if _, err := r2.Result(); !errors.Is(err, narad.ErrTimeout) {
		t.Fatalf("result before it is known: %v", err)
	}
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r2.Done():
	default:
		t.Fatal("Flush returned before the message's result was known")
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, topic)
	if string(m.Bytes()) != "lingered" || m.Key != "k" {
		t.Fatalf("got %q key %q", m.Bytes(), m.Key)
	}
}

// TestPublisherBufferFull holds the first batch at the transport, fills the buffer, and
// checks both the typed error of a non-blocking publisher and the blocking one.
func TestPublisherBufferFull(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	gate := make(chan struct{})
	var held atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce-batch") {
			held.Add(1)
			<-gate
		}
		return nil, nil
	}, nil)
	p := c.Publisher(topic, narad.WithBufferSize(2), narad.WithNonBlocking(), narad.WithLinger(0))
	var pend []*narad.Pending
	for i := 0; i < 2; i++ {
		r, err := p.Publish(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		pend = append(pend, r)
	}
	if _, err := p.Publish(ctx, "x"); !errors.Is(err, narad.ErrBufferFull) {
		t.Fatalf("third publish: %v", err)
	}
	pb := c.Publisher(topic, narad.WithBufferSize(1), narad.WithLinger(0))
	if _, err := pb.Publish(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := pb.Publish(short, "y"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a blocking publisher must block until ctx ends: %v", err)
	}
	close(gate)
	for _, r := range pend {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pb.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestPublisherReportsFailuresPerMessage(t *testing.T) {
	c := newClient(t, narad.WithRetry(narad.RetryPolicy{Attempts: 1}))
	ctx := ctxT(t)
	p := c.Publisher("no-such-topic-p", narad.WithLinger(0))
	r, err := p.Publish(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Wait(ctx); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("result: %v", err)
	}
	if err := p.Close(ctx); !errors.Is(err, narad.ErrNotFound) && err != nil {
		t.Fatalf("close: %v", err)
	}
}

// BenchmarkPublisher measures Publisher throughput of 256-byte messages against the
// local node, with the defaults and with bigger batches sent four at a time.
func BenchmarkPublisher(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []narad.PublisherOption
	}{
		{"defaults", nil},
		{"batch500x4", []narad.PublisherOption{narad.WithBatchCount(500), narad.WithInFlightBatches(4)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := narad.New([]string{shared.url})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			topic := "bench-publisher-" + bc.name
			if _, err := c.EnsureTopic(ctx, topic, narad.TopicConfig{Partitions: 3}); err != nil {
				b.Fatal(err)
			}
			p := c.Publisher(topic, bc.opts...)
			body := make([]byte, 256)
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := p.Publish(ctx, body); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Close(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// TestPublisherIsolatesARefusedMessage: a message the broker refuses (a schema
// violation) makes it refuse the whole batch it travels in, with 400 and nothing
// stored. The other messages of that batch, published by other callers, are valid: they
// must be stored and resolve, not fail with the refused one's BadRequest (which a caller
// takes as "fix the request, never retry" and drops).
func TestPublisherIsolatesARefusedMessage(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	schema := json.RawMessage(`{"type":"object","required":["id"],"properties":{"id":{"type":"integer"}}}`)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, Schema: schema})
	p := c.Publisher(topic, narad.WithLinger(time.Second))
	good1, err := p.Publish(ctx, map[string]int{"id": 1})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := p.Publish(ctx, map[string]string{"id": "one"})
	if err != nil {
		t.Fatal(err)
	}
	good2, err := p.Publish(ctx, map[string]int{"id": 3})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close(ctx)
	if _, err := bad.Wait(ctx); !errors.Is(err, narad.ErrBadRequest) {
		t.Fatalf("the invalid message: %v, want ErrBadRequest", err)
	}
	for i, r := range []*narad.Pending{good1, good2} {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatalf("valid message %d failed with the invalid one's refusal: %v", i, err)
		}
	}
	info, err := c.Topic(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.Stats[0].NextOffset; n != 2 {
		t.Fatalf("stored %d messages, want the 2 valid ones", n)
	}
}
