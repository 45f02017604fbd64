package narad_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// runConsumer runs a Consumer in the background and returns a stop function that
// cancels it and returns Run's error.
func runConsumer(t *testing.T, cs *narad.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(45 * time.Second):
				err = errors.New("Run did not return within 45 s of cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func produceN(t *testing.T, c *narad.Client, topic string, n int) {
	t.Helper()
	msgs := make([]narad.Outgoing, n)
	for i := range msgs {
		msgs[i] = narad.Outgoing{Body: fmt.Sprintf("m%d", i)}
	}
	if _, err := c.ProduceBatch(ctxT(t), topic, msgs); err != nil {
		t.Fatal(err)
	}
}

func TestConsumeAcksEveryMessageOnce(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 3})
	produceN(t, c, topic, 60)
	var mu sync.Mutex
	seen := map[string]int{}
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		mu.Lock()
		seen[string(m.Bytes())]++
		mu.Unlock()
		return nil
	}, narad.WithConcurrency(4), narad.WithWait(time.Second))
	stop := runConsumer(t, cs)
	eventually(t, 30*time.Second, "60 acks", func() bool { return cs.Stats().Acked == 60 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("%s handled %d times", k, n)
		}
	}
	if len(seen) != 60 {
		t.Fatalf("handled %d distinct messages", len(seen))
	}
	assertEmpty(t, c, topic)
}

// TestConsumeRenewsLeaseBeyondVisibility runs a handler for 2.5 s on a topic whose lease
// is 1 s: the consumer renews it, so the message is neither redelivered (to the second
// worker) nor lost, and is acked once.
func TestConsumeRenewsLeaseBeyondVisibility(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Second})
	produceN(t, c, topic, 1)
	var calls atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		calls.Add(1)
		select {
		case <-time.After(2500 * time.Millisecond): // the work
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, narad.WithConcurrency(2), narad.WithWait(500*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 30*time.Second, "the ack", func() bool { return cs.Stats().Acked == 1 })
	st := cs.Stats()
	if calls.Load() != 1 || st.Lost != 0 || st.Renewals < 2 {
		t.Fatalf("calls %d, stats %+v", calls.Load(), st)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, c, topic)
}

// TestConsumeCancelsHandlerOnLeaseLoss: someone else hands the message back while the
// handler runs; the next renewal answers 410, the handler's context is cancelled with
// ErrLeaseLost, and the consumer does not ack it.
func TestConsumeCancelsHandlerOnLeaseLoss(t *testing.T) {
	c := newClient(t)
	other := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 600 * time.Millisecond})
	produceN(t, c, topic, 1)
	causes := make(chan error, 4)
	var deliveries atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		if deliveries.Add(1) > 1 {
			return nil // the redelivery succeeds
		}
		// Simulate another actor spending the handle: hand it back behind our back.
		stolen := &stolenHandle{c: other, topic: m.Topic, handle: m.ReceiptHandle}
		if err := stolen.nack(ctx); err != nil {
			t.Error(err)
		}
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return nil // even a nil return must not ack a lost lease
		case <-time.After(20 * time.Second):
			causes <- errors.New("not cancelled")
			return nil
		}
	}, narad.WithConcurrency(1), narad.WithWait(500*time.Millisecond))
	stop := runConsumer(t, cs)
	select {
	case cause := <-causes:
		if !errors.Is(cause, narad.ErrLeaseLost) {
			t.Fatalf("cause %v", cause)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was not cancelled")
	}
	eventually(t, 30*time.Second, "the redelivery acked", func() bool { return cs.Stats().Acked == 1 })
	st := cs.Stats()
	if st.Lost != 1 || deliveries.Load() != 2 {
		t.Fatalf("stats %+v, deliveries %d", st, deliveries.Load())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// stolenHandle nacks a receipt handle through the public API of another client.
type stolenHandle struct {
	c      *narad.Client
	topic  string
	handle string
}

func (s *stolenHandle) nack(ctx context.Context) error {
	m := s.c.MessageForHandle(s.topic, s.handle)
	return m.Nack(ctx, 0)
}

func TestConsumeMaxLeaseCancelsHandler(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 500 * time.Millisecond})
	produceN(t, c, topic, 1)
	var deliveries atomic.Int32
	cause := make(chan error, 1)
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		if deliveries.Add(1) > 1 {
			return nil
		}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	}, narad.WithMaxLease(time.Second), narad.WithConcurrency(2), narad.WithWait(300*time.Millisecond))
	stop := runConsumer(t, cs)
	select {
	case err := <-cause:
		if !errors.Is(err, narad.ErrLeaseLost) {
			t.Fatalf("cause %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler outlived its max lease")
	}
	eventually(t, 20*time.Second, "the redelivery acked", func() bool { return cs.Stats().Acked == 1 })
	// Renewals stop at the max lease: a handful, not a spin.
	if st := cs.Stats(); st.Lost != 1 || st.Nacked != 0 || st.Renewals > 6 {
		t.Fatalf("stats %+v", st)
	}
	stop()
}

func TestConsumeNacksOnErrorAndPanic(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceN(t, c, topic, 2)
	var attempts sync.Map
	var errorsSeen atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		n, _ := attempts.LoadOrStore(string(m.Bytes()), new(atomic.Int32))
		switch k := n.(*atomic.Int32).Add(1); {
		case k == 1 && string(m.Bytes()) == "m0":
			panic("boom")
		case k == 1:
			return narad.NackAfter(errors.New("try later"), 300*time.Millisecond)
		}
		if m.DeliveryAttempt != 2 {
			return fmt.Errorf("delivery attempt %d, want 2", m.DeliveryAttempt)
		}
		return nil
	}, narad.WithErrorHandler(func(error) { errorsSeen.Add(1) }), narad.WithWait(300*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 20*time.Second, "both acked", func() bool { return cs.Stats().Acked == 2 })
	st := cs.Stats()
	if st.Nacked != 2 || st.Panics != 1 || st.Failed != 2 || errorsSeen.Load() < 1 {
		t.Fatalf("stats %+v, reported %d", st, errorsSeen.Load())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, c, topic)
}

func TestConsumeHandlerSettlesItself(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceN(t, c, topic, 1)
	var calls atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		calls.Add(1)
		if err := m.Ack(ctx); err != nil {
			return err
		}
		return errors.New("after the ack, this error changes nothing")
	}, narad.WithWait(300*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 20*time.Second, "the handler", func() bool { return calls.Load() == 1 })
	stop()
	if st := cs.Stats(); st.Nacked != 0 || st.Lost != 0 || calls.Load() != 1 {
		t.Fatalf("stats %+v", st)
	}
	assertEmpty(t, c, topic)
}

// TestConsumeDrainsOnCancel: cancel while handlers run; they finish within the grace,
// their acks are flushed, nothing new starts, and what was not handled stays available.
func TestConsumeDrainsOnCancel(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 2 * time.Second})
	produceN(t, c, topic, 6)
	started := make(chan string, 6)
	release := make(chan struct{})
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		started <- string(m.Bytes())
		<-release
		return nil
	}, narad.WithConcurrency(3), narad.WithWait(300*time.Millisecond), narad.WithShutdownGrace(20*time.Second))
	stop := runConsumer(t, cs)
	handled := map[string]bool{}
	for i := 0; i < 3; i++ {
		select {
		case s := <-started:
			handled[s] = true
		case <-time.After(20 * time.Second):
			t.Fatal("handlers did not start")
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Run must wait for the running handlers.
	select {
	case err := <-stopped:
		t.Fatalf("Run returned before its handlers finished: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if st := cs.Stats(); st.Acked != 3 || len(started) != 0 {
		t.Fatalf("stats %+v, %d started after cancel", st, len(started))
	}
	// The other three are still there for the next consumer, none twice.
	rest := map[string]int{}
	cs2 := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		rest[string(m.Bytes())]++
		return nil
	}, narad.WithWait(300*time.Millisecond))
	stop2 := runConsumer(t, cs2)
	eventually(t, 20*time.Second, "the rest", func() bool { return cs2.Stats().Acked == 3 })
	stop2()
	for k, n := range rest {
		if handled[k] || n != 1 {
			t.Fatalf("%s handled again (%d)", k, n)
		}
	}
	assertEmpty(t, c, topic)
}

// TestConsumeGraceCancelsStragglers: a handler that outlives the grace period gets its
// context cancelled and its message handed back.
func TestConsumeGraceCancelsStragglers(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceN(t, c, topic, 1)
	started := make(chan struct{})
	cause := make(chan error, 1)
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	}, narad.WithWait(300*time.Millisecond), narad.WithShutdownGrace(200*time.Millisecond))
	stop := runConsumer(t, cs)
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, narad.ErrClosed) {
		t.Fatalf("cause %v", err)
	}
	if st := cs.Stats(); st.Nacked != 1 {
		t.Fatalf("stats %+v", st)
	}
	m := receiveOne(t, c, topic) // handed back at once
	m.Ack(ctxT(t))
}

// TestConsumeSurvivesTransientErrors: polls answering 503 are retried and reported, and
// the loop goes on to handle the message.
func TestConsumeSurvivesTransientErrors(t *testing.T) {
	c, ft := newFaultClient(t, narad.WithRetry(narad.RetryPolicy{Attempts: 1}))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceN(t, c, topic, 1)
	var polls atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/consume") && polls.Add(1) <= 3 {
			return unavailable("0"), nil
		}
		return nil, nil
	}, nil)
	var reported atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error { return nil },
		narad.WithErrorHandler(func(err error) {
			if errors.Is(err, narad.ErrUnavailable) {
				reported.Add(1)
			}
		}), narad.WithWait(300*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 30*time.Second, "the ack", func() bool { return cs.Stats().Acked == 1 })
	if reported.Load() != 3 || cs.Stats().Errors != 3 {
		t.Fatalf("reported %d, stats %+v", reported.Load(), cs.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestConsumeStopsOnTerminalErrors: a missing topic, or one deleted under the consumer,
// stops Run with the error instead of spinning.
func TestConsumeStopsOnTerminalErrors(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	err := c.Consume(ctx, "no-such-topic-z", func(context.Context, *narad.Message) error { return nil })
	if !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("missing topic: %v", err)
	}
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	var terminal, polled atomic.Bool
	c2 := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventConsumerError && e.Terminal {
			terminal.Store(true)
		}
		if e.Kind == narad.EventRequest && e.Op == "consume" {
			polled.Store(true)
		}
	}))
	done := make(chan error, 1)
	go func() {
		done <- c2.Consume(ctx, topic, func(context.Context, *narad.Message) error { return nil }, narad.WithWait(200*time.Millisecond))
	}()
	eventually(t, 10*time.Second, "the consumer polling", polled.Load)
	if err := c.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, narad.ErrNotFound) || !terminal.Load() {
			t.Fatalf("deleted topic: %v (terminal event %v)", err, terminal.Load())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not stop after its topic was deleted")
	}
}

func TestConsumerRunsOnceAtATime(t *testing.T) {
	var polled atomic.Bool
	c := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRequest && e.Op == "consume" {
			polled.Store(true)
		}
	}))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	cs := c.Consumer(topic, func(context.Context, *narad.Message) error { return nil }, narad.WithWait(200*time.Millisecond))
	stop := runConsumer(t, cs)
	eventually(t, 10*time.Second, "the first Run to poll", polled.Load)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cs.Run(ctx); err == nil {
		t.Fatal("a second Run of a running Consumer started")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Once stopped, it can run again.
	if err := cs.Run(ctx); err != nil {
		t.Fatalf("Run after stop: %v", err)
	}
}

// TestConsumeHandsBackAStragglerWhenRunReturns: a handler that ignores its cancelled
// context and outlives the grace is given up: Run stops renewing its lease and hands the
// message back before it returns, so the message is delivered again at once, and what
// the handler does later is ignored (it never acks). The old code only marked it lost:
// the lease kept being renewed after Run returned (up to the 1 h max lease), so the
// message was held rather than delivered again.
func TestConsumeHandsBackAStragglerWhenRunReturns(t *testing.T) {
	var mu sync.Mutex
	var extends []time.Time
	c := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRequest && e.Op == "extend" {
			mu.Lock()
			extends = append(extends, e.Start)
			mu.Unlock()
		}
	}))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 600 * time.Millisecond})
	produceN(t, c, topic, 1)
	started := make(chan struct{})
	release := make(chan struct{})
	returned := make(chan struct{})
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		close(started)
		<-release // ignores ctx: a stuck handler
		defer close(returned)
		return m.Ack(context.Background()) // too late: must not ack
	}, narad.WithWait(200*time.Millisecond), narad.WithShutdownGrace(100*time.Millisecond))
	stop := runConsumer(t, cs)
	<-started
	if err := stop(); err == nil || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("Run: %v", err)
	}
	stopped := time.Now()
	if st := cs.Stats(); st.Nacked != 1 {
		t.Fatalf("the straggler's message was not handed back: %+v", st)
	}
	// Handed back: delivered again at once, while the old handler still runs. (Another
	// client takes it, so that its calls are not counted as the consumer's renewals.)
	other := newClient(t)
	msgs, err := other.Receive(ctxT(t), topic, narad.WithWait(time.Second))
	if err != nil || len(msgs) != 1 || msgs[0].DeliveryAttempt != 2 {
		t.Fatalf("the straggler's message is not delivered again: %v (%d messages)", err, len(msgs))
	}
	if err := msgs[0].Extend(ctxT(t), time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // more than one renewal period of the old lease
	close(release)
	<-returned
	mu.Lock()
	for _, at := range extends {
		if at.After(stopped) {
			t.Errorf("the given-up lease was renewed %s after Run returned", at.Sub(stopped).Round(time.Millisecond))
		}
	}
	mu.Unlock()
	if st := cs.Stats(); st.Acked != 0 || st.Nacked != 1 {
		t.Fatalf("the handler's late outcome was counted: %+v", st)
	}
	if err := msgs[0].Ack(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, c, topic)
}

// TestConsumeSurvivesA500OnPoll: a 500 on a poll (a broker bug on one request, or a
// proxy) is reported and retried with backoff, and the loop goes on to handle the
// message: only 401, 403 and the topic gone stop it (contract rule 7). The old code
// stopped Run on the first 500 and returned it.
func TestConsumeSurvivesA500OnPoll(t *testing.T) {
	c, ft := newFaultClient(t, narad.WithRetry(narad.RetryPolicy{Attempts: 1}))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceN(t, c, topic, 1)
	var polls atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/consume") && polls.Add(1) <= 2 {
			return answer(500, "", `{"error":{"code":"internal","message":"an unexpected error happened"}}`), nil
		}
		return nil, nil
	}, nil)
	var reported atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error { return nil },
		narad.WithErrorHandler(func(err error) {
			if errors.Is(err, narad.ErrInternal) {
				reported.Add(1)
			}
		}), narad.WithWait(300*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Run(ctx) }()
	timeout := time.After(30 * time.Second)
	for cs.Stats().Acked != 1 {
		select {
		case err := <-done:
			t.Fatalf("the consumer stopped on a 500 from a poll: %v", err)
		case <-timeout:
			t.Fatalf("no ack within 30 s: %+v", cs.Stats())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if reported.Load() != 2 || cs.Stats().Errors != 2 {
		t.Fatalf("reported %d, stats %+v", reported.Load(), cs.Stats())
	}
}
