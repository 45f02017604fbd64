package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// TestRemoteChildSendsAgainOnlyWhatAPartlyStoredBatchDidNotStore: a remote topic with
// another partition count than the parent's, one of whose partitions cannot take
// writes for a while (its leader electing, its node down): the remote answers 503 with
// partly_stored, naming the failed partition, and stores the rest. The copy sent the
// whole batch again at every retry, so the messages of the remote's healthy partitions
// were stored once more at each (200 ms growing to 10 s, for as long as the partition
// failed), although the answer says which were stored and "resend only the messages
// of the failed partition(s)", what the SDKs do. The copy now sends again only the
// messages the remote did not store.
func TestRemoteChildSendsAgainOnlyWhatAPartlyStoredBatchDidNotStore(t *testing.T) {
	t.Parallel()
	const remoteParts = 2
	var mu sync.Mutex
	failing := 3 // answers that fail remote partition 1
	stored := map[int64]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req apigen.ProduceBatchRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":{"code":"invalid_json","message":"not a produce-batch"}}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		n := 0
		for _, m := range req.Messages {
			if failing > 0 && m.Key != nil && PartitionForKey([]byte(*m.Key), remoteParts) == 1 {
				continue
			}
			stored[m.Origin.Offset]++
			n++
		}
		if failing > 0 && n < len(req.Messages) {
			failing--
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"only part of the batch was stored",` +
				`"partly_stored":{"stored":` + strconv.Itoa(n) + `,"failed_partitions":[1]}}}`))
			return
		}
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"results":[]}`))
	}))
	t.Cleanup(srv.Close)

	keys := make([]string, 10) // spread over both remote partitions
	for k := range keys {
		keys[k] = "key-" + strconv.Itoa(k)
	}
	copyTenKeyed(t, srv.URL, remoteParts, keys)
	mu.Lock()
	defer mu.Unlock()
	for o := range int64(10) {
		if stored[o] != 1 {
			t.Fatalf("the remote stored offsets %v times each, want each once: the messages of its healthy partition were sent again with every retry", stored)
		}
	}
}

// copyTenKeyed stores ten JSON messages with keys in partition 0 of a new topic
// "orders" on a new broker, attaches a remote child copying them to the remote at url
// (a topic of remoteParts partitions) from the start, and waits until its cursor passed
// all ten.
func copyTenKeyed(t *testing.T, url string, remoteParts int32, keys []string) {
	t.Helper()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []Outgoing
	for _, k := range keys {
		msgs = append(msgs, Outgoing{Partition: 0, Key: []byte(k), Value: []byte(`{}`), Attrs: PayloadKindJSON})
	}
	if _, err := b.Produce(ctx, "orders", msgs); err != nil {
		t.Fatal(err)
	}
	rc := attachRemoteAt(t, b, url, remoteParts, "orders", m.Incarnation, 0, "remote-password-42")
	waitUntil(t, "the ten messages to be copied", func() bool {
		r, ok := b.meta.RemoteChild(rc.ID)
		return ok && r.Cursors[0] == uint64(len(keys))
	})
}
