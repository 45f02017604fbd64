package transport

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func mustDialRaft(t *testing.T, from, to *testNode) net.Conn {
	t.Helper()
	c, err := from.StreamLayer().Dial(raft.ServerAddress(to.Addr()), 20*time.Second)
	if err != nil {
		t.Fatalf("raft dial %s → %s: %v", from.NodeID(), to.NodeID(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func pingPong(t *testing.T, client, server net.Conn, msg string) {
	t.Helper()
	_ = client.SetDeadline(time.Now().Add(20 * time.Second))
	_ = server.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := client.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(server, got); err != nil || string(got) != msg {
		t.Fatalf("server read %q, %v", got, err)
	}
	if _, err := server.Write(bytes.ToUpper(got)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, got); err != nil || string(got) != string(bytes.ToUpper([]byte(msg))) {
		t.Fatalf("client read %q, %v", got, err)
	}
}

func TestRaftStreamCarriesBytesBothWays(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	accepted := make(chan net.Conn, 1)
	go func() { c, _ := b.StreamLayer().Accept(); accepted <- c }()
	client := mustDialRaft(t, a, b)
	server := <-accepted
	pingPong(t, client, server, "append entries")
	if got := string(server.RemoteAddr().String()); got != a.Addr() {
		t.Errorf("server sees remote %q, want a's address %q", got, a.Addr())
	}
	if got := b.StreamLayer().Addr().String(); got != b.Addr() {
		t.Errorf("layer address %q, want %q", got, b.Addr())
	}
	// Closing one end ends the other's reads, and both streams are released.
	client.Close()
	_ = server.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := server.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read after the peer closed succeeded")
	}
	server.Close()
	waitFor(t, "raft streams released", 30*time.Second, func() bool {
		return a.Stats().RaftStreams == 0 && b.Stats().RaftStreams == 0
	})
	// Requests and raft streams share the one connection.
	mustEcho(t, a, b, "same connection")
	if a.Stats().Conns != 1 {
		t.Errorf("%d connections, want 1", a.Stats().Conns)
	}
}

func TestRaftStreamsPastTheLimitAreRefused(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", func(o *Options) { o.MaxRaftStreams = 2 })
	for range 2 {
		go func() { b.StreamLayer().Accept() }()
	}
	mustDialRaft(t, a, b)
	mustDialRaft(t, a, b)
	_, err := a.StreamLayer().Dial(raft.ServerAddress(b.Addr()), 20*time.Second)
	mustErrIs(t, err, ErrBusy)
}

func TestRaftStreamToAStoppedLayerIsRefused(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	b.StreamLayer().Close()
	_, err := a.StreamLayer().Dial(raft.ServerAddress(b.Addr()), 20*time.Second)
	mustErrIs(t, err, ErrPeerUnavailable)
	// Closing the layer leaves the node serving.
	mustEcho(t, a, b, "still serving")
	_, err = b.StreamLayer().Accept()
	mustErrIs(t, err, ErrClosed)
}

func TestRaftStreamIsNotStuckBehindRequests(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	// Fill the connection with large requests whose handlers never return...
	b.Handle(50, func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	accepted := make(chan net.Conn, 1)
	go func() { c, _ := b.StreamLayer().Accept(); accepted <- c }()
	client := mustDialRaft(t, a, b)
	server := <-accepted
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 8)
	for range 8 {
		go func() {
			_, _ = a.Call(ctx, b.Addr(), 50, make([]byte, 3<<20))
			done <- struct{}{}
		}()
	}
	waitFor(t, "the large requests to reach their handler", 60*time.Second, func() bool {
		return b.Stats().RequestsServed >= 8
	})
	// ...and raft's bytes still go through at once.
	start := time.Now()
	pingPong(t, client, server, "heartbeat")
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("raft round trip took %v behind the requests", el)
	}
	cancel()
	for range 8 {
		<-done
	}
}
