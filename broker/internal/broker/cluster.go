package broker

import (
	"context"
	"errors"

	"github.com/narad-mq/narad/broker/internal/meta"
)

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
		return errors.Join(ErrNotImplemented, err)
	}
	return mapMetaErr(err)
}

// HandleForward answers a control-plane request another node sent over the node plane
// (meta.Store.HandleForward).
func (b *Broker) HandleForward(ctx context.Context, req []byte) ([]byte, error) {
	return b.meta.HandleForward(ctx, req)
}

// RaftState returns the control plane's Raft state, for metrics.
func (b *Broker) RaftState() meta.RaftState { return b.meta.RaftState() }

// Clustered reports whether this node is one of several: metadata written through
// another node reaches it a moment later (a lone node has no peers configured).
func (b *Broker) Clustered() bool { return b.opts.Peers != nil }

// CatchUp returns once this node has applied every metadata write the controller had
// committed when it was called (meta.Store.Sync).
func (b *Broker) CatchUp(ctx context.Context) error { return b.meta.Sync(ctx) }
