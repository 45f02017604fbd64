package e2e

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// removedByRetention sums the messages nd's retention removed from topic (its log
// lines).
func removedByRetention(nd *clusterNode, topic string) int {
	re := regexp.MustCompile(`msg="retention removed messages" topic=` + regexp.QuoteMeta(topic) + ` partition=\d+ messages=(\d+)`)
	n := 0
	for _, m := range re.FindAllStringSubmatch(nd.Log(), -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}

// TestReplicationSnapshotRestoreAfterEverythingAgedOut: a replica down while its
// partition's group compacted its log comes back needing the group's snapshot, whose
// messages have since aged out on every other replica. It must take the snapshot (the
// messages are gone for good) and serve in its group again: here it is the one other
// replica the leader has once the third node stops. On the old code the restore asked
// the others for the snapshot's messages for ever (they hold none, and said nothing
// more), its group's loop held all the while: it neither answered appends nor voted,
// so the partition took no produce with one other node down.
func TestReplicationSnapshotRestoreAfterEverythingAgedOut(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3, "--replica-snapshot-entries", "16", "--retention-interval", "100ms")
	atVersion(t, nodes[0], 2)
	nodes[0].api.createTopic("aged", map[string]any{"partitions": 1, "retention_ms": 1000})
	lead := leaderOf(t, nodes, "aged", 0)
	rest := others(nodes, lead)
	victim, third := rest[0], rest[1]
	victim.Stop()
	const n = 60 // one group entry each: the group snapshots every 16 and compacts its log
	for i := range n {
		id := fmt.Sprint("a", i)
		waitFor(t, 30*time.Second, "produce "+id, func() bool { return produceTry(lead, "aged", id) == http.StatusAccepted })
	}
	for _, nd := range []*clusterNode{lead, third} {
		waitFor(t, 60*time.Second, nd.id+"'s retention to remove all "+fmt.Sprint(n)+" messages", func() bool {
			return removedByRetention(nd, "aged") >= n
		})
	}
	victim.Launch()
	if err := victim.WaitReady(); err != nil {
		t.Fatal(err)
	}
	third.Stop()
	// The leader and the restored replica are a majority: a produce commits.
	waitFor(t, 45*time.Second, "a produce with the third node stopped", func() bool {
		return produceTry(lead, "aged", "after") == http.StatusAccepted
	})
}
