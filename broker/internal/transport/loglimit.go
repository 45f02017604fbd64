package transport

import (
	"log/slog"
	"sync"
	"time"
)

// logLimiter lets a burst of warnings through and then at most one per interval, so a
// flood of bad handshakes cannot flood the log. Lines it drops are counted and the
// count is attached to the next line it lets through.
type logLimiter struct {
	log      *slog.Logger
	interval time.Duration
	burst    int

	mu         sync.Mutex
	tokens     int
	last       time.Time
	suppressed int
}

func newLogLimiter(log *slog.Logger, interval time.Duration, burst int) *logLimiter {
	return &logLimiter{log: log, interval: interval, burst: burst, tokens: burst}
}

func (l *logLimiter) Warn(msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if l.last.IsZero() {
		l.last = now
	}
	if refill := int(now.Sub(l.last) / l.interval); refill > 0 {
		l.tokens = min(l.burst, l.tokens+refill)
		l.last = l.last.Add(time.Duration(refill) * l.interval)
	}
	if l.tokens == 0 {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.tokens--
	dropped := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	if dropped > 0 {
		args = append(args, "suppressed", dropped)
	}
	l.log.Warn(msg, args...)
}
