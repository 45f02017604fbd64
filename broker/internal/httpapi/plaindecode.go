package httpapi

import (
	"encoding/binary"
	"strconv"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// plainProduceBatch reads the produce-batch bodies the SDKs and the load generator
// send: an object with only "messages", each message an object of "payload" (a
// string), "payload_encoding", "key", "partition" and "timestamp" (digits alone),
// every string plain ASCII with no escape.
// Such a body is scanned byte by byte without a tokenizer: the token reader
// (fastProduceBatch) checked each payload's characters one at a time, 7 % of a
// node's CPU in the batched flow. On anything else (another member, a payload that
// is not a string, an escape, a byte outside printable ASCII, a repeated member, a
// syntax error) it gives up, and fastProduceBatch (then strictDecode) reads the body:
// it accepts a subset of what they accept and reads it as they do
// (FuzzFastBatchDecode holds it to strictDecode).
func plainProduceBatch(data []byte) (*apigen.ProduceBatchRequest, bool) {
	s := plainScanner{data: data}
	if !s.byte('{') || !s.name("messages") || !s.byte('[') {
		return nil, false
	}
	req := &apigen.ProduceBatchRequest{}
	if s.byte(']') {
		req.Messages = make([]apigen.OutgoingMessage, 0, 16)
	} else {
		for {
			start := s.i
			m, ok := s.message()
			if !ok {
				return nil, false
			}
			if req.Messages == nil {
				// Room for as many messages as the first one's size leaves space for
				// (the messages of a batch are most often alike; grown by doubling
				// from 16, a batch of 100 was copied three times), never more than a
				// batch may hold: a small first message must not make a large body
				// allocate many times its size.
				req.Messages = make([]apigen.OutgoingMessage, 0, min(1+(len(data)-s.i)/(s.i-start), broker.MaxBatch))
			}
			req.Messages = append(req.Messages, m)
			if s.byte(']') {
				break
			}
			if !s.byte(',') {
				return nil, false
			}
		}
	}
	if !s.byte('}') {
		return nil, false
	}
	s.space()
	return req, s.i == len(data)
}

// plainScanner is a position in a body being read by plainProduceBatch.
type plainScanner struct {
	data []byte
	i    int
}

// space skips JSON whitespace.
func (s *plainScanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte skips whitespace and then c, reporting whether c was there (nothing is
// skipped past the whitespace when it was not).
func (s *plainScanner) byte(c byte) bool {
	s.space()
	if s.i < len(s.data) && s.data[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a plain string (see plainStringEnd) and returns it with its quotes.
func (s *plainScanner) str() ([]byte, bool) {
	s.space()
	end := plainStringEnd(s.data, s.i)
	if end < 0 {
		return nil, false
	}
	v := s.data[s.i : end+1 : end+1]
	s.i = end + 1
	return v, true
}

// name reads the member name n and the colon after it.
func (s *plainScanner) name(n string) bool {
	v, ok := s.str()
	return ok && string(v[1:len(v)-1]) == n && s.byte(':')
}

// integer reads a number written as digits alone (no sign, fraction or exponent, no
// leading zero) that fits in bits.
func (s *plainScanner) integer(bits int) (int64, bool) {
	s.space()
	start := s.i
	for s.i < len(s.data) && s.data[s.i] >= '0' && s.data[s.i] <= '9' {
		s.i++
	}
	digits := s.data[start:s.i]
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseInt(string(digits), 10, bits)
	return n, err == nil
}

// message reads one message object.
func (s *plainScanner) message() (apigen.OutgoingMessage, bool) {
	var m apigen.OutgoingMessage
	if !s.byte('{') {
		return m, false
	}
	if s.byte('}') {
		return m, true // no payload: the handler refuses it as the others would read it
	}
	const payload, encoding, key, partition, timestamp = 1, 2, 4, 8, 16
	var seen int
	for {
		n, ok := s.str()
		if !ok || !s.byte(':') {
			return m, false
		}
		var member int
		switch string(n) {
		case `"payload"`:
			member = payload
			if m.Payload, ok = s.str(); !ok {
				return m, false // any other JSON value: the token reader reads those
			}
		case `"payload_encoding"`:
			member = encoding
			v, ok := s.str()
			switch {
			case !ok:
				return m, false
			case string(v) == `"base64"`:
				m.PayloadEncoding = &encodingBase64
			case string(v) == `"text"`:
				m.PayloadEncoding = &encodingText
			default:
				return m, false
			}
		case `"key"`:
			member = key
			v, ok := s.str()
			if !ok {
				return m, false
			}
			k := string(v[1 : len(v)-1])
			m.Key = &k
		case `"partition"`:
			member = partition
			v, ok := s.integer(32)
			if !ok {
				return m, false
			}
			p := int32(v)
			m.Partition = &p
		case `"timestamp"`:
			member = timestamp
			v, ok := s.integer(64)
			if !ok {
				return m, false
			}
			m.Timestamp = &v
		default:
			return m, false
		}
		if seen&member != 0 {
			return m, false // a repeated member: the reference refuses it
		}
		seen |= member
		if s.byte('}') {
			return m, true
		}
		if !s.byte(',') {
			return m, false
		}
	}
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plainStringEnd returns the index of the closing quote of the string whose opening
// quote is data[i], when every byte between them is printable ASCII (0x20 to 0x7f)
// other than a backslash: such a string is valid JSON and reads as its bytes. It
// returns -1 for anything else (no quote at i, an escape, a control or non-ASCII
// byte, no closing quote). Eight bytes are looked at a time.
func plainStringEnd(data []byte, i int) int {
	if i >= len(data) || data[i] != '"' {
		return -1
	}
	j := i + 1
	for ; j+8 <= len(data); j += 8 {
		if plainWordStops(binary.LittleEndian.Uint64(data[j:])) {
			break
		}
	}
	for ; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return j
		case c < 0x20 || c >= 0x80 || c == '\\':
			return -1
		}
	}
	return -1
}

// plainWordStops reports whether the eight bytes of x may hold a quote, a backslash,
// a control byte or a non-ASCII one. It never misses one: a byte under 0x20 borrows
// when 0x20 is taken from it and so does a zero (a quote or backslash xored with
// itself) when 1 is, which sets its high bit, as a non-ASCII byte has it set. It may
// also stop on a word with none, after a borrow from such a byte below: the bytewise
// loop then decides.
func plainWordStops(x uint64) bool {
	below := x - 0x20*ones          // a byte under 0x20 borrows
	quote := (x ^ '"'*ones) - ones  // a quote, zero once xored, borrows
	slash := (x ^ '\\'*ones) - ones // so does a backslash
	return (below|quote|slash|x)&highs != 0
}
