package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// Application error codes in a QUIC CONNECTION_CLOSE.
const (
	connCodeShutdown        quic.ApplicationErrorCode = 0
	connCodeUnauthenticated quic.ApplicationErrorCode = 1
	connCodeRefused         quic.ApplicationErrorCode = 2
	connCodeHandshake       quic.ApplicationErrorCode = 3
	connCodeDuplicate       quic.ApplicationErrorCode = 4
	connCodeVersion         quic.ApplicationErrorCode = 5
)

// Stream error codes in RESET_STREAM and STOP_SENDING.
const (
	streamCodeDone    quic.StreamErrorCode = 0
	streamCodeRefused quic.StreamErrorCode = 1
)

// peerConn is one authenticated connection to a peer, whichever side dialed.
type peerConn struct {
	qc       *quic.Conn
	peerID   string
	peerAddr string
	// dialed is true when this node opened the connection.
	dialed bool
	// reqs holds a token per request in a handler; its capacity is the limit.
	reqs chan struct{}
	// raftStreams counts the raft streams the peer opened on this connection.
	raftStreams atomic.Int32
	// msgStreams counts the message streams the peer opened on this connection.
	msgStreams atomic.Int32
	// calls counts this node's calls in flight on the connection, so a duplicate
	// connection is closed only once it is idle.
	calls atomic.Int64
}

func (n *Node) newPeerConn(qc *quic.Conn, peerID, peerAddr string, dialed bool) *peerConn {
	return &peerConn{qc: qc, peerID: peerID, peerAddr: peerAddr, dialed: dialed,
		reqs: make(chan struct{}, n.opts.MaxConcurrentRequests)}
}

func (pc *peerConn) alive() bool { return pc.qc.Context().Err() == nil }

// acceptLoop accepts connections and runs each one's secret handshake, with at most
// MaxPendingHandshakes in progress, and at most a quarter of them from one host: a host
// that opens connections and says nothing, as fast as they time out, must not hold
// every slot while a member on another host (one that restarted, say) connects.
func (n *Node) acceptLoop() {
	defer n.wg.Done()
	perHost := max(1, n.opts.MaxPendingHandshakes/4)
	for {
		qc, err := n.ln.Accept(n.ctx)
		if err != nil {
			return
		}
		host := remoteHost(qc.RemoteAddr())
		if !n.takeHandshakeSlot(host, perHost) {
			n.stats.handshakesRefused.Add(1)
			n.authLog.Warn("node-plane handshake refused: too many in progress",
				"remote", qc.RemoteAddr().String(), "limit", n.opts.MaxPendingHandshakes, "per_host", perHost)
			_ = qc.CloseWithError(connCodeRefused, "too many handshakes in progress")
			continue
		}
		go func() {
			pc, err := n.serverHandshake(qc)
			n.releaseHandshakeSlot(host)
			if err != nil {
				n.handshakeFailed(qc, err)
				return
			}
			n.adopt(pc)
		}()
	}
}

// takeHandshakeSlot takes one of the MaxPendingHandshakes slots for a connection from
// host, unless they are all taken or host holds perHost of them already.
func (n *Node) takeHandshakeSlot(host string, perHost int) bool {
	n.pendingMu.Lock()
	defer n.pendingMu.Unlock()
	if n.pending[host] >= perHost {
		return false
	}
	select {
	case n.handshakes <- struct{}{}:
	default:
		return false
	}
	n.pending[host]++
	return true
}

func (n *Node) releaseHandshakeSlot(host string) {
	n.pendingMu.Lock()
	defer n.pendingMu.Unlock()
	<-n.handshakes
	if n.pending[host]--; n.pending[host] <= 0 {
		delete(n.pending, host)
	}
}

// remoteHost is the host a connection came from: its IPv4 address, or the /64 of its
// IPv6 address (a host is commonly given a whole /64). The port is left out: one host
// has as many as it likes.
func remoteHost(a net.Addr) string {
	if ua, ok := a.(*net.UDPAddr); ok {
		if v4 := ua.IP.To4(); v4 != nil {
			return v4.String()
		}
		return ua.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// handshakeFailed counts, logs and closes a connection whose handshake failed.
func (n *Node) handshakeFailed(qc *quic.Conn, err error) {
	code := connCodeHandshake
	switch {
	case errors.Is(err, ErrUnauthenticated):
		n.stats.authFailures.Add(1)
		code = connCodeUnauthenticated
	case errors.Is(err, ErrUnsupportedVersion):
		n.stats.handshakeErrors.Add(1)
		code = connCodeVersion
	default:
		n.stats.handshakeErrors.Add(1)
	}
	n.authLog.Warn("node-plane handshake failed", "remote", qc.RemoteAddr().String(), "err", err)
	_ = qc.CloseWithError(code, "handshake failed")
}

// serverHandshake runs the server side of the secret handshake on the first stream the
// client opens. Nothing else on the connection is accepted until it succeeds.
func (n *Node) serverHandshake(qc *quic.Conn) (*peerConn, error) {
	deadline := time.Now().Add(n.opts.HandshakeTimeout)
	ctx, cancel := context.WithDeadline(n.ctx, deadline)
	defer cancel()
	st, err := qc.AcceptStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("waiting for the hello: %w", err)
	}
	defer st.CancelRead(streamCodeDone)
	defer func() { _ = st.Close() }() // the handshake's result is decided; the stream is freed either way
	_ = st.SetDeadline(deadline)

	h, err := readHello(st)
	if errors.Is(err, ErrUnsupportedVersion) {
		refuse(qc, st, hsBadVersion, handshakeVersion)
		return nil, err
	}
	if err != nil {
		refuse(qc, st, hsMalformed)
		return nil, fmt.Errorf("reading the hello: %w", err)
	}
	if h.nodeID == n.opts.NodeID {
		refuse(qc, st, hsSameNodeID)
		return nil, fmt.Errorf("%w: a peer claims this node's id %q", ErrUnauthenticated, h.nodeID)
	}
	exporter, err := exportKeyingMaterial(qc)
	if err != nil {
		return nil, fmt.Errorf("TLS exporter: %w", err)
	}
	nonce, err := newNonce()
	if err != nil {
		return nil, err
	}
	secrets := n.currentSecrets()
	ids := handshakeIDs(h.nodeID, h.advertised, n.opts.NodeID)
	c := challenge{nonce: nonce, nodeID: n.opts.NodeID}
	for _, s := range secrets {
		c.proofs = append(c.proofs, proof(s, macLabelServer, exporter, h.nonce, nonce, ids))
	}
	if _, err := st.Write(encodeChallenge(c)); err != nil {
		return nil, fmt.Errorf("writing the challenge: %w", err)
	}
	var got [macLen]byte
	if _, err := io.ReadFull(st, got[:]); err != nil {
		return nil, fmt.Errorf("%w: node %q sent no proof: %v", ErrUnauthenticated, h.nodeID, err)
	}
	if matchProof(secrets, [][macLen]byte{got}, macLabelClient, exporter, nonce, h.nonce, ids) < 0 {
		refuse(qc, st, hsDenied)
		return nil, fmt.Errorf("%w: node %q proved no secret this node holds", ErrUnauthenticated, h.nodeID)
	}
	if _, err := st.Write([]byte{hsOK}); err != nil {
		return nil, fmt.Errorf("writing the verdict: %w", err)
	}
	return n.newPeerConn(qc, h.nodeID, h.advertised, false), nil
}

// refuse answers a failed handshake with a status and gives it a moment to reach the
// client before the connection is closed, since closing drops unsent stream data: a
// client learns why (old version, wrong secret) instead of only that it failed.
func refuse(qc *quic.Conn, st *quic.Stream, status ...byte) {
	if _, err := st.Write(status); err != nil {
		return
	}
	_ = st.Close()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-qc.Context().Done():
	case <-t.C:
	}
}

// clientHandshake runs the client side on a fresh connection.
func (n *Node) clientHandshake(ctx context.Context, qc *quic.Conn, addr string) (*peerConn, error) {
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening the handshake stream: %w", err)
	}
	defer st.CancelRead(streamCodeDone)
	defer func() { _ = st.Close() }() // the handshake's result is decided; the stream is freed either way
	if d, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(d)
	}
	nonce, err := newNonce()
	if err != nil {
		return nil, err
	}
	advertised := n.Addr()
	if _, err := st.Write(encodeHello(hello{version: handshakeVersion, nonce: nonce, nodeID: n.opts.NodeID, advertised: advertised})); err != nil {
		return nil, fmt.Errorf("writing the hello: %w", err)
	}
	c, err := readChallenge(st)
	if err != nil {
		return nil, fmt.Errorf("reading the challenge: %w", err)
	}
	exporter, err := exportKeyingMaterial(qc)
	if err != nil {
		return nil, fmt.Errorf("TLS exporter: %w", err)
	}
	secrets := n.currentSecrets()
	ids := handshakeIDs(n.opts.NodeID, advertised, c.nodeID)
	i := matchProof(secrets, c.proofs, macLabelServer, exporter, nonce, c.nonce, ids)
	if i < 0 {
		return nil, fmt.Errorf("%w: the server at %s (node %q) proved no secret this node holds", ErrUnauthenticated, addr, c.nodeID)
	}
	p := proof(secrets[i], macLabelClient, exporter, c.nonce, nonce, ids)
	if _, err := st.Write(p[:]); err != nil {
		return nil, fmt.Errorf("writing the proof: %w", err)
	}
	var v [1]byte
	if _, err := io.ReadFull(st, v[:]); err != nil {
		return nil, fmt.Errorf("reading the verdict: %w", err)
	}
	if err := statusError(v[0], st); err != nil {
		return nil, err
	}
	return n.newPeerConn(qc, c.nodeID, addr, true), nil
}

// adopt registers an authenticated connection and serves the streams the peer opens
// on it. When both nodes dialed each other at once, the connection dialed by the node
// with the smaller id wins on both sides; the other is retired once idle.
func (n *Node) adopt(pc *peerConn) *peerConn {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		_ = pc.qc.CloseWithError(connCodeShutdown, "node shutting down")
		return nil
	}
	n.live[pc] = struct{}{}
	winner := pc
	if old := n.conns[pc.peerAddr]; old != nil && old.alive() && pc.peerAddr != "" {
		if n.dialerID(old) < n.dialerID(pc) {
			winner = old
		}
		loser := old
		if winner == old {
			loser = pc
		}
		go n.retire(loser)
	}
	if pc.peerAddr != "" {
		n.conns[pc.peerAddr] = winner
	}
	// Added under the lock that Close takes to set closed, so Close's Wait sees it.
	n.wg.Add(1)
	n.mu.Unlock()

	go n.serve(pc)
	return winner
}

func (n *Node) dialerID(pc *peerConn) string {
	if pc.dialed {
		return n.opts.NodeID
	}
	return pc.peerID
}

// retire ends a duplicate connection. Both nodes stop starting calls on it at once;
// only its dialer closes it, and only after every call that either side may have
// started on it before retiring it has had its whole deadline, and its own calls and
// the requests in its handlers are done. Until then the duplicate costs only memory.
func (n *Node) retire(pc *peerConn) {
	if !pc.dialed {
		return
	}
	grace := time.NewTimer(n.opts.MaxCallTimeout + n.opts.HandshakeTimeout)
	defer grace.Stop()
	select {
	case <-grace.C:
	case <-pc.qc.Context().Done():
		return
	}
	deadline := time.Now().Add(n.opts.MaxCallTimeout)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for (pc.calls.Load() > 0 || len(pc.reqs) > 0) && time.Now().Before(deadline) {
		select {
		case <-t.C:
		case <-pc.qc.Context().Done():
			return
		}
	}
	_ = pc.qc.CloseWithError(connCodeDuplicate, "duplicate connection")
}

// serve accepts the streams the peer opens until the connection closes.
func (n *Node) serve(pc *peerConn) {
	defer n.wg.Done()
	defer func() {
		n.mu.Lock()
		delete(n.live, pc)
		if n.conns[pc.peerAddr] == pc {
			delete(n.conns, pc.peerAddr)
		}
		n.mu.Unlock()
	}()
	for {
		st, err := pc.qc.AcceptStream(n.ctx)
		if err != nil {
			return
		}
		go n.serveStream(pc, st)
	}
}

// serveStream reads a stream's first frame and serves it by kind.
func (n *Node) serveStream(pc *peerConn, st *quic.Stream) {
	handedOff := false
	defer func() {
		if !handedOff {
			st.CancelRead(streamCodeDone)
			_ = st.Close()
		}
	}()
	_ = st.SetReadDeadline(time.Now().Add(n.opts.HandshakeTimeout))
	h, err := readHeader(st)
	if err != nil {
		n.stats.requestsRefused.Add(1)
		switch {
		case errors.Is(err, ErrUnsupportedVersion):
			n.respond(st, CodeUnsupportedVersion, []byte(err.Error()))
		case errors.Is(err, ErrBadFrame):
			n.respond(st, CodeBadFrame, []byte(err.Error()))
		}
		return
	}
	switch h.kind {
	case kindRequest:
		n.serveRequest(pc, st, h)
	case kindRaftStream:
		handedOff = n.raft.deliver(pc, st)
	case kindGroupStream:
		n.serveMessages(pc, st, h)
	default:
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeUnknownKind, fmt.Appendf(nil, "stream kind %d is not served by this node", h.kind))
	}
}

func (n *Node) serveRequest(pc *peerConn, st *quic.Stream, h header) {
	if h.length > n.opts.MaxFrameSize {
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeFrameTooLarge, fmt.Appendf(nil, "request of %d bytes, this node accepts at most %d", h.length, n.opts.MaxFrameSize))
		return
	}
	select {
	case pc.reqs <- struct{}{}:
		defer func() { <-pc.reqs }()
	default:
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeBusy, fmt.Appendf(nil, "%d requests already in progress on this connection", cap(pc.reqs)))
		return
	}
	timeout := time.Duration(h.timeoutMS) * time.Millisecond
	if timeout <= 0 || timeout > n.opts.MaxCallTimeout {
		timeout = n.opts.MaxCallTimeout
	}
	_ = st.SetReadDeadline(time.Now().Add(timeout))
	req, err := readPayload(st, h, n.opts.MaxFrameSize)
	if err != nil {
		return
	}
	hd := n.handler(h.code)
	if hd == nil {
		n.stats.requestsRefused.Add(1)
		n.respond(st, CodeUnknownOp, fmt.Appendf(nil, "operation %d is not served by this node", h.code))
		return
	}
	n.stats.requestsServed.Add(1)
	ctx, cancel := context.WithTimeout(pc.qc.Context(), timeout)
	defer cancel()
	// A caller that stops waiting (its deadline, a cancel) stops reading the stream,
	// which ends our writing half: the handler's context ends with it, as an HTTP
	// request's does when its client goes, so work done for nobody can be undone (a
	// lease taken for a consume that was cut is handed back).
	stop := context.AfterFunc(st.Context(), cancel)
	defer stop()
	resp, err := n.runHandler(ctx, hd, pc.peerID, h.code, req)
	_ = st.SetWriteDeadline(time.Now().Add(timeout))
	if err != nil {
		code, msg := errorCode(err)
		n.respond(st, code, []byte(truncateMessage(msg)))
		return
	}
	if uint32(len(resp)) > n.opts.MaxFrameSize || uint64(len(resp)) > uint64(^uint32(0)) {
		n.respond(st, CodeFrameTooLarge, fmt.Appendf(nil, "response of %d bytes, at most %d are sent", len(resp), n.opts.MaxFrameSize))
		return
	}
	n.respond(st, CodeOK, resp)
}

// runHandler runs a handler, turning a panic into an error answer so one bad request
// cannot take the node down.
func (n *Node) runHandler(ctx context.Context, hd Handler, peer string, op uint16, req []byte) (resp []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			n.log.Error("node-plane handler panicked", "op", op, "peer", peer, "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, &RemoteError{Code: CodeHandler, Message: fmt.Sprintf("handler for operation %d failed", op)}
		}
	}()
	return hd(ctx, peer, req)
}

// respond writes one response frame; failures mean the caller went away.
func (n *Node) respond(st *quic.Stream, code uint16, payload []byte) {
	if code != CodeOK {
		payload = []byte(truncateMessage(string(payload)))
	}
	_, _ = st.Write(appendFrame(nil, header{version: frameVersion, kind: kindResponse, code: code}, payload))
}

// exportKeyingMaterial derives the 32 bytes both ends of this TLS session share and
// no relay between two sessions can know.
func exportKeyingMaterial(qc *quic.Conn) ([]byte, error) {
	cs := qc.ConnectionState().TLS
	return cs.ExportKeyingMaterial(exporterLabel, nil, macLen)
}
