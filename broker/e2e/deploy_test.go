package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// eventOnly are series a healthy node exposes only once the event they count happened
// (a labelled series has no sample before its first label value), with what that takes.
// The test checks that the broker's code registers them instead.
var eventOnly = map[string]string{
	"narad_storage_errors_total":             "a failed disk write",
	"narad_damaged_records_total":            "a record failing its checksum",
	"narad_fanout_lag":                       "a child topic",
	"narad_cluster_forward_duration_seconds": "a write forwarded to another node",
	"narad_peer_alive":                       "another node in the cluster",
	"narad_peer_liveness_lapses_total":       "another node in the cluster",
}

var metricName = regexp.MustCompile(`\bnarad_[a-z0-9_]+`)

// TestDashboardAndAlertsUseRealSeries: every metric the Grafana dashboard
// (deploy/grafana/narad.json) and the Prometheus alert rules (deploy/prometheus/
// alerts.yml) query is exposed by a node with security and the node plane on, after a
// little traffic (or, for the few only an event brings, registered in the code).
func TestDashboardAndAlertsUseRealSeries(t *testing.T) {
	t.Parallel()
	root, err := testutil.WorkspaceRoot()
	if err != nil {
		t.Fatal(err)
	}
	exprs := dashboardExprs(t, filepath.Join(root, "deploy", "grafana", "narad.json"))
	exprs = append(exprs, alertExprs(t, filepath.Join(root, "deploy", "prometheus", "alerts.yml"))...)
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = true
		}
	}
	if len(used) < 20 {
		t.Fatalf("found only %d metric names in the dashboard and alerts: %v", len(used), used)
	}

	n := testutil.StartNarad(t, testutil.Options{
		Args: clusterArgs("n1", freeClusterAddr(t)),
		Env:  append(clusterEnv(clusterSecret), "NARAD_ADMIN_PASSWORD="+adminPass),
	})
	a := &api{Client: n.Client().WithBasicAuth("admin", adminPass), t: t}
	a.createTopic("d", map[string]any{"partitions": 1})
	a.produceJSON("d", map[string]any{"x": 1}, "")
	a.mustAck("d", a.mustConsume("d", "5s"))
	exposed := map[string]bool{}
	for series := range scrape(t, a) {
		name, _, _ := strings.Cut(series, "{")
		exposed[name] = true
	}

	src := brokerSource(t, root)
	names := make([]string, 0, len(used))
	for m := range used {
		names = append(names, m)
	}
	slices.Sort(names)
	for _, m := range names {
		if exposed[m] {
			continue
		}
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
		if why, ok := eventOnly[base]; ok {
			if !strings.Contains(src, `"`+base+`"`) {
				t.Errorf("%s (exposed after %s) is not registered anywhere in the broker's code", m, why)
			}
			continue
		}
		t.Errorf("the dashboard or the alerts use %s, which the node does not expose", m)
	}
}

func dashboardExprs(t *testing.T, path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok {
			out = append(out, q)
		}
	}
	return out
}

func alertExprs(t *testing.T, path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("%s: a rule without alert name or expr: %+v", path, r)
			}
			out = append(out, r.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", path)
	}
	return out
}

// brokerSource is the broker's non-test Go source, concatenated.
func brokerSource(t *testing.T, root string) string {
	var b strings.Builder
	err := filepath.WalkDir(filepath.Join(root, "broker", "internal"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		raw, err := os.ReadFile(p)
		b.Write(raw)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
