package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// FuzzProduceBatchBody posts arbitrary bytes as a produce-batch body. The answer must
// be 202 or a 4xx, never a panic or a 5xx. When the body is accepted, encoding/json
// (the reference decoder) must read the same messages from it, and every base64
// payload must have reached the broker as encoding/json plus base64 decode it: the
// single strict decode and the in-place base64 path may not change a message.
func FuzzProduceBatchBody(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"payload":1}]}`,
		`{"messages":[{"payload":"aGVsbG8=","payload_encoding":"base64"}]}`,
		`{"messages":[{"payload":"YS9i\/w==","payload_encoding":"base64","key":"k","partition":1}]}`,
		`{"messages":[{"payload":"\u0061GVsbG8=","payload_encoding":"base64"},{"payload":{"a":[1,"x"]}}]}`,
		`{"messages":[{"payload":"","payload_encoding":"base64"},{"payload":null}]}`,
		`{"messages":[{"payload":1}],"messages":[{"payload":2}]}`,
		`{"MESSAGES":[{"payload":1}]}`,
		`{"messages":[{"payload":"!!","payload_encoding":"base64"}]}`,
		"{\"messages\":[{\"payload\":\"\xff\"}]}",
		`{"messages":[{"payload":1}]} x`,
		`{"messages":[`,
	} {
		f.Add([]byte(s))
	}
	var got []broker.Outgoing // what the last accepted body handed to the broker
	h, err := New(captureBroker{got: &got}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AllowedHosts: []string{"example.com"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got = nil
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/v1/topics/t/produce-batch", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code == 202:
		case rec.Code >= 400 && rec.Code < 500:
			return
		default:
			t.Fatalf("answer %d %s", rec.Code, rec.Body)
		}
		var ref apigen.ProduceBatchRequest
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("accepted a body encoding/json refuses (%v): %q", err, body)
		}
		if len(ref.Messages) != len(got) {
			t.Fatalf("broker got %d messages, encoding/json reads %d", len(got), len(ref.Messages))
		}
		for i, m := range ref.Messages {
			if m.PayloadEncoding == nil {
				continue
			}
			var s string
			if err := json.Unmarshal(m.Payload, &s); err != nil {
				t.Fatalf("message %d: accepted a base64 payload that is not a string: %s", i, m.Payload)
			}
			want, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				t.Fatalf("message %d: accepted invalid base64 %q", i, s)
			}
			if string(got[i].Value) != string(want) || got[i].Attrs != kindBinary {
				t.Fatalf("message %d: broker got %q (attrs %d), want %q", i, got[i].Value, got[i].Attrs, want)
			}
		}
	})
}
