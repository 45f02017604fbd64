package narad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Client talks to a Narad cluster through a list of endpoints. It is safe for concurrent
// use; make one per process and share it. Close it when done.
type Client struct {
	cfg   config
	hc    *http.Client
	log   *slog.Logger
	nodes []*node

	clusterCheck sync.Once

	closed  atomic.Bool
	closing chan struct{}
	probeMu sync.Mutex     // orders wg.Add of background work against Close
	wg      sync.WaitGroup // breaker probes and the cluster check
}

// New returns a Client for the given endpoints (base URLs such as
// "http://10.0.0.1:7942"; a bare host:port means http). Calls go to the first endpoint
// whose breaker is closed, in the order given, and fail over to the next only when it
// fails; lease calls (ack, nack, extend, ack-batch) go to the endpoint that leased the
// message. It makes no request: with two or more endpoints, the first call checks in the
// background that they are one cluster and logs a warning once when they are not.
func New(endpoints []string, opts ...Option) (*Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("narad: New needs at least one endpoint")
	}
	cfg := config{
		retry:        DefaultRetry(),
		poolSize:     DefaultPoolSize,
		timeout:      DefaultRequestTimeout,
		breakerFails: 2,
		breakerCool:  2 * time.Second,
		userAgent:    "narad-go",
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.retry.Attempts < 1 {
		cfg.retry.Attempts = 1
	}
	if cfg.retry.Backoff == nil {
		cfg.retry.Backoff = DefaultRetry().Backoff
	}
	if cfg.breakerFails < 1 {
		cfg.breakerFails = 1
	}
	if cfg.breakerCool <= 0 {
		cfg.breakerCool = 2 * time.Second
	}
	c := &Client{cfg: cfg, closing: make(chan struct{})}
	c.log = cfg.logger
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.hc = cfg.httpClient
	if c.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = cfg.poolSize * len(endpoints)
		tr.MaxIdleConnsPerHost = cfg.poolSize
		tr.IdleConnTimeout = 90 * time.Second
		c.hc = &http.Client{Transport: tr}
	}
	for _, e := range endpoints {
		base, err := normalizeEndpoint(e)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &node{base: base})
	}
	return c, nil
}

func normalizeEndpoint(e string) (string, error) {
	e = strings.TrimSpace(e)
	if !strings.Contains(e, "://") {
		e = "http://" + e
	}
	u, err := url.Parse(e)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("narad: endpoint %q is not a URL like http://host:port", e)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Close stops the client's background probes and closes idle connections. Calls made
// after Close fail with ErrClosed. Closing twice is harmless. Close Publishers and stop
// Consumers first: their pending work fails with ErrClosed once the client is closed.
func (c *Client) Close() error {
	c.probeMu.Lock()
	if c.closed.Swap(true) {
		c.probeMu.Unlock()
		return nil
	}
	close(c.closing)
	c.probeMu.Unlock()
	c.wg.Wait()
	c.hc.CloseIdleConnections()
	return nil
}

// Endpoints returns the client's endpoints as normalized base URLs.
func (c *Client) Endpoints() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.base
	}
	return out
}

func (c *Client) observe(e Event) {
	if c.cfg.observer != nil {
		c.cfg.observer(e)
	}
}

// node is one endpoint with its circuit breaker.
type node struct {
	base string

	mu        sync.Mutex
	fails     int
	open      bool
	openUntil time.Time
	probing   bool
}

func (n *node) available() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.open
}

// pick chooses the endpoint for an attempt. Calls stick to one endpoint rather than
// rotate, because the endpoints may be independent nodes and a lease is only known to
// the node that issued it: prefer (the leasing node) when its breaker is closed and this
// call has not tried it, else the first closed, untried endpoint in the configured order,
// else the first closed one, else (every breaker open: never refuse to try) the one
// whose cooldown ends first. An endpoint whose Retry-After (notBefore) ends after at is
// passed over while another can be tried; when none can, the one whose Retry-After ends
// first is chosen (and the caller waits for it).
func (c *Client) pick(tried map[*node]bool, prefer *node, notBefore map[*node]time.Time, at time.Time) *node {
	ready := func(n *node) bool { return !notBefore[n].After(at) }
	if prefer != nil && !tried[prefer] && prefer.available() && ready(prefer) {
		return prefer
	}
	var fallback *node
	for _, n := range c.nodes {
		if !n.available() || !ready(n) {
			continue
		}
		if !tried[n] {
			return n
		}
		if fallback == nil {
			fallback = n
		}
	}
	if fallback != nil {
		return fallback
	}
	var best *node
	var bestUntil time.Time
	for _, n := range c.nodes {
		if !ready(n) {
			continue
		}
		if u := n.until(); best == nil || u.Before(bestUntil) {
			best, bestUntil = n, u
		}
	}
	if best != nil {
		return best
	}
	best = c.nodes[0]
	for _, n := range c.nodes[1:] {
		if notBefore[n].Before(notBefore[best]) {
			best = n
		}
	}
	return best
}

func (n *node) until() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.openUntil
}

func (c *Client) nodeOK(n *node) {
	n.mu.Lock()
	n.fails = 0
	wasOpen := n.open
	n.open = false
	n.mu.Unlock()
	if wasOpen {
		c.log.Info("narad: endpoint back in rotation", "node", n.base)
		c.observe(Event{Kind: EventBreakerClose, Node: n.base, Start: time.Now()})
	}
}

func (c *Client) nodeFailed(n *node, err error) {
	n.mu.Lock()
	n.fails++
	opened := false
	if !n.open && n.fails >= c.cfg.breakerFails && len(c.nodes) > 1 {
		n.open, opened = true, true
		n.openUntil = time.Now().Add(c.cfg.breakerCool)
	}
	startProbe := opened && !n.probing && !c.closed.Load()
	if startProbe {
		n.probing = true
		c.wg.Add(1)
	}
	n.mu.Unlock()
	if opened {
		c.log.Warn("narad: endpoint out of rotation", "node", n.base, "err", err)
		c.observe(Event{Kind: EventBreakerOpen, Node: n.base, Err: err, Start: time.Now()})
	}
	if startProbe {
		go c.probe(n)
	}
}

// probe checks an open endpoint's /readyz outside the rotation until it answers 200,
// waiting longer after each failure, then puts it back.
func (c *Client) probe(n *node) {
	defer c.wg.Done()
	defer func() { n.mu.Lock(); n.probing = false; n.mu.Unlock() }()
	wait := c.cfg.breakerCool
	for {
		t := time.NewTimer(wait)
		select {
		case <-c.closing:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, err := api.NewReadyzRequest(server(n))
		var resp *http.Response
		if err == nil {
			resp, err = c.hc.Do(req.WithContext(ctx))
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // drained so the connection is reused; the response is not needed
			resp.Body.Close()
		}
		cancel()
		if err == nil && resp.StatusCode == http.StatusOK {
			c.nodeOK(n)
			return
		}
		wait = min(wait*2, time.Minute)
		n.mu.Lock()
		n.openUntil = time.Now().Add(wait)
		n.mu.Unlock()
	}
}

// call is one API request, retried and failed over by do.
type call struct {
	op    string
	topic string
	// build makes the request for one attempt, addressed to server (the chosen
	// endpoint's base URL, ending in "/"). It is always a generated api.New<Op>Request
	// builder: the path, method, parameters and body type come from openapi.yaml, so a
	// spec change that breaks the SDK fails to compile. It runs once per attempt, which
	// lets failover move the call to another endpoint and gives every retry a fresh body.
	build func(server string) (*http.Request, error)
	// poll is a long poll's wait: the attempt deadline is poll plus a margin.
	poll time.Duration
	// unsafe marks a call that may take effect twice if retried after an unknown
	// outcome; such a retry happens only with allowDup.
	unsafe   bool
	allowDup bool
	// attempts overrides the client's policy when > 0.
	attempts int
	// count is how many messages the request carries, for observers.
	count int
	// prefer is the endpoint to try first: the one that leased the message a lease
	// call addresses.
	prefer *node
	// leases marks a long poll (consume, consume-batch): its answer leases messages,
	// so an attempt already sent when the caller's context ends is left open for an
	// answer on its way (see attempt).
	leases bool
	// via, when not nil, is the http.Client of a Consumer run's polls: the call goes
	// through it, and the end of the caller's context half-closes the attempt's
	// connection instead of cancelling it, so an answer on its way is still read.
	via *http.Client
}

// reply is a successful (2xx) answer.
type reply struct {
	status int
	body   []byte
	node   string
	from   *node
	// uncertainBefore is set when an earlier attempt of this call may have taken effect.
	uncertainBefore bool
}

// maxRetryAfter bounds how long one Retry-After can hold a call back, whatever the
// header says (the Python SDK's bound too).
const maxRetryAfter = 300 * time.Second

// retryAfterWait is the wait a Retry-After asks for, bounded by maxRetryAfter.
func retryAfterWait(d time.Duration) time.Duration { return min(max(d, 0), maxRetryAfter) }

// budget is what one call may take in all (docs/sdk/contract.md, "Timeouts"): attempts
// × the per-attempt bound + the longest backoff between them. A Retry-After that would
// hold the call past it (or past the caller's deadline) fails the call instead.
func (c *Client) budget(cl *call, attempts int, bo Backoff) time.Duration {
	per := c.cfg.timeout
	if cl.poll > 0 {
		per = cl.poll + c.cfg.timeout
	}
	gap := DefaultMaxBackoff
	if f, ok := bo.(*FullJitter); ok && f.Max > gap {
		gap = f.Max
	}
	return time.Duration(attempts)*per + time.Duration(attempts-1)*gap
}

func (c *Client) do(ctx context.Context, cl *call) (*reply, error) {
	if c.closed.Load() {
		return nil, &Error{Op: cl.op, Topic: cl.topic, kind: ErrClosed}
	}
	attempts := c.cfg.retry.Attempts
	if cl.attempts > 0 {
		attempts = cl.attempts
	}
	if len(c.nodes) > 1 {
		c.clusterCheck.Do(c.startClusterCheck)
	}
	bo := c.cfg.retry.Backoff()
	deadline := time.Now().Add(c.budget(cl, attempts, bo))
	tried := make(map[*node]bool, len(c.nodes))
	// notBefore holds, per endpoint, the time its Retry-After named: this call sends it
	// nothing before then, and goes to another endpoint or waits.
	notBefore := make(map[*node]time.Time, len(c.nodes))
	uncertain := false
	for attempt := 1; ; attempt++ {
		n := c.pick(tried, cl.prefer, notBefore, time.Now())
		tried[n] = true
		rep, err := c.attempt(ctx, cl, n, attempt)
		if err == nil {
			rep.uncertainBefore = uncertain
			return rep, nil
		}
		var e *Error
		if !errors.As(err, &e) {
			return nil, err
		}
		if e.uncertain {
			uncertain = true
		}
		if uncertain {
			e.uncertain = true
		}
		// A produce-batch of which part was stored is never sent again, whatever the
		// duplicates setting: its error says what was stored (contract rules 4 and 5).
		if e.PartlyStored != nil {
			return nil, e
		}
		if !e.Retryable() || attempt >= attempts || ctx.Err() != nil || c.closed.Load() {
			return nil, e
		}
		if e.uncertain && cl.unsafe && !cl.allowDup {
			return nil, e
		}
		now := time.Now()
		if e.RetryAfter > 0 {
			notBefore[n] = now.Add(retryAfterWait(e.RetryAfter))
		}
		// A request refused before it was stored (never sent, or a 503 that stored
		// nothing) fails over to an untried node at once.
		var wait time.Duration
		if e.uncertain || !untried(c.nodes, tried) {
			wait = bo.NextBackOff()
			if wait == StopBackoff {
				return nil, e
			}
		}
		// The next attempt goes to an endpoint that may be sent to by then, else to the
		// one whose Retry-After ends first, after waiting for it.
		next := c.pick(tried, cl.prefer, notBefore, now.Add(wait))
		if nb := notBefore[next]; nb.After(now.Add(wait)) {
			wait = nb.Sub(now)
			if now.Add(wait).After(deadline) {
				c.log.Debug("narad: not retrying: the Retry-After is past the call's budget", "op", cl.op, "topic", cl.topic, "retry_after", e.RetryAfter, "err", e)
				return nil, e
			}
		}
		if d, ok := ctx.Deadline(); ok && now.Add(wait).After(d) {
			// The caller's deadline comes before the next attempt could start.
			return nil, e
		}
		c.log.Debug("narad: retrying", "op", cl.op, "topic", cl.topic, "attempt", attempt, "wait", wait, "err", e)
		c.observe(Event{Kind: EventRetry, Context: ctx, Op: cl.op, Topic: cl.topic, Node: n.base, Attempt: attempt, Err: e, Start: time.Now(), Duration: wait})
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, e
			case <-c.closing:
				t.Stop()
				return nil, e
			case <-t.C:
			}
		}
	}
}

func untried(nodes []*node, tried map[*node]bool) bool {
	for _, n := range nodes {
		if !tried[n] && n.available() {
			return true
		}
	}
	return false
}

// notSent reports whether the request surely never reached a broker (the connection
// was refused), so another node may take it at once.
func notSent(e *Error) bool {
	var op *net.OpError
	return e.Status == 0 && errors.As(e.Err, &op) && op.Op == "dial"
}

func (c *Client) attempt(ctx context.Context, cl *call, n *node, attempt int) (*reply, error) {
	timeout := c.cfg.timeout
	if cl.poll > 0 {
		timeout = cl.poll + c.cfg.timeout
	}
	// The request does not end the moment the caller's context does: once the answer's
	// headers are in, its body is read for up to answerGrace more. A poll cut by a
	// consumer's shutdown may have leased messages; reading its answer lets the consumer
	// hand them back at once instead of leaving them leased for a visibility timeout.
	// A Consumer's poll goes further: its connection is its own, and the end of ctx
	// half-closes it even before the answer's headers are in (connCut), so that an
	// answer the broker has sent is read rather than dropped with its leases, for up
	// to answerGrace too. Any other poll (Receive's; a Consumer's through a transport
	// that cannot be cloned) cannot be half-closed without closing a connection others
	// may share: once sent, it is left open up to pollAnswerWait for its answer to
	// begin, then cut; an answer that began is read within answerGrace. A poll whose
	// caller gave up before it was sent is not sent. The attempt's timeout and the
	// client's Close cut such a poll at once.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	hc, rctx := c.hc, context.Context(actx)
	var cut *connCut
	if cl.via != nil {
		hc, cut = cl.via, &connCut{}
		rctx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { cut.got(info.Conn) },
		})
	}
	wait := cl.leases && cut == nil // a poll left open for its answer
	var hmu sync.Mutex
	headersIn, sent, began := false, false, false
	var timers []*time.Timer
	defer func() {
		hmu.Lock()
		defer hmu.Unlock()
		for _, t := range timers {
			t.Stop()
		}
	}()
	if wait {
		rctx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) {
				if ctx.Err() != nil {
					cancel() // the caller gave up before the poll was written: never send it
				}
			},
			WroteRequest: func(info httptrace.WroteRequestInfo) {
				hmu.Lock()
				sent = info.Err == nil
				hmu.Unlock()
			},
			GotFirstResponseByte: func() {
				hmu.Lock()
				began = true
				hmu.Unlock()
			},
		})
	}
	stopWatch := context.AfterFunc(ctx, func() {
		hmu.Lock()
		defer hmu.Unlock()
		switch {
		case wait && (sent || headersIn):
			if !headersIn && !began {
				timers = append(timers, time.AfterFunc(pollAnswerWait, func() {
					hmu.Lock()
					defer hmu.Unlock()
					if !began && !headersIn {
						cancel()
					}
				}))
			}
			timers = append(timers, time.AfterFunc(answerGrace, cancel))
			// The client's Close cuts the poll at once; the goroutine ends with the attempt.
			go func() {
				select {
				case <-c.closing:
					cancel()
				case <-actx.Done():
				}
			}()
		case !headersIn && (cut == nil || !cut.do()):
			cancel()
		default:
			timers = append(timers, time.AfterFunc(answerGrace, cancel))
		}
	})
	defer stopWatch()
	req, err := cl.build(server(n))
	if err != nil {
		return nil, &Error{Op: cl.op, Topic: cl.topic, Node: n.base, Err: err,
			Message: "the request cannot be built: " + err.Error(), kind: ErrBadRequest}
	}
	req = req.WithContext(rctx)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.cfg.userAgent)
	if c.cfg.auth {
		req.SetBasicAuth(c.cfg.user, c.cfg.password)
	}
	start := time.Now()
	var resp *http.Response
	if wait && ctx.Err() != nil {
		err = ctx.Err() // the caller gave up before the poll was sent: it is not sent
	} else {
		resp, err = hc.Do(req)
	}
	hmu.Lock()
	headersIn = err == nil
	hmu.Unlock()
	var data []byte
	if err == nil {
		data, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			resp = nil
		}
	}
	ev := Event{Kind: EventRequest, Context: ctx, Op: cl.op, Topic: cl.topic, Node: n.base, Attempt: attempt, Messages: cl.count, Start: start, Duration: time.Since(start)}
	if err != nil {
		e := &Error{Op: cl.op, Topic: cl.topic, Node: n.base, Err: err}
		switch {
		case ctx.Err() != nil:
			// The caller gave up; say so with the caller's own error.
			e.Err = ctx.Err()
			e.kind = ErrTimeout
			if errors.Is(ctx.Err(), context.Canceled) {
				e.kind = nil
			}
			e.Message = ctx.Err().Error()
			e.uncertain = cl.unsafe
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			e.kind = ErrTimeout
			e.Message = fmt.Sprintf("no answer within %s", timeout)
			e.uncertain = true
			c.nodeFailed(n, err)
		default:
			e.kind = ErrUnavailable
			e.uncertain = !notSent(e)
			c.nodeFailed(n, err)
		}
		ev.Err = e
		c.observe(ev)
		return nil, e
	}
	ev.Status = resp.StatusCode
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		c.nodeOK(n)
		c.observe(ev)
		return &reply{status: resp.StatusCode, body: data, node: n.base, from: n}, nil
	}
	e := &Error{Op: cl.op, Topic: cl.topic, Node: n.base, Status: resp.StatusCode}
	var wire api.Error
	if json.Unmarshal(data, &wire) == nil && wire.Error.Code != "" {
		e.Code, e.Message = string(wire.Error.Code), wire.Error.Message
		if p := wire.Error.PartlyStored; p != nil {
			e.PartlyStored = &PartlyStored{Stored: p.Stored, FailedPartitions: p.FailedPartitions}
		}
	} else {
		e.Message = strings.TrimSpace(string(data))
		if len(e.Message) > 200 {
			e.Message = e.Message[:200]
		}
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	e.kind = kindOf(resp.StatusCode, e.Code)
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		if s, err := strconv.Atoi(ra); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		} else if t, err := http.ParseTime(ra); err == nil {
			e.RetryAfter = max(time.Until(t), 0)
		}
	}
	switch {
	case e.PartlyStored != nil:
		// Part of the batch was stored: the call took effect, and must not be resent.
		e.uncertain = true
		c.nodeOK(n)
	case e.Code == CodeTimeout, e.Code == CodeMaybeStored, resp.StatusCode == http.StatusGatewayTimeout, resp.StatusCode == http.StatusRequestTimeout:
		// The broker could not tell whether the call took effect: it ran out of time,
		// or (maybe_stored) a disk write failed and could not be taken back.
		e.uncertain = true
	case resp.StatusCode == http.StatusServiceUnavailable && (e.Code == CodeUnavailable || e.Code == ""),
		resp.StatusCode == http.StatusBadGateway:
		// A 502, or a 503 without the broker's error body, is a proxy's answer: the proxy
		// may have sent the request on and lost the broker's reply, so a produce may
		// be stored (the broker never answers 502, and its 503s carry a code).
		e.uncertain = cl.unsafe && (resp.StatusCode == http.StatusBadGateway || e.Code == "")
		c.nodeFailed(n, e)
	default:
		c.nodeOK(n)
	}
	ev.Err = e
	c.observe(ev)
	return nil, e
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// server is the base URL the generated request builders resolve their paths against.
// It ends in "/" so that an endpoint with a path prefix (http://host/narad) keeps it.
func server(n *node) string { return n.base + "/" }

// doJSON runs a call and decodes its JSON answer into out (when out is not nil).
func (c *Client) doJSON(ctx context.Context, cl *call, out any) error {
	rep, err := c.do(ctx, cl)
	if err != nil {
		return err
	}
	if out != nil && len(rep.body) > 0 {
		if err := json.Unmarshal(rep.body, out); err != nil {
			// A 2xx says the call took effect: for a write that must not happen twice
			// (a produce), the unreadable answer leaves it uncertain, never "not done".
			return &Error{Op: cl.op, Topic: cl.topic, Node: rep.node, Status: rep.status, Err: err,
				Message: "the broker's answer is not the JSON the API describes: " + err.Error(), kind: ErrInternal,
				uncertain: cl.unsafe}
		}
	}
	return nil
}

// Ready returns nil when some endpoint answers /readyz with 200.
func (c *Client) Ready(ctx context.Context) error {
	return c.doJSON(ctx, &call{op: "readyz", build: api.NewReadyzRequest}, nil)
}

// ptr returns a pointer to v, for the generated API's optional fields and parameters.
func ptr[T any](v T) *T { return &v }
