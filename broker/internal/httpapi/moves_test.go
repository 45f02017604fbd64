package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// moveBroker is a cluster in memory for the membership routes: it keeps the moves it
// started (an identical move under way is answered as it is, as the broker does),
// records what each route handed it, and fails a call with err when that is set.
type moveBroker struct {
	benchBroker
	mu    sync.Mutex
	moves []broker.MoveInfo
	calls []string // "op arg...", in order
	alter broker.TopicAlter
	err   error
	users map[string]auth.User
}

var _ ClusterBroker = (*moveBroker)(nil)

func (f *moveBroker) record(call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	return f.err
}

func (f *moveBroker) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *moveBroker) User(name string) (auth.User, bool) {
	u, ok := f.users[name]
	return u, ok
}

func (f *moveBroker) ClusterID() string   { return "c1" }
func (f *moveBroker) ClusterVersion() int { return 3 }
func (f *moveBroker) Controller() string  { return "n1" }
func (f *moveBroker) NodeID() string      { return "n1" }
func (f *moveBroker) Members() ([]broker.MemberInfo, error) {
	return []broker.MemberInfo{{Member: meta.Member{ID: "n1", ClusterAddr: "127.0.0.1:1", Status: "alive"}}}, nil
}
func (f *moveBroker) AddMember(ctx context.Context, nodeID, addr string) error {
	return f.record("add " + nodeID)
}

func (f *moveBroker) Decommission(ctx context.Context, node string) (broker.MemberInfo, error) {
	if err := f.record("decommission " + node); err != nil {
		return broker.MemberInfo{}, err
	}
	return broker.MemberInfo{Member: meta.Member{ID: node, ClusterAddr: "127.0.0.1:2", Status: "decommissioning", Voter: true}, PartitionsHeld: 4}, nil
}

func (f *moveBroker) StartMove(ctx context.Context, topic string, p int32, from, to string) (broker.MoveInfo, error) {
	if err := f.record("move " + topic + " " + from + " " + to); err != nil {
		return broker.MoveInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.moves {
		if m.Topic == topic && m.Partition == p && m.From == from && m.To == to && m.Status == broker.MoveCopying {
			return m, nil
		}
	}
	m := broker.MoveInfo{ID: "m" + string(rune('1'+len(f.moves))), Topic: topic, Partition: p, From: from, To: to,
		Status: broker.MoveCopying, Cause: "request", Progress: 0.25, Lag: 30, CreatedAtMs: 1000, UpdatedAtMs: 1000}
	f.moves = append(f.moves, m)
	return m, nil
}

func (f *moveBroker) Moves(ctx context.Context) ([]broker.MoveInfo, error) {
	if err := f.record("moves"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]broker.MoveInfo(nil), f.moves...), nil
}

func (f *moveBroker) CancelMove(ctx context.Context, id string) error {
	return f.record("cancel " + id)
}

func (f *moveBroker) Rebalance(ctx context.Context) ([]broker.MoveInfo, error) {
	if err := f.record("rebalance"); err != nil {
		return nil, err
	}
	return []broker.MoveInfo{{ID: "r1", Topic: "t", Partition: 1, From: "n1", To: "n3", Status: broker.MoveCopying, Cause: "rebalance", CreatedAtMs: 5, UpdatedAtMs: 5}}, nil
}

func (f *moveBroker) ForceLeader(ctx context.Context, topic string, p int32, node string) (broker.ForceLeaderResult, error) {
	if err := f.record("force " + topic + " " + node); err != nil {
		return broker.ForceLeaderResult{}, err
	}
	return broker.ForceLeaderResult{PossiblyLostAtLeast: 12, Replicas: []string{node}}, nil
}

func (f *moveBroker) TopicMeta(name string) (meta.Topic, error) {
	return meta.Topic{Name: name, Incarnation: 1, TopicConfig: meta.TopicConfig{Partitions: 2, ReplicationFactor: 1}}, nil
}

func (f *moveBroker) AlterTopic(ctx context.Context, name string, a broker.TopicAlter) (meta.Topic, error) {
	if err := f.record("alter " + name); err != nil {
		return meta.Topic{}, err
	}
	f.mu.Lock()
	f.alter = a
	f.mu.Unlock()
	t := meta.Topic{Name: name, Incarnation: 1, TopicConfig: meta.TopicConfig{Partitions: 2, RetentionMs: 1000, VisibilityMs: 30000, MaxInFlight: 1, MaxAckedAhead: 1, ReplicationFactor: 1}}
	if a.ReplicationFactor != nil {
		t.ReplicationFactor = *a.ReplicationFactor
	}
	return t, nil
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) code(t *testing.T) string {
	t.Helper()
	code, _, err := testutil.ParseError([]byte(a.body))
	if err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	return code
}

// moveServer serves the API over f; every answer it returns was checked against
// openapi.yaml.
func moveServer(t *testing.T, f *moveBroker, opts Options) func(method, path, body string, basic ...string) answer {
	t.Helper()
	v, err := testutil.LoadOpenAPIValidator()
	if err != nil {
		t.Fatal(err)
	}
	opts.Logger, opts.AllowedHosts = quietLogger(), []string{"example.com"}
	h, err := New(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	return func(method, path, body string, basic ...string) answer {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if len(basic) == 2 {
			req.SetBasicAuth(basic[0], basic[1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if err := v.ValidateResponse(req, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
			t.Errorf("%s %s: the answer breaks openapi.yaml: %v (%d %s)", method, path, err, rec.Code, rec.Body)
		}
		return answer{rec.Code, rec.Header(), rec.Body.String()}
	}
}

type moveJSON struct {
	ID          string  `json:"id"`
	Topic       string  `json:"topic"`
	Partition   int32   `json:"partition"`
	From        string  `json:"from"`
	To          string  `json:"to"`
	Status      string  `json:"status"`
	Reason      *string `json:"reason"`
	Cause       string  `json:"cause"`
	Progress    float64 `json:"progress"`
	Lag         *int64  `json:"lag"`
	CreatedAtMs int64   `json:"created_at_ms"`
	UpdatedAtMs int64   `json:"updated_at_ms"`
}

func decodeInto[T any](t *testing.T, body string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
	return v
}

// TestMoveRoutes: a move starts (202 with the move), a repeat answers the same move,
// the list shows it with its progress (lag only while copying, reason only when there
// is one), a cancel answers 204, and a rebalance the moves it started.
func TestMoveRoutes(t *testing.T) {
	t.Parallel()
	f := &moveBroker{}
	do := moveServer(t, f, Options{})
	const req = `{"topic":"orders","partition":1,"from":"n1","to":"n2"}`

	a := do("POST", "/v1/cluster/moves", req)
	if a.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", a.status, a.body)
	}
	m := decodeInto[moveJSON](t, a.body)
	if m.ID == "" || m.Topic != "orders" || m.Partition != 1 || m.From != "n1" || m.To != "n2" || m.Status != "copying" ||
		m.Cause != "request" || m.Progress != 0.25 || m.Lag == nil || *m.Lag != 30 || m.Reason != nil || m.CreatedAtMs != 1000 {
		t.Fatalf("started move %+v from %s", m, a.body)
	}
	again := do("POST", "/v1/cluster/moves", req)
	if again.status != http.StatusAccepted || decodeInto[moveJSON](t, again.body).ID != m.ID {
		t.Fatalf("a repeat: %d %s, want 202 with id %s", again.status, again.body, m.ID)
	}

	// An ended move: no lag, its reason; an add-only move: no from.
	f.mu.Lock()
	f.moves = append(f.moves,
		broker.MoveInfo{ID: "old", Topic: "t", From: "n2", To: "n3", Status: broker.MoveFailed, Reason: "n3 died while copying", Cause: "decommission", Progress: 0.5, Lag: 9},
		broker.MoveInfo{ID: "rf", Topic: "t", To: "n3", Status: broker.MoveSwitching, Cause: "replication_factor", Progress: 1})
	f.mu.Unlock()
	a = do("GET", "/v1/cluster/moves", "")
	if a.status != http.StatusOK {
		t.Fatalf("list: %d %s", a.status, a.body)
	}
	list := decodeInto[struct{ Moves []moveJSON }](t, a.body).Moves
	if len(list) != 3 || list[0].ID != m.ID || list[1].ID != "old" || list[2].ID != "rf" {
		t.Fatalf("list %s", a.body)
	}
	if old := list[1]; old.Status != "failed" || old.Reason == nil || *old.Reason != "n3 died while copying" || old.Lag != nil || old.Cause != "decommission" {
		t.Errorf("the failed move %+v", old)
	}
	if rf := list[2]; rf.From != "" || rf.To != "n3" || rf.Status != "switching" || rf.Progress != 1 || rf.Lag != nil {
		t.Errorf("the add-only move %+v", rf)
	}

	if a := do("DELETE", "/v1/cluster/moves/"+m.ID, ""); a.status != http.StatusNoContent || a.body != "" {
		t.Fatalf("cancel: %d %q", a.status, a.body)
	}

	a = do("POST", "/v1/cluster/rebalance", "")
	if a.status != http.StatusAccepted {
		t.Fatalf("rebalance: %d %s", a.status, a.body)
	}
	if rb := decodeInto[struct{ Moves []moveJSON }](t, a.body).Moves; len(rb) != 1 || rb[0].ID != "r1" || rb[0].Cause != "rebalance" {
		t.Fatalf("rebalance answered %s", a.body)
	}

	want := []string{"move orders n1 n2", "move orders n1 n2", "moves", "cancel " + m.ID, "rebalance"}
	if got := f.called(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the broker was called %q, want %q", got, want)
	}
}

// TestMoveProgressStaysInItsRange: the spec bounds progress to 0..1 and JSON has no
// NaN, so whatever the broker reports leaves in range.
func TestMoveProgressStaysInItsRange(t *testing.T) {
	t.Parallel()
	for in, want := range map[float64]float64{math.NaN(): 0, -0.5: 0, 1.5: 1, 0.4: 0.4} {
		if got := apiMove(broker.MoveInfo{Progress: in}).Progress; got != want {
			t.Errorf("progress %v answered as %v, want %v", in, got, want)
		}
	}
	if lag := apiMove(broker.MoveInfo{Status: broker.MoveCopying, Lag: math.MaxUint64}).Lag; lag == nil || *lag != math.MaxInt64 {
		t.Errorf("a lag past int64 answered as %v", lag)
	}
}

// TestMembershipRoutesMapErrors: each refusal of the broker reaches the client as the
// status and code the spec names, with the broker's reason for a conflict.
func TestMembershipRoutesMapErrors(t *testing.T) {
	t.Parallel()
	routes := []struct{ method, path, body string }{
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"n1","to":"n2"}`},
		{"GET", "/v1/cluster/moves", ""},
		{"DELETE", "/v1/cluster/moves/m9", ""},
		{"POST", "/v1/cluster/rebalance", ""},
		{"DELETE", "/v1/cluster/members/n2", ""},
		{"POST", "/v1/topics/t/partitions/0/force-leader", `{"node":"n2"}`},
	}
	for _, c := range []struct {
		err    error
		status int
		code   string
		skip   map[string]bool // routes that cannot meet this error
	}{
		{&broker.ConflictError{Msg: "n2 holds a replica of t/0 already; move it to another node"}, 409, "conflict", map[string]bool{"GET /v1/cluster/moves": true}},
		{broker.ErrTopicNotFound, 404, "topic_not_found", map[string]bool{"GET /v1/cluster/moves": true, "DELETE /v1/cluster/moves/m9": true, "POST /v1/cluster/rebalance": true, "DELETE /v1/cluster/members/n2": true}},
		{broker.ErrPartitionNotFound, 404, "partition_not_found", map[string]bool{"GET /v1/cluster/moves": true, "DELETE /v1/cluster/moves/m9": true, "POST /v1/cluster/rebalance": true, "DELETE /v1/cluster/members/n2": true}},
		{broker.ErrMemberNotFound, 404, "node_not_found", map[string]bool{"GET /v1/cluster/moves": true, "DELETE /v1/cluster/moves/m9": true, "POST /v1/cluster/rebalance": true}},
		{broker.ErrMoveNotFound, 404, "move_not_found", map[string]bool{"POST /v1/cluster/moves": true, "GET /v1/cluster/moves": true, "POST /v1/cluster/rebalance": true, "DELETE /v1/cluster/members/n2": true, "POST /v1/topics/t/partitions/0/force-leader": true}},
		{broker.ErrUnavailable, 503, "unavailable", nil},
	} {
		f := &moveBroker{err: c.err}
		do := moveServer(t, f, Options{})
		for _, r := range routes {
			if c.skip[r.method+" "+r.path] {
				continue
			}
			a := do(r.method, r.path, r.body)
			if a.status != c.status || a.code(t) != c.code {
				t.Errorf("%s %s with %v: %d %s, want %d %s", r.method, r.path, c.err, a.status, a.body, c.status, c.code)
				continue
			}
			_, msg, _ := testutil.ParseError([]byte(a.body))
			var conflict *broker.ConflictError
			if errors.As(c.err, &conflict) && msg != conflict.Msg {
				t.Errorf("%s %s: the conflict's message %q, want the broker's reason", r.method, r.path, msg)
			}
			if c.status == 503 && a.header.Get("Retry-After") == "" {
				t.Errorf("%s %s: 503 without Retry-After", r.method, r.path)
			}
		}
	}
}

// TestMembershipRoutesRefuseBadInput: bad input is a 400 whose message says what to
// send, and never reaches the broker.
func TestMembershipRoutesRefuseBadInput(t *testing.T) {
	t.Parallel()
	f := &moveBroker{}
	do := moveServer(t, f, Options{})
	for _, c := range []struct {
		method, path, body string
		code, says         string
	}{
		{"POST", "/v1/cluster/moves", "", "invalid_json", ""},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"n1"}`, "invalid_json", "to"},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":-1,"from":"n1","to":"n2"}`, "invalid_json", "partition"},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"","to":"n2"}`, "invalid_json", "from"},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"n1","to":"n2","force":true}`, "invalid_json", "force"},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"n1","to":"n1"}`, "invalid_parameter", "same node"},
		{"POST", "/v1/topics/t/partitions/0/force-leader", "", "invalid_json", ""},
		{"POST", "/v1/topics/t/partitions/0/force-leader", `{}`, "invalid_json", "node"},
		{"POST", "/v1/topics/t/partitions/0/force-leader", `{"node":""}`, "invalid_json", "node"},
		{"POST", "/v1/topics/t/partitions/-1/force-leader", `{"node":"n2"}`, "invalid_parameter", "partition"},
		{"POST", "/v1/topics/t/partitions/x/force-leader", `{"node":"n2"}`, "invalid_parameter", "partition"},
		{"PATCH", "/v1/topics/t", `{"replication_factor":0}`, "invalid_json", "replication_factor"},
		{"PATCH", "/v1/topics/t", `{"replication_factor":8}`, "invalid_json", "replication_factor"},
	} {
		a := do(c.method, c.path, c.body)
		if a.status != http.StatusBadRequest || a.code(t) != c.code {
			t.Errorf("%s %s %s: %d %s, want 400 %s", c.method, c.path, c.body, a.status, a.body, c.code)
			continue
		}
		if _, msg, _ := testutil.ParseError([]byte(a.body)); !strings.Contains(msg, c.says) {
			t.Errorf("%s %s %s: message %q does not name %q", c.method, c.path, c.body, msg, c.says)
		}
	}
	if got := f.called(); len(got) != 0 {
		t.Errorf("bad requests reached the broker: %q", got)
	}
}

// TestDecommissionAndForceLeader: decommission answers 202 with the member as the
// broker has it (decommissioning); force-leader 200 with the lower bound of the loss
// and the new replica set.
func TestDecommissionAndForceLeader(t *testing.T) {
	t.Parallel()
	f := &moveBroker{}
	do := moveServer(t, f, Options{})
	a := do("DELETE", "/v1/cluster/members/n2", "")
	if a.status != http.StatusAccepted {
		t.Fatalf("decommission: %d %s", a.status, a.body)
	}
	mem := decodeInto[struct {
		ID             string `json:"id"`
		Status         string `json:"status"`
		PartitionsHeld int    `json:"partitions_held"`
	}](t, a.body)
	if mem.ID != "n2" || mem.Status != "decommissioning" || mem.PartitionsHeld != 4 {
		t.Fatalf("decommission answered %s", a.body)
	}

	a = do("POST", "/v1/topics/orders/partitions/1/force-leader", `{"node":"n3"}`)
	if a.status != http.StatusOK {
		t.Fatalf("force-leader: %d %s", a.status, a.body)
	}
	res := decodeInto[struct {
		Lost     *int64   `json:"possibly_lost_at_least"`
		Replicas []string `json:"replicas"`
	}](t, a.body)
	if res.Lost == nil || *res.Lost != 12 || len(res.Replicas) != 1 || res.Replicas[0] != "n3" {
		t.Fatalf("force-leader answered %s", a.body)
	}
	if got, want := strings.Join(f.called(), "|"), "decommission n2|force orders n3"; got != want {
		t.Errorf("the broker was called %q, want %q", got, want)
	}
}

// TestAlterReplicationFactor: PATCH carries replication_factor to the broker's alter;
// an alter without it leaves it unset (the topic keeps its factor).
func TestAlterReplicationFactor(t *testing.T) {
	t.Parallel()
	f := &moveBroker{}
	do := moveServer(t, f, Options{})
	a := do("PATCH", "/v1/topics/orders", `{"replication_factor":3}`)
	if a.status != http.StatusOK {
		t.Fatalf("alter: %d %s", a.status, a.body)
	}
	if rf := decodeInto[struct {
		RF int32 `json:"replication_factor"`
	}](t, a.body).RF; rf != 3 {
		t.Errorf("the answer shows replication_factor %d", rf)
	}
	f.mu.Lock()
	got := f.alter.ReplicationFactor
	f.mu.Unlock()
	if got == nil || *got != 3 {
		t.Fatalf("the broker's alter got replication_factor %v, want 3", got)
	}
	if a := do("PATCH", "/v1/topics/orders", `{"retention_ms":60000}`); a.status != http.StatusOK {
		t.Fatalf("alter: %d %s", a.status, a.body)
	}
	f.mu.Lock()
	got = f.alter.ReplicationFactor
	f.mu.Unlock()
	if got != nil {
		t.Fatalf("an alter without replication_factor handed the broker %d", *got)
	}
	f.mu.Lock()
	f.err = &broker.ConflictError{Msg: "replication_factor 5 is more than the cluster's 3 nodes"}
	f.mu.Unlock()
	if a := do("PATCH", "/v1/topics/orders", `{"replication_factor":5}`); a.status != http.StatusConflict || a.code(t) != "conflict" || !strings.Contains(a.body, "more than the cluster") {
		t.Fatalf("a refused factor: %d %s", a.status, a.body)
	}
}

// TestMembershipRoutesAreAdminOnly: with security on, a user without the admin grant
// on * gets 403 from every membership route, and the broker never hears of it; an
// admin gets through.
func TestMembershipRoutesAreAdminOnly(t *testing.T) {
	t.Parallel()
	hash, err := auth.HashPassword("password-1")
	if err != nil {
		t.Fatal(err)
	}
	f := &moveBroker{users: map[string]auth.User{
		"admin": {ID: 1, Name: "admin", Hash: hash, Grants: []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}},
		"ops":   {ID: 2, Name: "ops", Hash: hash, Grants: []auth.Grant{{Action: auth.Admin, Topics: []string{"orders"}}, {Action: auth.Create, Topics: []string{"*"}}}},
	}}
	do := moveServer(t, f, Options{AuthEnabled: func() bool { return true }})
	routes := []struct{ method, path, body string }{
		{"POST", "/v1/cluster/moves", `{"topic":"orders","partition":0,"from":"n1","to":"n2"}`},
		{"GET", "/v1/cluster/moves", ""},
		{"DELETE", "/v1/cluster/moves/m1", ""},
		{"POST", "/v1/cluster/rebalance", ""},
		{"DELETE", "/v1/cluster/members/n2", ""},
		{"POST", "/v1/topics/orders/partitions/0/force-leader", `{"node":"n2"}`},
	}
	for _, r := range routes {
		if a := do(r.method, r.path, r.body, "ops", "password-1"); a.status != http.StatusForbidden || a.code(t) != "forbidden" {
			t.Errorf("%s %s as a topic admin: %d %s, want 403", r.method, r.path, a.status, a.body)
		}
		if a := do(r.method, r.path, r.body); a.status != http.StatusUnauthorized {
			t.Errorf("%s %s without credentials: %d %s, want 401", r.method, r.path, a.status, a.body)
		}
	}
	if got := f.called(); len(got) != 0 {
		t.Fatalf("refused requests reached the broker: %q", got)
	}
	for _, r := range routes {
		if a := do(r.method, r.path, r.body, "admin", "password-1"); a.status >= 300 {
			t.Errorf("%s %s as admin: %d %s", r.method, r.path, a.status, a.body)
		}
	}
	if got := f.called(); len(got) != len(routes) {
		t.Fatalf("the admin's requests reached the broker as %q", got)
	}
}
