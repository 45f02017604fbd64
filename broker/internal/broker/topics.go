package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
)

// TopicSpec is a create request; nil fields take the defaults.
type TopicSpec struct {
	Name              string
	OwnerID           uint64 // the creating user's ID; 0 when security is off
	Partitions        *int32
	RetentionMs       *int64
	VisibilityMs      *int64
	MaxInFlight       *int32
	MaxAckedAhead     *int32
	ReplicationFactor *int32
	Schema            json.RawMessage
	Parent            *string
	FanoutDelayMs     *int64
}

// TopicAlter is a PATCH request; nil fields stay.
type TopicAlter = meta.Alter

func orDefault[T any](p *T, d T) T {
	if p != nil {
		return *p
	}
	return d
}

func (b *Broker) ensureReady() error {
	if !b.Ready() {
		return ErrUnavailable
	}
	return nil
}

// CreateTopic creates a topic; it is usable when this returns.
func (b *Broker) CreateTopic(ctx context.Context, s TopicSpec) (meta.Topic, error) {
	if err := b.ensureReady(); err != nil {
		return meta.Topic{}, err
	}
	if err := checkName(s.Name); err != nil {
		return meta.Topic{}, err
	}
	if err := firstInvalid(errors.Join(
		checkRange("partitions", s.Partitions, 1, MaxPartitions),
		checkSettings(s.RetentionMs, s.VisibilityMs, s.MaxInFlight, s.MaxAckedAhead),
		checkRange("replication_factor", s.ReplicationFactor, 1, b.maxReplicationFactor()),
	)); err != nil {
		var inv *InvalidError
		if errors.As(err, &inv) && s.ReplicationFactor != nil && b.repl == nil && *s.ReplicationFactor != 1 {
			inv.Msg = "replication_factor must be 1: this node runs alone"
		}
		return meta.Topic{}, err
	}
	rf, err := b.replicationFactor(s.ReplicationFactor)
	if err != nil {
		return meta.Topic{}, err
	}
	if len(s.Schema) > 0 {
		if _, err := compileSchema(s.Schema); err != nil {
			return meta.Topic{}, err
		}
		if isEmptySchema(s.Schema) {
			s.Schema = nil
		}
	}
	var start []uint64
	var parentInc uint64
	if s.Parent != nil {
		if err := checkName(*s.Parent); err != nil {
			return meta.Topic{}, err
		}
		var err error
		if start, parentInc, err = b.parentStart(*s.Parent); err != nil {
			return meta.Topic{}, err
		}
	} else if s.FanoutDelayMs != nil {
		return meta.Topic{}, invalid(apigen.ErrorCodeInvalidParameter, "fanout_delay_ms goes with parent")
	}
	if err := checkDelay(orDefault(s.FanoutDelayMs, 0)); err != nil {
		return meta.Topic{}, err
	}
	d := b.opts.Defaults
	m := meta.Topic{
		Name:        s.Name,
		OwnerID:     s.OwnerID,
		CreatedAtMs: partition.WallMillis(),
		TopicConfig: meta.TopicConfig{
			Partitions:        orDefault(s.Partitions, d.Partitions),
			RetentionMs:       orDefault(s.RetentionMs, d.RetentionMs),
			VisibilityMs:      orDefault(s.VisibilityMs, d.VisibilityMs),
			MaxInFlight:       orDefault(s.MaxInFlight, d.MaxInFlight),
			MaxAckedAhead:     orDefault(s.MaxAckedAhead, d.MaxAckedAhead),
			ReplicationFactor: rf,
			Schema:            s.Schema,
			Parent:            orDefault(s.Parent, ""),
			ParentIncarnation: parentInc, // the incarnation start was read from
			FanoutDelayMs:     orDefault(s.FanoutDelayMs, 0),
		},
	}
	t, err := b.meta.CreateTopic(m, start...)
	if err != nil {
		return meta.Topic{}, mapMetaErr(err)
	}
	if err := b.reconcile(false); err != nil {
		return meta.Topic{}, errors.Join(ErrStorage, err)
	}
	return t, nil
}

func mapMetaErr(err error) error {
	var ce *ConflictError
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, meta.ErrChildNotFound):
		return ErrChildNotFound
	case errors.Is(err, meta.ErrTopicExists):
		return ErrTopicExists
	case errors.Is(err, meta.ErrTopicNotFound):
		return ErrTopicNotFound
	case errors.Is(err, meta.ErrPartitionNotFound):
		return ErrPartitionNotFound
	case errors.Is(err, meta.ErrMoveNotFound):
		return ErrMoveNotFound
	case errors.Is(err, meta.ErrMemberNotFound):
		return ErrMemberNotFound
	case errors.Is(err, meta.ErrOutcomeUnknown):
		// Proposed, and Raft gave no answer in time: the write may have happened. The
		// HTTP API answers 503 timeout (outcome unknown), not unavailable (retry freely).
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	case errors.Is(err, meta.ErrUnavailable):
		return errors.Join(ErrUnavailable, err)
	}
	return err
}

// Topics lists every topic.
func (b *Broker) Topics() ([]meta.Topic, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	return b.meta.Topics(), nil
}

// PartitionInfo describes one partition for inspect.
type PartitionInfo struct {
	Index  int32
	Stats  queue.Stats
	Leader string
	// Replicas are the nodes holding a copy; Replication is, for a replicated
	// partition whose leader answered, its term and followers.
	Replicas    []string
	Replication *ReplicaInfo
	// Available is false when the node holding the partition could not be reached;
	// Stats is then zero.
	Available bool
}

// TopicMeta returns a topic's settings as this node knows them, without asking the
// nodes that hold its partitions (for authorization: a node that is down must not
// change who may do what).
func (b *Broker) TopicMeta(name string) (meta.Topic, error) {
	t, err := b.lookup(name)
	if err != nil {
		return meta.Topic{}, err
	}
	return *t.cur.Load(), nil
}

// Topic returns a topic and its partitions' state, asking the nodes that hold its
// partitions in parallel.
func (b *Broker) Topic(name string) (meta.Topic, []PartitionInfo, error) {
	t, err := b.lookup(name)
	if err != nil {
		return meta.Topic{}, nil, err
	}
	stats, ris, errs := b.allStatsAndReplicas(context.Background(), t)
	infos := make([]PartitionInfo, len(t.parts()))
	m := t.cur.Load()
	for i := range t.parts() {
		leader := b.opts.NodeID
		if ris[i] != nil && ris[i].Leader != "" {
			leader = ris[i].Leader // the node whose counters these are
		} else if !t.leads(i) {
			leader = b.holderOf(t, i)
		}
		infos[i] = PartitionInfo{Index: int32(i), Stats: stats[i], Leader: leader, Available: true, Replication: ris[i]}
		if i < len(m.Placement) {
			infos[i].Replicas = m.Placement[i].Replicas
		} else {
			infos[i].Replicas = []string{leader}
		}
		switch err := errs[i]; {
		case err == nil:
		case errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown):
			// The holder cannot be reached: the topic is still shown, with this
			// partition marked (its counters are unknown).
			infos[i].Stats, infos[i].Available = queue.Stats{}, false
		default:
			return meta.Topic{}, nil, err
		}
	}
	return *t.cur.Load(), infos, nil
}

// AlterTopic changes a topic's live-tunable settings; of a.Incarnation only, when set.
func (b *Broker) AlterTopic(ctx context.Context, name string, a TopicAlter) (meta.Topic, error) {
	if err := b.ensureReady(); err != nil {
		return meta.Topic{}, err
	}
	if err := checkName(name); err != nil {
		return meta.Topic{}, err
	}
	if err := firstInvalid(checkSettings(a.RetentionMs, a.VisibilityMs, a.MaxInFlight, a.MaxAckedAhead)); err != nil {
		return meta.Topic{}, err
	}
	if a.Schema != nil {
		if _, err := compileSchema(*a.Schema); err != nil {
			return meta.Topic{}, err
		}
		if isEmptySchema(*a.Schema) {
			a.Schema, a.ClearSchema = nil, true
		}
	}
	if b.opts.Peers != nil && (a.Incarnation == 0 || a.ReplicationFactor != nil) {
		// On state caught up with the controller: the incarnation the alter is pinned
		// to, and the check of an alter with a replication factor (below).
		sctx, cancel := context.WithTimeout(ctx, syncBound)
		serr := b.meta.Sync(sctx)
		cancel()
		if serr != nil {
			return meta.Topic{}, fmt.Errorf("%w: the controller could not be asked for topic %q's state: %w", ErrUnavailable, name, serr)
		}
		if a.Incarnation == 0 {
			// Pinned to the incarnation the name has now, as a delete is: an alter
			// that reaches the controller late (its caller was told "outcome unknown"
			// and moved on), or whose two commands (below) a delete and create fall
			// between, must not change a topic created under the name since (a review,
			// 6 December).
			cur, ok := b.meta.Topic(name)
			if !ok {
				return meta.Topic{}, ErrTopicNotFound
			}
			a.Incarnation = cur.Incarnation
		}
	}
	var t meta.Topic
	var err error
	switch {
	case a.ReplicationFactor == nil:
		t, err = b.meta.AlterTopic(name, a)
	case b.meta.Allows(meta.FeatureOneAlter):
		// One command, refused or applied whole (cluster version 4).
		var changes bool
		if changes, err = b.checkReplicationFactor(name, *a.ReplicationFactor); err != nil {
			return meta.Topic{}, err
		}
		if changes || b.repl != nil {
			// In a cluster always one command, even for the factor the topic has as
			// this node saw it: the controller's may differ by the commit.
			b.beforeAlterCommit(name)
			t, err = b.meta.AlterWithReplicationFactor(name, a, *a.ReplicationFactor)
		} else {
			t, err = b.meta.AlterTopic(name, a)
		}
	default:
		// Two commands, as a cluster of an older version understands them: the rest of
		// the alter is asked about first, on state caught up with the controller
		// (above), so that its refusal leaves the replication factor as it was. A
		// conflict that arises between the two commands (a delay child attached), or a
		// change of controller, still answers 409 or 503 with the factor changed.
		if err := b.meta.CheckAlter(name, a); err != nil {
			return meta.Topic{}, mapMetaErr(err)
		}
		if err := b.alterReplicationFactor(name, a.Incarnation, *a.ReplicationFactor); err != nil {
			return meta.Topic{}, err
		}
		t, err = b.meta.AlterTopic(name, a)
	}
	if err != nil {
		return meta.Topic{}, mapMetaErr(err)
	}
	// The pass pushes the new settings to this node's partitions, which cannot fail;
	// its error is another topic's open failing (logged, and tried again at the next
	// pass). The alter is committed: answered with that error, as 503 storage_failed
	// "not stored", it took effect all the same, and every alter through this node
	// answered so while that topic stayed unopenable (a review, 6 December).
	if err := b.reconcile(false); err != nil {
		b.log.Warn("the alter is committed; opening another topic failed in the same pass", "topic", name, "err", err)
	}
	return t, nil
}

// alterCommitHook, set only by serial tests (never with t.Parallel), runs just before
// an alter with a replication factor commits as one command.
var alterCommitHook atomic.Pointer[func(topic string)]

func (b *Broker) beforeAlterCommit(topic string) {
	if h := alterCommitHook.Load(); h != nil {
		(*h)(topic)
	}
}

// DeleteTopic deletes a topic's metadata and data. With incarnation != 0 it deletes
// only that incarnation: ErrIncarnationMismatch if the name has another now,
// ErrTopicNotFound if it has none.
func (b *Broker) DeleteTopic(ctx context.Context, name string, incarnation uint64) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	named := incarnation
	if incarnation == 0 && b.opts.Peers != nil {
		// Pinned to the incarnation the name has now, as the controller knows it: a
		// delete that reaches the controller late (its caller was told "outcome
		// unknown" and moved on) must not delete a topic created under the name since.
		sctx, cancel := context.WithTimeout(ctx, syncBound)
		serr := b.meta.Sync(sctx)
		cancel()
		if serr != nil {
			return fmt.Errorf("%w: the controller could not be asked which topic %q is: %w", ErrUnavailable, name, serr)
		}
		cur, ok := b.meta.Topic(name)
		if !ok {
			return ErrTopicNotFound
		}
		incarnation = cur.Incarnation
	}
	m, index, err := b.meta.DeleteTopic(name, incarnation)
	if err != nil {
		if named != 0 && errors.Is(err, meta.ErrTopicNotFound) {
			// The controller refused the incarnation named: say whether the name is
			// another topic now, as this node may not have seen it created (the
			// check before the delete was made on this node's view).
			sctx, cancel := context.WithTimeout(ctx, syncBound)
			serr := b.meta.Sync(sctx)
			cancel()
			if cur, ok := b.meta.Topic(name); serr == nil && ok && cur.Incarnation != named {
				return fmt.Errorf("%w: topic %s is incarnation %d, not %d: it was deleted and created again since; nothing was deleted (read the topic again to delete the one it is now)", ErrIncarnationMismatch, name, cur.Incarnation, named)
			}
		}
		return mapMetaErr(err)
	}
	err = b.reconcile(false)
	b.fenceDelete(ctx, m, index)
	return err
}

// Exists returns nil when the topic exists, ErrTopicNotFound (or why it cannot tell)
// otherwise.
func (b *Broker) Exists(name string) error {
	_, err := b.lookup(name)
	return err
}

func (b *Broker) lookup(name string) (*topic, error) {
	t, err := b.lookupLocal(name)
	if !errors.Is(err, ErrTopicNotFound) || b.opts.Peers == nil {
		return t, err
	}
	// In a cluster the topic may have been created through another node a moment
	// ago: catch up with the controller before answering that it does not exist, so a
	// client sees its own create on every node, as on one node.
	ctx, cancel := context.WithTimeout(context.Background(), syncBound)
	defer cancel()
	if serr := b.meta.Sync(ctx); serr != nil {
		// The topic may exist, created through another node: without the controller's
		// word a 404 would be a guess, so the answer is "retry later".
		b.log.Warn("catching up with the controller before a not-found answer failed", "topic", name, "err", serr)
		return nil, fmt.Errorf("%w: topic %q is unknown to this node and the controller could not be asked: %w", ErrUnavailable, name, serr)
	}
	return b.openAsMeta(ctx, name)
}

// syncBound bounds the catch-up of a lookup that missed.
const syncBound = 2 * time.Second

// reconcileRecheck is how long a wait for the reconcile loop sleeps at most between
// looks, should a pass not be signalled.
const reconcileRecheck = 50 * time.Millisecond

// awaitReconcile waits for the reconcile pass after wake was taken (it runs after
// every metadata change this node applies), or reconcileRecheck, or the end of ctx
// (its error).
func (b *Broker) awaitReconcile(ctx context.Context, wake <-chan struct{}) error {
	t := time.NewTimer(reconcileRecheck)
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// openAsMeta returns topic name open at the incarnation this node's metadata holds,
// waiting while the reconcile loop opens it; ErrTopicNotFound when the metadata has no
// topic of that name.
func (b *Broker) openAsMeta(ctx context.Context, name string) (*topic, error) {
	for {
		wake := b.reconciled.wait()
		m, ok := b.meta.Topic(name)
		if !ok {
			return nil, ErrTopicNotFound
		}
		t, err := b.lookupLocal(name)
		if err == nil && t.incarnation == m.Incarnation {
			return t, nil
		}
		if err != nil && !errors.Is(err, ErrTopicNotFound) {
			return nil, err
		}
		if b.awaitReconcile(ctx, wake) != nil {
			return nil, fmt.Errorf("%w: topic %q is being opened on this node", ErrUnavailable, name)
		}
	}
}

// lookupLocal finds an open topic as this node's replica knows it now.
func (b *Broker) lookupLocal(name string) (*topic, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	b.mu.RLock()
	t, ok := b.topics[name]
	b.mu.RUnlock()
	if !ok {
		return nil, ErrTopicNotFound
	}
	return t, nil
}

// topicList returns the topics this node has now, in no order.
func (b *Broker) topicList() []*topic {
	b.mu.RLock()
	defer b.mu.RUnlock()
	ts := make([]*topic, 0, len(b.topics))
	for _, t := range b.topics {
		ts = append(ts, t)
	}
	return ts
}
