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
	// Name is the child topic (for a remote child, the topic in the remote cluster).
	Name string
	// ID is what DetachChild, PauseChild and ResumeChild take: the topic's name for a
	// child in this cluster, "remote:<n>" for a remote child. "" from a broker that
	// does not say (then use Name).
	ID string
	// Remote describes a remote child's other end; nil for a child in this cluster.
	Remote *RemoteEnd
	// FanoutDelay delays the copies (a delay child); 0 copies at once.
	FanoutDelay time.Duration
	// State is "running", or "paused" while the child's owner may no longer consume the
	// parent (nothing is copied until the grant returns; the copy then resumes where it
	// stopped), or a remote child was paused; "failing" while a remote child's copy fails
	// in some partition (it is retried). "" from a broker that does not say.
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
	// The rest is given for remote children only. LagSeconds is the age of the oldest
	// message not yet copied; State is "copying", "paused" or "failing", with Reason
	// (why, and what to do) and LastError (kept after a recovery); Expired counts the
	// messages retention deleted before they were copied.
	LagSeconds               float64
	State, Reason, LastError string
	Expired                  int64
}

// RemoteEnd is the other end of a remote child. Its credentials are never shown.
type RemoteEnd struct {
	URL      string `json:"url"`
	Topic    string `json:"topic"`
	Username string `json:"username,omitempty"`
	// Incarnation is the remote topic's incarnation the copy goes to; ClusterID the
	// remote cluster's id, when it tells it.
	Incarnation string `json:"incarnation"`
	ClusterID   string `json:"cluster_id,omitempty"`
	// Start is "now" or "earliest", as attached.
	Start string `json:"start"`
}

// RemoteChildSpec says where a remote child's copy goes and as whom.
type RemoteChildSpec struct {
	// URL is the remote cluster's base URL, http:// or https://host[:port].
	URL string
	// Username and Password are a user of the remote cluster that may produce to the
	// remote topic. The broker stores the password encrypted and never shows it again.
	Username, Password string
	// CAPEM, when set, are the PEM certificates trusted for an https URL.
	CAPEM string
	// Start is "now" (the default: what is committed from now on) or "earliest" (also
	// every message the parent still holds).
	Start string
}

// AttachRemoteChild makes topic remoteTopic of another cluster a child of parent: every
// message committed to parent is copied there through that cluster's HTTP API, at least
// once. The broker first checks that the remote topic exists and that the credentials
// may produce to it (ErrConflict, with the remote's answer, otherwise).
func (c *Client) AttachRemoteChild(ctx context.Context, parent, remoteTopic string, spec RemoteChildSpec) (*Child, error) {
	rm := api.RemoteChildRequest{Url: spec.URL, Username: spec.Username, Password: spec.Password}
	if spec.CAPEM != "" {
		rm.CaPem = &spec.CAPEM
	}
	if spec.Start != "" {
		st := api.RemoteChildRequestStart(spec.Start)
		rm.Start = &st
	}
	req := api.AttachChildRequest{Child: remoteTopic, Remote: &rm}
	var out api.Child
	if err := c.doJSON(ctx, &call{op: "attach-child", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewAttachChildRequest(s, parent, req) }}, &out); err != nil {
		return nil, err
	}
	ch := childOf(out)
	return &ch, nil
}

// PauseChild pauses the copy to parent's remote child id ("remote:<n>"); the cursor
// stays, and ResumeChild continues from it. A child in this cluster is ErrConflict.
func (c *Client) PauseChild(ctx context.Context, parent, id string) error {
	return c.doJSON(ctx, &call{op: "pause-child", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewPauseChildRequest(s, parent, id) }}, nil)
}

// ResumeChild resumes a paused remote child's copy where it stopped.
func (c *Client) ResumeChild(ctx context.Context, parent, id string) error {
	return c.doJSON(ctx, &call{op: "resume-child", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewResumeChildRequest(s, parent, id) }}, nil)
}

// SetRemoteChildPassword gives parent's remote child id ("remote:<n>") the remote
// user's new password, after it changed on the remote: the copy goes on from its cursor.
// The broker first checks the password with the remote (ErrConflict, saying why, when it
// refuses; the stored one is kept). A child in this cluster is ErrConflict.
func (c *Client) SetRemoteChildPassword(ctx context.Context, parent, id, password string) error {
	req := api.ChildCredentialsRequest{Password: password}
	return c.doJSON(ctx, &call{op: "set-child-credentials", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewSetChildCredentialsRequest(s, parent, id, req) }}, nil)
}

// RemoteChildUpdate is what UpdateRemoteChild changes of a remote child; nil members
// are kept. A new URL, Username or CAPEM needs the Password (ErrBadRequest without
// it): the broker never sends the stored one anywhere it did not before. CAPEM ""
// goes back to the system's CAs.
type RemoteChildUpdate struct {
	URL, Username, Password, CAPEM *string
}

// UpdateRemoteChild changes how parent's remote child id ("remote:<n>") reaches its
// remote, in place: its URL (the remote cluster moved, or is reached by another
// name), the user it produces as, its password, the CA certificates of an https URL.
// The copy goes on from its cursor: nothing is skipped or sent again. The broker asks
// the remote first with the new settings; ErrConflict, saying why, when it cannot be
// reached, refuses them, or is another cluster or topic incarnation than the child's
// (attach those as a new child), and nothing is changed. ErrBadRequest for a URL or CA
// it cannot use. It returns the child as it is now.
func (c *Client) UpdateRemoteChild(ctx context.Context, parent, id string, u RemoteChildUpdate) (*Child, error) {
	req := api.RemoteChildUpdate{Url: u.URL, Username: u.Username, Password: u.Password, CaPem: u.CAPEM}
	var out api.Child
	if err := c.doJSON(ctx, &call{op: "update-remote-child", topic: parent,
		build: func(s string) (*http.Request, error) { return api.NewUpdateRemoteChildRequest(s, parent, id, req) }}, &out); err != nil {
		return nil, err
	}
	ch := childOf(out)
	return &ch, nil
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

// DetachChild stops copying parent's messages to child (a topic's name, or a remote
// child's ID); both topics stay.
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
	if ch.Id != nil {
		out.ID = *ch.Id
	}
	if r := ch.Remote; r != nil {
		out.Remote = &RemoteEnd{URL: r.Url, Topic: r.Topic, Incarnation: r.Incarnation, Start: string(r.Start)}
		if r.Username != nil {
			out.Remote.Username = *r.Username
		}
		if r.ClusterId != nil {
			out.Remote.ClusterID = *r.ClusterId
		}
	}
	if ch.State != nil {
		out.State = string(*ch.State)
	}
	if ch.PausedReason != nil {
		out.PausedReason = *ch.PausedReason
	}
	if ch.Lag != nil {
		for _, l := range *ch.Lag {
			cl := ChildLag{Partition: l.Partition, ParentNextOffset: l.ParentNextOffset, ChildCursor: l.ChildCursor, Lag: l.Lag}
			if l.LagSeconds != nil {
				cl.LagSeconds = *l.LagSeconds
			}
			if l.State != nil {
				cl.State = string(*l.State)
			}
			if l.Reason != nil {
				cl.Reason = *l.Reason
			}
			if l.LastError != nil {
				cl.LastError = *l.LastError
			}
			if l.Expired != nil {
				cl.Expired = *l.Expired
			}
			out.Lag = append(out.Lag, cl)
		}
	}
	return out
}
