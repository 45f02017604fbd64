package narad_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestFailoverOneEndpointDead gives the client a dead endpoint and a live one: every call
// succeeds, the dead one's breaker opens and keeps it out of the rotation.
func TestFailoverOneEndpointDead(t *testing.T) {
	dead, err := freeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead
	var mu sync.Mutex
	perNode := map[string]int{}
	var opened atomic.Int32
	c := newClientAt(t, []string{deadURL, shared.url}, narad.WithBreaker(2, time.Hour), narad.WithObserver(func(e narad.Event) {
		switch e.Kind {
		case narad.EventRequest:
			mu.Lock()
			perNode[e.Node]++
			mu.Unlock()
		case narad.EventBreakerOpen:
			if e.Node == deadURL {
				opened.Add(1)
			}
		}
	}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	for i := 0; i < 20; i++ {
		if _, err := c.Produce(ctx, topic, []byte{byte(i)}, narad.NoDuplicates()); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	msgs, err := c.Receive(ctx, topic, narad.WithMaxMessages(20), narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 20 {
		t.Fatalf("receive: %v %d", err, len(msgs))
	}
	if _, err := c.AckBatch(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if opened.Load() != 1 || perNode[deadURL] > 2 || perNode[shared.url] < 22 {
		t.Fatalf("breaker opened %d times; requests per node %v", opened.Load(), perNode)
	}
}

// TestFailoverProbeBringsNodeBack: a node that was down comes back into the rotation
// once its /readyz probe succeeds.
func TestFailoverProbeBringsNodeBack(t *testing.T) {
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + addr
	var opened, closed, servedByDown atomic.Int32
	c := newClientAt(t, []string{down, shared.url}, narad.WithBreaker(1, 100*time.Millisecond), narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRequest && e.Node == down && e.Status == 200 {
			servedByDown.Add(1)
		}
		if e.Kind == narad.EventBreakerOpen && e.Node == down {
			opened.Add(1)
		}
		if e.Kind == narad.EventBreakerClose && e.Node == down {
			closed.Add(1)
		}
	}))
	ctx := ctxT(t)
	for opened.Load() == 0 { // the rotation reaches the down node within two calls
		if _, err := c.Topics(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Bring a broker up at that address.
	startBrokerAt(t, addr)
	eventually(t, 30*time.Second, "the probe to close the breaker", func() bool { return closed.Load() == 1 })
	// Back in the rotation: it serves its share of calls again.
	for i := 0; i < 4; i++ {
		if _, err := c.Topics(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if servedByDown.Load() == 0 {
		t.Fatal("the node that came back serves no calls")
	}
}

// TestAllEndpointsDeadFailsRetryable: with no node up, calls fail with a retryable,
// certain (never sent) error after the policy's attempts.
func TestAllEndpointsDeadFailsRetryable(t *testing.T) {
	a1, _ := freeAddr()
	a2, _ := freeAddr()
	c := newClientAt(t, []string{a1, a2}, narad.WithRetry(narad.RetryPolicy{Attempts: 3}))
	_, err := c.Produce(ctxT(t), "any", "x")
	var e *narad.Error
	if !errors.As(err, &e) || !errors.Is(err, narad.ErrUnavailable) || !narad.Retryable(err) || narad.Uncertain(err) || e.Status != 0 {
		t.Fatalf("all dead: %v (retryable %v, uncertain %v)", err, narad.Retryable(err), narad.Uncertain(err))
	}
}

func startBrokerAt(t *testing.T, addr string) *brokerProc {
	t.Helper()
	b, err := startBrokerOn(addr, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	return b
}

// TestRetryAfterIsBoundedByTheCallBudget: a Retry-After never holds a call past its
// budget (attempts × per-attempt bound + backoff: 4 × 1 s + 3 × 5 s here), past the
// caller's deadline, or longer than 300 s: the call fails at once with the retryable
// error instead. The old code slept whatever the header said: an hour here, so a call
// whose context had no deadline hung.
func TestRetryAfterIsBoundedByTheCallBudget(t *testing.T) {
	var n atomic.Int32
	var retryAfter atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.Header().Set("Retry-After", retryAfter.Load().(string))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"code":"throttled","message":"slow down"}}`)
	}))
	defer srv.Close()
	try := func(what, ra string, ctx context.Context, within time.Duration, opts ...narad.Option) {
		t.Helper()
		n.Store(0)
		retryAfter.Store(ra)
		c := newClientAt(t, []string{srv.URL}, opts...)
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := c.Produce(ctx, "t", "x")
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, narad.ErrThrottled) || !narad.Retryable(err) || n.Load() != 1 || time.Since(start) > within {
				t.Fatalf("%s: %v after %s and %d request(s); want a retryable ErrThrottled at once", what, err, time.Since(start), n.Load())
			}
		case <-time.After(25 * time.Second):
			t.Fatalf("%s: the call still waits after 25 s (%d request(s))", what, n.Load())
		}
	}
	// Past the budget: no deadline of the caller's bounds it, the SDK's does.
	try("Retry-After: 3600, budget 19 s", "3600", context.Background(), 2*time.Second, narad.WithRequestTimeout(time.Second))
	// Past the caller's deadline: failing at once beats sleeping until the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	try("Retry-After: 10, deadline in 2 s", "10", ctx, time.Second)
	// Within a large budget, a Retry-After is still held to 300 s.
	retryAfter.Store("3600")
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var waited atomic.Int64
	c := newClientAt(t, []string{srv.URL}, narad.WithRequestTimeout(time.Hour), narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRetry {
			waited.Store(int64(e.Duration))
			cancel()
		}
	}))
	if _, err := c.Produce(ctx, "t", "x"); err == nil {
		t.Fatal("produce succeeded against a server that only throttles")
	}
	if d := time.Duration(waited.Load()); d != 300*time.Second {
		t.Fatalf("a Retry-After of 3600 s made the call wait %s, want 300 s", d)
	}
}

// TestRetryAfterOfANodeIsHonouredAfterFailover: a node that answered with Retry-After
// gets nothing more from the same call before the time it named; the call goes to
// another endpoint meanwhile, or waits. Here A throttles for 2 s and B is starting (503,
// Retry-After: 1): the call fails over to B, tries B again after 1 s, and comes back to
// A only 2 s after A's answer. The old code honoured a Retry-After only as the wait
// before the next attempt, wherever that went: after B's answer it waited 1 s and sent
// the retry to A, 1 s before A's time.
func TestRetryAfterOfANodeIsHonouredAfterFailover(t *testing.T) {
	var mu sync.Mutex
	var aTimes []time.Time
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if !strings.HasSuffix(r.URL.Path, "/produce") { // the one-cluster check
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"x"}}`)
			return
		}
		mu.Lock()
		aTimes = append(aTimes, time.Now())
		first := len(aTimes) == 1
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"throttled","message":"slow down"}}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"topic":"t","partition":0,"offset":1}`)
	}))
	defer a.Close()
	var bCalls atomic.Int32
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/produce") {
			bCalls.Add(1)
		}
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"code":"unavailable","message":"starting"}}`)
	}))
	defer b.Close()
	// A breaker that never opens keeps B in the rotation, so every attempt has a choice.
	c := newClientAt(t, []string{a.URL, b.URL}, narad.WithBreaker(100, time.Second),
		narad.WithRetry(narad.RetryPolicy{Attempts: 6, Backoff: func() narad.Backoff { return narad.NewFullJitter(time.Millisecond, 10*time.Millisecond) }}))
	at, err := c.Produce(ctxT(t), "t", "x")
	mu.Lock()
	defer mu.Unlock()
	if err != nil || at.Offset != 1 || len(aTimes) != 2 {
		t.Fatalf("produce: %v %+v; A was sent %d request(s), B %d", err, at, len(aTimes), bCalls.Load())
	}
	if gap := aTimes[1].Sub(aTimes[0]); gap < 2*time.Second {
		t.Fatalf("A asked for Retry-After: 2 and was sent the retry %s later (B got %d)", gap.Round(time.Millisecond), bCalls.Load())
	}
}
