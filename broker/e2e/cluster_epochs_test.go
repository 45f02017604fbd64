package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestClusterHandleOfAnEarlierGroupAnswers410: a partition with one copy becomes a
// replicated group when its replication factor is raised. A receipt handle it gave
// out before must answer 410 (the lease is gone: leases were the lone copy's memory),
// never a 503 the client would retry until its deadline because the handle's epoch
// looked newer than the new group's first terms.
func TestClusterHandleOfAnEarlierGroupAnswers410(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	atVersion(t, nodes[0], 3)
	nodes[0].api.createTopic("e", map[string]any{"partitions": 1, "replication_factor": 1, "visibility_timeout_ms": 60000})
	lead := leaderOf(t, nodes, "e", 0)
	for i := range 5 {
		if s := produceTry(lead, "e", fmt.Sprint("e", i)); s != http.StatusAccepted {
			t.Fatalf("produce %d: %d", i, s)
		}
	}
	old := lead.api.mustConsume("e", "1s") // leased by the lone copy
	r := nodes[0].api.Do(http.MethodPatch, topicPath("e"), []byte(`{"replication_factor":3}`), "Content-Type", "application/json")
	if r.Status != http.StatusOK {
		t.Fatalf("PATCH replication_factor 3: %d %s", r.Status, r.Body)
	}
	waitFor(t, 120*time.Second, "three replicas, no move under way", func() bool {
		for _, m := range moves(nodes[0]) {
			if m.Status == "copying" || m.Status == "switching" || m.Status == "removing" {
				return false
			}
		}
		return len(replicasOf(nodes[0], "e", 0)) == 3
	})
	waitFor(t, 30*time.Second, "a produce to the replicated partition", func() bool { return produceTry(nodes[1], "e", "after") == http.StatusAccepted })
	for _, nd := range nodes {
		ar := nd.api.ack("e", old.ReceiptHandle, "")
		if ar.Status != http.StatusGone {
			t.Fatalf("an ack through %s of a handle the lone copy gave out answered %d, want 410: %s", nd.id, ar.Status, ar.Body)
		}
	}
	// The message whose lease was lost is delivered again, and its new handle acks.
	got := map[string]bool{}
	waitFor(t, 30*time.Second, "every message delivered again", func() bool {
		for _, m := range nodes[2].api.consumeBatch("e", 10, "1s") {
			nodes[2].api.mustAck("e", &m)
			got[payloadID(t, &m)] = true
		}
		return len(got) == 6
	})
}
