package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/node"
)

// TestWALFailureStopsTheNode: a node whose write-ahead file fails (the failpoints
// build fails its 40th fdatasync round with EIO) can store nothing more. It must stop
// at once with exit status 74 and say why, rather than answer liveness while every
// write on it fails: the two others take over its leaderships (each partition stores
// again) and keep answering 202,
// every message answered 202 before or after is delivered, and the node restarted
// without the fault replays its write-ahead file and serves again. On the code before
// fail-stop the node kept running and this test found no exit.
func TestWALFailureStopsTheNode(t *testing.T) {
	t.Parallel()
	nodes, _ := startTestCluster(t, 3)
	if s, b := post(t, nodes[0].URL()+"/v1/topics", `{"name":"w","partitions":3,"replication_factor":3,"visibility_timeout_ms":120000}`); s != 201 {
		t.Fatalf("create: %d %s", s, b)
	}
	bad := nodes[2]
	if err := bad.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := bad.Start("NARAD_FAILPOINTS=wal-after-write:eio@40"); err != nil {
		t.Fatal(err)
	}
	if err := bad.WaitReady(2 * time.Minute); err != nil {
		t.Fatal(err)
	}

	// Produce one message at a time through n1 until n3 has stopped and 100 more were
	// answered 202 after it did.
	stored := map[string]bool{}
	after, refused := 0, 0
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; after < 100; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 min: %s running %v, %d stored, %d after its exit, %d refused", bad.ID(), bad.Running(), len(stored), after, refused)
		}
		id := fmt.Sprintf("m%d", i)
		s, b := postBounded(nodes[0].URL()+"/v1/topics/w/produce", fmt.Sprintf(`{"id":%q}`, id))
		switch {
		case s == http.StatusAccepted:
			stored[id] = true
			if !bad.Running() {
				after++
			}
		case s == http.StatusServiceUnavailable || s == 0:
			refused++ // a leader change under way: may or may not be stored
			time.Sleep(20 * time.Millisecond)
		default:
			t.Fatalf("produce %s: %d %s", id, s, b)
		}
	}
	stoppedItself(t, bad)
	// Each partition, those n3 led included, has a leader again and stores.
	for p := range 3 {
		id := fmt.Sprintf("p%d", p)
		for {
			s, b := postBounded(fmt.Sprintf("%s/v1/topics/w/produce?partition=%d", nodes[0].URL(), p), fmt.Sprintf(`{"id":%q}`, id))
			if s == http.StatusAccepted {
				stored[id] = true
				break
			}
			if s != http.StatusServiceUnavailable && s != 0 {
				t.Fatalf("produce to partition %d: %d %s", p, s, b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("partition %d has no leader 2 min after %s stopped", p, bad.ID())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("%d stored, %d of them after %s stopped; %d answered 503 or cut on the way", len(stored), after, bad.ID(), refused)

	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	if err := bad.WaitReady(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	allDelivered(t, nodes[0], stored)
}

// TestWALFailureStopsALoneNode: the same fault on a single node, whose partitions have
// no other copy. It stops with status 74 at the failed round, and every message
// answered 202 before is delivered after a restart without the fault (the failed
// round's own produces got 503 and may be there too). A process exit keeps the page
// cache, so this shows the stop loses nothing; the replay after a power cut is
// broker/internal/broker's TestWALReplayedAtStart.
func TestWALFailureStopsALoneNode(t *testing.T) {
	t.Parallel()
	bin, err := Binary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n, err := node.New(node.Options{Bin: bin, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "node.log"), Args: []string{"--log-level", "warn"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if err := n.Start("NARAD_FAILPOINTS=wal-after-write:eio@60"); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(time.Minute); err != nil {
		t.Fatal(err)
	}
	if s, b := post(t, n.URL()+"/v1/topics", `{"name":"w","partitions":2,"visibility_timeout_ms":120000}`); s != 201 {
		t.Fatalf("create: %d %s", s, b)
	}
	stored := map[string]bool{}
	refused := 0
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; n.Running(); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the node still runs after 2 min and %d produces answered 202", len(stored))
		}
		id := fmt.Sprintf("m%d", i)
		switch s, b := postBounded(n.URL()+"/v1/topics/w/produce", fmt.Sprintf(`{"id":%q}`, id)); {
		case s == http.StatusAccepted:
			stored[id] = true
		case s == http.StatusServiceUnavailable || s == 0:
			refused++ // the failed round's, or the node gone
		default:
			t.Fatalf("produce %s: %d %s", id, s, b)
		}
	}
	stoppedItself(t, n)
	t.Logf("%d answered 202 before the node stopped itself; %d refused or cut", len(stored), refused)
	if len(stored) == 0 {
		t.Fatal("nothing was stored before the fault")
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(time.Minute); err != nil {
		t.Fatal(err)
	}
	allDelivered(t, n, stored)
}

// stoppedItself checks that nd ended with exit status 74, said why in its log, and
// fired the write-ahead failpoint once.
func stoppedItself(t *testing.T, nd *node.Node) {
	t.Helper()
	select {
	case <-nd.Exited():
	case <-time.After(time.Minute):
		t.Fatal("the node did not exit")
	}
	if st := nd.ExitState(); !strings.Contains(st, "exit status 74") {
		t.Fatalf("the node ended with %q, want exit status 74", st)
	}
	log, err := os.ReadFile(nd.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "stopping at once: the write-ahead file failed") || !strings.Contains(string(log), "input/output error") {
		t.Fatalf("the node's log does not say why it stopped; see %s", nd.LogPath())
	}
	fired := nd.TakeFired()
	if len(fired) != 1 || fired[0].Name != "wal-after-write" {
		t.Fatalf("fired %+v, want wal-after-write once", fired)
	}
}

// allDelivered consumes topic w through nd until every id of stored was delivered
// (leases of 2 min: each once), for up to 2 min.
func allDelivered(t *testing.T, nd *node.Node, stored map[string]bool) {
	t.Helper()
	seen := map[string]bool{}
	deadline := time.Now().Add(2 * time.Minute)
	for missing(stored, seen) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages answered 202 never delivered", missing(stored, seen), len(stored))
		}
		for _, id := range consumeIDs(t, nd) {
			seen[id] = true
		}
	}
}

// postBounded posts body to url within 30 s; status 0 when no answer came.
func postBounded(url, body string) (int, []byte) {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func missing(stored, seen map[string]bool) int {
	n := 0
	for id := range stored {
		if !seen[id] {
			n++
		}
	}
	return n
}

// consumeIDs leases up to 100 messages of topic w through nd and returns their ids.
func consumeIDs(t *testing.T, nd *node.Node) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, nd.URL()+"/v1/topics/w/consume-batch?max=100&wait=1s", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil // a node busy with a leader change: the caller tries again
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		time.Sleep(50 * time.Millisecond)
		return nil
	}
	var l struct {
		Messages []struct {
			Payload struct {
				ID string `json:"id"`
			} `json:"payload"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(l.Messages))
	for i, m := range l.Messages {
		ids[i] = m.Payload.ID
	}
	return ids
}
