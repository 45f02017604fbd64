package narad_test

import (
	"errors"
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
