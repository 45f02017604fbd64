package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/jsonstr"
)

// Payload kinds, stored in a record's attrs so a consumer sees the payload as it was
// sent: JSON verbatim, text as a JSON string, anything else as base64.
const (
	kindBinary = broker.PayloadKindBinary
	kindJSON   = broker.PayloadKindJSON
	kindText   = broker.PayloadKindText
	kindMask   = broker.PayloadKindMask
)

// appendMessage appends one message object.
func appendMessage(b []byte, topic string, d *broker.Delivered, forceBase64 bool) []byte {
	b = append(b, `{"topic":`...)
	b = jsonstr.Append(b, topic)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(d.Partition), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendUint(b, d.Offset, 10)
	b = append(b, `,"key":`...)
	if d.Key == nil {
		b = append(b, "null"...)
	} else {
		b = jsonstr.Append(b, string(d.Key))
	}
	b = append(b, `,"payload":`...)
	kind := d.Attrs & kindMask
	switch {
	case forceBase64 || kind == kindBinary:
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, d.Value)
		b = append(b, `","payload_encoding":"base64"`...)
	case kind == kindJSON:
		b = append(b, d.Value...)
	default:
		b = jsonstr.Append(b, string(d.Value))
	}
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, d.Timestamp, 10)
	if d.Handle != "" {
		b = append(b, `,"receipt_handle":"`...)
		b = append(b, d.Handle...) // URL-safe base64: nothing to escape
		b = append(b, `","delivery_attempt":`...)
		b = strconv.AppendUint(b, uint64(d.Attempt), 10)
	}
	return append(b, '}')
}

// messagesSize is the room appendMessage needs for ds: exact for the payload as
// stored or in base64, and enough for the members around it unless the key or a text
// payload needs escapes (the buffer then grows). A short guess made the buffer of a
// consume-batch of base64 payloads grow and copy once per answer.
func messagesSize(topic string, ds []broker.Delivered, forceBase64 bool) int {
	n := 32
	for i := range ds {
		n += 192 + len(topic) + len(ds[i].Key) + len(ds[i].Handle)
		switch kind := ds[i].Attrs & kindMask; {
		case forceBase64 || kind == kindBinary:
			n += base64.StdEncoding.EncodedLen(len(ds[i].Value))
		case kind == kindJSON:
			n += len(ds[i].Value)
		default:
			n += len(ds[i].Value) + len(ds[i].Value)/8
		}
	}
	return n
}

// messageResponse writes one consumed message; it serves Consume's 200.
type messageResponse struct {
	topic       string
	d           *broker.Delivered
	forceBase64 bool
}

func (m messageResponse) VisitConsumeResponse(w http.ResponseWriter) error {
	b := make([]byte, 0, messagesSize(m.topic, []broker.Delivered{*m.d}, m.forceBase64))
	b = appendMessage(b, m.topic, m.d, m.forceBase64)
	return writeJSON(w, http.StatusOK, append(b, '\n'))
}

// messageListResponse writes {"messages":[...]} (and next_offset for replay).
type messageListResponse struct {
	topic       string
	ds          []broker.Delivered
	forceBase64 bool
	next        *uint64
	// incarnation (when not 0) and damaged are a replay's: the topic incarnation read,
	// and the offsets of the damaged messages the read went past.
	incarnation uint64
	damaged     []uint64
}

func (m messageListResponse) bytes() []byte {
	b := make([]byte, 0, messagesSize(m.topic, m.ds, m.forceBase64))
	b = append(b, `{"messages":[`...)
	for i := range m.ds {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendMessage(b, m.topic, &m.ds[i], m.forceBase64)
	}
	b = append(b, ']')
	if m.next != nil {
		b = append(b, `,"next_offset":`...)
		b = strconv.AppendUint(b, *m.next, 10)
	}
	if m.incarnation != 0 {
		b = append(b, `,"incarnation":"`...)
		b = strconv.AppendUint(b, m.incarnation, 10)
		b = append(b, '"')
	}
	if len(m.damaged) > 0 {
		b = append(b, `,"damaged":[`...)
		for i, o := range m.damaged {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, o, 10)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

func (m messageListResponse) VisitConsumeBatchResponse(w http.ResponseWriter) error {
	return writeJSON(w, http.StatusOK, m.bytes())
}

func (m messageListResponse) VisitReadMessagesResponse(w http.ResponseWriter) error {
	return writeJSON(w, http.StatusOK, m.bytes())
}

func writeJSON(w http.ResponseWriter, status int, body []byte) error {
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// producedResponse writes produce's 202, and producedListResponse produce-batch's: the
// generated types' members in their order, built without reflection (encoding/json
// was 3 to 4 % of a batched flow's CPU on these two answers and ack-batch's).
type producedResponse struct {
	topic string
	p     broker.Produced
}

func (r producedResponse) VisitProduceResponse(w http.ResponseWriter) error {
	b := appendProduced(make([]byte, 0, 64+len(r.topic)), r.topic, r.p)
	return writeJSON(w, http.StatusAccepted, append(b, '\n'))
}

type producedListResponse struct {
	topic string
	res   []broker.Produced
}

func (r producedListResponse) VisitProduceBatchResponse(w http.ResponseWriter) error {
	b := make([]byte, 0, 16+len(r.res)*(56+len(r.topic)))
	b = append(b, `{"results":[`...)
	for i := range r.res {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendProduced(b, r.topic, r.res[i])
	}
	return writeJSON(w, http.StatusAccepted, append(b, "]}\n"...))
}

func appendProduced(b []byte, topic string, p broker.Produced) []byte {
	b = append(b, `{"offset":`...)
	b = strconv.AppendUint(b, p.Offset, 10)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(p.Partition), 10)
	b = append(b, `,"topic":`...)
	b = jsonstr.Append(b, topic)
	return append(b, '}')
}

// ackResultsResponse writes ack-batch's 200.
type ackResultsResponse []apigen.AckResult

func (r ackResultsResponse) VisitAckBatchResponse(w http.ResponseWriter) error {
	n := 16
	for i := range r {
		n += 40 + len(r[i].ReceiptHandle)
		if r[i].Error != nil {
			n += 32 + len(r[i].Error.Code) + len(r[i].Error.Message)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, `{"results":[`...)
	for i := range r {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		if e := r[i].Error; e != nil {
			b = append(b, `"error":{"code":`...)
			b = jsonstr.Append(b, string(e.Code))
			b = append(b, `,"message":`...)
			b = jsonstr.Append(b, e.Message)
			b = append(b, `},`...)
		}
		b = append(b, `"receipt_handle":`...)
		b = jsonstr.Append(b, r[i].ReceiptHandle)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(r[i].Status), 10)
		b = append(b, '}')
	}
	return writeJSON(w, http.StatusOK, append(b, "]}\n"...))
}
