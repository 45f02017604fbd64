package narad

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// The connections of a consumer run's polls are its own (a half-closed one must never
// serve another request) and HTTP/1.1 (a half-close would end an HTTP/2 connection
// with every stream on it); a caller's transport that cannot be cloned is used as is.
func TestPollClientOwnsItsConnections(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	hc, tr := c.pollClient()
	if hc == nil || tr == nil || hc.Transport != tr || tr == c.hc.Transport {
		t.Fatalf("poll client %v over %p; want a transport of its own (the client's is %p)", hc, tr, c.hc.Transport)
	}
	if tr.ForceAttemptHTTP2 || tr.TLSNextProto == nil || len(tr.TLSNextProto) != 0 || tr.Protocols == nil || tr.Protocols.HTTP2() || !tr.Protocols.HTTP1() {
		t.Fatalf("poll transport may speak HTTP/2: force %v, next protos %v, protocols %v", tr.ForceAttemptHTTP2, tr.TLSNextProto, tr.Protocols)
	}
	if hc2, _ := c.pollClient(); hc2.Transport == tr {
		t.Fatal("two runs share a poll transport")
	}

	type wrapped struct{ http.RoundTripper }
	w, err := New([]string{"127.0.0.1:1"}, WithHTTPClient(&http.Client{Transport: wrapped{http.DefaultTransport}}))
	if err != nil {
		t.Fatal(err)
	}
	if hc, tr := w.pollClient(); hc != nil || tr != nil {
		t.Fatal("a caller's RoundTripper was replaced for the polls")
	}
}

// A cut asked before the attempt has its connection half-closes the connection as soon
// as it comes, so the request is never sent on it.
func TestConnCutBeforeTheConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	var k connCut
	if k.do() {
		t.Fatal("a cut with no connection yet says it half-closed one")
	}
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	k.got(conn)
	var srv net.Conn
	select {
	case srv = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
	}
	defer srv.Close()
	if err := srv.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := srv.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("the server read %d bytes, %v; want the end of the stream", n, err)
	}
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err == nil {
		t.Fatal("a request could be written on the half-closed connection")
	}
	if !k.do() {
		t.Fatal("a second cut on a known connection failed")
	}
}
