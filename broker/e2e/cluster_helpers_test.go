package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// clusterSecret is the cluster secret of the test clusters (NARAD_CLUSTER_SECRET).
const clusterSecret = "e2e-cluster-secret-0123456789"

// clusterNode is one node of a test cluster: its process, id and cluster address.
type clusterNode struct {
	*testutil.Narad
	id   string
	addr string // 127.0.0.1:UDP port
	api  *api
}

// clusterArgs are the flags of node id at addr, plus extra.
func clusterArgs(id, addr string, extra ...string) []string {
	return append([]string{"--node-id", id, "--cluster-addr", addr}, extra...)
}

func clusterEnv(secret string) []string {
	if secret == "" {
		return nil
	}
	return []string{"NARAD_CLUSTER_SECRET=" + secret}
}

func freeClusterAddr(t *testing.T) string {
	t.Helper()
	p, err := testutil.FreeUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

// startPeersCluster starts n nodes bootstrapped from one --peers list, at once, each
// with the flags extra besides.
func startPeersCluster(t *testing.T, n int, extra ...string) []*clusterNode {
	t.Helper()
	return startPeersClusterEnv(t, n, nil, extra...)
}

// startPeersClusterEnv is startPeersCluster with env added to every node's environment.
func startPeersClusterEnv(t *testing.T, n int, env []string, extra ...string) []*clusterNode {
	t.Helper()
	return startPeersClusterWith(t, n, func(_ int, o *testutil.Options) { o.Env = append(o.Env, env...) }, extra...)
}

// startChaosCluster is startPeersCluster on binaries built with the chaosnet tag, each
// node's node plane obeying its own rules file (empty at first: no faults); it returns
// the nodes and their files. Write a file with cutNode.
func startChaosCluster(t *testing.T, n int, extra ...string) ([]*clusterNode, []string) {
	t.Helper()
	return startChaosClusterWith(t, n, "chaosnet", nil, extra...)
}

// startChaosClusterWith is startChaosCluster on a binary built with tags (which must
// include chaosnet), each node with env added to its environment.
func startChaosClusterWith(t *testing.T, n int, tags string, env []string, extra ...string) ([]*clusterNode, []string) {
	t.Helper()
	bin := testutil.BuildNaradTags(t, tags)
	dir := t.TempDir()
	files := make([]string, n)
	nodes := startPeersClusterWith(t, n, func(i int, o *testutil.Options) {
		files[i] = filepath.Join(dir, fmt.Sprintf("chaosnet-%d", i))
		if err := os.WriteFile(files[i], nil, 0o644); err != nil {
			t.Fatal(err)
		}
		o.Bin = bin
		o.Env = append(append(o.Env, env...), transport.ChaosNetEnvVar+"="+files[i])
	}, extra...)
	return nodes, files
}

// cutNode sets nd's chaosnet rules (file from startChaosCluster) to cut its node plane
// off both ways (cut) or to none, and waits until nd has read them.
func cutNode(t *testing.T, nd *clusterNode, file string, cut bool) {
	t.Helper()
	rules, want := "", transport.ChaosNetPrefix+` rules now ""`
	if cut {
		rules, want = "drop in 1\ndrop out 1\n", transport.ChaosNetPrefix+` rules now "drop in 1; drop out 1"`
	}
	before := strings.Count(nd.Log(), want)
	if err := os.WriteFile(file, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, nd.id+" to read its chaosnet rules", func() bool { return strings.Count(nd.Log(), want) > before })
}

// startPeersClusterWith is startPeersCluster with set applied to each node's options.
func startPeersClusterWith(t *testing.T, n int, set func(i int, o *testutil.Options), extra ...string) []*clusterNode {
	t.Helper()
	nodes := make([]*clusterNode, n)
	var peers []string
	for i := range nodes {
		nodes[i] = &clusterNode{id: fmt.Sprintf("n%d", i+1), addr: freeClusterAddr(t)}
		peers = append(peers, nodes[i].id+"@"+nodes[i].addr)
	}
	var opts []testutil.Options
	for _, nd := range nodes {
		o := testutil.Options{
			Args: clusterArgs(nd.id, nd.addr, append([]string{"--peers", strings.Join(peers, ",")}, extra...)...),
			Env:  clusterEnv(clusterSecret),
		}
		set(len(opts), &o)
		opts = append(opts, o)
	}
	for i, p := range testutil.StartNarads(t, opts...) {
		nodes[i].Narad = p
		nodes[i].api = &api{Client: p.Client(), t: t}
	}
	return nodes
}

// startJoiner starts node id joining through the member at through, and waits until
// it is ready.
func startJoiner(t *testing.T, id, through string, dataDir string) *clusterNode {
	t.Helper()
	nd := &clusterNode{id: id, addr: freeClusterAddr(t)}
	nd.Narad = testutil.StartNarad(t, testutil.Options{
		DataDir: dataDir,
		Args:    clusterArgs(id, nd.addr, "--join", through),
		Env:     clusterEnv(clusterSecret),
	})
	nd.api = &api{Client: nd.Client(), t: t}
	return nd
}

type clusterJSON struct {
	NodeID     string       `json:"node_id"`
	ClusterID  string       `json:"cluster_id"`
	Controller string       `json:"controller"`
	Version    int          `json:"version"`
	Members    []memberJSON `json:"members"`
}

type memberJSON struct {
	ID          string `json:"id"`
	Address     string `json:"address"`
	HTTPAddress string `json:"http_address"`
	Status      string `json:"status"`
	Voter       bool   `json:"voter"`
	MinVersion  int    `json:"min_version"`
	MaxVersion  int    `json:"max_version"`
}

// cluster reads GET /v1/cluster without failing the test (it may be polled while the
// node is down or not ready).
func (nd *clusterNode) cluster() (clusterJSON, error) {
	var c clusterJSON
	r, err := nd.api.Try(http.MethodGet, "/v1/cluster", nil)
	if err != nil {
		return c, err
	}
	if r.Status != http.StatusOK {
		return c, fmt.Errorf("GET /v1/cluster on %s: %d %s", nd.id, r.Status, r.Body)
	}
	return c, json.Unmarshal(r.Body, &c)
}

// membersString renders members as "id@addr(http)=status" sorted, for comparisons.
func membersString(ms []memberJSON) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s@%s(%s)=%s", m.ID, m.Address, m.HTTPAddress, m.Status))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// wantMembers is membersString of nodes, all alive.
func wantMembers(nodes ...*clusterNode) string {
	var ms []memberJSON
	for _, nd := range nodes {
		ms = append(ms, memberJSON{ID: nd.id, Address: nd.addr, HTTPAddress: nd.URL(), Status: "alive"})
	}
	return membersString(ms)
}

// agreed waits until every node reports the same cluster id and exactly want as its
// members, and returns the cluster id.
func agreed(t *testing.T, want string, nodes ...*clusterNode) string {
	t.Helper()
	var id string
	var last string
	ok := testutil.Poll(60*time.Second, func() bool {
		id = ""
		for _, nd := range nodes {
			c, err := nd.cluster()
			if err != nil {
				last = err.Error()
				return false
			}
			if c.ClusterID == "" || (id != "" && c.ClusterID != id) {
				last = fmt.Sprintf("%s reports cluster id %q, another %q", nd.id, c.ClusterID, id)
				return false
			}
			id = c.ClusterID
			if got := membersString(c.Members); got != want {
				last = fmt.Sprintf("%s reports members %s", nd.id, got)
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("the nodes never agreed on the cluster id and members %s: %s", want, last)
	}
	return id
}

// controllerOf returns the node the nodes name as controller once they agree.
func controllerOf(t *testing.T, nodes ...*clusterNode) *clusterNode {
	t.Helper()
	var ctl *clusterNode
	ok := testutil.Poll(60*time.Second, func() bool {
		ctl = nil
		for _, nd := range nodes {
			c, err := nd.cluster()
			if err != nil || c.Controller == "" {
				return false
			}
			for _, o := range nodes {
				if o.id == c.Controller {
					if ctl != nil && ctl != o {
						return false
					}
					ctl = o
				}
			}
		}
		return ctl != nil
	})
	if !ok {
		t.Fatalf("the nodes never agreed on a controller among them")
	}
	return ctl
}

// quick is an unvalidated client with a short timeout, for polling writes while the
// cluster fails over: a write in flight to a dead controller waits out the node's
// apply timeout, so a poller that gave up sends a fresh one.
var quick = &http.Client{Timeout: 2 * time.Second}

// firstWrite measures how long after start a metadata write first succeeds on one of
// nodes: it sends a fresh create of topic name every 200 ms (alternating nodes), each
// with a 10 s timeout, and returns when the first answers 201 or 409 (another attempt's
// create committed). A write sent to a dead controller waits out the node's apply
// timeout; writes sent after it show when the cluster took writes again. ok is false
// after bound.
func firstWrite(nodes []*clusterNode, name string, start time.Time, bound time.Duration) (time.Duration, bool) {
	client := &http.Client{Timeout: 10 * time.Second}
	done := make(chan time.Duration, 1)
	stop := make(chan struct{})
	defer close(stop)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(bound)
	for i := 0; ; i++ {
		nd := nodes[i%len(nodes)]
		go func() {
			resp, err := client.Post(nd.URL()+"/v1/topics", "application/json", bytes.NewReader([]byte(`{"name":"`+name+`","partitions":1}`)))
			if err != nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusConflict {
				select {
				case done <- time.Since(start):
				default:
				}
			}
		}()
		select {
		case d := <-done:
			return d, true
		case <-deadline:
			return 0, false
		case <-tick.C:
		}
	}
}

// topicsOf returns nd's sorted topic names.
func topicsOf(nd *clusterNode) string {
	names := nd.api.topicNames()
	sort.Strings(names)
	return strings.Join(names, ",")
}

func others(nodes []*clusterNode, not *clusterNode) []*clusterNode {
	var out []*clusterNode
	for _, nd := range nodes {
		if nd != not {
			out = append(out, nd)
		}
	}
	return out
}

// indexOf is nd's place in nodes (-1 when it is not there).
func indexOf(nodes []*clusterNode, nd *clusterNode) int {
	for i, o := range nodes {
		if o == nd {
			return i
		}
	}
	return -1
}
