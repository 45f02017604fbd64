package broker

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// TestRemoteChildKeepsWhatAPartlyStoredBatchStoredPastAShorterBatch: a partly stored
// answer (a partition of the remote topic failing) is remembered so that only the
// unstored messages are sent again. A try after it that got no answer halves the next
// batch; the copy then moved its cursor past the shorter batch and forgot what the
// remote had stored beyond it, so the next batch sent those messages again:
// duplicates with no crash nor lost answer of theirs, although remote-children.md says
// a partly stored answer sends again only what it did not store. What the remote
// stored past the batch now stays remembered for the batch that follows.
func TestRemoteChildKeepsWhatAPartlyStoredBatchStoredPastAShorterBatch(t *testing.T) {
	t.Parallel()
	const remoteParts = 2
	var keys [remoteParts]string
	for i := 0; keys[0] == "" || keys[1] == ""; i++ {
		k := "key-" + strconv.Itoa(i)
		if rp := PartitionForKey([]byte(k), remoteParts); keys[rp] == "" {
			keys[rp] = k
		}
	}
	var mu sync.Mutex
	requests := 0
	stored := map[int64]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req apigen.ProduceBatchRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":{"code":"invalid_json","message":"not a produce-batch"}}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		requests++
		switch requests {
		case 1:
			// Remote partition 1 fails: only partition 0's messages are stored.
			n := 0
			for _, m := range req.Messages {
				if m.Key != nil && PartitionForKey([]byte(*m.Key), remoteParts) == 1 {
					continue
				}
				stored[m.Origin.Offset]++
				n++
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"only part of the batch was stored",` +
				`"partly_stored":{"stored":` + strconv.Itoa(n) + `,"failed_partitions":[1]}}}`))
			return
		case 2:
			// No answer, nothing stored: the connection is cut (the next batch is halved).
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		for _, m := range req.Messages {
			stored[m.Origin.Offset]++
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"results":[]}`))
	}))
	t.Cleanup(srv.Close)

	alternating := make([]string, 10) // alternating between the two remote partitions
	for i := range alternating {
		alternating[i] = keys[i%remoteParts]
	}
	copyTenKeyed(t, srv.URL, remoteParts, alternating)
	mu.Lock()
	defer mu.Unlock()
	if requests < 3 {
		t.Fatalf("%d requests: the scenario did not run", requests)
	}
	for o := range int64(10) {
		if stored[o] != 1 {
			t.Fatalf("the remote stored offsets %v times each, want each once: what the partly stored answer took past the halved batch was sent again", stored)
		}
	}
}
