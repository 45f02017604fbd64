package narad

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"time"
	"unicode/utf8"
)

// EnvelopeFormat marks a message body as a Narad envelope, version 1.
const EnvelopeFormat = "narad.envelope/1"

// Envelope is the opt-in JSON wrapper shared by every Narad SDK, for the patterns that
// need more than a body: a message id that stays the same across produce retries and
// re-routing (for deduplication), an attempt count, headers and a W3C trace context.
// The broker never looks inside it. Produce one by passing it as the body; read one back
// with OpenEnvelope.
//
// On the wire it is the JSON object {"format":"narad.envelope/1", "id", "attempt",
// "headers", "traceparent", "tracestate", "not_before", "last_error", "origin", and one
// of "body" (a JSON value), "body_text" (text) or "body_base64" (other bytes)}, the same
// in every SDK.
type Envelope struct {
	// ID identifies the message across retries and tiers.
	ID string
	// Attempt counts attempts from 1; retry tiers count it up.
	Attempt int
	// Headers are application headers.
	Headers map[string]string
	// TraceParent and TraceState are the producer's W3C trace context.
	TraceParent, TraceState string
	// NotBefore, when not zero, is when the message becomes due (set by retry tiers).
	NotBefore time.Time
	// LastError is the error that sent the message to a tier or to parking.
	LastError string
	// Origin is the topic the message was first produced to.
	Origin string

	body []byte
	kind string // "json", "text" or "bytes"
}

type envelopeWire struct {
	Format      string            `json:"format"`
	ID          string            `json:"id"`
	Attempt     int               `json:"attempt"`
	Headers     map[string]string `json:"headers,omitempty"`
	TraceParent string            `json:"traceparent,omitempty"`
	TraceState  string            `json:"tracestate,omitempty"`
	NotBefore   *int64            `json:"not_before,omitempty"`
	LastError   string            `json:"last_error,omitempty"`
	Origin      string            `json:"origin,omitempty"`
	Body        json.RawMessage   `json:"body,omitempty"`
	BodyText    *string           `json:"body_text,omitempty"`
	BodyBase64  *string           `json:"body_base64,omitempty"`
}

// NewEnvelope wraps body (encoded as for Produce: bytes, text or a JSON value) with a
// fresh random id and attempt 1.
func NewEnvelope(body any) (*Envelope, error) {
	if _, ok := body.(*Envelope); ok {
		return nil, errors.New("narad: the body is already an envelope")
	}
	data, ct, err := encodeBody(body)
	if err != nil {
		return nil, err
	}
	kind := "bytes"
	switch ct {
	case "application/json":
		kind = "json"
	case "text/plain; charset=utf-8":
		kind = "text"
	}
	return &Envelope{ID: newID(), Attempt: 1, body: data, kind: kind}, nil
}

func newID() string {
	var id [16]byte
	_, _ = rand.Read(id[:])   // since Go 1.24 it never returns an error (it crashes instead)
	id[6] = id[6]&0x0f | 0x40 // a version 4 UUID, like the other SDKs'
	id[8] = id[8]&0x3f | 0x80
	h := hex.EncodeToString(id[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Bytes returns the wrapped body's exact bytes.
func (e *Envelope) Bytes() []byte { return e.body }

// Decode unmarshals a JSON body into v.
func (e *Envelope) Decode(v any) error { return json.Unmarshal(e.body, v) }

// SetHeader sets one header, making the map when needed.
func (e *Envelope) SetHeader(k, v string) {
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	e.Headers[k] = v
}

// Clone returns an independent copy: same id and body.
func (e *Envelope) Clone() *Envelope {
	n := *e
	n.Headers = maps.Clone(e.Headers)
	return &n
}

// MarshalJSON writes the wire form.
func (e Envelope) MarshalJSON() ([]byte, error) {
	w := envelopeWire{Format: EnvelopeFormat, ID: e.ID, Attempt: max(e.Attempt, 1), Headers: e.Headers,
		TraceParent: e.TraceParent, TraceState: e.TraceState, LastError: e.LastError, Origin: e.Origin}
	if !e.NotBefore.IsZero() {
		ms := e.NotBefore.UnixMilli()
		w.NotBefore = &ms
	}
	switch {
	case e.kind == "json" && json.Valid(e.body):
		w.Body = e.body
	case e.kind == "text" && utf8.Valid(e.body):
		s := string(e.body)
		w.BodyText = &s
	default:
		s := base64.StdEncoding.EncodeToString(e.body)
		w.BodyBase64 = &s
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the wire form; it fails on JSON that is not an envelope.
func (e *Envelope) UnmarshalJSON(b []byte) error {
	var w envelopeWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if w.Format != EnvelopeFormat || w.ID == "" {
		return errors.New("narad: not a " + EnvelopeFormat + " envelope")
	}
	out := Envelope{ID: w.ID, Attempt: max(w.Attempt, 1), Headers: w.Headers, TraceParent: w.TraceParent,
		TraceState: w.TraceState, LastError: w.LastError, Origin: w.Origin}
	if w.NotBefore != nil {
		out.NotBefore = time.UnixMilli(*w.NotBefore)
	}
	switch {
	case w.BodyBase64 != nil:
		p, err := base64.StdEncoding.DecodeString(*w.BodyBase64)
		if err != nil {
			return err
		}
		out.body, out.kind = p, "bytes"
	case w.BodyText != nil:
		out.body, out.kind = []byte(*w.BodyText), "text"
	default:
		out.body, out.kind = bytes.Clone(w.Body), "json"
		if len(out.body) == 0 {
			out.body = []byte("null")
		}
	}
	*e = out
	return nil
}

// OpenEnvelope returns the envelope a message's body holds, or nil and false when the
// body is not an envelope (plain messages and envelopes can share a topic).
func OpenEnvelope(m *Message) (*Envelope, bool) {
	if m.env != nil {
		return m.env, true
	}
	var e Envelope
	if len(m.body) == 0 || m.body[0] != '{' || e.UnmarshalJSON(m.body) != nil {
		return nil, false
	}
	return &e, true
}

// Envelope returns the envelope a RetryTiers handler unwrapped the message from (or
// wrapped a plain message in), or nil outside one.
func (m *Message) Envelope() *Envelope { return m.env }
