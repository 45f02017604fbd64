package narad

import (
	"context"
	"net/http"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Child is a child topic of a parent: it receives a copy of every message committed to
// the parent since it was attached, FanoutDelay after the parent committed it.
type Child struct {
	// Name is the child topic.
	Name string
	// FanoutDelay delays the copies (a delay child); 0 copies at once.
	FanoutDelay time.Duration
	// State is "running", or "paused" while the child's owner may no longer consume the
	// parent (nothing is copied until the grant returns; the copy then resumes where it
	// stopped). "" from a broker that does not say.
	State string
	// PausedReason says why the copy is paused and what to do; "" while it runs.
	PausedReason string
	// Lag says, per parent partition, how far the copying is behind.
	Lag []ChildLag
}

// ChildLag is how far a child is behind one partition of its parent.
type ChildLag struct {
	Partition        int32
	ParentNextOffset int64
	ChildCursor      int64
	// Lag counts the parent's messages not yet copied.
	Lag int64
}

// AttachChild makes child (an existing topic) receive a copy of every message committed
// to parent from now on, with its key, delay after the commit (0 for at once: a delay
// child otherwise). There is no backfill. The broker refuses (ErrConflict) a child that
// already has a parent, chains (children cannot have children), more than 64 children,
// differing schemas, and a parent whose retention does not exceed the delay by an hour.
func (c *Client) AttachChild(ctx context.Context, parent, child string, delay time.Duration) (*Child, error) {
	req := api.AttachChildRequest{Child: child}
	if delay > 0 {
		d := delay.Milliseconds()
		req.FanoutDelayMs = &d
	}
	var out api.Child
	if err := c.doJSON(ctx, &call{op: "attach-child", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewAttachChildRequest(s, parent, req) }}, &out); err != nil {
		return nil, err
	}
	ch := childOf(out)
	return &ch, nil
}

// DetachChild stops copying parent's messages to child; both topics stay.
func (c *Client) DetachChild(ctx context.Context, parent, child string) error {
	return c.doJSON(ctx, &call{op: "detach-child", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewDetachChildRequest(s, parent, child) }}, nil)
}

// Children lists parent's children with their lag.
func (c *Client) Children(ctx context.Context, parent string) ([]Child, error) {
	var out api.ChildList
	if err := c.doJSON(ctx, &call{op: "list-children", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewListChildrenRequest(s, parent) }}, &out); err != nil {
		return nil, err
	}
	cs := make([]Child, len(out.Children))
	for i, ch := range out.Children {
		cs[i] = childOf(ch)
	}
	return cs, nil
}

// CreateChild creates topic child with cfg as a child of parent in one step: it gets a
// copy of every message committed to parent from now on, delay after the commit (a
// delay child when delay > 0: the broker-side way to deliver messages later).
func (c *Client) CreateChild(ctx context.Context, parent, child string, delay time.Duration, cfg TopicConfig) (*TopicInfo, error) {
	cfg.Parent, cfg.FanoutDelay = parent, delay
	return c.CreateTopic(ctx, child, cfg)
}

func childOf(ch api.Child) Child {
	out := Child{Name: ch.Child, FanoutDelay: time.Duration(ch.FanoutDelayMs) * time.Millisecond}
	if ch.State != nil {
		out.State = string(*ch.State)
	}
	if ch.PausedReason != nil {
		out.PausedReason = *ch.PausedReason
	}
	if ch.Lag != nil {
		for _, l := range *ch.Lag {
			out.Lag = append(out.Lag, ChildLag{Partition: l.Partition, ParentNextOffset: l.ParentNextOffset, ChildCursor: l.ChildCursor, Lag: l.Lag})
		}
	}
	return out
}
