package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

func TestUnknownOperationIsAnsweredCleanly(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	_, err := a.Call(t.Context(), b.Addr(), 999, []byte("?"))
	mustErrIs(t, err, ErrUnknownOp)
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeUnknownOp {
		t.Fatalf("got %#v, want a RemoteError with CodeUnknownOp", err)
	}
	mustEcho(t, a, b, "still fine")
}

// rawStream opens a stream on a's authenticated connection to b, for frames the API
// would never send.
func rawStream(t *testing.T, a, b *testNode) io.ReadWriteCloser {
	t.Helper()
	pc, err := a.conn(t.Context(), b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	st, err := pc.qc.OpenStreamSync(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { st.CancelRead(0); st.Close() })
	return st
}

func TestUnknownFrameVersionAndKindAreAnsweredCleanly(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	for _, tc := range []struct {
		name string
		h    header
		want uint16
	}{
		{"version 2", header{version: 2, kind: kindRequest, code: opEcho}, CodeUnsupportedVersion},
		{"version 255", header{version: 255, kind: 77, code: opEcho}, CodeUnsupportedVersion},
		{"message stream of an operation without a handler", header{version: frameVersion, kind: kindGroupStream, code: 999}, CodeUnknownOp},
		{"kind 200", header{version: frameVersion, kind: 200}, CodeUnknownKind},
		{"kind 0", header{version: frameVersion, kind: 0}, CodeBadFrame},
		{"a response as a request", header{version: frameVersion, kind: kindResponse}, CodeUnknownKind},
	} {
		st := rawStream(t, a, b)
		if _, err := st.Write(appendFrame(nil, tc.h, []byte("payload"))); err != nil {
			t.Fatal(err)
		}
		h, msg, err := readFrame(st, 4096)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", tc.name, err)
		}
		if h.version != frameVersion || h.kind != kindResponse || h.code != tc.want {
			t.Errorf("%s: answer %+v %q, want code %d", tc.name, h, msg, tc.want)
		}
	}
	if b.served.Load() != 0 {
		t.Errorf("a handler ran for a frame it should not see")
	}
	mustEcho(t, a, b, "still fine")
}

func TestHandlerErrorsSurviveTheWire(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	b.Handle(10, func(context.Context, string, []byte) ([]byte, error) {
		return nil, errors.New("disk on fire")
	})
	b.Handle(11, func(context.Context, string, []byte) ([]byte, error) {
		panic("handler bug")
	})

	_, err := a.Call(t.Context(), b.Addr(), opError, nil)
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != 300 || re.Message != "refused by the test handler" {
		t.Fatalf("got %v, want RemoteError 300", err)
	}
	mustErrIs(t, err, ErrRemote)

	_, err = a.Call(t.Context(), b.Addr(), 10, nil)
	if !errors.As(err, &re) || re.Code != CodeHandler || re.Message != "disk on fire" {
		t.Fatalf("got %v, want RemoteError CodeHandler with the message", err)
	}
	_, err = a.Call(t.Context(), b.Addr(), 11, nil)
	if !errors.As(err, &re) || re.Code != CodeHandler {
		t.Fatalf("a panicking handler: got %v", err)
	}
	mustEcho(t, a, b, "survived a panic")
}

func TestOversizedFramesAreRefused(t *testing.T) {
	big := func(o *Options) { o.MaxFrameSize = 1 << 20 }
	small := func(o *Options) { o.MaxFrameSize = 1024 }
	a := mustStartNode(t, "a", big)
	b := mustStartNode(t, "b", small)
	for _, n := range []*testNode{a, b} {
		n.Handle(20, func(_ context.Context, _ string, req []byte) ([]byte, error) {
			return bytes.Repeat([]byte("r"), 2048), nil
		})
	}

	// The receiver refuses a request larger than it accepts, without reading it.
	_, err := a.Call(t.Context(), b.Addr(), opEcho, make([]byte, 4096))
	mustErrIs(t, err, ErrFrameTooLarge)
	var re *RemoteError
	if !errors.As(err, &re) {
		t.Fatalf("want the peer's refusal, got %v", err)
	}
	// The sender refuses a request larger than it sends.
	_, err = b.Call(t.Context(), a.Addr(), opEcho, make([]byte, 4096))
	mustErrIs(t, err, ErrFrameTooLarge)
	if errors.As(err, &re) {
		t.Fatalf("want a local refusal, got the peer's: %v", err)
	}
	// A handler's answer too large to send is refused by the sender...
	_, err = a.Call(t.Context(), b.Addr(), 20, nil)
	mustErrIs(t, err, ErrFrameTooLarge)
	// ...and one too large to receive by the receiver.
	_, err = b.Call(t.Context(), a.Addr(), 20, nil)
	mustErrIs(t, err, ErrFrameTooLarge)
	// A raw header announcing 4 GiB is refused without an allocation.
	st := rawStream(t, a, b)
	var hb [headerLen]byte
	header{version: frameVersion, kind: kindRequest, code: opEcho, length: ^uint32(0)}.encode(hb[:])
	if _, err := st.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	h, _, err := readFrame(st, 4096)
	if err != nil || h.code != CodeFrameTooLarge {
		t.Fatalf("4 GiB header answered %+v, %v", h, err)
	}
	mustEcho(t, a, b, "still fine")
	mustEcho(t, b, a, "still fine")
}

func TestConcurrentRequestsPastTheLimitAreRefused(t *testing.T) {
	const limit = 3
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", func(o *Options) { o.MaxConcurrentRequests = limit })
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(limit)
	b.Handle(30, func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
		started.Done()
		select {
		case <-release:
			return []byte("done"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	errs := make(chan error, limit)
	for range limit {
		go func() {
			_, err := a.Call(t.Context(), b.Addr(), 30, nil)
			errs <- err
		}()
	}
	started.Wait()
	err := callWithin(t, a, b.Addr(), opEcho, 20*time.Second, 10*time.Second)
	mustErrIs(t, err, ErrBusy)
	close(release)
	for range limit {
		if err := <-errs; err != nil {
			t.Errorf("a call within the limit failed: %v", err)
		}
	}
	mustEcho(t, a, b, "room again")
}

func TestBlockedHandlerTurnsIntoTimeout(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	b.Handle(40, func(context.Context, string, []byte) ([]byte, error) {
		<-stuck // ignores its context on purpose
		return nil, nil
	})
	mustEcho(t, a, b, "warm up")
	for _, op := range []uint16{opBlock, 40} {
		err := callWithin(t, a, b.Addr(), op, 300*time.Millisecond, 10*time.Second)
		mustErrIs(t, err, ErrTimeout)
	}
	// A caller without a deadline gets Options.CallTimeout.
	short := mustStartNode(t, "short", func(o *Options) { o.CallTimeout = 300 * time.Millisecond })
	start := time.Now()
	_, err := short.Call(context.Background(), b.Addr(), opBlock, nil)
	mustErrIs(t, err, ErrTimeout)
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("a call without a deadline took %v", el)
	}
	// A cancelled caller returns at once too.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	_, err = a.Call(ctx, b.Addr(), opBlock, nil)
	mustErrIs(t, err, context.Canceled)
	mustEcho(t, a, b, "still fine")
}

func TestBlackholedPeerTurnsIntoErrorsNeverHangs(t *testing.T) {
	idle := func(o *Options) {
		o.IdleTimeout = time.Second
		o.HandshakeTimeout = time.Second
	}
	a := mustStartNode(t, "a", idle)
	var dc *dropConn
	b := mustStartNode(t, "b", withDropConn(&dc))
	mustEcho(t, a, b, "before")

	dc.drop.Store(true)
	// The connection still looks alive: the call times out at its deadline.
	err := callWithin(t, a, b.Addr(), opEcho, 300*time.Millisecond, 10*time.Second)
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrPeerUnavailable) {
		t.Fatalf("got %v, want ErrTimeout or ErrPeerUnavailable", err)
	}
	// Once the idle timeout declared it dead, calls fail as unavailable (the redial
	// gets no answer either), each within its deadline.
	sawUnavailable := false
	deadline := time.Now().Add(60 * time.Second)
	for !sawUnavailable && time.Now().Before(deadline) {
		err := callWithin(t, a, b.Addr(), opEcho, 500*time.Millisecond, 10*time.Second)
		switch {
		case errors.Is(err, ErrPeerUnavailable):
			sawUnavailable = true
		case errors.Is(err, ErrTimeout):
		default:
			t.Fatalf("call to a blackholed peer: %v", err)
		}
	}
	if !sawUnavailable {
		t.Fatalf("never saw ErrPeerUnavailable from a blackholed peer")
	}
	waitFor(t, "the dead connection to be dropped", 30*time.Second, func() bool { return a.Stats().Conns == 0 })
	// The peer comes back: after the backoff, calls succeed again.
	dc.drop.Store(false)
	waitFor(t, "calls to succeed again", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := a.Call(ctx, b.Addr(), opEcho, []byte("back"))
		return err == nil
	})
}

func TestClosedPeerTurnsIntoPeerUnavailable(t *testing.T) {
	a := mustStartNode(t, "a", func(o *Options) { o.HandshakeTimeout = time.Second })
	b := mustStartNode(t, "b", nil)
	mustEcho(t, a, b, "before")
	addr := b.Addr()
	b.Close()
	// The peer said goodbye, so a knows at once.
	err := callWithin(t, a, addr, opEcho, 5*time.Second, 15*time.Second)
	mustErrIs(t, err, ErrPeerUnavailable)
	err = callWithin(t, a, addr, opEcho, 5*time.Second, 15*time.Second)
	mustErrIs(t, err, ErrPeerUnavailable)
	// Calls on a closed node fail at once.
	b2 := mustStartNode(t, "b2", nil)
	a.Close()
	_, err = a.Call(t.Context(), b2.Addr(), opEcho, nil)
	mustErrIs(t, err, ErrClosed)
}

func TestRedialsBackOff(t *testing.T) {
	// A socket that swallows everything: every dial to it times out.
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hole.Close() })
	go func() {
		b := make([]byte, 2048)
		for {
			if _, _, err := hole.ReadFrom(b); err != nil {
				return
			}
		}
	}()
	a := mustStartNode(t, "a", func(o *Options) {
		o.HandshakeTimeout = 500 * time.Millisecond
		o.MinRedialBackoff = 3 * time.Second
		o.MaxRedialBackoff = 3 * time.Second
	})
	addr := hole.LocalAddr().String()
	err = callWithin(t, a, addr, opEcho, 20*time.Second, 30*time.Second)
	mustErrIs(t, err, ErrPeerUnavailable)
	if d := a.Stats().Dials; d != 1 {
		t.Fatalf("%d dials, want 1", d)
	}
	// Within the backoff (at least 1.5 s with jitter), callers fail at once and no
	// new dial starts.
	for range 10 {
		err := callWithin(t, a, addr, opEcho, 200*time.Millisecond, 150*time.Millisecond)
		mustErrIs(t, err, ErrPeerUnavailable)
	}
	if d := a.Stats().Dials; d != 1 {
		t.Fatalf("%d dials during the backoff, want 1", d)
	}
	// A caller with time to wait gets the next dial after the backoff.
	err = callWithin(t, a, addr, opEcho, 20*time.Second, 30*time.Second)
	mustErrIs(t, err, ErrPeerUnavailable)
	if d := a.Stats().Dials; d != 2 {
		t.Fatalf("%d dials, want 2", d)
	}
}

// TestNotSentMarksOnlyRequestsThatNeverLeft: a caller that wants to send a
// non-idempotent request again (the control plane's forwarded writes) needs to know when
// the request certainly never reached the peer. Failures before the request's stream
// existed carry ErrNotSent; a request the peer received and did not answer in time does
// not.
func TestNotSentMarksOnlyRequestsThatNeverLeft(t *testing.T) {
	a := mustStartNode(t, "a", func(o *Options) { o.HandshakeTimeout = time.Second })
	b := mustStartNode(t, "b", nil)
	mustEcho(t, a, b, "warm up")

	// Received, never answered: the outcome is unknown.
	err := callWithin(t, a, b.Addr(), opBlock, 300*time.Millisecond, 10*time.Second)
	mustErrIs(t, err, ErrTimeout)
	if errors.Is(err, ErrNotSent) {
		t.Fatalf("a request the peer was handling reports %v, which says it never left", err)
	}
	// A handler's own error is an answer, not a failure to send.
	err = callWithin(t, a, b.Addr(), opError, 5*time.Second, 10*time.Second)
	if errors.Is(err, ErrNotSent) {
		t.Fatalf("a handler's error reports %v", err)
	}

	// Nobody listens: the dial fails, so nothing was sent.
	gone, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := gone.LocalAddr().String()
	gone.Close()
	err = callWithin(t, a, addr, opEcho, 5*time.Second, 15*time.Second)
	mustErrIs(t, err, ErrPeerUnavailable)
	mustErrIs(t, err, ErrNotSent)
	// A closed node sends nothing either.
	a.Close()
	_, err = a.Call(t.Context(), addr, opEcho, nil)
	mustErrIs(t, err, ErrClosed)
	mustErrIs(t, err, ErrNotSent)
}

// TestHandlerContextEndsWhenTheCallerStopsWaiting: a caller that cancels stops reading
// the stream, and the handler's context ends then, not at the deadline the caller
// sent: work done for nobody can be undone (the broker hands back a lease taken for a
// consume that was cut).
func TestHandlerContextEndsWhenTheCallerStopsWaiting(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	entered, ended := make(chan struct{}), make(chan error, 1)
	b.Handle(41, func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
		close(entered)
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
		case <-time.After(30 * time.Second):
			ended <- errors.New("still running 30 s after its caller cancelled")
		}
		return nil, ctx.Err()
	})
	mustEcho(t, a, b, "warm up")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the deadline sent is a minute off
	go func() { <-entered; cancel() }()
	_, err := a.Call(ctx, b.Addr(), 41, nil)
	mustErrIs(t, err, context.Canceled)
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context: %v; want cancelled once its caller stopped waiting", err)
	}
	mustEcho(t, a, b, "still fine")
}
