package raftnet

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// rpcType is the first byte of a single-RPC request: which raft RPC it carries.
type rpcType byte

const (
	rpcAppendEntries  rpcType = 1
	rpcRequestVote    rpcType = 2
	rpcTimeoutNow     rpcType = 3
	rpcRequestPreVote rpcType = 4
)

// mh is raft's own encoding (msgpack, as NetworkTransport uses), so entries, headers
// and configurations cross the wire the way the library expects to decode them.
var mh = &codec.MsgpackHandle{}

func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := codec.NewEncoder(&buf, mh).Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decode(b []byte, v any) error {
	return codec.NewDecoderBytes(b, mh).Decode(v)
}

// appendGroup appends a group id: one length byte, then the id.
func appendGroup(dst []byte, group string) []byte {
	dst = append(dst, byte(len(group)))
	return append(dst, group...)
}

// readGroup reads a group id written by appendGroup and returns the rest.
func readGroup(b []byte) (string, []byte, error) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", nil, fmt.Errorf("%w: truncated group id", ErrBadMessage)
	}
	n := int(b[0])
	return string(b[1 : 1+n]), b[1+n:], nil
}

// A batch carries the empty AppendEntries of many groups to one peer:
//
//	u32 count, then per item: u8 group length, group, u32 body length, msgpack body
//
// Its answer, in the same order: u8 status (0 ok, 1 error), u32 length, then the
// msgpack AppendEntriesResponse or the error's text.
type batchItem struct {
	group string
	req   *raft.AppendEntriesRequest
	resp  *raft.AppendEntriesResponse
	err   error
	done  chan struct{}
}

func encodeBatch(items []*batchItem) ([]byte, error) {
	out := binary.BigEndian.AppendUint32(nil, uint32(len(items)))
	for _, it := range items {
		body, err := encode(it.req)
		if err != nil {
			return nil, err
		}
		out = appendGroup(out, it.group)
		out = binary.BigEndian.AppendUint32(out, uint32(len(body)))
		out = append(out, body...)
	}
	return out, nil
}

// decodedItem is one request of a received batch.
type decodedItem struct {
	group string
	req   raft.AppendEntriesRequest
}

func decodeBatch(b []byte) ([]decodedItem, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: batch without a count", ErrBadMessage)
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if n > uint32(len(b)) { // every item takes at least one byte
		return nil, fmt.Errorf("%w: batch claims %d items in %d bytes", ErrBadMessage, n, len(b))
	}
	items := make([]decodedItem, n)
	for i := range items {
		g, rest, err := readGroup(b)
		if err != nil {
			return nil, err
		}
		if len(rest) < 4 || uint32(len(rest)-4) < binary.BigEndian.Uint32(rest) {
			return nil, fmt.Errorf("%w: truncated batch item", ErrBadMessage)
		}
		l := binary.BigEndian.Uint32(rest)
		items[i].group = g
		if err := decode(rest[4:4+l], &items[i].req); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
		b = rest[4+l:]
	}
	return items, nil
}

// batchAnswer is one answer of a batch: a response or an error.
type batchAnswer struct {
	resp *raft.AppendEntriesResponse
	err  error
}

func encodeAnswers(ans []batchAnswer) []byte {
	out := binary.BigEndian.AppendUint32(nil, uint32(len(ans)))
	for _, a := range ans {
		var body []byte
		status := byte(0)
		if a.err == nil {
			var err error
			body, err = encode(a.resp)
			if err != nil {
				a.err = err
			}
		}
		if a.err != nil {
			status, body = 1, []byte(a.err.Error())
		}
		out = append(out, status)
		out = binary.BigEndian.AppendUint32(out, uint32(len(body)))
		out = append(out, body...)
	}
	return out
}

func decodeAnswers(b []byte, items []*batchItem) error {
	if len(b) < 4 || binary.BigEndian.Uint32(b) != uint32(len(items)) {
		return fmt.Errorf("%w: batch answer does not match its %d requests", ErrBadMessage, len(items))
	}
	b = b[4:]
	for _, it := range items {
		if len(b) < 5 || uint32(len(b)-5) < binary.BigEndian.Uint32(b[1:]) {
			return fmt.Errorf("%w: truncated batch answer", ErrBadMessage)
		}
		status, l := b[0], binary.BigEndian.Uint32(b[1:])
		body := b[5 : 5+l]
		b = b[5+l:]
		if status != 0 {
			it.err = fmt.Errorf("%w: %s", ErrRemote, body)
			continue
		}
		if err := decode(body, it.resp); err != nil {
			it.err = fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
	}
	return nil
}
