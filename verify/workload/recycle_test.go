package workload

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// A create of the Recycled topic that answers 409 because the topic cannot be created
// yet (its replication factor is more than the live nodes while a node is down) is tried
// again once the node is back. A soak run once hung here: the recycler took every 409
// for "an earlier attempt created it" and read the topic until it existed, which it
// never would.
func TestRecreateTriesAgainAfterAConflictForATopicThatDoesNotExist(t *testing.T) {
	var mu sync.Mutex
	conflicts, created := 2, false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodPost && conflicts > 0:
			conflicts--
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"conflict","message":"replication_factor 3 is more than the 2 live nodes"}}`))
		case r.Method == http.MethodPost:
			created = true
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"name":"recycled","incarnation":"7","partitions":[]}`))
		case r.Method == http.MethodGet && created:
			_, _ = w.Write([]byte(`{"name":"recycled","incarnation":"7","partitions":[]}`))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"no topic recycled"}}`))
		}
	}))
	defer srv.Close()
	rec, err := history.Create(filepath.Join(t.TempDir(), "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	w := &run{rec: rec, clk: history.NewClock(), stats: &Stats{}}
	c := newClient("recycler", []endpoint{{id: "n1", url: srv.URL}}, rec, w.clk)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !w.recreate(ctx, c, map[string]any{"name": Recycled, "partitions": 1, "replication_factor": 3}) {
		t.Fatalf("recreate gave up (context: %v); notes: %v", ctx.Err(), w.stats.Notes)
	}
	mu.Lock()
	defer mu.Unlock()
	if !created || conflicts != 0 {
		t.Fatalf("created %v after %d conflicts left; want the create tried until it answered 201", created, conflicts)
	}
	if w.gen.Load() != 1 {
		t.Fatalf("incarnations made %d, want 1", w.gen.Load())
	}
}

// The wait for the recycler's last round is bounded: a cluster that keeps refusing the
// create (a seed once held a run for ever when a live node stayed counted dead) fails
// the run when the bound passes.
func TestWaitGroupForIsBounded(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	if waitGroupFor(&wg, 50*time.Millisecond) {
		t.Fatal("a wait group that never finished was reported finished")
	}
	wg.Done()
	if !waitGroupFor(&wg, 10*time.Second) {
		t.Fatal("a finished wait group was not reported finished")
	}
}
