package narad

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Broker limits on produce requests.
const (
	// MaxMessageBytes is the largest message body the broker accepts.
	MaxMessageBytes = 1 << 20
	// MaxBatchMessages is the most messages (or acks) in one batch request.
	MaxBatchMessages = 1000
	// maxBatchBody is the largest batch body the SDK sends (the broker's limit is 8 MiB).
	maxBatchBody = 7 << 20
)

// Produced says where a message was written.
type Produced struct {
	Topic     string
	Partition int32
	Offset    int64
}

// ProduceOption configures one Produce call.
type ProduceOption func(*produceConfig)

type produceConfig struct {
	key         string
	hasKey      bool
	partition   int32
	pinned      bool
	contentType string
	noDup       bool
}

// WithKey sets the message key: the same key always lands in the same partition.
func WithKey(key string) ProduceOption {
	return func(p *produceConfig) { p.key, p.hasKey = key, true }
}

// WithPartition pins the partition, overriding the key for placement.
func WithPartition(partition int32) ProduceOption {
	return func(p *produceConfig) { p.partition, p.pinned = partition, true }
}

// WithContentType sends the body with this Content-Type instead of the one the SDK
// picks from its Go type. The broker checks application/json and text/* bodies.
func WithContentType(ct string) ProduceOption {
	return func(p *produceConfig) { p.contentType = ct }
}

// NoDuplicates forbids retrying when the outcome of an attempt is unknown (the reply was
// lost): the call then fails with an error for which Uncertain is true, and the caller
// decides. By default such attempts are retried, which may store a second copy, since
// consumers are expected to be idempotent.
func NoDuplicates() ProduceOption {
	return func(p *produceConfig) { p.noDup = true }
}

// encodeBody turns a body into bytes and a Content-Type: []byte as application/octet-stream,
// a UTF-8 string as text/plain, json.RawMessage verbatim as application/json, and any other
// value marshalled as JSON.
func encodeBody(body any) ([]byte, string, error) {
	switch b := body.(type) {
	case []byte:
		return b, "application/octet-stream", nil
	case json.RawMessage:
		if !json.Valid(b) {
			return nil, "", fmt.Errorf("narad: the json.RawMessage body is not valid JSON")
		}
		return b, "application/json", nil
	case string:
		if utf8.ValidString(b) {
			return []byte(b), "text/plain; charset=utf-8", nil
		}
		return []byte(b), "application/octet-stream", nil
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, "", fmt.Errorf("narad: encoding the body as JSON: %w", err)
	}
	return data, "application/json", nil
}

// Produce writes one message and returns where it landed once it is durable. body is a
// []byte (sent as is), a string (sent as UTF-8 text), a json.RawMessage, or any other
// value, sent as its JSON encoding. Consumers of this SDK get the bytes back exactly.
//
// A request refused before it was stored fails over to another endpoint at once. An
// attempt whose outcome is unknown is retried (possibly storing a second copy) unless
// NoDuplicates is given; the error then answers true to Uncertain.
func (c *Client) Produce(ctx context.Context, topic string, body any, opts ...ProduceOption) (Produced, error) {
	var pc produceConfig
	for _, o := range opts {
		o(&pc)
	}
	data, ct, err := encodeBody(body)
	if err != nil {
		return Produced{}, &Error{Op: "produce", Topic: topic, Err: err, Message: err.Error(), kind: ErrBadRequest}
	}
	if pc.contentType != "" {
		ct = pc.contentType
	}
	if len(data) > MaxMessageBytes {
		return Produced{}, &Error{Op: "produce", Topic: topic, Message: fmt.Sprintf("the body is %d bytes; a message is at most %d", len(data), MaxMessageBytes), kind: ErrTooLarge}
	}
	var params api.ProduceParams
	if pc.hasKey {
		params.Key = &pc.key
	}
	if pc.pinned {
		params.Partition = &pc.partition
	}
	// The body is the message's own bytes in its own content type, so the call uses the
	// WithBody builder (the spec's produce has no JSON-only form).
	build := func(s string) (*http.Request, error) {
		return api.NewProduceRequestWithBody(s, topic, &params, ct, bytes.NewReader(data))
	}
	var out api.Produced
	err = c.doJSON(ctx, &call{op: "produce", topic: topic, build: build,
		unsafe: true, allowDup: !pc.noDup, count: 1}, &out)
	if err != nil {
		return Produced{}, err
	}
	return Produced{Topic: topic, Partition: out.Partition, Offset: out.Offset}, nil
}

// Outgoing is one message of a batch.
type Outgoing struct {
	// Body is the message, encoded as for Produce: []byte and string bodies are stored
	// as their exact bytes, json.RawMessage and other values as JSON.
	Body any
	// Key, when not "", chooses the partition by hash.
	Key string
	// Partition, when not nil, pins the partition (see Pin).
	Partition *int32
}

// Pin returns a pointer to p, for Outgoing.Partition.
func Pin(p int32) *int32 { return &p }

// ProduceResult is the outcome of one message of ProduceBatch.
type ProduceResult struct {
	Produced
	// Err is nil when the message is durable.
	Err error
}

// ProduceBatch writes many messages to one topic in as few requests as the broker's
// limits allow (1000 messages or about 7 MiB each) and returns one result per message,
// in order. A message over the broker's 1 MiB limit fails alone with ErrTooLarge and is
// not sent; the others are. A batch that needs several requests can fail in part, and
// so can one request whose partitions' writes partly failed: its messages then all get
// an *Error whose PartlyStored says how many were stored and which partitions were not
// (such a request is never resent, whatever NoDuplicates says). The error is non-nil
// when any message failed, and joins the distinct failures; check every result's Err.
// Retryable and Uncertain of the error describe the whole call: when some messages were
// stored (or some request's outcome is unknown) it is uncertain and not retryable, since
// sending the whole batch again would store those twice.
func (c *Client) ProduceBatch(ctx context.Context, topic string, msgs []Outgoing, opts ...ProduceOption) ([]ProduceResult, error) {
	var pc produceConfig
	for _, o := range opts {
		o(&pc)
	}
	res := make([]ProduceResult, len(msgs))
	wire := make([]api.OutgoingMessage, len(msgs))
	sizes := make([]int, len(msgs))
	for i, m := range msgs {
		w, n, err := outgoingWireAs(m, "")
		if err != nil {
			res[i].Err = &Error{Op: "produce-batch", Topic: topic, Err: err, Message: err.Error(), kind: ErrBadRequest}
			continue
		}
		if n > MaxMessageBytes {
			// Refused here, alone: sent, it would make the broker refuse the whole
			// request (413) and fail every other message of it.
			res[i].Err = &Error{Op: "produce-batch", Topic: topic, Message: fmt.Sprintf("message %d: the body is %d bytes; a message is at most %d", i, n, MaxMessageBytes), kind: ErrTooLarge}
			continue
		}
		wire[i] = w
		sizes[i] = len(w.Payload) + len(m.Key) + 64
	}
	var chunk []int
	size := 0
	flush := func() {
		if len(chunk) > 0 {
			c.produceChunk(ctx, topic, wire, chunk, res, !pc.noDup)
		}
		chunk, size = chunk[:0], 0
	}
	for i := range msgs {
		if res[i].Err != nil {
			continue
		}
		if len(chunk) == MaxBatchMessages || (len(chunk) > 0 && size+sizes[i] > maxBatchBody) {
			flush()
		}
		chunk = append(chunk, i)
		size += sizes[i]
	}
	flush()
	var errs []error
	seen := map[error]bool{}
	stored, retryable, uncertain := 0, true, false
	for _, r := range res {
		if r.Err == nil {
			stored++
			continue
		}
		retryable = retryable && Retryable(r.Err)
		uncertain = uncertain || Uncertain(r.Err)
		if !seen[r.Err] {
			seen[r.Err] = true
			errs = append(errs, r.Err)
		}
	}
	if len(errs) > 0 && (stored > 0 || (uncertain && !Uncertain(errs[0])) || (!retryable && Retryable(errs[0]))) {
		// The call's own flags differ from its first failure's: part of it was stored
		// (or another request's outcome is unknown), so sending the whole batch again is
		// not safe. Retryable and Uncertain read this summary first; errors.Is and the
		// failures themselves (and each result's Err) are unchanged.
		errs = append([]error{&Error{Op: "produce-batch", Topic: topic, uncertain: true,
			Message: fmt.Sprintf("%d of %d messages failed and %d were stored; do not send the batch again whole, check each result", len(msgs)-stored, len(msgs), stored)}}, errs...)
		if stored == 0 {
			errs[0].(*Error).Message = fmt.Sprintf("%d messages failed, some with an unknown outcome; do not send the batch again whole, check each result", len(msgs))
		}
	}
	return res, errors.Join(errs...)
}

// outgoingWireAs encodes m for a batch; contentType, when not "", overrides the type
// the body's Go type implies. A batch entry has no content type of its own: a JSON type
// sends the body as a JSON payload (which must be valid JSON, and which the broker
// checks as JSON), any other sends its exact bytes. n is the size of the message's body
// as the broker stores it, which its 1 MiB limit applies to.
func outgoingWireAs(m Outgoing, contentType string) (w api.OutgoingMessage, n int, err error) {
	if m.Key != "" {
		k := m.Key
		w.Key = &k
	}
	w.Partition = m.Partition
	data, ct, err := encodeBody(m.Body)
	if err != nil {
		return w, 0, err
	}
	if contentType != "" {
		ct = contentType
		if isJSONType(ct) {
			if !json.Valid(data) {
				return w, 0, fmt.Errorf("narad: the body is not valid JSON, but its content type is %s", ct)
			}
			ct = "application/json"
		}
	}
	if ct == "application/json" {
		w.Payload = data
		return w, len(data), nil
	}
	// Bytes and text travel as base64 so the stored bytes are exactly the body's.
	s, _ := json.Marshal(base64.StdEncoding.EncodeToString(data))
	enc := api.OutgoingMessagePayloadEncoding("base64")
	w.Payload, w.PayloadEncoding = s, &enc
	return w, len(data), nil
}

// isJSONType reports whether a Content-Type names JSON (application/json or a +json type).
func isJSONType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

func (c *Client) produceChunk(ctx context.Context, topic string, wire []api.OutgoingMessage, idx []int, res []ProduceResult, allowDup bool) {
	req := api.ProduceBatchRequest{Messages: make([]api.OutgoingMessage, len(idx))}
	for j, i := range idx {
		req.Messages[j] = wire[i]
	}
	var out api.ProducedList
	err := c.doJSON(ctx, &call{op: "produce-batch", topic: topic,
		build:  func(s string) (*http.Request, error) { return api.NewProduceBatchRequest(s, topic, req) },
		unsafe: true, allowDup: allowDup, count: len(idx)}, &out)
	if err == nil && len(out.Results) != len(idx) {
		// Answered 202: stored, though the answer does not say where.
		err = &Error{Op: "produce-batch", Topic: topic, kind: ErrInternal, uncertain: true,
			Message: fmt.Sprintf("the broker answered %d results for %d messages", len(out.Results), len(idx))}
	}
	for j, i := range idx {
		if err != nil {
			res[i].Err = err
			continue
		}
		p := out.Results[j]
		res[i].Produced, res[i].Err = Produced{Topic: topic, Partition: p.Partition, Offset: p.Offset}, nil
	}
}
