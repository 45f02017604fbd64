package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPI answers the routes of the membership commands from a table ("METHOD /path"
// to status and body) and records what it was sent.
type fakeAPI struct {
	mu      sync.Mutex
	answers map[string]fakeAnswer
	got     []string // "METHOD /path body"
}

type fakeAnswer struct {
	status int
	body   string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	route := r.Method + " " + r.URL.EscapedPath()
	f.mu.Lock()
	f.got = append(f.got, strings.TrimSpace(route+" "+string(b)))
	a, ok := f.answers[route]
	f.mu.Unlock()
	if !ok {
		a = fakeAnswer{404, `{"error":{"code":"not_found","message":"no route"}}`}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

func (f *fakeAPI) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

type ran struct {
	code           int
	stdout, stderr string
}

// runAgainst runs one CLI command against the fake API.
func runAgainst(t *testing.T, f *fakeAPI, args ...string) ran {
	t.Helper()
	srv := httptest.NewServer(f)
	defer srv.Close()
	vars := map[string]string{"NARAD_URL": srv.URL, "NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := Run(ctx, args, IO{Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader(""), Getenv: func(k string) string { return vars[k] }})
	return ran{code, stdout.String(), stderr.String()}
}

const (
	cliCopyingMove = `{"id":"m1","topic":"orders","partition":1,"from":"n1","to":"n2","status":"copying","cause":"request",` +
		`"progress":0.25,"lag":30,"created_at_ms":1700000000000,"updated_at_ms":1700000001000}`
	cliFailedMove = `{"id":"m0","topic":"t","partition":0,"from":"","to":"n3","status":"failed","reason":"n3 died while copying",` +
		`"cause":"replication_factor","progress":0.5,"created_at_ms":1,"updated_at_ms":2}`
)

// TestClusterMovesCommands: moves lists (table, JSON, raw), move starts one with the
// flags as the body, cancel-move and rebalance reach their routes.
func TestClusterMovesCommands(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{
		"GET /v1/cluster/moves":       {200, `{"moves":[` + cliCopyingMove + `,` + cliFailedMove + `]}`},
		"POST /v1/cluster/moves":      {202, cliCopyingMove},
		"DELETE /v1/cluster/moves/m1": {204, ""},
		"POST /v1/cluster/rebalance":  {202, `{"moves":[]}`},
	}}

	r := runAgainst(t, f, "cluster", "moves")
	if r.code != 0 {
		t.Fatalf("moves: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") ||
		strings.Join(strings.Fields(lines[1]), " ") != "m1 orders/1 n1 n2 copying request 25% 30 2023-11-14T22:13:21Z" ||
		strings.Join(strings.Fields(lines[2]), " ") != "m0 t/0 - n3 failed replication_factor 50% - 1970-01-01T00:00:00Z" ||
		lines[3] != "m0 failed: n3 died while copying" {
		t.Errorf("moves table:\n%s", r.stdout)
	}
	r = runAgainst(t, f, "cluster", "moves", "-o", "json")
	var ms []moveJSON
	if err := json.Unmarshal([]byte(r.stdout), &ms); err != nil || r.code != 0 {
		t.Fatalf("moves -o json: %+v %v", r, err)
	}
	if len(ms) != 2 || ms[0].ID != "m1" || ms[0].Lag != 30 || ms[0].Progress != 0.25 || ms[1].Reason != "n3 died while copying" || ms[1].From != "" {
		t.Errorf("moves as JSON %+v", ms)
	}
	if r := runAgainst(t, f, "cluster", "moves", "-o", "raw"); r.code != 0 || r.stdout != "m1\nm0\n" {
		t.Errorf("moves -o raw: %+v", r)
	}

	r = runAgainst(t, f, "cluster", "move", "--topic", "orders", "--partition", "1", "--from", "n1", "--to", "n2")
	if r.code != 0 || r.stdout != "m1: orders/1 n1 -> n2 copying\n" {
		t.Errorf("move: %+v", r)
	}
	if r := runAgainst(t, f, "cluster", "cancel-move", "m1"); r.code != 0 {
		t.Errorf("cancel-move: %+v", r)
	}
	if r := runAgainst(t, f, "cluster", "rebalance"); r.code != 0 || !strings.Contains(r.stdout, "nothing to move") {
		t.Errorf("rebalance: %+v", r)
	}
	want := []string{
		"GET /v1/cluster/moves", "GET /v1/cluster/moves", "GET /v1/cluster/moves",
		`POST /v1/cluster/moves {"from":"n1","partition":1,"to":"n2","topic":"orders"}`,
		"DELETE /v1/cluster/moves/m1",
		"POST /v1/cluster/rebalance",
	}
	if got := f.sent(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("sent:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestClusterMembershipRefusals: a wrong command line is exit 2 before anything is
// sent; the broker's 404 is exit 3 and its 409 or 501 exit 1, with its reason.
func TestClusterMembershipRefusals(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{
		"DELETE /v1/cluster/moves/gone":   {404, `{"error":{"code":"move_not_found","message":"no partition move has that id"}}`},
		"DELETE /v1/cluster/moves/m1":     {409, `{"error":{"code":"conflict","message":"move m1 is switching; it finishes"}}`},
		"DELETE /v1/cluster/members/nope": {404, `{"error":{"code":"node_not_found","message":"no member has that node id"}}`},
		"POST /v1/cluster/rebalance":      {501, `{"error":{"code":"not_implemented","message":"not here"}}`},
	}}
	for _, args := range [][]string{
		{"cluster", "move", "--topic", "orders"},
		{"cluster", "move", "--topic", "orders", "--partition", "1", "--from", "n1", "--to", "n2", "extra"},
		{"cluster", "cancel-move"},
		{"topic", "force-leader", "orders", "x", "--node", "n1"},
		{"topic", "force-leader", "orders", "-1", "--node", "n1"},
		{"topic", "force-leader", "orders", "0"},
	} {
		if r := runAgainst(t, f, args...); r.code != ExitUsage {
			t.Errorf("%q: %+v, want exit %d", args, r, ExitUsage)
		}
	}
	if got := f.sent(); len(got) != 0 {
		t.Fatalf("wrong command lines reached the broker: %q", got)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"cluster", "cancel-move", "gone"}, ExitNotFound, "no partition move has that id"},
		{[]string{"cluster", "cancel-move", "m1"}, ExitFailed, "switching; it finishes"},
		{[]string{"cluster", "decommission", "nope"}, ExitNotFound, "no member has that node id"},
		{[]string{"cluster", "rebalance"}, ExitFailed, "does not offer rebalancing"},
	} {
		if r := runAgainst(t, f, c.args...); r.code != c.code || !strings.Contains(r.stderr, c.says) {
			t.Errorf("%q: %+v, want exit %d saying %q", c.args, r, c.code, c.says)
		}
	}
}

// TestDecommissionForceLeaderAndReplicationFactor: decommission prints the member's
// status, force-leader the loss's lower bound and the new replicas, and topic alter
// sends --replication-factor.
func TestDecommissionForceLeaderAndReplicationFactor(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{
		"DELETE /v1/cluster/members/n2":                    {202, `{"id":"n2","address":"10.0.0.2:7950","status":"decommissioning"}`},
		"POST /v1/topics/orders/partitions/1/force-leader": {200, `{"possibly_lost_at_least":12,"replicas":["n3"]}`},
		"PATCH /v1/topics/orders": {200, `{"name":"orders","incarnation":"1","partitions":2,"retention_ms":1000,"visibility_timeout_ms":100,` +
			`"max_in_flight_per_partition":1,"max_acked_ahead_per_partition":1,"replication_factor":3,"created_at":"2026-01-02T03:04:05Z"}`},
	}}
	if r := runAgainst(t, f, "cluster", "decommission", "n2"); r.code != 0 || r.stdout != "n2: decommissioning\n" {
		t.Errorf("decommission: %+v", r)
	}
	if r := runAgainst(t, f, "topic", "force-leader", "orders", "1", "--node", "n3"); r.code != 0 ||
		r.stdout != "orders/1: led by n3; replicas n3; possibly lost: at least 12 messages\n" {
		t.Errorf("force-leader: %+v", r)
	}
	r := runAgainst(t, f, "topic", "force-leader", "orders", "1", "--node", "n3", "-o", "json")
	var res struct {
		Lost     int64    `json:"possibly_lost_at_least"`
		Replicas []string `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Lost != 12 || len(res.Replicas) != 1 {
		t.Errorf("force-leader -o json: %+v %v", r, err)
	}
	if r := runAgainst(t, f, "topic", "alter", "orders", "--replication-factor", "3"); r.code != 0 {
		t.Errorf("alter: %+v", r)
	}
	got := f.sent()
	if len(got) != 4 || got[0] != "DELETE /v1/cluster/members/n2" || got[1] != `POST /v1/topics/orders/partitions/1/force-leader {"node":"n3"}` ||
		!strings.Contains(got[3], `"replication_factor":3`) {
		t.Errorf("sent %q", got)
	}
}
