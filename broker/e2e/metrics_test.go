package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape reads /metrics into a map from series ("name{labels}" as exposed) to value.
func scrape(t *testing.T, a *api) map[string]float64 {
	t.Helper()
	r := a.Get("/metrics")
	out := map[string]float64{}
	for _, line := range strings.Split(string(r.Body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("/metrics line %q has no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsMove runs a scripted workload against a node with security on (create,
// produce, consume, ack, nack, a lease that lapses, a late ack answered 410, a failed
// login, retention) and checks that every series the operator's dashboard and alerts
// rely on exists and moved.
func TestMetricsMove(t *testing.T) {
	t.Parallel()
	n, a := startSecured(t, "--retention-interval", "200ms")
	before := scrape(t, a)

	a.createTopic("work", map[string]any{"partitions": 1, "visibility_timeout_ms": 300})
	a.createTopic("old", map[string]any{"partitions": 1, "retention_ms": 1000})
	a.createTopic("held", map[string]any{"partitions": 1, "visibility_timeout_ms": 600000})
	for i := range 4 {
		a.produceJSON("work", map[string]any{"i": i}, "")
	}
	a.produceJSON("old", map[string]any{"x": 1}, "")

	acked := a.mustConsume("work", "5s")
	a.ack("work", acked.ReceiptHandle, "").Expect(t, http.StatusNoContent)
	nacked := a.mustConsume("work", "5s")
	a.ack("work", nacked.ReceiptHandle, "0").Expect(t, http.StatusNoContent)
	lapsed := a.mustConsume("work", "5s")
	waitFor(t, 30*time.Second, "the lease to lapse", func() bool {
		v := scrape(t, a)[`narad_lease_expiries_total{topic="work"}`]
		return v >= 1
	})
	a.ack("work", lapsed.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
	a.produceJSON("held", map[string]any{"x": 1}, "")
	a.mustConsume("held", "5s") // stays in flight for the rest of the test

	bad := n.Client().WithBasicAuth("admin", "wrong-password")
	bad.Do(http.MethodGet, "/v1/topics", nil).ExpectError(t, http.StatusUnauthorized, "unauthenticated")

	waitFor(t, 60*time.Second, "retention to delete the old topic's message", func() bool {
		return scrape(t, a)[`narad_retention_deleted_messages_total{topic="old"}`] >= 1
	})
	after := scrape(t, a)

	moved := []string{
		`narad_http_requests_total{op="produce",status="202"}`,
		`narad_http_requests_total{op="ack",status="410"}`,
		`narad_http_request_duration_seconds_count{op="produce"}`,
		`narad_messages_produced_total{topic="work"}`,
		`narad_produced_bytes_total{topic="work"}`,
		`narad_messages_delivered_total{topic="work"}`,
		`narad_delivered_bytes_total{topic="work"}`,
		`narad_messages_settled_total{topic="work"}`,
		`narad_nacks_total{topic="work"}`,
		`narad_lease_expiries_total{topic="work"}`,
		`narad_messages_redelivered_total{topic="work"}`,
		`narad_ack_outcomes_total{outcome="lease_lost"}`,
		`narad_auth_failures_total`,
		`narad_retention_deleted_messages_total{topic="old"}`,
		`narad_storage_sync_duration_seconds_count`,
		`narad_storage_sync_group_files_count`,
		`narad_storage_sync_rounds_total`,
	}
	for _, s := range moved {
		if after[s] <= before[s] {
			t.Errorf("%s did not move: %v before, %v after", s, before[s], after[s])
		}
	}
	positive := []string{
		`narad_topic_backlog{topic="work"}`,
		`narad_topic_in_flight{topic="held"}`,
		`narad_topic_oldest_unacked_age_seconds{topic="work"}`,
		`narad_topic_segments{topic="work"}`,
		`narad_topic_segment_bytes{topic="work"}`,
		`narad_disk_free_bytes`,
		`narad_disk_size_bytes`,
		`narad_control_plane_term`,
		`narad_control_plane_state{state="Leader"}`,
		`narad_cluster_version`,
	}
	for _, s := range positive {
		if after[s] <= 0 {
			t.Errorf("%s is %v, want > 0 (present: %v)", s, after[s], has(after, s))
		}
	}
	for _, s := range []string{`narad_topic_acked_ahead{topic="work"}`, `narad_control_plane_commit_lag`, `narad_control_plane_leader_changes_total`, `narad_control_plane_lease_lapses_total`} {
		if !has(after, s) {
			t.Errorf("%s is missing", s)
		}
	}
	if after[`narad_disk_free_bytes`] > after[`narad_disk_size_bytes`] {
		t.Errorf("disk free %v > disk size %v", after[`narad_disk_free_bytes`], after[`narad_disk_size_bytes`])
	}
	for s := range after {
		if strings.Contains(s, "receipt") || strings.Contains(s, "client") {
			t.Errorf("series %s has a per-message or per-client label", s)
		}
	}
}

func has(m map[string]float64, k string) bool { _, ok := m[k]; return ok }
