package transport

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReadFrame feeds arbitrary bytes to the frame decoder: it must never panic, never
// allocate more than the limit, and whatever it accepts must encode back to the same
// bytes.
func FuzzReadFrame(f *testing.F) {
	f.Add(appendFrame(nil, header{version: frameVersion, kind: kindRequest, code: opEcho, timeoutMS: 5000}, []byte("hello")))
	f.Add(appendFrame(nil, header{version: frameVersion, kind: kindResponse, code: CodeUnknownOp}, []byte("operation 9 is not served")))
	f.Add(appendFrame(nil, header{version: frameVersion, kind: kindRaftStream}, nil))
	f.Add(appendFrame(nil, header{version: 2, kind: kindRequest}, []byte("x")))
	f.Add([]byte{1, 1, 0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{1, 0})
	f.Add([]byte{})
	const max = 1 << 16
	f.Fuzz(func(t *testing.T, b []byte) {
		h, p, err := readFrame(bytes.NewReader(b), max)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrUnsupportedVersion) &&
				!errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("unexpected error class: %v", err)
			}
			if errors.Is(err, ErrFrameTooLarge) && h.length <= max {
				t.Fatalf("refused %d bytes as too large", h.length)
			}
			return
		}
		if h.version != frameVersion || h.kind == 0 || uint32(len(p)) != h.length || h.length > max {
			t.Fatalf("accepted a bad frame: %+v with %d bytes", h, len(p))
		}
		if got := appendFrame(nil, h, p); !bytes.Equal(got, b[:headerLen+len(p)]) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", got, b[:headerLen+len(p)])
		}
	})
}

// FuzzReadHello feeds arbitrary bytes to the hello decoder, the first thing a server
// parses from an unauthenticated client.
func FuzzReadHello(f *testing.F) {
	f.Add(encodeHello(hello{version: handshakeVersion, nodeID: "n1", advertised: "127.0.0.1:7000"}))
	f.Add(encodeHello(hello{version: 9, nodeID: "n1"}))
	f.Add(encodeHello(hello{version: handshakeVersion}))
	f.Add([]byte("NRDH"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHello(bytes.NewReader(b))
		if err != nil {
			return
		}
		if h.version != handshakeVersion || h.nodeID == "" {
			t.Fatalf("accepted a bad hello: %+v", h)
		}
		if got := encodeHello(h); !bytes.Equal(got, b[:len(got)]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzReadChallenge feeds arbitrary bytes to the challenge decoder, which a client
// parses from a server it has not authenticated yet.
func FuzzReadChallenge(f *testing.F) {
	f.Add(encodeChallenge(challenge{nodeID: "n2", proofs: make([][macLen]byte, 1)}))
	f.Add(encodeChallenge(challenge{nodeID: "n2", proofs: make([][macLen]byte, 2)}))
	f.Add([]byte{hsBadVersion, 1})
	f.Add([]byte{hsDenied})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := readChallenge(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(c.proofs) == 0 || len(c.proofs) > maxProofs {
			t.Fatalf("accepted %d proofs", len(c.proofs))
		}
		if got := encodeChallenge(c); !bytes.Equal(got, b[:len(got)]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func TestFrameRoundTrip(t *testing.T) {
	for _, h := range []header{
		{version: frameVersion, kind: kindRequest, code: 65535, timeoutMS: 1<<32 - 1},
		{version: frameVersion, kind: kindResponse, code: CodeBusy},
		{version: frameVersion, kind: kindRaftStream},
	} {
		payload := []byte("payload")
		b := appendFrame(nil, h, payload)
		if len(b) != headerLen+len(payload) {
			t.Fatalf("frame of %d bytes", len(b))
		}
		got, p, err := readFrame(bytes.NewReader(b), 1024)
		h.length = uint32(len(payload))
		if err != nil || got != h || string(p) != "payload" {
			t.Fatalf("round trip of %+v: %+v %q %v", h, got, p, err)
		}
	}
}
