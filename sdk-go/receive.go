package narad

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// ConsumeOption configures Receive and Consume (and Consumer). Options that only make
// sense for a worker loop are ignored by Receive.
type ConsumeOption func(*consumeConfig)

type consumeConfig struct {
	wait        time.Duration
	max         int
	concurrency int
	maxLease    time.Duration
	grace       time.Duration
	renew       bool
	nackDelay   time.Duration
	nackSet     bool // WithNackDelay was given: no poison backoff
	onError     func(error)
	// maxDeliveries > 0 dead-letters a message delivered more often than that.
	maxDeliveries int
	deadLetter    string
}

func defaultConsumeConfig() consumeConfig {
	return consumeConfig{
		wait:        DefaultWait,
		max:         1,
		concurrency: DefaultConcurrency,
		maxLease:    DefaultMaxLease,
		grace:       DefaultShutdownGrace,
		renew:       true,
	}
}

// WithWait sets how long one poll waits for a message to arrive (default 10 s, at most
// 20 s; 0 answers at once).
func WithWait(d time.Duration) ConsumeOption {
	return func(c *consumeConfig) { c.wait = min(max(d, 0), maxWait) }
}

// WithMaxMessages sets how many messages Receive takes at most in its one poll (default
// 1, at most 1000).
func WithMaxMessages(n int) ConsumeOption {
	return func(c *consumeConfig) { c.max = min(max(n, 1), MaxBatchMessages) }
}

// WithConcurrency sets how many handlers a Consumer runs at once (default 1). It never
// holds more leased messages than that.
func WithConcurrency(n int) ConsumeOption {
	return func(c *consumeConfig) { c.concurrency = min(max(n, 1), MaxBatchMessages) }
}

// WithMaxLease bounds how long a Consumer keeps renewing one message's lease (default
// 1 h). Past it the lease lapses: the handler's context is cancelled and the message is
// delivered again.
func WithMaxLease(d time.Duration) ConsumeOption {
	return func(c *consumeConfig) { c.maxLease = d }
}

// WithShutdownGrace sets how long a Consumer lets running handlers finish after its
// context is cancelled (default 30 s); then their contexts are cancelled too, and a
// handler that has not returned shortly after is given up and its message handed back.
func WithShutdownGrace(d time.Duration) ConsumeOption {
	return func(c *consumeConfig) { c.grace = max(d, 0) }
}

// WithoutRenewal turns off lease renewal: a handler that runs longer than the topic's
// visibility timeout loses its lease.
func WithoutRenewal() ConsumeOption {
	return func(c *consumeConfig) { c.renew = false }
}

// WithNackDelay sets a fixed delay before a message whose handler failed is delivered
// again, instead of the default backoff that grows with the message's delivery attempt
// (see PoisonBackoff); 0 means at once. NackAfter overrides it per message.
func WithNackDelay(d time.Duration) ConsumeOption {
	return func(c *consumeConfig) { c.nackDelay, c.nackSet = max(d, 0), true }
}

// WithMaxDeliveries dead-letters a message delivered more than n times: instead of
// running the handler again, the Consumer produces the message to the topic named by
// WithDeadLetterTopic (same key and bytes; an envelope gets the reason in LastError and
// a "dead_letter_from" header) and then acks it. When that produce fails, the message
// is handed back with the backoff and never acked. 0 (the default) turns it off. The
// broker has no dead-letter queue of its own: this is user code you can read and change.
// n > 0 without WithDeadLetterTopic makes Run fail at once.
func WithMaxDeliveries(n int) ConsumeOption {
	return func(c *consumeConfig) { c.maxDeliveries = max(n, 0) }
}

// WithDeadLetterTopic names the topic WithMaxDeliveries sends messages to. Create it
// beforehand (EnsureTopic).
func WithDeadLetterTopic(topic string) ConsumeOption {
	return func(c *consumeConfig) { c.deadLetter = topic }
}

// WithErrorHandler calls f with every failure a Consumer survives or stops on (poll
// errors, lost leases, failed acks, errors the handler returns and its panics). f must
// be quick.
func WithErrorHandler(f func(error)) ConsumeOption {
	return func(c *consumeConfig) { c.onError = f }
}

// Receive takes up to WithMaxMessages messages (default 1) from topic in one long poll of
// up to WithWait (default 10 s). Each comes under its own lease: settle it with Ack or
// Nack before the topic's visibility timeout, or Extend it. An empty poll returns no
// messages and a nil error. Receive does not renew leases; Consume does.
//
// The end of ctx does not cut a poll already sent at once: the broker may have leased
// messages to it and be sending them, and cutting the poll would leave them leased to
// nobody until their visibility timeout. The poll is left open up to 1 s for its answer
// to begin, then cut (Receive returns ctx's error); an answer that began is read for up
// to 5 s after ctx ended, and Receive returns its messages with a nil error though ctx
// is done. Settle them then (Nack with no delay, under context.WithoutCancel(ctx),
// hands a message back at once). A poll not yet sent when ctx ends is never sent; the
// client's Close and the per-attempt timeout (WithRequestTimeout beyond the wait) cut
// the poll at once.
func (c *Client) Receive(ctx context.Context, topic string, opts ...ConsumeOption) ([]*Message, error) {
	cfg := defaultConsumeConfig()
	for _, o := range opts {
		o(&cfg)
	}
	return c.poll(ctx, topic, cfg.max, cfg.wait, nil)
}

// poll takes up to n messages in one long poll. via, when not nil, is a Consumer run's
// own http.Client (pollClient): the poll goes through it, and the end of ctx
// half-closes the poll's connection rather than cancelling it (see connCut).
func (c *Client) poll(ctx context.Context, topic string, n int, wait time.Duration, via *http.Client) ([]*Message, error) {
	var w *api.Wait
	if wait > 0 {
		s := strconv.FormatInt(wait.Milliseconds(), 10) + "ms"
		w = &s
	}
	// Payloads come as base64 so that any bytes survive the JSON answer.
	cl := &call{op: "consume", topic: topic, poll: wait, leases: true, via: via}
	if n > 1 {
		params := &api.ConsumeBatchParams{Wait: w, Max: ptr(int32(n)), PayloadEncoding: ptr(api.ConsumeBatchParamsPayloadEncodingBase64)}
		cl.op = "consume-batch"
		cl.build = func(s string) (*http.Request, error) { return api.NewConsumeBatchRequest(s, topic, params) }
	} else {
		params := &api.ConsumeParams{Wait: w, PayloadEncoding: ptr(api.ConsumeParamsPayloadEncodingBase64)}
		cl.build = func(s string) (*http.Request, error) { return api.NewConsumeRequest(s, topic, params) }
	}
	start := time.Now()
	rep, err := c.do(ctx, cl)
	if err != nil {
		return nil, err
	}
	if rep.status == http.StatusNoContent || len(rep.body) == 0 {
		c.observe(Event{Kind: EventReceive, Context: ctx, Op: cl.op, Topic: topic, Node: rep.node, Start: start, Duration: time.Since(start)})
		return nil, nil
	}
	var wire []api.Message
	if n > 1 {
		var list api.MessageList
		err = json.Unmarshal(rep.body, &list)
		wire = list.Messages
	} else {
		var one api.Message
		err = json.Unmarshal(rep.body, &one)
		wire = []api.Message{one}
	}
	if err != nil {
		return nil, &Error{Op: cl.op, Topic: topic, Node: rep.node, Status: rep.status, Err: err, Message: "the broker's answer is not a message: " + err.Error(), kind: ErrInternal}
	}
	out := make([]*Message, 0, len(wire))
	for i := range wire {
		m, err := c.newMessage(&wire[i], rep.from)
		if err != nil {
			return out, &Error{Op: cl.op, Topic: topic, Node: rep.node, Err: err, Message: "a payload is not valid base64: " + err.Error(), kind: ErrInternal}
		}
		out = append(out, m)
	}
	c.observe(Event{Kind: EventReceive, Context: ctx, Op: cl.op, Topic: topic, Node: rep.node, Messages: len(out), Start: start, Duration: time.Since(start)})
	return out, nil
}
