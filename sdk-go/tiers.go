package narad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"
)

// RetryTier is one delay step. Topic is the tier's retry topic: failed messages are
// produced there and nobody consumes it. Its delay child Due receives each of them Delay
// after the broker stored it, and the tier's consumer reads Due. The broker does the
// waiting, in the retry topic's log: a waiting message holds no lease, so it takes none
// of the in-flight slots (max_in_flight_per_partition) and nothing blocks behind it.
type RetryTier struct {
	// Topic is the retry topic failed messages are produced to.
	Topic string
	// Delay is how long a message waits in the tier (the delay child's fanout delay).
	Delay time.Duration
	// Due is the delay child of Topic the tier's consumer reads; "" means Topic + ".due".
	Due string
}

// DueTopic returns the delay child the tier's consumer reads.
func (t RetryTier) DueTopic() string {
	if t.Due != "" {
		return t.Due
	}
	return t.Topic + ".due"
}

// RetryTiers routes failed messages through delay tiers and finally to a parking
// (dead-letter) topic, all in user space on plain topics and delay children, with the
// opt-in Envelope; the same topics and envelope as the other SDKs, so they can share them:
//
//   - a handler failure on the main topic (attempt 1) re-produces the message to the
//     first tier's retry topic with attempt 2 (and NotBefore = now + that tier's delay,
//     for information), then acks the original;
//   - the broker copies it to the tier's delay child (RetryTier.DueTopic) the tier's
//     delay after it stored it; the tier's consumer runs the same handler there, and a
//     failure moves the message to the next tier;
//   - after the last tier it goes to the parking topic with its last error.
//
// The envelope's id stays the same all the way, so handlers can deduplicate.
type RetryTiers struct {
	// Topic is the main topic.
	Topic string
	// Tiers are the delay steps, in order.
	Tiers []RetryTier
	// Parking receives messages that failed in the last tier too.
	Parking string
}

// EnsureTopics creates, with cfg, the main and parking topics and each tier's retry topic
// and delay child, those that do not exist yet. A retry topic keeps its messages for its
// delay plus two hours unless cfg keeps them longer (the broker wants a parent to keep
// them at least an hour past its delay). An existing due topic that is not the delay
// child its tier needs fails with ErrConflict.
func (t RetryTiers) EnsureTopics(ctx context.Context, c *Client, cfg TopicConfig) error {
	for _, n := range []string{t.Topic, t.Parking} {
		if _, err := c.EnsureTopic(ctx, n, cfg); err != nil {
			return err
		}
	}
	for _, tier := range t.Tiers {
		retryCfg := cfg
		if keep := tier.Delay + 2*time.Hour; retryCfg.Retention < keep {
			retryCfg.Retention = keep
		}
		if _, err := c.EnsureTopic(ctx, tier.Topic, retryCfg); err != nil {
			return err
		}
		if err := ensureDelayChild(ctx, c, tier.Topic, tier.DueTopic(), tier.Delay, cfg); err != nil {
			return err
		}
	}
	return nil
}

// ensureDelayChild creates child as parent's delay child, or checks that it already is one.
func ensureDelayChild(ctx context.Context, c *Client, parent, child string, delay time.Duration, cfg TopicConfig) error {
	_, err := c.CreateChild(ctx, parent, child, delay, cfg)
	if !errors.Is(err, ErrConflict) {
		return err
	}
	info, gerr := c.Topic(ctx, child)
	if gerr != nil {
		return errors.Join(err, gerr)
	}
	if info.Parent != parent || info.FanoutDelay != delay {
		return fmt.Errorf("retry tier %s: %s exists as a child of %q with delay %s, not of %s with %s; delete it or name another Due topic: %w",
			parent, child, info.Parent, info.FanoutDelay, parent, delay, ErrConflict)
	}
	return nil
}

// envelopeOf returns m's envelope, wrapping a plain message as attempt 1.
func (t RetryTiers) envelopeOf(m *Message) *Envelope {
	if env, ok := OpenEnvelope(m); ok {
		return env
	}
	kind := "bytes"
	switch {
	case len(m.body) > 0 && json.Valid(m.body):
		kind = "json"
	case utf8.Valid(m.body):
		kind = "text"
	}
	return &Envelope{ID: newID(), Attempt: 1, Origin: m.Topic, body: m.body, kind: kind}
}

// Route sends a failed message on: to the tier for its attempt, or to the parking topic
// after the last tier, keeping its key. It returns where it went. The caller acks the
// original afterwards (the Handler of RetryTiers does).
func (t RetryTiers) Route(ctx context.Context, c *Client, m *Message, failure error) (string, *Envelope, error) {
	env := t.envelopeOf(m)
	next := env.Clone()
	if failure != nil {
		next.LastError = failure.Error()
	}
	if next.Origin == "" {
		next.Origin = t.Topic
	}
	topic := t.Parking
	if i := env.Attempt - 1; i >= 0 && i < len(t.Tiers) {
		next.Attempt = env.Attempt + 1
		next.NotBefore = time.Now().Add(t.Tiers[i].Delay)
		topic = t.Tiers[i].Topic
	}
	var opts []ProduceOption
	if m.Key != "" {
		opts = append(opts, WithKey(m.Key))
	}
	_, err := c.Produce(ctx, topic, next, opts...)
	return topic, next, err
}

// Handler returns a Handler for the main topic and every tier's due topic: it runs h
// with the envelope's body as the message body (m.Envelope has the rest), and routes a
// failure to the next tier or to parking, then acks. When the lease is lost or the
// consumer stops, the failure is left to redelivery instead. It does not hold messages
// whose NotBefore is still ahead: the waiting is the delay children's (holding them
// leased would fill the in-flight cap and stall the ready messages behind them).
func (t RetryTiers) Handler(c *Client, h Handler) Handler {
	return func(ctx context.Context, m *Message) error {
		env := t.envelopeOf(m)
		m.body, m.env = env.body, env
		err := h(ctx, m)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if _, _, rerr := t.Route(ctx, c, m, err); rerr != nil {
			return errors.Join(err, rerr) // nacked: retried as it is
		}
		return m.Ack(ctx)
	}
}

// Consume runs one Consumer on the main topic and one on each tier's due topic, all with
// h through Handler, until ctx is cancelled or one of them stops on a terminal error, which is
// returned (the others are stopped then).
func (t RetryTiers) Consume(ctx context.Context, c *Client, h Handler, opts ...ConsumeOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrapped := t.Handler(c, h)
	topics := []string{t.Topic}
	for _, tier := range t.Tiers {
		topics = append(topics, tier.DueTopic())
	}
	var wg sync.WaitGroup
	errs := make([]error, len(topics))
	for i, topic := range topics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Consume(ctx, topic, wrapped, opts...)
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
