package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/jsondepth"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// Limits on request bodies.
const (
	MaxPayloadBytes   = 1 << 20                // one produced message
	MaxPayloadDepth   = broker.MaxPayloadDepth // nesting of a JSON payload's arrays and objects
	MaxBatchBodyBytes = 8 << 20                // a produce-batch or ack-batch body
	MaxAdminBodyBytes = 1 << 20                // any other JSON body
)

// Broker is what the HTTP API needs from the broker.
type Broker interface {
	Ready() bool
	NodeID() string
	CreateTopic(ctx context.Context, s broker.TopicSpec) (meta.Topic, error)
	Topics() ([]meta.Topic, error)
	Exists(name string) error
	Topic(name string) (meta.Topic, []broker.PartitionInfo, error)
	AlterTopic(ctx context.Context, name string, a broker.TopicAlter) (meta.Topic, error)
	DeleteTopic(ctx context.Context, name string, incarnation uint64) error
	Produce(ctx context.Context, topic string, msgs []broker.Outgoing) ([]broker.Produced, error)
	Consume(ctx context.Context, topic string, max int, wait time.Duration) ([]broker.Delivered, error)
	Ack(ctx context.Context, topic string, reqs []broker.AckReq) []error
	Read(ctx context.Context, topic string, part int32, from *uint64, fromTimeMs *int64, max int) ([]broker.Delivered, uint64, error)
	ReadOne(ctx context.Context, topic string, part int32, offset uint64) (*broker.Delivered, error)
	User(name string) (auth.User, bool)
	Users() ([]auth.User, error)
	CreateUser(ctx context.Context, name, password string, grants []auth.Grant) (auth.User, error)
	DeleteUser(ctx context.Context, name string) error
	SetGrants(ctx context.Context, name string, grants []auth.Grant) (auth.User, error)
	SetPassword(ctx context.Context, name, password string) error
	AttachChild(ctx context.Context, parent, child string, delayMs int64) (broker.ChildInfo, error)
	DetachChild(ctx context.Context, parent, child string) error
	Children(parent string) ([]broker.ChildInfo, error)
}

// handlers implements the generated strict server interface. Handlers return domain
// errors; the strict server's error hook turns them into JSON error bodies.
type handlers struct {
	b       Broker
	metrics http.Handler
	authn   *authenticator // checks the current password of a password change
}

var _ apigen.StrictServerInterface = (*handlers)(nil)

func (h *handlers) Healthz(ctx context.Context, _ apigen.HealthzRequestObject) (apigen.HealthzResponseObject, error) {
	return apigen.Healthz200JSONResponse{Status: "ok"}, nil
}

func (h *handlers) Readyz(ctx context.Context, _ apigen.ReadyzRequestObject) (apigen.ReadyzResponseObject, error) {
	if !h.b.Ready() {
		return nil, broker.ErrUnavailable
	}
	return apigen.Readyz200JSONResponse{Status: "ready"}, nil
}

// Metrics is served by the Prometheus handler directly (see server.go); this method only
// satisfies the interface.
func (h *handlers) Metrics(ctx context.Context, _ apigen.MetricsRequestObject) (apigen.MetricsResponseObject, error) {
	return nil, errors.New("metrics are served by the Prometheus handler")
}

func ownerID(ctx context.Context) uint64 {
	if u := principal(ctx); u != nil {
		return u.ID
	}
	return 0
}

func topicJSON(t meta.Topic) apigen.Topic {
	out := apigen.Topic{
		Name:                      t.Name,
		Incarnation:               strconv.FormatUint(t.Incarnation, 10),
		Partitions:                t.Partitions,
		RetentionMs:               t.RetentionMs,
		VisibilityTimeoutMs:       t.VisibilityMs,
		MaxInFlightPerPartition:   t.MaxInFlight,
		MaxAckedAheadPerPartition: t.MaxAckedAhead,
		ReplicationFactor:         t.ReplicationFactor,
		CreatedAt:                 time.UnixMilli(t.CreatedAtMs).UTC(),
	}
	if len(t.Schema) > 0 {
		s := json.RawMessage(t.Schema)
		out.Schema = &s
	}
	if t.Parent != "" {
		p := t.Parent
		out.Parent = &p
		d := t.FanoutDelayMs
		out.FanoutDelayMs = &d
	}
	return out
}

func (h *handlers) CreateTopic(ctx context.Context, r apigen.CreateTopicRequestObject) (apigen.CreateTopicResponseObject, error) {
	body := r.Body
	spec := broker.TopicSpec{
		Name:              body.Name,
		OwnerID:           ownerID(ctx),
		Partitions:        body.Partitions,
		RetentionMs:       body.RetentionMs,
		VisibilityMs:      body.VisibilityTimeoutMs,
		MaxInFlight:       body.MaxInFlightPerPartition,
		MaxAckedAhead:     body.MaxAckedAheadPerPartition,
		ReplicationFactor: body.ReplicationFactor,
		Parent:            body.Parent,
		FanoutDelayMs:     body.FanoutDelayMs,
	}
	if body.Schema != nil {
		spec.Schema = *body.Schema
	}
	t, err := h.b.CreateTopic(ctx, spec)
	if err != nil {
		return nil, err
	}
	return apigen.CreateTopic201JSONResponse(topicJSON(t)), nil
}

func (h *handlers) ListTopics(ctx context.Context, _ apigen.ListTopicsRequestObject) (apigen.ListTopicsResponseObject, error) {
	ts, err := h.b.Topics()
	if err != nil {
		return nil, err
	}
	out := apigen.ListTopics200JSONResponse{Topics: make([]apigen.Topic, 0, len(ts))}
	u := principal(ctx)
	for _, t := range ts {
		if u == nil || u.IsAdmin() || h.canSee(u, t) {
			out.Topics = append(out.Topics, topicJSON(t))
		}
	}
	return out, nil
}

func (h *handlers) GetTopic(ctx context.Context, r apigen.GetTopicRequestObject) (apigen.GetTopicResponseObject, error) {
	t, parts, err := h.b.Topic(r.Topic)
	if err != nil {
		return nil, err
	}
	tj := topicJSON(t)
	out := apigen.GetTopic200JSONResponse{
		Name: tj.Name, Incarnation: tj.Incarnation, Partitions: tj.Partitions, RetentionMs: tj.RetentionMs,
		VisibilityTimeoutMs: tj.VisibilityTimeoutMs, MaxInFlightPerPartition: tj.MaxInFlightPerPartition,
		MaxAckedAheadPerPartition: tj.MaxAckedAheadPerPartition, ReplicationFactor: tj.ReplicationFactor,
		CreatedAt: tj.CreatedAt, Schema: tj.Schema, Parent: tj.Parent, FanoutDelayMs: tj.FanoutDelayMs,
		PartitionStats: make([]apigen.PartitionStats, len(parts)),
	}
	for i, p := range parts {
		s := p.Stats
		out.PartitionStats[i] = apigen.PartitionStats{
			Partition:     p.Index,
			OldestOffset:  int64(s.Oldest),
			NextOffset:    int64(s.End),
			HighWatermark: int64(s.End),
			AckFrontier:   int64(s.Frontier),
			AckedAhead:    int64(s.AckedAhead),
			InFlight:      int64(s.InFlight),
			Backlog:       int64(s.Backlog),
			Leader:        p.Leader,
			Replicas:      []string{p.Leader},
		}
	}
	return out, nil
}

func (h *handlers) AlterTopic(ctx context.Context, r apigen.AlterTopicRequestObject) (apigen.AlterTopicResponseObject, error) {
	a := broker.TopicAlter{
		RetentionMs:   r.Body.RetentionMs,
		VisibilityMs:  r.Body.VisibilityTimeoutMs,
		MaxInFlight:   r.Body.MaxInFlightPerPartition,
		MaxAckedAhead: r.Body.MaxAckedAheadPerPartition,
		Schema:        r.Body.Schema,
		Incarnation:   authorizedIncarnation(ctx),
	}
	t, err := h.b.AlterTopic(ctx, r.Topic, a)
	if err != nil {
		return nil, err
	}
	return apigen.AlterTopic200JSONResponse(topicJSON(t)), nil
}

func (h *handlers) DeleteTopic(ctx context.Context, r apigen.DeleteTopicRequestObject) (apigen.DeleteTopicResponseObject, error) {
	if err := h.b.DeleteTopic(ctx, r.Topic, authorizedIncarnation(ctx)); err != nil {
		return nil, err
	}
	return apigen.DeleteTopic204Response{}, nil
}

// payloadKind decides how a produced body is stored from its Content-Type, checking that
// it is what it claims to be.
func payloadKind(contentType string, body []byte) (uint16, error) {
	mt := ""
	if contentType != "" {
		var err error
		mt, _, err = mime.ParseMediaType(contentType)
		if err != nil {
			return 0, newErr(http.StatusBadRequest, "bad_request", "the Content-Type header is malformed: "+err.Error())
		}
	}
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		// JSON is UTF-8 (RFC 8259 §8.1); json.Valid alone lets invalid bytes inside
		// strings through, and serving them back verbatim would break every response
		// they are part of.
		if !json.Valid(body) || !utf8.Valid(body) {
			return 0, newErr(http.StatusBadRequest, "invalid_payload", "the body is not valid JSON but Content-Type says it is; fix the JSON or send application/octet-stream")
		}
		if jsondepth.Exceeds(body, MaxPayloadDepth) {
			return 0, tooDeep("")
		}
		return kindJSON, nil
	case strings.HasPrefix(mt, "text/"):
		if !utf8.Valid(body) {
			return 0, newErr(http.StatusBadRequest, "invalid_payload", "the body is not valid UTF-8 but Content-Type says text; send application/octet-stream for bytes")
		}
		return kindText, nil
	case mt == "application/octet-stream":
		return kindBinary, nil
	}
	// No or another content type (curl -d sends a form type): sniff.
	switch {
	case len(body) > 0 && json.Valid(body) && utf8.Valid(body):
		if jsondepth.Exceeds(body, MaxPayloadDepth) {
			return 0, tooDeep("")
		}
		return kindJSON, nil
	case utf8.Valid(body):
		return kindText, nil
	}
	return kindBinary, nil
}

func checkKey(key *string) ([]byte, error) {
	if key == nil {
		return nil, nil
	}
	if len(*key) > broker.MaxKeyBytes {
		return nil, badParam("key is " + strconv.Itoa(len(*key)) + " bytes; the limit is 1024")
	}
	if !utf8.ValidString(*key) {
		return nil, badParam("key is not valid UTF-8")
	}
	return []byte(*key), nil
}

func checkPartition(p *int32) (int32, error) {
	if p == nil {
		return -1, nil
	}
	if *p < 0 {
		return 0, badParam("partition must be 0 or more")
	}
	return *p, nil
}

func (h *handlers) Produce(ctx context.Context, r apigen.ProduceRequestObject) (apigen.ProduceResponseObject, error) {
	key, err := checkKey(r.Params.Key)
	if err != nil {
		return nil, err
	}
	part, err := checkPartition(r.Params.Partition)
	if err != nil {
		return nil, err
	}
	body, err := readPayload(r.Body)
	if err != nil {
		return nil, err
	}
	kind, err := payloadKind(r.ContentType, body)
	if err != nil {
		return nil, err
	}
	res, err := h.b.Produce(ctx, r.Topic, []broker.Outgoing{{Key: key, Partition: part, Value: body, Attrs: kind}})
	if err != nil {
		return nil, err
	}
	return apigen.Produce202JSONResponse{Topic: r.Topic, Partition: res[0].Partition, Offset: int64(res[0].Offset)}, nil
}

// base64Room is the bytes the base64 payloads of msgs decode to, at most.
func base64Room(msgs []apigen.OutgoingMessage) int {
	n := 0
	for i := range msgs {
		if msgs[i].PayloadEncoding != nil {
			n += base64.StdEncoding.DecodedLen(len(msgs[i].Payload))
		}
	}
	return n
}

// jsonStringBytes returns the characters of raw, a valid JSON value, when it is a
// string. A string without escapes (every base64 string a client library writes) is
// returned in place; only one with escapes is unquoted by encoding/json.
func jsonStringBytes(raw json.RawMessage) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return nil, false
	}
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}

// readPayload reads a produce body of at most MaxPayloadBytes.
func readPayload(r io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, MaxPayloadBytes+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, newErr(http.StatusBadRequest, "bad_request", "reading the body failed: "+err.Error())
	}
	if n > MaxPayloadBytes {
		return nil, tooLarge()
	}
	return buf.Bytes(), nil
}

// tooDeep refuses a JSON payload nested deeper than MaxPayloadDepth. Consumers decode
// JSON payloads, and recursive decoders give up on deep nesting (Python's json near
// 1,000 levels): a message none of them can decode could never be settled.
func tooDeep(at string) *apiError {
	return newErr(http.StatusBadRequest, "invalid_payload", at+"the JSON payload nests arrays and objects more than "+strconv.Itoa(MaxPayloadDepth)+" levels deep; flatten it, or send it as bytes (application/octet-stream, or payload_encoding base64)")
}

func tooLarge() *apiError {
	return newErr(http.StatusRequestEntityTooLarge, "payload_too_large", "a message is at most 1 MiB (1048576 bytes); split it or store it elsewhere and send a reference")
}

func (h *handlers) ProduceBatch(ctx context.Context, r apigen.ProduceBatchRequestObject) (apigen.ProduceBatchResponseObject, error) {
	msgs := r.Body.Messages
	if len(msgs) == 0 || len(msgs) > broker.MaxBatch {
		return nil, newErr(http.StatusBadRequest, "bad_request", "a batch holds 1 to 1000 messages, got "+strconv.Itoa(len(msgs)))
	}
	out := make([]broker.Outgoing, len(msgs))
	// One buffer holds every base64 payload's bytes: one allocation, not one each.
	var b64buf []byte
	if n := base64Room(msgs); n > 0 {
		b64buf = make([]byte, 0, n)
	}
	for i, m := range msgs {
		at := "message " + strconv.Itoa(i) + ": "
		key, err := checkKey(m.Key)
		if err != nil {
			return nil, badParam(at + err.(*apiError).msg)
		}
		part, err := checkPartition(m.Partition)
		if err != nil {
			return nil, badParam(at + err.(*apiError).msg)
		}
		if len(m.Payload) == 0 {
			return nil, newErr(http.StatusBadRequest, "invalid_json", at+"payload is required")
		}
		if !utf8.Valid(m.Payload) {
			return nil, newErr(http.StatusBadRequest, "invalid_payload", at+"payload holds invalid UTF-8; JSON text is UTF-8 (send bytes with payload_encoding base64)")
		}
		o := broker.Outgoing{Key: key, Partition: part, Value: m.Payload, Attrs: kindJSON}
		if m.PayloadEncoding == nil && jsondepth.Exceeds(m.Payload, MaxPayloadDepth) {
			return nil, tooDeep(at)
		}
		if m.PayloadEncoding != nil {
			if *m.PayloadEncoding != apigen.OutgoingMessagePayloadEncodingBase64 {
				return nil, newErr(http.StatusBadRequest, "invalid_json", at+"payload_encoding must be \"base64\"")
			}
			str, ok := jsonStringBytes(m.Payload)
			if !ok {
				return nil, newErr(http.StatusBadRequest, "invalid_payload", at+"with payload_encoding base64 the payload must be a base64 string")
			}
			start := len(b64buf)
			b64buf = slices.Grow(b64buf, base64.StdEncoding.DecodedLen(len(str)))
			n, err := base64.StdEncoding.Decode(b64buf[start:start+base64.StdEncoding.DecodedLen(len(str))], str)
			if err != nil {
				return nil, newErr(http.StatusBadRequest, "invalid_payload", at+"payload is not valid standard base64: "+err.Error())
			}
			b64buf = b64buf[:start+n]
			o.Value, o.Attrs = b64buf[start:start+n:start+n], kindBinary
		}
		if len(o.Value) > MaxPayloadBytes {
			return nil, newErr(http.StatusRequestEntityTooLarge, "payload_too_large", at+"a message is at most 1 MiB")
		}
		out[i] = o
	}
	res, err := h.b.Produce(ctx, r.Topic, out)
	if err != nil {
		return nil, err
	}
	resp := apigen.ProduceBatch202JSONResponse{Results: make([]apigen.Produced, len(res))}
	for i, p := range res {
		resp.Results[i] = apigen.Produced{Topic: r.Topic, Partition: p.Partition, Offset: int64(p.Offset)}
	}
	return resp, nil
}

// parseWait reads a wait parameter: a Go duration ("10s", "500ms") or whole seconds.
func parseWait(s *string) (time.Duration, error) {
	if s == nil || *s == "" {
		return 0, nil
	}
	d, err := parseDuration(*s, time.Second)
	if err != nil || d < 0 {
		return 0, badParam("wait must be a duration like 10s or 500ms, or whole seconds, from 0 to 20s")
	}
	if d > broker.MaxWait {
		return 0, badParam("wait is capped at 20s; poll again after it answers")
	}
	return d, nil
}

// parseDuration accepts a Go duration or a bare integer in unit.
func parseDuration(s string, unit time.Duration) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > int64(time.Duration(1<<62)/unit) || n < -int64(time.Duration(1<<62)/unit) {
			return 0, errors.New("out of range")
		}
		return time.Duration(n) * unit, nil
	}
	return time.ParseDuration(s)
}

// forceBase64 reads a payload_encoding parameter (each operation has its own generated
// string type for it).
func forceBase64[T ~string](p *T) (bool, error) {
	if p == nil {
		return false, nil
	}
	switch string(*p) {
	case "base64":
		return true, nil
	case "auto":
		return false, nil
	}
	return false, badParam("payload_encoding must be base64 or auto")
}

func (h *handlers) Consume(ctx context.Context, r apigen.ConsumeRequestObject) (apigen.ConsumeResponseObject, error) {
	wait, err := parseWait(r.Params.Wait)
	if err != nil {
		return nil, err
	}
	b64, err := forceBase64(r.Params.PayloadEncoding)
	if err != nil {
		return nil, err
	}
	if (r.Params.Partition == nil) != (r.Params.Offset == nil) {
		return nil, badParam("partition and offset go together: both read one message without a lease, neither takes one under a lease")
	}
	if r.Params.Partition != nil {
		if *r.Params.Partition < 0 || *r.Params.Offset < 0 {
			return nil, badParam("partition and offset must be 0 or more")
		}
		d, err := h.b.ReadOne(ctx, r.Topic, *r.Params.Partition, uint64(*r.Params.Offset))
		if err != nil {
			return nil, err
		}
		if d == nil {
			return apigen.Consume204Response{}, nil
		}
		return messageResponse{topic: r.Topic, d: d, forceBase64: b64}, nil
	}
	ds, err := h.b.Consume(ctx, r.Topic, 1, wait)
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return apigen.Consume204Response{}, nil
	}
	return messageResponse{topic: r.Topic, d: &ds[0], forceBase64: b64}, nil
}

func (h *handlers) ConsumeBatch(ctx context.Context, r apigen.ConsumeBatchRequestObject) (apigen.ConsumeBatchResponseObject, error) {
	wait, err := parseWait(r.Params.Wait)
	if err != nil {
		return nil, err
	}
	max := 10
	if r.Params.Max != nil {
		if *r.Params.Max < 1 || *r.Params.Max > broker.MaxBatch {
			return nil, badParam("max must be between 1 and 1000")
		}
		max = int(*r.Params.Max)
	}
	b64, err := forceBase64(r.Params.PayloadEncoding)
	if err != nil {
		return nil, err
	}
	ds, err := h.b.Consume(ctx, r.Topic, max, wait)
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return apigen.ConsumeBatch204Response{}, nil
	}
	return messageListResponse{topic: r.Topic, ds: ds, forceBase64: b64}, nil
}

// maxExtendChars is the spec's maxLength of extend, as a parameter and in ack-batch.
const maxExtendChars = 32

// parseExtend reads an ack's extend parameter.
func parseExtend(s *string) (broker.AckMode, time.Duration, error) {
	if s == nil {
		return broker.Settle, 0, nil
	}
	if utf8.RuneCountInString(*s) > maxExtendChars {
		return 0, 0, badParam("extend is at most " + strconv.Itoa(maxExtendChars) + " characters: true, 0 or a duration like 45s")
	}
	switch *s {
	case "true":
		return broker.Renew, 0, nil
	case "false":
		return broker.Settle, 0, nil
	}
	d, err := parseDuration(*s, time.Millisecond)
	if err != nil || d < 0 {
		return 0, 0, badParam("extend must be true, 0 (hand back now) or a duration like 45s, 500ms or milliseconds")
	}
	if d > broker.MaxVisibility {
		return 0, 0, badParam("extend is capped at 12h")
	}
	return broker.ExtendBy, d, nil
}

func (h *handlers) Ack(ctx context.Context, r apigen.AckRequestObject) (apigen.AckResponseObject, error) {
	mode, d, err := parseExtend(r.Params.Extend)
	if err != nil {
		return nil, err
	}
	if r.Params.ReceiptHandle == "" {
		return nil, badParam("receipt_handle is required")
	}
	errs := h.b.Ack(ctx, r.Topic, []broker.AckReq{{Handle: r.Params.ReceiptHandle, Mode: mode, Delay: d}})
	if errs[0] != nil {
		return nil, errs[0]
	}
	return apigen.Ack204Response{}, nil
}

func (h *handlers) AckBatch(ctx context.Context, r apigen.AckBatchRequestObject) (apigen.AckBatchResponseObject, error) {
	acks := r.Body.Acks
	if len(acks) == 0 || len(acks) > broker.MaxBatch {
		return nil, newErr(http.StatusBadRequest, "bad_request", "an ack batch holds 1 to 1000 entries, got "+strconv.Itoa(len(acks)))
	}
	// A batch for a topic that does not exist fails whole, like every other topic route.
	if err := h.b.Exists(r.Topic); err != nil {
		return nil, err
	}
	res := make([]apigen.AckResult, len(acks))
	reqs := make([]broker.AckReq, 0, len(acks))
	idx := make([]int, 0, len(acks))
	for i, a := range acks {
		res[i].ReceiptHandle = a.ReceiptHandle
		mode, d, err := parseExtend(a.Extend)
		if err == nil && a.ReceiptHandle == "" {
			err = badParam("receipt_handle is required")
		}
		if err != nil {
			setAckResult(&res[i], err)
			continue
		}
		reqs = append(reqs, broker.AckReq{Handle: a.ReceiptHandle, Mode: mode, Delay: d})
		idx = append(idx, i)
	}
	if len(reqs) > 0 {
		errs := h.b.Ack(ctx, r.Topic, reqs)
		for j, err := range errs {
			setAckResult(&res[idx[j]], err)
		}
	}
	return apigen.AckBatch200JSONResponse{Results: res}, nil
}

func setAckResult(r *apigen.AckResult, err error) {
	if err == nil {
		r.Status = http.StatusNoContent
		return
	}
	ae := toAPIError(err)
	r.Status = int32(ae.status)
	r.Error = &struct {
		Code    apigen.ErrorCode `json:"code"`
		Message string           `json:"message"`
	}{Code: apigen.ErrorCode(ae.code), Message: ae.msg}
}

// parseTime reads RFC 3339 or Unix milliseconds.
func parseTime(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}

func (h *handlers) ReadMessages(ctx context.Context, r apigen.ReadMessagesRequestObject) (apigen.ReadMessagesResponseObject, error) {
	if r.Partition < 0 {
		return nil, badParam("partition must be 0 or more")
	}
	max := 100
	if r.Params.Max != nil {
		if *r.Params.Max < 1 || *r.Params.Max > broker.MaxBatch {
			return nil, badParam("max must be between 1 and 1000")
		}
		max = int(*r.Params.Max)
	}
	var from *uint64
	if r.Params.From != nil {
		if *r.Params.From < 0 {
			return nil, badParam("from must be 0 or more")
		}
		f := uint64(*r.Params.From)
		from = &f
	}
	var fromTime *int64
	if r.Params.FromTime != nil {
		ms, err := parseTime(*r.Params.FromTime)
		if err != nil {
			return nil, badParam("from_time must be an RFC 3339 time (2026-01-02T15:04:05Z) or Unix milliseconds")
		}
		fromTime = &ms
	}
	b64, err := forceBase64(r.Params.PayloadEncoding)
	if err != nil {
		return nil, err
	}
	ds, next, err := h.b.Read(ctx, r.Topic, r.Partition, from, fromTime, max)
	if err != nil {
		return nil, err
	}
	return messageListResponse{topic: r.Topic, ds: ds, forceBase64: b64, next: &next}, nil
}
