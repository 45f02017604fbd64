package httpapi

import (
	"context"
	"strconv"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

func (h *handlers) Consume(ctx context.Context, r apigen.ConsumeRequestObject) (apigen.ConsumeResponseObject, error) {
	wait, err := parseWait(r.Params.Wait)
	if err != nil {
		return nil, err
	}
	b64, err := forceBase64(r.Params.PayloadEncoding)
	if err != nil {
		return nil, err
	}
	if (r.Params.Partition == nil) != (r.Params.Offset == nil) {
		return nil, badParam("partition and offset go together: both read one message without a lease, neither takes one under a lease")
	}
	if r.Params.Partition != nil {
		if *r.Params.Partition < 0 || *r.Params.Offset < 0 {
			return nil, badParam("partition and offset must be 0 or more")
		}
		d, err := h.b.ReadOne(ctx, r.Topic, *r.Params.Partition, uint64(*r.Params.Offset))
		if err != nil {
			return nil, err
		}
		if d == nil {
			return apigen.Consume204Response{}, nil
		}
		return messageResponse{topic: r.Topic, d: d, forceBase64: b64}, nil
	}
	lctx, ended, stop := h.whileMayConsume(ctx, r.Topic)
	defer stop()
	ds, err := h.b.Consume(lctx, r.Topic, 1, wait)
	if len(ds) == 0 {
		_ = lctx.Err() // nothing leased: a poll whose rights ended meanwhile says so, not 204
	}
	if eerr := ended(); eerr != nil {
		return nil, eerr
	}
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return apigen.Consume204Response{}, nil
	}
	return messageResponse{topic: r.Topic, d: &ds[0], forceBase64: b64}, nil
}

func (h *handlers) ConsumeBatch(ctx context.Context, r apigen.ConsumeBatchRequestObject) (apigen.ConsumeBatchResponseObject, error) {
	wait, err := parseWait(r.Params.Wait)
	if err != nil {
		return nil, err
	}
	max := 10
	if r.Params.Max != nil {
		if *r.Params.Max < 1 || *r.Params.Max > broker.MaxBatch {
			return nil, badParam("max must be between 1 and " + strconv.Itoa(broker.MaxBatch))
		}
		max = int(*r.Params.Max)
	}
	b64, err := forceBase64(r.Params.PayloadEncoding)
	if err != nil {
		return nil, err
	}
	lctx, ended, stop := h.whileMayConsume(ctx, r.Topic)
	defer stop()
	ds, err := h.b.Consume(lctx, r.Topic, max, wait)
	if len(ds) == 0 {
		_ = lctx.Err() // as in Consume
	}
	if eerr := ended(); eerr != nil {
		return nil, eerr
	}
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return apigen.ConsumeBatch204Response{}, nil
	}
	return messageListResponse{topic: r.Topic, ds: ds, forceBase64: b64}, nil
}
