package transport

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"testing/iotest"
	"time"
)

// TestPayloadReadAcrossItsGrowth: a payload read in pieces of any size comes out whole
// at every length around the growth steps, and one cut short is an unexpected EOF.
func TestPayloadReadAcrossItsGrowth(t *testing.T) {
	for _, n := range []int{1, payloadChunk - 1, payloadChunk, payloadChunk + 1, 3*payloadChunk + 7, 1 << 20} {
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(rand.IntN(256))
		}
		h := header{version: frameVersion, kind: kindRequest, length: uint32(n)}
		for _, r := range []io.Reader{bytes.NewReader(want), iotest.OneByteReader(bytes.NewReader(want)), iotest.HalfReader(bytes.NewReader(want))} {
			got, err := readPayload(r, h, 1<<20)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%d bytes: read %d, err %v", n, len(got), err)
			}
			if cap(got) > 2*n {
				t.Fatalf("%d bytes: a buffer of %d, more than twice the payload", n, cap(got))
			}
		}
		if n > 1 {
			_, err := readPayload(bytes.NewReader(want[:n-1]), h, 1<<20)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%d bytes cut short by one: %v, want io.ErrUnexpectedEOF", n, err)
			}
		}
	}
}

// TestAnnouncedLengthAllocatesOnlyWhatArrives: a frame's length is only what the
// sender claims. A peer that opens many requests announcing the largest frame and then
// sends nothing must not make the receiver allocate the sum of the claims (with the
// cluster's 24 MiB frames and 256 requests per connection, 6 GiB from one connection
// of headers): memory follows the bytes that arrived, which QUIC's flow control bounds.
func TestAnnouncedLengthAllocatesOnlyWhatArrives(t *testing.T) {
	const (
		frame   = 8 << 20
		streams = 32 // 256 MiB announced
		bound   = 32 << 20
	)
	big := func(o *Options) { o.MaxFrameSize = frame }
	victim := mustStartNode(t, "victim", big)
	mallory := mustStartNode(t, "mallory", big)
	mustEcho(t, mallory, victim, "hello") // the connection, authenticated

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var hb [headerLen]byte
	header{version: frameVersion, kind: kindRequest, code: opEcho, timeoutMS: 30000, length: frame}.encode(hb[:])
	for range streams {
		st := rawStream(t, mallory, victim)
		if _, err := st.Write(hb[:]); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the victim to hold a request slot per stream", 30*time.Second, func() bool {
		victim.mu.Lock()
		defer victim.mu.Unlock()
		for pc := range victim.live {
			if pc.peerID == "mallory" && len(pc.reqs) == streams {
				return true
			}
		}
		return false
	})
	// One more round trip on the connection, so the reads behind the slots have begun.
	mustEcho(t, mallory, victim, "after the headers")
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > bound {
		t.Fatalf("%d requests announcing %d MiB each and sending nothing made the heap grow by %d MiB (bound %d MiB)",
			streams, frame>>20, grew>>20, bound>>20)
	}
}
