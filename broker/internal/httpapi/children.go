package httpapi

import (
	"context"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
)

func childJSON(c broker.ChildInfo) apigen.Child {
	lag := make([]apigen.ChildLag, len(c.Lag))
	for i, l := range c.Lag {
		behind := int64(0)
		if l.ParentNext > l.Cursor {
			behind = int64(l.ParentNext - l.Cursor)
		}
		lag[i] = apigen.ChildLag{Partition: l.Partition, ParentNextOffset: int64(l.ParentNext), ChildCursor: int64(l.Cursor), Lag: behind}
	}
	id := c.Name
	out := apigen.Child{Child: c.Name, Id: &id, FanoutDelayMs: c.DelayMs, Lag: &lag}
	state := apigen.ChildStateRunning
	if c.Paused != "" {
		state = apigen.ChildStatePaused
		out.PausedReason = &c.Paused
	}
	out.State = &state
	return out
}

func (h *handlers) AttachChild(ctx context.Context, r apigen.AttachChildRequestObject) (apigen.AttachChildResponseObject, error) {
	if r.Body.Remote != nil {
		return h.attachRemoteChild(ctx, r)
	}
	delay := int64(0)
	if r.Body.FanoutDelayMs != nil {
		delay = *r.Body.FanoutDelayMs
	}
	c, err := h.b.AttachChild(ctx, r.Topic, r.Body.Child, delay)
	if err != nil {
		return nil, err
	}
	return apigen.AttachChild201JSONResponse(childJSON(c)), nil
}

func (h *handlers) ListChildren(ctx context.Context, r apigen.ListChildrenRequestObject) (apigen.ListChildrenResponseObject, error) {
	cs, err := h.b.Children(r.Topic)
	if err != nil {
		return nil, err
	}
	out := apigen.ListChildren200JSONResponse{Children: make([]apigen.Child, len(cs))}
	for i, c := range cs {
		out.Children[i] = childJSON(c)
	}
	rs, err := h.b.RemoteChildren(r.Topic)
	if err != nil {
		return nil, err
	}
	// A remote child's last_error is the remote's words, which can quote a message (a
	// schema refusal quotes the value that did not match): shown only to a user who may
	// read the parent's messages. Others see the state and the reason, fixed texts.
	u := principal(ctx)
	quotes := u == nil || u.IsAdmin() || u.Can(auth.Consume, r.Topic)
	for _, c := range rs {
		if !quotes {
			for i := range c.Lag {
				c.Lag[i].LastError = ""
			}
		}
		out.Children = append(out.Children, remoteChildJSON(c))
	}
	return out, nil
}

func (h *handlers) DetachChild(ctx context.Context, r apigen.DetachChildRequestObject) (apigen.DetachChildResponseObject, error) {
	detach := h.b.DetachChild
	if broker.IsRemoteChildID(r.Child) {
		detach = h.b.DetachRemoteChild
	}
	if err := detach(ctx, r.Topic, r.Child); err != nil {
		return nil, err
	}
	return apigen.DetachChild204Response{}, nil
}
