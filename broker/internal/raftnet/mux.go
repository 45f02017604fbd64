// Package raftnet carries many raft groups over one node's node plane: a
// raft.Transport per group, all sharing the node's one authenticated QUIC connection
// per peer, with every group's empty AppendEntries to a peer (heartbeats and commit
// notices) coalesced into one frame per tick. See DESIGN.md.
package raftnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/transport"
)

// Operations this package serves on the node plane.
const (
	// OpGroupRPC carries one raft RPC of one group: u8 rpc type, u8 group length,
	// group, msgpack request; the answer is the msgpack response.
	OpGroupRPC uint16 = 0x0201
	// OpGroupBatch carries the empty AppendEntries of many groups (see codec.go).
	OpGroupBatch uint16 = 0x0202
)

// Defaults of Options.
const (
	DefaultTick       = 100 * time.Millisecond
	DefaultRPCTimeout = 5 * time.Second
)

// Options configures a Mux.
type Options struct {
	// Node is the started (or about to start) node plane this mux registers its
	// operations on.
	Node *transport.Node
	// Tick is how long an empty AppendEntries may wait to share a frame with those of
	// other groups to the same peer. Keep it well below HeartbeatTimeout/10.
	Tick time.Duration
	// RPCTimeout bounds every RPC, batched or not.
	RPCTimeout time.Duration
	// Logger gets warnings. Default slog.Default().
	Logger *slog.Logger
}

// Stats counts what went over the node plane, for tests and the spike's reports.
type Stats struct {
	RPCCalls   uint64 // single-RPC calls sent (entries, votes, timeouts)
	BatchCalls uint64 // coalesced frames sent
	BatchItems uint64 // empty AppendEntries carried by those frames
}

// Mux is one node's end: it owns the per-group transports and the per-peer batches.
type Mux struct {
	node *transport.Node
	opts Options
	log  *slog.Logger

	gmu    sync.RWMutex
	groups map[string]*Transport

	pmu     sync.Mutex
	pending map[raft.ServerAddress][]*batchItem
	closed  bool

	rpcCalls, batchCalls, batchItems atomic.Uint64

	quit chan struct{}
	wg   sync.WaitGroup
}

// New registers the mux's operations on opts.Node and starts its ticker. Close stops
// it; the node stays the caller's.
func New(opts Options) (*Mux, error) {
	if opts.Node == nil {
		return nil, errors.New("raftnet: Options.Node is required")
	}
	if opts.Tick <= 0 {
		opts.Tick = DefaultTick
	}
	if opts.RPCTimeout <= 0 {
		opts.RPCTimeout = DefaultRPCTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Mux{
		node:    opts.Node,
		opts:    opts,
		log:     opts.Logger.With("component", "raftnet"),
		groups:  map[string]*Transport{},
		pending: map[raft.ServerAddress][]*batchItem{},
		quit:    make(chan struct{}),
	}
	m.node.Handle(OpGroupRPC, m.serveRPC)
	m.node.Handle(OpGroupBatch, m.serveBatch)
	m.wg.Add(1)
	go m.tick()
	return m, nil
}

// Stats returns the counters so far.
func (m *Mux) Stats() Stats {
	return Stats{RPCCalls: m.rpcCalls.Load(), BatchCalls: m.batchCalls.Load(), BatchItems: m.batchItems.Load()}
}

// Transport returns a new raft.Transport for group, which must be 1–255 bytes and not
// already open on this mux.
func (m *Mux) Transport(group string) (*Transport, error) {
	if group == "" || len(group) > 255 {
		return nil, fmt.Errorf("raftnet: group id must be 1–255 bytes, got %d", len(group))
	}
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if _, ok := m.groups[group]; ok {
		return nil, fmt.Errorf("raftnet: group %q already has a transport", group)
	}
	t := &Transport{mux: m, group: group, consumer: make(chan raft.RPC), quit: make(chan struct{})}
	m.groups[group] = t
	return t, nil
}

func (m *Mux) remove(t *Transport) {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if m.groups[t.group] == t {
		delete(m.groups, t.group)
	}
}

func (m *Mux) group(id string) *Transport {
	m.gmu.RLock()
	defer m.gmu.RUnlock()
	return m.groups[id]
}

// Close stops the ticker and fails what is still waiting for a batch.
func (m *Mux) Close() {
	m.pmu.Lock()
	if m.closed {
		m.pmu.Unlock()
		return
	}
	m.closed = true
	pending := m.pending
	m.pending = nil
	m.pmu.Unlock()
	close(m.quit)
	m.wg.Wait()
	for _, items := range pending {
		for _, it := range items {
			it.err = ErrClosed
			close(it.done)
		}
	}
}

// enqueue puts an empty AppendEntries into target's next batch and waits for its
// answer.
func (m *Mux) enqueue(target raft.ServerAddress, it *batchItem) error {
	m.pmu.Lock()
	if m.closed {
		m.pmu.Unlock()
		return ErrClosed
	}
	m.pending[target] = append(m.pending[target], it)
	m.pmu.Unlock()
	<-it.done // sendBatch always ends in time: its call is bounded by RPCTimeout
	return it.err
}

func (m *Mux) tick() {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-m.quit:
			return
		case <-t.C:
		}
		m.pmu.Lock()
		if len(m.pending) == 0 {
			m.pmu.Unlock()
			continue
		}
		batches := m.pending
		m.pending = make(map[raft.ServerAddress][]*batchItem, len(batches))
		m.pmu.Unlock()
		for addr, items := range batches {
			go m.sendBatch(addr, items)
		}
	}
}

func (m *Mux) sendBatch(addr raft.ServerAddress, items []*batchItem) {
	err := m.callBatch(addr, items)
	for _, it := range items {
		if err != nil {
			it.err = err
		}
		close(it.done)
	}
}

func (m *Mux) callBatch(addr raft.ServerAddress, items []*batchItem) error {
	payload, err := encodeBatch(items)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.RPCTimeout)
	defer cancel()
	m.batchCalls.Add(1)
	m.batchItems.Add(uint64(len(items)))
	resp, err := m.node.Call(ctx, string(addr), OpGroupBatch, payload)
	if err != nil {
		return err
	}
	return decodeAnswers(resp, items)
}

// call sends one RPC of group to addr and decodes its answer into resp.
func (m *Mux) call(addr raft.ServerAddress, typ rpcType, group string, req, resp any) error {
	body, err := encode(req)
	if err != nil {
		return err
	}
	payload := make([]byte, 0, 2+len(group)+len(body))
	payload = append(payload, byte(typ))
	payload = appendGroup(payload, group)
	payload = append(payload, body...)
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.RPCTimeout)
	defer cancel()
	m.rpcCalls.Add(1)
	out, err := m.node.Call(ctx, string(addr), OpGroupRPC, payload)
	if err != nil {
		return err
	}
	if err := decode(out, resp); err != nil {
		return fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	return nil
}

// serveRPC hands one RPC to its group's raft and returns raft's answer.
func (m *Mux) serveRPC(ctx context.Context, _ string, req []byte) ([]byte, error) {
	if len(req) < 1 {
		return nil, fmt.Errorf("%w: empty request", ErrBadMessage)
	}
	typ := rpcType(req[0])
	group, body, err := readGroup(req[1:])
	if err != nil {
		return nil, err
	}
	t := m.group(group)
	if t == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownGroup, group)
	}
	var cmd any
	switch typ {
	case rpcAppendEntries:
		cmd = &raft.AppendEntriesRequest{}
	case rpcRequestVote:
		cmd = &raft.RequestVoteRequest{}
	case rpcTimeoutNow:
		cmd = &raft.TimeoutNowRequest{}
	case rpcRequestPreVote:
		cmd = &raft.RequestPreVoteRequest{}
	default:
		return nil, fmt.Errorf("%w: rpc type %d", ErrBadMessage, typ)
	}
	if err := decode(body, cmd); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	resp, err := t.deliver(ctx, cmd, false)
	if err != nil {
		return nil, err
	}
	return encode(resp)
}

// serveBatch hands every item of a batch to its group: heartbeats through raft's fast
// path, at once; commit notices through the group's consumer, concurrently, so one
// busy group does not hold back the others.
func (m *Mux) serveBatch(ctx context.Context, _ string, req []byte) ([]byte, error) {
	items, err := decodeBatch(req)
	if err != nil {
		return nil, err
	}
	ans := make([]batchAnswer, len(items))
	var wg sync.WaitGroup
	for i := range items {
		t := m.group(items[i].group)
		if t == nil {
			ans[i].err = fmt.Errorf("%w %q", ErrUnknownGroup, items[i].group)
			continue
		}
		if isHeartbeat(&items[i].req) {
			r, err := t.deliver(ctx, &items[i].req, true)
			ans[i] = batchAnswer{resp: asAppendResp(r), err: err}
			continue
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := t.deliver(ctx, &items[i].req, false)
			ans[i] = batchAnswer{resp: asAppendResp(r), err: err}
		}(i)
	}
	wg.Wait()
	return encodeAnswers(ans), nil
}

func asAppendResp(r any) *raft.AppendEntriesResponse {
	a, _ := r.(*raft.AppendEntriesResponse)
	return a
}

// isHeartbeat is raft's own test for an AppendEntries its fast path may handle: it
// carries nothing to store and no commit index to apply.
func isHeartbeat(r *raft.AppendEntriesRequest) bool {
	leader := r.RPCHeader.Addr
	if len(leader) == 0 {
		//lint:ignore SA1019 older raft versions fill only this field
		leader = r.Leader
	}
	return r.Term != 0 && leader != nil && r.PrevLogEntry == 0 && r.PrevLogTerm == 0 &&
		len(r.Entries) == 0 && r.LeaderCommitIndex == 0
}
