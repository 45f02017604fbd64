package transport

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// A message stream is a stream kept open from one node to a peer that carries one-way
// messages of one operation, in order, each as a frame of kind kindGroupStream whose
// code is the operation. The opener's first frame (no payload) names the operation and
// waits for the peer's answer: CodeOK, or a refusal (CodeUnknownKind from a node
// older than message streams, CodeUnknownOp when nothing is registered for the
// operation, CodeBusy past MaxRaftStreams). After that no answer ever comes back: a
// message costs one frame written on a stream already open, where a Call opens a stream,
// writes, waits for the answer and frees the stream (about half the CPU, see
// BenchmarkMessageStream). The receiver hands the messages to the operation's
// MessageHandler one at a time, in the order they were sent.

// MessageHandler serves one message of a message stream. peerNodeID is the sender.
// Messages of one stream arrive in order, and the next waits until this returns. An
// error is logged (rate-limited) and the stream goes on: the framing is intact, so only
// that message is lost.
type MessageHandler func(peerNodeID string, msg []byte) error

// HandleMessages registers h for the message streams of op, replacing any earlier
// handler. It may be called before or after Start.
func (n *Node) HandleMessages(op uint16, h MessageHandler) {
	n.hmu.Lock()
	defer n.hmu.Unlock()
	n.msgHandlers[op] = h
}

func (n *Node) messageHandler(op uint16) MessageHandler {
	n.hmu.RLock()
	defer n.hmu.RUnlock()
	return n.msgHandlers[op]
}

// MessageStream is the sending end of a message stream. It is not safe for
// concurrent Sends; one goroutine owns it.
type MessageStream struct {
	n    *Node
	pc   *peerConn
	st   *quic.Stream
	addr string
	buf  []byte
	once sync.Once
}

// OpenMessages opens a message stream for op to the node at peerAddr, over the
// existing connection when there is one, and waits for the peer to accept it. Errors
// match those of Call; a peer that does not serve message streams, or not this
// operation, answers ErrUnknownKind or ErrUnknownOp, and the caller falls back to
// Call.
func (n *Node) OpenMessages(ctx context.Context, peerAddr string, op uint16) (*MessageStream, error) {
	ctx, cancel := n.callContext(ctx)
	defer cancel()
	pc, st, err := n.openAccepted(ctx, peerAddr, header{version: frameVersion, kind: kindGroupStream, code: op})
	if err != nil {
		return nil, err
	}
	n.stats.msgStreams.Add(1)
	return &MessageStream{n: n, pc: pc, st: st, addr: peerAddr}, nil
}

// openAccepted opens a stream to peerAddr whose first frame is open (no payload) and
// waits for the peer to accept it: a raft stream or a message stream. On success the
// stream has no deadline and belongs to the caller; on failure it is reset.
func (n *Node) openAccepted(ctx context.Context, peerAddr string, open header) (*peerConn, *quic.Stream, error) {
	pc, err := n.conn(ctx, peerAddr)
	if err != nil {
		return nil, nil, err
	}
	st, err := pc.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, nil, streamError(ctx, peerAddr, err)
	}
	fail := func(err error) (*peerConn, *quic.Stream, error) {
		st.CancelRead(streamCodeRefused)
		st.CancelWrite(streamCodeRefused)
		return nil, nil, err
	}
	// An explicit cancel (not a deadline) must also unblock the reads below.
	stop := context.AfterFunc(ctx, func() {
		st.CancelRead(streamCodeDone)
		st.CancelWrite(streamCodeDone)
	})
	defer stop()
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if _, err := st.Write(appendFrame(nil, open, nil)); err != nil {
		return fail(streamError(ctx, peerAddr, err))
	}
	h, err := readHeader(st)
	if err != nil {
		if errors.Is(err, ErrUnsupportedVersion) || errors.Is(err, ErrBadFrame) {
			return fail(err)
		}
		return fail(streamError(ctx, peerAddr, err))
	}
	msg, err := readPayload(st, h, maxErrorMessage)
	if err != nil {
		return fail(streamError(ctx, peerAddr, err))
	}
	if h.kind != kindResponse {
		return fail(fmt.Errorf("%w: answer of kind %d", ErrBadFrame, h.kind))
	}
	if h.code != CodeOK {
		return fail(&RemoteError{Code: h.code, Message: string(msg)})
	}
	if !stop() {
		return fail(ctxError(ctx, peerAddr)) // the context ended as the answer came
	}
	_ = st.SetDeadline(time.Time{})
	return pc, st, nil
}

// Send writes msg as the stream's next message, waiting at most timeout for the
// peer's flow control to take it. A nil error means the message is on its way, not
// that it arrived: a message is lost if the connection dies before the peer reads it.
// After an error the stream is broken: Close it and open another.
func (s *MessageStream) Send(msg []byte, timeout time.Duration) error {
	if uint64(len(msg)) > uint64(s.n.opts.MaxFrameSize) {
		return fmt.Errorf("%w: message of %d bytes, at most %d are sent", ErrFrameTooLarge, len(msg), s.n.opts.MaxFrameSize)
	}
	s.buf = appendFrame(s.buf[:0], header{version: frameVersion, kind: kindGroupStream}, msg)
	_ = s.st.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := s.st.Write(s.buf); err != nil {
		return streamError(context.Background(), s.addr, err)
	}
	return nil
}

// Alive reports whether the stream's connection is still up.
func (s *MessageStream) Alive() bool { return s.pc.alive() }

// Close ends the stream; the peer's reader sees it end.
func (s *MessageStream) Close() {
	s.once.Do(func() {
		s.st.CancelRead(streamCodeDone)
		_ = s.st.Close()
		s.n.stats.msgStreams.Add(-1)
	})
}

// serveMessages accepts a message stream a peer opened and hands its messages to the
// operation's handler until the stream or its connection ends.
func (n *Node) serveMessages(pc *peerConn, st *quic.Stream, h header) {
	hd := n.messageHandler(h.code)
	if hd == nil {
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeUnknownOp, fmt.Appendf(nil, "operation %d has no message streams on this node", h.code))
		return
	}
	if h.length != 0 {
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeBadFrame, []byte("a message stream's first frame has no payload"))
		return
	}
	if int(pc.msgStreams.Add(1)) > n.opts.MaxRaftStreams {
		pc.msgStreams.Add(-1)
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeBusy, fmt.Appendf(nil, "%d message streams already open on this connection", n.opts.MaxRaftStreams))
		return
	}
	defer pc.msgStreams.Add(-1)
	n.stats.msgStreams.Add(1)
	defer n.stats.msgStreams.Add(-1)
	n.respond(st, CodeOK, nil)
	// From here the stream stays open for as long as the sender keeps it.
	_ = st.SetReadDeadline(time.Time{})
	for {
		fh, err := readHeader(st)
		if err != nil {
			return // the sender closed the stream, or the connection ended
		}
		if fh.kind != kindGroupStream || fh.code != 0 {
			n.stats.requestsRefused.Add(1)
			n.msgLog.Warn("node-plane message stream: a frame of another kind; the stream is reset",
				"peer", pc.peerID, "kind", fh.kind, "code", fh.code)
			st.CancelRead(streamCodeRefused)
			return
		}
		msg, err := readPayload(st, fh, n.opts.MaxFrameSize)
		if err != nil {
			if errors.Is(err, ErrFrameTooLarge) {
				n.stats.requestsRefused.Add(1)
				n.msgLog.Warn("node-plane message stream: a message larger than this node accepts; the stream is reset",
					"peer", pc.peerID, "op", h.code, "err", err)
				st.CancelRead(streamCodeRefused)
			}
			return
		}
		n.stats.messagesServed.Add(1)
		if err := n.runMessageHandler(hd, pc.peerID, h.code, msg); err != nil {
			n.msgLog.Warn("node-plane message refused by its handler", "peer", pc.peerID, "op", h.code, "err", err)
		}
	}
}

func (n *Node) runMessageHandler(hd MessageHandler, peer string, op uint16, msg []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			n.log.Error("node-plane message handler panicked", "op", op, "peer", peer, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler for operation %d failed", op)
		}
	}()
	return hd(peer, msg)
}
