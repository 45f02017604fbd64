package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// TestRemoteChildShrinksABatchTheLinkCannotCarry: a remote (or the path to it) that
// cannot take a full batch within the request's bound and gives no answer (a slow link
// times the request out, a middlebox cuts a large request) while it takes smaller ones.
// The copy sent the same full batch again at every retry, for good: nothing more was
// copied while the parent held the messages, retention then lost them, and each try the
// remote stored after all was one more copy of that batch. Only a 413 answer made
// batches smaller; a request that got no answer now does too (they grow back after
// each batch the remote takes).
func TestRemoteChildShrinksABatchTheLinkCannotCarry(t *testing.T) {
	t.Parallel()
	const most = 8 // messages the link carries in one request
	var mu sync.Mutex
	var stored []uint64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req apigen.ProduceBatchRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":{"code":"invalid_json","message":"not a produce-batch"}}`, http.StatusBadRequest)
			return
		}
		if len(req.Messages) > most {
			// No answer: the connection is cut, as a request that ran out of time.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		mu.Lock()
		for _, m := range req.Messages {
			if m.Origin != nil {
				stored = append(stored, uint64(m.Origin.Offset))
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"results":[]}`))
	}))
	t.Cleanup(srv.Close)

	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []Outgoing
	for range 20 {
		msgs = append(msgs, Outgoing{Partition: 0, Value: []byte(`{"n":1}`), Attrs: PayloadKindJSON})
	}
	if _, err := b.Produce(ctx, "orders", msgs); err != nil {
		t.Fatal(err)
	}
	rc := attachFake(t, b, &fakeRemote{srv: srv}, "orders", m.Incarnation, 0, "remote-password-42")
	waitUntil(t, "the 20 messages to be copied in batches the link carries", func() bool {
		r, ok := b.meta.RemoteChild(rc.ID)
		return ok && r.Cursors[0] == 20
	})
	mu.Lock()
	defer mu.Unlock()
	if len(stored) != 20 {
		t.Fatalf("the remote stored %d messages, want 20 (each once)", len(stored))
	}
	for i, o := range stored {
		if o != uint64(i) {
			t.Fatalf("the remote stored offsets %v, want 0 to 19 in order", stored)
		}
	}
}
