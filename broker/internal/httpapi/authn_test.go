package httpapi

// The tests of this file are not parallel: they measure how logins behave in time (a
// flood in flight, a quiet window of the log), which tests running beside them skew.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/auth"
)

// fakeUsers is an in-memory user store for the authenticator.
type fakeUsers struct {
	mu    sync.Mutex
	users map[string]auth.User
}

func newFakeUsers(t *testing.T, namePass ...string) *fakeUsers {
	t.Helper()
	f := &fakeUsers{users: map[string]auth.User{}}
	for i := 0; i+1 < len(namePass); i += 2 {
		h, err := auth.HashPassword(namePass[i+1])
		if err != nil {
			t.Fatal(err)
		}
		f.users[namePass[i]] = auth.User{Name: namePass[i], Hash: h, Grants: []auth.Grant{}}
	}
	return f
}

func (f *fakeUsers) get(name string) (auth.User, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, ok := f.users[name]
	return u, ok
}

// loginRequest is a request from client address addr with Basic credentials.
func loginRequest(addr, user, pass string) *http.Request {
	r := httptest.NewRequest("GET", "/v1/topics", nil)
	r.RemoteAddr = addr
	if user != "" || pass != "" {
		r.SetBasicAuth(user, pass)
	}
	return r
}

func statusOf(err error) (int, string, int) {
	if err == nil {
		return http.StatusOK, "", 0
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		return 0, err.Error(), 0
	}
	return ae.status, string(ae.code), ae.retryAfter
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// floodBound is the most unproven login attempts from one address the test lets be
// in flight at once; the authenticator's own bound is below it.
const floodBound = 8

// TestFailDelayReachesItsBound: a client that keeps failing waits up to the configured
// longest delay. The doubling stopped at 3.2 s, so a longer --auth-failure-delay was
// never reached (and the flood test below, which counts on a 60 s delay to keep its
// admitted attempts in flight, failed when the other logins took over 3.2 s).
func TestFailDelayReachesItsBound(t *testing.T) {
	users := newFakeUsers(t, "u", "u-password")
	a := newAuthenticator(users.get, 60*time.Second, quietLogger(), nil)
	a.mu.Lock()
	a.fails["10.0.0.9"] = &failState{n: 40, last: time.Now()}
	a.mu.Unlock()
	if d := a.failDelay("10.0.0.9"); d != 60*time.Second {
		t.Fatalf("after 40 recent failures the delay is %v, want the bound of 60s", d)
	}
}

// TestLoginFloodFromOneAddress: a flood of wrong passwords from one address is bounded
// before any hashing. Attempts past the per-address bound get a fast 503 with
// Retry-After, the admitted ones wait out their failure delay before they hash, and
// meanwhile a user from another address and a user whose credentials passed before
// (even from the flooding address) log in.
func TestLoginFloodFromOneAddress(t *testing.T) {
	users := newFakeUsers(t, "victim", "victim-password", "fresh", "fresh-password", "known", "known-password")
	// A long failure delay keeps the admitted flood attempts in flight for the whole test.
	a := newAuthenticator(users.get, 60*time.Second, quietLogger(), nil)
	const flooder = "10.0.0.9"

	// "known" logs in from the flooding address before the flood starts.
	if _, err := a.authenticate(loginRequest(flooder+":1000", "known", "known-password")); err != nil {
		t.Fatalf("known's first login: %v", err)
	}
	// The flooding address has failed often already: its next attempts are slowed.
	a.mu.Lock()
	a.fails[flooder] = &failState{n: 20, last: time.Now()}
	a.mu.Unlock()

	const n = 64
	type result struct {
		status, retryAfter int
		code               string
		took               time.Duration
	}
	results := make(chan result, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var done atomic.Int32
	for i := 0; i < n; i++ {
		go func(i int) {
			r := loginRequest(fmt.Sprintf("%s:%d", flooder, 2000+i), "victim", fmt.Sprintf("guess-%03d", i)).WithContext(ctx)
			start := time.Now()
			_, err := a.authenticate(r)
			st, code, ra := statusOf(err)
			done.Add(1)
			results <- result{st, ra, code, time.Since(start)}
		}(i)
	}
	// The attempts past the bound are answered at once; collect them.
	var refused []result
	deadline := time.After(60 * time.Second)
	for len(refused) < n-floodBound {
		select {
		case r := <-results:
			if r.status != http.StatusServiceUnavailable {
				t.Fatalf("a flood attempt answered %d %s after %v while the flood was in flight; want the attempts past the bound refused at once with 503", r.status, r.code, r.took)
			}
			refused = append(refused, r)
		case <-deadline:
			t.Fatalf("only %d of %d flood attempts were refused within 60 s; want all but %d refused before any hashing", len(refused), n, floodBound)
		}
	}
	for _, r := range refused {
		if r.code != "unavailable" || r.retryAfter < 1 {
			t.Errorf("refused flood attempt: %d %s Retry-After %d; want 503 unavailable with Retry-After", r.status, r.code, r.retryAfter)
		}
	}
	// While the admitted attempts are still in flight, others log in.
	if _, err := a.authenticate(loginRequest("10.0.0.1:3000", "fresh", "fresh-password")); err != nil {
		t.Errorf("a user from another address could not log in during the flood: %v", err)
	}
	a.mu.Lock()
	for k, e := range a.cache {
		e.expires = time.Now().Add(-time.Second) // past the no-hash cache: known must hash again
		a.cache[k] = e
	}
	a.mu.Unlock()
	if _, err := a.authenticate(loginRequest(flooder+":4000", "known", "known-password")); err != nil {
		t.Errorf("a user whose login passed before could not log in from the flooding address: %v", err)
	}
	if d := done.Load(); d >= n {
		t.Errorf("all %d flood attempts had finished before the other logins; the test wants them in flight", d)
	}
	cancel() // the admitted attempts are waiting out their delay; let them go
	for i := len(refused); i < n; i++ {
		select {
		case r := <-results:
			if r.status == http.StatusOK {
				t.Errorf("a wrong password was accepted")
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("flood attempts still running 60 s after their requests were cancelled")
		}
	}
}

// lineCounter counts log lines and keeps the last one.
type lineCounter struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func (l *lineCounter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += bytes.Count(p, []byte("\n"))
	l.lines = append(l.lines, strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestFailedLoginLogAndTableBounded: failed logins from many addresses neither write one
// log line each without limit nor grow the per-address failure table without bound.
// Malformed credentials (an empty username) fail without a bcrypt, so the test is fast.
func TestFailedLoginLogAndTableBounded(t *testing.T) {
	users := newFakeUsers(t)
	var lc lineCounter
	a := newAuthenticator(users.get, 0, slog.New(slog.NewTextHandler(&lc, nil)), nil)
	const addrs = 30_000
	for i := 0; i < addrs; i++ {
		r := loginRequest(fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255), "", "some-password")
		_, err := a.authenticate(r)
		if st, code, _ := statusOf(err); st != http.StatusUnauthorized {
			t.Fatalf("malformed credentials: %d %s, want 401", st, code)
		}
	}
	a.mu.Lock()
	size := len(a.fails)
	a.mu.Unlock()
	if size > 20_000 {
		t.Errorf("the failure table holds %d addresses after failures from %d; want it bounded", size, addrs)
	}
	lc.mu.Lock()
	lines := lc.n
	lc.mu.Unlock()
	if lines > 100 {
		t.Errorf("%d failed logins wrote %d log lines; want them rate-limited", addrs, lines)
	}
	// The first line written after the window says how many were left out.
	later := time.Now().Add(time.Minute)
	a.now = func() time.Time { return later }
	a.authenticate(loginRequest("10.200.0.1:1", "", "some-password"))
	lc.mu.Lock()
	last := lc.lines[len(lc.lines)-1]
	lc.mu.Unlock()
	if want := fmt.Sprintf("unlogged_since_last=%d", addrs-lines); !strings.Contains(last, want) {
		t.Errorf("the line after the quiet window is %q; want it to carry %s", last, want)
	}
}

// TestHashGateProvenFirst: when a bcrypt slot frees, a waiting proven check gets it
// before unproven ones that waited longer.
func TestHashGateProvenFirst(t *testing.T) {
	g := newHashGate(1)
	ctx := context.Background()
	if err := g.acquire(ctx, false); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 3)
	queued := func(n int) {
		waitUntil(t, "the waiters to queue", func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.hi)+len(g.lo) == n })
	}
	go func() { g.acquire(ctx, false); order <- "unproven-1"; g.release() }()
	queued(1)
	go func() { g.acquire(ctx, false); order <- "unproven-2"; g.release() }()
	queued(2)
	go func() { g.acquire(ctx, true); order <- "proven"; g.release() }()
	queued(3)
	// A waiter that gives up leaves the queue and takes no slot.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- g.acquire(cctx, true) }()
	queued(4)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled wait got a slot")
	}
	g.release()
	var got []string
	for i := 0; i < 3; i++ {
		got = append(got, <-order)
	}
	if strings.Join(got, ",") != "proven,unproven-1,unproven-2" {
		t.Fatalf("slots went to %v; want the proven check first, then the others in arrival order", got)
	}
	g.mu.Lock()
	free := g.free
	g.mu.Unlock()
	if free != 1 {
		t.Fatalf("%d slots free after every holder released; want 1", free)
	}
}

// TestLoginCatchesUpWithTheCluster: on a clustered node, a user created through
// another node a moment ago (not yet in this node's metadata) logs in once the node
// has caught up with the controller, and a wrong password still fails; the catch-up
// runs only for a login that failed.
func TestLoginCatchesUpWithTheCluster(t *testing.T) {
	users := newFakeUsers(t, "old", "old-password")
	pending := newFakeUsers(t, "new", "new-password") // what the controller has committed
	a := newAuthenticator(users.get, 0, quietLogger(), nil)
	var catchUps atomic.Int32
	a.catchUp = func(context.Context) error {
		catchUps.Add(1)
		users.mu.Lock()
		defer users.mu.Unlock()
		for k, v := range pending.users {
			users.users[k] = v
		}
		return nil
	}
	if _, err := a.authenticate(loginRequest("10.0.0.1:1", "old", "old-password")); err != nil {
		t.Fatalf("a known user: %v", err)
	}
	if n := catchUps.Load(); n != 0 {
		t.Fatalf("%d catch-ups for a login that passed, want 0", n)
	}
	if _, err := a.authenticate(loginRequest("10.0.0.2:1", "new", "new-password")); err != nil {
		t.Fatalf("a user created through another node: %v, want it to log in after the catch-up", err)
	}
	if st, _, _ := statusOf(mustFail(a.authenticate(loginRequest("10.0.0.3:1", "new", "not-it")))); st != http.StatusUnauthorized {
		t.Fatalf("a wrong password after the catch-up: %d, want 401", st)
	}
}

func mustFail(_ *auth.User, err error) error { return err }
