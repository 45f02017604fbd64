package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

const opMessages uint16 = 120

// collector records the messages a node's handler got, by sender.
type collector struct {
	mu   sync.Mutex
	got  []uint64
	from map[string]int
}

func (c *collector) handle(peer string, msg []byte) error {
	if len(msg) != 8 {
		return fmt.Errorf("message of %d bytes", len(msg))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, binary.BigEndian.Uint64(msg))
	if c.from == nil {
		c.from = map[string]int{}
	}
	c.from[peer]++
	return nil
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

func mustOpenMessages(t testing.TB, from, to *testNode, op uint16) *MessageStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := from.OpenMessages(ctx, to.Addr(), op)
	if err != nil {
		t.Fatalf("opening a message stream %s → %s: %v", from.NodeID(), to.NodeID(), err)
	}
	t.Cleanup(s.Close)
	return s
}

// Every message sent on a stream reaches the handler once, in the order sent, named
// with its sender; a message the handler refuses costs only itself.
func TestMessageStreamDeliversInOrder(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	var c collector
	b.HandleMessages(opMessages, c.handle)
	s := mustOpenMessages(t, a, b, opMessages)
	const n = 5000
	for i := range n {
		if i == 100 {
			if err := s.Send([]byte("refused by the handler"), 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Send(binary.BigEndian.AppendUint64(nil, uint64(i)), 5*time.Second); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	waitFor(t, "every message", 20*time.Second, func() bool { return c.count() == n })
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, v := range c.got {
		if v != uint64(i) {
			t.Fatalf("message %d arrived as the %d-th", v, i)
		}
	}
	if c.from["a"] != n || len(c.from) != 1 {
		t.Fatalf("senders %v, want a for all %d", c.from, n)
	}
	if st := b.Stats(); st.MessagesServed != n+1 || st.MessageStreams != 1 {
		t.Fatalf("receiver's stats %+v, want %d messages served on 1 stream", st, n+1)
	}
	mustEcho(t, a, b, "calls still work beside the stream")
}

// A peer without a handler for the operation refuses the stream, so the opener can
// fall back to Call; a message larger than the frame limit is refused before it goes.
func TestMessageStreamRefusals(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", func(o *Options) { o.MaxRaftStreams = 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := a.OpenMessages(ctx, b.Addr(), opMessages)
	mustErrIs(t, err, ErrUnknownOp)

	var c collector
	b.HandleMessages(opMessages, c.handle)
	mustOpenMessages(t, a, b, opMessages)
	mustOpenMessages(t, a, b, opMessages)
	_, err = a.OpenMessages(ctx, b.Addr(), opMessages)
	mustErrIs(t, err, ErrBusy)

	a.HandleMessages(opMessages, c.handle)
	s := mustOpenMessages(t, b, a, opMessages) // the limit counts what the peer opened
	big := make([]byte, a.opts.MaxFrameSize+1)
	if err := s.Send(big, time.Second); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("sending %d bytes: %v, want ErrFrameTooLarge", len(big), err)
	}
}

// A stream whose receiver went away fails its sends (within the write timeout once
// the flow-control window is full), so the sender opens another.
func TestMessageStreamFailsWhenThePeerCloses(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	var c collector
	b.HandleMessages(opMessages, c.handle)
	s := mustOpenMessages(t, a, b, opMessages)
	if err := s.Send(binary.BigEndian.AppendUint64(nil, 1), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first message", 20*time.Second, func() bool { return c.count() == 1 })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 64<<10)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.Send(msg, time.Second)
		if err != nil {
			mustErrIs(t, err, ErrPeerUnavailable)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sends to a closed peer kept succeeding for 30 s")
		}
	}
	// The closing peer resets its streams before it closes the connection, so the
	// send may fail on the reset a moment before the connection's close arrives.
	waitFor(t, "the stream's connection to count dead after the peer closed it", 20*time.Second, func() bool { return !s.Alive() })
}

// BenchmarkMessageStream measures a small one-way message on a kept message stream,
// against BenchmarkCall's round trip on a stream of its own per call. It waits for the
// last message to arrive, so every message's receiving is counted too.
func BenchmarkMessageStream(b *testing.B) {
	x := mustStartNode(b, "x", nil)
	y := mustStartNode(b, "y", nil)
	var got syncCount
	y.HandleMessages(opMessages, func(string, []byte) error { got.add(); return nil })
	s := mustOpenMessages(b, x, y, opMessages)
	msg := make([]byte, 64)
	b.ReportAllocs()
	stop := reportCPU(b)
	for range b.N {
		if err := s.Send(msg, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	waitFor(b, "every message", time.Minute, func() bool { return got.load() == int64(b.N) })
	stop()
}

type syncCount struct {
	mu sync.Mutex
	n  int64
}

func (c *syncCount) add() { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *syncCount) load() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
