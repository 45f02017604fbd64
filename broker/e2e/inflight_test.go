package e2e

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMaxInflightBytes: with --max-inflight-bytes of 2 MiB, two 1 MiB produce bodies
// still arriving hold the budget; a third produce is refused with 503 overloaded and
// Retry-After without being read; the two are stored once their bodies arrive, and the
// bytes they held come back, so the next produce is stored.
func TestMaxInflightBytes(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	n, a := startBroker(t, "--max-inflight-bytes", strconv.Itoa(2*mib))
	a.createTopic("t", map[string]any{"partitions": 1})
	host := strings.TrimPrefix(n.URL(), "http://")
	body := bytes.Repeat([]byte{'x'}, mib)

	// Two produces whose bodies stop after their first KiB.
	conns := make([]net.Conn, 2)
	for i := range conns {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		head := "POST /v1/topics/t/produce HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/octet-stream\r\nContent-Length: " + strconv.Itoa(mib) + "\r\n\r\n"
		if _, err := c.Write(append([]byte(head), body[:1024]...)); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	waitFor(t, 30*time.Second, "2 MiB of bodies held", func() bool {
		v, ok := metricValue(a, "narad_http_body_bytes_in_flight")
		return ok && v == 2*mib
	})

	r := a.Do(http.MethodPost, "/v1/topics/t/produce", body, "Content-Type", "application/octet-stream")
	r.ExpectError(t, http.StatusServiceUnavailable, "overloaded")
	if r.Header.Get("Retry-After") == "" {
		t.Errorf("503 overloaded without Retry-After")
	}
	if v, _ := metricValue(a, "narad_http_overloaded_total"); v != 1 {
		t.Errorf("narad_http_overloaded_total %v, want 1", v)
	}

	// The rest of the two bodies: both are stored.
	for i, c := range conns {
		if _, err := c.Write(body[1024:]); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("held produce %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Errorf("held produce %d: status %d, want 202", i, resp.StatusCode)
		}
	}
	waitFor(t, 30*time.Second, "the held bytes given back", func() bool {
		v, ok := metricValue(a, "narad_http_body_bytes_in_flight")
		return ok && v == 0
	})
	a.produce("t", body, "application/octet-stream", "")
	if st := a.topic("t").PartitionStats[0]; st.NextOffset != 3 {
		t.Errorf("topic holds %d messages, want 3 (the refused one not among them)", st.NextOffset)
	}
}
