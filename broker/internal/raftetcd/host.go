// Package raftetcd hosts many etcd-io/raft groups (one per partition) in one node
// process over the node plane: one clock for every group, every raft message to a peer
// coalesced into one frame, node liveness as one heartbeat per node pair, and idle
// groups quiesced so they cost nothing between writes. It is the replication spike's
// second engine (the first is raftnet with hashicorp/raft); see
// docs/internals/replication.md for what it measured and why it was built.
package raftetcd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// Operations this package serves on the node plane (raftnet uses 0x0201–0x0202).
const (
	// OpBatch carries raft messages of many groups from one node to one peer
	// (codec.go). The answer is empty.
	OpBatch uint16 = 0x0203
	// OpLiveness is the node-pair heartbeat: the caller's raft id (u64) in, the
	// callee's, its wall clock (u64 Unix nanoseconds), its start id (u64) and a byte of
	// flags (livenessDiskStalled) out; older nodes answer a prefix of that. A success
	// proves both ends alive.
	OpLiveness uint16 = 0x0204
)

// Defaults of Options.
const (
	DefaultTick             = 100 * time.Millisecond
	DefaultElectionTick     = 10 // 1 s with the default tick
	DefaultHeartbeatTick    = 1
	DefaultLivenessInterval = 250 * time.Millisecond
	DefaultLivenessTimeout  = time.Second
	DefaultSnapshotEvery    = 10_000
	DefaultSnapshotKeep     = 2_048
	sendTimeout             = time.Second
)

// Options configures a Host.
type Options struct {
	// Node is the node plane the host registers its operations on.
	Node *transport.Node
	// ID is this node's raft id (not 0); Peers maps every voter's raft id, this
	// node's included, to its node-plane address.
	ID    uint64
	Peers map[uint64]string
	// Dir holds each group's log; Sync is the node's shared sync round.
	Dir  string
	Sync *vfs.SyncGroup
	// WAL, when set, is the node's write-ahead file (StoreRaftstore only): the groups'
	// logs commit their appends and durable state writes to it instead of syncing
	// their files (raftstore.Options.WAL). Its root must hold Dir.
	WAL WAL
	// FS is the file system of the groups' logs (StoreRaftstore only); nil means the
	// operating system's. Tests put a cluster on vfs.Mem to cut its power.
	FS vfs.FS
	// Store picks the groups' log store: StoreWAL (the default) or StoreRaftstore.
	Store string
	// ParallelAppend lets a leader send its new entries to its followers while it
	// writes them itself, instead of after (the serial Ready loop).
	ParallelAppend bool
	// AsyncStorageWrites runs each group's log writes on a worker of its own, off
	// the Ready loop (etcd-io/raft's Config.AsyncStorageWrites; see async.go). It
	// implies ParallelAppend.
	AsyncStorageWrites bool
	// WallClock is the wall clock, in Unix nanoseconds, this node stamps records
	// with: the liveness calls measure each peer's clock offset on it (nil:
	// time.Now). A node whose stamping clock is the wall clock read at its start plus
	// the monotonic time since parts from the machine's clock when the machine's
	// clock is stepped (a virtual machine paused and resumed, an NTP step): the
	// offset must show what the records carry.
	WallClock func() int64
	// Tick is the raft clock; ElectionTick and HeartbeatTick count in it.
	Tick                        time.Duration
	ElectionTick, HeartbeatTick int
	// A peer is live while it showed within LivenessTimeout that it hears this node: it
	// answered a call of this node's (a liveness call, or a frame of raft messages sent
	// as a call), or its frames carried answers to this node's raft messages. Its own
	// calls and requests here prove only that it sends, and a deaf peer must count
	// dead. Liveness calls go every LivenessInterval.
	LivenessInterval, LivenessTimeout time.Duration
	// NoQuiesce keeps every group ticking (for comparison).
	NoQuiesce bool
	// LazyHeartbeats holds heartbeats, their answers and appends that carry no entries
	// (a new commit index, a probe) for the next frame to their peer instead of sending
	// them at once, so an awake group's heartbeats to a peer share one frame per tick
	// with every other group's, and a commit index rides with the next entries. They
	// wait at most one tick.
	LazyHeartbeats bool
	// Apply is called with each committed proposal of a group, in log order, from
	// that group's goroutine. It must not call back into the host.
	Apply func(group string, index uint64, data []byte)
	// SnapshotEvery is how many entries a group applies between two snapshots of its
	// application (GroupConfig.Snapshot), each followed by the compaction of its log
	// up to SnapshotKeep entries before it. Defaults 10,000 and 2,048; a negative
	// SnapshotEvery turns snapshots off (the log then grows for ever). StoreRaftstore only.
	SnapshotEvery, SnapshotKeep int
	// SnapshotsAllowed, when set, must say yes before a group takes a snapshot (in a
	// cluster: once every member runs a version that can restore one).
	SnapshotsAllowed func() bool
	// Logger gets warnings. Default slog.Default().
	Logger *slog.Logger
	// DiskStalled, when set, reports whether this node's disk stalls now. Each
	// liveness answer tells the caller (PeerStalled), so that its leaders hand
	// leaderships to replicas on healthy disks rather than to this node's. Nothing in
	// raft changes: elections and handed leaderships are taken as always.
	DiskStalled func() bool

	// Tests: refuseStreams makes the host act as a node before message streams (it
	// takes frames as calls only); streamRetry replaces streamRetry.
	refuseStreams bool
	streamRetry   time.Duration
}

// Stats counts what went over the node plane.
type Stats struct {
	RPCCalls   uint64 // liveness calls sent
	BatchCalls uint64 // message frames sent (on message streams, or as calls)
	BatchItems uint64 // raft messages carried by those frames
	// StreamsOpened counts the message streams opened to peers: one per peer, and
	// another each time one broke.
	StreamsOpened uint64
	// ForcedCampaigns counts the elections this node started at once because a group's
	// leader was found dead (or restarted); LeadershipsWon the times a group here became
	// leader and began serving, by election or by a handed leadership.
	ForcedCampaigns uint64
	LeadershipsWon  uint64
	// LeaseServed counts the times a leader found its lease held when asked
	// (LeaseHeld: a consume served without a round to a quorum); LeaseRenewals the
	// read indexes asked to renew leases; VotesHeld the vote requests a replica
	// refused while it held its vote for its leader's lease.
	LeaseServed, LeaseRenewals, VotesHeld uint64
	// Quiesces counts the times a group led here fell asleep (its quiesce heartbeats
	// sent).
	Quiesces uint64
}

// PeerLiveness is what this node knows of another's liveness (Host.Peers).
type PeerLiveness struct {
	// Live: a call of this node's to the peer was answered within LivenessTimeout.
	Live bool
	// Lapses counts the times it was found dead, or found to have restarted, after
	// counting live: each makes the groups it led elect a new leader.
	Lapses uint64
}

// Host runs the groups of one node.
type Host struct {
	opts Options
	log  *slog.Logger
	// start is a random id of this start of the host, sent with every liveness answer:
	// a peer that sees it change knows the node restarted (see peer.start).
	start uint64
	pmu   sync.RWMutex
	peers map[uint64]*peer // every other node groups may reach (AddPeer)

	gmu    sync.RWMutex
	groups map[string]*group

	nextProposal atomic.Uint64
	rpcCalls     atomic.Uint64
	batchCalls   atomic.Uint64
	batchItems   atomic.Uint64
	// streamsOpened counts message streams opened to peers (Stats.StreamsOpened).
	streamsOpened atomic.Uint64
	forced        atomic.Uint64 // Stats.ForcedCampaigns
	won           atomic.Uint64 // Stats.LeadershipsWon
	leaseServed   atomic.Uint64 // Stats.LeaseServed
	leaseRenewals atomic.Uint64 // Stats.LeaseRenewals
	votesHeld     atomic.Uint64 // Stats.VotesHeld
	quiesces      atomic.Uint64 // Stats.Quiesces

	// lastTick is when tickOnce last ran (UnixNano; the ticker goroutine only).
	lastTick int64
	// clockStopped (tests) makes tickLoop skip its turns: nothing waits for a tick
	// then, and what waits for one (a lazy message) waits for good.
	clockStopped atomic.Bool

	quit     chan struct{}
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	isClosed bool
}

// peer is one other voter: its outbox and when it was last heard from.
type peer struct {
	id        uint64
	addr      string
	lastHeard atomic.Int64 // unix nanos
	// clockOffset is the peer's wall clock minus ours (nanoseconds), from the last
	// liveness call: its clock read halfway through the round trip. clockKnown says
	// whether one was measured.
	clockOffset atomic.Int64
	clockKnown  atomic.Bool
	// stalled is what the peer's last liveness answer said of its disk (PeerStalled).
	stalled atomic.Bool
	live    bool // the ticker's view, owned by the ticker goroutine
	// alive mirrors live for readers outside the ticker; lapses counts its falls
	// (PeerLiveness).
	alive  atomic.Bool
	lapses atomic.Uint64
	// start is the peer's start id from its last liveness answer (0: none yet, or an
	// older node that sends none); restarted is set when it changed, until the ticker
	// acts on it. A node back at its address within the liveness timeout was heard
	// all along, yet it lost every leadership and lease it had: the ticker treats it
	// as having died and come back.
	start     atomic.Uint64
	restarted atomic.Bool

	mu    sync.Mutex
	queue []outMsg
	kick  chan struct{}
	down  chan struct{} // closed when the peer is next found dead, then replaced
}

// New registers the host's operations on opts.Node and starts its clock, liveness and
// senders. Add groups with AddGroup; Close stops everything but the node.
func New(opts Options) (*Host, error) {
	if opts.Node == nil || opts.ID == 0 || opts.Sync == nil || opts.Dir == "" {
		return nil, errors.New("raftetcd: Options.Node, ID, Dir and Sync are required")
	}
	if opts.FS != nil && opts.Store != StoreRaftstore {
		return nil, errors.New("raftetcd: Options.FS needs StoreRaftstore (the prototype store writes the operating system's files)")
	}
	if opts.WAL != nil && opts.Store != StoreRaftstore {
		return nil, errors.New("raftetcd: Options.WAL needs StoreRaftstore")
	}
	if opts.FS == nil {
		opts.FS = vfs.OS{}
	}
	setDefault(&opts.Tick, DefaultTick)
	setDefault(&opts.ElectionTick, DefaultElectionTick)
	setDefault(&opts.HeartbeatTick, DefaultHeartbeatTick)
	setDefault(&opts.LivenessInterval, DefaultLivenessInterval)
	setDefault(&opts.LivenessTimeout, DefaultLivenessTimeout)
	setDefault(&opts.SnapshotEvery, DefaultSnapshotEvery)
	setDefault(&opts.SnapshotKeep, DefaultSnapshotKeep)
	setDefault(&opts.streamRetry, streamRetry)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.WallClock == nil {
		opts.WallClock = func() int64 { return time.Now().UnixNano() }
	}
	h := &Host{opts: opts, log: opts.Logger.With("component", "raftetcd"), peers: map[uint64]*peer{}, start: randomStart(),
		groups: map[string]*group{}, quit: make(chan struct{})}
	h.nextProposal.Store(opts.ID << 48)
	opts.Node.Handle(OpBatch, h.serveBatch)
	if !opts.refuseStreams {
		opts.Node.HandleMessages(OpBatch, h.serveStreamBatch)
	}
	opts.Node.Handle(OpLiveness, h.serveLiveness)
	for id, addr := range opts.Peers {
		h.AddPeer(id, addr)
	}
	h.wg.Add(1)
	go h.tickLoop()
	return h, nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// AddPeer makes node id reachable at addr (or moves it there). Groups send to peers
// only; a voter of a group that is not a peer yet is simply not reached until it is.
func (h *Host) AddPeer(id uint64, addr string) {
	if id == h.opts.ID || id == 0 {
		return
	}
	h.pmu.Lock()
	defer h.pmu.Unlock()
	if p := h.peers[id]; p != nil {
		p.mu.Lock()
		p.addr = addr
		p.mu.Unlock()
		return
	}
	if h.closed() {
		return
	}
	p := &peer{id: id, addr: addr, kick: make(chan struct{}, 1), down: make(chan struct{})}
	h.peers[id] = p
	h.wg.Add(2)
	go h.sendLoop(p)
	go h.livenessLoop(p)
}

func (h *Host) peer(id uint64) *peer {
	h.pmu.RLock()
	defer h.pmu.RUnlock()
	return h.peers[id]
}

func (h *Host) allPeers() []*peer {
	h.pmu.RLock()
	defer h.pmu.RUnlock()
	out := make([]*peer, 0, len(h.peers))
	for _, p := range h.peers {
		out = append(out, p)
	}
	return out
}

func (p *peer) address() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// CutWhenSilent calls cancel, from a goroutine of its own, when the node-pair liveness
// finds node id dead (nothing heard from it for LivenessTimeout), or, for a peer this
// node has not heard from since it learned of it (one never found live is never found
// dead), when it is still unheard a LivenessTimeout after this call: a caller waiting
// on an answer from it can stop waiting. The watch ends with ctx. An unknown peer is
// not watched.
func (h *Host) CutWhenSilent(ctx context.Context, id uint64, cancel func()) {
	p := h.peer(id)
	if p == nil {
		return
	}
	p.mu.Lock()
	down := p.down
	p.mu.Unlock()
	go cutWhenSilent(ctx, cancel, down, func() bool { return p.lastHeard.Load() != 0 }, h.opts.LivenessTimeout)
}

// cutWhenSilent is CutWhenSilent's watch. Without its unheard case, a node restarted
// just before the leader it forwarded to was killed waited out the whole call timeout
// (5 s: the failover rounds of TestReplicationFailoverTimes that took 5–6 s).
func cutWhenSilent(ctx context.Context, cancel func(), down <-chan struct{}, heard func() bool, liveness time.Duration) {
	var unheard <-chan time.Time
	if !heard() {
		t := time.NewTimer(liveness)
		defer t.Stop()
		unheard = t.C
	}
	for {
		select {
		case <-down:
			cancel()
			return
		case <-unheard:
			if !heard() {
				cancel()
				return
			}
			unheard = nil // heard meanwhile: found live, so down closes if it dies
		case <-ctx.Done():
			return
		}
	}
}

// PeerSilent reports whether node id was heard from before and not for LivenessTimeout
// since: it is down or cut off. A peer never heard from yet is not silent.
func (h *Host) PeerSilent(id uint64) bool {
	p := h.peer(id)
	if p == nil {
		return false
	}
	last := p.lastHeard.Load()
	return last != 0 && time.Now().UnixNano()-last > int64(h.opts.LivenessTimeout)
}

// PeerStalled reports whether node id said in its last liveness answer that its disk
// stalls (Options.DiskStalled). A peer of an older version never says so.
func (h *Host) PeerStalled(id uint64) bool {
	p := h.peer(id)
	return p != nil && p.stalled.Load()
}

// ClockOffsets returns, per peer measured, its wall clock minus this node's, as the
// last liveness call saw it (accurate to half its round trip).
func (h *Host) ClockOffsets() map[uint64]time.Duration {
	out := map[uint64]time.Duration{}
	for _, p := range h.allPeers() {
		if p.clockKnown.Load() {
			out[p.id] = time.Duration(p.clockOffset.Load())
		}
	}
	return out
}

// discardLogger silences etcd-io/raft's own logging (it logs every election at info).
var discardLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

// AddGroup opens (creating) the group's log and starts it, with every voter of Peers
// as a member (the spike's groups).
func (h *Host) AddGroup(id string) error {
	voters := make([]uint64, 0, len(h.opts.Peers))
	for pid := range h.opts.Peers {
		voters = append(voters, pid)
	}
	return h.OpenGroup(id, GroupConfig{Voters: voters})
}

// GroupConfig is what a group of the product is opened with.
type GroupConfig struct {
	// Voters are the raft ids of the group's members. A new group starts from a
	// bootstrap snapshot holding them, the same on every member.
	Voters []uint64
	// Dir holds the group's log (default Options.Dir/<id>).
	Dir string
	// Apply is called with each committed proposal, in log order, from the group's
	// goroutine; what it returns is what Propose returns to the proposer. Nil: the
	// host's Options.Apply.
	Apply func(index uint64, data []byte) any
	// OnRole is called from the group's goroutine when this node starts leading the
	// group (lead true, once its first entry of the term is applied, so everything
	// committed before is applied) and when it stops (lead false, at once).
	OnRole func(lead bool, term uint64)
	// Applied is the index up to which the application already holds the group's
	// committed entries durably; entries up to it are not applied again. 0: apply all.
	// (Raft itself still takes the configuration changes among them, from the log.)
	Applied uint64
	// Join opens a group that exists elsewhere and this node is not (yet) a voter of:
	// it starts with an empty log and no configuration, and waits for a leader that
	// added it to send it the group's log. Voters is ignored.
	Join bool
	// FirstTerm, when set and answering above 1, is the term a group this node
	// creates (not Join) starts in; its first leader's term is above it. A group made
	// over data another group held (a forced takeover) must never reuse a term that
	// group's leaders gave out receipt handles in: a handle names the term and a
	// sequence number that starts again in each term, so a term reused would let a
	// stale handle match a new lease. It is called only when the group is created, so
	// what it reads is read once, not at every opening.
	FirstTerm func() (uint64, error)
	// Campaign makes this node stand for election at once when it creates the group
	// (the preferred leader), instead of after an election timeout.
	Campaign bool
	// SnapshotFirst makes a group this node creates (not Join) take a snapshot as soon
	// as its first entries are applied, and drop its whole log behind it (a group
	// opened again before that snapshot, with SnapshotFirst, still takes it): the
	// application held data before the group existed (a partition that becomes a
	// group over its messages), so a member added later must restore that snapshot,
	// never replay a log that does not hold the data. Until it is taken, Info reports
	// SnapshotPending.
	SnapshotFirst bool
	// Snapshot, when set, is called from the group's goroutine every
	// Options.SnapshotEvery applied entries: it makes the application's state of every
	// entry applied so far durable and describes it. The group then stores that as its
	// snapshot and drops its log's entries up to Options.SnapshotKeep before it. A group
	// opened again calls it only once its apply reached what it may have applied before
	// (see OpenGroup). An error wrapping ErrSnapshotDeferred is an expected refusal: it
	// is tried again later without being logged as a failure.
	Snapshot func() ([]byte, error)
	// Restore is called from the group's goroutine when this node must take a
	// snapshot's state instead of entries it will never get: a leader sent one
	// (this replica is new, or fell behind the leader's compacted log), or the group
	// opens on a snapshot (its own, or one whose restore a crash cut short). It must
	// make the application hold at least the state data describes, fetching what it
	// lacks from sources (raft ids, the leader first), durably, and be idempotent.
	// Nothing is applied before it succeeds; an error is retried with a backoff.
	Restore func(ctx context.Context, index uint64, data []byte, sources []uint64) error
	// MayLead, when set, reports whether this replica may lead now. While it says no,
	// the replica stands for no election (no pre-vote leaves it, it makes no forced
	// campaign when its leader dies, and a leadership handed to it is refused); it
	// still votes. One that won before it said no is handed over by the application.
	MayLead func() bool
}

// OpenGroup opens (creating) the group id with cfg and starts it.
func (h *Host) OpenGroup(id string, cfg GroupConfig) error {
	if id == "" || len(id) > 255 {
		return fmt.Errorf("raftetcd: group id must be 1–255 bytes, got %d", len(id))
	}
	voters := append([]uint64(nil), cfg.Voters...)
	sort.Slice(voters, func(i, j int) bool { return voters[i] < voters[j] })
	dir := h.opts.Dir
	name := id
	if cfg.Dir != "" {
		dir, name = filepath.Dir(cfg.Dir), filepath.Base(cfg.Dir)
	}
	var st logStore
	var err error
	if h.opts.Store == StoreRaftstore {
		st, err = openSegStore(h.opts.FS, dir, name, h.opts.Sync, h.opts.WAL)
	} else {
		st, err = openWALStore(dir, name, h.opts.Sync, voters)
	}
	if err != nil {
		return err
	}
	var applied uint64
	snap, err := st.Snapshot()
	if err != nil {
		_ = st.close() // the error being returned is the one to report
		return err
	}
	applied = snap.Metadata.Index
	last, err := st.LastIndex()
	if err != nil {
		_ = st.close() // the error being returned is the one to report
		return err
	}
	// A group with neither entries nor a snapshot is new, unless it holds a hard
	// state: a replica that joined (an empty log) and answered its leader, or voted,
	// writes its term and vote before any entry. Opened again after a restart (the
	// broker asks to join only when the directory is new), it took itself for new and
	// bootstrapped, which set it back to term 1 with no vote: it could vote twice in
	// one term, and a leader's lease counting its answers could be deposed at once
	// with its vote. It waits for its leader now, holding its vote as any reopened
	// replica does.
	hs, _, err := st.InitialState()
	if err != nil {
		_ = st.close() // the error being returned is the one to report
		return err
	}
	created := last == 0 && snap.Metadata.Index == 0 && raft.IsEmptyHardState(hs)
	if created && h.opts.Store == StoreRaftstore {
		// A replica that joined and stopped before its leader reached it holds no hard
		// state either; opened again without Join, it bootstrapped a history of its own
		// (the voters it was given, committed at indices 1 to n), which conflicts with
		// the group's, and its leader could never catch it up. A joining replica marks
		// its directory first, durably; one so marked joins again.
		marker := filepath.Join(dir, name, joinedMarker)
		if cfg.Join {
			err = writeMarker(h.opts.FS, marker)
		} else if _, serr := h.opts.FS.Stat(marker); serr == nil {
			cfg.Join = true
		} else if !errors.Is(serr, fs.ErrNotExist) {
			err = serr
		}
		if err != nil {
			_ = st.close() // the error being returned is the one to report
			return err
		}
	}
	if cfg.Applied > applied {
		if last, err := st.LastIndex(); err == nil {
			applied = min(cfg.Applied, last)
		}
		if hs, _, err := st.InitialState(); err == nil {
			applied = min(applied, hs.Commit)
		}
		applied = max(applied, snap.Metadata.Index)
	}
	seeded := false
	if created && !cfg.Join && cfg.FirstTerm != nil {
		first, err := cfg.FirstTerm()
		if err != nil {
			_ = st.close() // the error being returned is the one to report
			return err
		}
		if first > 1 {
			// What RawNode.Bootstrap would write (the first voters as configuration
			// entries of term 1, committed), but with the hard state in the first
			// term: Bootstrap always starts a group in term 1.
			if err := st.persist(raft.Ready{HardState: raftpb.HardState{Term: first, Commit: uint64(len(voters))}, Entries: bootstrapEntries(voters)}); err != nil {
				_ = st.close() // the error being returned is the one to report
				return err
			}
			seeded = true
		}
	}
	// Raft starts applying after the snapshot, never after cfg.Applied: the entries up
	// to Applied are handed over again, and apply gives the application none of its
	// own (skipTo) but still applies every configuration change among them. Raft's
	// configuration is the snapshot's (InitialState), and a change it is not handed
	// again would be missing from it for good: a learner or voter added after the
	// snapshot and at or below Applied was forgotten by a group opened again.
	skipTo := applied
	applied = snap.Metadata.Index
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                 h.opts.ID,
		ElectionTick:       h.opts.ElectionTick,
		HeartbeatTick:      h.opts.HeartbeatTick,
		Storage:            st,
		Applied:            applied,
		MaxSizePerMsg:      1 << 20,
		MaxInflightMsgs:    256,
		AsyncStorageWrites: h.opts.AsyncStorageWrites,
		CheckQuorum:        true,
		PreVote:            true,
		Logger:             discardLogger,
	})
	if err != nil {
		_ = st.close() // the error being returned is the one to report
		return err
	}
	g := &group{h: h, id: id, rn: rn, st: st, wake: make(chan struct{}, 1), quit: make(chan struct{}), broken: make(chan struct{}),
		done: make(chan struct{}), waiters: map[uint64]chan proposal{}, reads: map[uint64]chan uint64{},
		voters: voters, cfg: cfg, applied: applied, skipTo: skipTo, snapIndex: snap.Metadata.Index, snapHold: hs.Commit}
	// A group opened again applies its log again from its last snapshot, while the
	// application may already hold the effects of later entries (a replicated
	// partition's message log keeps the records it wrote, the last command maybe torn):
	// a snapshot taken during that replay would stamp the application's state with an
	// earlier index. The partition refuses such a snapshot itself when it can tell (a
	// snapshot restored at the start, or a log holding only the group's appends: an
	// append applied again that ends before the log's end shows the replay is behind),
	// but not in a group made over data it held before (SnapshotFirst), whose log's end
	// at the start may be that data. So no snapshot is taken, the owed first one
	// included, before the apply reaches the commit index stored (hs, read before a new
	// group's bootstrap: 0 for it). That bound is not always enough: a commit-only hard
	// state is written without a sync (raftstore's Save), and with AsyncStorageWrites
	// an entry is applied before the append worker has written the hard state that
	// commits it, so after a crash the application may hold the effects of entries past
	// the stored commit index. For a group over no earlier data the partition's guard
	// covers those: its log holds only records of the group's appends, so the first
	// append applied again either reaches the log's end or shows the replay is behind,
	// and a snapshot before any append is applied again would need SnapshotEvery
	// entries of other kinds ahead of the group's first append. A group owing its first
	// snapshot is held to its log's last index instead (below). (A group made over data
	// and opened again without SnapshotFirst before its first snapshot gets only the
	// commit bound; it would not take the owed snapshot either.)
	g.appliedC = sync.NewCond(&g.mu)
	if !created && !cfg.Join {
		// It may have heard a leader just before it stopped, and a leader's lease may
		// count on its vote: it holds its vote as if it had heard one now (lease.go).
		g.lease.heard = monoNanos()
	}
	if _, cs, err := st.InitialState(); err == nil {
		g.voters = votersOf(cs)
		g.cs = cs
	}
	if snap.Metadata.Index > 0 && cfg.Restore != nil {
		// The log starts after a snapshot: the application must hold its state before
		// anything after it is applied (run restores it first).
		g.pending = &snap
	}
	if created && !cfg.Join {
		// The first voters are the group's first entries, the same on every member, so
		// a replica added later learns them (and every change since) from the log.
		if !seeded {
			peers := make([]raft.Peer, len(voters))
			for i, v := range voters {
				peers[i] = raft.Peer{ID: v}
			}
			if err := rn.Bootstrap(peers); err != nil {
				_ = st.close() // the error being returned is the one to report
				return err
			}
		}
		g.voters = voters
		g.snapFirst = cfg.SnapshotFirst
		if cfg.Campaign {
			_ = rn.Campaign() // an error only means it cannot stand now; the election timeout does the rest
			g.recampaign = 30
		}
	}
	if !created && !cfg.Join && cfg.SnapshotFirst && snap.Metadata.Index == 0 {
		// Made over the application's data, and stopped (a crash) after its first
		// entries were written but before that snapshot: it is still owed, or a
		// member added later would replay a log that does not hold the data.
		g.snapFirst = true
		// Made over this node's data and given no member before that snapshot, it is
		// its group's only voter: every entry in its log is committed once it leads
		// again, and every entry whose effects the application holds is in its log (an
		// entry is durable here before it is applied: raft hands the async loop only
		// such entries, the serial loop writes before it applies). So the snapshot
		// waits for the apply to reach the log's last index, not the commit index
		// stored, which may lag (see snapHold above). A voter added against that
		// contract only holds the snapshot until new entries pass that index.
		g.snapHold = max(hs.Commit, last)
	}
	h.gmu.Lock()
	if _, ok := h.groups[id]; ok {
		h.gmu.Unlock()
		_ = st.close() // the error being returned is the one to report
		return fmt.Errorf("raftetcd: group %q already open", id)
	}
	h.groups[id] = g
	h.gmu.Unlock()
	h.wg.Add(1)
	go g.run()
	return nil
}

// bootstrapEntries are the entries RawNode.Bootstrap starts a group with: one
// configuration change adding each voter, in term 1.
func bootstrapEntries(voters []uint64) []raftpb.Entry {
	ents := make([]raftpb.Entry, len(voters))
	for i, v := range voters {
		data, err := (&raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: v}).Marshal()
		if err != nil {
			panic(err) // a ConfChange always marshals
		}
		ents[i] = raftpb.Entry{Type: raftpb.EntryConfChange, Term: 1, Index: uint64(i + 1), Data: data}
	}
	return ents
}

// joinedMarker names the file a replica that joins a group (GroupConfig.Join) writes in
// its log's directory before anything else: opened again before its leader reached it
// (no entry, no hard state), it joins again instead of bootstrapping.
const joinedMarker = "joined"

// writeMarker creates an empty file at path, durably (the file and its directory
// entry).
func writeMarker(fsys vfs.FS, path string) error {
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.SyncDir(filepath.Dir(path))
	}
	return err
}

// openClosedLog opens, to read it, the log in dir of a group that is not open here; nil
// (and no error) when dir holds none, or with the spike's prototype store (no group is
// made over another's data there).
func (h *Host) openClosedLog(dir string) (logStore, error) {
	if _, err := h.opts.FS.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	if h.opts.Store != StoreRaftstore {
		return nil, nil
	}
	st, err := openSegStore(h.opts.FS, filepath.Dir(dir), filepath.Base(dir), h.opts.Sync, h.opts.WAL)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// LastTerm is the highest term the group log in dir (a GroupConfig.Dir) knew: the
// term of its hard state. The group must not be open. 0 when dir holds no log.
func (h *Host) LastTerm(dir string) (uint64, error) {
	st, err := h.openClosedLog(dir)
	if st == nil {
		return 0, err
	}
	defer func() { _ = st.close() }() // only read (opening may cut a torn tail, as any open does); nothing to lose
	hs, _, err := st.InitialState()
	if err != nil {
		return 0, err
	}
	last, err := st.LastIndex()
	if err != nil {
		return 0, err
	}
	lt, err := st.Term(last)
	if err != nil {
		return 0, err
	}
	return max(hs.Term, lt), nil
}

// ApplyLogIn hands over the Raft log in dir of a group that will never run again and
// whose log this node takes as it stands: a forced takeover, after a majority of the
// group was lost for good (the caller closed the group, or this node was stopped
// then). The log is read and every entry with data past its snapshot is handed to
// apply in order, committed or not, as etcd's --force-new-cluster commits every entry
// it holds: among them are entries a majority with this node in it recorded that this
// node had not yet heard were committed (an ack answered 204 just before the others
// were lost); the rest were never answered as done (a 503 says they may have been).
// Configuration entries are skipped: the group is gone. The application must take
// again entries it already holds, as at every start (a group replays its log from its
// last snapshot). It returns how many entries it handed over; 0 when dir does not
// exist. StoreRaftstore only.
func (h *Host) ApplyLogIn(dir string, apply func(index uint64, data []byte)) (int, error) {
	st, err := h.openClosedLog(dir)
	if st == nil {
		return 0, err
	}
	defer func() { _ = st.close() }() // only read (opening may cut a torn tail, as any open does); nothing to lose
	snap, err := st.Snapshot()
	if err != nil {
		return 0, err
	}
	last, err := st.LastIndex()
	if err != nil {
		return 0, err
	}
	n := 0
	err = eachEntry(st, "the Raft log in "+dir, snap.Metadata.Index+1, last, func(e raftpb.Entry) {
		if withData(e) {
			apply(e.Index, e.Data[8:])
			n++
		}
	})
	return n, err
}

// CloseGroup stops group id and closes its log; its files stay.
func (h *Host) CloseGroup(id string) {
	h.gmu.Lock()
	g := h.groups[id]
	delete(h.groups, id)
	h.gmu.Unlock()
	if g == nil {
		return
	}
	close(g.quit)
	<-g.done
	_ = g.st.close() // the group is gone; a close error changes nothing for anyone
}

// eachEntry hands fn the entries of st from index from to last, in order.
func eachEntry(st logStore, what string, from, last uint64, fn func(raftpb.Entry)) error {
	for next := from; next <= last; {
		ents, err := st.Entries(next, last+1, 4<<20)
		if err != nil {
			return fmt.Errorf("raftetcd: reading %s from %d: %w", what, next, err)
		}
		if len(ents) == 0 {
			return nil
		}
		for _, e := range ents {
			if e.Index != next {
				return fmt.Errorf("raftetcd: %s holds %d where %d was due", what, e.Index, next)
			}
			fn(e)
			next++
		}
	}
	return nil
}

// withData reports whether e is a proposal of the application's (not a configuration
// change, nor a leader's empty entry).
func withData(e raftpb.Entry) bool { return e.Type == raftpb.EntryNormal && len(e.Data) >= 8 }

func (h *Host) group(id string) *group {
	h.gmu.RLock()
	defer h.gmu.RUnlock()
	return h.groups[id]
}

func (h *Host) allGroups() []*group {
	h.gmu.RLock()
	defer h.gmu.RUnlock()
	out := make([]*group, 0, len(h.groups))
	for _, g := range h.groups {
		out = append(out, g)
	}
	return out
}

// CachedBytes is the size of the log entries every group of this host holds in
// memory now: entries not yet applied here, or not yet in every active follower's
// log when this node leads (see trimCache).
func (h *Host) CachedBytes() int64 {
	var n int64
	for _, g := range h.allGroups() {
		n += int64(g.st.cachedBytes())
	}
	return n
}

// GroupCounts returns how many groups this host runs and how many of them are
// quiesced (idle: no ticks, no heartbeats until a write or a peer wakes them).
func (h *Host) GroupCounts() (groups, quiesced int) {
	for _, g := range h.allGroups() {
		groups++
		g.mu.Lock()
		if g.quiesced {
			quiesced++
		}
		g.mu.Unlock()
	}
	return groups, quiesced
}

// Stats returns the counters so far.
func (h *Host) Stats() Stats {
	return Stats{RPCCalls: h.rpcCalls.Load(), BatchCalls: h.batchCalls.Load(), BatchItems: h.batchItems.Load(),
		StreamsOpened: h.streamsOpened.Load(), ForcedCampaigns: h.forced.Load(), LeadershipsWon: h.won.Load(),
		LeaseServed: h.leaseServed.Load(), LeaseRenewals: h.leaseRenewals.Load(), VotesHeld: h.votesHeld.Load(),
		Quiesces: h.quiesces.Load()}
}

// Peers returns the liveness of every other node, by raft id.
func (h *Host) Peers() map[uint64]PeerLiveness {
	out := map[uint64]PeerLiveness{}
	for _, p := range h.allPeers() {
		out[p.id] = PeerLiveness{Live: p.alive.Load(), Lapses: p.lapses.Load()}
	}
	return out
}

// GroupInfo is one group's view on this node.
type GroupInfo struct {
	Lead     uint64 // the leader this node knows, 0 for none
	Leader   bool   // this node leads
	Quiesced bool
	Term     uint64
	Commit   uint64
	Applied  uint64
	Voters   []uint64 // the group's voters as this node applied them
	// Learners are its learners; Joint is true while a joint change is under way
	// (the outgoing voters are among Voters).
	Learners []uint64
	Joint    bool
	// Last is the last index of the leader's log (on the leader).
	Last uint64
	// SnapshotPending: the group was made with SnapshotFirst and has not taken that
	// snapshot yet; no member may be added before.
	SnapshotPending bool
	// FirstIndex is the first entry the log still holds; SnapshotIndex the index of
	// the last snapshot stored (0: none). Snapshots counts those taken here since
	// the group opened, Restores the snapshots this node installed.
	FirstIndex, SnapshotIndex uint64
	Snapshots, Restores       uint64
	// Match is, on the leader, each voter's last index known to be in its log.
	Match map[uint64]uint64
	// CachedBytes is the size of the log's entries this node holds in memory.
	CachedBytes int
}

// Info returns the group's view, or false when the host has no such group.
func (h *Host) Info(id string) (GroupInfo, bool) {
	g := h.group(id)
	if g == nil {
		return GroupInfo{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	bs := g.rn.BasicStatus()
	gi := GroupInfo{Lead: bs.Lead, Leader: bs.RaftState == raft.StateLeader, Quiesced: g.quiesced,
		Term: bs.Term, Commit: bs.Commit, Applied: bs.Applied, Voters: append([]uint64(nil), g.voters...),
		SnapshotIndex: g.snapIndex, Snapshots: g.snapshots, Restores: g.restores,
		Learners: append(append([]uint64(nil), g.cs.Learners...), g.cs.LearnersNext...), Joint: len(g.cs.VotersOutgoing) > 0,
		SnapshotPending: g.snapFirst}
	gi.FirstIndex, _ = g.st.FirstIndex()
	gi.CachedBytes = g.st.cachedBytes()
	if gi.Leader {
		gi.Last, _ = g.st.LastIndex()
		gi.Match = map[uint64]uint64{}
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) { gi.Match[id] = pr.Match })
	}
	return gi, true
}

// Propose replicates data in group and returns its index once it is committed and
// applied on this node. Only the leader proposes: elsewhere it returns ErrNotLeader at
// once. A proposal lost to a change of leader is not retried: ctx ends the wait.
func (h *Host) Propose(ctx context.Context, id string, data []byte) (uint64, error) {
	idx, _, err := h.ProposeResult(ctx, id, data)
	return idx, err
}

// ProposeResult is Propose that also returns what the group's Apply returned for the
// proposal.
// submitted, when given, is called once the proposal is in the leader's log (before
// it commits): proposals made one after the other's submitted call are in the log in
// that order.
func (h *Host) ProposeResult(ctx context.Context, id string, data []byte, submitted ...func()) (uint64, any, error) {
	g := h.group(id)
	if g == nil {
		return 0, nil, fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	var s func()
	if len(submitted) > 0 {
		s = submitted[0]
	}
	return g.propose(ctx, data, s)
}

// ProposeCommitted replicates data in group id and returns its index once it is
// committed, before this node applies it (see group.proposeCommitted): a leader whose
// own disk is slow learns of the commit from its followers at once, and applies later.
func (h *Host) ProposeCommitted(ctx context.Context, id string, data []byte) (uint64, error) {
	g := h.group(id)
	if g == nil {
		return 0, fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	return g.proposeCommitted(ctx, data)
}

// AppendedAgo returns how long ago the entry at index of group id reached this node's
// log (false when the group does not remember: see group.appendedAt). A command whose
// meaning depends on the time it was proposed at (a leader's handed-over leases, which
// carry their time left) counts from there: its apply may come much later on a replica
// catching up, and the time between its proposal and its arrival here is one trip.
func (h *Host) AppendedAgo(id string, index uint64) (time.Duration, bool) {
	g := h.group(id)
	if g == nil {
		return 0, false
	}
	at, ok := g.appendedAt(index)
	if !ok {
		return 0, false
	}
	return time.Since(at), true
}

// ConfirmLeader returns nil once a quorum of group id confirmed, after the call, that
// this node still leads it, and everything committed then is applied here (etcd-io/raft's
// ReadIndex). A deposed leader that has not noticed yet gets an error, never a yes.
func (h *Host) ConfirmLeader(ctx context.Context, id string) error {
	g := h.group(id)
	if g == nil {
		return fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	return g.confirm(ctx)
}

// ChangeVoters asks group id, led here, to replace the voters remove by add in one
// joint configuration change (both old and new majorities must agree on it, so a
// dead member can be replaced while a majority of both is up). It returns once the
// change is proposed; Info shows when it is applied. A change while another is
// pending is dropped by raft: call again later.
func (h *Host) ChangeVoters(id string, remove, add []uint64) error {
	return h.ChangeConf(id, ConfChange{RemoveVoters: remove, AddVoters: add})
}

// ConfChange is a change of a group's members. A learner receives the log but does
// not vote; adding as a voter a node that is a learner promotes it.
type ConfChange struct {
	RemoveVoters, AddVoters, AddLearners, RemoveLearners []uint64
}

// ChangeConf proposes c in group id, led here, as one change (joint when it changes
// more than one member). Like ChangeVoters, it returns once proposed.
func (h *Host) ChangeConf(id string, c ConfChange) error {
	g := h.group(id)
	if g == nil {
		return fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	var cc raftpb.ConfChangeV2
	for _, r := range append(append([]uint64(nil), c.RemoveVoters...), c.RemoveLearners...) {
		cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: r})
	}
	for _, a := range c.AddVoters {
		cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: a})
	}
	for _, a := range c.AddLearners {
		cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: a})
	}
	if len(cc.Changes) == 0 {
		return nil
	}
	if len(cc.Changes) > 1 {
		cc.Transition = raftpb.ConfChangeTransitionJointImplicit
	}
	return g.proposeConf(cc, nil)
}

// proposeConf proposes cc in g, which must be led here and, when given, pass check
// (under the group's lock); ErrNotLeader otherwise.
func (g *group) proposeConf(cc raftpb.ConfChangeV2, check func() bool) error {
	g.mu.Lock()
	defer g.signal()
	defer g.mu.Unlock()
	if g.rn.BasicStatus().RaftState != raft.StateLeader || check != nil && !check() {
		return ErrNotLeader
	}
	g.quiesced = false
	if err := g.rn.ProposeConfChange(cc); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return nil
}

// resetLearner removes learner from group id, led here, and adds it again once the
// removal applied: its progress then starts from nothing, and it catches up from the
// log or a snapshot (lostLearnerLocked). One reset runs at a time per group; one whose
// removal does not apply within resetWait gives up, and the learner's next refusal
// starts another.
func (h *Host) resetLearner(id string, learner uint64) {
	g := h.group(id)
	if g == nil || !g.resetting.CompareAndSwap(false, true) {
		return
	}
	defer g.resetting.Store(false)
	if !g.removeLearner(learner) {
		return
	}
	h.log.Warn("raftetcd: a learner lost entries it had acknowledged (its copy was deleted and it joined again); removed, and added again once that applied",
		"group", id, "learner", learner)
	deadline := time.Now().Add(resetWait)
	for time.Now().Before(deadline) {
		info, ok := h.Info(id)
		if !ok || !info.Leader {
			return
		}
		if !info.Joint && !slices.Contains(info.Learners, learner) && !slices.Contains(info.Voters, learner) {
			_ = h.ChangeConf(id, ConfChange{AddLearners: []uint64{learner}}) // refused: the next refusal resets again
			return
		}
		select {
		case <-h.quit:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// removeLearner proposes the removal of learner, led here, if it is a learner now:
// checked under the group's lock, so that a voter (a learner a move's switch promoted
// meanwhile) is never removed by a reset.
func (g *group) removeLearner(learner uint64) bool {
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: learner}}}
	return g.proposeConf(cc, func() bool {
		pr, ok := g.rn.Status().Progress[learner]
		return ok && pr.IsLearner
	}) == nil
}

// resetWait bounds how long resetLearner waits for its removal to apply.
const resetWait = 10 * time.Second

// TransferLeader asks group id, led here, to hand its leadership to voter to (on a
// node that does not lead it, it does nothing). The leader first gives up its lease
// for the rest of its term and tells its followers, which then vote for the candidate
// without waiting for their hold to end.
func (h *Host) TransferLeader(id string, to uint64) {
	if g := h.group(id); g != nil {
		g.mu.Lock()
		if g.rn.BasicStatus().RaftState != raft.StateLeader {
			// A follower's raft would forward it to the leader, which would hand its
			// leadership over without giving up its lease or handing its leases over.
			g.mu.Unlock()
			return
		}
		g.quiesced = false
		// The flagged heartbeats are queued before raft can emit the MsgTimeoutNow
		// (send takes only the peers' locks).
		h.send(g.id, flagHandover, g.endLeaseForHandoverLocked())
		g.rn.TransferLeader(to)
		g.mu.Unlock()
		g.signal()
	}
}

// LeaseHeld reports whether this node leads group id under a lease now: no other
// replica can be elected before the lease ends, so what the leader decides from its
// own state (which messages to lease) needs no round to a quorum. False also when it
// may lead but holds no lease (then confirm with ConfirmLeader, which renews it).
//
// Each true answer counts as a consume served under the lease (Stats.LeaseServed);
// LeaseValid asks the same without counting.
func (h *Host) LeaseHeld(id string) bool {
	g := h.group(id)
	return g != nil && g.leaseHeld(true)
}

// LeaseValid is LeaseHeld for a caller that serves no consume with its answer (a
// leader confirming it still leads before it answers its counters).
func (h *Host) LeaseValid(id string) bool {
	g := h.group(id)
	return g != nil && g.leaseHeld(false)
}

// Close stops the groups, the clock and the senders. The node stays the caller's.
func (h *Host) Close() {
	h.closeMu.Lock()
	if h.isClosed {
		h.closeMu.Unlock()
		return
	}
	h.isClosed = true
	h.closeMu.Unlock()
	close(h.quit)
	h.wg.Wait()
	for _, g := range h.allGroups() {
		_ = g.st.close()
	}
}

func (h *Host) closed() bool {
	select {
	case <-h.quit:
		return true
	default:
		return false
	}
}

// heard records that peer id is alive.
func (h *Host) heard(id uint64) {
	if p := h.peer(id); p != nil {
		p.lastHeard.Store(time.Now().UnixNano())
	}
}

// tickLoop is the node's one clock: it updates liveness, then ticks every group that
// is not quiesced.
func (h *Host) tickLoop() {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-h.quit:
			return
		case <-t.C:
		}
		if h.clockStopped.Load() {
			continue
		}
		h.tickOnce(time.Now())
	}
}

// tickOnce is one turn of the node's clock at now (tickLoop's goroutine only).
func (h *Host) tickOnce(at time.Time) {
	if h.opts.LazyHeartbeats {
		h.flushAll() // what the last tick's heartbeats left queued
	}
	now := at.UnixNano()
	if last := h.lastTick; last != 0 && now-last > int64(h.opts.LivenessTimeout/2) {
		// This node did not run for a while (stopped, paused by its machine, starved):
		// neither did its liveness calls, so its peers' silence over that time proves
		// nothing. Without this, a node continued after a SIGSTOP counted every peer
		// dead and forced an election in the groups they led, deposing healthy leaders
		// (their leases lost) as soon as it had caught up. A peer really gone is still
		// found dead one timeout later.
		h.log.Warn("raftetcd: this node's clock did not tick for a while (paused or starved); its peers' silence over that time is not held against them",
			"stalled_for", time.Duration(now-last).Round(time.Millisecond))
		for _, p := range h.allPeers() {
			if p.live {
				p.lastHeard.Store(max(p.lastHeard.Load(), now))
			}
		}
	}
	h.lastTick = now
	var down, up []uint64
	for _, p := range h.allPeers() {
		live := now-p.lastHeard.Load() < int64(h.opts.LivenessTimeout)
		// (A restart seen while the peer counted dead is its coming back below.)
		if restarted := p.restarted.Swap(false); p.live && live && restarted {
			// Back before it was missed: what it led must elect again, what it
			// was waited on for will not come, and what this node leads must
			// catch it up.
			p.mu.Lock()
			close(p.down)
			p.down = make(chan struct{})
			p.mu.Unlock()
			p.lapses.Add(1)
			down = append(down, p.id)
			up = append(up, p.id)
			continue
		}
		if live != p.live {
			p.live = live
			p.alive.Store(live)
			if live {
				h.log.Info("raftetcd: a peer answers the liveness calls", "peer", p.id)
				up = append(up, p.id)
			} else {
				p.mu.Lock()
				close(p.down)
				p.down = make(chan struct{})
				p.mu.Unlock()
				p.lapses.Add(1)
				h.log.Warn("raftetcd: a peer did not answer within the liveness timeout; the groups it led elect a new leader",
					"peer", p.id, "timeout", h.opts.LivenessTimeout, "silent_for", time.Duration(now-p.lastHeard.Load()).Round(time.Millisecond))
				down = append(down, p.id)
			}
		}
	}
	groups := h.allGroups()
	for _, id := range down {
		h.peerDown(groups, id)
	}
	for range up {
		h.peerUp(groups)
	}
	for _, g := range groups {
		g.tick()
	}
}

// isLive is the ticker's view of a peer (call from the ticker goroutine only).
func (h *Host) isLive(id uint64) bool {
	if id == h.opts.ID {
		return true
	}
	p := h.peer(id)
	return p != nil && p.live
}

// peerDown wakes every group the dead node led. In each, the live voter with the
// smallest id campaigns at once, bypassing the check-quorum lease of the others (a
// quiesced follower's election clock is stopped, so it would otherwise refuse to vote
// for up to an election timeout); the rest only resume ticking, as a fallback.
func (h *Host) peerDown(groups []*group, dead uint64) {
	for _, g := range groups {
		g.leaderDown(dead)
	}
}

// peerLive reports whether peer id counts live (from any goroutine).
func (h *Host) peerLive(id uint64) bool {
	p := h.peer(id)
	return p != nil && p.alive.Load()
}

// peerUp wakes every group this node leads, so a restarted or reconnected node hears
// its leaders and catches up; they quiesce again once it has.
func (h *Host) peerUp(groups []*group) {
	for _, g := range groups {
		g.wakeIfLeader()
	}
}

// livenessLoop calls p every LivenessInterval; a success proves both ends alive.
func (h *Host) livenessLoop(p *peer) {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.LivenessInterval)
	defer t.Stop()
	req := binary.BigEndian.AppendUint64(nil, h.opts.ID)
	for {
		select {
		case <-h.quit:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.opts.LivenessTimeout/2)
		h.rpcCalls.Add(1)
		sent, sentWall := time.Now(), h.opts.WallClock()
		resp, err := h.opts.Node.Call(ctx, p.address(), OpLiveness, req)
		got := time.Now()
		cancel()
		if err == nil {
			h.heard(p.id)
			if len(resp) >= 16 {
				theirs := int64(binary.BigEndian.Uint64(resp[8:16]))
				mid := sentWall + got.Sub(sent).Nanoseconds()/2
				off := theirs - mid
				if was := time.Duration(p.clockOffset.Swap(off)); abs(time.Duration(off)) > ClockOffsetWarn && (abs(was) <= ClockOffsetWarn || !p.clockKnown.Load()) {
					h.log.Warn("a peer's wall clock is over a second from this node's: delayed copies and retention move by the difference after a change of leader; sync the clocks (NTP) and restart a node that kept an old clock after its machine's was stepped",
						"peer", p.id, "offset", time.Duration(off))
				}
				p.clockKnown.Store(true)
			}
			if len(resp) >= 24 {
				if was := p.start.Swap(binary.BigEndian.Uint64(resp[16:24])); was != 0 && was != p.start.Load() {
					h.log.Info("a peer restarted since its last liveness answer; the groups it led elect again", "peer", p.id)
					p.restarted.Store(true)
				}
			}
			p.stalled.Store(len(resp) >= 25 && resp[24]&livenessDiskStalled != 0)
		}
	}
}

func (h *Host) serveLiveness(_ context.Context, _ string, req []byte) ([]byte, error) {
	if len(req) != 8 {
		return nil, fmt.Errorf("%w: liveness of %d bytes", ErrBadMessage, len(req))
	}
	// Not heard(): a call that reaches this node proves the caller sends, not that it
	// hears. A deaf node (it sends, receives nothing) must count dead to its peers, or
	// the groups it leads, which can commit nothing, keep it as their leader.
	// Our wall clock goes with the answer, so the caller can tell how far apart the
	// two clocks are (an 8-byte answer from an older node has none).
	out := binary.BigEndian.AppendUint64(nil, h.opts.ID)
	out = binary.BigEndian.AppendUint64(out, uint64(h.opts.WallClock()))
	// Then this start's id (an older caller reads the first 16 bytes only), then a
	// byte of flags (an older caller reads the first 24).
	out = binary.BigEndian.AppendUint64(out, h.start)
	var flags byte
	if h.opts.DiskStalled != nil && h.opts.DiskStalled() {
		flags |= livenessDiskStalled
	}
	return append(out, flags), nil
}

// livenessDiskStalled is the flag of a liveness answer saying the node's disk stalls.
const livenessDiskStalled byte = 1

// ClockOffsetWarn is the peer clock offset past which a node logs a warning (once each
// time the offset crosses it).
const ClockOffsetWarn = time.Second

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// randomStart draws a start id: random, never 0 (which means "none").
func randomStart() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(err) // crypto/rand does not fail on Linux
		}
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// send queues msgs of group for their peers.
func (h *Host) send(group string, flags byte, msgs []raftpb.Message) {
	for _, m := range msgs {
		p := h.peer(m.To)
		if p == nil {
			continue
		}
		p.mu.Lock()
		p.queue = append(p.queue, outMsg{group: group, flags: flags, m: m})
		p.mu.Unlock()
		if h.lazy(flags, m) {
			continue // the next tick kicks the sender
		}
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// lazy reports whether m may wait for the next frame to its peer (at the latest the
// next tick's): a plain heartbeat or its answer (one carrying a ReadIndex context is
// awaited by a reader and goes at once), or an append without entries, which a leader
// sends only to move a follower's commit index or to probe it. No client waits on a
// follower learning of a commit: the leader answered when it committed, and a forced
// takeover applies the survivor's whole log, committed or not (ApplyLogIn). Under load
// the next frame is a fraction of a millisecond away; sent in a frame of its own, this
// append was a quarter of the frames of a replicated produce
// (docs/internals/replication.md).
func (h *Host) lazy(flags byte, m raftpb.Message) bool {
	if !h.opts.LazyHeartbeats || flags != 0 || len(m.Context) != 0 {
		return false
	}
	switch m.Type {
	case raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp:
		return true
	case raftpb.MsgApp:
		return len(m.Entries) == 0
	}
	return false
}

// flushAll kicks the sender of every peer something is queued for.
func (h *Host) flushAll() {
	for _, p := range h.allPeers() {
		p.flushQueued()
	}
}

// flushQueued kicks p's sender when something is queued for it: an idle node's tick
// wakes no sender (it woke each peer's at every tick: 20 wake-ups a second on a node of
// a 3-node cluster with nothing to send).
func (p *peer) flushQueued() {
	p.mu.Lock()
	queued := len(p.queue) > 0
	p.mu.Unlock()
	if queued {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// sendLoop sends whatever is queued for p in one frame, as a message on a stream kept
// open to p (see transport.MessageStream), or, to a peer that does not take message
// streams (a node of an older version), as a call with one frame in flight at a time.
// Messages queued while a frame is being written share the next one.
func (h *Host) sendLoop(p *peer) {
	defer h.wg.Done()
	var buf []byte
	var out outStream
	defer out.close()
	for {
		select {
		case <-h.quit:
			return
		case <-p.kick:
		}
		p.mu.Lock()
		msgs := p.queue
		p.queue = nil
		p.mu.Unlock()
		if len(msgs) == 0 {
			continue
		}
		buf = encodeBatch(buf[:0], msgs)
		h.batchCalls.Add(1)
		h.batchItems.Add(uint64(len(msgs)))
		switch s, err := h.stream(p, &out); {
		case err != nil:
			h.unreachable(p.id, msgs)
			continue
		case s != nil:
			if err := s.Send(buf, sendTimeout); err != nil {
				// Broken (the peer restarted, its connection died, or it stopped
				// reading): what the stream still held is lost, as raft allows; the
				// next frame opens another.
				out.close()
				h.unreachable(p.id, msgs)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		_, err := h.opts.Node.Call(ctx, p.address(), OpBatch, buf)
		cancel()
		if err != nil {
			h.unreachable(p.id, msgs)
		} else {
			h.heard(p.id) // answered: it hears this node, and this node hears it
		}
	}
}

// outStream is a sender's message stream to its peer, and when to try opening one
// again after the peer refused.
type outStream struct {
	s        *transport.MessageStream
	addr     string
	noneTill time.Time
}

func (o *outStream) close() {
	if o.s != nil {
		o.s.Close()
		o.s = nil
	}
}

// streamRetry is how long a sender whose peer refused message streams sends calls
// before it asks again (the peer may have been upgraded meanwhile).
const streamRetry = 30 * time.Second

// stream returns the open message stream to p, opening one when there is none; nil
// with no error means "send a call": the peer refused message streams lately. An error
// means p could not be reached.
func (h *Host) stream(p *peer, o *outStream) (*transport.MessageStream, error) {
	addr := p.address()
	if o.s != nil && (o.addr != addr || !o.s.Alive()) {
		o.close()
	}
	if o.s != nil {
		return o.s, nil
	}
	if time.Now().Before(o.noneTill) {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	s, err := h.opts.Node.OpenMessages(ctx, addr, OpBatch)
	if errors.Is(err, transport.ErrUnknownKind) || errors.Is(err, transport.ErrUnknownOp) {
		h.log.Info("raftetcd: a peer does not take message streams (an older version); its raft frames go as calls", "peer", p.id, "err", err)
		o.noneTill = time.Now().Add(h.opts.streamRetry)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	o.s, o.addr = s, addr
	h.streamsOpened.Add(1)
	return s, nil
}

// unreachable tells each group whose message to id was lost, so raft probes again
// instead of waiting for acknowledgements that will not come.
func (h *Host) unreachable(id uint64, msgs []outMsg) {
	seen := map[string]bool{}
	for _, o := range msgs {
		if seen[o.group] {
			continue
		}
		seen[o.group] = true
		if g := h.group(o.group); g != nil {
			g.mu.Lock()
			g.rn.ReportUnreachable(id)
			g.mu.Unlock()
		}
	}
}

func (h *Host) serveBatch(_ context.Context, _ string, req []byte) ([]byte, error) {
	if h.closed() {
		return nil, ErrClosed
	}
	// The sender is not marked heard (see serveLiveness): its own call's answer is
	// what proves to it that this node hears.
	return nil, h.receive(req, false)
}

// serveStreamBatch takes a frame that came on a message stream. No answer goes back,
// so the sender learns nothing from it; here, an answer of the sender's to a raft
// message of this node's (an append's, a heartbeat's, a vote's) proves that the
// sender hears this node, as a liveness answer would.
func (h *Host) serveStreamBatch(_ string, msg []byte) error {
	if h.closed() {
		return nil // shutting down: the frames of the streams still open are dropped
	}
	return h.receive(msg, true)
}

func (h *Host) receive(frame []byte, answersProveHearing bool) error {
	var answeredBy uint64 // a frame comes from one peer: mark it heard once, after
	err := decodeBatch(frame, func(name string, flags byte, m raftpb.Message) {
		if m.To != h.opts.ID {
			// For a member this node was before its data directory was wiped (the
			// sender has not applied the replacement yet): raft does not check the
			// addressee, and that member's log is gone.
			return
		}
		if answersProveHearing && raft.IsResponseMsg(m.Type) {
			answeredBy = m.From
		}
		if g := h.group(name); g != nil {
			g.step(flags, m)
		}
	})
	if answeredBy != 0 {
		h.heard(answeredBy)
	}
	return err
}
