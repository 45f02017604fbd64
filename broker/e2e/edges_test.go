package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestReplayPastEndPointsAtEnd: a replay from beyond the end of a partition answers
// the end as next_offset, so a follower does not skip messages written later.
func TestReplayPastEndPointsAtEnd(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("a", map[string]any{"partitions": 1})
	a.produceJSON("a", map[string]any{"id": "0"}, "")
	mr := a.read("a", 0, "from=50")
	if len(mr.Messages) != 0 || mr.NextOffset != 1 {
		t.Fatalf("replay from 50 of a 1-message log: %d messages, next_offset %d; want none and 1", len(mr.Messages), mr.NextOffset)
	}
	a.produceJSON("a", map[string]any{"id": "1"}, "")
	if got := a.read("a", 0, "from=1"); len(got.Messages) != 1 {
		t.Fatalf("following from next_offset found %d messages", len(got.Messages))
	}
}

// TestHandleOfAnotherTopic: a receipt handle of another live topic is a bad handle
// (400) and does not disturb its own lease.
func TestHandleOfAnotherTopic(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("a", map[string]any{"partitions": 1})
	a.createTopic("b", map[string]any{"partitions": 1})
	a.produceJSON("a", map[string]any{"id": "x"}, "")
	m := a.mustConsume("a", "5s")
	a.ack("b", m.ReceiptHandle, "").ExpectError(t, http.StatusBadRequest, "invalid_receipt_handle")
	a.mustAck("a", m)
}

// TestTimestampNotBeforeProduce: a message is never stamped before the client sent it,
// so replaying from_time = "when I started producing" finds it. (Whether one process
// could show the old 1 ms error depended on its start time, hence two processes.)
func TestTimestampNotBeforeProduce(t *testing.T) {
	t.Parallel()
	for run := 0; run < 2; run++ {
		_, a := startBroker(t)
		a.createTopic("ts", map[string]any{"partitions": 1})
		for i := 0; i < 300; i++ {
			before := time.Now().UnixMilli()
			p := a.produce("ts", []byte("x"), "text/plain", "")
			m := a.consume("ts", "partition=0&offset="+strconv.FormatInt(p.Offset, 10))
			if m == nil || m.Timestamp >= before {
				continue
			}
			mr := a.read("ts", 0, "from_time="+strconv.FormatInt(before, 10))
			t.Fatalf("offset %d stamped %d, %d ms before its produce was sent (%d); from_time=%d starts at %v, skipping it",
				p.Offset, m.Timestamp, before-m.Timestamp, before, before, first(mr.Messages))
		}
	}
}

// TestJSONPayloadMustBeUTF8: JSON is UTF-8; a JSON payload with invalid bytes in a string
// is refused, and a sniffed one is kept as bytes, so no response is ever invalid JSON.
func TestJSONPayloadMustBeUTF8(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("j", map[string]any{"partitions": 1})
	bad := []byte("{\"a\":\"\xff\xfe\"}")
	a.Do(http.MethodPost, "/v1/topics/j/produce", bad, "Content-Type", "application/json").ExpectError(t, http.StatusBadRequest, "invalid_payload")
	a.PostJSON("/v1/topics/j/produce-batch", []byte("{\"messages\":[{\"payload\":\"\xff\"}]}")).ExpectError(t, http.StatusBadRequest, "invalid_payload")
	a.Do(http.MethodPost, "/v1/topics/j/produce", bad) // no type: sniffed
	for _, path := range []string{"/v1/topics/j/consume-batch?max=10", "/v1/topics/j/partitions/0/messages"} {
		if r := a.Get(path); !utf8.Valid(r.Body) {
			t.Errorf("GET %s: %d with a body that is not valid UTF-8: %q", path, r.Status, r.Body)
		}
	}
}

// TestHTTPFraming: malformed framing is refused before any handler runs and stores
// nothing. net/http answers these itself, with a plain-text 400 and a closed connection
// (a documented exception to the JSON error body). Content-Length together with
// Transfer-Encoding: chunked is read as chunked, as RFC 9112 says, with the
// Content-Length dropped, so it cannot smuggle a second request.
func TestHTTPFraming(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("f", map[string]any{"partitions": 1})
	addr := strings.TrimPrefix(a.BaseURL(), "http://")
	send := func(req string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ name, req string }{
		{"duplicate Content-Length", "POST /v1/topics/f/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"},
		{"no Host", "GET /v1/topics HTTP/1.1\r\n\r\n"},
	} {
		if st, body := send(c.req); st != http.StatusBadRequest {
			t.Errorf("%s: %d %q, want 400", c.name, st, body)
		}
	}
	if n := a.topic("f").PartitionStats[0].NextOffset; n != 0 {
		t.Errorf("%d messages stored from malformed requests", n)
	}
	st, _ := send("POST /v1/topics/f/produce HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	if st != http.StatusAccepted {
		t.Fatalf("chunked with a Content-Length: %d, want the chunked body taken", st)
	}
	if m := a.consume("f", "partition=0&offset=0"); m == nil || string(m.Payload) != `"abc"` {
		t.Fatalf("stored %v, want the whole chunked body \"abc\"", m)
	}
}

// TestMalformedQueryAndPath: a malformed query escape is a 400, not silently ignored;
// a non-canonical path is a 404, not a redirect.
func TestMalformedQueryAndPath(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("j", map[string]any{"partitions": 1})
	a.Get("/v1/topics/j/consume?wait=%zz").ExpectError(t, http.StatusBadRequest, "invalid_parameter")
	a.Get("/v1/topics/j/../j").ExpectError(t, http.StatusNotFound, "not_found")
	a.Get("/v1/topics/").ExpectError(t, http.StatusNotFound, "not_found")
}

// TestH2C talks HTTP/2 without TLS (prior knowledge) to a plain-HTTP node: many
// requests, a long poll among them, share one connection, and the whole flow works.
func TestH2C(t *testing.T) {
	n, a := startBroker(t)
	a.createTopic("h2", map[string]any{"partitions": 2})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: &protos}, Timeout: 30 * time.Second}
	do := func(method, path, body string) (*http.Response, []byte) {
		req, err := http.NewRequest(method, n.URL()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s %s answered over %s, want HTTP/2", method, path, resp.Proto)
		}
		return resp, data
	}
	// A long poll parked on the connection while produces go through it.
	polled := make(chan []byte, 1)
	go func() {
		resp, data := do("GET", "/v1/topics/h2/consume?wait=10s", "")
		if resp.StatusCode != 200 {
			t.Errorf("long poll: %d %s", resp.StatusCode, data)
		}
		polled <- data
	}()
	for i := 0; i < 20; i++ {
		if resp, data := do("POST", "/v1/topics/h2/produce", fmt.Sprintf(`{"n":%d}`, i)); resp.StatusCode != 202 {
			t.Fatalf("produce over h2c: %d %s", resp.StatusCode, data)
		}
	}
	var m message
	if err := json.Unmarshal(<-polled, &m); err != nil || m.ReceiptHandle == "" {
		t.Fatalf("long poll over h2c returned %+v (%v)", m, err)
	}
	if resp, data := do("POST", "/v1/topics/h2/ack?receipt_handle="+url.QueryEscape(m.ReceiptHandle), ""); resp.StatusCode != 204 {
		t.Fatalf("ack over h2c: %d %s", resp.StatusCode, data)
	}
}

// TestDeleteNamingAnIncarnationDeletesOnlyThatOne: an operator who read a topic and
// deletes it naming its incarnation deletes that topic only: once the name is another
// topic (deleted and created again since the read), the delete answers 409
// incarnation_mismatch and the new topic stays.
func TestDeleteNamingAnIncarnationDeletesOnlyThatOne(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("d", nil)
	first := a.topic("d").Incarnation
	a.Do("DELETE", "/v1/topics/d", nil).Expect(t, http.StatusNoContent)
	a.createTopic("d", nil)
	second := a.topic("d").Incarnation
	if second == first {
		t.Fatalf("the topic created again has the first one's incarnation %s", first)
	}
	a.Do("DELETE", "/v1/topics/d?incarnation="+first, nil).ExpectError(t, http.StatusConflict, "incarnation_mismatch")
	if got := a.topic("d").Incarnation; got != second {
		t.Fatalf("after a refused delete the topic is incarnation %s, want %s", got, second)
	}
	for _, bad := range []string{"x", "0"} {
		a.Do("DELETE", "/v1/topics/d?incarnation="+bad, nil).ExpectError(t, http.StatusBadRequest, "invalid_parameter")
	}
	a.Do("DELETE", "/v1/topics/d?incarnation="+second, nil).Expect(t, http.StatusNoContent)
	a.Do("DELETE", "/v1/topics/d?incarnation="+second, nil).ExpectError(t, http.StatusNotFound, "topic_not_found")
}
