package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/quic-go/quic-go"
)

// StreamLayer implements raft.StreamLayer over the node's authenticated connections:
// each raft connection is one QUIC stream of kind kindRaftStream, so raft traffic never
// waits behind a request on another stream. raft.NewNetworkTransport takes it as is.
type StreamLayer struct {
	n      *Node
	accept chan net.Conn
	once   sync.Once
	closed chan struct{}
}

var _ raft.StreamLayer = (*StreamLayer)(nil)

func newStreamLayer(n *Node) *StreamLayer {
	return &StreamLayer{n: n, accept: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept returns the next raft stream a peer opened. It fails with ErrClosed once the
// layer or the node is closed.
func (l *StreamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.closed:
		return nil, fmt.Errorf("%w: raft stream layer", ErrClosed)
	}
}

// Close stops Accept; streams already handed out stay open, and the node stays up.
func (l *StreamLayer) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr returns the node's advertised address, which raft uses as this server's address.
func (l *StreamLayer) Addr() net.Addr { return nodeAddr(l.n.Addr()) }

// Dial opens a raft stream to the node at address, over the existing connection when
// there is one. It waits for the peer to accept the stream, so a refused stream is an
// error here and not a broken pipe later.
func (l *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, fmt.Errorf("%w: raft stream layer", ErrClosed)
	default:
	}
	n := l.n
	ctx, cancel := context.WithTimeout(n.ctx, min(timeout, n.opts.MaxCallTimeout))
	if timeout <= 0 {
		cancel()
		ctx, cancel = context.WithTimeout(n.ctx, n.opts.CallTimeout)
	}
	defer cancel()
	// Closing the layer (raft's transport shutting down) ends a dial in progress.
	go func() {
		select {
		case <-l.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	pc, st, err := n.openAccepted(ctx, string(address), header{version: frameVersion, kind: kindRaftStream})
	if err != nil {
		return nil, err
	}
	return n.newStreamConn(pc, st, nil), nil
}

// deliver hands a raft stream a peer opened to Accept, answering the opener with
// CodeOK, or refuses it. It reports whether the stream now belongs to raft.
func (l *StreamLayer) deliver(pc *peerConn, st *quic.Stream) bool {
	n := l.n
	if int(pc.raftStreams.Add(1)) > n.opts.MaxRaftStreams {
		pc.raftStreams.Add(-1)
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeBusy, fmt.Appendf(nil, "%d raft streams already open on this connection", n.opts.MaxRaftStreams))
		return false
	}
	release := func() { pc.raftStreams.Add(-1) }
	c := n.newStreamConn(pc, st, release)
	// From here raft owns the stream's deadlines.
	_ = st.SetReadDeadline(time.Time{})
	t := time.NewTimer(n.opts.HandshakeTimeout)
	defer t.Stop()
	select {
	case l.accept <- c:
	case <-l.closed:
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeShuttingDown, []byte("raft is not running on this node"))
		_ = c.Close() // refused: the peer has been answered
		return true
	case <-t.C:
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeBusy, []byte("raft did not accept the stream in time"))
		_ = c.Close() // refused: the peer has been answered
		return true
	case <-pc.qc.Context().Done():
		_ = c.Close() // the peer's connection is gone
		return true
	}
	// Raft on the other side writes nothing before it has read this answer, so it
	// cannot interleave with raft's own bytes.
	n.respond(st, CodeOK, nil)
	return true
}

// streamConn is a QUIC stream seen as a net.Conn.
type streamConn struct {
	*quic.Stream
	pc      *peerConn
	n       *Node
	once    sync.Once
	release func()
}

func (n *Node) newStreamConn(pc *peerConn, st *quic.Stream, release func()) *streamConn {
	n.stats.raftStreams.Add(1)
	return &streamConn{Stream: st, pc: pc, n: n, release: release}
}

// Close ends both directions: Stream.Close alone would leave the receive side, and
// the stream, alive until the peer closed its own.
func (c *streamConn) Close() error {
	c.once.Do(func() {
		c.Stream.CancelRead(streamCodeDone)
		_ = c.Stream.Close()
		c.n.stats.raftStreams.Add(-1)
		if c.release != nil {
			c.release()
		}
	})
	return nil
}

// Read reads the stream; a connection closed because its node (this one or the peer)
// is shutting down ends it as io.EOF, the clean end raft's transport expects: it logs
// any other read error as a failed command, and an orderly stop is not one.
func (c *streamConn) Read(p []byte) (int, error) {
	n, err := c.Stream.Read(p)
	if err != nil {
		var ae *quic.ApplicationError
		if errors.As(err, &ae) && ae.ErrorCode == connCodeShutdown {
			err = io.EOF
		}
	}
	return n, err
}

func (c *streamConn) LocalAddr() net.Addr  { return c.pc.qc.LocalAddr() }
func (c *streamConn) RemoteAddr() net.Addr { return nodeAddr(c.pc.peerAddr) }

// nodeAddr is a node-plane address as a net.Addr.
type nodeAddr string

func (a nodeAddr) Network() string { return "quic" }
func (a nodeAddr) String() string  { return string(a) }
