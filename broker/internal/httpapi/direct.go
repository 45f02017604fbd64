package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/oapi-codegen/runtime"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// The routes of one message each (produce, consume, ack) carry most requests of a
// per-message load. ServeHTTP hands a well-formed one to serveDirect, which does what
// the generated router (apigen.ServerInterfaceWrapper) and strict handler do for it,
// in their order, without their layers: a second route match, the query parsed again
// for each parameter, a copy of the request for a context value nothing reads
// (apigen.BasicScopes), a handler closure per layer. An ack's HTTP handling takes a
// fifth less time and 15 fewer allocations, a produce's 8 fewer (docs/performance.md,
// "The direct routes"). The answers are the generated path's: a request this path
// cannot take as the generated code would (an escaped topic, a parameter that does
// not bind, a missing receipt handle) is left to it, so its errors keep their words.
// TestCopiesFollowTheGeneratedCode pins the generated functions these repeat;
// TestDirectRoutesAnswerAsTheGeneratedPath and TestDirectRoutesRandomizedAgainstGenerated
// compare the two paths' answers.

// directTopic is the topic of a request to /v1/topics/{topic}/<op>, which the router
// matched already, when its segment is the topic as it stands: the generated binder
// unescapes the segment once more, which changes nothing only without a '%'.
func directTopic(r *http.Request, op string) (string, bool) {
	if r.URL.RawPath != "" {
		return "", false
	}
	t, ok := strings.CutPrefix(r.URL.Path, "/v1/topics/")
	if ok {
		t, ok = strings.CutSuffix(t, "/"+op)
	}
	if !ok || t == "" || strings.ContainsAny(t, "/%") {
		return "", false
	}
	return t, true
}

// serveDirect serves the operation op (the spec's id) if it is one of the direct
// routes and the request binds as the generated router would bind it; it reports
// false, having written nothing, otherwise. q is the request's query, parsed once.
func (s *server) serveDirect(w http.ResponseWriter, r *http.Request, op string, q url.Values) bool {
	if s.d.h == nil {
		return false
	}
	switch op {
	case "produce":
		topic, ok := directTopic(r, "produce")
		if !ok {
			return false
		}
		var p apigen.ProduceParams
		if runtime.BindQueryParameter("form", true, false, "key", q, &p.Key) != nil ||
			runtime.BindQueryParameter("form", true, false, "partition", q, &p.Partition) != nil {
			return false
		}
		req := apigen.ProduceRequestObject{Topic: topic, Params: p, ContentType: r.Header.Get("Content-Type"), Body: r.Body}
		s.d.serve(w, r, "Produce", req,
			func(ctx context.Context, _ http.ResponseWriter, _ *http.Request, req any) (any, error) {
				return s.d.h.Produce(ctx, req.(apigen.ProduceRequestObject))
			},
			func(resp any) error { return resp.(apigen.ProduceResponseObject).VisitProduceResponse(w) })
	case "consume":
		topic, ok := directTopic(r, "consume")
		if !ok {
			return false
		}
		var p apigen.ConsumeParams
		if runtime.BindQueryParameter("form", true, false, "wait", q, &p.Wait) != nil ||
			runtime.BindQueryParameter("form", true, false, "partition", q, &p.Partition) != nil ||
			runtime.BindQueryParameter("form", true, false, "offset", q, &p.Offset) != nil ||
			runtime.BindQueryParameter("form", true, false, "payload_encoding", q, &p.PayloadEncoding) != nil {
			return false
		}
		s.d.serve(w, r, "Consume", apigen.ConsumeRequestObject{Topic: topic, Params: p},
			func(ctx context.Context, _ http.ResponseWriter, _ *http.Request, req any) (any, error) {
				return s.d.h.Consume(ctx, req.(apigen.ConsumeRequestObject))
			},
			func(resp any) error { return resp.(apigen.ConsumeResponseObject).VisitConsumeResponse(w) })
	case "ack":
		topic, ok := directTopic(r, "ack")
		if !ok || q.Get("receipt_handle") == "" {
			return false
		}
		var p apigen.AckParams
		if runtime.BindQueryParameter("form", true, true, "receipt_handle", q, &p.ReceiptHandle) != nil ||
			runtime.BindQueryParameter("form", true, false, "extend", q, &p.Extend) != nil {
			return false
		}
		s.d.serve(w, r, "Ack", apigen.AckRequestObject{Topic: topic, Params: p},
			func(ctx context.Context, _ http.ResponseWriter, _ *http.Request, req any) (any, error) {
				return s.d.h.Ack(ctx, req.(apigen.AckRequestObject))
			},
			func(resp any) error { return resp.(apigen.AckResponseObject).VisitAckResponse(w) })
	default:
		return false
	}
	if s.directHook != nil {
		s.directHook(op)
	}
	return true
}
