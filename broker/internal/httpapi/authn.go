package httpapi

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
)

type principalKey struct{}

// principal returns the authenticated user of a request, or nil when security is off.
func principal(ctx context.Context) *auth.User {
	u, _ := ctx.Value(principalKey{}).(*auth.User)
	return u
}

// authenticator checks HTTP Basic credentials (and the current password of a password
// change) against the users in the control plane. bcrypt is slow on purpose, which makes
// every password check a way to spend the node's CPU; so:
//
//   - a credential that passed is remembered (by an HMAC of name and password under a
//     key drawn at start, compared in constant time, and only while the stored hash is
//     unchanged): for 2 minutes it passes without a bcrypt, and for a day its bcrypt
//     goes ahead of every unproven one, so a flood never stands in front of a known user;
//   - unproven attempts are bounded per client address and in total before anything is
//     hashed: past the bound they get a fast 503 with Retry-After;
//   - a client address that keeps failing waits out a growing delay before its next
//     attempt is hashed (not after), holding one of its few admitted places meanwhile;
//   - identical checks in flight (a pool of connections opening with one credential)
//     share one bcrypt;
//   - at most max(2, CPUs) bcrypts run at once.
type authenticator struct {
	users func(name string) (auth.User, bool)
	// catchUp, in a cluster, brings this node's metadata up to the controller's: a user
	// created, or a password changed, through another node a moment ago. Nil on a lone
	// node.
	catchUp func(ctx context.Context) error
	maxWait time.Duration // longest delay for a client that keeps failing; 0 disables it
	log     *slog.Logger
	metrics *broker.Metrics
	gate    *hashGate
	dummy   []byte   // a hash compared against for unknown users, so timing does not tell them apart
	macKey  [32]byte // keys the digests of passwords held in memory
	now     func() time.Time

	mu       sync.Mutex
	cache    map[string]cacheEntry // by username: the last credential that passed
	fails    map[string]*failState // by client address
	pending  map[string]int        // unproven attempts in flight, by client address
	pendingN int                   // unproven attempts in flight, in total
	checks   map[string]*pwCheck   // bcrypts in flight, by digest and stored hash
	logs     logLimit
}

type cacheEntry struct {
	storedHash []byte
	digest     [32]byte
	expires    time.Time // until then the credential passes without a bcrypt
	known      time.Time // until then its bcrypt goes ahead of unproven ones
}

type failState struct {
	n    int
	last time.Time
}

// pwCheck is one bcrypt in flight; identical checks wait for it instead of hashing.
type pwCheck struct {
	done chan struct{}
	ok   bool
	err  error
}

const (
	authCacheTTL  = 2 * time.Minute
	knownGoodTTL  = 24 * time.Hour
	failMemory    = 5 * time.Minute
	freeFailures  = 3
	bcryptWaitMax = 5 * time.Second
	// maxPendingPerClient and maxPendingTotal bound the unproven password checks in
	// flight (waiting out a delay, queued for bcrypt, or hashing) from one client
	// address and from all of them.
	maxPendingPerClient = 4
	maxPendingTotal     = 64
	// maxFailClients and maxCacheEntries bound the two tables.
	maxFailClients  = 10_000
	maxCacheEntries = 10_000
	// At most failLogBurst failure lines are written per failLogWindow; the next line
	// written says how many were left out.
	failLogBurst  = 10
	failLogWindow = 10 * time.Second
)

func newAuthenticator(users func(string) (auth.User, bool), maxWait time.Duration, log *slog.Logger, m *broker.Metrics) *authenticator {
	dummy, _ := bcrypt.GenerateFromPassword([]byte("narad-dummy-password"), auth.BcryptCost)
	a := &authenticator{
		users: users, maxWait: maxWait, log: log, metrics: m, dummy: dummy, now: time.Now,
		gate:    newHashGate(max(2, runtime.NumCPU())),
		cache:   make(map[string]cacheEntry),
		fails:   make(map[string]*failState),
		pending: make(map[string]int),
		checks:  make(map[string]*pwCheck),
	}
	if _, err := rand.Read(a.macKey[:]); err != nil {
		panic("httpapi: no randomness for the credential cache: " + err.Error())
	}
	return a
}

func unauthenticated(msg string) *apiError {
	return newErr(http.StatusUnauthorized, apigen.ErrorCodeUnauthenticated, msg)
}

// tooManyLogins answers an unproven password check the node will not hash now.
func tooManyLogins() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
		msg: "too many password checks are in flight from your address or in total; retry after Retry-After seconds"}
}

// clientKey is the client address failures and attempts are counted by: the IP, or for
// IPv6 its /64, which one host usually holds whole.
func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
	}
	return host
}

// errWrongPassword means the name or password did not match.
var errWrongPassword = errors.New("wrong username or password")

// authenticate returns the user named by the request's Basic credentials.
// catchUpBound bounds the catch-up of a login that failed on a clustered node.
const catchUpBound = 2 * time.Second

func (a *authenticator) authenticate(r *http.Request) (*auth.User, error) {
	name, pw, ok := r.BasicAuth()
	if !ok {
		return nil, unauthenticated("credentials are required: send HTTP Basic auth (curl -u user:password)")
	}
	if name == "" || len(name) > auth.MaxUsernameLen || len(pw) > auth.MaxPasswordBytes {
		return nil, a.fail(r, name, "malformed credentials")
	}
	seen, seenFound := a.users(name)
	u, err := a.check(r, name, pw)
	if errors.Is(err, errWrongPassword) && a.catchUp != nil {
		// The user may have been created, or the password changed, through another
		// node a moment ago: catch up, and check again only if the record changed.
		ctx, cancel := context.WithTimeout(r.Context(), catchUpBound)
		cerr := a.catchUp(ctx)
		cancel()
		if now, found := a.users(name); cerr == nil && (found != seenFound || !bytes.Equal(now.Hash, seen.Hash)) {
			u, err = a.check(r, name, pw)
		}
	}
	if errors.Is(err, errWrongPassword) {
		return nil, a.fail(r, name, "wrong username or password")
	}
	if err != nil {
		return nil, err
	}
	return &u, nil
}

// check verifies that pw is user name's password, under the limits above. It returns
// the user, errWrongPassword, or a 503 the caller passes on; the caller counts a
// failure with fail.
func (a *authenticator) check(r *http.Request, name, pw string) (auth.User, error) {
	u, found := a.users(name)
	digest := a.digest(name, pw)
	proven := false
	if found {
		now := a.now()
		a.mu.Lock()
		e, hit := a.cache[name]
		a.mu.Unlock()
		if hit && bytes.Equal(e.storedHash, u.Hash) && subtle.ConstantTimeCompare(e.digest[:], digest[:]) == 1 {
			if now.Before(e.expires) {
				return u, nil
			}
			proven = now.Before(e.known)
		}
	}
	hash := a.dummy
	if found {
		hash = u.Hash
	}
	ok, err := a.verify(r, digest, hash, pw, proven)
	if err != nil {
		return auth.User{}, err
	}
	if !found || !ok {
		return auth.User{}, errWrongPassword
	}
	a.remember(name, u.Hash, digest)
	return u, nil
}

func (a *authenticator) digest(name, pw string) [32]byte {
	m := hmac.New(sha256.New, a.macKey[:])
	m.Write([]byte(name))
	m.Write([]byte{0})
	m.Write([]byte(pw))
	var d [32]byte
	copy(d[:], m.Sum(nil))
	return d
}

// remember records a credential that passed (or that was just set, see rememberSet): it then passes
// without a bcrypt for a while, and goes first for longer.
func (a *authenticator) remember(name string, storedHash []byte, digest [32]byte) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.cache[name]; !ok && len(a.cache) >= maxCacheEntries {
		for k, e := range a.cache {
			if !now.Before(e.known) {
				delete(a.cache, k)
			}
		}
		for k := range a.cache { // still full: forget any one
			if len(a.cache) < maxCacheEntries {
				break
			}
			delete(a.cache, k)
		}
	}
	a.cache[name] = cacheEntry{storedHash: storedHash, digest: digest, expires: now.Add(authCacheTTL), known: now.Add(knownGoodTTL)}
}

// rememberSet remembers pw, just set as user name's password, as a login that passed,
// if it is still the password stored: another change may have landed between the
// write and this call (two changes racing, through two nodes or two requests), and
// the hash stored by then may be another password's. The broker does not say which
// hash it stored, so one bcrypt against the stored hash tells; it goes ahead of
// unproven checks, and when none can run soon the password is simply not remembered
// (its first login then hashes as any other).
func (a *authenticator) rememberSet(ctx context.Context, name, pw string) {
	u, ok := a.users(name)
	if !ok {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, bcryptWaitMax)
	defer cancel()
	if a.gate.acquire(wctx, true) != nil {
		return
	}
	err := bcrypt.CompareHashAndPassword(u.Hash, []byte(pw))
	a.gate.release()
	if err == nil {
		a.remember(name, u.Hash, a.digest(name, pw))
	}
}

// verify runs one bcrypt of pw against hash, or waits for an identical one in flight.
func (a *authenticator) verify(r *http.Request, digest [32]byte, hash []byte, pw string, proven bool) (bool, error) {
	key := string(digest[:]) + string(hash)
	a.mu.Lock()
	if c := a.checks[key]; c != nil {
		a.mu.Unlock()
		select {
		case <-c.done:
			return c.ok, c.err
		case <-r.Context().Done():
			return false, tooManyLogins()
		}
	}
	c := &pwCheck{done: make(chan struct{})}
	a.checks[key] = c
	a.mu.Unlock()
	c.ok, c.err = a.hashCheck(r, hash, pw, proven)
	a.mu.Lock()
	delete(a.checks, key)
	a.mu.Unlock()
	close(c.done)
	return c.ok, c.err
}

// hashCheck admits an unproven check (or refuses it at once), waits out the client's
// failure delay, then takes a bcrypt slot, proven checks first.
func (a *authenticator) hashCheck(r *http.Request, hash []byte, pw string, proven bool) (bool, error) {
	ctx := r.Context()
	if !proven {
		key := clientKey(r)
		if !a.admit(key) {
			if a.metrics != nil {
				a.metrics.AuthThrottled.Inc()
			}
			a.logLine(ctx, "password check refused: too many in flight", "client", key)
			return false, tooManyLogins()
		}
		defer a.leave(key)
		if d := a.failDelay(key); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return false, tooManyLogins()
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, bcryptWaitMax)
	defer cancel()
	if err := a.gate.acquire(wctx, proven); err != nil {
		if a.metrics != nil {
			a.metrics.AuthThrottled.Inc()
		}
		return false, &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeUnavailable, retryAfter: 1,
			msg: "too many password checks are running; retry after Retry-After seconds"}
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(pw))
	a.gate.release()
	return err == nil, nil
}

func (a *authenticator) admit(key string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending[key] >= maxPendingPerClient || a.pendingN >= maxPendingTotal {
		return false
	}
	a.pending[key]++
	a.pendingN++
	return true
}

func (a *authenticator) leave(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending[key]--; a.pending[key] <= 0 {
		delete(a.pending, key)
	}
	a.pendingN--
}

// failDelay is how long an unproven attempt from a client waits before its bcrypt:
// nothing for the first few recent failures, then 100 ms doubling up to maxWait (the
// shift is bounded only so that it cannot overflow: bounded at 6, it stopped at 3.2 s
// whatever --auth-failure-delay said).
func (a *authenticator) failDelay(key string) time.Duration {
	if a.maxWait <= 0 {
		return 0
	}
	now := a.now()
	a.mu.Lock()
	n := 0
	if f := a.fails[key]; f != nil && now.Sub(f.last) <= failMemory {
		n = f.n
	}
	a.mu.Unlock()
	if n < freeFailures {
		return 0
	}
	return min(time.Duration(50<<min(n-freeFailures+1, 20))*time.Millisecond, a.maxWait)
}

// fail counts a failed login and logs it (rate-limited) without the password. The
// count slows the client's next attempts (failDelay). A success does not reset it (an
// attacker holding one valid account could otherwise reset it at will); it decays after
// failMemory without failures.
func (a *authenticator) fail(r *http.Request, name, why string) error {
	key := clientKey(r)
	now := a.now()
	a.mu.Lock()
	f := a.fails[key]
	if f == nil || now.Sub(f.last) > failMemory {
		if f == nil {
			a.makeRoomForFails(now)
		}
		f = &failState{}
		a.fails[key] = f
	}
	f.n++
	f.last = now
	n := f.n
	a.mu.Unlock()
	if a.metrics != nil {
		a.metrics.AuthFailures.Inc()
	}
	a.logLine(r.Context(), "authentication failed", "user", clip(name, 64), "client", key, "reason", why, "recent_failures", n)
	return unauthenticated("wrong username or password")
}

// failForbidden counts a wrong current_password like a failed login and answers 403.
func (a *authenticator) failForbidden(r *http.Request, name string) error {
	_ = a.fail(r, name, "wrong current_password") // counts the failure; the caller answers 403, not its 401
	return forbidden("current_password is wrong")
}

// makeRoomForFails keeps the failure table under maxFailClients: it forgets clients
// whose failures have decayed, and if that is not enough, the tenth that failed least
// recently. Called with a.mu held.
func (a *authenticator) makeRoomForFails(now time.Time) {
	if len(a.fails) < maxFailClients {
		return
	}
	for k, v := range a.fails {
		if now.Sub(v.last) > failMemory {
			delete(a.fails, k)
		}
	}
	if len(a.fails) < maxFailClients {
		return
	}
	lasts := make([]time.Time, 0, len(a.fails))
	for _, v := range a.fails {
		lasts = append(lasts, v.last)
	}
	slices.SortFunc(lasts, func(x, y time.Time) int { return x.Compare(y) })
	cut := lasts[len(lasts)/10]
	for k, v := range a.fails {
		if !v.last.After(cut) {
			delete(a.fails, k)
		}
	}
}

// logLine writes a warning about a refused login unless too many were written lately;
// the next one written carries the count left out.
func (a *authenticator) logLine(ctx context.Context, msg string, args ...any) {
	a.mu.Lock()
	ok, left := a.logs.allow(a.now())
	a.mu.Unlock()
	if !ok {
		return
	}
	if left > 0 {
		args = append(args, "unlogged_since_last", left)
	}
	a.log.WarnContext(ctx, msg, args...)
}

// logLimit allows failLogBurst lines per failLogWindow and counts the rest.
type logLimit struct {
	start      time.Time
	n          int
	suppressed int
}

func (l *logLimit) allow(now time.Time) (bool, int) {
	if now.Sub(l.start) >= failLogWindow || now.Before(l.start) {
		l.start, l.n = now, 0
	}
	if l.n >= failLogBurst {
		l.suppressed++
		return false, 0
	}
	l.n++
	left := l.suppressed
	l.suppressed = 0
	return true, left
}

// hashGate hands out the bcrypt slots: to waiting proven checks first, then to
// unproven ones, each group in arrival order.
type hashGate struct {
	mu     sync.Mutex
	free   int
	hi, lo []*gateWaiter
}

type gateWaiter struct {
	ch      chan struct{}
	granted bool
}

func newHashGate(slots int) *hashGate { return &hashGate{free: slots} }

func (g *hashGate) acquire(ctx context.Context, first bool) error {
	g.mu.Lock()
	if g.free > 0 {
		g.free--
		g.mu.Unlock()
		return nil
	}
	w := &gateWaiter{ch: make(chan struct{})}
	if first {
		g.hi = append(g.hi, w)
	} else {
		g.lo = append(g.lo, w)
	}
	g.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		if w.granted { // the slot came as the wait ended: hand it on
			g.mu.Unlock()
			g.release()
			return ctx.Err()
		}
		g.hi = slices.DeleteFunc(g.hi, func(x *gateWaiter) bool { return x == w })
		g.lo = slices.DeleteFunc(g.lo, func(x *gateWaiter) bool { return x == w })
		g.mu.Unlock()
		return ctx.Err()
	}
}

func (g *hashGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var w *gateWaiter
	switch {
	case len(g.hi) > 0:
		w, g.hi = g.hi[0], g.hi[1:]
	case len(g.lo) > 0:
		w, g.lo = g.lo[0], g.lo[1:]
	default:
		g.free++
		return
	}
	w.granted = true
	close(w.ch)
}
