package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// The cluster tests run real processes on loopback: the node plane over UDP, the
// control plane's Raft on it. These are the quick ones, run by every `make test`; the
// slower ones (a stopped follower, a wiped node, the failover and idle-CPU figures) are
// in cluster_slow_test.go behind the `cluster` build tag, run by `make e2e`.

// TestClusterBootstrapJoinFailoverRestart: three nodes bootstrap from --peers and a
// fourth joins with --join; all report one cluster id and the same members with their
// cluster and HTTP addresses; a write on a follower is forwarded; after kill -9 of the
// controller, metadata writes sent to survivors succeed again within seconds and lose
// nothing; after every node is killed and started again, everything is still there.
func TestClusterBootstrapJoinFailoverRestart(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	id := agreed(t, wantMembers(nodes...), nodes...)

	ctl := controllerOf(t, nodes...)
	follower := others(nodes, ctl)[0]
	follower.api.createTopic("before", map[string]any{"partitions": 1})
	waitFor(t, 30*time.Second, "every node to list the topic made on a follower", func() bool {
		for _, nd := range nodes {
			if topicsOf(nd) != "before" {
				return false
			}
		}
		return true
	})

	joiner := startJoiner(t, "n4", nodes[1].addr, "")
	nodes = append(nodes, joiner)
	if got := agreed(t, wantMembers(nodes...), nodes...); got != id {
		t.Fatalf("the joiner reports cluster id %s, the cluster %s", got, id)
	}
	if got := topicsOf(joiner); got != "before" {
		t.Fatalf("the joiner lists topics %q, want before", got)
	}

	// kill -9 the controller: writes resume on the survivors.
	ctl = controllerOf(t, nodes...)
	survivors := others(nodes, ctl)
	ctl.Kill()
	took, ok := firstWrite(survivors, "after", time.Now(), 60*time.Second)
	if !ok {
		t.Fatalf("no metadata write succeeded on a survivor within 60s of killing the controller")
	}
	t.Logf("first metadata write after kill -9 of the controller %s: %v", ctl.id, took.Round(time.Millisecond))
	waitFor(t, 30*time.Second, "every survivor to list both topics", func() bool {
		for _, nd := range survivors {
			if topicsOf(nd) != "after,before" {
				return false
			}
		}
		return true
	})

	// Every node down hard, then all up again: the cluster, its members and its
	// metadata are still there.
	for _, nd := range survivors {
		nd.Kill()
	}
	for _, nd := range nodes {
		nd.Launch()
	}
	var ps []*testutil.Narad
	for _, nd := range nodes {
		ps = append(ps, nd.Narad)
	}
	testutil.WaitAllReady(t, ps...)
	if got := agreed(t, wantMembers(nodes...), nodes...); got != id {
		t.Fatalf("after the restart the cluster id is %s, was %s", got, id)
	}
	for _, nd := range nodes {
		if got := topicsOf(nd); got != "after,before" {
			t.Errorf("%s lists topics %q after the restart, want after,before", nd.id, got)
		}
	}
	// And it still takes writes, on any node.
	nodes[3].api.createTopic("later", map[string]any{"partitions": 1})
}

// TestClusterNeedsTheSecret: a node started with --cluster-addr and no secret refuses
// to start and says why; a node with a wrong secret cannot join: it is served nothing,
// the members do not change, and the member counts the failed handshakes. (That no
// operation is served before the handshake, op by op, and that an expired certificate
// still connects, are transport's in-process tests: TestWrongSecretGetsNoOperationNorRaftStream
// and TestExpiredCertificateStillConnects in internal/transport.)
func TestClusterNeedsTheSecret(t *testing.T) {
	t.Parallel()
	bare := testutil.LaunchNarad(t, testutil.Options{Args: clusterArgs("bare", freeClusterAddr(t))})
	if err, exited := bare.Wait(30 * time.Second); !exited || err == nil {
		t.Fatalf("a node without a cluster secret: exited %v (%v), want it to refuse to start", exited, err)
	}
	if log := bare.Log(); !strings.Contains(log, "needs the cluster secret") || !strings.Contains(log, "NARAD_CLUSTER_SECRET") {
		t.Errorf("the refusal does not say what to set:\n%s", log)
	}
	short := testutil.LaunchNarad(t, testutil.Options{Args: clusterArgs("short", freeClusterAddr(t)), Env: clusterEnv("too-short")})
	if err, exited := short.Wait(30 * time.Second); !exited || err == nil || !strings.Contains(short.Log(), "at least 16 are required") {
		t.Fatalf("a node with a 9-byte secret: exited %v (%v), want a refusal naming the minimum:\n%s", exited, err, short.Log())
	}

	a := &clusterNode{id: "a", addr: freeClusterAddr(t)}
	a.Narad = testutil.StartNarad(t, testutil.Options{Args: clusterArgs(a.id, a.addr), Env: clusterEnv(clusterSecret)})
	a.api = &api{Client: a.Client(), t: t}
	agreed(t, wantMembers(a), a)
	failures := func() float64 { v, _ := metricValue(a.api, "narad_cluster_auth_failures_total"); return v }
	if f := failures(); f != 0 {
		t.Fatalf("narad_cluster_auth_failures_total is %v before any intruder", f)
	}

	intruder := testutil.LaunchNarad(t, testutil.Options{
		Args: clusterArgs("intruder", freeClusterAddr(t), "--join", a.addr),
		Env:  clusterEnv("not-the-cluster-secret-at-all"),
	})
	waitFor(t, 30*time.Second, "the member to count the intruder's failed handshakes", func() bool { return failures() > 0 })
	if !intruder.Running() {
		t.Fatalf("the intruder exited: it should keep trying (and failing) to join:\n%s", intruder.Log())
	}
	if r, err := quick.Get(intruder.URL() + "/readyz"); err == nil {
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			t.Fatalf("the intruder is ready")
		}
	}
	if got, want := membersOf(t, a), wantMembers(a); got != want {
		t.Fatalf("members became %s, want %s", got, want)
	}
	waitFor(t, 30*time.Second, "the intruder to log why it cannot join", func() bool {
		return strings.Contains(intruder.Log(), "authentication")
	})
	intruder.Stop()
}

func membersOf(t *testing.T, nd *clusterNode) string {
	t.Helper()
	c, err := nd.cluster()
	if err != nil {
		t.Fatal(err)
	}
	return membersString(c.Members)
}

// TestClusterOpensASingleNodeDataDirectory: a data directory of the single-node version
// (format 1) started with --cluster-addr is a cluster of one with every topic, message,
// ack, user and child intact; a second node then joins it and sees the same metadata.
func TestClusterOpensASingleNodeDataDirectory(t *testing.T) {
	t.Parallel()
	first := &clusterNode{addr: freeClusterAddr(t)}
	// No --node-id: the node keeps the id its data directory was made with.
	n, admin := checkFixture(t, unpackFixture(t, "format-1.tar.gz"), 1, testutil.Options{
		Args: []string{"--cluster-addr", first.addr},
		Env:  clusterEnv(clusterSecret),
	})
	first.Narad, first.api = n, admin
	c, err := first.cluster()
	if err != nil {
		t.Fatal(err)
	}
	first.id = c.NodeID
	id := agreed(t, wantMembers(first), first)

	second := &clusterNode{id: "second", addr: freeClusterAddr(t)}
	second.Narad = testutil.StartNarad(t, testutil.Options{
		Args: clusterArgs(second.id, second.addr, "--join", first.addr),
		Env:  clusterEnv(clusterSecret),
	})
	// Security is on in the joined node too: its users came with the metadata.
	second.api = &api{Client: second.Client().WithBasicAuth("admin", fixturePassword), t: t}
	second.Client().Get("/v1/topics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	if got := agreed(t, wantMembers(first, second), first, second); got != id {
		t.Fatalf("the joined node reports cluster id %s, the first %s", got, id)
	}
	if got, want := topicsOf(second), topicsOf(first); got != want || got == "" {
		t.Fatalf("the joined node lists topics %q, the first %q", got, want)
	}
	second.api.createTopic("made.on.second", map[string]any{"partitions": 1})
	waitFor(t, 30*time.Second, "the first node to list a topic made on the second", func() bool {
		return strings.Contains(","+topicsOf(first)+",", ",made.on.second,")
	})
}

// TestClusterAddMemberAndRotateTheSecret: a node started with --wait-for-add is admitted
// by POST /v1/cluster/members; a node holding only a new secret cannot join until the
// member has that secret as its next one (written to its file, then SIGHUP), the first
// phase of a rotation.
func TestClusterAddMemberAndRotateTheSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	current, next := filepath.Join(dir, "secret"), filepath.Join(dir, "secret-next")
	writeFile(t, current, clusterSecret+"\n")
	writeFile(t, next, "")
	a := &clusterNode{id: "a", addr: freeClusterAddr(t)}
	a.Narad = testutil.StartNarad(t, testutil.Options{Args: clusterArgs(a.id, a.addr,
		"--cluster-secret-file", current, "--cluster-secret-next-file", next)})
	a.api = &api{Client: a.Client(), t: t}

	b := &clusterNode{id: "b", addr: freeClusterAddr(t)}
	b.Narad = testutil.LaunchNarad(t, testutil.Options{Args: clusterArgs(b.id, b.addr, "--wait-for-add"), Env: clusterEnv(clusterSecret)})
	b.api = &api{Client: b.Client(), t: t}
	// Waiting to be added, b's port is open but not ready: /healthz 200, the rest 503.
	waitFor(t, 30*time.Second, "b's port to answer /healthz while it waits", func() bool {
		r, err := b.Client().Try("GET", "/healthz", nil)
		return err == nil && r.Status == http.StatusOK
	})
	b.api.Get("/readyz").ExpectError(t, http.StatusServiceUnavailable, "unavailable")
	b.api.Get("/v1/topics").ExpectError(t, http.StatusServiceUnavailable, "unavailable")
	r := a.api.PostJSON("/v1/cluster/members", map[string]any{"id": b.id, "address": b.addr})
	if !r.Expect(t, http.StatusCreated) {
		t.Fatalf("POST /v1/cluster/members: %d %s", r.Status, r.Body)
	}
	if err := b.WaitReady(); err != nil {
		t.Fatal(err)
	}
	agreed(t, wantMembers(a, b), a, b)

	// c knows only the new secret.
	const newSecret = "the-next-cluster-secret-98765"
	c := &clusterNode{id: "c", addr: freeClusterAddr(t)}
	c.Narad = testutil.LaunchNarad(t, testutil.Options{Args: clusterArgs(c.id, c.addr, "--join", a.addr), Env: clusterEnv(newSecret)})
	c.api = &api{Client: c.Client(), t: t}
	failures := func() float64 { v, _ := metricValue(a.api, "narad_cluster_auth_failures_total"); return v }
	waitFor(t, 30*time.Second, "a to refuse c's handshakes", func() bool { return failures() > 0 })
	writeFile(t, next, newSecret+"\n")
	a.Reload()
	waitFor(t, 30*time.Second, "a to log the reload", func() bool { return strings.Contains(a.Log(), "reloaded the cluster secrets") })
	if err := c.WaitReady(); err != nil {
		t.Fatal(err)
	}
	agreed(t, wantMembers(a, b, c), a, b, c)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
