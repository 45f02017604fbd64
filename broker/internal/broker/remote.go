package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// A Peers reaches the other nodes' data planes: cmd/narad gives the node plane's
// data operation. A node without one (a lone node) holds every partition itself.
//
// Call sends req to the node at the cluster address addr and returns its answer. An
// error that wraps meta.ErrNotDelivered means the request certainly did not run there
// (no connection, the peer refused it unread); any other error leaves the outcome
// unknown.
type Peers interface {
	Call(ctx context.Context, addr string, req []byte) ([]byte, error)
}

// ErrOutcomeUnknown means the node holding a partition went silent after it was sent a
// write: the write may or may not be stored. It is never retried on another partition.
var ErrOutcomeUnknown = errors.New("the outcome is unknown")

// ErrPartitionDown means the node holding a partition cannot be reached now.
var ErrPartitionDown = errors.New("the node holding the partition is unreachable")

// ErrPeerSaturated means this node has its limit of requests in flight to the node
// holding a partition.
var ErrPeerSaturated = errors.New("too many requests in flight to the node holding the partition")

const (
	// remoteCallTimeout bounds one forwarded operation (a long poll's wait excepted):
	// the client gets 503 within it when the holder went silent.
	remoteCallTimeout = 5 * time.Second
	// remoteDownFor is how long a holder that failed a call is not sent new requests:
	// they answer 503 at once instead of each waiting out remoteCallTimeout.
	remoteDownFor = time.Second
	// remoteWaitFor bounds one long-poll watch on a holder (it is made again while
	// consumers wait).
	remoteWaitFor = 10 * time.Second
	// holderCatchUp is how long a holder waits for its metadata to reach a topic it was
	// sent a request for (a create it has not applied yet).
	holderCatchUp = 3 * time.Second
	// DefaultMaxPeerInflight bounds the forwarded requests in flight to one node.
	DefaultMaxPeerInflight = 512
)

// Data-plane request kinds.
const (
	dataAppend   = "append"
	dataLease    = "lease"
	dataSettle   = "settle"
	dataExtend   = "extend"
	dataHandBack = "hand_back"
	dataRead     = "read"
	dataStats    = "stats"
	dataWait     = "wait"
	dataLag      = "lag"
	// dataReplicaRead reads committed records of any replica, leader or not: a
	// replica restoring a snapshot fetches the messages it lacks with it.
	dataReplicaRead = "replica_read"
	// dataStatsBatch asks for the counters of several partitions the node leads in one
	// request (meta.FeatureStatsBatch): sent only once the cluster version allows it,
	// since a node of version 1 does not know it.
	dataStatsBatch = "stats_batch"
	// dataApplied asks whether the node has applied the metadata through Index and
	// closed what that removed (meta.FeatureDeleteFence): a topic's delete waits for
	// it (deletefence.go).
	dataApplied = "applied"
)

// replicaReadLimit is the most records one replica_read answers (4 MiB at most).
const replicaReadLimit = 2048

// dataReq is one partition operation sent to the node that holds the partition. The
// entry node has authenticated and authorized the client; Principal names who, for
// the holder's logs (credentials never travel).
type dataReq struct {
	Kind        string                `json:"kind"`
	Topic       string                `json:"topic"`
	Incarnation uint64                `json:"inc"`
	Partition   int32                 `json:"part"`
	Parts       []int32               `json:"parts,omitempty"`
	Principal   string                `json:"principal,omitempty"`
	Records     []segment.Record      `json:"records,omitempty"`
	Limit       int                   `json:"limit,omitempty"`
	DurationMs  int64                 `json:"duration_ms,omitempty"`
	MaxBytes    int                   `json:"max_bytes,omitempty"`
	Settles     []partition.SettleReq `json:"settles,omitempty"`
	Offset      uint64                `json:"offset,omitempty"`
	Nonce       queue.Nonce           `json:"nonce"`
	FromTimeMs  *int64                `json:"from_time_ms,omitempty"`
	// SkipDamaged asks a read to go past damaged records, naming them in
	// dataResp.Damaged, instead of failing at the first (a holder of an earlier
	// version ignores it and fails, which the reader retries as before).
	SkipDamaged bool `json:"skip_damaged,omitempty"`
	// Child names a fan-out child (lag): its name, incarnation and attach id.
	Child    string `json:"child,omitempty"`
	ChildInc uint64 `json:"child_inc,omitempty"`
	AttachID uint64 `json:"attach_id,omitempty"`
	// Index is, for applied, the metadata index asked about.
	Index uint64 `json:"index,omitempty"`
	// Group asks, for stats, for the answer of the partition's replica in that group
	// only, while it leads it (a forced takeover reads its survivor's log end): a
	// replica of another group answers not_leader. A node of an earlier version
	// ignores it.
	Group string `json:"group,omitempty"`
	// Bin asks for a lease's answer in the binary form (wirebin.go); a holder of an
	// earlier version ignores it and answers in JSON.
	Bin bool `json:"bin,omitempty"`
	// Attend asks a lease's holder whether consumers of the topic ask it directly
	// (attend.go), and says the entry node reads the binary form's version 2, which
	// carries that answer. A holder of an earlier version ignores it.
	Attend bool `json:"attend,omitempty"`
}

type dataResp struct {
	First      uint64               `json:"first,omitempty"`
	Deliveries []partition.Delivery `json:"deliveries,omitempty"`
	Records    []segment.Record     `json:"records,omitempty"`
	Start      uint64               `json:"start,omitempty"`
	Damaged    []uint64             `json:"damaged,omitempty"`
	Stats      *queue.Stats         `json:"stats,omitempty"`
	Errs       []*wireErr           `json:"errs,omitempty"`
	Ready      bool                 `json:"ready,omitempty"`
	Lag        *ChildLag            `json:"lag,omitempty"`
	Repl       *ReplicaInfo         `json:"repl,omitempty"`
	Batch      []partStats          `json:"batch,omitempty"`
	Err        *wireErr             `json:"err,omitempty"`
	// Attended answers a lease that asked (dataReq.Attend): consumers of the topic
	// ask this node directly.
	Attended bool `json:"attended,omitempty"`
}

// partStats is one partition's answer in a stats_batch: its counters and replication
// state, or why this node cannot give them (it does not lead the partition).
type partStats struct {
	Part  int32        `json:"part"`
	Stats *queue.Stats `json:"stats,omitempty"`
	Repl  *ReplicaInfo `json:"repl,omitempty"`
	Err   *wireErr     `json:"err,omitempty"`
}

// wireErr carries a partition's error to the entry node, which maps it as it maps a
// local partition's (partitionErr, ackErr).
type wireErr struct {
	Code string `json:"code"`
	Msg  string `json:"msg"`
	// Leader is, with not_leader, the node the answering replica knows leads the
	// partition ("" when it knows none: an election is running).
	Leader string `json:"leader,omitempty"`
}

var dataSentinels = []struct {
	code string
	err  error
}{
	{"lease_lost", queue.ErrLeaseLost},
	// Before not_leader: a write that may be stored must never read as one to send to
	// the leader again.
	{"outcome_unknown", partition.ErrOutcomeUnknown},
	{"not_leader", partition.ErrNotLeader},
	{"acked_ahead_full", queue.ErrAckedAheadFull},
	{"not_undone", segment.ErrNotUndone}, // before storage: both match such an error
	{"corrupt", partition.ErrCorrupt},
	{"disk_full", partition.ErrDiskFull},
	{"storage", partition.ErrStorage},
	{"unavailable", ErrUnavailable}, // before closed: a holder shutting down is not a deleted topic
	{"closed", partition.ErrClosed},
	{"topic_not_found", ErrTopicNotFound},
}

func toWireErr(err error) *wireErr {
	if err == nil {
		return nil
	}
	for _, s := range dataSentinels {
		if errors.Is(err, s.err) {
			code := s.code
			if code == "not_undone" && !errors.Is(err, partition.ErrStorage) {
				continue
			}
			return &wireErr{Code: code, Msg: err.Error()}
		}
	}
	return &wireErr{Code: "internal", Msg: err.Error()}
}

func fromWireErr(w *wireErr) error {
	if w == nil {
		return nil
	}
	for _, s := range dataSentinels {
		if s.code == w.Code {
			if s.code == "not_undone" {
				return fmt.Errorf("%w: %w: %s", partition.ErrStorage, segment.ErrNotUndone, w.Msg)
			}
			return fmt.Errorf("%w (on the node holding the partition: %s)", s.err, w.Msg)
		}
	}
	return fmt.Errorf("the node holding the partition failed: %s", w.Msg)
}

// remote is a node's state about the other nodes it forwards to.
type remote struct {
	mu       sync.Mutex
	inflight map[string]int       // node id → forwarded requests in flight
	downTill map[string]time.Time // node id → when to try it again
	watch    map[watchKey]bool    // long-poll watches running
	watches  map[string]int       // node id → watches running on it
}

type watchKey struct {
	topic string
	inc   uint64
	node  string
}

func newRemote() *remote {
	return &remote{inflight: map[string]int{}, downTill: map[string]time.Time{}, watch: map[watchKey]bool{}, watches: map[string]int{}}
}

// leads reports whether this node serves partition p of t: it holds it and, for a
// replicated partition, leads it.
func (t *topic) leads(p int) bool {
	return p < len(t.parts()) && t.parts()[p] != nil && t.parts()[p].Leading()
}

// holderOf returns the node that serves partition p of topic t ("" for this node, or
// for a replicated partition whose leader is not known now).
func (b *Broker) holderOf(t *topic, p int) string {
	if t.leads(p) {
		return ""
	}
	m := t.cur.Load()
	if b.replicated(m, p) {
		return b.leaderOf(t, p)
	}
	if p < len(m.Placement) {
		return m.Placement[p].Leader
	}
	return ""
}

// hasRemote reports whether some partition of t is served by another node.
func (t *topic) hasRemote() bool {
	for i := range t.parts() {
		if !t.leads(i) {
			return true
		}
	}
	return false
}

// peerUp reports whether node is worth sending a request to now: a member the control
// plane thinks alive that has not just failed a call.
func (b *Broker) peerUp(node string) bool {
	if m, ok := b.meta.Member(node); ok && m.Status != meta.StatusAlive {
		return false
	}
	b.remote.mu.Lock()
	defer b.remote.mu.Unlock()
	return !time.Now().Before(b.remote.downTill[node])
}

// call sends one data request to node and decodes the answer. An error of its own
// (not the partition's) wraps ErrUnavailable plus ErrPartitionDown or ErrPeerSaturated
// when the request certainly did not run, and ErrOutcomeUnknown when it may have.
func (b *Broker) call(ctx context.Context, node string, req *dataReq, timeout time.Duration) (*dataResp, error) {
	start := time.Now()
	resp, err := b.callOnce(ctx, node, req, timeout)
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrPeerSaturated):
		outcome = "saturated"
	case errors.Is(err, ErrPartitionDown):
		outcome = "unreachable"
	case errors.Is(err, ErrOutcomeUnknown):
		outcome = "unknown"
	default:
		outcome = "error"
	}
	b.metrics.Forwarded.WithLabelValues(req.Kind, outcome).Observe(time.Since(start).Seconds())
	return resp, err
}

func (b *Broker) callOnce(ctx context.Context, node string, req *dataReq, timeout time.Duration) (*dataResp, error) {
	if b.opts.Peers == nil {
		return nil, fmt.Errorf("%w: %w: partition of topic %q is placed on node %q and this node has no node plane", ErrUnavailable, ErrPartitionDown, req.Topic, node)
	}
	m, ok := b.meta.Member(node)
	if !ok || m.ClusterAddr == "" {
		return nil, fmt.Errorf("%w: %w: node %q holding partition %d of topic %q is not a member", ErrUnavailable, ErrPartitionDown, node, req.Partition, req.Topic)
	}
	if !b.peerUp(node) {
		return nil, fmt.Errorf("%w: %w: node %q holding partition %d of topic %q is %s", ErrUnavailable, ErrPartitionDown, node, req.Partition, req.Topic, b.peerState(node, m))
	}
	if b.repl != nil && b.repl.host.PeerSilent(raftID(m.ServerID)) {
		// Found dead by the node-pair liveness (a second of silence): not sent, so the
		// caller may go elsewhere; sending would wait out the call's timeout.
		b.markDown(node)
		return nil, fmt.Errorf("%w: %w: node %q holding partition %d of topic %q has not answered for a second", ErrUnavailable, ErrPartitionDown, node, req.Partition, req.Topic)
	}
	// Watches are not counted: there is at most one per topic and holder, and they
	// park by design.
	if req.Kind != dataWait {
		r := b.remote
		r.mu.Lock()
		if r.inflight[node] >= b.opts.MaxPeerInflight {
			r.mu.Unlock()
			b.log.Warn("a forwarded request was refused: too many in flight to the node holding the partition", "node", node, "limit", b.opts.MaxPeerInflight)
			return nil, fmt.Errorf("%w: %w (%d, to node %q)", ErrUnavailable, ErrPeerSaturated, b.opts.MaxPeerInflight, node)
		}
		r.inflight[node]++
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			r.inflight[node]--
			r.mu.Unlock()
		}()
	}

	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if b.repl != nil {
		// Stop waiting as soon as the node is found dead (about a second of silence),
		// not at the end of the timeout: a failover should not wait out a dead peer.
		b.repl.host.CutWhenSilent(cctx, raftID(m.ServerID), cancel)
	}
	out, err := b.opts.Peers.Call(cctx, m.ClusterAddr, body)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err() // the client went; not the holder's fault
		}
		if timeout < remoteCallTimeout && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			// The caller's own shorter bound (a consume's lease budget) ended: the
			// holder is slow, not found silent, and stays up for everyone else.
			return nil, fmt.Errorf("%w: node %q holding partition %d of topic %q did not answer within %s: %w", ErrOutcomeUnknown, node, req.Partition, req.Topic, timeout, err)
		}
		b.markDown(node)
		if errors.Is(err, meta.ErrNotDelivered) {
			return nil, fmt.Errorf("%w: %w: node %q holding partition %d of topic %q: %w", ErrUnavailable, ErrPartitionDown, node, req.Partition, req.Topic, err)
		}
		b.log.Warn("a forwarded request's outcome is unknown: the node holding the partition went silent",
			"node", node, "topic", req.Topic, "partition", req.Partition, "op", req.Kind, "err", err)
		return nil, fmt.Errorf("%w: node %q holding partition %d of topic %q did not answer: %w", ErrOutcomeUnknown, node, req.Partition, req.Topic, err)
	}
	b.markUp(node)
	resp, err := decodeAnswer(out)
	if err != nil {
		return nil, fmt.Errorf("%w: an answer of node %q could not be read: %w", ErrOutcomeUnknown, node, err)
	}
	return resp, nil
}

func (b *Broker) peerState(node string, m meta.Member) string {
	if m.Status != meta.StatusAlive {
		return "not alive (" + string(m.Status) + ")"
	}
	return "not answering"
}

func (b *Broker) markDown(node string) {
	b.remote.mu.Lock()
	b.remote.downTill[node] = time.Now().Add(remoteDownFor)
	b.remote.mu.Unlock()
}

func (b *Broker) markUp(node string) {
	b.remote.mu.Lock()
	delete(b.remote.downTill, node)
	b.remote.mu.Unlock()
}

type principalKey struct{}

// WithPrincipal records who the HTTP layer authenticated (and authorized) for a
// request: forwarded partition operations carry the name to the holder's logs, never
// a credential. The holder does not check it again; the node plane is authenticated.
func WithPrincipal(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, principalKey{}, name)
}

func principalOf(ctx context.Context) string {
	name, _ := ctx.Value(principalKey{}).(string)
	return name
}

func (b *Broker) dataReq(t *topic, kind string, p int) *dataReq {
	return &dataReq{Kind: kind, Topic: t.name, Incarnation: t.incarnation, Partition: int32(p)}
}

// appendTo appends records to partition p of t, wherever it lives.
func (b *Broker) appendTo(ctx context.Context, t *topic, p int, recs []segment.Record) (uint64, error) {
	return b.appendFor(ctx, t, p, recs, 0)
}

// appendFor is appendTo for a fan-out copy into child t made for its attachment
// attachID (0: not a copy). Where the child partition is held, a copy is refused once
// the child's attachment is another (detached, or attached again): a copier whose node
// has not applied the detach yet copies nothing more into it (the detach fence,
// deletefence.go).
func (b *Broker) appendFor(ctx context.Context, t *topic, p int, recs []segment.Record, attachID uint64) (uint64, error) {
	var first uint64
	var lerr error
	req := b.dataReq(t, dataAppend, p)
	req.Records, req.Principal = recs, principalOf(ctx)
	if attachID != 0 {
		req.Child, req.ChildInc, req.AttachID = t.name, t.incarnation, attachID
	}
	// The write is not tied to the client: once sent it runs to its end on the holder,
	// as a local append runs to its fsync.
	resp, err := b.route(context.WithoutCancel(ctx), t, p, req, remoteCallTimeout, func(lp *partition.Partition) bool {
		if attachID != 0 && t.cur.Load().AttachID != attachID {
			lerr = errAttachChanged(t.name)
			return true
		}
		first, lerr = lp.Append(recs)
		return !errors.Is(lerr, partition.ErrNotLeader)
	})
	if err != nil {
		return 0, err
	}
	if resp == nil {
		return first, lerr
	}
	return resp.First, fromWireErr(resp.Err)
}

// leaseOn leases from partition p of t, wherever it lives.
//
// A forwarded ask waits up to bound for the holder's answer (remoteCallTimeout at most).
func (b *Broker) leaseOn(ctx context.Context, t *topic, p, limit int, vis time.Duration, maxBytes int, bound time.Duration) ([]partition.Delivery, error) {
	var ds []partition.Delivery
	var lerr error
	req := b.dataReq(t, dataLease, p)
	req.Limit, req.DurationMs, req.MaxBytes, req.Principal = limit, vis.Milliseconds(), maxBytes, principalOf(ctx)
	req.Bin, req.Attend = true, true
	// Once sent, the lease is taken on the holder whether or not the client stays: wait
	// for the answer (within remoteCallTimeout), so the caller can hand back what a gone
	// client was leased instead of leaving it hidden for a visibility timeout.
	rctx := context.WithoutCancel(ctx)
	var until time.Time
	if bound < remoteCallTimeout {
		// The bound is the budget of the leases held: it ends every try route makes
		// (a replicated partition's leader is looked for up to leaseLeaderWait, and a
		// local ask that met not-leader goes on to the leader), not each one.
		until = time.Now().Add(bound)
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(rctx, until)
		defer cancel()
	}
	resp, err := b.route(rctx, t, p, req, min(bound, remoteCallTimeout), func(lp *partition.Partition) bool {
		if until.IsZero() {
			ds, lerr = leaseLocal(t.name, p, lp, limit, vis, maxBytes)
			return !errors.Is(lerr, partition.ErrNotLeader)
		}
		// Leases of other partitions are held: a partition served here waits no
		// longer than their budget either, as a forwarded ask does. Its lease may wait
		// for a confirmation from its group (on a slow disk, seconds), and the answer
		// waited with it: a lease taken before it lapsed meanwhile and was handed out
		// dead, its message already leased to another consumer. One taken here after
		// the wait ends is handed back at once (uncounted): nobody got it.
		type leased struct {
			ds  []partition.Delivery
			err error
		}
		var mu sync.Mutex
		abandoned := false
		done := make(chan leased, 1)
		go func() {
			ds, err := leaseLocal(t.name, p, lp, limit, vis, maxBytes)
			mu.Lock()
			if !abandoned {
				done <- leased{ds, err}
				mu.Unlock()
				return
			}
			mu.Unlock()
			b.handBackUnsent(t, p, lp, ds)
		}()
		timer := time.NewTimer(time.Until(until))
		defer timer.Stop()
		select {
		case l := <-done:
			ds, lerr = l.ds, l.err
			return !errors.Is(lerr, partition.ErrNotLeader)
		case <-timer.C:
			mu.Lock()
			select {
			case l := <-done: // it came as the wait ended
				mu.Unlock()
				ds, lerr = l.ds, l.err
				return !errors.Is(lerr, partition.ErrNotLeader)
			default:
			}
			abandoned = true
			mu.Unlock()
			lerr = fmt.Errorf("%w: partition %d did not lease within the consume's budget (%v)", ErrOutcomeUnknown, p, bound)
			return true
		}
	})
	if err != nil {
		if !until.IsZero() && rctx.Err() != nil {
			return nil, fmt.Errorf("%w: partition %d was not leased within the consume's budget (%v): %w", ErrOutcomeUnknown, p, bound, err)
		}
		return nil, err
	}
	if resp == nil {
		return ds, lerr
	}
	if resp.Err == nil {
		t.att.heard(p, resp.Attended, mono())
	}
	return resp.Deliveries, fromWireErr(resp.Err)
}

// handBackUnsent hands back leases of partition p, held here as lp, taken for a
// consume that had stopped waiting for them (its budget cut the ask, or its client
// went): nobody got them, so they are deliverable again at once and count as no
// delivery attempt.
func (b *Broker) handBackUnsent(t *topic, p int, lp *partition.Partition, ds []partition.Delivery) {
	if len(ds) == 0 {
		return
	}
	t.metrics.tooLate.Add(float64(len(ds)))
	b.log.Info("leases taken after their consume stopped waiting are handed back", "topic", t.name, "partition", p, "leases", len(ds))
	for _, d := range ds {
		if herr := lp.HandBack(d.Record.Offset, d.Nonce); herr != nil && !errors.Is(herr, queue.ErrLeaseLost) {
			b.log.Warn("handing back a lease taken after its consume stopped waiting failed; the message is delivered again after its visibility timeout",
				"topic", t.name, "partition", p, "offset", d.Record.Offset, "err", herr)
		}
	}
}

// leaseLocal leases from partition p of topic, held here.
func leaseLocal(topic string, p int, lp *partition.Partition, limit int, vis time.Duration, maxBytes int) ([]partition.Delivery, error) {
	if h := localLeaseHook.Load(); h != nil {
		(*h)(topic, p)
	}
	ds, err := lp.Lease(limit, vis, maxBytes)
	if h := localLeasedHook.Load(); h != nil {
		(*h)(topic, p)
	}
	return ds, err
}

// localLeaseHook and localLeasedHook, set only by serial tests (never with t.Parallel),
// run before and after a lease of a partition held here (a slow one: its group's
// confirmation waiting on a slow disk, before or after the grant).
var localLeaseHook, localLeasedHook atomic.Pointer[func(topic string, p int)]

// settleOn settles leases of partition p of t, wherever it lives.
func (b *Broker) settleOn(t *topic, p int, reqs []partition.SettleReq) []error {
	var lerrs []error
	req := b.dataReq(t, dataSettle, p)
	req.Settles = reqs
	errs := make([]error, len(reqs))
	resp, err := b.route(context.Background(), t, p, req, remoteCallTimeout, func(lp *partition.Partition) bool {
		lerrs = lp.Settle(reqs)
		return !slices.ContainsFunc(lerrs, notLeaderOnly)
	})
	if err == nil && resp == nil {
		return lerrs
	}
	if err == nil && resp.Err != nil {
		// The holder refused the whole request (the topic is deleted there, or it has
		// not caught up with it): nothing was settled, for the reason it gives.
		err = fromWireErr(resp.Err)
	} else if err == nil && len(resp.Errs) != len(reqs) {
		err = fmt.Errorf("%w: the node holding partition %d answered %d results for %d settles", ErrOutcomeUnknown, p, len(resp.Errs), len(reqs))
	}
	for i := range errs {
		if err != nil {
			errs[i] = err
		} else {
			errs[i] = fromWireErr(resp.Errs[i])
		}
	}
	return errs
}

// notLeaderOnly reports whether a settle's result is "not the leader, nothing done":
// an unknown outcome that also says not-leader may have been applied, and must not
// be sent to the leader again (where it would meet 410).
func notLeaderOnly(e error) bool {
	return errors.Is(e, partition.ErrNotLeader) && !errors.Is(e, partition.ErrOutcomeUnknown)
}

// extendOn extends (or, with d 0, hands back) a lease of partition p of t.
func (b *Broker) extendOn(t *topic, p int, off uint64, n queue.Nonce, d time.Duration, kind string) error {
	var lerr error
	req := b.dataReq(t, kind, p)
	req.Offset, req.Nonce, req.DurationMs = off, n, d.Milliseconds()
	resp, err := b.route(context.Background(), t, p, req, remoteCallTimeout, func(lp *partition.Partition) bool {
		if kind == dataHandBack {
			lerr = lp.HandBack(off, n)
		} else {
			lerr = lp.Extend(off, n, d)
		}
		return !errors.Is(lerr, partition.ErrNotLeader)
	})
	if err != nil {
		return err
	}
	if resp == nil {
		return lerr
	}
	return fromWireErr(resp.Err)
}

// partRead is what a replay read of one partition got: the records from start on
// (start is where the read began, past the damaged records it skipped when it got no
// record), the offsets of the damaged records it skipped, and the partition's counters.
type partRead struct {
	recs    []segment.Record
	start   uint64
	damaged []uint64
	st      queue.Stats
}

// readOn reads up to max records of partition p from offset from (or from the first
// at or after fromTimeMs, when that is later), wherever the partition is led.
func (b *Broker) readOn(ctx context.Context, t *topic, p int, from uint64, fromTimeMs *int64, max int, skipDamaged bool) (partRead, error) {
	var got partRead
	var lerr error
	req := b.dataReq(t, dataRead, p)
	req.Offset, req.FromTimeMs, req.Limit, req.Principal, req.SkipDamaged = from, fromTimeMs, max, principalOf(ctx), skipDamaged
	resp, err := b.route(ctx, t, p, req, remoteCallTimeout, func(lp *partition.Partition) bool {
		got, lerr = b.readLocal(t, p, lp, from, fromTimeMs, max, skipDamaged)
		return true
	})
	if err != nil && (errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown)) && t.parts()[p] != nil && ctx.Err() == nil {
		// No leader can be reached (a majority of the replicas is down): a replica
		// here serves what it has applied, which was all committed, so a replay still
		// answers, up to where this replica knows the partition's messages.
		return b.readLocal(t, p, t.parts()[p], from, fromTimeMs, max, skipDamaged)
	}
	if err != nil {
		return partRead{}, err
	}
	if resp == nil {
		return got, lerr
	}
	got = partRead{recs: resp.Records, start: resp.Start, damaged: resp.Damaged}
	if resp.Stats != nil {
		got.st = *resp.Stats
	}
	return got, fromWireErr(resp.Err)
}

// readLocal reads partition i of t, held here as p, for a replay. With skipDamaged a
// damaged record the read meets first is skipped and named (up to limit of them), and
// the read goes on after it; not on a replica of a group that holds other copies: it is
// marked to be rebuilt from them and hands its leadership over (damagedOnReplica), and
// the reader's retry reads an intact copy from the next leader.
func (b *Broker) readLocal(t *topic, i int, p *partition.Partition, from uint64, fromTimeMs *int64, limit int, skipDamaged bool) (partRead, error) {
	if p.Failed() {
		return partRead{start: from}, errFailedReplica
	}
	if fromTimeMs != nil {
		o, err := p.OffsetForTime(*fromTimeMs)
		if err != nil {
			return partRead{start: from}, err
		}
		from = max(from, o)
	}
	recs, err := p.Read(from, limit)
	var damaged []uint64
	for skipDamaged && errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 && len(damaged) < limit && !t.damagedOnReplica(i) {
		// The read began at the damaged record (at the oldest one held, when from is
		// below it): what it returned before one comes back without an error.
		at := max(from, p.Stats().Oldest)
		b.metrics.Damaged.WithLabelValues(t.name, "replay").Inc()
		b.log.Warn("a replay read past a damaged message; it is never served", "topic", t.name, "partition", i, "offset", at, "err", err)
		damaged = append(damaged, at)
		from = at + 1
		recs, err = p.Read(from, limit)
	}
	if len(damaged) > 0 && len(recs) == 0 && errors.Is(err, partition.ErrCorrupt) {
		err = nil // limit of them skipped: the next read goes on from here
	}
	return partRead{recs: recs, start: from, damaged: damaged, st: p.Stats()}, err
}

// statsOf returns the counters of partition p of t, wherever it lives.
func (b *Broker) statsOf(ctx context.Context, t *topic, p int) (queue.Stats, error) {
	st, _, err := b.statsAndReplicas(ctx, t, p)
	return st, err
}

// errFailedReplica answers for the counters of a leader whose replica failed a write:
// its state stopped there, so they would be stale markers (a high watermark below what
// its group committed). It hands its leadership over within moments.
var errFailedReplica = fmt.Errorf("%w: the replica leading this partition failed a write and hands its leadership over", ErrUnavailable)

// localStats is the counters and replication state of partition i of t, led here by
// lp; errFailedReplica when lp failed a write.
func (b *Broker) localStats(t *topic, i int, lp *partition.Partition) (queue.Stats, *ReplicaInfo, error) {
	if lp.Failed() {
		return queue.Stats{}, nil, errFailedReplica
	}
	return lp.Stats(), b.localReplicaInfo(t, i), nil
}

// statsConfirmWait bounds how long a leader takes to confirm that it still leads
// before it answers for its partition's counters; one that cannot by then is taken for
// one that does not (a confirmation is one round to its followers).
const statsConfirmWait = 2 * time.Second

// leaderStats is localStats for partition i of t led here by lp, once lp confirmed
// that it still leads (partition.ConfirmLeading: under its leader lease, without a
// round); an error wrapping partition.ErrNotLeader when it could not, and the caller
// asks the leader the group has now. A leader starved past its election timeout (a
// disk stall froze its process for two seconds in a chaos run) answered from its old
// term on resuming: a high watermark and a frontier behind those its successor had
// already answered.
func (b *Broker) leaderStats(ctx context.Context, t *topic, i int, lp *partition.Partition) (queue.Stats, *ReplicaInfo, error) {
	st, ri, err := b.localStats(t, i, lp)
	if err != nil {
		return queue.Stats{}, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, statsConfirmWait)
	defer cancel()
	if err := lp.ConfirmLeading(cctx); err != nil {
		return queue.Stats{}, nil, err
	}
	return st, ri, nil
}

// statsAndReplicas is statsOf with, for a replicated partition, its replication state
// as its leader sees it.
func (b *Broker) statsAndReplicas(ctx context.Context, t *topic, p int) (queue.Stats, *ReplicaInfo, error) {
	var st queue.Stats
	var ri *ReplicaInfo
	var lerr error
	resp, err := b.route(ctx, t, p, b.dataReq(t, dataStats, p), remoteCallTimeout, func(lp *partition.Partition) bool {
		st, ri, lerr = b.leaderStats(ctx, t, p, lp)
		if errors.Is(lerr, partition.ErrNotLeader) {
			lerr = nil
			return false // deposed: the route asks the leader the group has now
		}
		return true
	})
	if err == nil {
		err = lerr
	}
	if err != nil {
		return queue.Stats{}, nil, err
	}
	if resp == nil {
		return st, ri, nil
	}
	if err := fromWireErr(resp.Err); err != nil {
		return queue.Stats{}, nil, err
	}
	if resp.Stats == nil {
		return queue.Stats{}, nil, fmt.Errorf("%w: node %q sent no counters", ErrOutcomeUnknown, b.holderOf(t, p))
	}
	return *resp.Stats, resp.Repl, nil
}

// remoteLag asks the node holding partition i of parent pt how far child m's copy
// of it is behind (that node runs the copy).
func (b *Broker) remoteLag(pt *topic, i int, m meta.Topic) (ChildLag, error) {
	req := b.dataReq(pt, dataLag, i)
	req.Child, req.ChildInc, req.AttachID = m.Name, m.Incarnation, m.AttachID
	resp, err := b.call(context.Background(), b.holderOf(pt, i), req, remoteCallTimeout)
	if err != nil {
		return ChildLag{}, err
	}
	if err := fromWireErr(resp.Err); err != nil {
		return ChildLag{}, err
	}
	if resp.Lag == nil {
		return ChildLag{}, fmt.Errorf("%w: node %q sent no lag", ErrOutcomeUnknown, b.holderOf(pt, i))
	}
	return *resp.Lag, nil
}

// allStats returns every partition's counters, asking the holders in parallel. A
// partition whose holder cannot answer has its error in errs.
func (b *Broker) allStats(ctx context.Context, t *topic) ([]queue.Stats, []error) {
	out, _, errs := b.allStatsAndReplicas(ctx, t)
	return out, errs
}

// allStatsAndReplicas is allStats with each replicated partition's ReplicaInfo. Once the
// cluster version allows it, it asks each other node for all its partitions in one
// stats_batch request; a partition that request did not answer (the node does not lead
// it any more, or could not be asked) is asked for on its own, as before.
func (b *Broker) allStatsAndReplicas(ctx context.Context, t *topic) ([]queue.Stats, []*ReplicaInfo, []error) {
	out := make([]queue.Stats, len(t.parts()))
	ris := make([]*ReplicaInfo, len(t.parts()))
	errs := make([]error, len(t.parts()))
	var led []int32
	var remote []int
	for i := range t.parts() {
		if t.leads(i) {
			led = append(led, int32(i))
		} else {
			remote = append(remote, i)
		}
	}
	for k, a := range b.ledStats(ctx, t, led) {
		i := int(led[k])
		if errors.Is(a.err, partition.ErrNotLeader) {
			remote = append(remote, i) // deposed since: asked of the leader
			continue
		}
		out[i], ris[i], errs[i] = a.st, a.ri, a.err
	}
	if b.meta.Allows(meta.FeatureStatsBatch) {
		remote = b.statsBatches(ctx, t, remote, out, ris)
	}
	var wg sync.WaitGroup
	for _, i := range remote {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], ris[i], errs[i] = b.statsAndReplicas(ctx, t, i)
		}()
	}
	wg.Wait()
	return out, ris, errs
}

// statsBatches asks every node that leads some of parts for their counters in one
// stats_batch request each, in parallel, fills out and ris with the answers, and
// returns the partitions left unanswered.
func (b *Broker) statsBatches(ctx context.Context, t *topic, parts []int, out []queue.Stats, ris []*ReplicaInfo) []int {
	byNode := map[string][]int32{}
	var left []int
	for _, i := range parts {
		if node := b.holderOf(t, i); node != "" {
			byNode[node] = append(byNode[node], int32(i))
		} else {
			left = append(left, i) // no leader known now: routed on its own
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for node, ps := range byNode {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := b.dataReq(t, dataStatsBatch, int(ps[0]))
			req.Parts = ps
			answered := map[int32]bool{}
			resp, err := b.call(ctx, node, req, remoteCallTimeout)
			if err == nil && resp.Err != nil && resp.Err.Code != "not_leader" && resp.Err.Code != "unavailable" {
				// Not a node that moved on: one that refused the operation itself (it
				// should never meet it unless it speaks it). Each partition is asked
				// for on its own below.
				b.log.Warn("a stats_batch was refused by the node holding the partitions; asking for each partition instead", "node", node, "topic", t.name, "err", resp.Err.Msg)
			}
			if err == nil && resp.Err == nil {
				for _, a := range resp.Batch {
					if a.Err == nil && a.Stats != nil && a.Part >= 0 && int(a.Part) < len(out) && slices.Contains(ps, a.Part) {
						out[a.Part], ris[a.Part] = *a.Stats, a.Repl
						answered[a.Part] = true
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, p := range ps {
				if !answered[p] {
					left = append(left, int(p))
				}
			}
		}()
	}
	wg.Wait()
	return left
}

// serveStatsBatch answers a stats_batch: per partition its counters and replication
// state, or not_leader with the leader this node knows.
func (b *Broker) serveStatsBatch(ctx context.Context, t *topic, req *dataReq) *dataResp {
	var resp dataResp
	for k, got := range b.ledStats(ctx, t, req.Parts) {
		a := partStats{Part: req.Parts[k]}
		if got.err != nil {
			a.Err = b.notLeader(t, int(a.Part), got.err)
		} else {
			a.Stats, a.Repl = &got.st, got.ri
		}
		resp.Batch = append(resp.Batch, a)
	}
	return &resp
}

// ledAnswer is one partition's counters as ledStats gets them.
type ledAnswer struct {
	st  queue.Stats
	ri  *ReplicaInfo
	err error
}

// ledStats is leaderStats of each of parts of t, in parts' order; an error wrapping
// partition.ErrNotLeader for one not led here. Those that must confirm with a round
// (no leader lease) do so in parallel: one at a time, a topic's read could wait a
// confirmation bound per partition.
func (b *Broker) ledStats(ctx context.Context, t *topic, parts []int32) []ledAnswer {
	out := make([]ledAnswer, len(parts))
	var wg sync.WaitGroup
	for k, i := range parts {
		// One look at the replica: it may leave this node (a move) between two.
		lp := t.parts()[i]
		if lp == nil || !lp.Leading() {
			out[k].err = partition.ErrNotLeader
			continue
		}
		if !lp.Replicated() {
			out[k].st, out[k].ri, out[k].err = b.leaderStats(ctx, t, int(i), lp) // no round
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[k].st, out[k].ri, out[k].err = b.leaderStats(ctx, t, int(i), lp)
		}()
	}
	wg.Wait()
	return out
}

// watchRemote makes sure a watch runs on every other node holding partitions of t
// while consumers wait on this node: a watch is a long request the holder answers when
// one of its partitions of t has a message ready, and it wakes the waiting consumers
// (t.sig) so they lease again. One watch per topic and holder serves every consumer
// waiting here. At most maxWatchesPerPeer run per holder (each holds one of the
// holder's request slots); consumers of a topic past that look again every
// remoteRecheck instead.
func (b *Broker) watchRemote(t *topic) {
	byNode := map[string][]int32{}
	for i := range t.parts() {
		if !t.leads(i) {
			byNode[b.holderOf(t, i)] = append(byNode[b.holderOf(t, i)], int32(i))
		}
	}
	for node, parts := range byNode {
		k := watchKey{topic: t.name, inc: t.incarnation, node: node}
		b.remote.mu.Lock()
		start := !b.remote.watch[k] && b.remote.watches[node] < maxWatchesPerPeer
		if start {
			b.remote.watch[k] = true
			b.remote.watches[node]++
		}
		b.remote.mu.Unlock()
		if start {
			go b.watch(t, k, parts)
		}
	}
}

const (
	// maxWatchesPerPeer bounds the watches one node runs on another.
	maxWatchesPerPeer = 64
	// remoteRecheck is how often a waiting consume of a topic with partitions on other
	// nodes leases again without being woken (a watch that could not run, or failed).
	remoteRecheck = time.Second
)

// watch runs one topic's watch on one holder while consumers of the topic wait here.
// It ends with the node (b.stop), the topic's incarnation, or the last waiting
// consumer; Close does not wait for it (it only wakes consumers).
func (b *Broker) watch(t *topic, k watchKey, parts []int32) {
	defer func() {
		b.remote.mu.Lock()
		delete(b.remote.watch, k)
		b.remote.watches[k.node]--
		b.remote.mu.Unlock()
		// A consume that parked after the loop saw none waiting found this watch
		// still registered and started none: start the next one for it.
		if t.waiting.Load() > 0 && !closed(t.done) && !closed(b.stop) {
			b.watchRemote(t)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-t.done:
		case <-b.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	for t.waiting.Load() > 0 && ctx.Err() == nil {
		req := b.dataReq(t, dataWait, int(parts[0]))
		req.Parts, req.DurationMs = parts, remoteWaitFor.Milliseconds()
		resp, err := b.call(ctx, k.node, req, remoteWaitFor+remoteCallTimeout)
		switch {
		case err == nil && resp.Err == nil:
			if resp.Ready {
				t.sig.broadcast()
			}
			continue
		case ctx.Err() != nil:
			return
		}
		// The holder is down or refused: its partitions cannot be leased now anyway.
		// Look again after a pause, and wake the consumers then, in case it came back
		// with messages ready.
		select {
		case <-time.After(remoteDownFor):
			t.sig.broadcast()
		case <-ctx.Done():
			return
		}
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// HandleData runs a partition operation another node forwarded to this node, which
// holds the partition (the node plane's data operation).
func (b *Broker) HandleData(ctx context.Context, body []byte) ([]byte, error) {
	var req dataReq
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("a data request could not be read: %w", err)
	}
	resp := b.serveData(ctx, &req)
	return encodeAnswer(&req, resp)
}

func (b *Broker) serveData(ctx context.Context, req *dataReq) *dataResp {
	if req.Kind == dataApplied && b.meta.Speaks(meta.FeatureDeleteFence) {
		return &dataResp{Err: toWireErr(b.awaitReconciled(ctx, req.Index))}
	}
	t, err := b.heldTopic(ctx, req)
	if err != nil {
		if t != nil {
			return &dataResp{Err: b.notLeader(t, int(req.Partition), err)}
		}
		return &dataResp{Err: toWireErr(err)}
	}
	if req.Kind == dataStatsBatch && b.meta.Speaks(meta.FeatureStatsBatch) {
		return b.serveStatsBatch(ctx, t, req)
	}
	p := t.parts()[req.Partition]
	if p == nil {
		// It left this node (a move's reconcile) since heldTopic looked.
		if b.replicated(t.cur.Load(), int(req.Partition)) {
			return &dataResp{Err: b.notLeader(t, int(req.Partition), partition.ErrNotLeader)}
		}
		return &dataResp{Err: toWireErr(fmt.Errorf("%w: partition %d of topic %q left node %q", ErrUnavailable, req.Partition, req.Topic, b.opts.NodeID))}
	}
	var resp dataResp
	if req.Kind == dataReplicaRead {
		// Every replica's log holds only committed records, at the same offsets.
		resp.Records, err = p.ReplicaRead(req.Offset, min(max(req.Limit, 1), replicaReadLimit))
		if gone := (*partition.AgedOutError)(nil); errors.As(err, &gone) {
			// Nothing held from there on, all of it aged out: Start says from where
			// (a node of an earlier version answers no records and no Start).
			resp.Start, err = gone.Oldest, nil
		}
		resp.Err = toWireErr(err)
		return &resp
	}
	if !p.Leading() {
		// A replica that does not lead serves nothing: the caller follows the hint.
		resp.Err = b.notLeader(t, int(req.Partition), partition.ErrNotLeader)
		return &resp
	}
	switch req.Kind {
	case dataAppend:
		if req.AttachID != 0 {
			// A fan-out copy: only for the child's attachment as it stands.
			if _, err = b.childAsOf(ctx, req); err != nil {
				b.log.Warn("a fan-out copy for an attachment the child no longer has was refused", "child", t.name, "attach_id", req.AttachID, "err", err)
				break
			}
		}
		resp.First, err = p.Append(req.Records)
		if err != nil {
			b.log.Warn("a forwarded append failed", "topic", t.name, "partition", req.Partition, "principal", req.Principal, "err", err)
		}
	case dataLease:
		resp.Deliveries, err = p.Lease(req.Limit, time.Duration(req.DurationMs)*time.Millisecond, req.MaxBytes)
		if len(resp.Deliveries) > 0 && ctx.Err() != nil {
			// The caller stopped waiting while they were taken (the consume's budget
			// cut the ask, or its client went): nobody gets them. Until 6 December
			// they stayed hidden for the visibility timeout and then counted a
			// delivery attempt nobody had. (One the caller gives up on after this
			// check is still hidden so: the window is the answer's way back.)
			go b.handBackUnsent(t, int(req.Partition), p, resp.Deliveries)
			resp.Deliveries, err = nil, fmt.Errorf("%w: the caller stopped waiting for the lease", ErrOutcomeUnknown)
			break
		}
		resp.Attended = req.Attend && t.att.attended(mono())
	case dataSettle:
		errs := p.Settle(req.Settles)
		if slices.ContainsFunc(errs, notLeaderOnly) {
			// Nothing of it was done (a replica that does not lead, or hands over, or
			// whose proposal raft dropped, settles none of the batch): answered as the
			// request's not-leader, which the entry node's routing follows to the
			// leader, as it does for a settle of its own replica (settleOn). As one
			// entry's result it read as 503 unavailable, and an ack reaching a leader
			// during its handover through another node was never sent on.
			err = partition.ErrNotLeader
			break
		}
		for _, e := range errs {
			resp.Errs = append(resp.Errs, toWireErr(e))
		}
	case dataExtend:
		err = p.Extend(req.Offset, req.Nonce, time.Duration(req.DurationMs)*time.Millisecond)
	case dataHandBack:
		err = p.HandBack(req.Offset, req.Nonce)
	case dataRead:
		var got partRead
		got, err = b.readLocal(t, int(req.Partition), p, req.Offset, req.FromTimeMs, req.Limit, req.SkipDamaged)
		resp.Records, resp.Start, resp.Damaged, resp.Stats = got.recs, got.start, got.damaged, &got.st
	case dataStats:
		var st queue.Stats
		if req.Group != "" {
			// A takeover's survivor, asked for its log's end: the replica leading
			// that group, whatever the placement says.
			if p, err = b.inGroup(t, int(req.Partition), req.Group); err != nil {
				break
			}
			st, resp.Repl, err = b.localStats(t, int(req.Partition), p)
		} else {
			st, resp.Repl, err = b.leaderStats(ctx, t, int(req.Partition), p)
		}
		if err == nil {
			resp.Stats = &st
		}
	case dataLag:
		var m meta.Topic
		if m, err = b.childAsOf(ctx, req); err == nil {
			l := b.localLag(t, int(req.Partition), m)
			resp.Lag = &l
		}
	case dataWait:
		resp.Ready, err = b.waitReady(ctx, t, req.Parts, time.Duration(req.DurationMs)*time.Millisecond)
	default:
		err = fmt.Errorf("unknown data request %q (a newer node sent it)", req.Kind)
	}
	if err != nil && errors.Is(err, partition.ErrClosed) && b.closing.Load() {
		err = errors.Join(ErrUnavailable, err)
	}
	resp.Err = b.notLeader(t, int(req.Partition), err)
	return &resp
}

// inGroup returns the replica of partition i of t held here while it leads group, or
// ErrNotLeader: the replica held here is of another group (the placement changed and
// this node has not followed it yet), or does not lead.
func (b *Broker) inGroup(t *topic, i int, group string) (*partition.Partition, error) {
	if b.repl == nil {
		return nil, partition.ErrNotLeader
	}
	// The group first: once it leads here, the replica of an earlier group is closed.
	if info, ok := b.repl.host.Info(group); !ok || !info.Leader {
		return nil, partition.ErrNotLeader
	}
	if lp := t.parts()[i]; lp != nil && lp.Leading() && t.gid(i) == group {
		return lp, nil
	}
	return nil, partition.ErrNotLeader
}

// heldTopic finds the topic incarnation a forwarded request names, waiting a little
// for this node's metadata when the request is for an incarnation it has not applied
// yet (the entry node saw the create first).
func (b *Broker) heldTopic(ctx context.Context, req *dataReq) (*topic, error) {
	deadline := time.Now().Add(holderCatchUp)
	for {
		wake := b.reconciled.wait()
		t, err := b.lookupLocal(req.Topic)
		switch {
		case err == nil && t.incarnation == req.Incarnation:
			ps := append([]int32{req.Partition}, req.Parts...)
			for _, p := range ps {
				if p < 0 || int(p) >= len(t.parts()) {
					return nil, fmt.Errorf("%w: partition %d of topic %q is not held by node %q", ErrUnavailable, p, req.Topic, b.opts.NodeID)
				}
				if t.parts()[p] == nil {
					if b.replicated(t.cur.Load(), int(p)) {
						// Sent here on a stale hint: point the caller at the leader.
						return t, fmt.Errorf("%w: node %q holds no replica of partition %d of topic %q", partition.ErrNotLeader, b.opts.NodeID, p, req.Topic)
					}
					return nil, fmt.Errorf("%w: partition %d of topic %q is not held by node %q", ErrUnavailable, p, req.Topic, b.opts.NodeID)
				}
			}
			return t, nil
		case err == nil && t.incarnation > req.Incarnation:
			return nil, errRecreated(req.Topic)
		case err != nil && !errors.Is(err, ErrTopicNotFound):
			return nil, err
		}
		// Not open here, or an older incarnation: deleted since, or not opened yet.
		if m, ok := b.meta.Topic(req.Topic); ok && m.Incarnation > req.Incarnation {
			return nil, errRecreated(req.Topic)
		} else if !ok && b.meta.AppliedIndex() >= req.Incarnation {
			return nil, fmt.Errorf("%w: the incarnation of topic %q the request was for is deleted", ErrTopicNotFound, req.Topic)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: node %q has not caught up with topic %q yet", ErrUnavailable, b.opts.NodeID, req.Topic)
		}
		if err := b.awaitReconcile(ctx, wake); err != nil {
			return nil, err
		}
	}
}

// errRecreated answers a request for an incarnation of a topic that was deleted and
// created again: the entry node's metadata is behind. The topic exists, so the answer
// is "retry" (the entry node catches up within moments), not a 404 for a topic the
// client may have just created.
func errRecreated(topic string) error {
	return fmt.Errorf("%w: %w: topic %q was deleted and created again and the node this request came through has not caught up yet", ErrUnavailable, ErrTopicRecreated, topic)
}

// notGoneIfRecreated answers for err, met while serving topic t: a "topic not found"
// that this node took from its own view of t's incarnation (the holder of that
// incarnation deleted it, or its partition closed for the delete: closedErr) while the
// name exists again as a newer incarnation is a 503 to retry, not a 404 that tells the
// client a topic it may use is gone. This node may be behind (it was paused, or cut
// off), so it catches up with the controller first; if it cannot, the answer is 503 too.
func (b *Broker) notGoneIfRecreated(t *topic, err error) error {
	if err == nil || b.opts.Peers == nil || !errors.Is(err, ErrTopicNotFound) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), syncBound)
	defer cancel()
	var answer error
	if serr := b.meta.Sync(ctx); serr != nil {
		answer = fmt.Errorf("%w: %w (topic %q): %w", ErrUnavailable, ErrTopicGoneUnconfirmed, t.name, serr)
	} else if m, ok := b.meta.Topic(t.name); ok && m.Incarnation != t.incarnation {
		answer = errRecreated(t.name)
	} else {
		return err
	}
	// A batch part of which was stored (in the deleted incarnation, where a consumer
	// may have been given it before the delete) must still say so: read as a plain
	// "retry", it would be sent again as if nothing had been stored (a chaos run in
	// namespaces, seed 2451626300, while no controller was known).
	var part *PartlyStoredError
	if errors.As(err, &part) {
		return errors.Join(part, answer)
	}
	return answer
}

// errAttachChanged answers a request made for an attachment of child that is not the
// child's any more: it was detached, or attached again, or deleted.
func errAttachChanged(child string) error {
	return fmt.Errorf("%w: child %q was detached or attached again since the request was made", ErrUnavailable, child)
}

// childAsOf returns the child a lag request or a fan-out copy names, waiting a little for this node's
// metadata to reach the attach the entry node saw.
func (b *Broker) childAsOf(ctx context.Context, req *dataReq) (meta.Topic, error) {
	deadline := time.Now().Add(holderCatchUp)
	for {
		wake := b.reconciled.wait()
		m, ok := b.meta.Topic(req.Child)
		if ok && m.Incarnation == req.ChildInc && m.AttachID == req.AttachID {
			return m, nil
		}
		// Incarnations and attach ids are the indexes of the commands that made them.
		if b.meta.AppliedIndex() >= max(req.ChildInc, req.AttachID) {
			return meta.Topic{}, errAttachChanged(req.Child)
		}
		if time.Now().After(deadline) {
			return meta.Topic{}, fmt.Errorf("%w: node %q has not caught up with child %q yet", ErrUnavailable, b.opts.NodeID, req.Child)
		}
		if err := b.awaitReconcile(ctx, wake); err != nil {
			return meta.Topic{}, err
		}
	}
}

// waitReady answers a watch: true as soon as one of parts has a message to lease, or
// has left this node (moved off, or closed to be reopened in a new group: the waiting
// consumers look again and find it where it is now), false when d passed first.
func (b *Broker) waitReady(ctx context.Context, t *topic, parts []int32, d time.Duration) (bool, error) {
	timer := time.NewTimer(min(d, remoteWaitFor))
	defer timer.Stop()
	for {
		wake := t.sig.wait()
		for _, p := range parts {
			if lp := t.parts()[p]; lp == nil || lp.Available() {
				return true, nil
			}
		}
		select {
		case <-wake:
		case <-timer.C:
			return false, nil
		case <-ctx.Done():
			return false, nil
		case <-t.done:
			return false, ErrTopicNotFound
		case <-b.draining:
			return false, ErrUnavailable
		}
	}
}
