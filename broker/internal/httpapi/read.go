package httpapi

import (
	"context"
	"strconv"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

func (h *handlers) ReadMessages(ctx context.Context, r apigen.ReadMessagesRequestObject) (apigen.ReadMessagesResponseObject, error) {
	if r.Partition < 0 {
		return nil, badParam("partition must be 0 or more")
	}
	max := 100
	if r.Params.Max != nil {
		if *r.Params.Max < 1 || *r.Params.Max > broker.MaxBatch {
			return nil, badParam("max must be between 1 and " + strconv.Itoa(broker.MaxBatch))
		}
		max = int(*r.Params.Max)
	}
	var from *uint64
	if r.Params.From != nil {
		if *r.Params.From < 0 {
			return nil, badParam("from must be 0 or more")
		}
		f := uint64(*r.Params.From)
		from = &f
	}
	var fromTime *int64
	if r.Params.FromTime != nil {
		ms, err := parseTime(*r.Params.FromTime)
		if err != nil {
			return nil, badParam("from_time must be an RFC 3339 time (2026-01-02T15:04:05Z) or Unix milliseconds")
		}
		fromTime = &ms
	}
	b64, err := forceBase64(r.Params.PayloadEncoding)
	if err != nil {
		return nil, err
	}
	spec := broker.ReadSpec{From: from, FromTimeMs: fromTime, Max: max, SkipDamaged: true}
	if r.Params.Incarnation != nil {
		inc, err := strconv.ParseUint(*r.Params.Incarnation, 10, 64)
		if err != nil || inc == 0 {
			return nil, badParam("incarnation must be a topic's incarnation, as GET /v1/topics/{topic} or a replay's answer gives it (digits)")
		}
		spec.Incarnation = inc
	}
	got, err := h.b.Read(ctx, r.Topic, r.Partition, spec)
	if err != nil {
		return nil, err
	}
	return messageListResponse{topic: r.Topic, ds: got.Messages, forceBase64: b64, next: &got.Next,
		incarnation: got.Incarnation, damaged: got.Damaged}, nil
}
