package transport

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
)

// frameVersion is the only frame layout this node speaks. A frame whose first byte is
// another value is answered with CodeUnsupportedVersion, in a version-1 frame, so that
// a newer node learns what an older one understands.
const frameVersion = 1

// headerLen is the fixed size of a frame header.
const headerLen = 12

// Stream kinds: the first frame on a stream says what the stream is for.
const (
	// kindRequest opens a request/response stream: one request frame, one response.
	kindRequest byte = 1
	// kindResponse answers a request.
	kindResponse byte = 2
	// kindRaftStream turns the stream into a raw byte pipe for raft's NetworkTransport
	// (the control plane); after the header the stream carries raft's own encoding.
	kindRaftStream byte = 3
	// kindGroupStream opens a message stream (msgstream.go): one-way messages of one
	// operation, each a frame of this kind, kept open for as long as the sender likes.
	// It carries the partition groups' raft frames. Nodes before it answer
	// CodeUnknownKind.
	kindGroupStream byte = 4
)

// header is the decoded fixed part of a frame.
//
//	offset size field
//	0      1    version     (frameVersion)
//	1      1    kind        (kindRequest, kindResponse, kindRaftStream, kindGroupStream)
//	2      2    code        request, message stream's first frame: operation;
//	                        response: status; raft stream, message: 0
//	4      4    timeout_ms  request: milliseconds the caller still waits; else 0
//	8      4    length      payload bytes that follow
//
// All integers are big-endian.
type header struct {
	version   byte
	kind      byte
	code      uint16
	timeoutMS uint32
	length    uint32
}

func (h header) encode(b []byte) {
	b[0] = h.version
	b[1] = h.kind
	binary.BigEndian.PutUint16(b[2:4], h.code)
	binary.BigEndian.PutUint32(b[4:8], h.timeoutMS)
	binary.BigEndian.PutUint32(b[8:12], h.length)
}

// decodeHeader parses a header. A version other than frameVersion returns the header
// (so the receiver can answer) together with ErrUnsupportedVersion; an unknown kind is
// left for the receiver to refuse, since only it knows which kinds it serves.
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerLen {
		return header{}, fmt.Errorf("%w: header of %d bytes, want %d", ErrBadFrame, len(b), headerLen)
	}
	h := header{
		version:   b[0],
		kind:      b[1],
		code:      binary.BigEndian.Uint16(b[2:4]),
		timeoutMS: binary.BigEndian.Uint32(b[4:8]),
		length:    binary.BigEndian.Uint32(b[8:12]),
	}
	if h.version != frameVersion {
		return h, fmt.Errorf("%w: frame version %d, this node speaks %d", ErrUnsupportedVersion, h.version, frameVersion)
	}
	if h.kind == 0 {
		return h, fmt.Errorf("%w: kind 0", ErrBadFrame)
	}
	return h, nil
}

// readHeader reads and decodes one header.
func readHeader(r io.Reader) (header, error) {
	var b [headerLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return header{}, err
	}
	return decodeHeader(b[:])
}

// payloadChunk is what a payload read allocates before any of its bytes arrived.
const payloadChunk = 64 << 10

// readPayload reads the payload announced by h, refusing before it allocates anything
// when the announced length is above max: a frame's size is bounded by the receiver,
// never by what the sender claims. Below max the length is still only a claim, so the
// buffer grows (doubling, never past the claim) as the bytes arrive: a peer that
// announces many large requests and sends nothing holds payloadChunk per request, not
// the sum of its claims, and what it does send is bounded by QUIC's flow control.
func readPayload(r io.Reader, h header, max uint32) ([]byte, error) {
	if h.length > max {
		return nil, fmt.Errorf("%w: %d bytes, at most %d accepted", ErrFrameTooLarge, h.length, max)
	}
	if h.length == 0 {
		return nil, nil
	}
	n := int(h.length)
	p := make([]byte, 0, min(n, payloadChunk))
	for len(p) < n {
		if len(p) == cap(p) {
			p = slices.Grow(p, min(n-len(p), cap(p)))
		}
		got, err := io.ReadFull(r, p[len(p):min(cap(p), n)])
		p = p[:len(p)+got]
		if err == io.EOF && len(p) > 0 {
			err = io.ErrUnexpectedEOF // some of the payload came, then the stream ended
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// readFrame reads one whole frame whose payload is at most max bytes.
func readFrame(r io.Reader, max uint32) (header, []byte, error) {
	h, err := readHeader(r)
	if err != nil {
		return h, nil, err
	}
	p, err := readPayload(r, h, max)
	return h, p, err
}

// appendFrame appends a frame with header h (its length set from payload) and payload.
func appendFrame(dst []byte, h header, payload []byte) []byte {
	h.length = uint32(len(payload))
	var b [headerLen]byte
	h.encode(b[:])
	dst = append(dst, b[:]...)
	return append(dst, payload...)
}
