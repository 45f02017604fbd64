package httpapi

import (
	"context"
	"strconv"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// copyFields takes a produce-batch message's timestamp and origin: a message with an
// origin is a copy from another cluster's remote child, stored marked as one.
func copyFields(o *broker.Outgoing, m apigen.OutgoingMessage, at string) error {
	if m.Timestamp != nil {
		if *m.Timestamp < 1 {
			return badParam(at + "timestamp must be a Unix time in milliseconds, 1 or more; leave it out for now")
		}
		o.Timestamp = *m.Timestamp
	}
	if og := m.Origin; og != nil {
		if og.ClusterId == "" || len(og.ClusterId) > broker.MaxClusterIDLen || og.Topic == "" || og.Partition < 0 || og.Offset < 0 {
			return badParam(at + "origin needs cluster_id (at most " + strconv.Itoa(broker.MaxClusterIDLen) + " characters), topic, and a partition and offset of 0 or more")
		}
		o.Attrs |= broker.AttrRemoteCopy
	}
	return nil
}

// maxIncarnationChars is the most digits an incarnation (a uint64) has.
const maxIncarnationChars = 20

// produceCheck reads the fields of a produce-batch request that ask for more checks.
func produceCheck(body *apigen.ProduceBatchRequest) (broker.ProduceCheck, error) {
	chk := broker.ProduceCheck{ValidateOnly: body.ValidateOnly != nil && *body.ValidateOnly}
	if body.Incarnation != nil {
		if len(*body.Incarnation) > maxIncarnationChars {
			return chk, badParam("incarnation is at most " + strconv.Itoa(maxIncarnationChars) + " digits")
		}
		chk.Incarnation = *body.Incarnation
	}
	for _, m := range body.Messages {
		if o := m.Origin; o != nil {
			chk.Origins = append(chk.Origins, broker.Origin{ClusterID: o.ClusterId, Topic: o.Topic, Partition: o.Partition, Offset: uint64(max(o.Offset, 0))})
		}
	}
	return chk, nil
}

// produce is Produce, or ProduceChecked when the request asked for more checks.
func (h *handlers) produce(ctx context.Context, topic string, chk broker.ProduceCheck, msgs []broker.Outgoing) ([]broker.Produced, error) {
	if chk.Incarnation == "" && !chk.ValidateOnly && len(chk.Origins) == 0 {
		return h.b.Produce(ctx, topic, msgs)
	}
	return h.b.ProduceChecked(ctx, topic, chk, msgs)
}

func (h *handlers) attachRemoteChild(ctx context.Context, r apigen.AttachChildRequestObject) (apigen.AttachChildResponseObject, error) {
	rm := r.Body.Remote
	if r.Body.FanoutDelayMs != nil && *r.Body.FanoutDelayMs != 0 {
		return nil, badParam("fanout_delay_ms is for a child topic of this cluster; a remote child copies at once")
	}
	spec := broker.RemoteSpec{URL: rm.Url, Topic: r.Body.Child, Username: rm.Username, Password: rm.Password}
	if rm.CaPem != nil {
		spec.CAPEM = *rm.CaPem
	}
	if rm.Start != nil {
		spec.Start = string(*rm.Start)
	}
	if u := principal(ctx); u != nil {
		spec.OwnerID = u.ID
	}
	c, err := h.b.AttachRemoteChild(ctx, r.Topic, spec)
	if err != nil {
		return nil, err
	}
	return apigen.AttachChild201JSONResponse(remoteChildJSON(c)), nil
}

func remoteChildJSON(c broker.RemoteChildInfo) apigen.Child {
	lag := make([]apigen.ChildLag, len(c.Lag))
	for i, l := range c.Lag {
		behind := int64(0)
		if l.ParentNext > l.Cursor {
			behind = int64(l.ParentNext - l.Cursor)
		}
		e := apigen.ChildLag{Partition: l.Partition, ParentNextOffset: int64(l.ParentNext), ChildCursor: int64(l.Cursor), Lag: behind}
		secs, expired := l.LagSeconds, int64(l.Expired)
		e.LagSeconds, e.Expired = &secs, &expired
		if l.State != "" {
			st := apigen.ChildLagState(l.State)
			e.State = &st
		}
		if l.Reason != "" {
			e.Reason = &l.Reason
		}
		if l.LastError != "" {
			e.LastError = &l.LastError
		}
		lag[i] = e
	}
	id := c.ID
	rc := &apigen.RemoteChild{Url: c.URL, Topic: c.Topic, Incarnation: c.Incarnation, Start: apigen.RemoteChildStart(c.Start)}
	if c.Username != "" {
		rc.Username = &c.Username
	}
	if c.ClusterID != "" {
		rc.ClusterId = &c.ClusterID
	}
	state := apigen.ChildState(c.State)
	out := apigen.Child{Child: c.Topic, Id: &id, Remote: rc, State: &state, Lag: &lag}
	if c.Reason != "" {
		out.PausedReason = &c.Reason
	}
	return out
}

func (h *handlers) PauseChild(ctx context.Context, r apigen.PauseChildRequestObject) (apigen.PauseChildResponseObject, error) {
	if err := h.b.PauseRemoteChild(ctx, r.Topic, r.Child, true); err != nil {
		return nil, err
	}
	return apigen.PauseChild204Response{}, nil
}

func (h *handlers) ResumeChild(ctx context.Context, r apigen.ResumeChildRequestObject) (apigen.ResumeChildResponseObject, error) {
	if err := h.b.PauseRemoteChild(ctx, r.Topic, r.Child, false); err != nil {
		return nil, err
	}
	return apigen.ResumeChild204Response{}, nil
}

func (h *handlers) SetChildCredentials(ctx context.Context, r apigen.SetChildCredentialsRequestObject) (apigen.SetChildCredentialsResponseObject, error) {
	if r.Body == nil {
		return nil, badParam(`send a JSON body {"password": "..."} with the remote user's new password`)
	}
	if err := h.b.UpdateRemoteCredentials(ctx, r.Topic, r.Child, r.Body.Password); err != nil {
		return nil, err
	}
	return apigen.SetChildCredentials204Response{}, nil
}

func (h *handlers) UpdateRemoteChild(ctx context.Context, r apigen.UpdateRemoteChildRequestObject) (apigen.UpdateRemoteChildResponseObject, error) {
	if r.Body == nil {
		return nil, badParam(`send a JSON body with what to change: {"url": "...", "username": "...", "password": "...", "ca_pem": "..."}`)
	}
	up := broker.RemoteUpdate{URL: r.Body.Url, Username: r.Body.Username, Password: r.Body.Password, CAPEM: r.Body.CaPem}
	if u := principal(ctx); u != nil {
		up.OwnerID = u.ID // the child is the changer's from now on, as an attach would make it
	}
	c, err := h.b.UpdateRemoteChild(ctx, r.Topic, r.Child, up)
	if err != nil {
		return nil, err
	}
	// last_error quotes the remote (see ListChildren): for who may read the parent only.
	if u := principal(ctx); u != nil && !u.IsAdmin() && !u.Can(auth.Consume, r.Topic) {
		for i := range c.Lag {
			c.Lag[i].LastError = ""
		}
	}
	return apigen.UpdateRemoteChild200JSONResponse(remoteChildJSON(c)), nil
}
