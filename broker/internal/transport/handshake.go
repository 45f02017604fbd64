package transport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
)

// handshakeVersion is the only secret-handshake version this node speaks.
const handshakeVersion = 1

// handshakeMagic opens every hello so that a stray client fails at once.
var handshakeMagic = [4]byte{'N', 'R', 'D', 'H'}

// exporterLabel names the TLS exporter the proofs are bound to. Both ends of one TLS
// session derive the same 32 bytes from it; a relay between two sessions cannot.
const exporterLabel = "EXPORTER-narad-node-plane"

const (
	nonceLen = 32
	macLen   = sha256.Size
	// maxIDLen bounds node ids and addresses in the hello (one length byte each).
	maxIDLen = 255
)

// Handshake statuses, the first byte of the server's answers.
const (
	hsOK         byte = 0
	hsBadVersion byte = 1
	hsRefused    byte = 2
	hsDenied     byte = 3
	hsMalformed  byte = 4
	hsSameNodeID byte = 5
)

// Domain-separation labels of the two proofs, so a server proof can never be replayed
// as a client proof.
const (
	macLabelServer = "narad-node-plane/1 server"
	macLabelClient = "narad-node-plane/1 client"
)

// hello is the client's opening message.
type hello struct {
	version    byte
	nonce      [nonceLen]byte
	nodeID     string
	advertised string
}

// encodeHello lays out: magic[4] version[1] nonce_c[32] idlen[1] id addrlen[1] addr.
func encodeHello(h hello) []byte {
	b := make([]byte, 0, 4+1+nonceLen+2+len(h.nodeID)+len(h.advertised))
	b = append(b, handshakeMagic[:]...)
	b = append(b, h.version)
	b = append(b, h.nonce[:]...)
	b = appendLP(b, h.nodeID)
	return appendLP(b, h.advertised)
}

// readHello reads a hello. A wrong version is reported as ErrUnsupportedVersion after
// reading only the fixed part, so the server can answer before the rest arrives.
func readHello(r io.Reader) (hello, error) {
	var fixed [4 + 1 + nonceLen]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return hello{}, err
	}
	if [4]byte(fixed[:4]) != handshakeMagic {
		return hello{}, fmt.Errorf("%w: not a node-plane hello", ErrBadFrame)
	}
	h := hello{version: fixed[4]}
	if h.version != handshakeVersion {
		return h, fmt.Errorf("%w: handshake version %d, this node speaks %d", ErrUnsupportedVersion, h.version, handshakeVersion)
	}
	copy(h.nonce[:], fixed[5:])
	var err error
	if h.nodeID, err = readLP(r); err != nil {
		return h, err
	}
	if h.nodeID == "" {
		return h, fmt.Errorf("%w: empty node id", ErrBadFrame)
	}
	if h.advertised, err = readLP(r); err != nil {
		return h, err
	}
	return h, nil
}

// challenge is the server's answer to a hello.
type challenge struct {
	nonce  [nonceLen]byte
	nodeID string
	proofs [][macLen]byte
}

// encodeChallenge lays out: status[1]=0 nonce_s[32] idlen[1] id count[1] proofs[32×count].
func encodeChallenge(c challenge) []byte {
	b := make([]byte, 0, 1+nonceLen+1+len(c.nodeID)+1+macLen*len(c.proofs))
	b = append(b, hsOK)
	b = append(b, c.nonce[:]...)
	b = appendLP(b, c.nodeID)
	b = append(b, byte(len(c.proofs)))
	for _, p := range c.proofs {
		b = append(b, p[:]...)
	}
	return b
}

// maxProofs bounds the proofs in a challenge: one per secret a node holds.
const maxProofs = 2

func readChallenge(r io.Reader) (challenge, error) {
	var st [1]byte
	if _, err := io.ReadFull(r, st[:]); err != nil {
		return challenge{}, err
	}
	if err := statusError(st[0], r); err != nil {
		return challenge{}, err
	}
	var c challenge
	if _, err := io.ReadFull(r, c.nonce[:]); err != nil {
		return c, err
	}
	var err error
	if c.nodeID, err = readLP(r); err != nil {
		return c, err
	}
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return c, err
	}
	if n[0] == 0 || n[0] > maxProofs {
		return c, fmt.Errorf("%w: %d proofs", ErrBadFrame, n[0])
	}
	c.proofs = make([][macLen]byte, n[0])
	for i := range c.proofs {
		if _, err := io.ReadFull(r, c.proofs[i][:]); err != nil {
			return c, err
		}
	}
	return c, nil
}

// statusError turns a non-OK handshake status into an error. hsBadVersion is followed
// by the one version byte the server speaks.
func statusError(st byte, r io.Reader) error {
	switch st {
	case hsOK:
		return nil
	case hsBadVersion:
		var v [1]byte
		_, _ = io.ReadFull(r, v[:])
		return fmt.Errorf("%w: the peer speaks handshake version %d", ErrUnsupportedVersion, v[0])
	case hsRefused:
		return fmt.Errorf("%w: the peer refused the handshake (too many in progress)", ErrPeerUnavailable)
	case hsDenied:
		return fmt.Errorf("%w: the peer rejected this node's proof (no cluster secret in common)", ErrUnauthenticated)
	case hsSameNodeID:
		return fmt.Errorf("%w: the peer has this node's own node id", ErrUnauthenticated)
	case hsMalformed:
		return fmt.Errorf("%w: the peer could not parse the hello", ErrBadFrame)
	default:
		return fmt.Errorf("%w: handshake status %d", ErrBadFrame, st)
	}
}

// handshakeIDs is what both proofs bind besides the nonces: who the client says it is,
// where it says it listens, and who the server says it is. Each is length-prefixed so
// no two different triples encode alike.
func handshakeIDs(clientID, clientAddr, serverID string) []byte {
	b := make([]byte, 0, 3+len(clientID)+len(clientAddr)+len(serverID))
	b = appendLP(b, clientID)
	b = appendLP(b, clientAddr)
	return appendLP(b, serverID)
}

// proof computes HMAC-SHA256(secret, label | exporter | first | second | ids).
func proof(secret []byte, label string, exporter []byte, first, second [nonceLen]byte, ids []byte) [macLen]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(exporter)
	m.Write(first[:])
	m.Write(second[:])
	m.Write(ids)
	var out [macLen]byte
	copy(out[:], m.Sum(nil))
	return out
}

// matchProof returns the index of the first secret whose expected proof equals one of
// got, or -1. Every comparison runs through hmac.Equal.
func matchProof(secrets [][]byte, got [][macLen]byte, label string, exporter []byte, first, second [nonceLen]byte, ids []byte) int {
	found := -1
	for i, s := range secrets {
		want := proof(s, label, exporter, first, second, ids)
		for _, g := range got {
			if hmac.Equal(want[:], g[:]) && found < 0 {
				found = i
			}
		}
	}
	return found
}

func newNonce() ([nonceLen]byte, error) {
	var n [nonceLen]byte
	_, err := rand.Read(n[:])
	return n, err
}

func appendLP(b []byte, s string) []byte {
	b = append(b, byte(len(s)))
	return append(b, s...)
}

func readLP(r io.Reader) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}
