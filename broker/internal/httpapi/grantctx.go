package httpapi

import (
	"bytes"
	"context"
	"errors"

	"github.com/narad-mq/narad/broker/internal/auth"
)

// grantCtx is the context of a consume that takes leases for an authenticated user.
// Authorization runs once, when the request arrives, but a long poll then waits up to
// 20 s and leases whatever arrives meanwhile: a grant revoked, the user deleted or its
// password changed during the wait (through this node or any other, once this node
// has applied it) must end the poll, not hand the user messages it may no longer
// read. So Err also reports the request as ended once the user, as this node knows it
// now, may no longer consume the topic. The broker asks Err before each look at the
// partitions and again after leasing, when it hands back what it leased for a request
// that has ended: nothing is leased to the user after the change, and nothing is left
// hidden under a lease nobody holds. The check is a map lookup in this node's replica,
// made only when the broker asks, so a parked poll costs nothing more while it waits.
type grantCtx struct {
	context.Context
	cancel context.CancelCauseFunc
	still  func() error
}

// errGrantEnded wraps the refusal a consume gets when the user's rights ended while it
// was being served.
type errGrantEnded struct{ err error }

func (e errGrantEnded) Error() string { return e.err.Error() }
func (e errGrantEnded) Unwrap() error { return e.err }

func (c *grantCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if err := c.still(); err != nil {
		c.cancel(errGrantEnded{err})
		return c.Context.Err()
	}
	return nil
}

// whileMayConsume returns the context to consume topic under for the request's user
// (ctx itself with security off), and ended, which after the consume returns the
// refusal to answer when the user's rights ended meanwhile (nil otherwise). Call stop
// when done.
func (h *handlers) whileMayConsume(ctx context.Context, topic string) (_ context.Context, ended func() error, stop func()) {
	u := principal(ctx)
	if u == nil {
		return ctx, func() error { return nil }, func() {}
	}
	cctx, cancel := context.WithCancelCause(ctx)
	gc := &grantCtx{Context: cctx, cancel: cancel, still: func() error { return h.mayStillConsume(u, topic) }}
	ended = func() error {
		var ge errGrantEnded
		if errors.As(context.Cause(cctx), &ge) {
			return ge.err
		}
		return nil
	}
	return gc, ended, func() { cancel(nil) }
}

// mayStillConsume checks u's consume right on topic against the user as this node
// knows it now: the same user (not deleted, nor deleted and created again under the
// name), with the password it logged in with, still holding consume on the topic.
func (h *handlers) mayStillConsume(u *auth.User, topic string) error {
	now, ok := h.b.User(u.Name)
	if !ok || now.ID != u.ID || !bytes.Equal(now.Hash, u.Hash) {
		return unauthenticated("user " + u.Name + " was deleted or its password changed while the request waited; log in again")
	}
	return h.needGrantSeen(&now, auth.Consume, topic)
}
