// Package transport is Narad's node plane: one authenticated QUIC connection per pair
// of nodes, carrying request/response operations and raft streams. It knows nothing of
// topics or of any state machine; see DESIGN.md.
package transport

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// MinSecretLen is the shortest cluster secret accepted.
const MinSecretLen = 16

// Defaults of Options.
const (
	DefaultMaxFrameSize          = 4 << 20
	DefaultMaxConcurrentRequests = 256
	DefaultMaxRaftStreams        = 64
	DefaultMaxPendingHandshakes  = 64
	DefaultHandshakeTimeout      = 5 * time.Second
	DefaultCallTimeout           = 10 * time.Second
	DefaultMaxCallTimeout        = 60 * time.Second
	DefaultIdleTimeout           = 15 * time.Second
	DefaultMinRedialBackoff      = 50 * time.Millisecond
	DefaultMaxRedialBackoff      = 5 * time.Second
)

// Options configures a Node. Zero values take the defaults above.
type Options struct {
	// NodeID names this node; it must be unique in the cluster and 1–255 bytes.
	NodeID string
	// ListenAddr is the UDP host:port to bind; port 0 picks a free one. Listening and
	// dialing share this one socket.
	ListenAddr string
	// AdvertiseAddr is the address peers dial to reach this node, sent in the hello so
	// a peer can reuse this node's connection instead of dialing back. Default: the
	// bound address. Set it when ListenAddr's host is unspecified (0.0.0.0).
	AdvertiseAddr string
	// Secret is the cluster secret (at least MinSecretLen bytes); NextSecret, when not
	// empty, is a second one accepted and offered during a rotation (see DESIGN.md).
	Secret     []byte
	NextSecret []byte
	// Logger receives warnings (failed handshakes, rate-limited). Default slog.Default().
	Logger *slog.Logger
	// Certificate replaces the self-signed certificate generated at Start.
	Certificate *tls.Certificate

	// MaxFrameSize bounds a request or response payload, in bytes, both ways.
	MaxFrameSize uint32
	// MaxConcurrentRequests bounds the requests one connection has in its handlers at
	// once; past it requests are refused with ErrBusy.
	MaxConcurrentRequests int
	// MaxRaftStreams bounds the raft streams a peer may open on one connection.
	MaxRaftStreams int
	// MaxPendingHandshakes bounds connections that have not finished the secret
	// handshake; past it new connections are closed at once. One host (IP address)
	// may hold a quarter of them (at least one).
	MaxPendingHandshakes int
	// HandshakeTimeout bounds the TLS plus secret handshake, and the wait for a
	// request's header after its stream opened.
	HandshakeTimeout time.Duration
	// CallTimeout is the deadline of a Call whose context has none; MaxCallTimeout
	// caps every Call's deadline.
	CallTimeout    time.Duration
	MaxCallTimeout time.Duration
	// IdleTimeout closes a connection that heard nothing for this long: how long a
	// silently dead peer keeps its connection. Keep-alives go out every third of it.
	IdleTimeout time.Duration
	// MinRedialBackoff is the wait after the first failed dial to an address; it
	// doubles (with jitter) per failure up to MaxRedialBackoff. Callers whose deadline
	// ends before the wait fail at once with ErrPeerUnavailable.
	MinRedialBackoff time.Duration
	MaxRedialBackoff time.Duration

	// wrapPacketConn lets tests put a packet-dropping socket under the transport.
	wrapPacketConn func(net.PacketConn) net.PacketConn
}

// Handler serves one operation. ctx carries the caller's deadline and is cancelled
// when the connection closes or the caller stops waiting (cancels, or its deadline
// passes, which our clock may see a little later); a handler must return when it is
// done. A nil error
// answers resp; an error answers a *RemoteError on the caller's side (use
// *RemoteError with a code ≥ CodeFirstApp to pick the code).
type Handler func(ctx context.Context, peerNodeID string, req []byte) ([]byte, error)

// Node is one node's end of the node plane.
type Node struct {
	opts    Options
	log     *slog.Logger
	authLog *logLimiter
	msgLog  *logLimiter // refused messages of message streams
	secrets atomic.Pointer[[][]byte]
	stats   counters

	hmu         sync.RWMutex
	handlers    map[uint16]Handler
	msgHandlers map[uint16]MessageHandler

	tlsServer *tls.Config
	tlsClient *tls.Config
	qconf     *quic.Config

	udp  net.PacketConn
	tr   *quic.Transport
	ln   *quic.Listener
	addr net.Addr

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	handshakes chan struct{}
	pendingMu  sync.Mutex
	pending    map[string]int // handshakes in progress, by the host they came from
	raft       *StreamLayer

	mu      sync.Mutex
	started bool
	closed  bool
	conns   map[string]*peerConn // by the peer's address
	live    map[*peerConn]struct{}
	dials   map[string]*dialState
}

// New checks opts and prepares a node; Start binds the socket.
func New(opts Options) (*Node, error) {
	if opts.NodeID == "" || len(opts.NodeID) > maxIDLen {
		return nil, fmt.Errorf("transport: node id must be 1–%d bytes, got %d", maxIDLen, len(opts.NodeID))
	}
	if len(opts.AdvertiseAddr) > maxIDLen {
		return nil, fmt.Errorf("transport: advertise address longer than %d bytes", maxIDLen)
	}
	if opts.ListenAddr == "" {
		return nil, errors.New("transport: ListenAddr is required (UDP host:port)")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	setDefault(&opts.MaxFrameSize, DefaultMaxFrameSize)
	setDefault(&opts.MaxConcurrentRequests, DefaultMaxConcurrentRequests)
	setDefault(&opts.MaxRaftStreams, DefaultMaxRaftStreams)
	setDefault(&opts.MaxPendingHandshakes, DefaultMaxPendingHandshakes)
	setDefault(&opts.HandshakeTimeout, DefaultHandshakeTimeout)
	setDefault(&opts.CallTimeout, DefaultCallTimeout)
	setDefault(&opts.MaxCallTimeout, DefaultMaxCallTimeout)
	setDefault(&opts.IdleTimeout, DefaultIdleTimeout)
	setDefault(&opts.MinRedialBackoff, DefaultMinRedialBackoff)
	setDefault(&opts.MaxRedialBackoff, DefaultMaxRedialBackoff)
	opts.MaxRedialBackoff = max(opts.MaxRedialBackoff, opts.MinRedialBackoff)

	n := &Node{
		opts:        opts,
		log:         opts.Logger.With("component", "transport", "node", opts.NodeID),
		handlers:    map[uint16]Handler{},
		msgHandlers: map[uint16]MessageHandler{},
		handshakes:  make(chan struct{}, opts.MaxPendingHandshakes),
		pending:     map[string]int{},
		conns:       map[string]*peerConn{},
		live:        map[*peerConn]struct{}{},
		dials:       map[string]*dialState{},
	}
	n.authLog = newLogLimiter(n.log, time.Second, 10)
	n.msgLog = newLogLimiter(n.log, time.Second, 10)
	if err := n.SetSecrets(opts.Secret, opts.NextSecret); err != nil {
		return nil, err
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.raft = newStreamLayer(n)
	// Streams a peer may hold open at once: every request slot, every raft stream, and
	// room for the requests that get refused with ErrBusy rather than left waiting.
	maxStreams := int64(opts.MaxConcurrentRequests + opts.MaxRaftStreams + 16)
	n.qconf = &quic.Config{
		HandshakeIdleTimeout:  opts.HandshakeTimeout,
		MaxIdleTimeout:        opts.IdleTimeout,
		KeepAlivePeriod:       opts.IdleTimeout / 3,
		MaxIncomingStreams:    maxStreams,
		MaxIncomingUniStreams: -1,
		Allow0RTT:             false,
		EnableDatagrams:       false,
	}
	return n, nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// SetSecrets replaces the cluster secrets for connections made from now on; existing
// connections stay up. next may be empty. See DESIGN.md for the rotation procedure.
func (n *Node) SetSecrets(current, next []byte) error {
	if len(current) < MinSecretLen {
		return fmt.Errorf("%w: the secret has %d bytes, at least %d are required", ErrSecretTooShort, len(current), MinSecretLen)
	}
	if len(next) > 0 && len(next) < MinSecretLen {
		return fmt.Errorf("%w: the next secret has %d bytes, at least %d are required", ErrSecretTooShort, len(next), MinSecretLen)
	}
	s := [][]byte{append([]byte(nil), current...)}
	if len(next) > 0 {
		s = append(s, append([]byte(nil), next...))
	}
	n.secrets.Store(&s)
	return nil
}

func (n *Node) currentSecrets() [][]byte { return *n.secrets.Load() }

// Handle registers h for op, replacing any earlier handler. It may be called before or
// after Start.
func (n *Node) Handle(op uint16, h Handler) {
	n.hmu.Lock()
	defer n.hmu.Unlock()
	n.handlers[op] = h
}

func (n *Node) handler(op uint16) Handler {
	n.hmu.RLock()
	defer n.hmu.RUnlock()
	return n.handlers[op]
}

// Start binds the UDP socket and starts accepting connections.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	if n.started {
		return errors.New("transport: already started")
	}
	var cert tls.Certificate
	if n.opts.Certificate != nil {
		cert = *n.opts.Certificate
	} else {
		c, err := generateCertificate(time.Now().AddDate(10, 0, 0))
		if err != nil {
			return fmt.Errorf("transport: generating certificate: %w", err)
		}
		cert = c
	}
	n.tlsServer = serverTLSConfig(cert)
	n.tlsClient = clientTLSConfig()

	udpAddr, err := net.ResolveUDPAddr("udp", n.opts.ListenAddr)
	if err != nil {
		return fmt.Errorf("transport: listen address %q: %w", n.opts.ListenAddr, err)
	}
	uc, err := net.ListenUDP("udp", udpAddr)
	if err != nil {
		return fmt.Errorf("transport: binding %s: %w", n.opts.ListenAddr, err)
	}
	// A chaosnet build may put a fault-injecting socket under the transport (see
	// chaosnet.go); every other build gets uc back.
	pconn := chaosWrap(uc)
	if n.opts.wrapPacketConn != nil {
		pconn = n.opts.wrapPacketConn(pconn)
	}
	n.udp = pconn // closing it closes uc (and stops a chaosnet socket's polling)
	n.tr = &quic.Transport{Conn: pconn, StatelessResetKey: n.statelessResetKey()}
	ln, err := n.tr.Listen(n.tlsServer, n.qconf)
	if err != nil {
		_ = n.tr.Close()  // the listen error is the one to report
		_ = pconn.Close() // closes uc too
		return fmt.Errorf("transport: listening: %w", err)
	}
	n.ln = ln
	n.addr = uc.LocalAddr()
	if n.opts.AdvertiseAddr == "" {
		n.opts.AdvertiseAddr = n.addr.String()
	}
	n.started = true
	n.wg.Add(1)
	go n.acceptLoop()
	return nil
}

// statelessResetKey derives the key of the stateless resets this node sends for
// packets of connections it does not know: those of a process that ran before it at
// this address and crashed without a word. A peer closes such a connection at once
// instead of calling into it until its idle timeout; without this, the connection a
// peer of smaller id had dialed kept winning over the one this node opens
// (TestCrashedPeerRestartedAtItsAddressIsReachedAgain). The key must be the same after
// a restart, and only members may be able to make the tokens (a reset closes the
// connection), so it is derived from the current cluster secret and the node id. After
// the current secret changed, a restart's resets are not believed, and the old
// connection lasts until the idle timeout, as before.
func (n *Node) statelessResetKey() *quic.StatelessResetKey {
	m := hmac.New(sha256.New, n.currentSecrets()[0])
	m.Write([]byte("narad-node-plane/1 stateless reset"))
	m.Write([]byte{byte(len(n.opts.NodeID))})
	m.Write([]byte(n.opts.NodeID))
	var k quic.StatelessResetKey
	copy(k[:], m.Sum(nil))
	return &k
}

// Addr returns the address peers should dial (AdvertiseAddr, or the bound address).
// It is empty before Start.
func (n *Node) Addr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.started {
		return ""
	}
	return n.opts.AdvertiseAddr
}

// NodeID returns this node's id.
func (n *Node) NodeID() string { return n.opts.NodeID }

// StreamLayer returns the raft.StreamLayer that carries the control plane's raft
// traffic over this node's connections.
func (n *Node) StreamLayer() *StreamLayer { return n.raft }

// Stats returns a snapshot of the counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	conns := len(n.live)
	n.mu.Unlock()
	c := &n.stats
	return Stats{
		Conns:             conns,
		RaftStreams:       int(c.raftStreams.Load()),
		MessageStreams:    int(c.msgStreams.Load()),
		MessagesServed:    c.messagesServed.Load(),
		Dials:             c.dials.Load(),
		DialFailures:      c.dialFailures.Load(),
		AuthFailures:      c.authFailures.Load(),
		HandshakeErrors:   c.handshakeErrors.Load(),
		HandshakesRefused: c.handshakesRefused.Load(),
		RequestsServed:    c.requestsServed.Load(),
		RequestsRefused:   c.requestsRefused.Load(),
	}
}

// Close closes every connection (peers see ErrPeerUnavailable), the raft stream layer
// and the socket. Handlers still running see their context cancelled.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	started := n.started
	live := make([]*peerConn, 0, len(n.live))
	for pc := range n.live {
		live = append(live, pc)
	}
	n.mu.Unlock()

	n.cancel()
	_ = n.raft.Close() // always nil; raft streams end with their connections below
	for _, pc := range live {
		_ = pc.qc.CloseWithError(connCodeShutdown, "node shutting down")
	}
	if !started {
		return nil
	}
	err := n.ln.Close()
	if e := n.tr.Close(); err == nil {
		err = e
	}
	if e := n.udp.Close(); err == nil && !errors.Is(e, net.ErrClosed) {
		err = e
	}
	n.wg.Wait()
	return err
}
