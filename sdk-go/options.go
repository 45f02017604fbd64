package narad

import (
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"
)

// Defaults shared by every Narad SDK (see docs/sdk/contract.md).
const (
	DefaultWait           = 10 * time.Second
	DefaultConcurrency    = 1
	DefaultMaxLease       = time.Hour
	DefaultShutdownGrace  = 30 * time.Second
	DefaultAttempts       = 4
	DefaultMinBackoff     = 50 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
	DefaultLinger         = 5 * time.Millisecond
	DefaultRequestTimeout = 30 * time.Second
	DefaultPoolSize       = 64

	// answerGrace is how long an answer whose headers arrived is still read after the
	// caller's context ended.
	answerGrace = 5 * time.Second
	// pollAnswerWait is how long a long poll already sent when its caller's context
	// ended is left open for its answer to begin (the TypeScript SDK's
	// POLL_ANSWER_WAIT_MS): the broker may have leased messages to it and be sending
	// them, and cutting the poll would drop them with their leases.
	pollAnswerWait = time.Second
	// maxWait is the broker's cap on a long poll.
	maxWait = 20 * time.Second
)

// Option configures a Client. Pass options to New.
type Option func(*config)

type config struct {
	user, password string
	auth           bool
	logger         *slog.Logger
	retry          RetryPolicy
	httpClient     *http.Client
	observer       Observer
	poolSize       int
	timeout        time.Duration
	breakerFails   int
	breakerCool    time.Duration
	userAgent      string
}

// RetryPolicy says how often and how patiently a call is retried. Attempts counts the
// first try (1 means no retry). Backoff makes a fresh Backoff per call; its NextBackOff
// gives the wait before each retry. A Retry-After from an endpoint keeps the call from
// that endpoint until the time it named (at most 300 s): the call goes to another one
// meanwhile, or waits when there is none; a wait that would end past the call's budget
// (Attempts × the per-attempt bound + the backoff's longest wait) or the caller's
// deadline fails the call at once with the retryable error. A nil Backoff means full
// jitter between 50 ms and 5 s.
type RetryPolicy struct {
	Attempts int
	Backoff  func() Backoff
}

// Backoff gives the waits between the attempts of one call. NextBackOff returns the next
// wait, or StopBackoff to give up before the policy's Attempts are used up; Reset starts
// over. It is the SDK's own small interface, so the SDK's API does not tie callers to a
// backoff library; the method set matches the common ones (github.com/cenkalti/backoff's
// BackOff values satisfy it as they are).
type Backoff interface {
	NextBackOff() time.Duration
	Reset()
}

// StopBackoff, returned by a Backoff's NextBackOff, ends the retries of a call.
const StopBackoff time.Duration = -1

// DefaultRetry is the policy of a Client made without WithRetry: 4 attempts, full-jitter
// backoff from 50 ms to 5 s.
func DefaultRetry() RetryPolicy {
	return RetryPolicy{Attempts: DefaultAttempts, Backoff: func() Backoff {
		return NewFullJitter(DefaultMinBackoff, DefaultMaxBackoff)
	}}
}

// WithBasicAuth sends HTTP Basic credentials on every request.
func WithBasicAuth(user, password string) Option {
	return func(c *config) { c.user, c.password, c.auth = user, password, true }
}

// WithLogger sends the client's log lines (retries, breaker changes, consumer errors) to
// l. Without it the client is quiet.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithRetry replaces the retry policy of every call. Attempts below 1 mean 1.
func WithRetry(p RetryPolicy) Option {
	return func(c *config) { c.retry = p }
}

// WithHTTPClient uses hc for every request instead of a client whose connection pool is
// sized by WithPoolSize. Its Timeout should be zero: the SDK sets each call's deadline
// itself, and a client-wide timeout would cut long polls. A Consumer's polls go through
// a clone of hc's transport (HTTP/1.1 only) when it is an *http.Transport, so that its
// shutdown can half-close the poll's connection and read its answer; through any other
// RoundTripper they use hc itself, and a shutdown cancels a poll whose answer has not
// begun to arrive.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) { c.httpClient = hc }
}

// WithObserver calls o for every request, retry, breaker change, delivery and
// settlement; metrics and tracing adapters plug in here. o must be quick and safe for
// concurrent use.
func WithObserver(o Observer) Option {
	return func(c *config) { c.observer = o }
}

// WithPoolSize keeps up to n idle connections per endpoint (default 64). Size it for the
// sum of the concurrency of the consumers and publishers sharing the client plus a few
// for renewals and acks, so busy workers do not open and close connections. It has no
// effect with WithHTTPClient.
func WithPoolSize(n int) Option {
	return func(c *config) { c.poolSize = n }
}

// WithRequestTimeout bounds each attempt of a call (default 30 s); an attempt of a long
// poll gets its wait plus this. An attempt that times out counts against its endpoint's
// breaker and the call moves on to the next endpoint. See docs/sdk/contract.md.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// WithBreaker opens an endpoint's circuit breaker after failures consecutive failures
// (connection errors, 503 unavailable); the endpoint then stays out of the rotation
// until a probe of its /readyz succeeds, first after cooldown and then at growing
// intervals (default 2 failures, 2 s).
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(c *config) { c.breakerFails, c.breakerCool = failures, cooldown }
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(c *config) { c.userAgent = ua }
}

// FullJitter is a Backoff whose waits are drawn uniformly from zero to an
// exponentially growing cap ("full jitter"), which spreads retries of many clients.
type FullJitter struct {
	Min, Max time.Duration
	n        int
}

// NewFullJitter returns a full-jitter backoff whose cap starts at min and doubles up to max.
func NewFullJitter(min, max time.Duration) *FullJitter {
	return &FullJitter{Min: min, Max: max}
}

// NextBackOff returns the next wait; it never stops by itself (the policy's Attempts does).
func (f *FullJitter) NextBackOff() time.Duration {
	ceil := f.Min
	for i := 0; i < f.n && ceil < f.Max; i++ {
		ceil *= 2
	}
	if ceil > f.Max {
		ceil = f.Max
	}
	f.n++
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// Reset starts the growth over.
func (f *FullJitter) Reset() { f.n = 0 }

var _ Backoff = (*FullJitter)(nil)
