package httpapi

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// staleTopicBroker is a clustered node that has not applied the creation of
// incarnation current of a topic yet: it knows incarnation seen until CatchUp.
type staleTopicBroker struct {
	Broker
	seen, current uint64
	caughtUp      atomic.Bool
	deleted       atomic.Uint64
}

func (b *staleTopicBroker) TopicMeta(name string) (meta.Topic, error) {
	if b.caughtUp.Load() {
		return meta.Topic{Name: name, Incarnation: b.current}, nil
	}
	return meta.Topic{Name: name, Incarnation: b.seen}, nil
}

func (b *staleTopicBroker) CatchUp(context.Context) error { b.caughtUp.Store(true); return nil }

func (b *staleTopicBroker) DeleteTopic(_ context.Context, _ string, inc uint64) error {
	b.deleted.Store(inc)
	return nil
}

// TestADeleteNamingTheCurrentIncarnationOnANodeBehind: a delete naming the incarnation
// the topic has now (created again through another node a moment ago), sent to a node
// that has not applied that creation yet, deletes it: the node catches up with the
// controller before it answers a mismatch. It answered 409 incarnation_mismatch, on
// its stale view, for the topic the caller had just read.
func TestADeleteNamingTheCurrentIncarnationOnANodeBehind(t *testing.T) {
	t.Parallel()
	b := &staleTopicBroker{seen: 7, current: 9}
	h := &handlers{b: b}
	cur := "9"
	if _, err := h.DeleteTopic(context.Background(), apigen.DeleteTopicRequestObject{Topic: "t", Params: apigen.DeleteTopicParams{Incarnation: &cur}}); err != nil {
		t.Fatalf("a delete of the current incarnation on a node behind: %v", err)
	}
	if got := b.deleted.Load(); got != 9 {
		t.Fatalf("deleted incarnation %d, want 9", got)
	}
	old := "7"
	_, err := h.DeleteTopic(context.Background(), apigen.DeleteTopicRequestObject{Topic: "t", Params: apigen.DeleteTopicParams{Incarnation: &old}})
	if st, code, _ := statusOf(err); st != 409 || code != string(apigen.ErrorCodeIncarnationMismatch) {
		t.Fatalf("a delete of the replaced incarnation answered %d %s (%v), want 409 incarnation_mismatch", st, code, err)
	}
}
