package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// h2Preface is what an HTTP/2 client with prior knowledge (h2c) sends first, followed
// here by an empty SETTINGS frame: a connection that then opens no stream.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// TestH2CWithoutStreamCutOff: a connection that sends the HTTP/2 preface and then no
// request is closed within the header timeout, as an HTTP/1 client stuck in its
// headers is; before, the HTTP/2 idle timeout held it for two minutes.
func TestH2CWithoutStreamCutOff(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t, "--read-header-timeout", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, h2Preface); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conn.SetReadDeadline(start.Add(30 * time.Second))
	_, err = io.Copy(io.Discard, conn) // the server's SETTINGS, then EOF when it hangs up
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("an h2c connection without a stream was still open after %v", time.Since(start))
	}
	// A real h2c client that sends its request in time is served, and its connection
	// outlives the header timeout.
	hc := h2cClient()
	defer hc.CloseIdleConnections()
	get := func() (*http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL()+"/healthz", nil)
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	resp, err := get()
	if err != nil || resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("GET /healthz over h2c: %v %v", resp, err)
	}
	time.Sleep(1500 * time.Millisecond) // past the header timeout: time must pass here
	if resp, err := get(); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a second request on the served h2c connection: %v %v", resp, err)
	}
	a.Get("/healthz").Expect(t, http.StatusOK)
}

func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

// dialFrom opens a connection to the broker from the loopback address src (all of
// 127/8 is loopback on Linux, so each src is a distinct client address) and sends one
// GET /healthz. It reports whether the broker answered 200; the connection stays open
// (keep-alive) until the caller closes it.
func dialFrom(t *testing.T, brokerURL, src string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.Dial("tcp", strings.TrimPrefix(brokerURL, "http://"))
	if err != nil {
		t.Fatalf("dialing from %s: %v", src, err)
	}
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", strings.TrimPrefix(brokerURL, "http://"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return conn, false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	conn.SetDeadline(time.Time{})
	return conn, resp.StatusCode == http.StatusOK
}

// TestConnectionsPerAddressLimited: past --max-connections-per-address, a new
// connection from that address is closed unserved; other addresses are still served,
// and a closed connection frees its slot.
func TestConnectionsPerAddressLimited(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t, "--max-connections-per-address", "3", "--max-connections", "100")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		c, ok := dialFrom(t, n.URL(), "127.0.0.2")
		held = append(held, c)
		if !ok {
			t.Fatalf("connection %d from 127.0.0.2 was not served; the limit is 3", i+1)
		}
	}
	c, ok := dialFrom(t, n.URL(), "127.0.0.2")
	c.Close()
	if ok {
		t.Fatal("a 4th connection from 127.0.0.2 was served; the limit is 3")
	}
	c, ok = dialFrom(t, n.URL(), "127.0.0.3")
	c.Close()
	if !ok {
		t.Fatal("a connection from another address was refused")
	}
	if v, ok := metricValue(a, `narad_http_connections_refused_total{reason="max_connections_per_address"}`); !ok || v < 1 {
		t.Errorf("narad_http_connections_refused_total{reason=max_connections_per_address} = %v (%v), want at least 1", v, ok)
	}
	held[0].Close()
	held = held[1:]
	waitFor(t, 30*time.Second, "a closed connection to free its slot", func() bool {
		c, ok := dialFrom(t, n.URL(), "127.0.0.2")
		if ok {
			held = append(held, c)
		} else {
			c.Close()
		}
		return ok
	})
}

// TestConnectionsLimited: past --max-connections, a new connection is closed unserved;
// closing connections frees their slots.
func TestConnectionsLimited(t *testing.T) {
	t.Parallel()
	const limit = 6
	n, _ := startBroker(t, "--max-connections", fmt.Sprint(limit), "--max-connections-per-address", "0")
	var held []net.Conn
	closeAll := func() {
		for _, c := range held {
			c.Close()
		}
		held = nil
	}
	defer closeAll()
	refused := false
	for i := 0; i <= limit && !refused; i++ {
		c, ok := dialFrom(t, n.URL(), "127.0.0.2")
		held = append(held, c)
		refused = !ok
	}
	if !refused {
		t.Fatalf("%d connections were served; the limit is %d", limit+1, limit)
	}
	closeAll()
	waitFor(t, 30*time.Second, "closed connections to free their slots", func() bool {
		c, ok := dialFrom(t, n.URL(), "127.0.0.2")
		c.Close()
		return ok
	})
}

// TestConnectionLimitFlagsValidated: a negative limit is refused at start.
func TestConnectionLimitFlagsValidated(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--max-connections", "-1"}, {"--max-connections-per-address", "-1"}} {
		out, err := runNarad(t, append(args, "--http-addr", "127.0.0.1:0")...)
		if err == nil || !strings.Contains(out, args[0]) {
			t.Errorf("narad serve %v: err %v, output %s; want a refusal naming %s", args, err, out, args[0])
		}
	}
}

// runNarad runs `narad serve` with a fresh data directory and a clean environment and
// returns its output once it exits; one that is still running after 30 s is killed (a
// start that should have been refused).
func runNarad(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.BuildNarad(t), append([]string{"serve", "--data-dir", t.TempDir()}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("narad serve %v was still running after 30 s", args)
	}
	return string(out), err
}

// rawExchange sends raw bytes on a new connection and returns the response the broker
// writes before it hangs up.
func rawExchange(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	go io.WriteString(conn, request) // the broker may answer before it has read it all
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %.60q: %v", request, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// TestServerErrorsAreJSON: the answers net/http writes on its own, before any handler
// runs (headers too large, a malformed request), carry the API's JSON error body like
// every other error.
func TestServerErrorsAreJSON(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	a.createTopic("t", map[string]any{"partitions": 1})
	addr := strings.TrimPrefix(n.URL(), "http://")
	for _, c := range []struct {
		name, request string
		status        int
	}{
		{"headers over 64 KiB", "GET /v1/topics HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 80<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"two Content-Lengths", "POST /v1/topics/t/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", http.StatusBadRequest},
		{"unknown Transfer-Encoding", "POST /v1/topics/t/produce HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented},
		{"no Host", "GET /v1/topics HTTP/1.1\r\n\r\n", http.StatusBadRequest},
		{"malformed header line", "GET /v1/topics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", http.StatusBadRequest},
		{"unsupported protocol version", "GET /v1/topics HTTP/7.0\r\nHost: x\r\n\r\n", 0},
	} {
		resp, body := rawExchange(t, addr, c.request)
		if c.status != 0 && resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d", c.name, resp.StatusCode, c.status)
		}
		if resp.StatusCode < 400 {
			t.Errorf("%s: status %d, want an error", c.name, resp.StatusCode)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", c.name, ct)
		}
		if code, msg, err := testutil.ParseError(body); err != nil || code == "" || msg == "" {
			t.Errorf("%s: body %q is not the JSON error shape: %v", c.name, body, err)
		}
	}
	if got := a.topic("t").PartitionStats[0].NextOffset; got != 0 {
		t.Errorf("malformed produces stored %d messages", got)
	}
}
