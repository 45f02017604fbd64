package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// The hand-written answers of produce, produce-batch and ack-batch must say what the
// generated types' encoding/json answers said: same status, same content type, the
// same JSON value (escapes may differ: encoding/json also escapes <, > and &).
func TestHandWrittenAnswersMatchTheGenerated(t *testing.T) {
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
}
