package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTopicLifecycle walks create, list, get, patch and delete of a topic and checks
// that each answer reflects the state the previous calls left.
func TestTopicLifecycle(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)

	created := a.createTopic("orders.v1", map[string]any{
		"partitions": 4, "retention_ms": 3600000, "visibility_timeout_ms": 5000,
		"max_in_flight_per_partition": 7, "max_acked_ahead_per_partition": 9, "replication_factor": 1,
	})
	if created.Name != "orders.v1" || created.Partitions != 4 || created.RetentionMs != 3600000 ||
		created.VisibilityTimeoutMs != 5000 || created.MaxInFlightPerPartition != 7 ||
		created.MaxAckedAheadPerPartition != 9 || created.ReplicationFactor != 1 || created.Incarnation == "" {
		t.Errorf("create answered %+v", created)
	}
	// Defaults: 3 partitions, 30 s visibility, 1024/1024 caps, 7 days.
	def := a.createTopic("defaults", nil)
	if def.Partitions != 3 || def.VisibilityTimeoutMs != 30000 || def.MaxInFlightPerPartition != 1024 ||
		def.MaxAckedAheadPerPartition != 1024 || def.RetentionMs != 7*24*3600*1000 {
		t.Errorf("defaults: %+v", def)
	}

	a.PostJSON("/v1/topics", map[string]any{"name": "orders.v1"}).ExpectError(t, http.StatusConflict, "topic_exists")

	if names := a.topicNames(); !slices.Equal(names, []string{"defaults", "orders.v1"}) {
		t.Errorf("list: %v, want [defaults orders.v1] (sorted by name)", names)
	}

	d := a.topic("orders.v1")
	if d.Incarnation != created.Incarnation || d.Partitions != 4 || len(d.PartitionStats) != 4 {
		t.Fatalf("get: %+v", d)
	}
	for i, ps := range d.PartitionStats {
		if ps.Partition != int32(i) || ps.NextOffset != 0 || ps.Backlog != 0 || ps.InFlight != 0 || ps.Leader == "" {
			t.Errorf("partition_stats[%d] of a new topic: %+v", i, ps)
		}
	}

	r := a.PatchJSON(topicPath("orders.v1"), map[string]any{"visibility_timeout_ms": 1500, "max_in_flight_per_partition": 3})
	var patched topicJSON
	if r.Expect(t, http.StatusOK) && r.JSON(t, &patched) {
		if patched.VisibilityTimeoutMs != 1500 || patched.MaxInFlightPerPartition != 3 ||
			patched.RetentionMs != 3600000 || patched.MaxAckedAheadPerPartition != 9 || patched.Incarnation != created.Incarnation {
			t.Errorf("patch answered %+v", patched)
		}
	}
	if g := a.topic("orders.v1"); g.VisibilityTimeoutMs != 1500 || g.MaxInFlightPerPartition != 3 {
		t.Errorf("get after patch: %+v", g.topicJSON)
	}
	a.PatchJSON(topicPath("orders.v1"), map[string]any{"partitions": 8}).ExpectError(t, http.StatusBadRequest, "invalid_json")
	a.PatchJSON(topicPath("nope"), map[string]any{"retention_ms": 5000}).ExpectError(t, http.StatusNotFound, "topic_not_found")

	a.Do(http.MethodDelete, topicPath("orders.v1"), nil).Expect(t, http.StatusNoContent)
	a.Get(topicPath("orders.v1")).ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.Do(http.MethodDelete, topicPath("orders.v1"), nil).ExpectError(t, http.StatusNotFound, "topic_not_found")
	if names := a.topicNames(); !slices.Equal(names, []string{"defaults"}) {
		t.Errorf("list after delete: %v", names)
	}
}

// TestHealthAndCluster covers the routes a single node answers about itself.
func TestHealthAndCluster(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)

	for _, p := range []string{"/healthz", "/readyz"} {
		var h struct {
			Status string `json:"status"`
		}
		if r := a.Get(p); r.Expect(t, http.StatusOK) && r.JSON(t, &h) && h.Status == "" {
			t.Errorf("%s: empty status", p)
		}
	}

	var c struct {
		NodeID     string `json:"node_id"`
		Controller string `json:"controller"`
		Members    []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"members"`
	}
	if r := a.Get("/v1/cluster"); r.Expect(t, http.StatusOK) && r.JSON(t, &c) {
		if c.NodeID == "" || c.Controller != c.NodeID || len(c.Members) != 1 || c.Members[0].ID != c.NodeID || c.Members[0].Status != "alive" {
			t.Errorf("single-node cluster: %+v", c)
		}
	}
	var ml struct {
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if r := a.Get("/v1/cluster/members"); r.Expect(t, http.StatusOK) && r.JSON(t, &ml) {
		if len(ml.Members) != 1 || ml.Members[0].ID != c.NodeID {
			t.Errorf("members: %+v, want just %q", ml, c.NodeID)
		}
	}
}

// TestClusterRoutesOnALoneNode: on a node without a node plane, adding a member answers
// 501 not_implemented (it has no way to reach one), decommissioning an unknown node 404,
// and the membership operations (decommissioning itself, moves, rebalance, a forced
// takeover) answer 409 conflict saying they need a cluster;
// listing moves answers an empty list. None of them changes the members.
func TestClusterRoutesOnALoneNode(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("t", nil)
	var cl struct {
		NodeID string `json:"node_id"`
	}
	if r := a.Get("/v1/cluster"); !r.Expect(t, http.StatusOK) || !r.JSON(t, &cl) || cl.NodeID == "" {
		t.Fatal("GET /v1/cluster")
	}
	self := cl.NodeID
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/cluster/members", `{"id":"n2","address":"127.0.0.1:1"}`, http.StatusNotImplemented, "not_implemented"},
		{"DELETE", "/v1/cluster/members/n2", "", http.StatusNotFound, "node_not_found"},
		{"DELETE", "/v1/cluster/members/" + self, "", http.StatusConflict, "conflict"},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"a","to":"b"}`, http.StatusConflict, "conflict"},
		{"DELETE", "/v1/cluster/moves/3", "", http.StatusConflict, "conflict"},
		{"POST", "/v1/cluster/rebalance", "", http.StatusConflict, "conflict"},
		{"POST", "/v1/topics/t/partitions/0/force-leader", `{"node":"n1"}`, http.StatusConflict, "conflict"},
	} {
		var body []byte
		var hdr []string
		if c.body != "" {
			body, hdr = []byte(c.body), []string{"Content-Type", "application/json"}
		}
		r := a.Do(c.method, c.path, body, hdr...)
		if !r.ExpectError(t, c.status, c.code) {
			t.Logf("  (%s %s)", c.method, c.path)
		} else if c.status == http.StatusConflict && !strings.Contains(string(r.Body), "needs a cluster") {
			t.Errorf("%s %s: %s, want it to say a cluster is needed", c.method, c.path, r.Body)
		}
	}
	if r := a.Get("/v1/cluster/moves"); r.Expect(t, http.StatusOK) && string(r.Body) != `{"moves":[]}` && !strings.HasPrefix(string(r.Body), `{"moves":[]`) {
		t.Errorf("moves of a lone node: %s", r.Body)
	}
	var ml struct {
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if r := a.Get("/v1/cluster/members"); r.Expect(t, http.StatusOK) && r.JSON(t, &ml) && len(ml.Members) != 1 {
		t.Errorf("a refused join changed the members: %+v", ml)
	}
}

// TestUnknownRouteAndMethod: no route is 404 not_found, a known path with another
// method is 405 method_not_allowed with an Allow header; both with the JSON body.
func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("t", nil)
	for _, p := range []string{"/", "/v2/topics", "/v1/topics/t/nothing", "/v1/topics/t/partitions/0", "/v1/nope"} {
		if !a.Get(p).ExpectError(t, http.StatusNotFound, "not_found") {
			t.Logf("  (GET %s)", p)
		}
	}
	for _, c := range []struct{ method, path, allow string }{
		{"PUT", "/v1/topics", "GET"},
		{"DELETE", "/v1/topics/t/produce", "POST"},
		{"GET", "/v1/topics/t/produce", "POST"},
		{"POST", "/v1/topics/t/consume", "GET"},
		{"GET", "/v1/topics/t/ack", "POST"},
		{"POST", "/healthz", "GET"},
		{"PATCH", "/v1/cluster", "GET"},
	} {
		r := a.Do(c.method, c.path, nil)
		if !r.ExpectError(t, http.StatusMethodNotAllowed, "method_not_allowed") {
			t.Logf("  (%s %s)", c.method, c.path)
		}
		if allow := r.Header.Get("Allow"); !strings.Contains(allow, c.allow) {
			t.Errorf("%s %s: Allow %q, want it to name %s", c.method, c.path, allow, c.allow)
		}
	}
}

// TestMetrics: /metrics serves the Prometheus text format with the broker's counters.
func TestMetrics(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("m", map[string]any{"partitions": 1})
	a.produceJSON("m", map[string]any{"id": "1"}, "")
	r := a.Get("/metrics")
	if !r.Expect(t, http.StatusOK) {
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain (Prometheus text format)", ct)
	}
	body := string(r.Body)
	for _, want := range []string{
		"# TYPE narad_messages_produced_total counter",
		`narad_messages_produced_total{topic="m"} 1`,
		"# TYPE narad_http_requests_total counter",
		"narad_consume_waiting ",
		"go_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if v, ok := metricValue(a, "narad_consume_waiting"); !ok || v != 0 {
		t.Errorf("narad_consume_waiting = %v (found %v), want 0 with no long poll", v, ok)
	}
}

// TestBoundaryValues: the edges of every documented range are accepted.
func TestBoundaryValues(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	lo := a.createTopic("lo", map[string]any{"partitions": 1, "retention_ms": 1000, "visibility_timeout_ms": 100,
		"max_in_flight_per_partition": 1, "max_acked_ahead_per_partition": 1, "replication_factor": 1})
	hi := a.createTopic("hi", map[string]any{"partitions": 256, "retention_ms": 315360000000, "visibility_timeout_ms": 43200000,
		"max_in_flight_per_partition": 1000000, "max_acked_ahead_per_partition": 1000000})
	if lo.Partitions != 1 || lo.VisibilityTimeoutMs != 100 || hi.Partitions != 256 || hi.VisibilityTimeoutMs != 43200000 {
		t.Errorf("edges: %+v %+v", lo, hi)
	}
	name := strings.Repeat("n", 249)
	a.createTopic(name, nil)
	a.Get(topicPath(name)).Expect(t, http.StatusOK)
	a.createTopic("a-Z_0.9", nil)
	if d := a.topic("hi"); len(d.PartitionStats) != 256 {
		t.Errorf("256 partitions, %d stats", len(d.PartitionStats))
	}
	p := a.produce("hi", []byte("edge"), "text/plain", "partition=255&key="+strings.Repeat("k", 1024))
	if p.Partition != 255 {
		t.Errorf("partition=255 produced to %d", p.Partition)
	}
	for i, w := range []string{"20s", "20", "0", "0s", "20000ms"} {
		a.produceJSON("hi", map[string]any{"id": w}, "")
		m := a.consume("hi", "wait="+w) // a message is waiting: answers at once
		if m == nil {
			t.Fatalf("wait=%s: 204 with a message waiting", w)
		}
		// The last extend ends the lease at once, so it goes last.
		for _, ext := range []string{"12h", "43200000", []string{"1", "1ms"}[i%2]} {
			a.ack("hi", m.ReceiptHandle, ext).Expect(t, http.StatusNoContent)
		}
	}
	if mr := a.read("hi", 255, "max=1000&from=0"); len(mr.Messages) != 1 {
		t.Errorf("max=1000: %d messages", len(mr.Messages))
	}
	// Six messages, the five leases shortened to 1 ms: max=1000 gets them all.
	var got []message
	waitFor(t, 10*time.Second, "all six messages by consume-batch max=1000", func() bool {
		got = append(got, a.consumeBatch("hi", 1000, "1s")...)
		return len(got) >= 6
	})
	if len(got) != 6 {
		t.Errorf("consume-batch max=1000 returned %d messages, want 6", len(got))
	}
}
