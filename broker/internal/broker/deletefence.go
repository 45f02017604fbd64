package broker

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// The delete fence. A topic's delete commits on the controller, and each node closes
// its copies of the topic's partitions when it applies the delete, moments later. A
// node that has not applied it yet still serves the deleted incarnation: a produce sent
// right after the delete's 204 could reach it (through its own HTTP port, or through
// another node as far behind) and be answered 202 by a topic nobody can read any more.
// So the delete is answered only once, for every partition, a majority of its replicas
// have confirmed that they applied the delete and closed their copy: from then on the
// old incarnation's group cannot commit anything (its voters are gone), and a
// partition of one replica is closed on the one node that held it.
//
// Every lease operation of a replicated partition's leader (consume, extend, nack)
// confirms with a majority of its group that it still leads, so a majority closed
// stops those as well as commits.
//
// A replica that cannot be reached does not confirm. The wait then ends after the
// metadata lease (meta/lease.go) and a margin: a node serves only while a catch-up
// with the controller that started less than the lease ago is applied and reconciled,
// so from then on every node that serves has closed the topic, and one that could not
// be asked (cut off, paused, its answers dropped) serves nothing until it has caught
// up, and applied the delete. The delete is answered, logged and counted
// (narad_topic_deletes_unconfirmed_total); its 204 is not withheld, because the delete
// has committed and will be applied everywhere.
//
// (Before the lease this wait was the suspect threshold plus 2 s, on the view that a
// node cut off from the controller stops serving by then. It stopped only 5 s after
// its Raft noticed the controller gone, up to 2 s after the cut, and a node whose
// answers were dropped, or one paused and continued, never noticed.)

// fenceMargin is added to the lease for a replica that does not confirm: the lease is
// measured on the node that holds it, this wait on the node that took the delete.
const fenceMargin = time.Second

// fenceRetry is how long a confirmation that failed waits before it is asked again.
const fenceRetry = 100 * time.Millisecond

// fenceDelete waits, within the bound above and ctx, until a majority of the replicas
// of every partition of m (deleted at index) have applied the delete.
func (b *Broker) fenceDelete(ctx context.Context, m meta.Topic, index uint64) {
	if b.opts.Peers == nil || !b.meta.Allows(meta.FeatureDeleteFence) || len(m.Placement) == 0 {
		return
	}
	missing, err := b.awaitApplied(ctx, m, index, false)
	if missing == nil {
		return
	}
	b.metrics.DeletesUnconfirmed.Inc()
	b.log.Warn("a topic's delete is answered before a majority of some partition's replicas confirmed they closed it; those nodes serve nothing until they have caught up with the controller, and applied the delete",
		"topic", m.Name, "incarnation", m.Incarnation, "delete_index", index, "unconfirmed", missing, "err", err)
}

// The detach fence. A fan-out child is copied into by whichever node leads each
// partition of its parent, and each stops when it applies the detach and closes its
// copier. Answered at once, a detach could be followed by copies from a node that has
// not applied it yet (cut off from the controller, or only behind): if the child was
// attached again meanwhile as a delay child, those copies arrived before they were due
// (an adversarial review, 5 December). So a detach is answered once every replica of
// every parent partition has confirmed that it applied the detach, which closed its
// copier and the copy it was making; one that cannot be reached is waited for up to the
// metadata lease and the margin, after which it copies nothing (a copier copies only
// while its node's metadata is current: copier.round). The node holding a child
// partition also refuses a copy made for an attachment that is not the child's any more.

// fenceDetach waits, within the bound above and ctx, until every replica of every
// partition of the parent (as this node knows it) has applied the detach at index.
func (b *Broker) fenceDetach(ctx context.Context, parent, child string, index uint64) {
	m, ok := b.meta.Topic(parent)
	if b.opts.Peers == nil || !ok || !b.meta.Allows(meta.FeatureDeleteFence) || len(m.Placement) == 0 {
		return
	}
	// A move's source may still lead a parent partition its placement no longer
	// names (it hands the leadership over before its copy goes): asked too.
	pl := make([]meta.Placement, len(m.Placement))
	for i, p := range m.Placement {
		pl[i] = p
		pl[i].Replicas = slices.Clone(p.Replicas)
	}
	for _, mv := range b.meta.Moves() {
		if mv.Active() && mv.Topic == m.Name && mv.Incarnation == m.Incarnation && mv.From != "" &&
			int(mv.Partition) < len(pl) && !slices.Contains(pl[mv.Partition].Replicas, mv.From) {
			pl[mv.Partition].Replicas = append(pl[mv.Partition].Replicas, mv.From)
		}
	}
	m.Placement = pl
	missing, err := b.awaitApplied(ctx, m, index, true)
	if missing == nil {
		return
	}
	b.metrics.DetachesUnconfirmed.Inc()
	b.log.Warn("a fan-out detach is answered before every replica of the parent confirmed it stopped copying; those nodes copy nothing until they have caught up with the controller, and applied the detach",
		"parent", parent, "child", child, "detach_index", index, "unconfirmed", missing, "err", err)
}

// awaitApplied asks the replicas of m's partitions to confirm that they applied the
// metadata through index (and reconciled it), until a majority of every partition's
// replicas did (all of them with every), ctx ends, or the metadata lease and
// fenceMargin passed. It returns the nodes that did not confirm when it gave up (nil
// when fenced, or when ctx ended) and why it gave up.
func (b *Broker) awaitApplied(ctx context.Context, m meta.Topic, index uint64, every bool) ([]string, error) {
	parts := make([][]string, len(m.Placement))
	var nodes []string
	seen := map[string]bool{}
	for i, p := range m.Placement {
		parts[i] = p.Replicas
		if len(parts[i]) == 0 && p.Leader != "" {
			parts[i] = []string{p.Leader}
		}
		for _, n := range parts[i] {
			if !seen[n] {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	sort.Strings(nodes)

	var mu sync.Mutex
	confirmed := map[string]bool{}
	fenced := func() bool {
		for _, rs := range parts {
			n := 0
			for _, r := range rs {
				if confirmed[r] {
					n++
				}
			}
			if (every && n < len(rs)) || n <= len(rs)/2 {
				return false
			}
		}
		return true
	}
	changed := make(chan struct{}, len(nodes))
	wctx, cancel := context.WithTimeout(ctx, b.meta.Lease()+fenceMargin)
	defer cancel()
	for _, n := range nodes {
		if n == b.opts.NodeID {
			// The caller reconciled this node after the command applied here.
			mu.Lock()
			confirmed[n] = b.reconciledThrough.Load() >= index
			mu.Unlock()
			continue
		}
		go func() {
			for {
				resp, err := b.call(wctx, n, &dataReq{Kind: dataApplied, Topic: m.Name, Index: index}, remoteCallTimeout)
				if err == nil {
					err = fromWireErr(resp.Err)
				}
				if err == nil {
					mu.Lock()
					confirmed[n] = true
					mu.Unlock()
					changed <- struct{}{}
					return
				}
				select {
				case <-wctx.Done():
					return
				case <-time.After(fenceRetry):
				}
			}
		}()
	}
	for {
		mu.Lock()
		done := fenced()
		mu.Unlock()
		if done {
			return nil, nil
		}
		select {
		case <-changed:
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, nil // the caller went away; the command stands, as committed
			}
			mu.Lock()
			var missing []string
			for _, n := range nodes {
				if !confirmed[n] {
					missing = append(missing, n)
				}
			}
			mu.Unlock()
			return missing, wctx.Err()
		}
	}
}

// awaitReconciled returns once this node has applied the metadata through index and
// finished a reconcile pass over it, or ErrUnavailable after holderCatchUp (the asking
// node asks again).
func (b *Broker) awaitReconciled(ctx context.Context, index uint64) error {
	deadline := time.Now().Add(holderCatchUp)
	for {
		wake := b.reconciled.wait()
		if b.reconciledThrough.Load() >= index {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: node %q has not applied metadata entry %d yet (it has %d)", ErrUnavailable, b.opts.NodeID, index, b.meta.AppliedIndex())
		}
		if err := b.awaitReconcile(ctx, wake); err != nil {
			return err
		}
	}
}
