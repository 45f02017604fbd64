package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	secretA = []byte("cluster-secret-A-0123456789abcdef")
	secretB = []byte("cluster-secret-B-fedcba9876543210")
	secretX = []byte("an-intruders-guess-at-the-secret")
)

// Operations the test nodes serve.
const (
	opEcho  uint16 = 1 // answers "<node id> got <req> from <peer id>"
	opError uint16 = 2 // answers a RemoteError with code 300
	opBlock uint16 = 3 // blocks until the context ends
)

var testOps = []uint16{opEcho, opError, opBlock}

// testNode is a started node plus how many times each of its handlers ran.
type testNode struct {
	*Node
	served atomic.Int64
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// mustStartNode starts a node on 127.0.0.1 with the echo, error and block operations,
// closed when the test ends.
func mustStartNode(t testing.TB, id string, mod func(*Options)) *testNode {
	t.Helper()
	opts := Options{NodeID: id, ListenAddr: "127.0.0.1:0", Secret: secretA, Logger: quietLogger()}
	if mod != nil {
		mod(&opts)
	}
	n, err := New(opts)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	tn := &testNode{Node: n}
	n.Handle(opEcho, func(ctx context.Context, peer string, req []byte) ([]byte, error) {
		tn.served.Add(1)
		return fmt.Appendf(nil, "%s got %s from %s", id, req, peer), nil
	})
	n.Handle(opError, func(ctx context.Context, peer string, req []byte) ([]byte, error) {
		tn.served.Add(1)
		return nil, &RemoteError{Code: 300, Message: "refused by the test handler"}
	})
	n.Handle(opBlock, func(ctx context.Context, peer string, req []byte) ([]byte, error) {
		tn.served.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if err := n.Start(); err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	t.Cleanup(func() { n.Close() })
	return tn
}

// waitFor polls cond until it holds, failing the test after a generous bound.
func waitFor(t testing.TB, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", bound, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustEcho(t testing.TB, from, to *testNode, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := from.Call(ctx, to.Addr(), opEcho, []byte(msg))
	if err != nil {
		t.Fatalf("%s → %s: %v", from.NodeID(), to.NodeID(), err)
	}
	want := fmt.Sprintf("%s got %s from %s", to.NodeID(), msg, from.NodeID())
	if string(got) != want {
		t.Fatalf("%s → %s answered %q, want %q", from.NodeID(), to.NodeID(), got, want)
	}
}

// closeConns closes every connection of the node, so the next call handshakes anew.
func (n *Node) closeConns() {
	n.mu.Lock()
	live := make([]*peerConn, 0, len(n.live))
	for pc := range n.live {
		live = append(live, pc)
	}
	n.mu.Unlock()
	for _, pc := range live {
		_ = pc.qc.CloseWithError(connCodeShutdown, "test closes connections")
		<-pc.qc.Context().Done()
	}
}

// dropConn is a packet socket that can be told to drop everything both ways, like a
// peer whose host vanished without a word.
type dropConn struct {
	net.PacketConn
	drop atomic.Bool
}

func (c *dropConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil || !c.drop.Load() {
			return n, addr, err
		}
	}
}

func (c *dropConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if c.drop.Load() {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, addr)
}

// withDropConn installs a dropConn under the node and hands it to the test.
func withDropConn(dc **dropConn) func(*Options) {
	var once sync.Once
	return func(o *Options) {
		o.wrapPacketConn = func(pc net.PacketConn) net.PacketConn {
			once.Do(func() { *dc = &dropConn{PacketConn: pc} })
			return *dc
		}
	}
}

// callWithin calls and checks the call returned within bound, whatever it returned:
// the transport must never hang past a deadline.
func callWithin(t testing.TB, from *testNode, addr string, op uint16, timeout, bound time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	_, err := from.Call(ctx, addr, op, []byte("x"))
	if el := time.Since(start); el > bound {
		t.Fatalf("call with a %v deadline took %v (bound %v), err %v", timeout, el, bound, err)
	}
	return err
}

func mustErrIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want one matching %v", err, target)
	}
}

// SetReadBuffer and SetWriteBuffer pass through, so quic-go sizes the socket as usual.
func (c *dropConn) SetReadBuffer(n int) error {
	if s, ok := c.PacketConn.(interface{ SetReadBuffer(int) error }); ok {
		return s.SetReadBuffer(n)
	}
	return nil
}

func (c *dropConn) SetWriteBuffer(n int) error {
	if s, ok := c.PacketConn.(interface{ SetWriteBuffer(int) error }); ok {
		return s.SetWriteBuffer(n)
	}
	return nil
}
