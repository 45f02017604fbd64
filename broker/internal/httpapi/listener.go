package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ListenerOptions bounds the connections a Listener hands to the HTTP server.
type ListenerOptions struct {
	// MaxConns is the most connections open at once (0: no limit). Past it a new
	// connection is closed at once, unserved: each open connection costs a file
	// descriptor and, for HTTP/2, tens of kilobytes of buffers.
	MaxConns int
	// MaxConnsPerAddr is the most connections open at once from one client IP address
	// (0: no limit), so one client cannot take every slot of MaxConns.
	MaxConnsPerAddr int
	// FirstRequestTimeout is how long a new connection may take to deliver the headers
	// of its first request, TLS handshake included (0: no bound). net/http bounds an
	// HTTP/1 request's headers itself (ReadHeaderTimeout), but an HTTP/2 connection
	// that sends only its preface opens no stream, and net/http then holds it for the
	// whole idle timeout; this closes it.
	FirstRequestTimeout time.Duration
	// Logger receives a line when connections are refused (at most one a minute per
	// reason); nil means slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives narad_http_connections and
	// narad_http_connections_refused_total.
	Registerer prometheus.Registerer
}

// Reasons a Listener closes a connection unserved (the reason label of
// narad_http_connections_refused_total).
const (
	refusedMaxConns  = "max_connections"
	refusedPerAddr   = "max_connections_per_address"
	refusedNoRequest = "no_request"
)

// Listener wraps the HTTP port's listener: it counts connections (in total and per
// client address), closes those past the limits as they arrive, and closes those that
// have not started a request within FirstRequestTimeout. Serve with it and set the
// server's ConnContext to Listener.ConnContext and its handler to
// Listener.Handler(api), which tell the listener when a connection's first request
// arrives. Its connections also turn the few plain-text answers net/http writes on its
// own into the API's JSON error body (see serverErrorJSON).
type Listener struct {
	net.Listener
	opts    ListenerOptions
	open    prometheus.Gauge
	refused *prometheus.CounterVec

	mu         sync.Mutex
	total      int
	perAddr    map[string]int
	lastLogged map[string]time.Time
}

// NewListener wraps ln.
func NewListener(ln net.Listener, opts ListenerOptions) (*Listener, error) {
	if opts.MaxConns < 0 || opts.MaxConnsPerAddr < 0 {
		return nil, errors.New("httpapi: connection limits must be 0 (none) or more")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &Listener{
		Listener: ln, opts: opts,
		perAddr:    make(map[string]int),
		lastLogged: make(map[string]time.Time),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "narad_http_connections", Help: "Connections open on the HTTP port.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_http_connections_refused_total",
			Help: "Connections the HTTP port closed unserved: past --max-connections or --max-connections-per-address, or without a request within --read-header-timeout (no_request).",
		}, []string{"reason"}),
	}
	for _, r := range []string{refusedMaxConns, refusedPerAddr, refusedNoRequest} {
		l.refused.WithLabelValues(r) // present at 0, so alerts see the series from the start
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(l.open); err != nil {
			return nil, err
		}
		if err := opts.Registerer.Register(l.refused); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Accept returns the next connection within the limits; connections past them are
// closed here and never reach the server.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteIP(c)
		if reason := l.admit(addr); reason != "" {
			_ = c.Close() // refused before any byte is read; the refusal is counted below
			l.refuse(reason, addr)
			continue
		}
		tc := &trackedConn{Conn: c, l: l, addr: addr}
		if d := l.opts.FirstRequestTimeout; d > 0 {
			tc.timer = time.AfterFunc(d, tc.noRequest)
		}
		return tc, nil
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// admit counts a new connection from addr, or returns why it is refused.
func (l *Listener) admit(addr string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.opts.MaxConns > 0 && l.total >= l.opts.MaxConns:
		return refusedMaxConns
	case l.opts.MaxConnsPerAddr > 0 && l.perAddr[addr] >= l.opts.MaxConnsPerAddr:
		return refusedPerAddr
	}
	l.total++
	l.perAddr[addr]++
	l.open.Inc()
	return ""
}

func (l *Listener) release(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.perAddr[addr]--; l.perAddr[addr] <= 0 {
		delete(l.perAddr, addr)
	}
	l.open.Dec()
}

func (l *Listener) refuse(reason, addr string) {
	l.refused.WithLabelValues(reason).Inc()
	l.mu.Lock()
	quiet := time.Since(l.lastLogged[reason]) < time.Minute
	if !quiet {
		l.lastLogged[reason] = time.Now()
	}
	l.mu.Unlock()
	if quiet {
		return
	}
	switch reason {
	case refusedMaxConns:
		l.opts.Logger.Warn("refusing connections: the HTTP port holds --max-connections (logged once a minute; see narad_http_connections_refused_total)", "limit", l.opts.MaxConns, "client", addr)
	case refusedPerAddr:
		l.opts.Logger.Warn("refusing connections from a client past --max-connections-per-address (logged once a minute; see narad_http_connections_refused_total)", "limit", l.opts.MaxConnsPerAddr, "client", addr)
	case refusedNoRequest:
		l.opts.Logger.Info("closed a connection that sent no request within --read-header-timeout (logged once a minute; see narad_http_connections_refused_total)", "client", addr)
	}
}

type connKey struct{}

// ConnContext is the http.Server's ConnContext: it lets Handler find the connection a
// request arrived on, for HTTP/1 and HTTP/2 alike.
func (l *Listener) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// Handler marks a connection as served when a request arrives on it, then calls next.
func (l *Listener) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tc, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
			tc.served.Store(true)
		}
		next.ServeHTTP(w, r)
	})
}

// trackedConn is a connection the Listener counts until it is closed.
type trackedConn struct {
	net.Conn
	l      *Listener
	addr   string
	timer  *time.Timer
	served atomic.Bool
	once   sync.Once
}

// noRequest closes the connection if no request has arrived on it by now.
func (c *trackedConn) noRequest() {
	if c.served.Load() {
		return
	}
	c.l.refuse(refusedNoRequest, c.addr)
	_ = c.Close() // the connection sent no request; the refusal is counted above
}

// Write passes the server's bytes on, except the plain-text answers net/http writes on
// its own (see serverErrorJSON), which go out as the API's JSON error body.
func (c *trackedConn) Write(p []byte) (int, error) {
	if out, ok := serverErrorJSON(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		if c.timer != nil {
			c.timer.Stop()
		}
		c.l.release(c.addr)
	})
	return c.Conn.Close()
}
