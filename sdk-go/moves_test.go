package narad_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// fakeCluster answers the membership routes from a table: route ("METHOD /path") to a
// list of answers, one per request (the last repeats), and records what it was sent.
type fakeCluster struct {
	mu      sync.Mutex
	answers map[string][]fakeAnswer
	got     []string // "METHOD /path body"
}

type fakeAnswer struct {
	status int
	body   string
}

func (f *fakeCluster) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	route := r.Method + " " + r.URL.EscapedPath()
	f.mu.Lock()
	f.got = append(f.got, strings.TrimSpace(route+" "+string(b)))
	as := f.answers[route]
	var a fakeAnswer
	switch len(as) {
	case 0:
		a = fakeAnswer{404, `{"error":{"code":"not_found","message":"no route"}}`}
	case 1:
		a = as[0]
	default:
		a, f.answers[route] = as[0], as[1:]
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if a.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "0")
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

func (f *fakeCluster) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func fakeClusterClient(t *testing.T, f *fakeCluster) (*narad.Client, context.Context) {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := narad.New([]string{srv.URL},
		narad.WithRetry(narad.RetryPolicy{Attempts: 3, Backoff: func() narad.Backoff { return narad.NewFullJitter(time.Millisecond, time.Millisecond) }}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c, ctx
}

const copyingMove = `{"id":"m1","topic":"orders","partition":1,"from":"n1","to":"n2","status":"copying","cause":"request",` +
	`"progress":0.25,"lag":30,"created_at_ms":1700000000000,"updated_at_ms":1700000001000}`

// TestMembershipCalls: every membership call sends its route and body and reads the
// answer whole.
func TestMembershipCalls(t *testing.T) {
	f := &fakeCluster{answers: map[string][]fakeAnswer{
		"POST /v1/cluster/moves":                           {{202, copyingMove}},
		"GET /v1/cluster/moves":                            {{200, `{"moves":[` + copyingMove + `,{"id":"m0","topic":"t","partition":0,"from":"","to":"n3","status":"failed","reason":"n3 died","cause":"replication_factor","progress":0.5,"created_at_ms":1,"updated_at_ms":2}]}`}},
		"DELETE /v1/cluster/moves/m1":                      {{204, ""}},
		"POST /v1/cluster/rebalance":                       {{202, `{"moves":[]}`}},
		"DELETE /v1/cluster/members/n2":                    {{202, `{"id":"n2","address":"10.0.0.2:7950","status":"decommissioning","voter":true,"partitions_held":4}`}},
		"POST /v1/topics/orders/partitions/1/force-leader": {{200, `{"possibly_lost_at_least":12,"replicas":["n3"]}`}},
		"PATCH /v1/topics/orders": {{200, `{"name":"orders","incarnation":"1","partitions":2,"retention_ms":1000,"visibility_timeout_ms":100,` +
			`"max_in_flight_per_partition":1,"max_acked_ahead_per_partition":1,"replication_factor":3,"created_at":"2026-01-02T03:04:05Z"}`}},
	}}
	c, ctx := fakeClusterClient(t, f)

	m, err := c.MovePartition(ctx, "orders", 1, "n1", "n2")
	if err != nil {
		t.Fatal(err)
	}
	want := narad.Move{ID: "m1", Topic: "orders", Partition: 1, From: "n1", To: "n2", Status: narad.MoveCopying, Cause: "request",
		Progress: 0.25, Lag: 30, Created: time.UnixMilli(1700000000000), Updated: time.UnixMilli(1700000001000)}
	if *m != want {
		t.Fatalf("move %+v, want %+v", *m, want)
	}
	ms, err := c.Moves(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0] != want || ms[1].From != "" || ms[1].Status != narad.MoveFailed || ms[1].Reason != "n3 died" || ms[1].Lag != 0 || ms[1].Cause != "replication_factor" {
		t.Fatalf("moves %+v", ms)
	}
	if err := c.CancelMove(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	if rb, err := c.Rebalance(ctx); err != nil || rb == nil || len(rb) != 0 {
		t.Fatalf("rebalance: %v %v, want no moves and no error", rb, err)
	}
	mem, err := c.Decommission(ctx, "n2")
	if err != nil || mem.ID != "n2" || mem.Status != "decommissioning" || mem.PartitionsHeld != 4 {
		t.Fatalf("decommission: %+v %v", mem, err)
	}
	fl, err := c.ForceLeader(ctx, "orders", 1, "n3")
	if err != nil || fl.PossiblyLostAtLeast != 12 || len(fl.Replicas) != 1 || fl.Replicas[0] != "n3" {
		t.Fatalf("force leader: %+v %v", fl, err)
	}
	rf := 3
	ti, err := c.AlterTopic(ctx, "orders", narad.TopicUpdate{ReplicationFactor: &rf})
	if err != nil || ti.ReplicationFactor != 3 {
		t.Fatalf("alter: %+v %v", ti, err)
	}
	if _, err := c.AlterTopic(ctx, "orders", narad.TopicUpdate{}); err != nil {
		t.Fatal(err)
	}

	got := f.sent()
	wantSent := []string{
		`POST /v1/cluster/moves {"from":"n1","partition":1,"to":"n2","topic":"orders"}`,
		`GET /v1/cluster/moves`,
		`DELETE /v1/cluster/moves/m1`,
		`POST /v1/cluster/rebalance`,
		`DELETE /v1/cluster/members/n2`,
		`POST /v1/topics/orders/partitions/1/force-leader {"node":"n3"}`,
		// The generated body always has schema: null when it is not changed.
		`PATCH /v1/topics/orders {"replication_factor":3,"schema":null}`,
		`PATCH /v1/topics/orders {"schema":null}`,
	}
	if len(got) != len(wantSent) {
		t.Fatalf("sent %q, want %q", got, wantSent)
	}
	for i := range got {
		if normJSON(t, got[i]) != normJSON(t, wantSent[i]) {
			t.Errorf("request %d: sent %q, want %q", i, got[i], wantSent[i])
		}
	}
}

// normJSON puts the JSON body after "METHOD /path " in a canonical form.
func normJSON(t *testing.T, s string) string {
	t.Helper()
	method, rest, _ := strings.Cut(s, " ")
	path, body, ok := strings.Cut(rest, " ")
	if !ok {
		return s
	}
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	b, _ := json.Marshal(v)
	return method + " " + path + " " + string(b)
}

// TestMembershipErrors: the broker's refusals come back as the SDK's sentinels with the
// broker's reason; a retried move gets the same move; a forced takeover whose outcome
// is unknown is not sent again, while a move (the broker answers a repeat with the
// move under way) is.
func TestMembershipErrors(t *testing.T) {
	timeout := fakeAnswer{503, `{"error":{"code":"timeout","message":"the controller did not answer in time"}}`}
	f := &fakeCluster{answers: map[string][]fakeAnswer{
		"DELETE /v1/cluster/moves/gone":               {{404, `{"error":{"code":"move_not_found","message":"no partition move has that id"}}`}},
		"DELETE /v1/cluster/moves/m1":                 {{409, `{"error":{"code":"conflict","message":"move m1 is switching; it finishes"}}`}},
		"DELETE /v1/cluster/members/nope":             {{404, `{"error":{"code":"node_not_found","message":"no member has that node id"}}`}},
		"POST /v1/cluster/moves":                      {timeout, {202, copyingMove}},
		"POST /v1/topics/t/partitions/0/force-leader": {timeout, {200, `{"possibly_lost_at_least":0,"replicas":["n1"]}`}},
	}}
	c, ctx := fakeClusterClient(t, f)

	if err := c.CancelMove(ctx, "gone"); !errors.Is(err, narad.ErrNotFound) {
		t.Errorf("cancel of an unknown move: %v, want ErrNotFound", err)
	}
	err := c.CancelMove(ctx, "m1")
	var ne *narad.Error
	if !errors.Is(err, narad.ErrConflict) || !errors.As(err, &ne) || ne.Code != "conflict" || !strings.Contains(ne.Message, "switching") {
		t.Errorf("cancel of a switching move: %v, want ErrConflict with the broker's reason", err)
	}
	if _, err := c.Decommission(ctx, "nope"); !errors.Is(err, narad.ErrNotFound) {
		t.Errorf("decommission of an unknown node: %v, want ErrNotFound", err)
	}
	if m, err := c.MovePartition(ctx, "orders", 1, "n1", "n2"); err != nil || m.ID != "m1" {
		t.Errorf("a move retried after a timeout: %+v %v, want move m1", m, err)
	}
	_, err = c.ForceLeader(ctx, "t", 0, "n1")
	if !errors.Is(err, narad.ErrTimeout) || !narad.Uncertain(err) {
		t.Errorf("a forced takeover that timed out: %v, want an uncertain ErrTimeout", err)
	}
	forced := 0
	for _, s := range f.sent() {
		if strings.Contains(s, "force-leader") {
			forced++
		}
	}
	if forced != 1 {
		t.Errorf("the forced takeover was sent %d times, want once", forced)
	}
}
