package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Exchange is one HTTP request the driver's client made, as the mock or the fault
// proxy saw it, with what it got.
type Exchange struct {
	Seq    int
	Node   int
	Method string
	Path   string
	Query  map[string]string
	Header map[string]string
	Body   []byte
	Start  time.Time
	End    time.Time
	// Status is what the client got (0: no answer); Upstream what the broker (or the
	// fake) answered (0: the request never reached it).
	Status   int
	Upstream int
	// Fault names the action applied: status, drop_reply, reset, delay, or "".
	Fault string
	// Grants are the leases a consume handed out in this exchange (also when the
	// reply was dropped: the broker leased them all the same).
	Grants []Grant
}

// Grant is one lease handed out by a consume.
type Grant struct {
	Topic     string
	Handle    string
	Partition int64
	Offset    int64
	Attempt   int64
}

// Settle is one ack, nack or extend named by a request.
type Settle struct {
	Handle    string
	Extend    string
	HasExtend bool
}

// Settles lists the receipt handles an ack or ack-batch request settles or extends.
func (e *Exchange) Settles() []Settle {
	switch {
	case strings.HasSuffix(e.Path, "/ack"):
		ext, has := e.Query["extend"]
		return []Settle{{Handle: e.Query["receipt_handle"], Extend: ext, HasExtend: has}}
	case strings.HasSuffix(e.Path, "/ack-batch"):
		var req struct {
			Acks []struct {
				ReceiptHandle string  `json:"receipt_handle"`
				Extend        *string `json:"extend"`
			} `json:"acks"`
		}
		_ = json.Unmarshal(e.Body, &req)
		var out []Settle
		for _, a := range req.Acks {
			s := Settle{Handle: a.ReceiptHandle}
			if a.Extend != nil {
				s.Extend, s.HasExtend = *a.Extend, true
			}
			out = append(out, s)
		}
		return out
	}
	return nil
}

// IsPoll reports whether the exchange is a consume or consume-batch taking leases.
func (e *Exchange) IsPoll() bool {
	if _, replay := e.Query["offset"]; replay {
		return false
	}
	return e.Method == http.MethodGet && (strings.HasSuffix(e.Path, "/consume") || strings.HasSuffix(e.Path, "/consume-batch"))
}

// View is the exchange as scenarios match it.
func (e *Exchange) View(t0 time.Time) map[string]any {
	q := map[string]any{}
	for k, v := range e.Query {
		q[k] = v
	}
	h := map[string]any{}
	for k, v := range e.Header {
		h[k] = v
	}
	v := map[string]any{
		"node": float64(e.Node), "method": e.Method, "path": e.Path, "query": q, "headers": h,
		"status": float64(e.Status), "upstream": float64(e.Upstream), "fault": e.Fault,
		"start_ms": float64(e.Start.Sub(t0).Milliseconds()), "body_len": float64(len(e.Body)),
		"body_text": string(e.Body),
	}
	var js any
	if json.Unmarshal(e.Body, &js) == nil {
		v["body_json"] = normalize(js)
	}
	return v
}

// History is everything recorded during one scenario run: exchanges (from the mock or
// the proxies) in order.
type History struct {
	mu   sync.Mutex
	list []*Exchange
}

// add records an exchange as it starts, so a check made while a request is still
// held (a delay fault, a client that gave up) sees it.
func (h *History) add(e *Exchange) {
	h.mu.Lock()
	e.Seq = len(h.list)
	h.list = append(h.list, e)
	h.mu.Unlock()
}

// update changes a recorded exchange under the history's lock.
func (h *History) update(f func()) {
	h.mu.Lock()
	f()
	h.mu.Unlock()
}

// Exchanges returns a snapshot of the exchanges recorded so far.
func (h *History) Exchanges() []*Exchange {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Exchange, len(h.list))
	for i, e := range h.list {
		c := *e
		out[i] = &c
	}
	return out
}

// Rules is the ordered list of faults shared by every node of a scenario.
type Rules struct {
	mu    sync.Mutex
	rules []*ruleState
}

type ruleState struct {
	f    Fault
	re   *regexp.Regexp
	seen int
	used int
}

// Add installs a fault after the ones already there.
func (rs *Rules) Add(f Fault) error {
	st := &ruleState{f: f}
	if strings.HasPrefix(f.Match.Path, "~") {
		re, err := regexp.Compile(f.Match.Path[1:])
		if err != nil {
			return err
		}
		st.re = re
	}
	rs.mu.Lock()
	rs.rules = append(rs.rules, st)
	rs.mu.Unlock()
	return nil
}

// Clear removes every fault.
func (rs *Rules) Clear() {
	rs.mu.Lock()
	rs.rules = nil
	rs.mu.Unlock()
}

func (rs *Rules) take(node int, r *http.Request) *Fault {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, st := range rs.rules {
		if !st.matches(node, r) {
			continue
		}
		if st.f.Times > 0 && st.used >= st.f.Times {
			continue
		}
		st.seen++
		if st.seen <= st.f.Skip {
			return nil
		}
		st.used++
		f := st.f
		return &f
	}
	return nil
}

func (st *ruleState) matches(node int, r *http.Request) bool {
	m := st.f.Match
	if m.Method != "" && !strings.EqualFold(m.Method, r.Method) {
		return false
	}
	if m.Node != nil && *m.Node != node {
		return false
	}
	if st.re != nil {
		if !st.re.MatchString(r.URL.Path) {
			return false
		}
	} else if m.Path != "" && m.Path != r.URL.Path {
		return false
	}
	q := r.URL.Query()
	for k, want := range m.Query {
		_, has := q[k]
		switch {
		case want == "$absent":
			if has {
				return false
			}
		case want == "$present":
			if !has {
				return false
			}
		case strings.HasPrefix(want, "~"):
			if !has || !regexp.MustCompile(want[1:]).MatchString(q.Get(k)) {
				return false
			}
		default:
			if q.Get(k) != want {
				return false
			}
		}
	}
	return true
}

// Front is one endpoint the driver's client talks to: it records every exchange,
// applies the scenario's faults, and hands the rest to its upstream (the fake broker
// in the wire tier, a reverse proxy to narad in the behaviour tier).
type Front struct {
	Node     int
	History  *History
	Rules    *Rules
	Upstream http.Handler

	// mu guards the listener: a node restarted in the background reopens its endpoint
	// from another goroutine.
	mu  sync.Mutex
	ln  net.Listener
	srv *http.Server
}

// Start listens on a free loopback port.
func (f *Front) Start() error { return f.listen("127.0.0.1:0") }

func (f *Front) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	f.mu.Lock()
	f.ln, f.srv = ln, srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// URL is the endpoint's base URL.
func (f *Front) URL() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "http://" + f.ln.Addr().String()
}

// Close stops the endpoint and every connection to it: in a cluster run, the endpoint of
// a killed node goes with it, so the client meets what a dead node gives, a closed
// connection and then refused ones.
func (f *Front) Close() {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Reopen listens again on the endpoint's address after Close (its node came back).
func (f *Front) Reopen() error {
	f.mu.Lock()
	ln := f.ln
	f.mu.Unlock()
	if ln == nil {
		return f.Start()
	}
	return f.listen(ln.Addr().String())
}

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	rec0 := &Exchange{Node: f.Node, Method: r.Method, Path: r.URL.Path, Query: map[string]string{},
		Header: map[string]string{}, Body: body, Start: time.Now()}
	for k, v := range r.URL.Query() {
		rec0.Query[k] = v[0]
	}
	for k, v := range r.Header {
		rec0.Header[strings.ToLower(k)] = v[0]
	}
	f.History.add(rec0)
	// ex collects the outcome; it is copied into the record under the lock at the end.
	ex := &Exchange{}
	*ex = *rec0
	// record stores the outcome. It runs before the client can see anything (an answer
	// or a hang-up): otherwise the driver could report the step done, and the runner
	// check it, before the exchange shows its fault.
	recorded := false
	record := func() {
		if recorded {
			return
		}
		recorded = true
		f.History.update(func() {
			rec0.End, rec0.Status, rec0.Upstream, rec0.Fault, rec0.Grants = time.Now(), ex.Status, ex.Upstream, ex.Fault, ex.Grants
		})
	}
	defer record()
	fault := f.Rules.take(f.Node, r)
	if fault != nil && fault.DelayMs > 0 {
		ex.Fault = "delay"
		select {
		case <-time.After(time.Duration(fault.DelayMs) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case fault != nil && fault.Reset:
		ex.Fault = "reset"
		record()
		hangUp(w)
		return
	case fault != nil && fault.Status != 0:
		ex.Fault = "status"
		for k, v := range fault.Headers {
			w.Header().Set(k, v)
		}
		var out []byte
		switch {
		case fault.JSON != nil:
			out, _ = json.Marshal(normalize(fault.JSON))
			w.Header().Set("Content-Type", "application/json")
		case fault.Body != "":
			out = []byte(fault.Body)
		case fault.Status >= 400:
			out, _ = json.Marshal(map[string]any{"error": map[string]any{"code": defaultCode(fault.Status), "message": "injected by the conformance runner"}})
			w.Header().Set("Content-Type", "application/json")
		}
		ex.Status = fault.Status
		record()
		w.WriteHeader(fault.Status)
		_, _ = w.Write(out)
		return
	}
	rec := &recorder{header: http.Header{}}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	f.Upstream.ServeHTTP(rec, r2)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	ex.Upstream = rec.status
	if rec.status == http.StatusOK && ex.IsPoll() {
		ex.Grants = grantsOf(rec.body)
	}
	if fault != nil && fault.DropReply {
		ex.Fault = "drop_reply"
		record()
		hangUp(w)
		return
	}
	ex.Status = rec.status
	record()
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body)
}

// hangUp closes the client's connection without an answer, with a TCP reset.
func hangUp(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func defaultCode(status int) string {
	switch status {
	case 400:
		return "bad_request"
	case 401:
		return "unauthenticated"
	case 403:
		return "forbidden"
	case 404:
		return "topic_not_found"
	case 409:
		return "conflict"
	case 410:
		return "lease_lost"
	case 413:
		return "payload_too_large"
	case 503:
		return "unavailable"
	}
	return "internal"
}

func grantsOf(body []byte) []Grant {
	type wm struct {
		Topic           string `json:"topic"`
		Partition       int64  `json:"partition"`
		Offset          int64  `json:"offset"`
		ReceiptHandle   string `json:"receipt_handle"`
		DeliveryAttempt int64  `json:"delivery_attempt"`
	}
	var many struct {
		Messages []wm `json:"messages"`
	}
	var one wm
	var list []wm
	if json.Unmarshal(body, &many) == nil && many.Messages != nil {
		list = many.Messages
	} else if json.Unmarshal(body, &one) == nil && one.ReceiptHandle != "" {
		list = []wm{one}
	}
	var out []Grant
	for _, m := range list {
		if m.ReceiptHandle != "" {
			out = append(out, Grant{Topic: m.Topic, Handle: m.ReceiptHandle, Partition: m.Partition, Offset: m.Offset, Attempt: m.DeliveryAttempt})
		}
	}
	return out
}

type recorder struct {
	header http.Header
	status int
	body   []byte
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

// ReverseProxy forwards requests to a broker, or in turn to the nodes of a cluster
// (Bases): each request to the next node, so every route is served through every node.
type ReverseProxy struct {
	Base   string
	Bases  []string
	Client *http.Client
	next   atomic.Uint64
}

func (p *ReverseProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	base := p.Base
	if len(p.Bases) > 0 {
		base = p.Bases[(p.next.Add(1)-1)%uint64(len(p.Bases))]
	}
	u := base + r.URL.Path
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	// The upstream call outlives a client that hangs up, so a served request stays
	// served (the point of drop_reply), but not forever.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, u, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for _, h := range []string{"Authorization", "Content-Type", "Accept", "User-Agent"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.ContentLength = r.ContentLength
	resp, err := p.Client.Do(req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, `{"error":{"code":"unavailable","message":%q}}`, err.Error())
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func atoiDefault(s string, def int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return def
	}
	return n
}
