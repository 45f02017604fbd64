package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// recordingBroker answers produce, consume and ack from their arguments alone and
// writes down every call, so that two servers given the same requests can be compared
// call by call. A topic named "missing" does not exist.
type recordingBroker struct {
	Broker
	mu    sync.Mutex
	calls []string
}

func (*recordingBroker) Ready() bool     { return true }
func (*recordingBroker) Clustered() bool { return false }

func (r *recordingBroker) note(format string, args ...any) {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recordingBroker) Exists(name string) error {
	if name == "missing" {
		return broker.ErrTopicNotFound
	}
	return nil
}

func (r *recordingBroker) Produce(_ context.Context, topic string, msgs []broker.Outgoing) ([]broker.Produced, error) {
	for _, m := range msgs {
		r.note("produce %s key=%q part=%d value=%q attrs=%d", topic, m.Key, m.Partition, m.Value, m.Attrs)
	}
	if err := r.Exists(topic); err != nil {
		return nil, err
	}
	return []broker.Produced{{Partition: 1, Offset: uint64(len(msgs[0].Value))}}, nil
}

func (r *recordingBroker) Consume(_ context.Context, topic string, max int, wait time.Duration) ([]broker.Delivered, error) {
	r.note("consume %s max=%d wait=%v", topic, max, wait)
	if err := r.Exists(topic); err != nil {
		return nil, err
	}
	return []broker.Delivered{{Partition: 2, Offset: 7, Value: []byte("v"), Attrs: kindBinary, Timestamp: 1_764_000_000_000, Handle: "3.1.2.7.99.1", Attempt: 1}}, nil
}

func (r *recordingBroker) ReadOne(_ context.Context, topic string, partition int32, offset uint64) (*broker.Delivered, error) {
	r.note("read %s %d %d", topic, partition, offset)
	if err := r.Exists(topic); err != nil {
		return nil, err
	}
	return &broker.Delivered{Partition: partition, Offset: offset, Value: []byte("r"), Attrs: kindText, Timestamp: 1_764_000_000_000}, nil
}

func (r *recordingBroker) Ack(topic string, reqs []broker.AckReq) []error {
	errs := make([]error, len(reqs))
	for i, q := range reqs {
		r.note("ack %s %s mode=%v delay=%v", topic, q.Handle, q.Mode, q.Delay)
		errs[i] = r.Exists(topic)
	}
	return errs
}

// TestDirectRoutesAnswerAsTheGeneratedPath sends the same requests of the three direct
// routes (well-formed, and each way of being malformed or unusual the router, the
// binder and the handlers tell apart) to a server and to one without direct routes:
// status, headers, body and the calls that reached the broker must be the same, and
// the well-formed ones must have been served directly (or the comparison proves
// nothing).
func TestDirectRoutesAnswerAsTheGeneratedPath(t *testing.T) {
	t.Parallel()
	serve := func(direct bool) (http.Handler, *recordingBroker) {
		rb := &recordingBroker{}
		h, err := New(rb, Options{Logger: quietLogger(), AllowedHosts: []string{"example.com"}})
		if err != nil {
			t.Fatal(err)
		}
		if !direct {
			h.(*server).d.h = nil
		}
		return h, rb
	}
	cases := []struct {
		method, target, ctype, body string
		direct                      bool // served by serveDirect
	}{
		{"POST", "/v1/topics/t/produce", "application/octet-stream", "hello", true},
		{"POST", "/v1/topics/t/produce?key=k1", "application/octet-stream", "hello", true},
		{"POST", "/v1/topics/t/produce?key=", "text/plain", "héllo", true},
		{"POST", "/v1/topics/t/produce?partition=2", "application/json", `{"a":1}`, true},
		{"POST", "/v1/topics/t/produce?partition=-1", "application/octet-stream", "x", true},
		{"POST", "/v1/topics/t/produce?key=a&partition=1", "application/octet-stream", "x", true},
		{"POST", "/v1/topics/t/produce", "application/json", `{"a":`, true},
		{"POST", "/v1/topics/t/produce", "text/plain; charset=utf-8", "\xff", true},
		{"POST", "/v1/topics/t/produce", "", "", true},
		{"POST", "/v1/topics/missing/produce", "application/octet-stream", "x", true},
		{"POST", "/v1/topics/t/produce?partition=x", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/t/produce?partition=", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/t/produce?partition=99999999999", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/t/produce?key=a&key=b", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/%74/produce", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/a%2Fb/produce", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/a%25b/produce", "application/octet-stream", "x", false},
		{"POST", "/v1/topics/t/produce?bogus=1", "application/octet-stream", "x", false},
		{"GET", "/v1/topics/t/consume", "", "", true},
		{"GET", "/v1/topics/t/consume?wait=0", "", "", true},
		{"GET", "/v1/topics/t/consume?wait=250ms", "", "", true},
		{"GET", "/v1/topics/t/consume?wait=2", "", "", true},
		{"GET", "/v1/topics/t/consume?payload_encoding=base64", "", "", true},
		{"GET", "/v1/topics/t/consume?payload_encoding=rot13", "", "", true},
		{"GET", "/v1/topics/t/consume?partition=3&offset=5", "", "", true},
		{"GET", "/v1/topics/t/consume?partition=3", "", "", true},
		{"GET", "/v1/topics/missing/consume", "", "", true},
		{"GET", "/v1/topics/t/consume?wait=soon", "", "", true},
		{"GET", "/v1/topics/t/consume?offset=x", "", "", false},
		{"GET", "/v1/topics/t/consume?partition=1&partition=2", "", "", false},
		{"GET", "/v1/topics/%74/consume", "", "", false},
		{"POST", "/v1/topics/t/ack?receipt_handle=3.1.2.7.99.1", "", "", true},
		{"POST", "/v1/topics/t/ack?receipt_handle=3.1.2.7.99.1&extend=true", "", "", true},
		{"POST", "/v1/topics/t/ack?receipt_handle=3.1.2.7.99.1&extend=false", "", "", true},
		{"POST", "/v1/topics/t/ack?receipt_handle=garbage", "", "", true},
		{"POST", "/v1/topics/missing/ack?receipt_handle=3.1.2.7.99.1", "", "", true},
		{"POST", "/v1/topics/t/ack", "", "", false},
		{"POST", "/v1/topics/t/ack?receipt_handle=", "", "", false},
		{"POST", "/v1/topics/t/ack?receipt_handle=a&receipt_handle=b", "", "", false},
		{"POST", "/v1/topics/t/ack?receipt_handle=h&extend=maybe", "", "", true},
		{"POST", "/v1/topics/%74/ack?receipt_handle=h", "", "", false},
	}
	var mu sync.Mutex
	var served []string
	direct, db := serve(true)
	direct.(*server).directHook = func(op string) {
		mu.Lock()
		served = append(served, op)
		mu.Unlock()
	}
	generated, gb := serve(false)
	for _, c := range cases {
		db.calls, gb.calls = nil, nil
		answer := func(h http.Handler) *httptest.ResponseRecorder {
			req := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			req.Header.Set("X-Request-Id", "same-id")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		mu.Lock()
		served = nil
		mu.Unlock()
		got := answer(direct)
		mu.Lock()
		wasDirect := len(served) == 1
		mu.Unlock()
		want := answer(generated)
		name := c.method + " " + c.target
		if wasDirect != c.direct {
			t.Errorf("%s: served directly %v, want %v", name, wasDirect, c.direct)
		}
		sameAnswer(t, name, got, want, db.calls, gb.calls)
	}
}

// sameAnswer fails t unless the direct route's answer and broker calls are the
// generated path's: status, body, headers, and the broker asked the same things.
func sameAnswer(t *testing.T, name string, got, want *httptest.ResponseRecorder, directCalls, generatedCalls []string) {
	t.Helper()
	if got.Code != want.Code || !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
		t.Errorf("%s: direct %d %s; generated %d %s", name, got.Code, got.Body, want.Code, want.Body)
	}
	if g, w := fmt.Sprint(got.Header()), fmt.Sprint(want.Header()); g != w {
		t.Errorf("%s: direct headers %s; generated %s", name, g, w)
	}
	if g, w := strings.Join(directCalls, "\n"), strings.Join(generatedCalls, "\n"); g != w {
		t.Errorf("%s: the broker was asked\n%s\ndirectly, and\n%s\nby the generated path", name, g, w)
	}
}

// TestAHeadOfAConsumeLeasesNothing: net/http routes a HEAD to the GET route and drops
// the body, so a HEAD of consume (or consume-batch) leased a message and showed none;
// it stayed invisible for its visibility timeout. It is refused with 405 now, before the
// broker is asked; a HEAD of a route that only reads is answered as before.
func TestAHeadOfAConsumeLeasesNothing(t *testing.T) {
	t.Parallel()
	rb := &recordingBroker{}
	h, err := New(rb, Options{Logger: quietLogger(), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"/v1/topics/t/consume?wait=0", "/v1/topics/t/consume-batch?wait=0&max=10"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, target, nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET" {
			t.Errorf("HEAD %s: %d, Allow %q; want 405 and GET", target, rec.Code, rec.Header().Get("Allow"))
		}
	}
	if len(rb.calls) != 0 {
		t.Fatalf("HEADs of consumes reached the broker: %q", rb.calls)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("HEAD /healthz: %d; want 200", rec.Code)
	}
}

// TestAQueryRefusalNamesTheSameParameterEachTime: a query with several unknown names,
// or several values out of their bounds, was refused naming whichever a map's random
// order met first, so the same request got different messages. It names the first in
// byte order now.
func TestAQueryRefusalNamesTheSameParameterEachTime(t *testing.T) {
	t.Parallel()
	h, err := New(&recordingBroker{}, Options{Logger: quietLogger(), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ target, names string }{
		{"/v1/topics/t/produce?zz=1&mm=1&aa=1&qq=1", `parameter \"aa\"`},
		{"/v1/topics/t/ack?receipt_handle=" + strings.Repeat("h", 600) + "&extend=" + strings.Repeat("e", 40), "parameter extend "},
	} {
		for i := range 40 {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, c.target, strings.NewReader("x")))
			if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), c.names) {
				t.Fatalf("try %d of %.60s: %d %s; want 400 naming %s", i, c.target, rec.Code, rec.Body, c.names)
			}
		}
	}
}
