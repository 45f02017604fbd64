package httpapi

import (
	"bytes"
	"io"
	"strconv"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// strictDecode reads any batch body, but by reflection: it walks the generated types
// member by member, looking each type's decoder up on every value, and copies every
// payload (15 % of a node's CPU in the batched flow). For the shapes clients send
// (every member a known one, strings, integers, a payload of any JSON value)
// fastProduceBatch and fastAckBatch read the tokens straight into the generated types.
// Each is a fast path only: on anything it does not handle (a null, an unknown or
// repeated member, an origin, a number that is not a plain integer, invalid UTF-8, a
// syntax error) it gives up and the caller decodes with strictDecode, whose answer,
// error message included, is the reference. So the fast path never accepts what
// strictDecode refuses, never refuses anything, and where it accepts it must read
// exactly what strictDecode reads: FuzzFastBatchDecode holds it to that.

// batchDecoder is a pooled token reader over one body.
type batchDecoder struct {
	dec jsontext.Decoder
	buf bytes.Buffer
}

var batchDecoders = sync.Pool{New: func() any { return new(batchDecoder) }}

func getBatchDecoder(data []byte) *batchDecoder {
	bd := batchDecoders.Get().(*batchDecoder)
	bd.buf = *bytes.NewBuffer(data)
	// Reading from a bytes.Buffer, the decoder parses data in place: InputOffset is an
	// offset into data.
	bd.dec.Reset(&bd.buf)
	return bd
}

func (bd *batchDecoder) release() {
	bd.buf = bytes.Buffer{}
	bd.dec.Reset(&bd.buf) // drop the reference to the body
	batchDecoders.Put(bd)
}

// decodeBatch decodes a batch body by fast, or by strictDecode when fast gives up.
func decodeBatch[T any](data []byte, fast func([]byte) (*T, bool)) (*T, error) {
	if req, ok := fast(data); ok {
		return req, nil
	}
	req := new(T)
	if err := strictDecode(data, req); err != nil {
		return nil, err
	}
	return req, nil
}

// name reads an object member's name and returns it unquoted, false when the name
// holds an escape (the reference then compares it) or cannot be read.
func (bd *batchDecoder) name() ([]byte, bool) {
	if bd.dec.PeekKind() != '"' {
		return nil, false
	}
	v, err := bd.dec.ReadValue()
	if err != nil || bytes.IndexByte(v, '\\') >= 0 {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// delim reads the token k ('{', '}', '[' or ']').
func (bd *batchDecoder) delim(k jsontext.Kind) bool {
	if bd.dec.PeekKind() != k {
		return false
	}
	_, err := bd.dec.ReadToken()
	return err == nil
}

// str reads a string value.
func (bd *batchDecoder) str() (string, bool) {
	if bd.dec.PeekKind() != '"' {
		return "", false
	}
	t, err := bd.dec.ReadToken()
	if err != nil {
		return "", false
	}
	return t.String(), true
}

// integer reads a number written as a plain integer that fits in bits.
func (bd *batchDecoder) integer(bits int) (int64, bool) {
	if bd.dec.PeekKind() != '0' {
		return 0, false
	}
	v, err := bd.dec.ReadValue()
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v), 10, bits)
	return n, err == nil
}

// end reports whether the body ends after its one value.
func (bd *batchDecoder) end() bool {
	_, err := bd.dec.ReadToken()
	return err == io.EOF
}

// fastProduceBatch decodes a produce-batch body of the common shape; false: decode it
// with strictDecode instead. The plainest bodies need no token reader
// (plainProduceBatch).
func fastProduceBatch(data []byte) (*apigen.ProduceBatchRequest, bool) {
	if req, ok := plainProduceBatch(data); ok {
		return req, true
	}
	return tokenProduceBatch(data)
}

// tokenProduceBatch is fastProduceBatch's token reader.
func tokenProduceBatch(data []byte) (*apigen.ProduceBatchRequest, bool) {
	bd := getBatchDecoder(data)
	defer bd.release()
	req := &apigen.ProduceBatchRequest{}
	if !bd.delim('{') {
		return nil, false
	}
	seen := false
	for bd.dec.PeekKind() != '}' {
		n, ok := bd.name()
		switch {
		case !ok:
			return nil, false
		case string(n) == "incarnation" && req.Incarnation == nil:
			s, ok := bd.str()
			if !ok {
				return nil, false
			}
			req.Incarnation = &s
			continue
		case seen || string(n) != "messages": // validate_only and unknown members
			return nil, false
		}
		seen = true
		if !bd.delim('[') {
			return nil, false // null, or not an array: the reference decides
		}
		req.Messages = make([]apigen.OutgoingMessage, 0, 16)
		for bd.dec.PeekKind() != ']' {
			m, ok := bd.outgoing(data)
			if !ok {
				return nil, false
			}
			req.Messages = append(req.Messages, m)
		}
		if !bd.delim(']') {
			return nil, false
		}
	}
	if !bd.delim('}') || !bd.end() {
		return nil, false
	}
	return req, true
}

// outgoing reads one message object of a produce batch.
func (bd *batchDecoder) outgoing(data []byte) (apigen.OutgoingMessage, bool) {
	var m apigen.OutgoingMessage
	if !bd.delim('{') {
		return m, false
	}
	for bd.dec.PeekKind() != '}' {
		n, ok := bd.name()
		if !ok {
			return m, false
		}
		switch string(n) {
		case "payload":
			if k := bd.dec.PeekKind(); k == 'n' || k == 0 {
				return m, false // a null payload: the reference decides what it reads
			}
			v, err := bd.dec.ReadValue()
			if err != nil {
				return m, false
			}
			// The value's exact bytes, in place in the body (which the request owns
			// and nothing writes to): no copy.
			end := int(bd.dec.InputOffset())
			start := end - len(v)
			if start < 0 || end > len(data) || data[start] != v[0] {
				return m, false
			}
			m.Payload = data[start:end:end]
		case "payload_encoding":
			if bd.dec.PeekKind() != '"' {
				return m, false
			}
			v, err := bd.dec.ReadValue()
			if err != nil {
				return m, false
			}
			switch string(v) {
			case `"base64"`:
				m.PayloadEncoding = &encodingBase64
			case `"text"`:
				m.PayloadEncoding = &encodingText
			default: // the handler refuses it; the reference decodes it
				return m, false
			}
		case "key":
			s, ok := bd.str()
			if !ok {
				return m, false
			}
			m.Key = &s
		case "partition":
			v, ok := bd.integer(32)
			if !ok {
				return m, false
			}
			p := int32(v)
			m.Partition = &p
		case "timestamp":
			v, ok := bd.integer(64)
			if !ok {
				return m, false
			}
			m.Timestamp = &v
		default: // origin (remote children's copies) and unknown members
			return m, false
		}
	}
	return m, bd.delim('}')
}

// encodingBase64 and encodingText are the values every decoded payload_encoding
// member points to: one allocation a message fewer. Nothing writes through a decoded
// request's pointers (the handlers only read the body).
var (
	encodingBase64 = apigen.OutgoingMessagePayloadEncodingBase64
	encodingText   = apigen.OutgoingMessagePayloadEncodingText
)

// fastAckBatch decodes an ack-batch body of the common shape; false: decode it with
// strictDecode instead.
func fastAckBatch(data []byte) (*apigen.AckBatchRequest, bool) {
	bd := getBatchDecoder(data)
	defer bd.release()
	req := &apigen.AckBatchRequest{}
	if !bd.delim('{') {
		return nil, false
	}
	seen := false
	for bd.dec.PeekKind() != '}' {
		if n, ok := bd.name(); !ok || seen || string(n) != "acks" {
			return nil, false
		}
		seen = true
		if !bd.delim('[') {
			return nil, false
		}
		req.Acks = make([]apigen.AckEntry, 0, 16)
		for bd.dec.PeekKind() != ']' {
			var a apigen.AckEntry
			if !bd.delim('{') {
				return nil, false
			}
			for bd.dec.PeekKind() != '}' {
				n, ok := bd.name()
				if !ok {
					return nil, false
				}
				switch string(n) {
				case "receipt_handle":
					if a.ReceiptHandle, ok = bd.str(); !ok {
						return nil, false
					}
				case "extend":
					s, ok := bd.str()
					if !ok {
						return nil, false
					}
					a.Extend = &s
				default:
					return nil, false
				}
			}
			if !bd.delim('}') {
				return nil, false
			}
			req.Acks = append(req.Acks, a)
		}
		if !bd.delim(']') {
			return nil, false
		}
	}
	if !bd.delim('}') || !bd.end() {
		return nil, false
	}
	return req, true
}
