package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// fastDecodeSeeds are bodies of both batch operations: the shapes clients send, and
// every kind of body the fast path must leave to strictDecode.
var fastDecodeSeeds = []string{
	`{"messages":[{"payload":1}]}`,
	`{"messages":[{"payload":"eHh4eA==","payload_encoding":"base64"},{"payload":"eXk=","payload_encoding":"base64"}]}`,
	`{"messages":[{"key":"k1","partition":3,"payload":"eHh4","payload_encoding":"base64","timestamp":1700000000000}]}`,
	`{"messages": [{"payload": "aGk=", "payload_encoding": "base64", "key": "order-7"}]}`,
	"{\"messages\":[{\"payload\":\"a\x7fb~ \",\"payload_encoding\":\"text\"},{}]}",
	"{\"messages\":[{\"payload\":\"a\tb\"}]}",
	`{"messages":[]}`,
	`{}`,
	` { "messages" : [ { "payload" : { "a" : [ 1 , "x" ] } } , {"payload":"s"} ] } `,
	`{"messages":[{"payload":"aGVsbG8=","payload_encoding":"base64"}]}`,
	`{"messages":[{"payload":"YS9i\/w==","payload_encoding":"base64","key":"k","partition":1}]}`,
	`{"messages":[{"payload":"x","payload_encoding":"text","key":"caf\u00e9","partition":0,"timestamp":1700000000000}]}`,
	`{"messages":[{"payload":"\u0061GVsbG8=","payload_encoding":"base64"},{"payload":{"a":[1,"x"]}}]}`,
	`{"messages":[{"payload":"","payload_encoding":"base64"},{"payload":null}]}`,
	`{"messages":[{"payload":true,"key":""},{"payload":false},{"payload":-1.5e3},{"payload":[]}]}`,
	`{"messages":[{"payload":1,"partition":-0}]}`,
	`{"messages":[{"payload":1,"partition":2147483648}]}`,
	`{"messages":[{"payload":1,"partition":1.0}]}`,
	`{"messages":[{"payload":1,"partition":1e2}]}`,
	`{"messages":[{"payload":1,"timestamp":-9223372036854775808}]}`,
	`{"messages":[{"payload":1,"timestamp":9223372036854775808}]}`,
	`{"messages":[{"payload":1,"key":null}]}`,
	`{"messages":[{"payload":1,"partition":"1"}]}`,
	`{"messages":[{"payload":1,"payload":2}]}`,
	`{"messages":[{"payload":1}],"messages":[{"payload":2}]}`,
	`{"messages":null}`,
	`{"messages":{}}`,
	`{"MESSAGES":[{"payload":1}]}`,
	`{"messag\u0065s":[{"payload":1}]}`,
	`{"messages":[{"payl\u006fad":1}]}`,
	`{"messages":[{"payload":1,"extra":2}]}`,
	`{"messages":[{"payload":1,"origin":{"cluster_id":"c","topic":"t","partition":0,"offset":5}}]}`,
	`{"messages":[{"payload":"!!","payload_encoding":"base64"}]}`,
	"{\"messages\":[{\"payload\":\"\xff\"}]}",
	"{\"messages\":[{\"payload\":1,\"key\":\"\xc3\"}]}",
	`{"messages":[{"payload":1}]} x`,
	`{"messages":[{"payload":1}]}{}`,
	`{"incarnation":"7","messages":[{"payload":1}]}`,
	`{"messages":[{"payload":1}],"incarnation":"7"}`,
	`{"incarnation":"7","incarnation":"8","messages":[]}`,
	`{"incarnation":null,"messages":[]}`,
	`{"incarnation":7,"messages":[]}`,
	`{"messages":[{"payload":1}],"validate_only":true}`,
	`{"messages":[`,
	`{"messages":[{"payload":1},]}`,
	`[]`,
	`null`,
	``,
	`{"acks":[{"receipt_handle":"3.1.2.1000000.77777777.1"}]}`,
	`{"acks":[]}`,
	`{"acks":[{"receipt_handle":"h","extend":"45s"},{"extend":"true","receipt_handle":"h2"}]}`,
	`{"acks":[{"receipt_handle":"h\u002e1"}]}`,
	`{"acks":[{"receipt_handle":null}]}`,
	`{"acks":[{"receipt_handle":"h","extend":null}]}`,
	`{"acks":[{"receipt_handle":"h","extend":true}]}`,
	`{"acks":[{"receipt_handle":1}]}`,
	`{"acks":[{"receipt_handle":"h","receipt_handle":"g"}]}`,
	`{"acks":[{"receipt_handle":"h"}],"acks":[]}`,
	`{"acks":null}`,
	`{"acks":[{}]}`,
	`{"acks":[{"receipt_handle":"h","other":1}]}`,
	`{"acks":[{"receipt_handle":"h"}],"messages":[]}`,
}

// FuzzFastBatchDecode holds the batch bodies' fast path to the strict decoder: on any
// body the fast path accepts, strictDecode must accept it too and read exactly the
// same request, and so the answer cannot differ from the reference's.
func FuzzFastBatchDecode(f *testing.F) {
	for _, s := range fastDecodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastProduceBatch(t, body)
		checkFastAckBatch(t, body)
	})
}

func checkFastProduceBatch(t *testing.T, body []byte) {
	t.Helper()
	if plain, ok := plainProduceBatch(bytes.Clone(body)); ok {
		// The plain scanner takes a subset of what the token reader takes.
		token, ok := tokenProduceBatch(bytes.Clone(body))
		if !ok {
			t.Fatalf("the plain scanner accepted a produce-batch body the token reader does not: %q", body)
		}
		if !reflect.DeepEqual(*plain, *token) {
			t.Fatalf("produce-batch body %q: the plain scanner read\n%s\nthe token reader read\n%s", body, dump(plain), dump(token))
		}
	}
	got, ok := fastProduceBatch(bytes.Clone(body))
	if !ok {
		return
	}
	var want apigen.ProduceBatchRequest
	if err := strictDecode(body, &want); err != nil {
		t.Fatalf("the fast path accepted a produce-batch body strictDecode refuses (%v): %q", err, body)
	}
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("produce-batch body %q: the fast path read\n%s\nstrictDecode read\n%s", body, dump(got), dump(&want))
	}
}

func checkFastAckBatch(t *testing.T, body []byte) {
	t.Helper()
	got, ok := fastAckBatch(bytes.Clone(body))
	if !ok {
		return
	}
	var want apigen.AckBatchRequest
	if err := strictDecode(body, &want); err != nil {
		t.Fatalf("the fast path accepted an ack-batch body strictDecode refuses (%v): %q", err, body)
	}
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("ack-batch body %q: the fast path read\n%s\nstrictDecode read\n%s", body, dump(got), dump(&want))
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestFastBatchDecodeTakesTheCommonShapes pins which bodies take the fast path: the
// shapes the SDKs and the load generator send must (else the fast path has silently
// stopped working), and the ones it cannot read exactly must not (the reference then
// answers, refusals included).
func TestFastBatchDecodeTakesTheCommonShapes(t *testing.T) {
	t.Parallel()
	fast := []string{
		`{"messages":[{"payload":1}]}`,
		` { "messages" : [ { "payload" : { "a" : [ 1 , "x" ] } } , {"payload":"s"} ] } `,
		`{"messages":[{"payload":"YS9i\/w==","payload_encoding":"base64","key":"k","partition":1}]}`,
		`{"messages":[{"payload":"x","payload_encoding":"text","key":"caf\u00e9","partition":0,"timestamp":1700000000000}]}`,
		`{"messages":[]}`,
		`{"messages":[{"payload":1}],"incarnation":"7"}`,
	}
	for _, s := range fast {
		if _, ok := fastProduceBatch([]byte(s)); !ok {
			t.Errorf("produce-batch body %s: not taken by the fast path", s)
		}
		checkFastProduceBatch(t, []byte(s))
	}
	for _, s := range []string{
		`{"acks":[{"receipt_handle":"3.1.2.1000000.77777777.1"}]}`,
		`{"acks":[{"receipt_handle":"h","extend":"45s"},{"extend":"true","receipt_handle":"h\u002e2"}]}`,
		`{"acks":[]}`,
	} {
		if _, ok := fastAckBatch([]byte(s)); !ok {
			t.Errorf("ack-batch body %s: not taken by the fast path", s)
		}
		checkFastAckBatch(t, []byte(s))
	}
	slow := []string{
		`{"messages":[{"payload":1,"key":null}]}`,
		`{"messages":[{"payload":null}]}`,
		`{"messages":[{"payload":1,"partition":1.0}]}`,
		`{"messages":[{"payload":1,"partition":2147483648}]}`,
		`{"messages":[{"payload":1,"payload":2}]}`,
		`{"messages":[{"payload":1}],"messages":[{"payload":2}]}`,
		`{"messages":[{"payload":1,"extra":2}]}`,
		`{"messages":[{"payload":1}],"validate_only":true}`,
		`{"incarnation":null,"messages":[]}`,
		`{"messages":[{"payload":1,"origin":{"cluster_id":"c","topic":"t","partition":0,"offset":5}}]}`,
		`{"messag\u0065s":[{"payload":1}]}`,
		"{\"messages\":[{\"payload\":\"\xff\"}]}",
		`{"messages":[{"payload":1}]} x`,
		`{"messages":[`,
		`{"acks":[{"receipt_handle":"h"}]}`, // an ack-batch's member in a produce-batch
	}
	for _, s := range slow {
		if _, ok := fastProduceBatch([]byte(s)); ok {
			t.Errorf("produce-batch body %q: taken by the fast path; it must go to strictDecode", s)
		}
	}
	for _, s := range []string{
		`{"acks":[{"receipt_handle":null}]}`,
		`{"acks":[{"receipt_handle":"h","extend":true}]}`,
		`{"acks":[{"receipt_handle":"h","receipt_handle":"g"}]}`,
		`{"acks":[{"receipt_handle":"h","other":1}]}`,
		`{"acks":null}`,
		`{"messages":[]}`,
	} {
		if _, ok := fastAckBatch([]byte(s)); ok {
			t.Errorf("ack-batch body %q: taken by the fast path; it must go to strictDecode", s)
		}
	}
}

// TestFastBatchDecodeRefusalsAnswerAsBefore posts bodies the fast path leaves to the
// strict decoder and checks the answer is the reference's refusal, message included.
func TestFastBatchDecodeRefusalsAnswerAsBefore(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ path, body, want string }{
		{"produce-batch", `{"messages":[{"payload":1,"key":null}]}`, "/messages/0/key is null"},
		{"produce-batch", `{"messages":[{"payload":1,"extra":2}]}`, "extra"},
		{"produce-batch", `{"messages":[{"payload":1}]} x`, "invalid character"},
		{"ack-batch", `{"acks":[{"receipt_handle":"h","extend":null}]}`, "/acks/0/extend is null"},
	} {
		var want apigen.ProduceBatchRequest
		refErr := strictDecode([]byte(c.body), &want)
		if c.path == "ack-batch" {
			var ab apigen.AckBatchRequest
			refErr = strictDecode([]byte(c.body), &ab)
		}
		if refErr == nil || !strings.Contains(refErr.Error(), c.want) {
			t.Fatalf("%s: strictDecode says %v; the test expects it to mention %q", c.body, refErr, c.want)
		}
		code, body := postBody(t, "/v1/topics/t/"+c.path, c.body)
		if code != 400 || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: answer %d %s; want 400 mentioning %q", c.path, c.body, code, body, c.want)
		}
	}
}

// postBody posts body to path on a handler over a broker that stores nothing.
func postBody(t *testing.T, path, body string) (int, string) {
	t.Helper()
	var got []broker.Outgoing
	h, err := New(captureBroker{got: &got}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// benchBatchBodies are a produce-batch of 100 base64 payloads of 256 bytes and an
// ack-batch of 100 handles, as the load generator sends them: the bodies of the
// decode benchmarks below and of BenchmarkHTTPProduceBatch and BenchmarkHTTPAckBatch.
func benchBatchBodies() (produce, ack []byte) {
	type msg struct {
		Payload string `json:"payload"`
		Enc     string `json:"payload_encoding"`
	}
	msgs := make([]msg, 100)
	for i := range msgs {
		msgs[i] = msg{Payload: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{byte(i)}, 256)), Enc: "base64"}
	}
	produce, _ = json.Marshal(map[string]any{"messages": msgs})
	acks := make([]map[string]string, 100)
	for i := range acks {
		acks[i] = map[string]string{"receipt_handle": "3.1.2.1000000.77777777." + strconv.Itoa(i)}
	}
	ack, _ = json.Marshal(map[string]any{"acks": acks})
	return produce, ack
}

func BenchmarkDecodeProduceBatch(b *testing.B) {
	body, _ := benchBatchBodies()
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := fastProduceBatch(body); !ok {
				b.Fatal("not fast")
			}
		}
	})
	b.Run("token", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := tokenProduceBatch(body); !ok {
				b.Fatal("not fast")
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req apigen.ProduceBatchRequest
			if err := strictDecode(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodeAckBatch(b *testing.B) {
	_, body := benchBatchBodies()
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := fastAckBatch(body); !ok {
				b.Fatal("not fast")
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req apigen.AckBatchRequest
			if err := strictDecode(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
