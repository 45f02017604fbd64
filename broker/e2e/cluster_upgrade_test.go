package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/storage/format"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// release is how a node runs one release in an upgrade test: its binary (empty: the one
// built from this checkout) and the flags that make it that release.
type release struct {
	name string
	bin  string
	args []string
	// format is the newest data-directory format the release knows; 0 for this
	// binary's own (format.Current). A node goes back to an older one through
	// `narad downgrade-format`, as an operator's rollback does.
	format int
}

// heldAtVersion1 is this checkout's binary speaking only cluster version 1, as the
// releases before cluster versions do: it reports 1, halts at a command of version 2
// and answers a version-2 node-plane operation as unknown. The fast upgrade test uses it
// as release N; the slow one (cluster tag) builds the previous release from git.
var heldAtVersion1 = release{name: "N (this binary held at cluster version 1)", args: []string{"--cluster-version-max", "1"}}

// thisRelease is N+1: this checkout's binary, offering every version it speaks.
var thisRelease = release{name: "N+1 (this binary)"}

// upgradeCluster is a 3-node cluster under load whose nodes are replaced one at a time.
type upgradeCluster struct {
	t     *testing.T
	nodes []*clusterNode
	peers string
	topic string

	mu       sync.Mutex
	accepted map[string]bool // ids answered 202
	acked    map[string]bool // ids whose ack answered 204
	// ackedAt is when each ack answered 204: a delivery counts against it only if its
	// consume was sent after (a consume racing the ack may carry the message).
	ackedAt   map[string]time.Time
	delivered map[string]int  // ids delivered to the load's consumers
	answers   map[string]int  // "METHOD status" → count
	bad       []string        // answers outside the contract
	stopping  map[string]bool // node id → being replaced (its connection errors are expected)

	// quiet is how long the final drain waits on an empty topic (default 3 s): longer
	// than the visibility timeout when a test kills nodes, whose leases lapse.
	quiet time.Duration
	// crashes: the test kills nodes, so an ack may answer 410 lease_lost (a crash
	// loses the leases its node gave; the message comes again).
	crashes bool
	// unplanned are acks answered 410 though the test kills nothing: legal only when a
	// partition elected a leader meanwhile (a leader starved past the election timeout
	// on a loaded machine loses its leases as in a crash), which finish checks against
	// the nodes' narad_partition_leaderships_taken_total{how="election"} since load
	// began (electionsBase; electionsGone holds those of nodes the test stopped).
	unplanned                    []string
	electionsBase, electionsGone float64
	// visibility is the topic's visibility timeout (0: unknown): an ack answered after
	// it passed since its consume was sent may find its lease lapsed (410) on a slow
	// machine without anything having failed.
	visibility time.Duration
	// lat is every produce answered 202: when it was sent and how long it took.
	lat []sample

	seq  atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup
}

// startUpgradeCluster starts three nodes of rel bootstrapped together and creates a
// replicated topic of three partitions.
func startUpgradeCluster(t *testing.T, rel release) *upgradeCluster {
	t.Helper()
	c := &upgradeCluster{t: t, topic: "upgrade", accepted: map[string]bool{}, acked: map[string]bool{}, delivered: map[string]int{},
		answers: map[string]int{}, stopping: map[string]bool{}, stop: make(chan struct{}),
		// A handover that fails on a loaded machine loses its leases as a crash does.
		// Such a lease holds its partition's ack frontier: past max_acked_ahead (1024)
		// messages after it the partition hands out nothing until the lease lapses
		// (keyless produces through one node all go to the partitions it leads, so
		// one partition may take most of the load). The final drain outwaits it.
		quiet: 7 * time.Second, visibility: 5 * time.Second}
	var peers []string
	for i := range 3 {
		nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), addr: freeClusterAddr(t)}
		c.nodes = append(c.nodes, nd)
		peers = append(peers, nd.id+"@"+nd.addr)
	}
	c.peers = strings.Join(peers, ",")
	var opts []testutil.Options
	for _, nd := range c.nodes {
		opts = append(opts, c.options(nd, rel))
	}
	for i, p := range testutil.StartNarads(t, opts...) {
		c.nodes[i].Narad = p
		c.nodes[i].api = &api{Client: p.Client(), t: t}
	}
	c.nodes[0].api.createTopic(c.topic, map[string]any{"partitions": 3, "visibility_timeout_ms": 5000})
	for p := range 3 {
		leaderOf(t, c.nodes, c.topic, p)
	}
	return c
}

func (c *upgradeCluster) options(nd *clusterNode, rel release) testutil.Options {
	return testutil.Options{
		Bin:  rel.bin,
		Args: clusterArgs(nd.id, nd.addr, append([]string{"--peers", c.peers}, rel.args...)...),
		Env:  clusterEnv(clusterSecret),
	}
}

// note records one answer: 2xx is fine, 503 only with Retry-After, and no answer only
// from a node being replaced.
func (c *upgradeCluster) note(nd *clusterNode, what string, r *testutil.Response, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		if !c.stopping[nd.id] && nd.Running() {
			c.bad = append(c.bad, fmt.Sprintf("%s through %s (running, not being replaced): %v", what, nd.id, err))
		}
		c.answers[what+" no answer"]++
	case r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") == "":
		c.bad = append(c.bad, fmt.Sprintf("%s through %s: 503 without Retry-After: %s", what, nd.id, r.Body))
	case c.crashes && what == "ack" && r.Status == http.StatusGone:
	case what == "ack" && r.Status == http.StatusGone:
		c.unplanned = append(c.unplanned, fmt.Sprintf("%s through %s: %d %s", what, nd.id, r.Status, r.Body))
	case r.Status >= 300 && r.Status != http.StatusServiceUnavailable:
		c.bad = append(c.bad, fmt.Sprintf("%s through %s: %d %s", what, nd.id, r.Status, r.Body))
	}
	if r != nil {
		c.answers[what+" "+strconv.Itoa(r.Status)]++
	}
}

// electionsOf is how many partitions nd started leading by an election, not a handover.
func electionsOf(nd *clusterNode) float64 {
	v, _ := metricValue(nd.api, `narad_partition_leaderships_taken_total{how="election"}`)
	return v
}

// elections sums electionsOf over the running nodes.
func (c *upgradeCluster) elections() float64 {
	var n float64
	for _, nd := range c.nodes {
		if nd.Running() {
			n += electionsOf(nd)
		}
	}
	return n
}

// usable reports whether nd takes requests now (running and not being replaced).
func (c *upgradeCluster) usable(nd *clusterNode) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.stopping[nd.id] && nd.Running()
}

// load runs two producers, two consumers that ack, and a reader of the topic's
// counters (GET /v1/topics/{t}, which asks every holder), each going round the nodes.
func (c *upgradeCluster) load() {
	c.electionsBase = c.elections()
	worker := func(w int, step func(nd *clusterNode)) {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for i := w; ; i++ {
				select {
				case <-c.stop:
					return
				default:
				}
				nd := c.nodes[i%len(c.nodes)]
				if !c.usable(nd) {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				step(nd)
			}
		}()
	}
	for w := range 2 {
		worker(w, func(nd *clusterNode) {
			id := fmt.Sprint("m", c.seq.Add(1))
			sent := time.Now()
			r, err := nd.api.Try(http.MethodPost, topicPath(c.topic)+"/produce", []byte(`{"id":"`+id+`"}`), "Content-Type", "application/json")
			c.note(nd, "produce", r, err)
			if err == nil && r.Status == http.StatusAccepted {
				c.mu.Lock()
				c.accepted[id] = true
				c.lat = append(c.lat, sample{at: sent, took: time.Since(sent)})
				c.mu.Unlock()
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		})
		worker(w+1, func(nd *clusterNode) { c.consumeOnce(nd) })
	}
	worker(0, func(nd *clusterNode) {
		r, err := nd.api.Try(http.MethodGet, topicPath(c.topic), nil)
		c.note(nd, "get-topic", r, err)
		time.Sleep(50 * time.Millisecond)
	})
}

// consumeOnce leases up to ten messages through nd and acks each; a message whose ack
// was answered 204 must never come again.
func (c *upgradeCluster) consumeOnce(nd *clusterNode) {
	sent := time.Now()
	r, err := nd.api.Try(http.MethodGet, topicPath(c.topic)+"/consume-batch?max=10&wait=1s", nil)
	c.note(nd, "consume", r, err)
	if err != nil || r.Status != http.StatusOK {
		return
	}
	var l struct {
		Messages []message `json:"messages"`
	}
	if err := json.Unmarshal(r.Body, &l); err != nil {
		c.t.Errorf("consume-batch answer: %v", err)
		return
	}
	for _, m := range l.Messages {
		id := payloadID(c.t, &m)
		c.mu.Lock()
		if at, ok := c.ackedAt[id]; ok && at.Before(sent) {
			c.bad = append(c.bad, fmt.Sprintf("%s (at %s) was delivered again through %s after its ack answered 204 (%v before the consume was sent)", id, m.where(), nd.id, sent.Sub(at).Round(time.Millisecond)))
		} else if ok {
			c.answers["delivered while its ack was answered"]++
		}
		c.delivered[id]++
		c.mu.Unlock()
		ar, err := nd.api.Try(http.MethodPost, topicPath(c.topic)+"/ack?receipt_handle="+url.QueryEscape(m.ReceiptHandle), nil)
		if err == nil && ar.Status == http.StatusGone && c.visibility > 0 && time.Since(sent) > c.visibility {
			// Answered after the lease's time: it may have lapsed before the ack came.
			c.mu.Lock()
			c.answers["ack 410 after the lease's time"]++
			c.mu.Unlock()
			continue
		}
		c.note(nd, "ack", ar, err)
		if err == nil && ar.Status == http.StatusNoContent {
			c.mu.Lock()
			c.acked[id] = true
			if c.ackedAt == nil {
				c.ackedAt = map[string]time.Time{}
			}
			if _, ok := c.ackedAt[id]; !ok {
				c.ackedAt[id] = time.Now()
			}
			c.mu.Unlock()
		}
	}
}

type sample struct {
	at   time.Time
	took time.Duration
}

// p99 is the 99th percentile of the produces answered 202 that were sent between
// from and to, and how many there were.
func (c *upgradeCluster) p99(from, to time.Time) (time.Duration, int) {
	c.mu.Lock()
	var ds []time.Duration
	for _, s := range c.lat {
		if !s.at.Before(from) && s.at.Before(to) {
			ds = append(ds, s.took)
		}
	}
	c.mu.Unlock()
	if len(ds) == 0 {
		return 0, 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[min(len(ds)-1, len(ds)*99/100)], len(ds)
}

// progress waits until the load has had n more produces accepted and n more acks
// answered since it was called: the cluster serves through whatever it is now.
func (c *upgradeCluster) progress(n int) {
	c.t.Helper()
	c.mu.Lock()
	a0, k0 := len(c.accepted), len(c.acked)
	c.mu.Unlock()
	waitFor(c.t, 60*time.Second, fmt.Sprintf("%d more produces and acks", n), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.accepted) >= a0+n && len(c.acked) >= k0+n
	})
}

// replace stops node i with SIGTERM and starts it again as rel, on its data directory,
// and waits until it is ready and the load has gone on.
func (c *upgradeCluster) replace(i int, rel release) {
	c.t.Helper()
	nd := c.nodes[i]
	c.mu.Lock()
	c.stopping[nd.id] = true
	c.mu.Unlock()
	if rel.format != 0 && rel.format < format.Current {
		// The rollback of docs/operating/upgrades.md, after a crash (kill -9 leaves
		// records in the write-ahead file): this binary folds them into the node's
		// files and takes the directory back to the format the old release knows.
		nd.Kill()
		out, err := exec.Command(testutil.BuildNarad(c.t), "downgrade-format", "--to", strconv.Itoa(rel.format), "--data-dir", nd.DataDir()).CombinedOutput()
		if err != nil {
			c.t.Fatalf("narad downgrade-format --to %d on %s: %v\n%s", rel.format, nd.id, err, out)
		}
	} else {
		nd.Stop()
	}
	nd.Relaunch(c.options(nd, rel))
	if err := nd.WaitReady(); err != nil {
		c.t.Fatalf("%s as %s: %v", nd.id, rel.name, err)
	}
	c.mu.Lock()
	delete(c.stopping, nd.id)
	c.mu.Unlock()
	c.t.Logf("%s now runs %s", nd.id, rel.name)
	c.progress(20)
}

// versions reads the cluster version and each member's highest version from every
// running node: "v=1 n1=2 n2=1 n3=1" when they all agree, or an error. A node of a
// release before cluster versions shows neither (read as 1 and as nothing).
func (c *upgradeCluster) versions() (string, error) {
	var out string
	for _, nd := range c.nodes {
		if !c.usable(nd) {
			continue
		}
		cl, err := nd.cluster()
		if err != nil {
			return "", err
		}
		v := max(cl.Version, 1)
		s := fmt.Sprintf("v=%d", v)
		for _, id := range []string{"n1", "n2", "n3"} {
			for _, m := range cl.Members {
				if m.ID == id {
					s += fmt.Sprintf(" %s=%d", id, m.MaxVersion)
				}
			}
		}
		if out != "" && s != out {
			return "", fmt.Errorf("nodes disagree: %q and %q (from %s)", out, s, nd.id)
		}
		out = s
	}
	return out, nil
}

// versionIs waits until every running node reports exactly want (see versions).
func (c *upgradeCluster) versionIs(want string) {
	c.t.Helper()
	var last string
	ok := testutil.Poll(60*time.Second, func() bool {
		got, err := c.versions()
		if err != nil {
			last = err.Error()
			return false
		}
		last = got
		return got == want
	})
	if !ok {
		c.t.Fatalf("the nodes never reported %q: last %s", want, last)
	}
}

// clusterVersion reads the committed cluster version from every running node and fails
// the test when one reports another than want.
func (c *upgradeCluster) clusterVersionIs(want int) {
	c.t.Helper()
	for _, nd := range c.nodes {
		if !c.usable(nd) {
			continue
		}
		cl, err := nd.cluster()
		if err != nil {
			c.t.Fatal(err)
		}
		if got := max(cl.Version, 1); got != want {
			c.t.Fatalf("%s reports cluster version %d, want %d", nd.id, got, want)
		}
	}
}

// statsBatches sums, over the running nodes, the stats_batch requests (the version-2
// node-plane operation) each has sent, by narad_forwarded_duration_seconds.
func (c *upgradeCluster) statsBatches() float64 {
	c.t.Helper()
	var n float64
	for _, nd := range c.nodes {
		if !c.usable(nd) {
			continue
		}
		r, err := nd.api.Try(http.MethodGet, "/metrics", nil)
		if err != nil || r.Status != http.StatusOK {
			c.t.Fatalf("GET /metrics on %s: %v %v", nd.id, r, err)
		}
		for _, line := range strings.Split(string(r.Body), "\n") {
			if strings.HasPrefix(line, "narad_forwarded_duration_seconds_count{") && strings.Contains(line, `op="stats_batch"`) {
				v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				if err != nil {
					c.t.Fatalf("metric line %q: %v", line, err)
				}
				n += v
			}
		}
	}
	return n
}

// finish stops the load, drains the topic, and checks the delivery contract over the
// whole run: every message answered 202 was delivered, none whose ack answered 204 came
// again, and every answer was a success or a 503 with Retry-After.
func (c *upgradeCluster) finish() {
	c.t.Helper()
	close(c.stop)
	c.wg.Wait()
	seen := map[string]int{}
	quiet := c.quiet
	if quiet == 0 {
		quiet = 3 * time.Second
	}
	drain(c.t, c.nodes[0], c.topic, seen, quiet)
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range seen {
		if c.acked[id] {
			c.bad = append(c.bad, fmt.Sprintf("%s was delivered again in the final drain after its ack answered 204", id))
		}
	}
	lost := 0
	for id := range c.accepted {
		if c.delivered[id] == 0 && seen[id] == 0 {
			lost++
		}
	}
	if lost > 0 {
		// Tell a loss from a delivery that did not come: which of them are in the
		// partitions' logs (read through a node that runs)?
		inLog := map[string]string{}
		for _, nd := range c.nodes {
			if !nd.Running() {
				continue
			}
			for p := range 3 {
				for _, m := range nd.api.readAll(c.topic, p) {
					inLog[payloadID(c.t, &m)] = m.where()
				}
			}
			break
		}
		var stuck []string
		for id := range c.accepted {
			if c.delivered[id] == 0 && seen[id] == 0 && inLog[id] != "" {
				stuck = append(stuck, id+"@"+inLog[id])
			}
		}
		sort.Strings(stuck)
		c.t.Errorf("%d of %d messages answered 202 were never delivered (%d of them are in the logs: %.300v)", lost, len(c.accepted), len(stuck), stuck)
	}
	if len(c.unplanned) > 0 {
		if n := c.elections() + c.electionsGone - c.electionsBase; n > 0 {
			c.t.Logf("%d acks answered 410 with nothing killed; %v partition leaderships were taken by election meanwhile (a leader starved past the election timeout), so their leases were lost as in a crash", len(c.unplanned), n)
		} else {
			c.bad = append(c.bad, c.unplanned...)
		}
	}
	for i, b := range c.bad {
		if i == 20 {
			c.t.Errorf("... and %d more", len(c.bad)-20)
			break
		}
		c.t.Errorf("outside the contract: %s", b)
	}
	c.t.Logf("%d produced (202), %d acked (204); answers: %v", len(c.accepted), len(c.acked), c.answers)
}

// rollingUpgrade upgrades a 3-node cluster of release old to release cur one node at a
// time under load, rolls one node back to old before the cluster version is committed,
// upgrades it again, and checks that cur's highest version is committed only once
// every node runs cur, that no version-2 operation was used before, and the delivery contract.
// reports says old reports its versions (this binary held at 1 does; a release before
// cluster versions does not, and its controller records none).
func rollingUpgrade(t *testing.T, old, cur release, reports bool) {
	top := meta.VersionMax // what cur speaks and, once every node runs it, the cluster
	c := startUpgradeCluster(t, old)
	c.load()
	c.progress(20)
	c.clusterVersionIs(1)

	c.replace(0, cur)
	c.replace(1, cur)
	if reports {
		// Every node's range is known, and n3 alone holds the cluster at 1.
		c.versionIs(fmt.Sprintf("v=1 n1=%d n2=%d n3=1", top, top))
	}
	c.clusterVersionIs(1)

	// A rollback before the commit: n2 runs the old release again, and serves.
	c.replace(1, old)
	if reports {
		c.versionIs(fmt.Sprintf("v=1 n1=%d n2=1 n3=1", top))
	}
	c.clusterVersionIs(1)
	if n := c.statsBatches(); n != 0 {
		t.Fatalf("%v stats_batch requests (a version-2 operation) were sent before the cluster version was committed", n)
	}

	c.replace(1, cur)
	c.replace(2, cur)
	c.versionIs(fmt.Sprintf("v=%d n1=%d n2=%d n3=%d", top, top, top, top))
	for _, nd := range c.nodes {
		if v, ok := metricValue(nd.api, "narad_cluster_version"); !ok || v != float64(top) {
			t.Fatalf("narad_cluster_version on %s: %v %v", nd.id, v, ok)
		}
	}
	// The version-2 operation is in use now: the counters' reader goes on through
	// every node.
	waitFor(t, 60*time.Second, "stats_batch requests once version 2 is committed", func() bool { return c.statsBatches() > 0 })
	// A new node of release N is refused its join, naming both versions, and never
	// becomes a member.
	late := &clusterNode{id: "n4", addr: freeClusterAddr(t)}
	late.Narad = testutil.LaunchNarad(t, testutil.Options{Bin: old.bin, Args: clusterArgs(late.id, late.addr, append([]string{"--join", c.nodes[0].addr}, old.args...)...), Env: clusterEnv(clusterSecret)})
	waitFor(t, 60*time.Second, "the join of a node of release N refused", func() bool {
		return strings.Contains(late.Log(), fmt.Sprintf("node n4 speaks cluster versions 1 and the cluster runs version %d", top))
	})
	if cl, err := c.nodes[0].cluster(); err != nil || strings.Contains(membersString(cl.Members), "n4@") {
		t.Fatalf("after the refused join: %v %v", membersString(cl.Members), err)
	}
	late.Stop()
	c.progress(20)
	c.finish()
}

// TestClusterRollingUpgradeUnderLoad: N → N+1 of a 3-node cluster under produce,
// consume and ack load, with a rollback of one node before the commit. N is this
// binary held at cluster version 1 (see heldAtVersion1); the cluster-tagged
// TestClusterRollingUpgradeFromPreviousRelease runs the previous release itself.
func TestClusterRollingUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	rollingUpgrade(t, heldAtVersion1, thisRelease, true)
}
