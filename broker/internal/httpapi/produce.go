package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/jsondepth"
)

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
	return producedResponse{topic: r.Topic, p: res[0]}, nil
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

// payloadBody is a produce body read whole before the handler runs (prepareBody).
type payloadBody struct {
	data []byte
	off  int
}

func (b *payloadBody) Read(p []byte) (int, error) {
	if b.off >= len(b.data) {
		return 0, io.EOF
	}
	n := copy(p, b.data[b.off:])
	b.off += n
	return n, nil
}

func (b *payloadBody) Close() error { return nil }

// readPayload reads a produce body of at most MaxPayloadBytes: the one prepareBody
// read, or else all of r.
func readPayload(r io.Reader) ([]byte, error) {
	if pb, ok := r.(*payloadBody); ok && pb.off == 0 {
		pb.off = len(pb.data)
		return pb.data, nil
	}
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, MaxPayloadBytes+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "reading the body failed: "+err.Error())
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
	return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, at+"the JSON payload nests arrays and objects more than "+strconv.Itoa(MaxPayloadDepth)+" levels deep; flatten it, or send it as bytes (application/octet-stream, or payload_encoding base64)")
}

// payloadLimit is MaxPayloadBytes as messages write it: "1 MiB (1048576 bytes)".
var payloadLimit = strconv.Itoa(MaxPayloadBytes>>20) + " MiB (" + strconv.Itoa(MaxPayloadBytes) + " bytes)"

func tooLarge() *apiError {
	return newErr(http.StatusRequestEntityTooLarge, apigen.ErrorCodePayloadTooLarge, "a message is at most "+payloadLimit+"; split it or store it elsewhere and send a reference")
}

func (h *handlers) ProduceBatch(ctx context.Context, r apigen.ProduceBatchRequestObject) (apigen.ProduceBatchResponseObject, error) {
	msgs := r.Body.Messages
	if len(msgs) == 0 || len(msgs) > broker.MaxBatch {
		return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "a batch holds 1 to "+strconv.Itoa(broker.MaxBatch)+" messages, got "+strconv.Itoa(len(msgs)))
	}
	chk, err := produceCheck(r.Body)
	if err != nil {
		return nil, err
	}
	if chk.ValidateOnly {
		// The payloads are not checked, but the body must still be one the spec
		// allows: every message has a payload, and a key, timestamp or origin given is
		// well formed, as a batch that stores them needs.
		for i, m := range msgs {
			at := "message " + strconv.Itoa(i) + ": "
			if len(m.Payload) == 0 {
				return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, at+"payload is required")
			}
			if _, err := checkKey(m.Key); err != nil {
				return nil, badParam(at + err.(*apiError).msg)
			}
			if _, err := checkPartition(m.Partition); err != nil {
				return nil, badParam(at + err.(*apiError).msg)
			}
			if err := copyFields(&broker.Outgoing{}, m, at); err != nil {
				return nil, err
			}
		}
		if _, err := h.b.ProduceChecked(ctx, r.Topic, chk, nil); err != nil {
			return nil, err
		}
		return apigen.ProduceBatch202JSONResponse{Results: []apigen.Produced{}}, nil
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
			return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, at+"payload is required")
		}
		if !utf8.Valid(m.Payload) {
			return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, at+"payload holds invalid UTF-8; JSON text is UTF-8 (send bytes with payload_encoding base64)")
		}
		o := broker.Outgoing{Key: key, Partition: part, Value: m.Payload, Attrs: kindJSON}
		if m.PayloadEncoding == nil && jsondepth.Exceeds(m.Payload, MaxPayloadDepth) {
			return nil, tooDeep(at)
		}
		if err := copyFields(&o, m, at); err != nil {
			return nil, err
		}
		if m.PayloadEncoding != nil && *m.PayloadEncoding == apigen.OutgoingMessagePayloadEncodingText {
			str, ok := jsonStringBytes(m.Payload)
			if !ok {
				return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, at+"with payload_encoding text the payload must be a JSON string")
			}
			o.Value, o.Attrs = str, o.Attrs&^broker.PayloadKindMask|broker.PayloadKindText
		} else if m.PayloadEncoding != nil {
			if *m.PayloadEncoding != apigen.OutgoingMessagePayloadEncodingBase64 {
				return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, at+"payload_encoding must be \"base64\" or \"text\"")
			}
			str, ok := jsonStringBytes(m.Payload)
			if !ok {
				return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, at+"with payload_encoding base64 the payload must be a base64 string")
			}
			start := len(b64buf)
			b64buf = slices.Grow(b64buf, base64.StdEncoding.DecodedLen(len(str)))
			n, err := base64.StdEncoding.Decode(b64buf[start:start+base64.StdEncoding.DecodedLen(len(str))], str)
			if err != nil {
				return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, at+"payload is not valid standard base64: "+err.Error())
			}
			b64buf = b64buf[:start+n]
			o.Value, o.Attrs = b64buf[start:start+n:start+n], o.Attrs&^broker.PayloadKindMask|kindBinary
		}
		if len(o.Value) > MaxPayloadBytes {
			return nil, newErr(http.StatusRequestEntityTooLarge, apigen.ErrorCodePayloadTooLarge, at+"a message is at most "+strconv.Itoa(MaxPayloadBytes>>20)+" MiB")
		}
		out[i] = o
	}
	res, err := h.produce(ctx, r.Topic, chk, out)
	if err != nil {
		return nil, err
	}
	return producedListResponse{topic: r.Topic, res: res}, nil
}
