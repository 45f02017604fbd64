package narad_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestPoisonBackoffGrowsWithTheAttempt(t *testing.T) {
	for attempt, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 9: 256 * time.Second, 10: 5 * time.Minute, 1000: 5 * time.Minute} {
		for i := 0; i < 50; i++ {
			if d := narad.PoisonBackoff(attempt); d < want/2 || d > want {
				t.Fatalf("PoisonBackoff(%d) = %s, want within [%s, %s]", attempt, d, want/2, want)
			}
		}
	}
}

// nackExtends records the extend parameter of every nack (an ack with extend) the
// client sends, in order.
func nackExtends(ft *faultTransport) func() []time.Duration {
	var mu sync.Mutex
	var got []time.Duration
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/ack") {
			if ext := r.URL.Query().Get("extend"); ext != "" && ext != "true" {
				ms, _ := strconv.Atoi(ext)
				mu.Lock()
				got = append(got, time.Duration(ms)*time.Millisecond)
				mu.Unlock()
			}
		}
		return nil, nil
	}, nil)
	return func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), got...)
	}
}

// TestConsumerPoisonMessageBacksOff: a handler that always fails gets its message back
// after a delay that grows with the delivery attempt, not at once.
func TestConsumerPoisonMessageBacksOff(t *testing.T) {
	c, ft := newFaultClient(t)
	extends := nackExtends(ft)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctxT(t), topic, "poison"); err != nil {
		t.Fatal(err)
	}
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		return errors.New("always fails")
	}, narad.WithWait(200*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 30*time.Second, "two nacks", func() bool { return len(extends()) >= 2 })
	stop()
	got := extends()
	if got[0] < 500*time.Millisecond || got[0] > time.Second || got[1] < time.Second || got[1] > 2*time.Second {
		t.Fatalf("nack delays %v; want the first in [0.5 s, 1 s] and the second in [1 s, 2 s]", got)
	}
}

// TestConsumerDeadLettersAfterMaxDeliveries: past WithMaxDeliveries the message goes to
// the dead-letter topic with its key and bytes and is acked; the handler does not see it
// again.
func TestConsumerDeadLettersAfterMaxDeliveries(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	dlq := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	body := []byte{0xff, 0x00, 'x'}
	if _, err := c.Produce(ctx, topic, body, narad.WithKey("k1")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var attempts []int
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		mu.Lock()
		attempts = append(attempts, m.DeliveryAttempt)
		mu.Unlock()
		return errors.New("always fails")
	}, narad.WithWait(200*time.Millisecond), narad.WithNackDelay(10*time.Millisecond),
		narad.WithMaxDeliveries(2), narad.WithDeadLetterTopic(dlq))
	stop := runConsumer(t, cs)
	var dead []*narad.Message
	eventually(t, 30*time.Second, "the message in the dead-letter topic", func() bool {
		msgs, err := c.Receive(ctx, dlq, narad.WithWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, msgs...)
		return len(dead) > 0
	})
	eventually(t, 30*time.Second, "the original to be acked", func() bool { return cs.Stats().Acked == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if string(dead[0].Bytes()) != string(body) || dead[0].Key != "k1" {
		t.Fatalf("dead-lettered %q key %q; want %q key k1", dead[0].Bytes(), dead[0].Key, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 {
		t.Fatalf("the handler saw attempts %v; want [1 2]", attempts)
	}
	if s := cs.Stats(); s.DeadLettered != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Nothing is left in the main topic.
	if msgs, err := c.Receive(ctx, topic, narad.WithWait(100*time.Millisecond)); err != nil || len(msgs) != 0 {
		t.Fatalf("main topic still has %d messages (%v)", len(msgs), err)
	}
}

// TestConsumerDeadLetterFailureNeverAcks: when the dead-letter produce fails, the
// message is handed back, not acked. (A stop that lands while the handler runs may
// leave its last lease to lapse: the topic's 2 s visibility timeout bounds that.)
func TestConsumerDeadLetterFailureNeverAcks(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 2 * time.Second})
	if _, err := c.Produce(ctx, topic, "keep me"); err != nil {
		t.Fatal(err)
	}
	var errs sync.Map
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		return errors.New("always fails")
	}, narad.WithWait(200*time.Millisecond), narad.WithNackDelay(10*time.Millisecond),
		narad.WithMaxDeliveries(1), narad.WithDeadLetterTopic(topic+"-missing"),
		narad.WithErrorHandler(func(err error) {
			if errors.Is(err, narad.ErrNotFound) {
				errs.Store("dlq", err)
			}
		}))
	stop := runConsumer(t, cs)
	eventually(t, 30*time.Second, "two failed dead-letterings", func() bool { return cs.Stats().Received >= 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := errs.Load("dlq"); !ok {
		t.Fatal("the failed dead-letter produce was not reported")
	}
	if s := cs.Stats(); s.Acked != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v: a message that was not dead-lettered was acked", s)
	}
	msgs, err := c.Receive(ctx, topic, narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the message is gone from the topic: %d %v", len(msgs), err)
	}
}

func TestConsumerMaxDeliveriesNeedsADeadLetterTopic(t *testing.T) {
	c := newClient(t)
	start := time.Now()
	err := c.Consume(ctxT(t), "never-asked", func(context.Context, *narad.Message) error { return nil }, narad.WithMaxDeliveries(3))
	if !errors.Is(err, narad.ErrInvalidOption) || time.Since(start) > 5*time.Second {
		t.Fatalf("Consume = %v after %s; want ErrInvalidOption at once", err, time.Since(start))
	}
}
