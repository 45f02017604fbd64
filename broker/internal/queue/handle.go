package queue

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// ErrBadHandle means a receipt handle is not one this broker issued: wrong length,
// version or checksum.
var ErrBadHandle = errors.New("queue: malformed receipt handle")

// Handle is the decoded form of a receipt handle: it names the topic incarnation, the
// partition, the offset and the lease nonce. Clients treat the encoded form as opaque.
type Handle struct {
	Incarnation uint64
	Partition   uint32
	Offset      uint64
	Nonce       Nonce
}

const (
	handleVersion = 1
	handleLen     = 1 + 8 + 4 + 8 + 4 + 8 + 4 // version, fields, CRC-32C
)

var (
	castagnoli     = crc32.MakeTable(crc32.Castagnoli)
	handleEncoding = base64.RawURLEncoding.Strict()
)

// Encode returns the handle as URL-safe base64 text, safe in a query string unescaped.
func (h Handle) Encode() string {
	var b [handleLen]byte
	b[0] = handleVersion
	binary.BigEndian.PutUint64(b[1:], h.Incarnation)
	binary.BigEndian.PutUint32(b[9:], h.Partition)
	binary.BigEndian.PutUint64(b[13:], h.Offset)
	binary.BigEndian.PutUint32(b[21:], h.Nonce.Epoch)
	binary.BigEndian.PutUint64(b[25:], h.Nonce.Seq)
	binary.BigEndian.PutUint32(b[33:], crc32.Checksum(b[:33], castagnoli))
	return handleEncoding.EncodeToString(b[:])
}

// DecodeHandle parses a handle made by Encode. Anything else returns ErrBadHandle.
func DecodeHandle(s string) (Handle, error) {
	if handleEncoding.DecodedLen(len(s)) != handleLen {
		return Handle{}, ErrBadHandle
	}
	var b [handleLen]byte
	// Strict: the unused low bits of the last character must be zero, so one handle has
	// exactly one spelling (a lax decoder takes "…aEX" as "…aEQ").
	if n, err := handleEncoding.Decode(b[:], []byte(s)); err != nil || n != handleLen {
		return Handle{}, ErrBadHandle
	}
	if b[0] != handleVersion || binary.BigEndian.Uint32(b[33:]) != crc32.Checksum(b[:33], castagnoli) {
		return Handle{}, ErrBadHandle
	}
	return Handle{
		Incarnation: binary.BigEndian.Uint64(b[1:]),
		Partition:   binary.BigEndian.Uint32(b[9:]),
		Offset:      binary.BigEndian.Uint64(b[13:]),
		Nonce:       Nonce{Epoch: binary.BigEndian.Uint32(b[21:]), Seq: binary.BigEndian.Uint64(b[25:])},
	}, nil
}
