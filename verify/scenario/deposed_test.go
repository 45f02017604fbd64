package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/node"
	"github.com/narad-mq/narad/verify/workload"
)

// startTestCluster starts n nodes of one cluster for a bug test, stopped when it ends;
// each node's chaosnet rules file is rules[id].
func startTestCluster(t *testing.T, n int) ([]*node.Node, map[string]string) {
	t.Helper()
	bin, err := Binary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var peers []string
	addrs := make([]string, n)
	for i := range addrs {
		p, err := node.FreeUDPPort()
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
		peers = append(peers, fmt.Sprintf("n%d@%s", i+1, addrs[i]))
	}
	nodes := make([]*node.Node, n)
	rules := map[string]string{}
	for i := range nodes {
		id := fmt.Sprintf("n%d", i+1)
		rules[id] = filepath.Join(dir, id+".rules")
		if err := os.WriteFile(rules[id], nil, 0o644); err != nil {
			t.Fatal(err)
		}
		nd, err := node.New(node.Options{Bin: bin, ID: id, DataDir: filepath.Join(dir, "data-"+id), LogPath: filepath.Join(dir, id+".log"),
			Args: []string{"--node-id", id, "--cluster-addr", addrs[i], "--peers", strings.Join(peers, ","), "--log-level", "warn"},
			Env:  []string{"NARAD_CLUSTER_SECRET=" + clusterSecret, ChaosNetEnv + "=" + rules[id]}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = nd
		t.Cleanup(func() { _ = nd.Close() })
		if err := nd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range nodes {
		if err := nd.WaitReady(2 * time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for workload.MembersAlive(context.Background(), nodes) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the members were never all alive")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nodes, rules
}

func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestDeposedLeaderSendsAcksOn (found by the cluster chaos tier, seed 339003191): a
// deposed leader that has not noticed yet answered acks sent through it with 410
// lease_lost, also for live leases its successor granted: it settled locally, found no
// such lease and said it was lost. The lease lived on at the real leader until it
// lapsed, and the message was delivered again. In the run, the old leader had been
// paused past the election timeout; here it is cut off the node plane (chaosnet), so it
// keeps believing it leads while the test acks through its HTTP API. A handle from a
// later term now tells the replica it was deposed: the ack is forwarded to the leader
// (204), or answers 503 when this node cannot tell who leads; never 410 for a live
// lease (all 40 acks answered 410 on the old code).
func TestDeposedLeaderSendsAcksOn(t *testing.T) {
	t.Parallel()
	nodes, rules := startTestCluster(t, 3)
	if s, b := post(t, nodes[0].URL()+"/v1/topics", `{"name":"z","partitions":1,"replication_factor":3,"visibility_timeout_ms":60000}`); s != 201 {
		t.Fatalf("create: %d %s", s, b)
	}
	leader := func(via *node.Node, not string) *node.Node {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if st, ok := workload.ReadTopic(context.Background(), via.URL(), "z"); ok && st[0].Leader != "" && st[0].Leader != not && !(st[0].Available != nil && !*st[0].Available) {
				for _, nd := range nodes {
					if nd.ID() == st[0].Leader {
						return nd
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no leader of z other than %q", not)
		return nil
	}
	old := leader(nodes[0], "")
	for i := range 40 {
		if s, b := post(t, old.URL()+"/v1/topics/z/produce", fmt.Sprintf(`{"id":"m%d"}`, i)); s != 202 {
			t.Fatalf("produce %d: %d %s", i, s, b)
		}
	}
	var other *node.Node
	for _, nd := range nodes {
		if nd != old {
			other = nd
			break
		}
	}
	if err := writeRulesFile(rules[old.ID()], "drop in 1\ndrop out 1\n"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writeRulesFile(rules[old.ID()], "") }()
	next := leader(other, old.ID())
	resp, err := http.Get(next.URL() + "/v1/topics/z/consume-batch?max=40&wait=2s")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Messages []struct {
			Handle string `json:"receipt_handle"`
		} `json:"messages"`
	}
	err = json.NewDecoder(resp.Body).Decode(&l)
	resp.Body.Close()
	if err != nil || len(l.Messages) == 0 {
		t.Fatalf("the new leader %s leased nothing (%v)", next.ID(), err)
	}
	got := map[int]int{}
	var sample string
	for _, m := range l.Messages {
		s, b := post(t, old.URL()+"/v1/topics/z/ack?receipt_handle="+url.QueryEscape(m.Handle), "")
		got[s]++
		if s == http.StatusGone && sample == "" {
			sample = string(b)
		}
	}
	if got[http.StatusGone] > 0 {
		t.Fatalf("acks through the cut-off old leader %s of live leases granted by %s: answers %v (410: %s)", old.ID(), next.ID(), got, sample)
	}
	t.Logf("acks through the cut-off old leader: answers %v", got)
}

func writeRulesFile(path, rules string) error {
	if err := os.WriteFile(path+".tmp", []byte(rules), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
