package narad_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// receiveResult is what one Receive returned.
type receiveResult struct {
	msgs []*narad.Message
	err  error
	took time.Duration
}

func receiveAsync(c *narad.Client, ctx context.Context, topic string, opts ...narad.ConsumeOption) <-chan receiveResult {
	done := make(chan receiveResult, 1)
	go func() {
		start := time.Now()
		msgs, err := c.Receive(ctx, topic, opts...)
		done <- receiveResult{msgs, err, time.Since(start)}
	}()
	return done
}

func waitReceive(t *testing.T, done <-chan receiveResult, within time.Duration) receiveResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(within):
		t.Fatalf("Receive did not return within %s", within)
		return receiveResult{}
	}
}

// TestReceiveReturnsAnAnswerInFlightWhenCancelled: Receive's context is cancelled while
// the answer of its poll, which leased the topic's messages, is on its way (the broker
// sent it, the client has not read its headers). The answer reaches the client 200 ms
// after the cancel, unless the client has cut the connection by then. The poll is left
// open for it, so Receive returns the messages and its caller hands them back: another
// client gets them at once, not after the topic's 60 s visibility timeout. A Receive
// that cut its poll at once dropped the answer with its leases.
func TestReceiveReturnsAnAnswerInFlightWhenCancelled(t *testing.T) {
	plain := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, plain, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Minute})
	const produced = 2
	for i := range produced {
		if _, err := plain.Produce(ctx, topic, "in flight "+string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	p := startReleaseProxy(t, release)
	c := newClientAt(t, []string{p.url()})
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := receiveAsync(c, rctx, topic, narad.WithMaxMessages(10), narad.WithWait(5*time.Second))
	select {
	case <-p.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the poll's answer never came from the broker")
	}
	cancel() // the answer, with its leases, is on its way
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	r := waitReceive(t, done, 30*time.Second)
	t.Logf("the cancelled Receive returned %d messages and %v after %s", len(r.msgs), r.err, r.took.Round(time.Millisecond))
	for _, m := range r.msgs {
		// The caller gave up: it hands back what the poll leased.
		if err := m.Nack(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	var again []*narad.Message
	for len(again) < produced && time.Since(start) < 10*time.Second {
		msgs, err := plain.Receive(ctx, topic, narad.WithMaxMessages(10), narad.WithWait(10*time.Second-time.Since(start)))
		if err != nil {
			t.Fatal(err)
		}
		again = append(again, msgs...)
	}
	if len(again) != produced {
		t.Fatalf("a second client got %d of the %d messages in %s: the rest stay leased until the 60 s visibility timeout (the cancelled Receive returned %d messages and %v)",
			len(again), produced, time.Since(start).Round(time.Millisecond), len(r.msgs), r.err)
	}
	for _, m := range again {
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r.err != nil || len(r.msgs) != produced {
		t.Fatalf("the cancelled Receive returned %d messages and %v; want the %d its answer leased and no error", len(r.msgs), r.err, produced)
	}
}

// TestReceiveCancelledWhileIdleEndsWithinTheAnswerWait: an idle poll (a 20 s wait on an
// empty topic) whose context is cancelled is left open only briefly for an answer
// (1 s): Receive returns the context's error soon after, not at the end of the wait,
// and the poll leased nothing.
func TestReceiveCancelledWhileIdleEndsWithinTheAnswerWait(t *testing.T) {
	plain := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, plain, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Minute})
	p := startHoldProxy(t, true, false)
	c := newClientAt(t, []string{p.url()})
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := receiveAsync(c, rctx, topic, narad.WithWait(20*time.Second))
	select {
	case <-p.polled:
	case <-time.After(30 * time.Second):
		t.Fatal("no poll was sent")
	}
	start := time.Now()
	cancel()
	r := waitReceive(t, done, 30*time.Second)
	took := time.Since(start)
	if len(r.msgs) != 0 || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Receive returned %d messages and %v; want the context's error", len(r.msgs), r.err)
	}
	if took > 5*time.Second {
		t.Fatalf("Receive returned %s after its context was cancelled; want about 1 s", took)
	}
	t.Logf("Receive returned %s after the cancel", took.Round(time.Millisecond))
	if _, err := plain.Produce(ctx, topic, "after"); err != nil {
		t.Fatal(err)
	}
	msgs, err := plain.Receive(ctx, topic, narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 || msgs[0].DeliveryAttempt != 1 {
		t.Fatalf("receive after the cut poll: %d messages, %v; want the new message, never delivered before", len(msgs), err)
	}
	if err := msgs[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveWithADoneContextSendsNoPoll: a poll whose caller gave up before it was
// sent is never sent, though a poll already sent is left open for its answer.
func TestReceiveWithADoneContextSendsNoPoll(t *testing.T) {
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/consume") {
			polls.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	c := newClientAt(t, []string{srv.URL})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, max := range []int{1, 10} {
		msgs, err := c.Receive(ctx, "t", narad.WithMaxMessages(max), narad.WithWait(5*time.Second))
		if len(msgs) != 0 || !errors.Is(err, context.Canceled) {
			t.Fatalf("Receive with a done context returned %d messages and %v; want the context's error", len(msgs), err)
		}
	}
	if err := c.Ready(ctxT(t)); err != nil { // a request that is sent, after them
		t.Fatal(err)
	}
	if n := polls.Load(); n != 0 {
		t.Fatalf("%d polls reached the server after their caller gave up", n)
	}
}

// TestCloseCutsAPollLeftOpenForItsAnswer: a poll whose caller gave up, left open for
// its answer, is cut at once by the client's Close: the answer stalls after its headers
// (it would otherwise be read for up to 5 s), and Receive returns soon after Close.
func TestCloseCutsAPollLeftOpenForItsAnswer(t *testing.T) {
	headers := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"messages":[`))
		w.(http.Flusher).Flush()
		close(headers)
		<-r.Context().Done() // the rest of the answer never comes
	}))
	defer srv.Close()
	defer srv.CloseClientConnections()
	c, err := narad.New([]string{srv.URL}, narad.WithRetry(narad.RetryPolicy{Attempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := receiveAsync(c, rctx, "t", narad.WithMaxMessages(10), narad.WithWait(5*time.Second))
	select {
	case <-headers:
	case <-time.After(30 * time.Second):
		t.Fatal("the answer never began")
	}
	cancel()
	start := time.Now()
	c.Close()
	r := waitReceive(t, done, 30*time.Second)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Receive returned %s after Close; want at once, not after the answer's 5 s grace", took)
	}
	if r.err == nil || len(r.msgs) != 0 {
		t.Fatalf("Receive returned %d messages and %v; want an error", len(r.msgs), r.err)
	}
}
