package raftnet

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// Transport is one raft group's raft.Transport. Its address is the node's: every
// group on a node shares it, and the group id in each frame picks the raft.
type Transport struct {
	mux      *Mux
	group    string
	consumer chan raft.RPC

	hmu       sync.RWMutex
	heartbeat func(raft.RPC)

	once sync.Once
	quit chan struct{}
}

var (
	_ raft.Transport   = (*Transport)(nil)
	_ raft.WithClose   = (*Transport)(nil)
	_ raft.WithPreVote = (*Transport)(nil)
)

// Consumer is where raft reads the RPCs addressed to this group.
func (t *Transport) Consumer() <-chan raft.RPC { return t.consumer }

// LocalAddr is the node's node-plane address.
func (t *Transport) LocalAddr() raft.ServerAddress { return raft.ServerAddress(t.mux.node.Addr()) }

// AppendEntriesPipeline is not offered: raft then replicates to each follower one
// AppendEntries at a time, each carrying every entry that is ready (up to
// MaxAppendEntries), which is what batches under load.
func (t *Transport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// AppendEntries sends entries at once; an empty request (a heartbeat, or a notice of
// the commit index) waits for the next tick and shares one frame with those of every
// other group going to the same peer.
func (t *Transport) AppendEntries(_ raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if len(args.Entries) == 0 {
		it := &batchItem{group: t.group, req: args, resp: resp, done: make(chan struct{})}
		return t.mux.enqueue(target, it)
	}
	return t.mux.call(target, rpcAppendEntries, t.group, args, resp)
}

// RequestVote sends a vote request.
func (t *Transport) RequestVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return t.mux.call(target, rpcRequestVote, t.group, args, resp)
}

// RequestPreVote sends a pre-vote request, so a node cut off from its group does not
// bump the term of the others when it comes back.
func (t *Transport) RequestPreVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.mux.call(target, rpcRequestPreVote, t.group, args, resp)
}

// TimeoutNow asks target to start an election at once (leadership transfer).
func (t *Transport) TimeoutNow(_ raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return t.mux.call(target, rpcTimeoutNow, t.group, args, resp)
}

// InstallSnapshot is not implemented by the spike; see ErrSnapshotUnsupported.
func (t *Transport) InstallSnapshot(raft.ServerID, raft.ServerAddress, *raft.InstallSnapshotRequest, *raft.InstallSnapshotResponse, io.Reader) error {
	return ErrSnapshotUnsupported
}

// EncodePeer is the address's bytes: the id travels in the RPC header.
func (t *Transport) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte { return []byte(addr) }

// DecodePeer reverses EncodePeer.
func (t *Transport) DecodePeer(b []byte) raft.ServerAddress { return raft.ServerAddress(b) }

// SetHeartbeatHandler sets raft's fast path for heartbeats.
func (t *Transport) SetHeartbeatHandler(cb func(raft.RPC)) {
	t.hmu.Lock()
	defer t.hmu.Unlock()
	t.heartbeat = cb
}

// Close detaches the group from the mux; RPCs for it are answered ErrUnknownGroup.
func (t *Transport) Close() error {
	t.once.Do(func() {
		close(t.quit)
		t.mux.remove(t)
	})
	return nil
}

// deliver gives cmd to this group's raft and waits for its answer. A heartbeat goes
// through the fast path when raft set one.
func (t *Transport) deliver(ctx context.Context, cmd any, heartbeat bool) (any, error) {
	respCh := make(chan raft.RPCResponse, 1)
	rpc := raft.RPC{Command: cmd, RespChan: respCh}
	var fast func(raft.RPC)
	if heartbeat {
		t.hmu.RLock()
		fast = t.heartbeat
		t.hmu.RUnlock()
	}
	if fast != nil {
		fast(rpc)
	} else {
		select {
		case t.consumer <- rpc:
		case <-t.quit:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: group %q did not take the request", ErrTimeout, t.group)
		}
	}
	select {
	case r := <-respCh:
		if r.Error != nil {
			return nil, r.Error
		}
		return r.Response, nil
	case <-t.quit:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: group %q did not answer", ErrTimeout, t.group)
	}
}
