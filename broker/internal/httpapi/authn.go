package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
)

type principalKey struct{}

// principal returns the authenticated user of a request, or nil when security is off.
func principal(ctx context.Context) *auth.User {
	u, _ := ctx.Value(principalKey{}).(*auth.User)
	return u
}

// authenticator checks HTTP Basic credentials against the users in the control plane.
// bcrypt is slow on purpose, so a successful check is remembered for a short while (by
// a SHA-256 of the password, compared in constant time, and only while the stored hash
// is unchanged); concurrent bcrypt work is bounded; and a client that keeps failing is
// slowed down with a small, capped delay.
type authenticator struct {
	users   func(name string) (auth.User, bool)
	maxWait time.Duration // longest delay for a client that keeps failing; 0 disables it
	log     *slog.Logger
	metrics *broker.Metrics
	sem     chan struct{}
	dummy   []byte // a hash compared against for unknown users, so timing does not tell them apart

	mu    sync.Mutex
	cache map[string]cacheEntry
	fails map[string]*failState
}

type cacheEntry struct {
	storedHash []byte
	digest     [32]byte
	expires    time.Time
}

type failState struct {
	n    int
	last time.Time
}

const (
	authCacheTTL  = 2 * time.Minute
	failMemory    = 5 * time.Minute
	freeFailures  = 3
	bcryptWaitMax = 5 * time.Second
)

func newAuthenticator(users func(string) (auth.User, bool), maxWait time.Duration, log *slog.Logger, m *broker.Metrics) *authenticator {
	dummy, _ := bcrypt.GenerateFromPassword([]byte("narad-dummy-password"), auth.BcryptCost)
	return &authenticator{
		users: users, maxWait: maxWait, log: log, metrics: m, dummy: dummy,
		sem:   make(chan struct{}, max(2, runtime.NumCPU())),
		cache: make(map[string]cacheEntry),
		fails: make(map[string]*failState),
	}
}

func unauthenticated(msg string) *apiError {
	return newErr(http.StatusUnauthorized, "unauthenticated", msg)
}

func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// authenticate returns the user named by the request's Basic credentials.
func (a *authenticator) authenticate(r *http.Request) (*auth.User, error) {
	name, pw, ok := r.BasicAuth()
	if !ok {
		return nil, unauthenticated("credentials are required: send HTTP Basic auth (curl -u user:password)")
	}
	if name == "" || len(name) > auth.MaxUsernameLen || len(pw) > auth.MaxPasswordBytes {
		return nil, a.fail(r, name, "malformed credentials")
	}
	u, found := a.users(name)
	digest := sha256.Sum256([]byte(pw))
	if found {
		a.mu.Lock()
		e, hit := a.cache[name]
		a.mu.Unlock()
		if hit && time.Now().Before(e.expires) && bytes.Equal(e.storedHash, u.Hash) && subtle.ConstantTimeCompare(e.digest[:], digest[:]) == 1 {
			return &u, nil
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), bcryptWaitMax)
	defer cancel()
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, &apiError{status: http.StatusServiceUnavailable, code: "unavailable", retryAfter: 1,
			msg: "too many password checks are running; retry shortly"}
	}
	hash := a.dummy
	if found {
		hash = u.Hash
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(pw))
	<-a.sem
	if !found || err != nil {
		return nil, a.fail(r, name, "wrong username or password")
	}
	a.mu.Lock()
	a.cache[name] = cacheEntry{storedHash: u.Hash, digest: digest, expires: time.Now().Add(authCacheTTL)}
	a.mu.Unlock()
	return &u, nil
}

// fail counts a failed login, logs it without the password, and slows a client that
// keeps failing: after a few free failures each answer waits a little longer, up to
// maxWait. A success does not reset the count (an attacker holding one valid account
// could otherwise reset it at will); it decays after failMemory without failures.
func (a *authenticator) fail(r *http.Request, name, why string) error {
	key := clientKey(r)
	now := time.Now()
	a.mu.Lock()
	f := a.fails[key]
	if f == nil || now.Sub(f.last) > failMemory {
		f = &failState{}
		a.fails[key] = f
	}
	f.n++
	f.last = now
	n := f.n
	if len(a.fails) > 10_000 { // forget old clients so the map stays bounded
		for k, v := range a.fails {
			if now.Sub(v.last) > failMemory {
				delete(a.fails, k)
			}
		}
	}
	a.mu.Unlock()
	if a.metrics != nil {
		a.metrics.AuthFailures.Inc()
	}
	a.log.Warn("authentication failed", "user", truncate(name, 64), "client", key, "reason", why, "recent_failures", n)
	if n > freeFailures && a.maxWait > 0 {
		d := time.Duration(50<<min(n-freeFailures, 6)) * time.Millisecond
		d = min(d, a.maxWait)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}
	return unauthenticated("wrong username or password")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
