//go:build cluster

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// TestClusterSlowDiskLeaderHandsOver: one node of three turns slow for good (every
// write-ahead sync from its 200th on takes 1.5 s, fault 20 of the reliability list)
// while it leads a partition under load. It hands that leadership to a healthy replica
// and is handed none back while it stalls (its peers hear of the stall in its liveness
// answers), so the partition serves at the healthy nodes' speed again; the others
// never count it dead (it still follows and forwards); its metrics show the stall and
// the handover; and every message answered 202 is delivered. Before, the slow node kept its leadership:
// each produce and ack of its partition waited for its own sync, most answered 503
// after 5 s, and producers round-robining over the partitions all crawled.
func TestClusterSlowDiskLeaderHandsOver(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildNaradTags(t, "failpoints")
	nodes := startPeersClusterWith(t, 3, func(i int, o *testutil.Options) {
		o.Bin = bin
		if i == 2 {
			o.Env = append(o.Env, failpoint.EnvVar+"="+failpoint.WALSync+":sleep(1500ms)@200+")
		}
	})
	agreed(t, wantMembers(nodes...), nodes...)
	slow := nodes[2]
	nodes[0].api.createTopic("slow", map[string]any{"partitions": 3})
	// The placement gives each node one leadership; the slow node's must be its own
	// before its disk turns slow, or there is nothing to hand over.
	var led int
	waitFor(t, 30*time.Second, slow.id+" to lead a partition", func() bool {
		led = -1
		for p, l := range leadersOf(nodes[0], "slow") {
			if l == slow.id {
				led = p
			}
		}
		return led >= 0
	})
	if strings.Contains(slow.Log(), failpoint.FiredPrefix) {
		t.Fatalf("%s's disk turned slow before it led a partition; raise the failpoint's count", slow.id)
	}

	// Every node takes requests, the slow one too: it forwards them.
	load := startProducers(nodes, "slow", "s", 6)
	// The others must never count the slow node anything but alive.
	var dead atomic.Value
	stopWatching, watching := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watching)
		for {
			select {
			case <-stopWatching:
				return
			case <-time.After(200 * time.Millisecond):
			}
			for _, nd := range nodes[:2] {
				c, err := nd.cluster()
				if err != nil {
					continue
				}
				for _, m := range c.Members {
					if m.ID == slow.id && m.Status != "alive" {
						dead.CompareAndSwap(nil, fmt.Sprintf("%s counted %s %s", nd.id, m.ID, m.Status))
					}
				}
			}
		}
	}()

	waitFor(t, 60*time.Second, slow.id+"'s disk to turn slow", func() bool {
		return strings.Contains(slow.Log(), failpoint.FiredPrefix)
	})
	turned := time.Now()
	waitFor(t, 30*time.Second, slow.id+" to hand over the partition it led", func() bool {
		ls := leadersOf(nodes[0], "slow")
		return len(ls) > led && ls[led] != "" && ls[led] != slow.id
	})
	t.Logf("%s handed partition %d over %v after its first slow sync", slow.id, led, time.Since(turned).Round(time.Millisecond))
	// The partition serves at the healthy nodes' pace again: before the handover, 6
	// producers made about 10 produces a second in all (see above); a healthy cluster
	// makes hundreds on a loaded 2-core machine.
	before := load.count()
	time.Sleep(5 * time.Second)
	if n := load.count() - before; n < 250 {
		t.Errorf("%d produces answered 202 in the 5 s after the handover; want at least 250", n)
	}
	ls := leadersOf(nodes[0], "slow")
	if len(ls) != 3 {
		t.Errorf("the partitions' leaders could not be read through %s: %v", nodes[0].id, ls)
	}
	for p, l := range ls {
		if l == slow.id {
			t.Errorf("%s, its disk still stalling, leads partition %d again", slow.id, p)
		}
	}
	if v, ok := metricValue(slow.api, "narad_storage_disk_stalled"); !ok || v != 1 {
		t.Errorf("narad_storage_disk_stalled on %s = %v (read: %v); want 1 while its disk stalls", slow.id, v, ok)
	}
	if v, _ := metricValue(slow.api, "narad_partition_stall_handovers_total"); v < 1 {
		t.Errorf("narad_partition_stall_handovers_total on %s = %v; want at least 1", slow.id, v)
	}
	load.halt()
	close(stopWatching)
	<-watching
	if d := dead.Load(); d != nil {
		t.Errorf("a slow node was counted dead: %s", d)
	}
	if !strings.Contains(slow.Log(), "the disk is stalling") {
		t.Errorf("%s never said its disk was stalling", slow.id)
	}
	lost, n := load.lostAfterDrain(t, nodes[0])
	if lost > 0 {
		t.Fatalf("%d of %d messages answered 202 were never delivered", lost, n)
	}
	t.Logf("%d messages accepted, all delivered", n)
}

// leadersOf reads the leader of each partition of topic through nd (nil when it cannot).
func leadersOf(nd *clusterNode, topic string) []string {
	r, err := nd.api.Try(http.MethodGet, topicPath(topic), nil)
	if err != nil || r.Status != http.StatusOK {
		return nil
	}
	var d topicDetail
	if json.Unmarshal(r.Body, &d) != nil {
		return nil
	}
	out := make([]string, len(d.PartitionStats))
	for i, ps := range d.PartitionStats {
		out[i] = ps.Leader
	}
	return out
}

// TestClusterSlowDiskControllerHandsItOver: the controller's disk turns slow (each
// write of its control-plane Raft store takes 1.5 s). Raft's heartbeats go on, so
// nothing moved the controller off it before, and every metadata write (a topic's
// create or delete, a member's status, a move's step) waited seconds for its log. The
// node hands the controller to a healthy voter now, is never counted dead, and
// metadata writes through it go to the new controller.
func TestClusterSlowDiskControllerHandsItOver(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildNaradTags(t, "failpoints")
	dir := t.TempDir()
	fpFile := func(i int) string { return filepath.Join(dir, fmt.Sprintf("failpoints-%d", i)) }
	nodes := startPeersClusterWith(t, 3, func(i int, o *testutil.Options) {
		o.Bin = bin
		o.Env = append(o.Env, failpoint.FileEnvVar+"="+fpFile(i))
	})
	agreed(t, wantMembers(nodes...), nodes...)
	ctl := controllerOf(t, nodes...)
	var other *clusterNode
	for i, nd := range nodes {
		if nd == ctl {
			if err := os.WriteFile(fpFile(i), []byte(failpoint.MetaStoreWrite+":sleep(1500ms)"), 0o600); err != nil {
				t.Fatal(err)
			}
		} else {
			other = nd
		}
	}
	waitFor(t, 30*time.Second, ctl.id+" to arm its slow disk", func() bool {
		return strings.Contains(ctl.Log(), failpoint.FilePrefix+" now")
	})
	// The control plane writes when asked to: creates through a healthy node meet the
	// slow disk at the controller (they may answer 503 timeout, their outcome
	// unknown). A controller hands over only once it has led for DeadAfter (30 s), so
	// the writes go on until it does.
	armed, n := time.Now(), 0
	waitFor(t, 90*time.Second, ctl.id+" to hand the controller over", func() bool {
		if c, err := other.cluster(); err == nil && c.Controller != "" && c.Controller != ctl.id {
			return true
		}
		n++
		r, err := other.api.Try(http.MethodPost, "/v1/topics", []byte(fmt.Sprintf(`{"name":"while-slow-%d","partitions":1}`, n)), "Content-Type", "application/json")
		if err == nil && n == 1 {
			t.Logf("a create while the controller's disk is slow: %d", r.Status)
		}
		return false
	})
	t.Logf("%s handed the controller over %v after its disk turned slow (%d creates meanwhile)", ctl.id, time.Since(armed).Round(time.Millisecond), n)
	// It says so once its transfer returns, which waits for its slow write in flight.
	waitFor(t, 30*time.Second, ctl.id+" to say it handed the controller over", func() bool {
		return strings.Contains(ctl.Log(), "handed the controller over")
	})
	if v, ok := metricValue(ctl.api, "narad_storage_disk_stalled"); !ok || v != 1 {
		t.Errorf("narad_storage_disk_stalled on %s = %v (read: %v); want 1 while its disk stalls", ctl.id, v, ok)
	}
	// Metadata writes go to the new controller. (One through the slow node itself
	// still waits for it to apply the write, a read of its own write: that node is
	// slow.)
	other.api.createTopic("after-the-handover", map[string]any{"partitions": 1})
	c, err := other.cluster()
	if err != nil {
		t.Fatal(err)
	}
	if c.Controller == ctl.id {
		t.Errorf("%s, its disk still slow, is controller again", ctl.id)
	}
	for _, m := range c.Members {
		if m.Status != "alive" {
			t.Errorf("%s counts %s %s; a slow node is not dead", other.id, m.ID, m.Status)
		}
	}
}
