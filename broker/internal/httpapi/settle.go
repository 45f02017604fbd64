package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

func (h *handlers) Ack(ctx context.Context, r apigen.AckRequestObject) (apigen.AckResponseObject, error) {
	mode, d, err := parseExtend(r.Params.Extend)
	if err != nil {
		return nil, err
	}
	if r.Params.ReceiptHandle == "" {
		return nil, badParam("receipt_handle is required")
	}
	errs := h.b.Ack(r.Topic, []broker.AckReq{{Handle: r.Params.ReceiptHandle, Mode: mode, Delay: d}})
	if errs[0] != nil {
		return nil, errs[0]
	}
	return apigen.Ack204Response{}, nil
}

func (h *handlers) AckBatch(ctx context.Context, r apigen.AckBatchRequestObject) (apigen.AckBatchResponseObject, error) {
	acks := r.Body.Acks
	if len(acks) == 0 || len(acks) > broker.MaxBatch {
		return nil, newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "an ack batch holds 1 to "+strconv.Itoa(broker.MaxBatch)+" entries, got "+strconv.Itoa(len(acks)))
	}
	// A batch for a topic that does not exist fails whole, like every other topic route.
	if err := h.b.Exists(r.Topic); err != nil {
		return nil, err
	}
	res := make([]apigen.AckResult, len(acks))
	reqs := make([]broker.AckReq, 0, len(acks))
	idx := make([]int, 0, len(acks))
	for i, a := range acks {
		res[i].ReceiptHandle = a.ReceiptHandle
		mode, d, err := parseExtend(a.Extend)
		if err == nil && a.ReceiptHandle == "" {
			err = badParam("receipt_handle is required")
		}
		if err != nil {
			setAckResult(&res[i], err)
			continue
		}
		reqs = append(reqs, broker.AckReq{Handle: a.ReceiptHandle, Mode: mode, Delay: d})
		idx = append(idx, i)
	}
	if len(reqs) > 0 {
		errs := h.b.Ack(r.Topic, reqs)
		for j, err := range errs {
			setAckResult(&res[idx[j]], err)
		}
	}
	return ackResultsResponse(res), nil
}

func setAckResult(r *apigen.AckResult, err error) {
	if err == nil {
		r.Status = http.StatusNoContent
		return
	}
	ae := toAPIError(err)
	r.Status = int32(ae.status)
	r.Error = &struct {
		Code    apigen.ErrorCode `json:"code"`
		Message string           `json:"message"`
	}{Code: ae.code, Message: ae.msg}
}
