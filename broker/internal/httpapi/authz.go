package httpapi

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// authorize is the one place that decides whether the authenticated user may run an
// operation. It runs as a strict-server middleware, after the request is parsed and
// before its handler, so a refused request has no side effect.
func (h *handlers) authorize(next apigen.StrictHandlerFunc, operationID string) apigen.StrictHandlerFunc {
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, req any) (any, error) {
		u := principal(ctx)
		if u == nil {
			return next(ctx, w, r, req) // security is off
		}
		var err error
		if writesMeta(req) && h.b.Clustered() {
			if u, err = h.current(ctx, u); err != nil {
				return nil, err
			}
			ctx = context.WithValue(ctx, principalKey{}, u)
		}
		switch r := req.(type) {
		case apigen.AlterTopicRequestObject:
			ctx, err = h.ownerOrAdminOfOne(ctx, u, r.Topic)
		case apigen.DeleteTopicRequestObject:
			ctx, err = h.ownerOrAdminOfOne(ctx, u, r.Topic)
		default:
			err = h.allowed(u, req)
		}
		if err != nil {
			return nil, err
		}
		if authorizedHook != nil {
			authorizedHook(req)
		}
		if cp, ok := req.(apigen.ChangePasswordRequestObject); ok {
			if err := h.proveCurrentPassword(r, u, cp); err != nil {
				return nil, err
			}
		}
		return next(ctx, w, r, req)
	}
}

// metaCatchUpBound bounds how long a write to the metadata tries to catch up before
// it is decided (the control plane's own wait for a controller is 5 s);
// catchUpRetry is the pause between tries.
const (
	metaCatchUpBound = 5 * time.Second
	catchUpRetry     = 50 * time.Millisecond
)

// writesMeta reports whether req changes the cluster's metadata: users, grants and
// passwords, topics and their children, members and placement.
func writesMeta(req any) bool {
	switch req.(type) {
	case apigen.CreateUserRequestObject, apigen.DeleteUserRequestObject, apigen.ReplaceGrantsRequestObject,
		apigen.ChangePasswordRequestObject,
		apigen.CreateTopicRequestObject, apigen.AlterTopicRequestObject, apigen.DeleteTopicRequestObject,
		apigen.AttachChildRequestObject, apigen.DetachChildRequestObject, apigen.PauseChildRequestObject, apigen.ResumeChildRequestObject,
		apigen.SetChildCredentialsRequestObject, apigen.UpdateRemoteChildRequestObject,
		apigen.JoinMemberRequestObject, apigen.DecommissionMemberRequestObject, apigen.MovePartitionRequestObject,
		apigen.CancelMoveRequestObject, apigen.RebalanceRequestObject, apigen.ForceLeaderRequestObject:
		return true
	}
	return false
}

// current brings this node's metadata up to the controller's and returns u as it
// stands there. A write to the metadata is decided on a current view, not on this
// node's replica, which may not have applied yet a change made through another node:
// an admin demoted or deleted a moment ago must not, through a node that is behind,
// create another admin, reset someone's password or hand out grants, all of which
// would outlive the demotion. The write costs a round trip to the controller anyway;
// this adds one more (shared by the writes that arrive meanwhile). While no controller
// is known (an election) it tries again, as the write itself would, for up to
// metaCatchUpBound. Data requests stay decided on the node's view: they change
// nothing that outlives a revoke.
func (h *handlers) current(ctx context.Context, u *auth.User) (*auth.User, error) {
	deadline := time.Now().Add(metaCatchUpBound)
	var err error
	for {
		cctx, cancel := context.WithTimeout(ctx, catchUpBound)
		err = h.b.CatchUp(cctx)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().Add(catchUpRetry).After(deadline) {
			break
		}
		t := time.NewTimer(catchUpRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if err != nil {
		return nil, &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
			msg: "this node could not catch up with the control plane to check your rights (no controller, or it is slow); retry after Retry-After seconds"}
	}
	now, ok := h.b.User(u.Name)
	if !ok || now.ID != u.ID || !bytes.Equal(now.Hash, u.Hash) {
		return nil, unauthenticated("wrong username or password")
	}
	return &now, nil
}

func forbidden(msg string) *apiError {
	return newErr(http.StatusForbidden, apigen.ErrorCodeForbidden, msg)
}

func needGrant(u *auth.User, a auth.Action, topic string) error {
	if u.Can(a, topic) {
		return nil
	}
	return forbidden("user " + u.Name + " holds no " + string(a) + " grant on topic " + topic + "; ask an admin for one")
}

// authorizedHook, set only by serial tests (never with t.Parallel), runs between the
// authorization of a request and its handler.
var authorizedHook func(req any)

// noTopic is the incarnation authorized when the topic did not exist at the check: no
// topic has it, so an action bound to it finds none (404) even if one was created since.
const noTopic = ^uint64(0)

type authorizedIncKey struct{}

// authorizedIncarnation is the topic incarnation the request's authorization was
// decided on; 0 when none was checked (security off): the action then takes whatever
// topic of the name exists.
func authorizedIncarnation(ctx context.Context) uint64 {
	inc, _ := ctx.Value(authorizedIncKey{}).(uint64)
	return inc
}

// ownerOrAdminOfOne is ownerOrAdminSeen for an alter or delete: the returned context
// carries the incarnation the rights were checked on, and the action applies to that
// incarnation only. Owner rights belong to one incarnation: a topic deleted and created
// again (by another user, perhaps) between the check and the action is another topic.
func (h *handlers) ownerOrAdminOfOne(ctx context.Context, u *auth.User, topic string) (context.Context, error) {
	if err := h.hideFrom(u, topic); err != nil {
		return ctx, err
	}
	inc, err := h.ownerOrAdminInc(u, topic)
	if err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, authorizedIncKey{}, inc), nil
}

// ownerOrAdmin reports whether u owns the topic or administers it. A topic that does
// not exist is let through so the handler answers 404.
func (h *handlers) ownerOrAdmin(u *auth.User, topic string) error {
	_, err := h.ownerOrAdminInc(u, topic)
	return err
}

// ownerOrAdminInc is ownerOrAdmin that also returns the incarnation it decided on
// (noTopic when none existed).
func (h *handlers) ownerOrAdminInc(u *auth.User, topic string) (uint64, error) {
	t, err := h.b.TopicMeta(topic)
	if err != nil {
		return noTopic, nil
	}
	if owns(u, t) || u.Can(auth.Admin, topic) {
		return t.Incarnation, nil
	}
	return 0, forbidden("only the topic's owner (while holding create on it) or an admin may do this to topic " + topic)
}

// owns reports whether u has owner rights on t: u is the user (by ID, never reused)
// who created it, and still holds a create grant matching it. Ownership is the create
// right carried on, so it ends when that grant does.
func owns(u *auth.User, t meta.Topic) bool {
	return t.OwnerID != 0 && t.OwnerID == u.ID && u.Can(auth.Create, t.Name)
}

// hideFrom answers a user who holds no grant at all on a topic (no pattern of any of
// their grants matches its name) and does not own it exactly as for a topic that does
// not exist, whether it exists or not: 403 against 404 would tell them which topics
// exist. A user with some grant on the topic gets 403 when it lacks the one needed.
func (h *handlers) hideFrom(u *auth.User, topic string) error {
	if u.CanSee(topic) {
		return nil
	}
	if t, err := h.b.TopicMeta(topic); err == nil && owns(u, t) {
		return nil // unreachable while owner rights need a create grant, which CanSee sees
	}
	return broker.ErrTopicNotFound
}

func (h *handlers) canSee(u *auth.User, t meta.Topic) bool {
	return owns(u, t) || u.CanSee(t.Name)
}

// ownerOrAdminSeen is ownerOrAdmin for a topic the user may know of (see hideFrom).
func (h *handlers) ownerOrAdminSeen(u *auth.User, topic string) error {
	if err := h.hideFrom(u, topic); err != nil {
		return err
	}
	return h.ownerOrAdmin(u, topic)
}

// needGrantSeen is needGrant for a topic the user may know of (see hideFrom).
func (h *handlers) needGrantSeen(u *auth.User, a auth.Action, topic string) error {
	if err := h.hideFrom(u, topic); err != nil {
		return err
	}
	return needGrant(u, a, topic)
}

func mustBeAdmin(u *auth.User) error {
	if u.IsAdmin() {
		return nil
	}
	return forbidden("this needs an admin grant on *")
}

func (h *handlers) allowed(u *auth.User, req any) error {
	switch r := req.(type) {
	case apigen.HealthzRequestObject, apigen.ReadyzRequestObject,
		apigen.ListTopicsRequestObject, apigen.ListTopicStatsRequestObject, apigen.GetClusterRequestObject, apigen.ListMembersRequestObject:
		return nil // list answers are filtered to what the user may see
	case apigen.MetricsRequestObject:
		return mustBeAdmin(u)
	case apigen.CreateTopicRequestObject:
		if r.Body == nil {
			return nil
		}
		if err := needGrant(u, auth.Create, r.Body.Name); err != nil {
			return err
		}
		if r.Body.Parent != nil {
			if err := h.hideFrom(u, *r.Body.Parent); err != nil {
				return err
			}
			if err := h.ownerOrAdmin(u, *r.Body.Parent); err != nil {
				return err
			}
			return needGrant(u, auth.Consume, *r.Body.Parent)
		}
		return nil
	case apigen.GetTopicRequestObject:
		return h.hideFrom(u, r.Topic)
	case apigen.GetTopicStatsRequestObject:
		return h.hideFrom(u, r.Topic)
	case apigen.ListChildrenRequestObject:
		return h.hideFrom(u, r.Topic)
	case apigen.AttachChildRequestObject:
		if err := h.ownerOrAdminSeen(u, r.Topic); err != nil {
			return err
		}
		if err := needGrant(u, auth.Consume, r.Topic); err != nil {
			return err
		}
		if r.Body != nil && r.Body.Remote == nil { // a remote child's topic is the remote's to guard
			return h.ownerOrAdminSeen(u, r.Body.Child)
		}
		return nil
	case apigen.DetachChildRequestObject:
		return h.ownerOrAdminSeen(u, r.Topic)
	case apigen.PauseChildRequestObject:
		return h.ownerOrAdminSeen(u, r.Topic)
	case apigen.ResumeChildRequestObject:
		return h.ownerOrAdminSeen(u, r.Topic)
	case apigen.SetChildCredentialsRequestObject:
		return h.ownerOrAdminSeen(u, r.Topic)
	case apigen.UpdateRemoteChildRequestObject:
		// A new URL or user sends the parent's messages elsewhere: what attach needs.
		if err := h.ownerOrAdminSeen(u, r.Topic); err != nil {
			return err
		}
		return needGrant(u, auth.Consume, r.Topic)
	case apigen.ProduceRequestObject:
		return h.needGrantSeen(u, auth.Produce, r.Topic)
	case apigen.ProduceBatchRequestObject:
		return h.needGrantSeen(u, auth.Produce, r.Topic)
	case apigen.ConsumeRequestObject:
		return h.needGrantSeen(u, auth.Consume, r.Topic)
	case apigen.ConsumeBatchRequestObject:
		return h.needGrantSeen(u, auth.Consume, r.Topic)
	case apigen.AckRequestObject:
		return h.needGrantSeen(u, auth.Consume, r.Topic)
	case apigen.AckBatchRequestObject:
		return h.needGrantSeen(u, auth.Consume, r.Topic)
	case apigen.ReadMessagesRequestObject:
		return h.needGrantSeen(u, auth.Consume, r.Topic)
	case apigen.CreateUserRequestObject:
		if err := mustBeAdmin(u); err != nil {
			return err
		}
		if r.Body != nil && r.Body.Grants != nil && !u.Covers(toGrants(*r.Body.Grants)) {
			return forbidden("nobody may grant more than they hold")
		}
		return nil
	case apigen.ReplaceGrantsRequestObject:
		if err := mustBeAdmin(u); err != nil {
			return err
		}
		if r.Body != nil && !u.Covers(toGrants(r.Body.Grants)) {
			return forbidden("nobody may grant more than they hold")
		}
		return nil
	case apigen.ListUsersRequestObject, apigen.DeleteUserRequestObject,
		apigen.JoinMemberRequestObject, apigen.DecommissionMemberRequestObject, apigen.MovePartitionRequestObject,
		apigen.ListMovesRequestObject, apigen.CancelMoveRequestObject, apigen.RebalanceRequestObject, apigen.ForceLeaderRequestObject:
		return mustBeAdmin(u)
	case apigen.GetUserRequestObject:
		if r.Username == u.Name {
			return nil
		}
		return mustBeAdmin(u)
	case apigen.ChangePasswordRequestObject:
		if r.Username == u.Name || u.IsAdmin() {
			return nil // a user changing their own password also proves the current one (proveCurrentPassword)
		}
		return forbidden("only the user themself or an admin may change this password")
	}
	return forbidden("this operation is not open to user " + u.Name)
}

func toGrants(gs []apigen.Grant) []auth.Grant {
	out := make([]auth.Grant, len(gs))
	for i, g := range gs {
		out[i] = auth.Grant{Action: auth.Action(g.Action), Topics: g.Topics}
	}
	return out
}

func fromGrants(gs []auth.Grant) []apigen.Grant {
	out := make([]apigen.Grant, len(gs))
	for i, g := range gs {
		out[i] = apigen.Grant{Action: apigen.GrantAction(g.Action), Topics: g.Topics}
	}
	return out
}
