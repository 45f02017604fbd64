package httpapi

import (
	"context"
	"net/http"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// decodedBodyKey carries a batch body that prepareBody decoded (strictly) into the
// request's context, so the batch routes do not decode the same bytes a second time.
type decodedBodyKey struct{}

// decodedOnce is the generated router's interface with the two batch-body routes served
// from the body prepareBody decoded: the generated strict handler would decode it again,
// which was a quarter of produce-batch's CPU. The middlewares, the handler and the
// response writing are the generated code's own steps, in its order. oapi-codegen has no
// hook to hand its strict handler a decoded body, so TestCopiesFollowTheGeneratedCode
// pins the generated functions these copy: it fails when they change shape.
type decodedOnce struct {
	apigen.ServerInterface // the generated strict handler, for every other route
	h                      *handlers
	middlewares            []apigen.StrictMiddlewareFunc
}

func (d decodedOnce) serve(w http.ResponseWriter, r *http.Request, op string, req any, handle apigen.StrictHandlerFunc, visit func(resp any) error) {
	for _, mw := range d.middlewares {
		handle = mw(handle, op)
	}
	resp, err := handle(r.Context(), w, r, req)
	if err == nil {
		err = visit(resp)
	}
	if err != nil {
		writeError(w, err)
	}
}

func (d decodedOnce) ProduceBatch(w http.ResponseWriter, r *http.Request, topic apigen.TopicName) {
	body, ok := r.Context().Value(decodedBodyKey{}).(*apigen.ProduceBatchRequest)
	if !ok {
		d.ServerInterface.ProduceBatch(w, r, topic)
		return
	}
	d.serve(w, r, "ProduceBatch", apigen.ProduceBatchRequestObject{Topic: topic, Body: body},
		func(ctx context.Context, _ http.ResponseWriter, _ *http.Request, req any) (any, error) {
			return d.h.ProduceBatch(ctx, req.(apigen.ProduceBatchRequestObject))
		},
		func(resp any) error { return resp.(apigen.ProduceBatchResponseObject).VisitProduceBatchResponse(w) })
}

func (d decodedOnce) AckBatch(w http.ResponseWriter, r *http.Request, topic apigen.TopicName) {
	body, ok := r.Context().Value(decodedBodyKey{}).(*apigen.AckBatchRequest)
	if !ok {
		d.ServerInterface.AckBatch(w, r, topic)
		return
	}
	d.serve(w, r, "AckBatch", apigen.AckBatchRequestObject{Topic: topic, Body: body},
		func(ctx context.Context, _ http.ResponseWriter, _ *http.Request, req any) (any, error) {
			return d.h.AckBatch(ctx, req.(apigen.AckBatchRequestObject))
		},
		func(resp any) error { return resp.(apigen.AckBatchResponseObject).VisitAckBatchResponse(w) })
}
