package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// The hand-written answers of produce, produce-batch and ack-batch must say what the
// generated types' encoding/json answers said: same status, same content type, the
// same JSON value (escapes may differ: encoding/json also escapes <, > and &).
func TestHandWrittenAnswersMatchTheGenerated(t *testing.T) {
	t.Parallel()
	type visit func(w http.ResponseWriter) error
	same := func(name string, got, want visit) {
		t.Helper()
		g, w := httptest.NewRecorder(), httptest.NewRecorder()
		if err := got(g); err != nil {
			t.Fatal(err)
		}
		if err := want(w); err != nil {
			t.Fatal(err)
		}
		if g.Code != w.Code || g.Header().Get("Content-Type") != w.Header().Get("Content-Type") {
			t.Errorf("%s: answer %d %q, the generated %d %q", name, g.Code, g.Header().Get("Content-Type"), w.Code, w.Header().Get("Content-Type"))
		}
		var gv, wv any
		if err := json.Unmarshal(g.Body.Bytes(), &gv); err != nil {
			t.Fatalf("%s: the hand-written answer is not JSON (%v): %s", name, err, g.Body)
		}
		if err := json.Unmarshal(w.Body.Bytes(), &wv); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(gv, wv) {
			t.Errorf("%s: answer\n%s\nthe generated\n%s", name, g.Body, w.Body)
		}
		if b := g.Body.Bytes(); len(b) == 0 || b[len(b)-1] != '\n' {
			t.Errorf("%s: the answer does not end in a newline as encoding/json's does", name)
		}
	}
	for _, p := range []broker.Produced{{}, {Partition: 7, Offset: 1<<62 + 5}} {
		same("produce", producedResponse{topic: "orders.eu-1", p: p}.VisitProduceResponse,
			apigen.Produce202JSONResponse{Topic: "orders.eu-1", Partition: p.Partition, Offset: int64(p.Offset)}.VisitProduceResponse)
	}
	res := []broker.Produced{{Partition: 0, Offset: 0}, {Partition: 3, Offset: 99}, {Partition: 255, Offset: 1 << 40}}
	want := apigen.ProduceBatch202JSONResponse{Results: []apigen.Produced{}}
	for _, p := range res {
		want.Results = append(want.Results, apigen.Produced{Topic: "t_1", Partition: p.Partition, Offset: int64(p.Offset)})
	}
	same("produce-batch", producedListResponse{topic: "t_1", res: res}.VisitProduceBatchResponse, want.VisitProduceBatchResponse)
	same("produce-batch, none", producedListResponse{topic: "t_1"}.VisitProduceBatchResponse,
		apigen.ProduceBatch202JSONResponse{Results: []apigen.Produced{}}.VisitProduceBatchResponse)

	acks := []apigen.AckResult{{ReceiptHandle: "3.1.2.1000000.77777777.1", Status: 204}}
	for i, h := range []string{"", `a"b\c`, "<x>&y", "caf\u00e9 \u2028", "bad \xff utf-8", "tab\there\n"} {
		r := apigen.AckResult{ReceiptHandle: h, Status: int32(400 + i)}
		setAckResult(&r, badParam("receipt_handle "+h+" is <not> one of ours"))
		acks = append(acks, r)
	}
	same("ack-batch", ackResultsResponse(acks).VisitAckBatchResponse, apigen.AckBatch200JSONResponse{Results: acks}.VisitAckBatchResponse)

	next, inc := uint64(12), "7"
	for _, damaged := range [][]uint64{nil, {3}, {3, 4, 1 << 40}} {
		var ds []int64
		for _, d := range damaged {
			ds = append(ds, int64(d))
		}
		gen := apigen.ReadMessages200JSONResponse{Messages: []apigen.Message{}, NextOffset: int64(next), Incarnation: &inc}
		if len(ds) > 0 {
			gen.Damaged = &ds
		}
		same("read", messageListResponse{topic: "t", next: &next, incarnation: 7, damaged: damaged}.VisitReadMessagesResponse, gen.VisitReadMessagesResponse)
	}
}

// messagesSize must leave appendMessage room for a whole answer of the usual shapes,
// so that a consume-batch's buffer is allocated once and never grows.
func TestMessagesSizeHoldsTheAnswer(t *testing.T) {
	t.Parallel()
	handle := "3.1.2.1000000.77777777.123456789"
	for _, c := range []struct {
		name  string
		value []byte
		attrs uint16
		force bool
	}{
		{"base64", bytes.Repeat([]byte{0xab}, 256), kindBinary, false},
		{"forced base64 of JSON", []byte(`{"a":[1,2,3],"b":"xyz"}`), kindJSON, true},
		{"JSON", []byte(`{"a":[1,2,3],"b":"` + strings.Repeat("x", 300) + `"}`), kindJSON, false},
		{"text", []byte(strings.Repeat("plain text ", 30)), broker.PayloadKindText, false},
		{"empty", nil, kindBinary, false},
	} {
		ds := make([]broker.Delivered, 100)
		for i := range ds {
			ds[i] = broker.Delivered{Partition: 255, Offset: 1<<62 + uint64(i), Key: []byte("customer-000042"),
				Value: c.value, Attrs: c.attrs, Timestamp: 1<<62 + 1, Handle: handle, Attempt: 1 << 20}
		}
		m := messageListResponse{topic: "a-topic-name-of-some-length", ds: ds, forceBase64: c.force}
		room := messagesSize(m.topic, m.ds, m.forceBase64)
		if got := len(m.bytes()); got > room {
			t.Errorf("%s: an answer of %d bytes, %d made room for", c.name, got, room)
		}
	}
}
