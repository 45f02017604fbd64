package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// captureBroker records what a produce handed to the broker.
type captureBroker struct {
	benchBroker
	got *[]broker.Outgoing
}

func (c captureBroker) Produce(ctx context.Context, topic string, msgs []broker.Outgoing) ([]broker.Produced, error) {
	*c.got = append([]broker.Outgoing(nil), msgs...)
	return c.benchBroker.Produce(ctx, topic, msgs)
}

// TestProduceBatchDecoding checks the single strict decode of a batch body and the
// base64 fast path: escaped and unescaped base64 strings decode alike, every payload
// keeps its own bytes (they share one buffer), JSON payloads stay verbatim, and the
// bodies encoding/json used to let through (repeated or differently cased member
// names) are refused.
func TestProduceBatchDecoding(t *testing.T) {
	t.Parallel()
	var got []broker.Outgoing
	h, err := New(captureBroker{got: &got}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	post := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/v1/topics/t/produce-batch", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	code, body := post(`{"messages":[
		{"payload":"aGVsbG8=","payload_encoding":"base64"},
		{"payload":"YS9i\/w==","payload_encoding":"base64"},
		{"payload":"","payload_encoding":"base64"},
		{"payload":{"a":[1,"x"]}},
		{"payload":"d29ybGQ=","payload_encoding":"base64","key":"k","partition":2}]}`)
	if code != 202 {
		t.Fatalf("produce-batch: %d %s", code, body)
	}
	want := []struct {
		value string
		attrs uint16
	}{{"hello", kindBinary}, {"a/b\xff", kindBinary}, {"", kindBinary}, {`{"a":[1,"x"]}`, kindJSON}, {"world", kindBinary}}
	if len(got) != len(want) {
		t.Fatalf("broker got %d messages, want %d", len(got), len(want))
	}
	for i, w := range want {
		if string(got[i].Value) != w.value || got[i].Attrs != w.attrs {
			t.Errorf("message %d: value %q attrs %d, want %q %d", i, got[i].Value, got[i].Attrs, w.value, w.attrs)
		}
	}
	if string(got[4].Key) != "k" || got[4].Partition != 2 {
		t.Errorf("message 4: key %q partition %d", got[4].Key, got[4].Partition)
	}
	// Appending to one payload must not overwrite the next (they share a buffer).
	_ = append(got[0].Value, "XXXX"...)
	if string(got[1].Value) != "a/b\xff" {
		t.Fatalf("payloads overlap: message 1 is now %q", got[1].Value)
	}

	for _, c := range []struct{ name, body, code string }{
		{"repeated member", `{"messages":[{"payload":1}],"messages":[{"payload":2}]}`, "invalid_json"},
		{"repeated member in a message", `{"messages":[{"payload":1,"payload":2}]}`, "invalid_json"},
		{"member in another case", `{"MESSAGES":[{"payload":1}]}`, "invalid_json"},
		{"escaped base64 not base64", `{"messages":[{"payload":"\u0021!","payload_encoding":"base64"}]}`, "invalid_payload"},
		{"invalid UTF-8 in a JSON payload", "{\"messages\":[{\"payload\":\"\xff\"}]}", "invalid_payload"},
		{"trailing data", `{"messages":[{"payload":1}]}x`, "invalid_json"},
	} {
		code, body := post(c.body)
		if code != 400 || !strings.Contains(body, `"code":"`+c.code+`"`) {
			t.Errorf("%s: %d %s, want 400 %s", c.name, code, body, c.code)
		}
	}
}

// TestErrorAfterAnswerStarted: when writing an answer fails (the client hung up), the
// error handler must not start a second answer on top of the first.
func TestErrorAfterAnswerStarted(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	sw := &statusWriter{ResponseWriter: rec}
	sw.WriteHeader(200)
	sw.Write([]byte(`{"messages":[`))
	writeError(sw, errors.New("write tcp: broken pipe"))
	if rec.Code != 200 || rec.Body.String() != `{"messages":[` {
		t.Fatalf("after a failed write the handler answered %d %q", rec.Code, rec.Body.String())
	}
	if sw.status != 200 {
		t.Fatalf("status recorded for metrics: %d, want 200", sw.status)
	}
}

// TestReadBody: bodies of every size around the growth steps come back whole, a body
// shorter than its Content-Length is an error, and the buffer never runs ahead of the
// bytes that arrived by more than double.
func TestReadBody(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 100, 64 << 10, 64<<10 + 1, 300 << 10, 1 << 20} {
		data := strings.Repeat("x", n)
		got, err := readBody(iotest.OneByteReader(strings.NewReader(data)), int64(n))
		if err != nil || string(got) != data {
			t.Fatalf("%d bytes: read %d, %v", n, len(got), err)
		}
	}
	lr := &io.LimitedReader{R: strings.NewReader(strings.Repeat("x", 10)), N: 10}
	if _, err := readBody(struct{ io.Reader }{readerWithErr{lr}}, 8<<20); err == nil {
		t.Fatal("a body shorter than its Content-Length read without an error")
	}
	got, _ := readBody(readerWithErr{strings.NewReader(strings.Repeat("x", 10))}, 8<<20)
	if cap(got) > 64<<10 {
		t.Fatalf("10 bytes of an announced 8 MiB body took a %d-byte buffer", cap(got))
	}
}

// readerWithErr ends like net/http's body when the client stops early.
type readerWithErr struct{ r io.Reader }

func (r readerWithErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
