package otel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	narad "github.com/narad-mq/narad/sdk-go"
	naradotel "github.com/narad-mq/narad/sdk-go/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// standIn answers produce with 202 and remembers the last body, and answers consume
// with that body as one leased message, and ack with 204: enough of the broker to trace
// a message from producer to handler.
func standIn(t *testing.T) *httptest.Server {
	var last []byte
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/produce"):
			last, _ = io.ReadAll(r.Body)
			w.WriteHeader(202)
			fmt.Fprint(w, `{"topic":"orders","partition":0,"offset":0}`)
		case strings.HasSuffix(r.URL.Path, "/consume"):
			payload, _ := json.Marshal(last)
			fmt.Fprintf(w, `{"topic":"orders","partition":0,"offset":0,"key":null,"payload":%s,"payload_encoding":"base64","timestamp":1,"receipt_handle":"h","delivery_attempt":1}`, payload)
		case strings.HasSuffix(r.URL.Path, "/ack"):
			w.WriteHeader(204)
		default:
			w.WriteHeader(404)
			fmt.Fprint(w, `{"error":{"code":"not_found","message":"no"}}`)
		}
	}))
}

func TestTraceContinuesFromProducerToHandler(t *testing.T) {
	srv := standIn(t)
	defer srv.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := naradotel.New(naradotel.WithTracerProvider(tp))
	c, err := narad.New([]string{srv.URL}, narad.WithObserver(tr.Observe))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, root := tp.Tracer("test").Start(context.Background(), "checkout")
	env, err := tr.NewEnvelope(ctx, map[string]int{"id": 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Produce(ctx, "orders", env); err != nil {
		t.Fatal(err)
	}
	root.End()

	msgs, err := c.Receive(context.Background(), "orders")
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive: %v", err)
	}
	var inHandler trace.SpanContext
	h := tr.Handler(func(ctx context.Context, m *narad.Message) error {
		inHandler = trace.SpanContextFromContext(ctx)
		return m.Ack(ctx)
	})
	if err := h(context.Background(), msgs[0]); err != nil {
		t.Fatal(err)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	send, process, receive, settle := spans["send orders"], spans["process orders"], spans["receive orders"], spans["settle orders"]
	if send == nil || process == nil || receive == nil || settle == nil {
		t.Fatalf("spans %v", keys(spans))
	}
	traceID := root.SpanContext().TraceID()
	if send.SpanKind() != trace.SpanKindProducer || send.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("send span kind %v parent %v", send.SpanKind(), send.Parent())
	}
	if process.SpanKind() != trace.SpanKindConsumer || process.SpanContext().TraceID() != traceID || inHandler.SpanID() != process.SpanContext().SpanID() {
		t.Fatal("the process span does not continue the producer's trace")
	}
	if settle.Parent().SpanID() != process.SpanContext().SpanID() {
		t.Fatal("the handler's ack is not a child of the process span")
	}
	if !has(send, attribute.String("messaging.system", "narad")) || !has(send, attribute.String("messaging.destination.name", "orders")) ||
		!has(process, attribute.String("messaging.message.id", env.ID)) {
		t.Fatalf("attributes %v / %v", send.Attributes(), process.Attributes())
	}
}

func TestFailedRequestsMarkTheSpan(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(410)
		fmt.Fprint(w, `{"error":{"code":"lease_lost","message":"gone"}}`)
	}))
	defer srv.Close()
	rec := tracetest.NewSpanRecorder()
	tr := naradotel.New(naradotel.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	c, _ := narad.New([]string{srv.URL}, narad.WithObserver(tr.Observe))
	defer c.Close()
	m := c.MessageForHandle("orders", "h")
	if err := m.Ack(context.Background()); err == nil {
		t.Fatal("want 410")
	}
	s := rec.Ended()
	if len(s) != 1 || s[0].Status().Code != codes.Error || !has(s[0], attribute.String("error.type", "lease_lost")) {
		t.Fatalf("spans %+v", s)
	}
}

func has(s sdktrace.ReadOnlySpan, kv attribute.KeyValue) bool {
	for _, a := range s.Attributes() {
		if a == kv {
			return true
		}
	}
	return false
}

func keys(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
