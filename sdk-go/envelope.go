package narad

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Envelope is the opt-in JSON wrapper shared by every Narad SDK. It carries a message id
// that stays the same across produce retries and re-routing (for deduplication), an
// attempt count, headers and a W3C trace context, around the payload. The broker never
// looks inside it; RetryTiers and the tracing adapter use it.
//
// On the wire it is a JSON object {"narad_envelope":1, "id", "attempt", "headers",
// "traceparent", "tracestate", "payload", "payload_encoding"}; a JSON payload is
// embedded as is, other bytes as base64 with "payload_encoding":"base64".
type Envelope struct {
	ID          string
	Attempt     int
	Headers     map[string]string
	TraceParent string
	TraceState  string

	payload []byte
	json    bool
}

type envelopeWire struct {
	Version         int               `json:"narad_envelope"`
	ID              string            `json:"id"`
	Attempt         int               `json:"attempt"`
	Headers         map[string]string `json:"headers,omitempty"`
	TraceParent     string            `json:"traceparent,omitempty"`
	TraceState      string            `json:"tracestate,omitempty"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding,omitempty"`
}

// NewEnvelope wraps body (encoded as for Produce) with a fresh random id and attempt 1.
func NewEnvelope(body any) (*Envelope, error) {
	data, ct, err := encodeBody(body)
	if err != nil {
		return nil, err
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	return &Envelope{ID: hex.EncodeToString(id[:]), Attempt: 1, payload: data, json: ct == "application/json"}, nil
}

// Bytes returns the wrapped payload's bytes.
func (e *Envelope) Bytes() []byte { return e.payload }

// Decode unmarshals a JSON payload into v.
func (e *Envelope) Decode(v any) error { return json.Unmarshal(e.payload, v) }

// SetHeader sets one header, making the map when needed.
func (e *Envelope) SetHeader(k, v string) {
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	e.Headers[k] = v
}

// Next returns a copy for the following attempt: same id, payload and trace, attempt + 1.
func (e *Envelope) Next() *Envelope {
	n := *e
	n.Attempt++
	n.Headers = make(map[string]string, len(e.Headers))
	for k, v := range e.Headers {
		n.Headers[k] = v
	}
	return &n
}

// MarshalJSON writes the wire form.
func (e Envelope) MarshalJSON() ([]byte, error) {
	w := envelopeWire{Version: 1, ID: e.ID, Attempt: e.Attempt, Headers: e.Headers, TraceParent: e.TraceParent, TraceState: e.TraceState}
	if e.json && json.Valid(e.payload) {
		w.Payload = e.payload
	} else {
		w.Payload, _ = json.Marshal(base64.StdEncoding.EncodeToString(e.payload))
		w.PayloadEncoding = "base64"
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the wire form; it fails on JSON that is not an envelope.
func (e *Envelope) UnmarshalJSON(b []byte) error {
	var w envelopeWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if w.Version != 1 || w.ID == "" || len(w.Payload) == 0 {
		return errors.New("narad: not an envelope")
	}
	*e = Envelope{ID: w.ID, Attempt: max(w.Attempt, 1), Headers: w.Headers, TraceParent: w.TraceParent, TraceState: w.TraceState}
	if w.PayloadEncoding == "base64" {
		var s string
		if err := json.Unmarshal(w.Payload, &s); err != nil {
			return err
		}
		p, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return err
		}
		e.payload = p
	} else {
		e.payload, e.json = []byte(w.Payload), true
	}
	return nil
}

// OpenEnvelope returns the envelope a message carries, or nil and false when its body is
// not an envelope.
func OpenEnvelope(m *Message) (*Envelope, bool) {
	var e Envelope
	if len(m.body) == 0 || m.body[0] != '{' || e.UnmarshalJSON(m.body) != nil {
		return nil, false
	}
	return &e, true
}

// Envelope returns the envelope the message was unwrapped from by RetryTiers, or nil.
func (m *Message) Envelope() *Envelope { return m.env }

// Headers written by RetryTiers on parked messages.
const (
	HeaderError           = "narad-error"
	HeaderOriginTopic     = "narad-origin-topic"
	HeaderOriginPartition = "narad-origin-partition"
	HeaderOriginOffset    = "narad-origin-offset"
)

// RetryTiers routes failed messages through growing delays and finally to a parking
// (dead-letter) topic, in user space on plain topics. Wrap a Handler with it.
//
// The attempt number is the envelope's attempt plus the broker's delivery attempt minus
// one, so it counts both re-routes and redeliveries. After a failure of attempt n:
//   - while n <= len(Delays), the message is retried after Delays[n-1]: in nack mode
//     (Topics empty) it is nacked with that delay; in topic mode it is wrapped in an
//     Envelope with attempt n+1 and produced to Topics[n-1] (a delay tier whose delay
//     child is the main topic, see CreateDelayTier), and the original is acked;
//   - after that it is produced to Parking in an Envelope whose headers say the last
//     error and where it came from, and the original is acked.
//
// The handler sees the payload of an enveloped message (Message.Envelope has the rest).
type RetryTiers struct {
	// Delays before the second, third, ... attempt.
	Delays []time.Duration
	// Topics are optional delay-tier topics, one per delay.
	Topics []string
	// Parking is the topic for messages that failed every tier; "" drops nothing and
	// keeps retrying with the last delay.
	Parking string
}

// Wrap returns a Handler that runs h and routes its failures through the tiers, using c
// to produce.
func (t RetryTiers) Wrap(c *Client, h Handler) Handler {
	return func(ctx context.Context, m *Message) error {
		env, ok := OpenEnvelope(m)
		if ok {
			m.body, m.env = env.payload, env
		} else {
			env = &Envelope{ID: fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset), Attempt: 1, payload: m.body, json: json.Valid(m.body)}
		}
		err := h(ctx, m)
		if err == nil || ctx.Err() != nil {
			return err
		}
		attempt := env.Attempt + max(m.DeliveryAttempt, 1) - 1
		if attempt <= len(t.Delays) || (t.Parking == "" && len(t.Delays) > 0) {
			delay := t.Delays[min(attempt, len(t.Delays))-1]
			if attempt > len(t.Delays) || len(t.Topics) < len(t.Delays) {
				return NackAfter(err, delay)
			}
			next := env.Next()
			next.Attempt = attempt + 1
			next.SetHeader(HeaderError, err.Error())
			if _, perr := c.Produce(ctx, t.Topics[attempt-1], next); perr != nil {
				return NackAfter(errors.Join(err, perr), delay)
			}
			return nil
		}
		if t.Parking == "" {
			return err
		}
		parked := env.Next()
		parked.Attempt = attempt
		parked.SetHeader(HeaderError, err.Error())
		parked.SetHeader(HeaderOriginTopic, m.Topic)
		parked.SetHeader(HeaderOriginPartition, strconv.Itoa(int(m.Partition)))
		parked.SetHeader(HeaderOriginOffset, strconv.FormatInt(m.Offset, 10))
		if _, perr := c.Produce(ctx, t.Parking, parked); perr != nil {
			return errors.Join(err, perr)
		}
		return nil
	}
}
