package narad_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	narad "github.com/narad-mq/narad/sdk-go"
)

// mismatch reports whether err is the SDK's error for a delete naming an incarnation
// the topic no longer is: a 409 conflict with code incarnation_mismatch.
func mismatch(err error) bool {
	var e *narad.Error
	return errors.Is(err, narad.ErrConflict) && errors.As(err, &e) &&
		e.Code == narad.CodeIncarnationMismatch && e.Status == http.StatusConflict && !narad.Retryable(err)
}

// TestDeleteTopicIncarnation: a delete naming the incarnation a topic had before it was
// deleted and created again fails with a conflict and deletes nothing; naming the
// current one deletes it.
func TestDeleteTopicIncarnation(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	name := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	old, err := c.Topic(ctx, name)
	if err != nil || old.Incarnation == "" {
		t.Fatalf("topic %+v %v", old, err)
	}
	if err := c.DeleteTopic(ctx, name); err != nil {
		t.Fatal(err)
	}
	cur, err := c.CreateTopic(ctx, name, narad.TopicConfig{Partitions: 1})
	if err != nil || cur.Incarnation == "" || cur.Incarnation == old.Incarnation {
		t.Fatalf("recreated %+v %v (old incarnation %s)", cur, err, old.Incarnation)
	}

	err = c.DeleteTopic(ctx, name, narad.WithDeleteIncarnation(old.Incarnation))
	if !mismatch(err) {
		t.Fatalf("delete naming the old incarnation %s: %v; want ErrConflict %s", old.Incarnation, err, narad.CodeIncarnationMismatch)
	}
	if still, err := c.Topic(ctx, name); err != nil || still.Incarnation != cur.Incarnation {
		t.Fatalf("after the refused delete: %+v %v; want incarnation %s", still, err, cur.Incarnation)
	}

	if err := c.DeleteTopic(ctx, name, narad.WithDeleteIncarnation(cur.Incarnation)); err != nil {
		t.Fatalf("delete naming the current incarnation: %v", err)
	}
	if _, err := c.Topic(ctx, name); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("after the delete: %v; want ErrNotFound", err)
	}
	if err := c.DeleteTopic(ctx, name, narad.WithDeleteIncarnation(cur.Incarnation)); !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("delete of a name with no topic: %v; want ErrNotFound", err)
	}
}

// TestDeleteTopicSendsIncarnation: the incarnation goes as the query parameter
// incarnation, a delete without it sends none, and an empty one sends nothing at all.
func TestDeleteTopicSendsIncarnation(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	var sent []string // the incarnation parameter of each DELETE, "-" for none
	ft.set(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodDelete {
			mu.Lock()
			if q := r.URL.Query(); q.Has("incarnation") {
				sent = append(sent, q.Get("incarnation"))
			} else {
				sent = append(sent, "-")
			}
			mu.Unlock()
			return &http.Response{StatusCode: http.StatusNoContent, Header: http.Header{}, Body: http.NoBody}, nil
		}
		return nil, nil
	}, nil)
	if err := c.DeleteTopic(ctx, "orders", narad.WithDeleteIncarnation("42")); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTopic(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTopic(ctx, "orders", narad.WithDeleteIncarnation("")); !errors.Is(err, narad.ErrInvalidOption) {
		t.Fatalf("empty incarnation: %v; want ErrInvalidOption", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || sent[0] != "42" || sent[1] != "-" {
		t.Fatalf("incarnation parameters sent %q; want [42 -]", sent)
	}
}

// TestDeleteTopicRetryAfterLostReply: a delete whose reply is lost is retried. When the
// topic is created again between the attempts, the retry of a delete naming the
// incarnation is refused (the new topic stays, and the error is Uncertain: the first
// attempt did delete), while the retry of one naming none deletes the new topic.
func TestDeleteTopicRetryAfterLostReply(t *testing.T) {
	admin := newClient(t)
	ctx := ctxT(t)
	c, ft := newFaultClient(t)

	// loseFirstAndRecreate lets the first DELETE reach the broker, drops its answer,
	// and creates the topic again before the SDK retries.
	loseFirstAndRecreate := func(name string, deletes *atomic.Int32) {
		ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
			if err != nil || r.Method != http.MethodDelete || deletes.Add(1) != 1 {
				return resp, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Errorf("first delete answered %d", resp.StatusCode)
			}
			if _, cerr := admin.CreateTopic(context.WithoutCancel(r.Context()), name, narad.TopicConfig{Partitions: 1}); cerr != nil {
				t.Errorf("recreating %s: %v", name, cerr)
			}
			return nil, errors.New("connection reset by peer (injected)")
		})
	}

	t.Run("with incarnation", func(t *testing.T) {
		name := mustTopic(t, admin, narad.TopicConfig{Partitions: 1})
		old, err := admin.Topic(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var deletes atomic.Int32
		loseFirstAndRecreate(name, &deletes)
		defer ft.set(nil, nil)
		err = c.DeleteTopic(ctx, name, narad.WithDeleteIncarnation(old.Incarnation))
		if !mismatch(err) || !narad.Uncertain(err) || deletes.Load() != 2 {
			t.Fatalf("delete retried after a lost reply: %v (uncertain %v) after %d attempts; want an uncertain %s conflict after 2",
				err, narad.Uncertain(err), deletes.Load(), narad.CodeIncarnationMismatch)
		}
		now, err := admin.Topic(ctx, name)
		if err != nil || now.Incarnation == old.Incarnation {
			t.Fatalf("the topic created again: %+v %v; want it kept", now, err)
		}
	})

	t.Run("without incarnation", func(t *testing.T) {
		name := mustTopic(t, admin, narad.TopicConfig{Partitions: 1})
		var deletes atomic.Int32
		loseFirstAndRecreate(name, &deletes)
		defer ft.set(nil, nil)
		// Not resent: a resend would delete the topic created again meanwhile (it did).
		if err := c.DeleteTopic(ctx, name); err == nil || !narad.Uncertain(err) || deletes.Load() != 1 {
			t.Fatalf("delete after a lost reply: %v (uncertain %v) after %d attempts; want an uncertain error after 1", err, narad.Uncertain(err), deletes.Load())
		}
		if _, err := admin.Topic(ctx, name); err != nil {
			t.Fatalf("the topic created again: %v; want it kept", err)
		}
	})
}
