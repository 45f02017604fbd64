package narad

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"
	"unicode/utf8"
)

// RetryTier is one delay step: a plain topic where failed messages wait Delay.
type RetryTier struct {
	Topic string
	Delay time.Duration
}

// RetryTiers routes failed messages through delay tiers and finally to a parking
// (dead-letter) topic, all in user space on plain topics, with the opt-in Envelope; the
// same scheme as the other SDKs, so they can share the topics:
//
//   - a handler failure on the main topic (attempt 1) re-produces the message to the
//     first tier with attempt 2 and NotBefore = now + that tier's delay, then acks the
//     original;
//   - a tier's consumer holds early messages back with a delayed nack until NotBefore,
//     then runs the same handler; a failure moves the message to the next tier;
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

// EnsureTopics creates the main, tier and parking topics that do not exist yet, with cfg.
func (t RetryTiers) EnsureTopics(ctx context.Context, c *Client, cfg TopicConfig) error {
	names := []string{t.Topic}
	for _, tier := range t.Tiers {
		names = append(names, tier.Topic)
	}
	names = append(names, t.Parking)
	for _, n := range names {
		if _, err := c.EnsureTopic(ctx, n, cfg); err != nil {
			return err
		}
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

// Handler returns a Handler for the main topic and every tier: it holds messages back
// until they are due, runs h with the envelope's body as the message body (m.Envelope
// has the rest), and routes a failure to the next tier or to parking, then acks. When
// the lease is lost or the consumer stops, the failure is left to redelivery instead.
func (t RetryTiers) Handler(c *Client, h Handler) Handler {
	return func(ctx context.Context, m *Message) error {
		env := t.envelopeOf(m)
		if wait := time.Until(env.NotBefore); !env.NotBefore.IsZero() && wait > 0 {
			return m.Nack(ctx, wait)
		}
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

// Consume runs one Consumer on the main topic and one on each tier, all with h through
// Handler, until ctx is cancelled or one of them stops on a terminal error, which is
// returned (the others are stopped then).
func (t RetryTiers) Consume(ctx context.Context, c *Client, h Handler, opts ...ConsumeOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrapped := t.Handler(c, h)
	topics := []string{t.Topic}
	for _, tier := range t.Tiers {
		topics = append(topics, tier.Topic)
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
