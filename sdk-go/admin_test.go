package narad_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestTopicsAdmin(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	name := mustTopic(t, c, narad.TopicConfig{
		Partitions: 2, Retention: time.Hour, VisibilityTimeout: 5 * time.Second,
		MaxInFlightPerPartition: 10, MaxAckedAheadPerPartition: 20,
	})
	info, err := c.Topic(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Partitions != 2 || info.Retention != time.Hour || info.VisibilityTimeout != 5*time.Second ||
		info.MaxInFlightPerPartition != 10 || info.MaxAckedAheadPerPartition != 20 || info.ReplicationFactor != 1 ||
		info.Incarnation == "" || info.CreatedAt.IsZero() || len(info.Stats) != 2 || info.Stats[1].Partition != 1 || info.Stats[0].Leader == "" {
		t.Fatalf("topic %+v", info)
	}
	if _, err := c.Produce(ctx, name, "x", narad.WithPartition(1)); err != nil {
		t.Fatal(err)
	}
	info, _ = c.Topic(ctx, name)
	if s := info.Stats[1]; s.NextOffset != 1 || s.HighWatermark != 1 || s.Backlog != 1 {
		t.Fatalf("stats %+v", s)
	}

	_, err = c.CreateTopic(ctx, name, narad.TopicConfig{})
	var e *narad.Error
	if !errors.Is(err, narad.ErrConflict) || !errors.As(err, &e) || e.Code != "topic_exists" || e.Status != http.StatusConflict {
		t.Fatalf("duplicate create: %v", err)
	}
	same, err := c.EnsureTopic(ctx, name, narad.TopicConfig{Partitions: 7})
	if err != nil || same.Partitions != 2 || same.Incarnation != info.Incarnation {
		t.Fatalf("ensure existing: %+v %v", same, err)
	}

	v := 9 * time.Second
	inFlight := 99
	altered, err := c.AlterTopic(ctx, name, narad.TopicUpdate{VisibilityTimeout: &v, MaxInFlightPerPartition: &inFlight})
	if err != nil || altered.VisibilityTimeout != v || altered.MaxInFlightPerPartition != 99 || altered.Retention != time.Hour {
		t.Fatalf("alter: %+v %v", altered, err)
	}

	all, err := c.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ti := range all {
		found = found || ti.Name == name
	}
	if !found {
		t.Fatalf("%s not listed", name)
	}

	if err := c.DeleteTopic(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Topic(ctx, name); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("deleted topic: %v", err)
	}
	if err := c.DeleteTopic(ctx, name); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	again, err := c.EnsureTopic(ctx, name, narad.TopicConfig{Partitions: 1})
	if err != nil || again.Incarnation == info.Incarnation {
		t.Fatalf("recreated: %+v %v", again, err)
	}
	if _, err := c.CreateTopic(ctx, "bad/name", narad.TopicConfig{}); !errors.Is(err, narad.ErrBadRequest) {
		t.Fatalf("bad name: %v", err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestChildrenFanOut attaches a child, sees copies arrive with their keys and the lag
// go to zero, detaches it, and creates a child with its parent in one step.
func TestChildrenFanOut(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	parent := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	child := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	ch, err := c.AttachChild(ctx, parent, child, 0)
	if err != nil || ch.Name != child || ch.FanoutDelay != 0 || ch.State != "running" || ch.PausedReason != "" {
		t.Fatalf("attach: %+v %v", ch, err)
	}
	if _, err := c.AttachChild(ctx, parent, child, 0); !errors.Is(err, narad.ErrConflict) {
		t.Fatalf("second attach: %v", err)
	}
	for i := 0; i < 4; i++ {
		if _, err := c.Produce(ctx, parent, []byte{byte(i)}, narad.WithKey("k")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "the copies to be made", func() bool {
		cs, err := c.Children(ctx, parent)
		if err != nil || len(cs) != 1 || cs[0].Name != child || len(cs[0].Lag) != 2 {
			return false
		}
		for _, l := range cs[0].Lag {
			if l.Lag != 0 {
				return false
			}
		}
		return true
	})
	msgs, err := c.Receive(ctx, child, narad.WithMaxMessages(10), narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 4 {
		t.Fatalf("child got %d messages (%v)", len(msgs), err)
	}
	for _, m := range msgs {
		if m.Key != "k" || len(m.Bytes()) != 1 {
			t.Fatalf("copy %+v %q", m, m.Bytes())
		}
	}
	if _, err := c.AckBatch(ctx, child, msgs); err != nil {
		t.Fatal(err)
	}
	if err := c.DetachChild(ctx, parent, child); err != nil {
		t.Fatal(err)
	}
	if err := c.DetachChild(ctx, parent, child); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("second detach: %v", err)
	}
	if cs, err := c.Children(ctx, parent); err != nil || len(cs) != 0 {
		t.Fatalf("children after detach: %+v %v", cs, err)
	}
	// Create-with-parent; children cannot have children.
	info, err := c.CreateChild(ctx, parent, child+"-b", 0, narad.TopicConfig{Partitions: 1})
	if err != nil || info.Parent != parent {
		t.Fatalf("create with parent: %+v %v", info, err)
	}
	_, err = c.CreateChild(ctx, child+"-b", child+"-c", 0, narad.TopicConfig{})
	var e *narad.Error
	if !errors.Is(err, narad.ErrConflict) || !errors.As(err, &e) || e.Status != http.StatusConflict {
		t.Fatalf("grandchild: %v", err)
	}
}

// TestDelayChild: a delay child's copy becomes consumable no earlier than the delay
// after the parent committed it, and producing straight into it is refused.
func TestDelayChild(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	parent := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	delayed := parent + "-later"
	info, err := c.CreateChild(ctx, parent, delayed, 700*time.Millisecond, narad.TopicConfig{Partitions: 1})
	if err != nil || info.FanoutDelay != 700*time.Millisecond || info.Parent != parent {
		t.Fatalf("create delay child: %+v %v", info, err)
	}
	if _, err := c.Produce(ctx, delayed, "direct"); !errors.Is(err, narad.ErrConflict) {
		t.Fatalf("produce into a delay child: %v", err)
	}
	if _, err := c.Produce(ctx, parent, "remind me"); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, c, delayed)
	parentMsg := firstReplayed(t, c, parent)
	if d := time.Since(parentMsg.Timestamp); d < 650*time.Millisecond || string(m.Bytes()) != "remind me" {
		t.Fatalf("copy %q consumable %s after the parent's commit", m.Bytes(), d)
	}
	m.Ack(ctx)
	cs, err := c.Children(ctx, parent)
	if err != nil || len(cs) != 1 || cs[0].FanoutDelay != 700*time.Millisecond {
		t.Fatalf("children %+v %v", cs, err)
	}
}

func TestSchemaViolationIsABadRequest(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	schema := json.RawMessage(`{"type":"object","required":["id"],"properties":{"id":{"type":"integer"}}}`)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, Schema: schema})
	if _, err := c.Produce(ctx, topic, map[string]int{"id": 1}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Produce(ctx, topic, map[string]string{"id": "one"})
	var e *narad.Error
	if !errors.Is(err, narad.ErrBadRequest) || !errors.As(err, &e) || e.Code != "schema_violation" || narad.Retryable(err) {
		t.Fatalf("schema violation: %v", err)
	}
	info, err := c.Topic(ctx, topic)
	if err != nil || len(info.Schema) == 0 {
		t.Fatalf("schema not shown: %+v %v", info, err)
	}
}

// TestUsersAndAuth runs a private broker with security on: admin manages users, a
// user's grants are enforced (403), wrong credentials answer 401, and a Consumer stops
// on both instead of spinning.
func TestUsersAndAuth(t *testing.T) {
	b, err := startBroker(t.TempDir(), "NARAD_ADMIN_PASSWORD=admin-password-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	ctx := ctxT(t)
	admin := newClientAt(t, []string{b.url}, narad.WithBasicAuth("admin", "admin-password-1"))
	anon := newClientAt(t, []string{b.url})
	if _, err := anon.Topics(ctx); !errors.Is(err, narad.ErrUnauthenticated) || narad.Retryable(err) {
		t.Fatalf("no credentials: %v", err)
	}
	if _, err := admin.CreateTopic(ctx, "orders.eu", narad.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateTopic(ctx, "payroll", narad.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	grants := []narad.Grant{{Action: "produce", Topics: []string{"orders.*"}}}
	u, err := admin.CreateUser(ctx, "alice", "correct horse", grants)
	if err != nil || u.Name != "alice" || len(u.Grants) != 1 || u.Grants[0].Action != "produce" || u.Grants[0].Topics[0] != "orders.*" {
		t.Fatalf("create user: %+v %v", u, err)
	}
	if _, err := admin.CreateUser(ctx, "alice", "correct horse", nil); !errors.Is(err, narad.ErrConflict) {
		t.Fatalf("duplicate user: %v", err)
	}
	alice := newClientAt(t, []string{b.url}, narad.WithBasicAuth("alice", "correct horse"))
	if _, err := alice.Produce(ctx, "orders.eu", "ok"); err != nil {
		t.Fatalf("granted produce: %v", err)
	}
	// A topic the user holds no grant on is hidden: it answers as if it did not exist.
	_, err = alice.Produce(ctx, "payroll", "no")
	var e *narad.Error
	if !errors.Is(err, narad.ErrNotFound) || !errors.As(err, &e) || e.Status != http.StatusNotFound || e.Code != narad.CodeTopicNotFound {
		t.Fatalf("ungranted produce: %v", err)
	}
	// A consumer without the consume grant stops with 403 at once.
	if err := alice.Consume(ctx, "orders.eu", func(context.Context, *narad.Message) error { return nil }); !errors.Is(err, narad.ErrForbidden) {
		t.Fatalf("consume without grant: %v", err)
	}
	// Grants replaced: now alice may consume too.
	grants = append(grants, narad.Grant{Action: "consume", Topics: []string{"orders.*"}})
	u, err = admin.ReplaceGrants(ctx, "alice", grants)
	if err != nil || len(u.Grants) != 2 {
		t.Fatalf("replace grants: %+v %v", u, err)
	}
	msgs, err := alice.Receive(ctx, "orders.eu", narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 1 || msgs[0].Ack(ctx) != nil {
		t.Fatalf("granted consume: %v", err)
	}
	got, err := alice.User(ctx, "alice")
	if err != nil || got.Name != "alice" {
		t.Fatalf("user themself: %+v %v", got, err)
	}
	users, err := admin.Users(ctx)
	if err != nil || len(users) != 2 {
		t.Fatalf("users: %+v %v", users, err)
	}
	if _, err := alice.Users(ctx); !errors.Is(err, narad.ErrForbidden) {
		t.Fatalf("users as alice: %v", err)
	}
	// Alice changes her own password; the old one stops working.
	if err := alice.ChangePassword(ctx, "alice", "correct horse", "battery staple"); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Produce(ctx, "orders.eu", "old password"); !errors.Is(err, narad.ErrUnauthenticated) {
		t.Fatalf("old password: %v", err)
	}
	alice2 := newClientAt(t, []string{b.url}, narad.WithBasicAuth("alice", "battery staple"))
	if err := alice2.Consume(ctx, "payroll", func(context.Context, *narad.Message) error { return nil }); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("consume payroll (hidden without a grant): %v", err)
	}
	if err := admin.ChangePassword(ctx, "alice", "", "reset by admin"); err != nil {
		t.Fatalf("admin reset: %v", err)
	}
	if err := admin.DeleteUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.User(ctx, "alice"); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("deleted user: %v", err)
	}
	// A consumer with wrong credentials stops with 401.
	if err := alice2.Consume(ctx, "orders.eu", func(context.Context, *narad.Message) error { return nil }); !errors.Is(err, narad.ErrUnauthenticated) {
		t.Fatalf("consume as a deleted user: %v", err)
	}
}

func TestBasicAuthIsSent(t *testing.T) {
	c, ft := newFaultClient(t, narad.WithBasicAuth("alice", "s3cret"), narad.WithUserAgent("test-agent"))
	var user, pass, ua string
	ft.set(func(r *http.Request) (*http.Response, error) {
		user, pass, _ = r.BasicAuth()
		ua = r.UserAgent()
		return nil, nil
	}, nil)
	if _, err := c.Topics(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if user != "alice" || pass != "s3cret" || ua != "test-agent" {
		t.Fatalf("sent %q %q %q", user, pass, ua)
	}
}

// TestRemoteChildren attaches a remote child (here the same broker, another topic),
// sees copies arrive, pauses, resumes, gives it a new password and detaches it by its
// ID; copying a topic into itself is refused.
func TestRemoteChildren(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	parent := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	child := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	spec := narad.RemoteChildSpec{URL: shared.url, Username: "copier", Password: "sdk-remote-pw"}
	if _, err := c.AttachRemoteChild(ctx, parent, parent, spec); !errors.Is(err, narad.ErrConflict) {
		t.Fatalf("copying a topic into itself: %v, want ErrConflict", err)
	}
	ch, err := c.AttachRemoteChild(ctx, parent, child, spec)
	if err != nil || ch.Name != child || ch.Remote == nil || ch.Remote.URL != shared.url || ch.Remote.Start != "now" || ch.ID == "" || ch.ID == child {
		t.Fatalf("attach: %+v %v", ch, err)
	}
	if _, err := c.Produce(ctx, parent, "hello", narad.WithKey("k")); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Receive(ctx, child, narad.WithMaxMessages(10), narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 || msgs[0].Key != "k" || string(msgs[0].Bytes()) != "hello" {
		t.Fatalf("copy: %+v %v", msgs, err)
	}
	if err := c.PauseChild(ctx, parent, ch.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the child to show paused", func() bool {
		cs, err := c.Children(ctx, parent)
		return err == nil && len(cs) == 1 && cs[0].State == "paused" && cs[0].Lag[0].State == "paused"
	})
	if err := c.ResumeChild(ctx, parent, ch.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.SetRemoteChildPassword(ctx, parent, child, spec.Password); !errors.Is(err, narad.ErrConflict) {
		t.Fatalf("a password for a topic name, not a remote child's id: %v, want ErrConflict", err)
	}
	if err := c.SetRemoteChildPassword(ctx, parent, ch.ID, "sdk-remote-pw-2"); err != nil {
		t.Fatalf("a new password: %v", err)
	}
	user, pass := "copier2", "sdk-remote-pw-3"
	if _, err := c.UpdateRemoteChild(ctx, parent, ch.ID, narad.RemoteChildUpdate{Username: &user}); !errors.Is(err, narad.ErrBadRequest) {
		t.Fatalf("a new user without its password: %v, want ErrBadRequest", err)
	}
	up, err := c.UpdateRemoteChild(ctx, parent, ch.ID, narad.RemoteChildUpdate{Username: &user, Password: &pass})
	if err != nil || up.ID != ch.ID || up.Remote == nil || up.Remote.Username != "copier2" || up.Remote.URL != shared.url {
		t.Fatalf("changed in place: %+v %v", up, err)
	}
	if _, err := c.Produce(ctx, parent, "after", narad.WithKey("k")); err != nil {
		t.Fatal(err)
	}
	msgs, err = c.Receive(ctx, child, narad.WithMaxMessages(10), narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 || string(msgs[0].Bytes()) != "after" {
		t.Fatalf("the copy after the change: %+v %v", msgs, err)
	}
	if err := c.DetachChild(ctx, parent, ch.ID); err != nil {
		t.Fatal(err)
	}
	if cs, err := c.Children(ctx, parent); err != nil || len(cs) != 0 {
		t.Fatalf("children after detach: %+v %v", cs, err)
	}
}
