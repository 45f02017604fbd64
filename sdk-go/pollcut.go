package narad

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
)

// A Consumer's shutdown must not drop an answer the broker already gave to its long
// poll: that answer leased messages, and a poll ended by closing its connection leaves
// them leased to nobody until their visibility timeout. So a Consumer's polls go
// through connections of their own, and its shutdown half-closes the connection of the
// poll in flight (CloseWrite). The broker takes the end of the request stream for the
// client gone: a poll still waiting ends at once with a 499 and leases nothing, and an
// answer already sent arrives as usual. The client reads that answer (for up to
// answerGrace) and the Consumer hands back what it leased. The half-closed connection
// is never used again: the connections are the Consumer's Run's alone, no poll follows
// its shutdown, and they are closed when Run returns.

// pollClient returns an http.Client for one Consumer run's polls: a clone of the
// client's transport, HTTP/1.1 only (a half-close would end an HTTP/2 connection with
// all its streams), whose connections nothing else uses. It returns nil when the
// client's transport is not an *http.Transport (a caller's RoundTripper that wraps
// one): the polls then go through it, and a shutdown cancels a poll whose answer has
// not begun to arrive, as any request.
func (c *Client) pollClient() (*http.Client, *http.Transport) {
	var base *http.Transport
	switch rt := c.hc.Transport.(type) {
	case nil:
		base, _ = http.DefaultTransport.(*http.Transport)
	case *http.Transport:
		base = rt
	}
	if base == nil {
		return nil, nil
	}
	tr := base.Clone()
	tr.ForceAttemptHTTP2 = false
	tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	var p http.Protocols
	p.SetHTTP1(true)
	tr.Protocols = &p
	return &http.Client{Transport: tr, CheckRedirect: c.hc.CheckRedirect, Jar: c.hc.Jar, Timeout: c.hc.Timeout}, tr
}

// connCut half-closes the connection of one poll attempt when asked to, or as soon as
// the attempt has a connection if asked before that.
type connCut struct {
	mu   sync.Mutex
	conn net.Conn
	cut  bool
}

// got is the attempt's httptrace GotConn hook. A connection got after the cut is
// half-closed before the request is written: the write fails, and nothing is sent.
func (k *connCut) got(c net.Conn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.conn = c
	if k.cut {
		_ = closeWrite(c) // best effort: the attempt is cancelled besides
	}
}

// do half-closes the attempt's connection. It reports whether it did, so that an
// answer will come (or the request was never sent); when not, the caller cancels the
// attempt instead.
func (k *connCut) do() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cut = true
	return k.conn != nil && closeWrite(k.conn) == nil
}

// closeWrite shuts the write side of c: a TCP FIN, or a TLS close_notify (which leaves
// the TLS state intact, so the answer can still be read).
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
