package narad_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestReceiveEmptyPollIsNotAnError(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	start := time.Now()
	msgs, err := c.Receive(ctx, topic, narad.WithWait(300*time.Millisecond))
	if err != nil || len(msgs) != 0 {
		t.Fatalf("empty poll: %v %d", err, len(msgs))
	}
	if time.Since(start) < 250*time.Millisecond {
		t.Fatalf("the poll did not wait")
	}
	msgs, err = c.Receive(ctx, topic, narad.WithWait(0), narad.WithMaxMessages(5))
	if err != nil || len(msgs) != 0 {
		t.Fatalf("empty batch poll: %v %d", err, len(msgs))
	}
}

func TestReceiveBatchAndLongPollWakesUp(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	got := make(chan []*narad.Message, 1)
	go func() {
		msgs, err := c.Receive(ctx, topic, narad.WithWait(15*time.Second), narad.WithMaxMessages(10))
		if err != nil {
			t.Error(err)
		}
		got <- msgs
	}()
	time.Sleep(100 * time.Millisecond) // let the poll park; the check below does not depend on it
	if _, err := c.Produce(ctx, topic, "wake"); err != nil {
		t.Fatal(err)
	}
	select {
	case msgs := <-got:
		if len(msgs) != 1 || string(msgs[0].Bytes()) != "wake" {
			t.Fatalf("got %d messages", len(msgs))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not answer when a message arrived")
	}
}

func TestNackExtendAndRedelivery(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 2 * time.Second})
	if _, err := c.Produce(ctx, topic, "again"); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, topic)
	if err := m.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("extend by duration: %v", err)
	}
	if err := m.Extend(ctx, 0); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := m.Nack(ctx, 0); err != nil {
		t.Fatalf("nack: %v", err)
	}
	if err := m.Ack(ctx); !errors.Is(err, narad.ErrLeaseLost) {
		t.Fatalf("ack after nack: %v", err)
	}
	m2 := receiveOne(t, c, topic)
	if m2.Offset != m.Offset || m2.DeliveryAttempt != 2 {
		t.Fatalf("redelivery %+v", m2)
	}
	// A delayed nack keeps the message invisible until the delay passes.
	start := time.Now()
	if err := m2.Nack(ctx, 700*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	m3 := receiveOne(t, c, topic)
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Fatalf("redelivered after %s, before the nack delay", d)
	}
	if err := m3.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m3.Extend(ctx, time.Second); !errors.Is(err, narad.ErrLeaseLost) {
		t.Fatalf("extend after ack: %v", err)
	}
}

func receiveOne(t *testing.T, c *narad.Client, topic string) *narad.Message {
	t.Helper()
	msgs, err := c.Receive(ctxT(t), topic, narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive: %v (%d messages)", err, len(msgs))
	}
	return msgs[0]
}

func TestLeaseLapsesAndAckAnswersLeaseLost(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 300 * time.Millisecond})
	if _, err := c.Produce(ctx, topic, "x"); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, topic)
	m2 := receiveOne(t, c, topic) // waits until the lease lapsed and it came back
	if m2.Offset != m.Offset {
		t.Fatal("not the same message")
	}
	err := m.Ack(ctx)
	var e *narad.Error
	if !errors.As(err, &e) || e.Status != http.StatusGone || e.Code != "lease_lost" || !errors.Is(err, narad.ErrLeaseLost) || narad.Retryable(err) {
		t.Fatalf("stale ack: %#v", err)
	}
	if err := m2.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAckBatchReportsEachEntry(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	for i := 0; i < 5; i++ {
		if _, err := c.Produce(ctx, topic, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := c.Receive(ctx, topic, narad.WithMaxMessages(5), narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 5 {
		t.Fatalf("receive: %v %d", err, len(msgs))
	}
	if err := msgs[2].Nack(ctx, 0); err != nil { // spent: its entry must fail alone
		t.Fatal(err)
	}
	replayed := firstReplayed(t, c, topic)
	res, err := c.AckBatch(ctx, topic, append(msgs, replayed))
	if err == nil || len(res) != 6 {
		t.Fatalf("want a partial failure: %v", err)
	}
	for i, r := range res {
		switch i {
		case 2:
			if !errors.Is(r.Err, narad.ErrLeaseLost) {
				t.Fatalf("entry 2: %v", r.Err)
			}
		case 5:
			if !errors.Is(r.Err, narad.ErrNoLease) {
				t.Fatalf("replayed entry: %v", r.Err)
			}
		default:
			if r.Err != nil || r.Message != msgs[i] {
				t.Fatalf("entry %d: %v", i, r.Err)
			}
		}
	}
	// The nacked message comes back; the acked ones do not.
	m := receiveOne(t, c, topic)
	if m.Offset != msgs[2].Offset {
		t.Fatalf("redelivered offset %d, want %d", m.Offset, msgs[2].Offset)
	}
	res, err = c.AckBatch(ctx, topic, []*narad.Message{m})
	if err != nil || res[0].Err != nil {
		t.Fatal(err)
	}
}

func firstReplayed(t *testing.T, c *narad.Client, topic string) *narad.Message {
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	t.Fatal("nothing to replay")
	return nil
}

// TestAckRetriesOn503 injects 503s in front of the broker: the ack is retried and
// confirmed.
func TestAckRetriesOn503(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "x"); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, topic)
	var injected atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/ack") && injected.Add(1) <= 2 {
			return unavailable("0"), nil
		}
		return nil, nil
	}, nil)
	if err := m.Ack(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if injected.Load() != 3 {
		t.Fatalf("%d ack attempts, want 3", injected.Load())
	}
	ft.set(nil, nil)
	assertEmpty(t, c, topic)
}

// TestAckLostReplyThen410CountsAsAcked: the first ack reaches the broker but its reply
// is lost; the retry answers 410, which counts as success.
func TestAckLostReplyThen410CountsAsAcked(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "x"); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, topic)
	var lost atomic.Int32
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/ack") && lost.Add(1) == 1 {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil, errors.New("connection reset by peer (injected)")
		}
		return resp, err
	})
	if err := m.Ack(ctx); err != nil {
		t.Fatalf("ack after a lost reply: %v", err)
	}
	if lost.Load() != 2 {
		t.Fatalf("%d ack attempts, want 2", lost.Load())
	}
	ft.set(nil, nil)
	assertEmpty(t, c, topic)
}

// TestAckRetriesWhileAckedAheadIsFull receives three messages under an acked-ahead cap
// of 2 (a receive leases no further past the frontier than the cap), then lowers the cap
// to 1: acking out of order answers 503 acked_ahead_full until the oldest message is
// acked, and the confirmed ack gets through then.
func TestAckRetriesWhileAckedAheadIsFull(t *testing.T) {
	saw503 := make(chan struct{}, 1)
	c := newClient(t, narad.WithObserver(func(e narad.Event) {
		var ne *narad.Error
		if e.Kind == narad.EventRequest && errors.As(e.Err, &ne) && ne.Code == "acked_ahead_full" {
			select {
			case saw503 <- struct{}{}:
			default:
			}
		}
	}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, MaxAckedAheadPerPartition: 2})
	for i := 0; i < 3; i++ {
		if _, err := c.Produce(ctx, topic, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := c.Receive(ctx, topic, narad.WithMaxMessages(3), narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 3 {
		t.Fatalf("receive: %v %d", err, len(msgs))
	}
	one := 1
	if _, err := c.AlterTopic(ctx, topic, narad.TopicUpdate{MaxAckedAheadPerPartition: &one}); err != nil {
		t.Fatal(err)
	}
	if err := msgs[1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- msgs[2].Ack(ctx) }()
	select {
	case <-saw503:
	case err := <-done:
		t.Fatalf("the out-of-order ack returned before any 503: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no acked_ahead_full answer")
	}
	if err := msgs[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the retried ack failed: %v", err)
	}
	assertEmpty(t, c, topic)
}

// assertEmpty checks that nothing is left to deliver: the topic's backlog is zero.
func assertEmpty(t *testing.T, c *narad.Client, topic string) {
	t.Helper()
	info, err := c.Topic(ctxT(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Stats {
		if s.Backlog != 0 || s.InFlight != 0 {
			t.Fatalf("partition %d: backlog %d, in flight %d", s.Partition, s.Backlog, s.InFlight)
		}
	}
}

func TestReplayedMessagesHaveNoLease(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "r"); err != nil {
		t.Fatal(err)
	}
	m := firstReplayed(t, c, topic)
	for _, err := range []error{m.Ack(ctx), m.Nack(ctx, 0), m.Extend(ctx, 0)} {
		if !errors.Is(err, narad.ErrNoLease) {
			t.Fatalf("settling a replayed message: %v", err)
		}
	}
}

// TestAckBatchEntryTimeoutThen410CountsAsAcked: an ack-batch entry answered 503
// `timeout` may have been applied (here it was), so the 410 its retry gets counts as
// acked, as it does for Message.Ack (contract rule 2). The old code retried the entry
// but reported the 410 as ErrLeaseLost for a message that was settled.
func TestAckBatchEntryTimeoutThen410CountsAsAcked(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "x"); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, topic)
	var batches atomic.Int32
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/ack-batch") && batches.Add(1) == 1 {
			// The broker acked it; the entry's answer says the outcome is unknown.
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return answer(200, "", `{"results":[{"receipt_handle":"`+m.ReceiptHandle+`","status":503,`+
				`"error":{"code":"timeout","message":"the node holding the partition did not answer in time: the outcome is unknown"}}]}`), nil
		}
		return resp, err
	})
	res, err := c.AckBatch(ctx, topic, []*narad.Message{m})
	if err != nil || res[0].Err != nil {
		t.Fatalf("an entry answered 503 timeout, then 410: %v (batch err %v)", res[0].Err, err)
	}
	if n := batches.Load(); n != 2 {
		t.Fatalf("%d ack-batch requests, want 2", n)
	}
	ft.set(nil, nil)
	assertEmpty(t, c, topic)
}
