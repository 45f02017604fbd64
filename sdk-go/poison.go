package narad

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Poison backoff: the default delay before a failed message is delivered again.
const (
	PoisonBackoffBase = time.Second
	PoisonBackoffMax  = 5 * time.Minute
)

// PoisonBackoff is the delay a Consumer hands a failed message back with when neither
// WithNackDelay nor NackAfter says otherwise: 1 s × 2^(attempt-1), capped at 5 min, drawn
// uniformly from its upper half. A message that always fails (a poison message) is then
// delivered a few times a minute at most instead of thousands of times a second, and
// the jitter keeps a batch of them from coming back together.
func PoisonBackoff(deliveryAttempt int) time.Duration {
	d := PoisonBackoffMax
	if deliveryAttempt < 1 {
		deliveryAttempt = 1
	}
	if deliveryAttempt <= 20 { // 2^19 s is far over the cap
		d = min(PoisonBackoffBase<<(deliveryAttempt-1), PoisonBackoffMax)
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// nackDelayFor is the delay for handing m back after a handler failure err.
func (cs *Consumer) nackDelayFor(m *Message, err error) time.Duration {
	var ne *nackError
	if errors.As(err, &ne) {
		return ne.delay
	}
	if cs.cfg.nackSet {
		return cs.cfg.nackDelay
	}
	return PoisonBackoff(m.DeliveryAttempt)
}

// checkConfig refuses option combinations that cannot work, before Run makes a request.
func (cs *Consumer) checkConfig() error {
	if cs.cfg.maxDeliveries > 0 && cs.cfg.deadLetter == "" {
		return fmt.Errorf("narad: consumer of %s: WithMaxDeliveries(%d) needs WithDeadLetterTopic, or messages past the limit would be dropped: %w",
			cs.topic, cs.cfg.maxDeliveries, ErrInvalidOption)
	}
	if cs.cfg.deadLetter != "" && cs.cfg.deadLetter == cs.topic {
		return fmt.Errorf("narad: consumer of %s: the dead-letter topic must be another topic: %w", cs.topic, ErrInvalidOption)
	}
	return nil
}

// deadLetter produces m to the dead-letter topic and acks it, or, when the produce
// fails, hands it back with the backoff: a message is acked only once it is stored in
// the dead-letter topic.
func (cs *Consumer) deadLetter(ctx context.Context, m *Message) {
	reason := fmt.Sprintf("delivered %d times, over the limit of %d", m.DeliveryAttempt, cs.cfg.maxDeliveries)
	var body any = m.body
	if env, ok := OpenEnvelope(m); ok {
		next := env.Clone()
		next.LastError = reason
		if next.Headers == nil {
			next.Headers = map[string]string{}
		}
		next.Headers["dead_letter_from"] = cs.topic
		if next.Origin == "" {
			next.Origin = cs.topic
		}
		body = next
	}
	var opts []ProduceOption
	if m.Key != "" {
		opts = append(opts, WithKey(m.Key))
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(cs.currentVisibility(), 10*time.Second))
	_, err := cs.c.Produce(pctx, cs.cfg.deadLetter, body, opts...)
	cancel()
	if err != nil {
		cs.report(fmt.Errorf("narad: dead-lettering partition %d offset %d of %s to %s failed; handing it back: %w",
			m.Partition, m.Offset, cs.topic, cs.cfg.deadLetter, err), false)
		delay := PoisonBackoff(m.DeliveryAttempt)
		if cs.cfg.nackSet {
			delay = cs.cfg.nackDelay
		}
		cs.settle(ctx, m, "nack", delay)
		return
	}
	cs.deadLettered.Add(1)
	cs.c.log.Warn("narad: message dead-lettered", "topic", cs.topic, "partition", m.Partition, "offset", m.Offset,
		"delivery_attempt", m.DeliveryAttempt, "dead_letter_topic", cs.cfg.deadLetter)
	cs.settle(ctx, m, "ack", 0)
}
