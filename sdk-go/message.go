package narad

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// maxExtend is the broker's cap on an extend or nack delay.
const maxExtend = 12 * time.Hour

// Message is a message read from a topic. A message taken by Receive or Consume holds a
// lease, named by ReceiptHandle, and is settled with Ack, Nack or kept longer with
// Extend; a message read by Replay holds none.
type Message struct {
	// Topic, Partition and Offset say where the message sits in the log.
	Topic     string
	Partition int32
	Offset    int64
	// Key is the key it was produced with, or "" for none.
	Key string
	// Timestamp is when the broker wrote it.
	Timestamp time.Time
	// DeliveryAttempt is 1 on the first delivery and counts up on redeliveries; 0 on replay.
	DeliveryAttempt int
	// ReceiptHandle names the lease; "" on replay.
	ReceiptHandle string

	body   []byte
	env    *Envelope
	client *Client
	// from is the endpoint that leased the message: its lease calls go there first.
	from *node
	// incarnation is the topic incarnation a replay read the message from, for
	// Position.Advance; "" for a message taken by Receive or Consume.
	incarnation string
	// startedAt is, for a message of a replay from an AtEnd position, the offset each
	// partition of that replay started at, for Position.Advance; shared, never written.
	startedAt map[int32]int64

	mu      sync.Mutex
	settled bool   // a settlement began or succeeded: no renewal, no second settlement
	outcome string // "ack" or "nack" once a settlement succeeded
	lost    bool   // the lease is gone: never ack
	lease   *lease
	// The consume loop's handler is done (finished) or was given up at shutdown
	// (abandoned); whichever comes first settles the message.
	finished, abandoned bool
}

// MessageForHandle returns a Message that settles the lease named by receiptHandle, a
// handle received elsewhere (another process, a stored job). It has no body; only Ack,
// Nack and Extend are meaningful.
func (c *Client) MessageForHandle(topic, receiptHandle string) *Message {
	return &Message{Topic: topic, ReceiptHandle: receiptHandle, client: c}
}

// Bytes returns the body exactly as it was produced. The slice belongs to the message;
// do not modify it.
func (m *Message) Bytes() []byte { return m.body }

// Decode unmarshals a JSON body into v. Its error wraps ErrDecode and the JSON error;
// it is about the message's content, never a broker answer.
func (m *Message) Decode(v any) error {
	if err := json.Unmarshal(m.body, v); err != nil {
		return fmt.Errorf("narad: decoding %s partition %d offset %d: %w: %w", m.Topic, m.Partition, m.Offset, ErrDecode, err)
	}
	return nil
}

// Ack settles the message: it will not be delivered again. The ack is confirmed: retried
// on 503 and connection errors, and a 410 after an attempt whose reply was lost counts
// as success. It returns an error wrapping ErrLeaseLost when the lease lapsed first.
func (m *Message) Ack(ctx context.Context) error {
	return m.settle(ctx, "ack", "")
}

// Nack hands the message back: with delay 0 it is delivered again at once; with a
// positive delay it becomes visible again that long from now (capped at 12 h).
func (m *Message) Nack(ctx context.Context, delay time.Duration) error {
	return m.settle(ctx, "nack", extendParam(delay, true))
}

// Extend keeps the lease: with d > 0 the lease ends d from now (capped at 12 h); with
// d <= 0 it is renewed for the topic's visibility timeout.
func (m *Message) Extend(ctx context.Context, d time.Duration) error {
	if m.ReceiptHandle == "" {
		return &Error{Op: "extend", Topic: m.Topic, kind: ErrNoLease}
	}
	m.mu.Lock()
	gone := m.settled || m.lost
	m.mu.Unlock()
	if gone {
		return &Error{Op: "extend", Topic: m.Topic, Status: http.StatusGone, Code: CodeLeaseLost, Message: "the message was settled or its lease lost", kind: ErrLeaseLost}
	}
	sent := time.Now()
	_, err := m.client.ack(ctx, "extend", m.Topic, m.ReceiptHandle, extendParam(d, false), m.from)
	m.mu.Lock()
	l := m.lease
	m.mu.Unlock()
	if err == nil && l != nil {
		l.extended(sent, d)
	}
	if errors.Is(err, ErrLeaseLost) {
		m.markLost()
	}
	return err
}

func extendParam(d time.Duration, nack bool) string {
	switch {
	case d <= 0 && nack:
		return "0"
	case d <= 0:
		return "true"
	case d > maxExtend:
		d = maxExtend
	}
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10)
}

func (m *Message) settle(ctx context.Context, op, extend string) error {
	if m.ReceiptHandle == "" {
		return &Error{Op: op, Topic: m.Topic, kind: ErrNoLease}
	}
	m.mu.Lock()
	switch {
	case m.lost:
		m.mu.Unlock()
		return &Error{Op: op, Topic: m.Topic, Status: http.StatusGone, Code: CodeLeaseLost, Message: "the lease was lost; the message is delivered again", kind: ErrLeaseLost}
	case m.settled:
		m.mu.Unlock()
		return &Error{Op: op, Topic: m.Topic, Status: http.StatusGone, Code: CodeLeaseLost, Message: "the message is already settled", kind: ErrLeaseLost}
	}
	m.settled = true
	l := m.lease
	m.mu.Unlock()
	if l != nil {
		l.stop()
	}
	_, err := m.client.ack(ctx, op, m.Topic, m.ReceiptHandle, extend, m.from)
	m.mu.Lock()
	switch {
	case err == nil:
		m.outcome = op
	case errors.Is(err, ErrLeaseLost):
		m.lost = true
	default:
		m.settled = false // let the caller try again
	}
	m.mu.Unlock()
	return err
}

// finish records that the consume loop's handler returned; false when the consumer
// gave up on it first (its message is handed back by Run).
func (m *Message) finish() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.abandoned {
		return false
	}
	m.finished = true
	return true
}

// giveUp records that the consumer gives up on the handler at shutdown and stops
// renewing its lease; false when the handler has returned already (its own settlement
// goes on).
func (m *Message) giveUp() bool {
	m.mu.Lock()
	if m.finished {
		m.mu.Unlock()
		return false
	}
	m.abandoned = true
	l := m.lease
	m.mu.Unlock()
	if l != nil {
		l.stop()
	}
	return true
}

func (m *Message) markLost() {
	m.mu.Lock()
	m.lost = true
	m.mu.Unlock()
}

// state reports whether a settlement began, how it ended ("ack", "nack" or "" while
// unknown), and whether the lease is known lost.
func (m *Message) state() (settled bool, outcome string, lost bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settled, m.outcome, m.lost
}

// ack sends one ack call (settle, renew, extend or nack), confirmed: retried on 503 and
// connection errors. For a settlement (ack, nack), a 410 on a retry whose earlier attempt
// may have taken effect counts as success, since that attempt most likely settled it.
// from is the endpoint that leased the message (nil when unknown): only that node knows
// the lease, so the call goes there and to the others only when it fails.
func (c *Client) ack(ctx context.Context, op, topic, handle, extend string, from *node) (*reply, error) {
	params := &api.AckParams{ReceiptHandle: handle}
	if extend != "" {
		params.Extend = &extend
	}
	cl := &call{op: op, topic: topic,
		build:    func(s string) (*http.Request, error) { return api.NewAckRequest(s, topic, params) },
		attempts: max(c.cfg.retry.Attempts, 6), prefer: from}
	rep, err := c.do(ctx, cl)
	if err != nil && op != "extend" && errors.Is(err, ErrLeaseLost) && Uncertain(err) {
		c.log.Debug("narad: 410 after an unconfirmed settlement counts as settled", "op", op, "topic", topic)
		return &reply{status: http.StatusNoContent}, nil
	}
	return rep, err
}

// AckResult is the outcome of one entry of AckBatch.
type AckResult struct {
	// Message is the message the entry settled.
	Message *Message
	// Err is nil when the message was settled, else why not (ErrLeaseLost, ...).
	Err error
}

// AckBatch acks many messages of one topic in as few requests as possible (1000 per
// request, one set of requests per endpoint that leased messages) and reports a result
// per message, in order. Entries that answer 503 are
// retried; a partial failure is never hidden: check every result. The error is non-nil
// when any entry failed; it joins the failures.
func (c *Client) AckBatch(ctx context.Context, topic string, msgs []*Message) ([]AckResult, error) {
	res := make([]AckResult, len(msgs))
	todo := make([]int, 0, len(msgs))
	for i, m := range msgs {
		res[i].Message = m
		if m.ReceiptHandle == "" {
			res[i].Err = &Error{Op: "ack-batch", Topic: topic, kind: ErrNoLease}
			continue
		}
		m.mu.Lock()
		if m.lost || m.settled {
			res[i].Err = &Error{Op: "ack-batch", Topic: topic, Status: http.StatusGone, Code: CodeLeaseLost, Message: "already settled or lost", kind: ErrLeaseLost}
		} else {
			m.settled = true
			todo = append(todo, i)
		}
		l := m.lease
		m.mu.Unlock()
		if res[i].Err == nil && l != nil {
			l.stop()
		}
	}
	// A lease is known only to the node that issued it: group the entries by that node,
	// in the order the nodes first appear.
	var order []*node
	byNode := map[*node][]int{}
	for _, i := range todo {
		from := msgs[i].from
		if _, ok := byNode[from]; !ok {
			order = append(order, from)
		}
		byNode[from] = append(byNode[from], i)
	}
	for _, from := range order {
		group := byNode[from]
		for start := 0; start < len(group); start += 1000 {
			chunk := group[start:min(start+1000, len(group))]
			c.ackChunk(ctx, topic, msgs, chunk, res, from)
		}
	}
	var errs []error
	for _, i := range todo {
		m := res[i].Message
		m.mu.Lock()
		switch {
		case res[i].Err == nil:
			m.outcome = "ack"
		case errors.Is(res[i].Err, ErrLeaseLost):
			m.lost = true
		default:
			m.settled = false
		}
		m.mu.Unlock()
	}
	for i := range res {
		if res[i].Err != nil {
			errs = append(errs, res[i].Err)
		}
	}
	return res, errors.Join(errs...)
}

func (c *Client) ackChunk(ctx context.Context, topic string, msgs []*Message, idx []int, res []AckResult, from *node) {
	bo := c.cfg.retry.Backoff()
	attempts := max(c.cfg.retry.Attempts, 6)
	uncertain := make(map[int]bool)
	for attempt := 1; len(idx) > 0; attempt++ {
		req := api.AckBatchRequest{Acks: make([]api.AckEntry, len(idx))}
		for j, i := range idx {
			req.Acks[j].ReceiptHandle = msgs[i].ReceiptHandle
		}
		rep, err := c.do(ctx, &call{op: "ack-batch", topic: topic,
			build:    func(s string) (*http.Request, error) { return api.NewAckBatchRequest(s, topic, req) },
			attempts: attempts, prefer: from})
		var out api.AckResultList
		if err == nil {
			if jerr := json.Unmarshal(rep.body, &out); jerr != nil || len(out.Results) != len(idx) {
				err = &Error{Op: "ack-batch", Topic: topic, Node: rep.node, kind: ErrInternal,
					Message: "the broker answered " + strconv.Itoa(len(out.Results)) + " results for " + strconv.Itoa(len(idx)) + " entries"}
			} else if rep.uncertainBefore {
				for _, i := range idx {
					uncertain[i] = true
				}
			}
		}
		if err != nil {
			for _, i := range idx {
				res[i].Err = err
			}
			return
		}
		var again []int
		var retryAfter time.Duration
		for j, r := range out.Results {
			i := idx[j]
			if r.Status == http.StatusNoContent {
				res[i].Err = nil
				continue
			}
			e := &Error{Op: "ack-batch", Topic: topic, Status: int(r.Status)}
			if r.Error != nil {
				e.Code, e.Message = string(r.Error.Code), r.Error.Message
			}
			e.kind = kindOf(e.Status, e.Code)
			if e.Status == http.StatusGone && uncertain[i] {
				// An earlier attempt of this entry may have settled it (contract rule 2).
				res[i].Err = nil
				continue
			}
			if e.Code == CodeTimeout || e.Status == http.StatusGatewayTimeout || e.Status == http.StatusRequestTimeout {
				// The broker could not tell whether this entry was applied (503 timeout):
				// a 410 on its retry counts as settled, as for Message.Ack.
				e.uncertain = true
				uncertain[i] = true
			}
			res[i].Err = e
			if e.Retryable() {
				again = append(again, i)
				retryAfter = time.Second
			}
		}
		if len(again) == 0 || attempt >= attempts {
			return
		}
		idx = again
		wait := max(bo.NextBackOff(), retryAfter)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (c *Client) newMessage(w *api.Message, from *node) (*Message, error) {
	m := &Message{
		from:      from,
		Topic:     w.Topic,
		Partition: w.Partition,
		Offset:    w.Offset,
		Timestamp: time.UnixMilli(w.Timestamp),
		client:    c,
	}
	if w.Key != nil {
		m.Key = *w.Key
	}
	if w.DeliveryAttempt != nil {
		m.DeliveryAttempt = int(*w.DeliveryAttempt)
	}
	if w.ReceiptHandle != nil {
		m.ReceiptHandle = *w.ReceiptHandle
	}
	if w.PayloadEncoding != nil && *w.PayloadEncoding == "base64" {
		var s string
		if err := json.Unmarshal(w.Payload, &s); err != nil {
			return nil, err
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, err
		}
		m.body = b
	} else {
		m.body = []byte(w.Payload)
	}
	return m, nil
}
