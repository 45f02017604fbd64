// Package cluster joins the control plane (meta) to the node plane (transport): Raft's
// traffic over the transport's stream layer, meta's Forwarder over a transport
// operation, and the node plane's metrics. cmd/narad builds one Plane per node.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// OpMeta is the node-plane operation that carries control-plane requests (meta's
// forwarded writes, read indexes, joins, heartbeats and identity questions).
const OpMeta uint16 = 1

// OpData is the node-plane operation that carries partition operations to the node
// holding the partition (the broker's forwarded produce, lease, settle, read, watch).
const OpData uint16 = 2

// MaxFrameSize bounds one node-plane request or answer. A forwarded produce-batch or
// consume-batch carries up to 8 MiB of keys and payloads (the HTTP API's limits),
// base64 in JSON: 24 MiB holds that with room. What a node holds in flight is bounded
// by the HTTP layer of the nodes that forward (--max-inflight-bytes), not by this.
const MaxFrameSize = 24 << 20

// codeNotServing answers OpMeta while this node's control plane is not open yet (or
// closed): the handler never ran, so the caller may send again.
const codeNotServing = transport.CodeFirstApp

// codeNotMember answers OpData from a node this node does not count among the members
// (decommissioned and removed, or never admitted): the handler never ran.
const codeNotMember = transport.CodeFirstApp + 1

// Options configures a Plane.
type Options struct {
	// NodeID names this node on the node plane (the same id as the control plane's).
	NodeID string
	// ListenAddr is the UDP host:port to bind; AdvertiseAddr what peers dial (default
	// the bound address).
	ListenAddr    string
	AdvertiseAddr string
	// Secret and NextSecret are the cluster secrets (see transport's DESIGN.md).
	Secret, NextSecret []byte
	Logger             *slog.Logger
	// RaftTimeout is the I/O deadline of Raft's connections (default 10 s).
	RaftTimeout time.Duration
}

// Plane is a node's node plane, started, with Raft's transport on it.
type Plane struct {
	node    *transport.Node
	raft    *raft.NetworkTransport
	handler atomic.Pointer[func(context.Context, []byte) ([]byte, error)]
	data    atomic.Pointer[dataServer]
	metrics *planeMetrics
}

// Start binds the node plane and starts serving. OpMeta answers "not serving" until
// Serve is called.
func Start(opts Options) (*Plane, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RaftTimeout <= 0 {
		opts.RaftTimeout = 10 * time.Second
	}
	n, err := transport.New(transport.Options{
		NodeID: opts.NodeID, ListenAddr: opts.ListenAddr, AdvertiseAddr: opts.AdvertiseAddr,
		Secret: opts.Secret, NextSecret: opts.NextSecret, Logger: opts.Logger,
		MaxFrameSize: MaxFrameSize,
	})
	if err != nil {
		return nil, err
	}
	p := &Plane{node: n, metrics: newPlaneMetrics()}
	n.Handle(OpMeta, p.serveMeta)
	n.Handle(OpData, p.serveData)
	if err := n.Start(); err != nil {
		return nil, err
	}
	p.raft = newRaftTransport(n.StreamLayer(), opts.RaftTimeout, raftLogger(opts.Logger))
	return p, nil
}

// newRaftTransport is the control plane's Raft transport over the node's streams.
//
// Pipelined replication is off (MaxRPCsInFlight 1: each AppendEntries waits for its
// answer). With it on, hashicorp/raft's leader can deadlock its replication to one
// follower when that follower answers an append with Success=false (a node that
// restarted behind the leader's guess of its log): the decoder of the pipeline stops
// reading while the sender is parked handing it the next request, and since the
// replication goroutine never returns, heartbeats to the follower go on. The follower
// then never times out and never gets another entry until the leadership changes: its
// metadata stops applying (hashicorp/raft issue 612; it stalled moves for minutes after
// a node was killed and restarted). The metadata log carries few, small writes, and
// hashicorp measured pipelining to gain next to nothing on a LAN.
func newRaftTransport(stream raft.StreamLayer, timeout time.Duration, logger hclog.Logger) *raft.NetworkTransport {
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream,
		// Three pooled connections per peer, as raft's own users take; each is one
		// QUIC stream on the pair's one connection.
		MaxPool:         3,
		MaxRPCsInFlight: 1,
		Timeout:         timeout,
		Logger:          logger,
	})
}

func (p *Plane) serveMeta(ctx context.Context, _ string, req []byte) ([]byte, error) {
	h := p.handler.Load()
	if h == nil {
		return nil, &transport.RemoteError{Code: codeNotServing, Message: "the control plane of this node is not open yet"}
	}
	return (*h)(ctx, req)
}

// dataServer is who serves OpData: the handler, and the check of the sending node.
type dataServer struct {
	serve  func(context.Context, []byte) ([]byte, error)
	member func(ctx context.Context, node string) error
}

func (p *Plane) serveData(ctx context.Context, peer string, req []byte) ([]byte, error) {
	d := p.data.Load()
	if d == nil {
		return nil, &transport.RemoteError{Code: codeNotServing, Message: "the data plane of this node is not open yet"}
	}
	if d.member == nil {
		return nil, &transport.RemoteError{Code: codeNotMember, Message: "this node serves no partition operations: it has no way to tell members"}
	}
	if err := d.member(ctx, peer); err != nil {
		return nil, &transport.RemoteError{Code: codeNotMember, Message: err.Error()}
	}
	return d.serve(ctx, req)
}

// ServeData routes OpData to h (the broker's HandleData) for the nodes member accepts
// (the broker's CheckPeer). The handshake proves only that a peer holds the cluster
// secret; a node removed from the cluster still does, and must be served nothing.
// member gets the node id the peer gave in its handshake; a refusal (or a nil member)
// reaches the peer as an error that wraps meta.ErrNotDelivered, since h never ran.
func (p *Plane) ServeData(h func(context.Context, []byte) ([]byte, error), member func(ctx context.Context, node string) error) {
	p.data.Store(&dataServer{serve: h, member: member})
}

// Call sends a partition operation to the node at addr (OpData): the broker's Peers.
// An error wraps meta.ErrNotDelivered when the request certainly did not run there.
func (p *Plane) Call(ctx context.Context, addr string, req []byte) ([]byte, error) {
	if len(req) > MaxFrameSize {
		return nil, fmt.Errorf("%w: %w: a request of %d bytes (at most %d are sent)", meta.ErrNotDelivered, transport.ErrFrameTooLarge, len(req), MaxFrameSize)
	}
	out, err := p.node.Call(ctx, addr, OpData, req)
	if err == nil {
		return out, nil
	}
	if errors.Is(err, transport.ErrUnknownOp) {
		// Refused unread: a node of an older version, without cluster routing.
		return nil, fmt.Errorf("%w: the node at %s runs an older version without the data operation; upgrade it: %w", meta.ErrNotDelivered, addr, err)
	}
	var re *transport.RemoteError
	if errors.As(err, &re) && re.Code == codeNotMember {
		return nil, fmt.Errorf("%w: the node at %s does not count this node as a member of its cluster: %w", meta.ErrNotDelivered, addr, err)
	}
	if errors.Is(err, transport.ErrNotSent) || errors.Is(err, transport.ErrBusy) ||
		(errors.As(err, &re) && re.Code == codeNotServing) {
		return nil, fmt.Errorf("%w: %w", meta.ErrNotDelivered, err)
	}
	return nil, err
}

// Serve routes OpMeta to h (meta's Store.HandleForward, through the broker).
func (p *Plane) Serve(h func(context.Context, []byte) ([]byte, error)) { p.handler.Store(&h) }

// Forward implements meta.Forwarder over the node plane. An error wraps
// meta.ErrNotDelivered when the request certainly was not handled by the other node:
// it never left (transport.ErrNotSent), or the other node refused it before any
// handler ran (busy, or its control plane not open yet).
func (p *Plane) Forward(ctx context.Context, addr raft.ServerAddress, req []byte) ([]byte, error) {
	start := time.Now()
	out, err := p.node.Call(ctx, string(addr), OpMeta, req)
	p.metrics.observe(time.Since(start), err)
	if err == nil {
		return out, nil
	}
	var re *transport.RemoteError
	if errors.Is(err, transport.ErrNotSent) || errors.Is(err, transport.ErrBusy) ||
		(errors.As(err, &re) && re.Code == codeNotServing) {
		return nil, fmt.Errorf("%w: %w", meta.ErrNotDelivered, err)
	}
	return nil, err
}

var _ meta.Forwarder = (*Plane)(nil)

// RaftTransport is Raft's transport over the node plane, for meta.Cluster.Transport.
func (p *Plane) RaftTransport() raft.Transport { return p.raft }

// Node returns the node plane itself, for the operations of other packages (partition
// replication registers its own).
func (p *Plane) Node() *transport.Node { return p.node }

// Addr is this node's cluster address as peers dial it.
func (p *Plane) Addr() string { return p.node.Addr() }

// SetSecrets replaces the cluster secrets for new connections (SIGHUP).
func (p *Plane) SetSecrets(current, next []byte) error { return p.node.SetSecrets(current, next) }

// Stats returns the node plane's counters.
func (p *Plane) Stats() transport.Stats { return p.node.Stats() }

// Close stops Raft's transport and the node plane. Call it after the control plane
// has shut down.
func (p *Plane) Close() error {
	err := p.raft.Close()
	if cerr := p.node.Close(); err == nil {
		err = cerr
	}
	return err
}

// raftLogger sends the network transport's errors to the process logger. Below error
// level it is quiet: a peer that is down would make a line per heartbeat.
func raftLogger(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "raft-net", Level: hclog.Error, Output: slogWriter{log}})
}

// slogWriter adapts hclog's lines to the process logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn("raft-net", "line", strings.TrimRight(string(p), "\r\n"))
	return len(p), nil
}

var _ io.Writer = slogWriter{}
