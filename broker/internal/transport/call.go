package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/quic-go/quic-go"
)

// dialState is the reconnect state of one peer address: at most one dial in flight,
// and after a failure no new dial before the backoff has passed.
type dialState struct {
	inflight *dialAttempt // the dial in flight, or nil
	next     time.Time    // no dial before this
	lastErr  error
	b        *backoff.ExponentialBackOff
}

// dialAttempt is one dial that callers wait on together.
type dialAttempt struct {
	done chan struct{} // closed when the dial ends
	err  error         // set before done is closed
}

func (n *Node) newBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = n.opts.MinRedialBackoff
	b.MaxInterval = n.opts.MaxRedialBackoff
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// conn returns an authenticated connection to addr: the one in use, one the peer
// opened to this node, or a new one. Concurrent callers share one dial; after a failed
// dial, callers whose deadline ends before the backoff does fail at once.
func (n *Node) conn(ctx context.Context, addr string) (*peerConn, error) {
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return nil, ErrClosed
		}
		if !n.started {
			n.mu.Unlock()
			return nil, errors.New("transport: node not started")
		}
		if pc := n.conns[addr]; pc != nil && pc.alive() {
			n.mu.Unlock()
			return pc, nil
		}
		d := n.dials[addr]
		if d == nil {
			d = &dialState{b: n.newBackoff()}
			n.dials[addr] = d
		}
		if a := d.inflight; a != nil {
			n.mu.Unlock()
			select {
			case <-a.done:
				if a.err != nil {
					return nil, a.err
				}
				continue
			case <-ctx.Done():
				return nil, ctxError(ctx, addr)
			}
		}
		if wait := time.Until(d.next); wait > 0 {
			lastErr := d.lastErr
			next := d.next
			n.mu.Unlock()
			if dl, ok := ctx.Deadline(); ok && dl.Before(next) {
				if errors.Is(lastErr, ErrPeerUnavailable) {
					return nil, fmt.Errorf("waiting to reconnect: %w", lastErr)
				}
				return nil, fmt.Errorf("%w: waiting to reconnect: %w", ErrPeerUnavailable, lastErr)
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return nil, ctxError(ctx, addr)
			}
		}
		d.inflight = &dialAttempt{done: make(chan struct{})}
		n.mu.Unlock()

		// The dial has its own deadline, not the caller's: a caller in a hurry must not
		// abort a dial that others will want, nor count as the peer's failure.
		go n.dialAndAdopt(addr, d, d.inflight)
	}
}

func (n *Node) dialAndAdopt(addr string, d *dialState, a *dialAttempt) {
	pc, err := n.dial(addr)
	if err == nil {
		pc = n.adopt(pc)
		if pc == nil {
			err = ErrClosed
		}
	}
	n.mu.Lock()
	d.inflight = nil
	a.err = err
	if err != nil {
		d.lastErr = err
		d.next = time.Now().Add(d.b.NextBackOff())
	} else {
		d.b.Reset()
		d.lastErr = nil
		d.next = time.Time{}
		// A connection registered under the peer's advertised address may differ from
		// the address dialed; make sure callers of this address find it.
		if cur := n.conns[addr]; cur == nil || !cur.alive() {
			n.conns[addr] = pc
		}
	}
	n.mu.Unlock()
	close(a.done)
}

// dial opens a QUIC connection and runs the client handshake on it.
func (n *Node) dial(addr string) (*peerConn, error) {
	n.stats.dials.Add(1)
	pc, err := n.dialOnce(addr)
	if err != nil {
		n.stats.dialFailures.Add(1)
		if errors.Is(err, ErrUnauthenticated) {
			n.stats.authFailures.Add(1)
			n.authLog.Warn("node-plane handshake failed", "remote", addr, "err", err)
		}
	}
	return pc, err
}

func (n *Node) dialOnce(addr string) (*peerConn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, 2*n.opts.HandshakeTimeout)
	defer cancel()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: resolving %q: %v", ErrPeerUnavailable, addr, err)
	}
	qc, err := n.tr.Dial(ctx, ua, n.tlsClient, n.qconf)
	if err != nil {
		return nil, fmt.Errorf("%w: connecting to %s: %v", ErrPeerUnavailable, addr, err)
	}
	pc, err := n.clientHandshake(ctx, qc, addr)
	if err != nil {
		var ae *quic.ApplicationError
		switch {
		case errors.As(err, &ae) && ae.Remote && ae.ErrorCode == connCodeUnauthenticated:
			err = fmt.Errorf("%w: the peer at %s rejected this node's proof", ErrUnauthenticated, addr)
		case errors.As(err, &ae) && ae.Remote && ae.ErrorCode == connCodeVersion:
			err = fmt.Errorf("%w: the peer at %s speaks another handshake version", ErrUnsupportedVersion, addr)
		case errors.As(err, &ae) && ae.Remote && ae.ErrorCode == connCodeRefused:
			err = fmt.Errorf("%w: the peer at %s refused the connection: %s", ErrPeerUnavailable, addr, ae.ErrorMessage)
		case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrUnsupportedVersion), errors.Is(err, ErrPeerUnavailable):
		default:
			err = fmt.Errorf("%w: handshake with %s: %v", ErrPeerUnavailable, addr, err)
		}
		code := connCodeHandshake
		if errors.Is(err, ErrUnauthenticated) {
			code = connCodeUnauthenticated
		}
		_ = qc.CloseWithError(code, "handshake failed")
		return nil, err
	}
	return pc, nil
}

// Call sends req to the node at peerAddr as operation op and waits for the answer. The
// deadline is ctx's, or Options.CallTimeout when ctx has none, and never more than
// Options.MaxCallTimeout. Errors match (errors.Is) ErrTimeout, ErrPeerUnavailable,
// ErrUnauthenticated, ErrFrameTooLarge, ErrClosed, or a *RemoteError's sentinel
// (ErrUnknownOp, ErrBusy, ErrRemote...).
func (n *Node) Call(ctx context.Context, peerAddr string, op uint16, req []byte) ([]byte, error) {
	if uint64(len(req)) > uint64(n.opts.MaxFrameSize) {
		return nil, fmt.Errorf("%w: request of %d bytes, at most %d are sent", ErrFrameTooLarge, len(req), n.opts.MaxFrameSize)
	}
	ctx, cancel := n.callContext(ctx)
	defer cancel()
	pc, err := n.conn(ctx, peerAddr)
	if err != nil {
		return nil, notSent(err)
	}
	pc.calls.Add(1)
	defer pc.calls.Add(-1)

	st, err := pc.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, notSent(streamError(ctx, peerAddr, err))
	}
	// Both halves must end, or the stream is never freed: Close ends only ours.
	defer st.CancelRead(streamCodeDone)
	defer func() { _ = st.Close() }() // the call's result is decided; the stream is freed either way
	// An explicit cancel (not a deadline) must also unblock the reads below.
	stop := context.AfterFunc(ctx, func() {
		st.CancelRead(streamCodeDone)
		st.CancelWrite(streamCodeDone)
	})
	defer stop()
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)

	h := header{version: frameVersion, kind: kindRequest, code: op, timeoutMS: remainingMS(deadline)}
	if _, err := st.Write(appendFrame(nil, h, req)); err != nil {
		return nil, streamError(ctx, peerAddr, err)
	}
	// The peer may have read the whole request and stopped its reading half before
	// this FIN goes out, which makes Close fail; the answer below is what counts.
	_ = st.Close()
	rh, err := readHeader(st)
	if err != nil {
		if errors.Is(err, ErrUnsupportedVersion) || errors.Is(err, ErrBadFrame) {
			return nil, err
		}
		return nil, streamError(ctx, peerAddr, err)
	}
	if rh.kind != kindResponse {
		return nil, fmt.Errorf("%w: answer of kind %d", ErrBadFrame, rh.kind)
	}
	resp, err := readPayload(st, rh, n.opts.MaxFrameSize)
	if err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			return nil, err
		}
		return nil, streamError(ctx, peerAddr, err)
	}
	if rh.code != CodeOK {
		return nil, &RemoteError{Code: rh.code, Message: string(resp)}
	}
	return resp, nil
}

// notSent marks err as a failure before anything of the request was sent.
func notSent(err error) error { return &notSentError{err} }

type notSentError struct{ err error }

func (e *notSentError) Error() string   { return e.err.Error() }
func (e *notSentError) Unwrap() []error { return []error{e.err, ErrNotSent} }

// callContext applies the default and the maximum deadline.
func (n *Node) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	limit := time.Now().Add(n.opts.MaxCallTimeout)
	dl, ok := ctx.Deadline()
	switch {
	case !ok:
		return context.WithTimeout(ctx, n.opts.CallTimeout)
	case dl.After(limit):
		return context.WithDeadline(ctx, limit)
	}
	return context.WithCancel(ctx)
}

func remainingMS(deadline time.Time) uint32 {
	ms := time.Until(deadline).Milliseconds()
	if ms < 1 {
		return 1
	}
	if ms > int64(^uint32(0)) {
		return ^uint32(0)
	}
	return uint32(ms)
}

// ctxError names why the context ended.
func ctxError(ctx context.Context, addr string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: no answer from %s in time", ErrTimeout, addr)
	}
	return fmt.Errorf("transport: call to %s: %w", addr, ctx.Err())
}

// streamError classifies a failure on a call's stream: the connection is gone
// (ErrPeerUnavailable), the deadline passed (ErrTimeout), or the caller cancelled.
func streamError(ctx context.Context, addr string, err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote && ae.ErrorCode == connCodeShutdown {
		return fmt.Errorf("%w: %s is shutting down", ErrPeerUnavailable, addr)
	}
	if errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("%w: connection to %s lost: %v", ErrPeerUnavailable, addr, err)
	}
	if ctx.Err() != nil {
		return ctxError(ctx, addr)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: no answer from %s in time", ErrTimeout, addr)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s closed the stream without an answer", ErrPeerUnavailable, addr)
	}
	var se *quic.StreamError
	if errors.As(err, &se) {
		return fmt.Errorf("%w: %s reset the stream: %v", ErrPeerUnavailable, addr, err)
	}
	return fmt.Errorf("%w: %s: %v", ErrPeerUnavailable, addr, err)
}
