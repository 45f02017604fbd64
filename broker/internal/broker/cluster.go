package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// ErrNotMember means a node that sent a partition operation over the node plane is
// not a member of the cluster, even after this node caught up with the controller.
var ErrNotMember = errors.New("the node is not a member of the cluster")

// MemberInfo is a member of the cluster with the partitions it holds and leads.
type MemberInfo struct {
	meta.Member
	PartitionsHeld int
	PartitionsLed  int
}

// ClusterID returns the cluster's id ("" until the controller has made it).
func (b *Broker) ClusterID() string { return b.meta.ClusterID() }

// ClusterVersion returns the cluster version committed, as this node knows it.
func (b *Broker) ClusterVersion() int { return b.meta.ClusterVersion() }

// Controller returns the node id of the control plane's leader as this node knows it.
func (b *Broker) Controller() string { return b.meta.Controller() }

// Members lists the cluster's members as this node's replica of the metadata knows
// them.
func (b *Broker) Members() ([]MemberInfo, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	loads := b.meta.MemberLoads()
	ms := b.meta.Members()
	out := make([]MemberInfo, 0, len(ms))
	for _, m := range ms {
		l := loads[m.ID]
		out = append(out, MemberInfo{Member: m, PartitionsHeld: l.Held, PartitionsLed: l.Led})
	}
	return out, nil
}

// AddMember admits the node nodeID listening at cluster address addr, through the
// controller.
func (b *Broker) AddMember(ctx context.Context, nodeID, addr string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	err := b.meta.AddMember(ctx, nodeID, addr)
	if errors.Is(err, meta.ErrNodeIDInUse) || errors.Is(err, meta.ErrVersionUnsupported) {
		return &ConflictError{Msg: err.Error()}
	}
	if errors.Is(err, meta.ErrNoForwarder) {
		// Said as the operator acts on it, on one line (a join of the two errors put a
		// newline and the store's own wording in the answer).
		return fmt.Errorf("%w: this node runs alone (started without --cluster-addr), so it admits no members; start every node of a cluster with --cluster-addr and --peers (operating/cluster.md)", ErrNotImplemented)
	}
	return mapMetaErr(err)
}

// HandleForward answers a control-plane request another node sent over the node plane
// (meta.Store.HandleForward).
func (b *Broker) HandleForward(ctx context.Context, req []byte) ([]byte, error) {
	return b.meta.HandleForward(ctx, req)
}

// CheckPeer decides whether this node serves the partition operations (HandleData)
// that node sends over the node plane: only while it is a member. The node plane
// proves only that the sender holds the cluster secret, and a node that left the
// cluster (decommissioned and removed) keeps the secret and, if its process is left
// running, serves its clients from its copy of the metadata as of its removal: users
// deleted and grants revoked since would still read through it what the holders
// serve. A node unknown here may have been admitted a moment ago, so this node catches
// up with the controller before it refuses; when it cannot, the answer is "retry".
func (b *Broker) CheckPeer(ctx context.Context, node string) error {
	if _, ok := b.meta.Member(node); ok {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, syncBound)
	defer cancel()
	if err := b.meta.Sync(sctx); err != nil {
		return fmt.Errorf("%w: node %q is not a member as node %q knows the cluster, and the controller could not be asked: %w", ErrUnavailable, node, b.opts.NodeID, err)
	}
	if _, ok := b.meta.Member(node); ok {
		return nil
	}
	// At most about one a second per such node: it holds this node down for a second
	// (remoteDownFor) after each refusal.
	b.log.Warn("refused a partition operation from a node that is not a member of the cluster; stop its process", "node", node)
	return fmt.Errorf("%w: node %q is not one (decommissioned and removed, or never admitted), so node %q serves it no partition", ErrNotMember, node, b.opts.NodeID)
}

// RaftState returns the control plane's Raft state, for metrics.
func (b *Broker) RaftState() meta.RaftState { return b.meta.RaftState() }

// Clustered reports whether this node is one of several: metadata written through
// another node reaches it a moment later (a lone node has no peers configured).
func (b *Broker) Clustered() bool { return b.opts.Peers != nil }

// CatchUp returns once this node has applied every metadata write the controller had
// committed when it was called (meta.Store.Sync).
func (b *Broker) CatchUp(ctx context.Context) error { return b.meta.Sync(ctx) }
