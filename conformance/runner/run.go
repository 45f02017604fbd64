package runner

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Outcomes of one scenario for one driver.
const (
	Pass  = "pass"
	Fail  = "fail"
	NA    = "n/a"
	XFail = "known failure"
	XPass = "unexpected pass"
)

// Result is the outcome of one scenario for one driver.
type Result struct {
	Scenario   string   `json:"scenario"`
	Title      string   `json:"title"`
	Tier       string   `json:"tier"`
	Rules      []string `json:"rules"`
	Driver     string   `json:"driver"`
	SDK        string   `json:"sdk"`
	Outcome    string   `json:"outcome"`
	Reason     string   `json:"reason,omitempty"`
	Known      string   `json:"known_failure,omitempty"`
	DurationMs int64    `json:"duration_ms"`
	Log        []string `json:"log,omitempty"`
}

// Env is what scenarios run against.
type Env struct {
	// Broker serves the behaviour tier; nil when only the wire tier runs.
	Broker *Broker
	// Nodes are the nodes of a cluster run (Broker is the first): the behaviour tier's
	// requests go to each in turn, and the cluster tier gets one endpoint per node.
	// Empty for a single node.
	Nodes []*Broker
	// Disposable: the cluster serves this one scenario and is thrown away after it, so
	// killed nodes are not brought back (a node restarted after kill -9 may take
	// seconds to be ready; a fresh cluster, started beside the previous scenario, is
	// quicker).
	Disposable bool
	// Dir is the data directory of a disposable cluster, removed with it.
	Dir string
}

// driverCommands are the commands of DRIVER.md; any other action is the runner's.
var driverCommands = map[string]bool{
	"client.new": true, "close": true, "produce": true, "produce_batch": true,
	"publisher.new": true, "publisher.publish": true, "publisher.flush": true, "publisher.close": true,
	"receive": true, "ack": true, "nack": true, "extend": true,
	"consume.start": true, "consume.stop": true, "replay": true,
	"topic.create": true, "topic.get": true, "topic.delete": true, "topic.attach_child": true, "topic.children": true,
}

var runnerActions = map[string]bool{
	"fault": true, "clear_faults": true, "mark": true, "await": true, "wait_event": true, "no_event": true,
	"events": true, "history": true, "quiet": true, "wait_request": true, "assert": true, "check_batch": true,
	"admin.create_topic": true, "admin.delete_topic": true, "admin.produce": true, "admin.read": true,
	"admin.topic": true, "admin.create_user": true, "admin.wait_topic": true,
	"cluster.kill": true, "cluster.restart": true, "cluster.await_leader": true,
}

func knownAction(a string) bool { return driverCommands[a] || runnerActions[a] }

// capabilityOf is the capability a driver command needs.
func capabilityOf(cmd string) string {
	switch {
	case cmd == "client.new" || cmd == "close":
		return ""
	case strings.HasPrefix(cmd, "publisher."):
		return "publisher"
	case strings.HasPrefix(cmd, "consume."):
		return "consume"
	case cmd == "topic.attach_child" || cmd == "topic.children":
		return "children"
	case strings.HasPrefix(cmd, "topic."):
		return "topics"
	}
	return cmd
}

// Required lists the capabilities a scenario needs: its own list and its commands'.
func (sc *Scenario) Required() []string {
	set := map[string]bool{}
	for _, r := range sc.Requires {
		set[r] = true
	}
	for _, st := range sc.Steps {
		if driverCommands[st.Action] {
			if c := capabilityOf(st.Action); c != "" {
				set[c] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

type run struct {
	sc     *Scenario
	env    Env
	drv    *Driver
	t0     time.Time
	hist   *History
	rules  *Rules
	fronts []*Front
	// nodeFront maps a cluster node's index to its endpoint (cluster tier); bg holds
	// the restarts going on in the background, by node index.
	nodeFront map[int]*Front
	bg        map[int]chan error
	vars      map[string]any
	marks     map[string]time.Time
	asyncs    map[string]<-chan Response
	log       []string
	cleanup   []func()
}

func (r *run) logf(format string, a ...any) {
	r.log = append(r.log, fmt.Sprintf("%7.3fs ", time.Since(r.t0).Seconds())+fmt.Sprintf(format, a...))
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// RunScenario runs one scenario with one driver and says how it went.
func RunScenario(ctx context.Context, sc *Scenario, spec DriverSpec, env Env) (res Result) {
	res = Result{Scenario: sc.Name, Title: sc.Title, Tier: sc.Tier, Rules: sc.Rules, Driver: spec.Name}
	start := time.Now()
	defer func() { res.DurationMs = time.Since(start).Milliseconds() }()
	if sc.Tier == "behaviour" && env.Broker == nil {
		res.Outcome, res.Reason = NA, "the behaviour tier needs a narad binary (-narad)"
		return res
	}
	if sc.Tier == "cluster" && len(env.Nodes) < 3 {
		res.Outcome, res.Reason = NA, "the cluster tier needs a cluster of 3 or more nodes (a narad binary; the runner starts one)"
		return res
	}
	timeout := time.Duration(sc.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	drv, err := StartDriver(ctx, spec)
	if err != nil {
		res.Outcome, res.Reason = Fail, err.Error()
		return res
	}
	res.SDK = drv.Hello.Name + " " + drv.Hello.Version
	r := &run{sc: sc, env: env, drv: drv, t0: time.Now(), hist: &History{}, rules: &Rules{},
		vars: map[string]any{}, marks: map[string]time.Time{}, asyncs: map[string]<-chan Response{}}
	defer func() {
		drv.Stop()
		if sc.Tier == "cluster" && !env.Disposable {
			// Killed nodes come back before the next scenario, which needs them all.
			if err := r.restoreCluster(context.WithoutCancel(ctx)); err != nil {
				r.logf("restoring the cluster: %v", err)
				if res.Outcome != Fail {
					res.Outcome, res.Reason = Fail, "restoring the cluster after the scenario: "+err.Error()
				}
			}
		}
		for i := len(r.cleanup) - 1; i >= 0; i-- {
			r.cleanup[i]()
		}
		res.Log = r.log
		if res.Outcome == Fail {
			if s := drv.Stderr(); s != "" {
				res.Log = append(res.Log, "driver stderr:\n"+s)
			}
		}
	}()
	var missing []string
	for _, c := range sc.Required() {
		if !drv.Hello.Has(c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		res.Outcome, res.Reason = NA, "driver lacks "+strings.Join(missing, ", ")
		return res
	}
	if err := r.setup(ctx); err != nil {
		res.Outcome, res.Reason = Fail, "setup: "+err.Error()
		return res
	}
	for i := range sc.Steps {
		st := &sc.Steps[i]
		if err := r.step(ctx, st); err != nil {
			res.Outcome, res.Reason = Fail, fmt.Sprintf("step %d (%s, line %d): %v", i+1, st.Action, st.Line, err)
			return res
		}
	}
	for _, iv := range sc.Invariants {
		args, err := Expand(iv.Args, r.vars)
		if err == nil {
			err = invariantChecks[iv.Kind](r, normalize(args))
		}
		if err != nil {
			res.Outcome, res.Reason = Fail, fmt.Sprintf("invariant %s: %v", iv.Kind, err)
			return res
		}
		r.logf("invariant %s holds", iv.Kind)
	}
	res.Outcome = Pass
	return res
}

func (r *run) setup(ctx context.Context) error {
	sc := r.sc
	uid := unsafeName.ReplaceAllString(fmt.Sprintf("%s%04x", r.drv.Spec.Name, rand.IntN(1<<16)), "-")
	prefix := unsafeName.ReplaceAllString(fmt.Sprintf("cf.%s.%s", sc.Name, uid), "-")
	r.vars["uid"] = uid
	var upstream http.Handler
	var fake *Fake
	if sc.Tier == "wire" {
		wait := time.Duration(sc.Mock.MaxWaitMs) * time.Millisecond
		if wait <= 0 {
			wait = 200 * time.Millisecond
		}
		fake = NewFake(wait)
		upstream = fake
		r.vars["auth"] = map[string]any{"username": "conformance", "password": "wire-secret"}
	} else if sc.Tier == "behaviour" {
		rp := &ReverseProxy{Base: r.env.Broker.URL, Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
		for _, n := range r.env.Nodes {
			rp.Bases = append(rp.Bases, n.URL)
		}
		upstream = rp
		r.vars["auth"] = map[string]any{"username": AdminUser, "password": AdminPassword}
	} else {
		r.vars["auth"] = map[string]any{"username": AdminUser, "password": AdminPassword}
	}
	for _, t := range sc.Topics {
		full := prefix + "." + t.Name
		if len(full) > 249 {
			full = full[len(full)-249:]
		}
		r.vars[t.Name] = full
		spec := t
		spec.Name = full
		if fake != nil {
			fake.AddTopic(full, t.Partitions, t.VisibilityTimeout, t.Queue)
			if t.Redeliver {
				fake.SetRedeliver(full)
			}
		} else if sc.Tier == "cluster" {
			if err := r.createTopic(ctx, spec); err != nil {
				return err
			}
		} else if err := r.env.Broker.Admin.CreateTopic(ctx, spec); err != nil {
			return err
		}
	}
	r.vars["prefix"] = prefix
	if sc.Tier == "cluster" {
		// Every partition has a leader before the client starts, so a kill finds one.
		for _, t := range sc.Topics {
			for p := 0; p < max(t.Partitions, 1); p++ {
				if _, err := r.leaderOf(ctx, r.vars[t.Name].(string), p, -1, 30*time.Second); err != nil {
					return err
				}
			}
		}
	}
	// An HTTP-date a few seconds ahead, for Retry-After in its date form (RFC 9110).
	r.vars["http_date_in_3s"] = time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat)
	var endpoints []any
	for i := 0; i < sc.DeadEndpoints; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		endpoints = append(endpoints, "http://"+ln.Addr().String())
		_ = ln.Close()
	}
	if sc.Tier == "cluster" {
		eps, err := r.clusterFronts(ctx)
		if err != nil {
			return err
		}
		endpoints = append(endpoints, eps...)
	}
	for i := 0; sc.Tier != "cluster" && i < max(sc.Endpoints, 1); i++ {
		f := &Front{Node: i, History: r.hist, Rules: r.rules, Upstream: upstream}
		if err := f.Start(); err != nil {
			return err
		}
		r.fronts = append(r.fronts, f)
		r.cleanup = append(r.cleanup, f.Close)
		endpoints = append(endpoints, f.URL())
	}
	r.vars["endpoints"] = endpoints
	for _, f := range sc.Faults {
		if err := r.addFault(f); err != nil {
			return err
		}
	}
	resp, err := r.drv.Call(ctx, "client.new", r.clientArgs(map[string]any{}))
	if err != nil {
		return err
	}
	if !resp.OK {
		return fmt.Errorf("client.new: %v", resp.Error)
	}
	r.logf("setup: topics under %s, endpoints %v", prefix, endpoints)
	return nil
}

func (r *run) clientArgs(a map[string]any) map[string]any {
	if _, ok := a["endpoints"]; !ok {
		a["endpoints"] = r.vars["endpoints"]
	}
	if _, ok := a["auth"]; !ok {
		a["auth"] = r.vars["auth"]
	}
	return a
}

func (r *run) addFault(f Fault) error {
	// Faults may name topics: expand ${t} in the path and query.
	raw, _ := json.Marshal(f)
	var generic any
	_ = json.Unmarshal(raw, &generic)
	ex, err := Expand(generic, r.vars)
	if err != nil {
		return err
	}
	raw, _ = json.Marshal(ex)
	var out Fault
	if err := json.Unmarshal(raw, &out); err != nil {
		return err
	}
	return r.rules.Add(out)
}

func argMap(v any) map[string]any {
	m, _ := normalize(v).(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	return m
}

func (r *run) step(ctx context.Context, st *Step) error {
	argsAny, err := Expand(st.Args, r.vars)
	if err != nil {
		return err
	}
	timeout := time.Duration(st.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	began := time.Now()
	var result any
	var failure map[string]any
	switch {
	case driverCommands[st.Action]:
		args := fillBodies(argMap(argsAny)).(map[string]any)
		if st.Action == "client.new" {
			args = r.clientArgs(args)
		}
		_, ch, err := r.drv.Send(st.Action, args)
		if err != nil {
			return err
		}
		if st.Async != "" {
			r.asyncs[st.Async] = ch
			r.logf("%s (async %s) sent", st.Action, st.Async)
			return nil
		}
		resp, err := r.drv.Await(sctx, ch)
		if err != nil {
			return err
		}
		result, failure = resp.Result, resp.Error
		if !resp.OK && failure == nil {
			failure = map[string]any{"kind": "Other", "message": "failed without an error"}
		}
	case st.Action == "await":
		name, _ := argsAny.(string)
		ch, ok := r.asyncs[name]
		if !ok {
			return fmt.Errorf("no async step named %q", name)
		}
		resp, err := r.drv.Await(sctx, ch)
		if err != nil {
			return err
		}
		result, failure = resp.Result, resp.Error
		if !resp.OK && failure == nil {
			failure = map[string]any{"kind": "Other"}
		}
	default:
		result, err = r.runnerAction(sctx, st.Action, argsAny)
		if err != nil {
			return err
		}
	}
	ended := time.Now()
	elapsed := float64(ended.Sub(began).Microseconds()) / 1000
	if failure != nil {
		r.logf("%s -> error %s (%.0f ms)", st.Action, show(failure), elapsed)
	} else {
		r.logf("%s -> %s (%.0f ms)", st.Action, show(result), elapsed)
	}
	if st.Save != "" {
		if failure != nil {
			r.vars[st.Save] = map[string]any{"error": failure}
		} else {
			r.vars[st.Save] = result
		}
	}
	switch {
	case failure != nil && st.AllowError && st.ExpectError == nil:
	case failure != nil && st.ExpectError == nil:
		return fmt.Errorf("unexpected error: %s", show(failure))
	case failure == nil && st.ExpectError != nil:
		return fmt.Errorf("expected an error, got %s", show(result))
	case failure != nil:
		exp, err := Expand(st.ExpectError, r.vars)
		if err != nil {
			return err
		}
		if err := Match(exp, failure); err != nil {
			return fmt.Errorf("error: %v", err)
		}
	case st.Expect != nil:
		exp, err := Expand(st.Expect, r.vars)
		if err != nil {
			return err
		}
		if err := Match(exp, result); err != nil {
			return fmt.Errorf("result: %v", err)
		}
	}
	if st.ElapsedMs != nil {
		if err := inRange("elapsed", elapsed, *st.ElapsedMs); err != nil {
			return err
		}
	}
	if st.Since != nil {
		m, ok := r.marks[st.Since.Mark]
		if !ok {
			return fmt.Errorf("no mark %q", st.Since.Mark)
		}
		if err := inRange("time since "+st.Since.Mark, float64(ended.Sub(m).Microseconds())/1000, st.Since.Range); err != nil {
			return err
		}
	}
	if st.Requests != nil {
		if err := r.checkRequests(st.Requests, began, ended); err != nil {
			return fmt.Errorf("requests: %v", err)
		}
	}
	return nil
}

func inRange(what string, v float64, rg Range) error {
	if v < rg.Min || (rg.Max > 0 && v > rg.Max) {
		return fmt.Errorf("%s %.0f ms is outside [%v, %v] ms", what, v, rg.Min, rg.Max)
	}
	return nil
}

func (r *run) selected(where any, from, to time.Time) ([]map[string]any, []*Exchange) {
	var views []map[string]any
	var exs []*Exchange
	w := normalize(where)
	for _, ex := range r.hist.Exchanges() {
		if ex.Start.Before(from) || (!to.IsZero() && ex.Start.After(to)) {
			continue
		}
		v := ex.View(r.t0)
		if w == nil && (ex.Path == "/readyz" || ex.Path == "/healthz" || ex.Path == "/v1/cluster") {
			// Breaker probes and the one-cluster check run outside the calls, on the
			// SDK's own schedule: a check counts them only when it asks for them.
			continue
		}
		if w != nil && Match(w, v) != nil {
			continue
		}
		views = append(views, v)
		exs = append(exs, ex)
	}
	return views, exs
}

func (r *run) checkRequests(spec *RequestsSpec, from, to time.Time) error {
	where, err := Expand(spec.Where, r.vars)
	if err != nil {
		return err
	}
	views, exs := r.selected(where, from, to)
	if spec.Count != nil && len(views) != *spec.Count {
		return fmt.Errorf("want %d requests, got %d: %s", *spec.Count, len(views), summarize(views))
	}
	if len(views) < spec.Min {
		return fmt.Errorf("want at least %d requests, got %d: %s", spec.Min, len(views), summarize(views))
	}
	if len(spec.Items) > len(views) {
		return fmt.Errorf("want at least %d requests, got %d: %s", len(spec.Items), len(views), summarize(views))
	}
	for i, it := range spec.Items {
		exp, err := Expand(it, r.vars)
		if err != nil {
			return err
		}
		if err := Match(exp, views[i]); err != nil {
			return fmt.Errorf("request %d: %v", i, err)
		}
	}
	if spec.All != nil {
		exp, err := Expand(spec.All, r.vars)
		if err != nil {
			return err
		}
		for i, v := range views {
			if err := Match(exp, v); err != nil {
				return fmt.Errorf("request %d: %v", i, err)
			}
		}
	}
	if spec.GapsMs != nil {
		for i := 1; i < len(exs); i++ {
			gap := float64(exs[i].Start.Sub(exs[i-1].Start).Microseconds()) / 1000
			if err := inRange(fmt.Sprintf("gap before request %d", i), gap, *spec.GapsMs); err != nil {
				return err
			}
		}
	}
	return nil
}

func summarize(views []map[string]any) string {
	var parts []string
	for _, v := range views {
		q, _ := json.Marshal(v["query"])
		parts = append(parts, fmt.Sprintf("%v %v %s -> %v%s", v["method"], v["path"], q, v["status"], func() string {
			if f, _ := v["fault"].(string); f != "" {
				return " (" + f + ")"
			}
			return ""
		}()))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func (r *run) matchingEvents(name string, match any, since time.Time) []any {
	evs, _ := r.drv.Events()
	var out []any
	for _, ev := range evs {
		if ev.Name != name || ev.At.Before(since) {
			continue
		}
		if match != nil && Match(match, ev.Data) != nil {
			continue
		}
		d := map[string]any{}
		for k, v := range ev.Data {
			d[k] = v
		}
		d["at_ms"] = float64(ev.At.Sub(r.t0).Milliseconds())
		out = append(out, d)
	}
	return out
}

func (r *run) runnerAction(ctx context.Context, action string, argsAny any) (any, error) {
	args := argMap(argsAny)
	str := func(k string) string { s, _ := args[k].(string); return s }
	num := func(k string, def float64) float64 {
		if f, ok := args[k].(float64); ok {
			return f
		}
		return def
	}
	admin := func() (*Admin, error) {
		if r.env.Broker == nil {
			return nil, errors.New(action + " needs the behaviour tier")
		}
		return r.admin(), nil
	}
	switch action {
	case "fault":
		raw, _ := json.Marshal(args)
		var f Fault
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, err
		}
		return map[string]any{}, r.rules.Add(f)
	case "clear_faults":
		r.rules.Clear()
		return map[string]any{}, nil
	case "mark":
		name, _ := argsAny.(string)
		r.marks[name] = time.Now()
		return map[string]any{}, nil
	case "wait_event":
		name := str("event")
		count := int(num("count", 1))
		deadline := time.Now().Add(time.Duration(num("timeout_ms", 20000)) * time.Millisecond)
		for {
			got := r.matchingEvents(name, args["match"], time.Time{})
			if len(got) >= count {
				return got, nil
			}
			_, changed := r.drv.Events()
			got = r.matchingEvents(name, args["match"], time.Time{})
			if len(got) >= count {
				return got, nil
			}
			left := time.Until(deadline)
			if left <= 0 {
				all, _ := r.drv.Events()
				var seen []string
				for _, e := range all {
					seen = append(seen, e.Name+show(e.Data))
				}
				return nil, fmt.Errorf("wanted %d %q event(s) matching %s within the timeout, got %d; events: %s", count, name, show(args["match"]), len(got), strings.Join(seen, " | "))
			}
			select {
			case <-changed:
			case <-time.After(left):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	case "no_event":
		since := time.Time{}
		if m := str("since"); m != "" {
			since = r.marks[m]
		}
		if w := num("for_ms", 0); w > 0 {
			select {
			case <-time.After(time.Duration(w) * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if got := r.matchingEvents(str("event"), args["match"], since); len(got) > 0 {
			return nil, fmt.Errorf("unwanted %q event(s): %s", str("event"), show(got))
		}
		return map[string]any{}, nil
	case "events":
		return r.matchingEvents(str("event"), args["match"], time.Time{}), nil
	case "history":
		views, _ := r.selected(args["where"], time.Time{}, time.Time{})
		out := make([]any, len(views))
		for i, v := range views {
			out[i] = v
		}
		return out, nil
	case "wait_request":
		// wait_request: {where, count, timeout_ms} — until that many matching requests
		// were recorded (the history has no change signal, so it looks every 20 ms).
		count := int(num("count", 1))
		deadline := time.Now().Add(time.Duration(num("timeout_ms", 20000)) * time.Millisecond)
		for {
			views, _ := r.selected(args["where"], time.Time{}, time.Time{})
			if len(views) >= count {
				out := make([]any, len(views))
				for i, v := range views {
					out[i] = v
				}
				return out, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("wanted %d requests matching %s, got %d", count, show(args["where"]), len(views))
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	case "quiet":
		from := time.Now()
		select {
		case <-time.After(time.Duration(num("for_ms", 500)) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if views, _ := r.selected(args["where"], from, time.Time{}); len(views) > 0 {
			return nil, fmt.Errorf("want no requests matching %s, got %s", show(args["where"]), summarize(views))
		}
		return map[string]any{}, nil
	case "assert":
		// assert: {value: ${x}, match: <subset>} — a check over saved results.
		if err := Match(args["match"], args["value"]); err != nil {
			return nil, err
		}
		return map[string]any{}, nil
	case "check_batch":
		return map[string]any{}, r.checkBatch(ctx, args)
	case "admin.create_topic":
		a, err := admin()
		if err != nil {
			return nil, err
		}
		raw, _ := json.Marshal(args)
		var t TopicSpec
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, err
		}
		return map[string]any{}, a.CreateTopic(ctx, t)
	case "admin.delete_topic":
		a, err := admin()
		if err != nil {
			return nil, err
		}
		return map[string]any{}, a.DeleteTopic(ctx, str("topic"))
	case "admin.create_user":
		a, err := admin()
		if err != nil {
			return nil, err
		}
		return map[string]any{}, a.CreateUser(ctx, args)
	case "admin.topic":
		a, err := admin()
		if err != nil {
			return nil, err
		}
		t, err := a.Topic(ctx, str("topic"))
		return normalize(t), err
	case "admin.read":
		a, err := admin()
		if err != nil {
			return nil, err
		}
		msgs, err := a.ReadAll(ctx, str("topic"))
		if err != nil {
			return nil, err
		}
		return map[string]any{"messages": msgs}, nil
	case "admin.wait_topic":
		// admin.wait_topic: {topic, match, timeout_ms} — until the topic's detail, as
		// the broker reports it, matches (a backlog drained, nothing in flight).
		a, err := admin()
		if err != nil {
			return nil, err
		}
		deadline := time.Now().Add(time.Duration(num("timeout_ms", 20000)) * time.Millisecond)
		for {
			t, err := a.Topic(ctx, str("topic"))
			var mismatch error
			if err == nil {
				mismatch = Match(args["match"], normalize(t))
				if mismatch == nil {
					return normalize(t), nil
				}
			}
			if time.Now().After(deadline) {
				if err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("the topic never matched: %v (last: %s)", mismatch, show(normalize(t)))
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			a = r.admin()
		}
	case "cluster.kill", "cluster.restart", "cluster.await_leader":
		return r.clusterAction(ctx, action, args)
	case "admin.produce":
		a, err := admin()
		if err != nil {
			return nil, err
		}
		body, ctype, err := BodyBytes(args["body"])
		if err != nil {
			return nil, err
		}
		q := url.Values{}
		if k := str("key"); k != "" {
			q.Set("key", k)
		}
		if p, ok := args["partition"].(float64); ok {
			q.Set("partition", fmt.Sprint(int(p)))
		}
		out, err := a.Produce(ctx, str("topic"), body, ctype, q)
		return normalize(out), err
	}
	return nil, fmt.Errorf("unknown action %q", action)
}

// BodyBytes turns a DRIVER.md body ({"b64"}, {"text"} or {"json"}) into bytes and the
// content type a plain HTTP producer would send.
func BodyBytes(v any) ([]byte, string, error) {
	m, ok := normalize(v).(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("a body is {b64: ...}, {text: ...} or {json: ...}")
	}
	if s, ok := m["b64"].(string); ok {
		b, err := base64.StdEncoding.DecodeString(s)
		return b, "application/octet-stream", err
	}
	if s, ok := m["text"].(string); ok {
		return []byte(s), "text/plain; charset=utf-8", nil
	}
	if s, ok := m["json_text"].(string); ok {
		// JSON exactly as written (spaces and all), as a plain HTTP producer might send it.
		return []byte(s), "application/json", nil
	}
	if j, ok := m["json"]; ok {
		b, err := json.Marshal(j)
		return b, "application/json", err
	}
	return nil, "", fmt.Errorf("a body is {b64: ...}, {text: ...} or {json: ...}")
}

// fillBodies replaces {"fill_bytes": N} with a body of N bytes ("x" repeated), so a
// scenario can send a large message without spelling it out.
func fillBodies(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if n, ok := x["fill_bytes"].(float64); ok && len(x) == 1 {
			return map[string]any{"b64": base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", int(n))))}
		}
		for k, e := range x {
			x[k] = fillBodies(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = fillBodies(e)
		}
	}
	return v
}

// checkBatch holds a produce_batch's per-item results against the topic's contents:
// every item reported ok is in the topic at its partition and offset, and (unless a
// result is uncertain) the topic holds exactly the items reported ok (SDK contract rule 5).
func (r *run) checkBatch(ctx context.Context, args map[string]any) error {
	if r.env.Broker == nil {
		return errors.New("check_batch needs the behaviour tier")
	}
	topic, _ := args["topic"].(string)
	results, _ := args["results"].([]any)
	msgs, err := r.admin().ReadAll(ctx, topic)
	if err != nil {
		return err
	}
	stored := map[string]bool{}
	for _, m := range msgs {
		mm := m.(map[string]any)
		stored[fmt.Sprint(mm["partition"], "@", mm["offset"])] = true
	}
	ok, uncertain := 0, false
	for i, it := range results {
		res, _ := it.(map[string]any)
		if res["ok"] == true {
			ok++
			if !stored[fmt.Sprint(res["partition"], "@", res["offset"])] {
				return fmt.Errorf("item %d is reported stored at %v@%v, which the topic does not hold", i, res["partition"], res["offset"])
			}
			continue
		}
		if e, _ := res["error"].(map[string]any); e != nil && e["uncertain"] == true {
			uncertain = true
		}
	}
	if !uncertain && len(msgs) != ok {
		return fmt.Errorf("%d items are reported stored but the topic holds %d messages: a failure is hidden or a success is unreported", ok, len(msgs))
	}
	return nil
}
