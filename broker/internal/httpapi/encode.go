package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// Payload kinds, stored in a record's attrs so a consumer sees the payload as it was
// sent: JSON verbatim, text as a JSON string, anything else as base64.
const (
	kindBinary = broker.PayloadKindBinary
	kindJSON   = broker.PayloadKindJSON
	kindText   = broker.PayloadKindText
	kindMask   = broker.PayloadKindMask
)

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. s must be valid UTF-8 (callers check);
// invalid bytes are replaced with U+FFFD rather than producing invalid JSON.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendMessage appends one message object.
func appendMessage(b []byte, topic string, d *broker.Delivered, forceBase64 bool) []byte {
	b = append(b, `{"topic":`...)
	b = appendString(b, topic)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(d.Partition), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendUint(b, d.Offset, 10)
	b = append(b, `,"key":`...)
	if d.Key == nil {
		b = append(b, "null"...)
	} else {
		b = appendString(b, string(d.Key))
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
		b = appendString(b, string(d.Value))
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

func messagesSize(ds []broker.Delivered) int {
	n := 32
	for i := range ds {
		n += 160 + len(ds[i].Key) + len(ds[i].Value)*4/3 + len(ds[i].Handle)
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
	b := make([]byte, 0, messagesSize([]broker.Delivered{*m.d}))
	b = appendMessage(b, m.topic, m.d, m.forceBase64)
	return writeJSON(w, http.StatusOK, append(b, '\n'))
}

// messageListResponse writes {"messages":[...]} (and next_offset for replay).
type messageListResponse struct {
	topic       string
	ds          []broker.Delivered
	forceBase64 bool
	next        *uint64
}

func (m messageListResponse) bytes() []byte {
	b := make([]byte, 0, messagesSize(m.ds))
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
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}
