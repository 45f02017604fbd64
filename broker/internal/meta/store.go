package meta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// Options configures a Store.
type Options struct {
	// Dir holds the Raft log, stable store, snapshots and the node's identity.
	Dir string
	// NodeID names this node. A data directory belongs to the node id it was made
	// with; Open refuses another one (ErrNodeIDMismatch).
	NodeID string
	// Logger receives Raft's warnings and errors.
	Logger *slog.Logger
	// ApplyTimeout bounds a metadata write; past it the write answers ErrUnavailable.
	ApplyTimeout time.Duration
	// OnChange is called after every change to the state (from the Raft goroutine; it
	// must not block on Store calls that write).
	OnChange func()
	// Cluster says how this node finds and talks to the others; the zero value is a
	// lone node on an in-memory transport.
	Cluster Cluster
	// tuneRaft, when set (tests), changes Raft's configuration before the node starts
	// (snapshot and log retention, to make a follower need a snapshot).
	tuneRaft func(*raft.Config)
}

// Cluster configures the node's place in a cluster.
type Cluster struct {
	// Transport carries Raft between nodes (the node plane's stream layer under
	// raft.NewNetworkTransport, or raft.InmemTransport in tests). Nil: an in-memory
	// transport nobody else can reach, for a lone node.
	Transport raft.Transport
	// LocalAddr is this node's cluster address as the others reach it; default
	// Transport.LocalAddr().
	LocalAddr raft.ServerAddress
	// Forwarder reaches other nodes' Store.HandleForward (writes, readiness, joins,
	// heartbeats). Required with Peers or Join; a lone node without one never asks
	// anybody.
	Forwarder Forwarder
	// Peers bootstraps a new cluster from a static list that includes this node (the
	// same list on every listed node). A node whose data directory holds state ignores
	// it; a node without state whose peers formed a cluster already joins it.
	Peers []Peer
	// Join is the cluster address of any member of an existing cluster to join
	// (ignored when the data directory holds state).
	Join raft.ServerAddress
	// WaitForAdd: with neither Peers nor Join, do not bootstrap a cluster of one; wait to
	// be added by a member (POST /v1/cluster/members).
	WaitForAdd bool
	// HTTPAddr is the HTTP address this node advertises to the others.
	HTTPAddr string
	// MaxVoters is how many members vote in the control plane (default 5); further
	// members join as non-voters.
	MaxVoters int
	// HeartbeatInterval is how often a member tells the controller it is alive
	// (default 1 s); SuspectAfter (default 5 s) and DeadAfter (default 30 s) without
	// one, the controller marks it suspect, then dead.
	HeartbeatInterval time.Duration
	SuspectAfter      time.Duration
	DeadAfter         time.Duration
	// RaftTimeout is Raft's heartbeat and election timeout: default 200 ms for a lone
	// in-memory node (it elects itself quickly at start), 1 s otherwise.
	RaftTimeout time.Duration
	// VersionMax is the highest cluster version this node offers (default, and at most,
	// VersionMax): lower, it speaks and reports only up to it, as a binary of that
	// version would, so the cluster stays at a version an older binary can still join
	// (see version.go and docs/operating/upgrades.md).
	VersionMax int
	// AutoRebalance: the controller moves replicas onto members that hold fewer (a
	// node that joined) on its own, MaxMoves at a time; off, only POST
	// /v1/cluster/rebalance does. MaxMoves (default DefaultMaxMoves) bounds the moves
	// under way at once, whatever started them.
	AutoRebalance bool
	MaxMoves      int
	// Ends, when set, returns the log end of each replicated partition this node
	// holds, by group id; heartbeats carry it to the controller (MaxReportedEnd).
	Ends func() map[string]uint64
	// DiskStalled, when set, reports whether the node's other writes find its disk
	// stalling (the write-ahead file's rounds); the control plane times its own writes
	// besides (Store.Stalled). While either says so, a controller hands the controller
	// to a voter that is alive and fit (PeerUnfit false), when there is one: on such a
	// disk every metadata write waits seconds for the controller's own log.
	DiskStalled func() bool
	// PeerUnfit, when set, reports whether the member with this Raft server id is
	// silent or says its disk stalls, as this node hears it; such a voter is not handed
	// the controller.
	PeerUnfit func(serverID string) bool
}

// Peer is one node of a static bootstrap list.
type Peer struct {
	ID   string
	Addr raft.ServerAddress
}

// Store is the control-plane state machine and the Raft node that replicates it.
type Store struct {
	opts  Options
	id    identity
	addr  raft.ServerAddress
	fsm   *fsm
	raft  *raft.Raft
	bolt  *raftboltdb.BoltStore
	trans raft.Transport
	watch diskWatch // times Raft's writes to bolt (Stalled)

	ready         atomic.Bool
	readyWakes    atomic.Uint64 // the ready loop's rounds, for its test
	nudged        atomic.Uint64 // barriers nudgeLoop appended, for tests
	leaderChanges atomic.Uint64
	joinErr       atomic.Pointer[error]
	nudges        chan struct{} // nudge: a barrier to append (one pending at most)
	ctl           controller
	stop          chan struct{}
	wg            sync.WaitGroup
	closeMu       sync.Once
	syncState
	leaseState
}

// Open starts the Raft node. On first start it writes the node's identity and, by the
// Cluster options, bootstraps a cluster of one, bootstraps one from Peers, or joins.
func Open(opts Options) (*Store, error) {
	if opts.ApplyTimeout == 0 {
		opts.ApplyTimeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.NodeID == "" {
		return nil, errors.New("meta: a node id is required")
	}
	c := &opts.Cluster
	if c.MaxVoters <= 0 {
		c.MaxVoters = 5
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.SuspectAfter <= 0 {
		c.SuspectAfter = 5 * time.Second
	}
	if c.DeadAfter <= 0 {
		c.DeadAfter = 30 * time.Second
	}
	if c.DeadAfter < c.SuspectAfter {
		c.DeadAfter = c.SuspectAfter
	}
	if c.RaftTimeout <= 0 {
		c.RaftTimeout = time.Second
		if c.Transport == nil {
			c.RaftTimeout = 200 * time.Millisecond
		}
	}
	if c.VersionMax == 0 {
		c.VersionMax = VersionMax
	}
	if c.MaxMoves <= 0 {
		c.MaxMoves = DefaultMaxMoves
	}
	if c.VersionMax < VersionMin || c.VersionMax > VersionMax {
		return nil, fmt.Errorf("meta: the highest cluster version to offer must be between %d and %d, the versions this binary speaks (got %d)", VersionMin, VersionMax, c.VersionMax)
	}
	if (len(c.Peers) > 0 || c.Join != "") && (c.Transport == nil || c.Forwarder == nil) {
		return nil, errors.New("meta: bootstrapping from peers or joining needs a Transport and a Forwarder")
	}
	// The directory's entry must be durable before the first metadata write commits.
	if err := vfs.MkdirAllSync(vfs.OS{}, opts.Dir, 0o700); err != nil {
		return nil, err
	}
	f := newFSM()
	f.onChange = opts.OnChange
	f.maxVersion = c.VersionMax

	cfg := raft.DefaultConfig()
	cfg.HeartbeatTimeout = c.RaftTimeout
	cfg.ElectionTimeout = c.RaftTimeout
	cfg.LeaderLeaseTimeout = c.RaftTimeout / 2
	// A follower learns the commit index from the leader's next AppendEntries: the one
	// a new entry sends, or an empty one every CommitTimeout (to twice that) while no
	// entry comes; heartbeats do not carry it. At hashicorp/raft's 50 ms those empty
	// ones were most of an idle controller's CPU. A quarter of RaftTimeout instead, and
	// the controller appends a barrier when a node should learn a commit at once (nudge).
	cfg.CommitTimeout = c.RaftTimeout / 4
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Error, Output: slogWriter{opts.Logger}})
	if opts.tuneRaft != nil {
		opts.tuneRaft(cfg)
	}

	if err := syncIfExists(filepath.Join(opts.Dir, "raft.db")); err != nil {
		return nil, fmt.Errorf("meta: making the raft store durable before reading it: %w", err)
	}
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(opts.Dir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("meta: opening raft store: %w", err)
	}
	s, err := open(opts, cfg, f, bolt)
	if err != nil {
		_ = bolt.Close() // the open error is the one to report
		return nil, err
	}
	return s, nil
}

// syncIfExists makes the file at path durable, if there is one, and has its reads come
// from the disk (vfs.SyncForReading). A process killed after a write and before its
// sync leaves the bytes in the page cache, and one whose sync failed leaves them in
// clean pages the disk never got; either way the next start would read them as
// durable: bbolt would take a commit whose meta page is not on the disk, and Raft a
// term or vote a power loss could still take back (a second vote in a term).
func syncIfExists(path string) error {
	if err := vfs.SyncForReading(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func open(opts Options, cfg *raft.Config, f *fsm, bolt *raftboltdb.BoltStore) (*Store, error) {
	c := opts.Cluster
	snaps, err := raft.NewFileSnapshotStoreWithLogger(opts.Dir, 2, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("meta: opening snapshots: %w", err)
	}
	has, err := raft.HasExistingState(bolt, bolt, snaps)
	if err != nil {
		return nil, fmt.Errorf("meta: reading raft state: %w", err)
	}
	var stored raft.Configuration
	if has {
		if stored, err = storedConfiguration(bolt, snaps); err != nil {
			return nil, fmt.Errorf("meta: reading the stored Raft configuration: %w", err)
		}
	}
	id, err := loadIdentity(opts.Dir, opts.NodeID, stored)
	if err != nil {
		return nil, err
	}
	cfg.LocalID = id.serverID()
	since, err := loadMemberSince(opts.Dir)
	if err != nil {
		return nil, err
	}
	f.self = string(cfg.LocalID)
	f.selfSince.Store(since)

	trans := c.Transport
	if trans == nil {
		_, trans = raft.NewInmemTransport(raft.ServerAddress(opts.NodeID))
	}
	addr := c.LocalAddr
	if addr == "" {
		addr = trans.LocalAddr()
	}
	if len(c.Peers) > 0 {
		found := false
		for _, p := range c.Peers {
			found = found || (p.ID == opts.NodeID && p.Addr == addr)
		}
		if !found {
			return nil, fmt.Errorf("meta: the peer list must name this node (%s at %s)", opts.NodeID, addr)
		}
	}
	self := raft.Configuration{Servers: []raft.Server{{ID: cfg.LocalID, Address: addr, Suffrage: raft.Voter}}}
	if has {
		recover, err := needsRecovery(stored, id, addr)
		if err != nil {
			return nil, err
		}
		if recover {
			// Rewrites the configuration to this node alone (a data directory of the
			// single-node version, or a lone node that moved address), keeping every entry.
			opts.Logger.Info("meta: rewriting the stored Raft configuration to this node alone", "was", fmt.Sprint(stored.Servers), "server_id", cfg.LocalID, "address", addr)
			if err := raft.RecoverCluster(cfg, newFSM(), bolt, bolt, snaps, trans, self); err != nil {
				return nil, fmt.Errorf("meta: recovering the stored Raft configuration: %w", err)
			}
		}
	} else if len(c.Peers) == 0 && c.Join == "" && !c.WaitForAdd {
		if err := raft.BootstrapCluster(cfg, bolt, bolt, snaps, trans, self); err != nil {
			return nil, fmt.Errorf("meta: bootstrap: %w", err)
		}
	}
	s := &Store{opts: opts, id: id, addr: addr, fsm: f, bolt: bolt, trans: trans, stop: make(chan struct{}), nudges: make(chan struct{}, 1)}
	f.onSelf = s.saveMemberSince
	ws := watchedStore{LogStore: bolt, StableStore: bolt, w: &s.watch}
	r, err := raft.NewRaft(cfg, f, ws, ws, snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("meta: starting raft: %w", err)
	}
	s.raft = r
	// NewRaft restored the newest snapshot before returning; the entries after it go
	// through Apply. A snapshot from before the state kept its index holds every command
	// up to the snapshot's own index.
	if f.applied.Load() == 0 {
		f.applied.Store(r.AppliedIndex())
	}
	countLeaderChanges(r, &s.leaderChanges, &s.leaderGen)
	s.ctl.init()
	if !has {
		switch {
		case len(c.Peers) > 0:
			s.goLoop(s.bootstrapLoop)
		case c.Join != "":
			s.goLoop(func() { s.joinLoop(c.Join) })
		}
	}
	s.goLoop(s.readyLoop)
	s.goLoop(s.controlLoop)
	s.goLoop(s.heartbeatLoop)
	s.goLoop(s.leaseLoop)
	s.goLoop(s.nudgeLoop)
	return s, nil
}

func (s *Store) goLoop(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// sleep waits d or until the store closes; false when it closed.
func (s *Store) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.stop:
		return false
	case <-t.C:
		return true
	}
}

// AppliedIndex returns the index of the last command applied to the state (Raft's own
// applied index can be ahead of it: see fsm.applied).
func (s *Store) AppliedIndex() uint64 { return s.fsm.applied.Load() }

// Leader reports whether this node leads the control plane (is the controller).
func (s *Store) Leader() bool { return s.raft.State() == raft.Leader }

// NodeID returns this node's id.
func (s *Store) NodeID() string { return s.opts.NodeID }

// ServerID returns this node's Raft server id, "<node id>/<disk id>".
func (s *Store) ServerID() string { return string(s.id.serverID()) }

// Addr returns this node's cluster address.
func (s *Store) Addr() raft.ServerAddress { return s.addr }

// applyCmd writes a command through the controller: here when this node leads, else
// forwarded to the leader. It waits up to ApplyTimeout for a controller, and passes a
// write on again only when the node asked answered that it did not take it.
func (s *Store) applyCmd(c command) (applyResult, error) {
	// Never propose what Apply would refuse: a refused entry stops every replica.
	if err := c.check(); err != nil {
		return applyResult{}, fmt.Errorf("meta: %w", err)
	}
	if err := s.gateCmd(c); err != nil {
		return applyResult{}, err
	}
	if err := s.fsm.haltedErr(); err != nil {
		return applyResult{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ApplyTimeout)
	defer cancel()
	var last error
	for {
		var res applyResult
		err := ErrNotLeader
		if s.Leader() {
			res, err = s.applyLocal(c)
		} else if addr, _ := s.raft.LeaderWithID(); addr != "" {
			res, err = s.applyRemote(ctx, addr, c)
		}
		// Sent again only when certainly not taken: the node asked did not lead, or
		// the request never reached it.
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNotDelivered) {
			return res, err
		}
		last = err
		select {
		case <-ctx.Done():
			return applyResult{}, fmt.Errorf("%w: no controller took the write within %v (%v)", ErrUnavailable, s.opts.ApplyTimeout, last)
		case <-s.stop:
			return applyResult{}, fmt.Errorf("%w: closing", ErrUnavailable)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// errHaltedLeader refuses a proposal on a controller whose state machine halted: it
// could not apply it, and it hands the controller over (handOverHalted), so the write is
// sent again to the next one.
func errHaltedLeader(halted error) error {
	return fmt.Errorf("%w: its state machine is halted (%v)", ErrNotLeader, halted)
}

// ErrOutcomeUnknown means a metadata write was proposed but its outcome is unknown: the
// controller lost its leadership or shut down holding it, or Raft gave no answer within
// the apply timeout plus an election. It may have committed (and may still apply), or
// not. It is a kind of ErrUnavailable; the HTTP API answers 503 timeout.
var ErrOutcomeUnknown = fmt.Errorf("%w: the write's outcome is unknown", ErrUnavailable)

// applyLocal proposes c on this node, which must lead (and not be halted).
func (s *Store) applyLocal(c command) (applyResult, error) {
	if err := s.fsm.haltedErr(); err != nil {
		return applyResult{}, errHaltedLeader(err)
	}
	if c.Op == "set_status" && c.Status == StatusDecommissioning {
		// A decommission commits wholly before or wholly after an admission (admit)
		// and a write of the configuration's records (recordServers): either read the
		// member record, and a record they write for a node's new server (its disk was
		// wiped) would drop a decommission of its old one that committed in between.
		s.ctl.versionMu.Lock()
		defer s.ctl.versionMu.Unlock()
	}
	b, err := encodeCommand(c)
	if err != nil {
		return applyResult{}, err
	}
	deadline := time.Now().Add(s.raftBound())
	fut := s.raft.Apply(b, s.opts.ApplyTimeout)
	if err := s.await(fut, deadline, c.Op, true); err != nil {
		return applyResult{}, err
	}
	res := fut.Response().(applyResult)
	res.index = fut.Index()
	// The node that forwarded it waits to apply it, and the others act on it.
	s.nudge()
	return res, res.err
}

// nudge has the controller tell its followers its commit index now rather than at the
// next CommitTimeout: it asks nudgeLoop for a barrier, whose AppendEntries carry it.
func (s *Store) nudge() {
	if s.opts.Cluster.Transport == nil || s.alone.Load() {
		// No follower to tell. (A lone node's log gets no barrier between its
		// commands: alone is known only from the lease loop's first round on.)
		return
	}
	select {
	case s.nudges <- struct{}{}:
	default: // one is pending: it is appended after the commits so far
	}
}

// nudgeLoop appends a barrier for each nudge, one at a time, while this node leads;
// nudges that come while one is in flight share the next.
func (s *Store) nudgeLoop() {
	for {
		select {
		case <-s.stop:
			return
		case <-s.nudges:
		}
		if !s.Leader() {
			continue
		}
		done := make(chan struct{})
		fut := s.raft.Barrier(s.opts.ApplyTimeout)
		go func() {
			_ = fut.Error() // a barrier that fails changed nothing; the next commit or CommitTimeout tells
			close(done)
		}()
		select {
		case <-done:
		case <-s.stop:
			return
		}
		s.nudged.Add(1)
	}
}

// raftBound is how long a Raft request (a write, a barrier, a configuration change, a
// check of leadership) may take before its outcome counts as unknown: the apply
// timeout, within which Raft takes it into its log, plus an election timeout, within
// which a controller that lost its quorum steps down and fails what it holds.
func (s *Store) raftBound() time.Duration {
	return s.opts.ApplyTimeout + s.opts.Cluster.RaftTimeout
}

// await waits for a Raft future until deadline, and answers its error through
// leaderErr, or ErrOutcomeUnknown past the deadline. hashicorp/raft gives a future no
// bound once it took the request: a command's future is answered by the state-machine
// goroutine, which returns when Raft shuts down and drops the batches still queued for
// it without answering them (a Store closing under a forwarded write or a heartbeat,
// whose handlers it does not wait for, left them waiting for ever). The goroutine
// waiting on such a future stays; it holds only the future. A request that changes
// nothing (a barrier, a check of leadership) answers a plain ErrUnavailable where a
// write's outcome would be unknown.
func (s *Store) await(fut raft.Future, deadline time.Time, what string, write bool) error {
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var err error
	select {
	case err = <-done:
		if err == nil {
			return nil
		}
		err = leaderErr(err)
	case <-t.C:
		s.opts.Logger.Warn("meta: Raft gave no answer in time", "request", what, "bound", s.raftBound(), "state", s.raft.State().String())
		err = fmt.Errorf("%w: %s (Raft gave no answer within %v)", ErrOutcomeUnknown, what, s.raftBound())
	}
	if !write && errors.Is(err, ErrOutcomeUnknown) {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return err
}

// awaitWrite and awaitRead are await with the deadline starting now.
func (s *Store) awaitWrite(fut raft.Future, what string) error {
	return s.await(fut, time.Now().Add(s.raftBound()), what, true)
}

func (s *Store) awaitRead(fut raft.Future, what string) error {
	return s.await(fut, time.Now().Add(s.raftBound()), what, false)
}

// applyRemote sends c to the controller at addr, then waits until this replica has
// applied it, so the caller reads its own write.
func (s *Store) applyRemote(ctx context.Context, addr raft.ServerAddress, c command) (applyResult, error) {
	b, err := encodeCommand(c)
	if err != nil {
		return applyResult{}, err
	}
	resp, err := s.forward(ctx, addr, fwdRequest{Kind: kindApply, Cmd: b})
	res := applyResult{clusterID: resp.ClusterID, index: resp.Index, err: err}
	if resp.Topic != nil {
		res.topic = *resp.Topic
	}
	if resp.User != nil {
		res.user = *resp.User
	}
	if resp.Move != nil {
		res.move = *resp.Move
	}
	if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNotDelivered) || (err != nil && resp.Index == 0) {
		return res, err
	}
	if werr := s.waitApplied(ctx, resp.Index); werr != nil {
		if err != nil {
			return res, err // refused by the state machine: its outcome is known
		}
		// The controller committed the write (it answered with its index): not
		// "unavailable", which says no controller took it and invites sending it
		// again (a second remote child, or a conflict with the caller's own write).
		return res, fmt.Errorf("%w: committed as entry %d, not yet applied on this node: %w", ErrOutcomeUnknown, resp.Index, werr)
	}
	return res, err
}

// waitApplied waits until this replica's state machine has applied the command at index
// (and so every command before it), or every command up to index when the entry there
// carries none (see appliedThrough).
func (s *Store) waitApplied(ctx context.Context, index uint64) error {
	var scanned uint64 // entries up to it are known to carry no command
	for !s.appliedThrough(index, &scanned) {
		if err := s.fsm.haltedErr(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: the write committed but this node has not applied it yet", ErrUnavailable)
		case <-s.stop:
			return fmt.Errorf("%w: closing", ErrUnavailable)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// appliedThrough reports whether this node's state machine holds every command up to
// Raft index index. Its last applied command can stay below index for good: the
// entries after it may carry no command (the no-op a new controller writes when it
// takes over, a barrier, a configuration change), which Raft applies without the
// state machine seeing them. Then the node is current once Raft has applied through
// index and none of the entries after the last applied command is a command. (A node
// that waited for the state machine alone waited for the next command, which in a
// quiet cluster right after the controller was killed did not come for minutes.)
// scanned carries, from one call to the next, how far the entries were found to carry
// no command, so each entry is read once.
func (s *Store) appliedThrough(index uint64, scanned *uint64) bool {
	a := s.fsm.applied.Load()
	if a >= index {
		return true
	}
	// Raft's applied index counts entries handed to the state machine, not yet
	// applied by it: it says only that no entry up to index is still to come.
	if s.raft.AppliedIndex() < index {
		return false
	}
	for i := max(a, *scanned) + 1; i <= index; i++ {
		var l raft.Log
		err := s.bolt.GetLog(i, &l)
		if errors.Is(err, raft.ErrLogNotFound) {
			// Not in the log: folded into a snapshot. Every entry up to the last
			// snapshot's index is in the state, which Raft restored from it (a follower
			// that was away gets the controller's, whose last entries may carry no
			// command: they are in no log it will ever hold) or took it of.
			if snap := s.lastSnapshotIndex(); snap >= i {
				*scanned = min(snap, index)
				i = *scanned
				continue
			}
		}
		if err != nil || l.Type == raft.LogCommand {
			return false // a command not applied yet (or an entry not readable: wait)
		}
		*scanned = i
	}
	return true
}

// lastSnapshotIndex is the index of the last snapshot Raft took or restored (0: none).
func (s *Store) lastSnapshotIndex() uint64 {
	n, err := strconv.ParseUint(s.raft.Stats()["last_snapshot_index"], 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func (s *Store) apply(c command) (Topic, error) {
	res, err := s.applyCmd(c)
	return res.topic, err
}

func (s *Store) applyUser(c command) (auth.User, error) {
	res, err := s.applyCmd(c)
	return res.user, err
}

// CreateUser stores a new user; with seed it applies only while no admin was ever seeded.
// A name equal to an existing user's but for case is ErrUserExists: usernames are
// unique regardless of case (logins still match them exactly).
func (s *Store) CreateUser(u auth.User, seed bool) (auth.User, error) {
	s.fsm.mu.RLock()
	taken := s.fsm.nameTaken(u.Name)
	s.fsm.mu.RUnlock()
	if taken {
		return auth.User{}, ErrUserExists
	}
	return s.applyUser(command{Op: "create_user", User: &u, Seed: seed, Rules: cmdRules})
}

// DeleteUser removes a user; ErrLastAdmin when it is the last holding admin on "*".
func (s *Store) DeleteUser(name string) (auth.User, error) {
	// Refuse what the state would refuse without writing it to the log, where an older
	// binary (after a rollback) would replay it under its own rules. The state machine
	// checks again, for changes racing this one.
	if s.fsm.leavesNoAdmin(name, nil) {
		return auth.User{}, ErrLastAdmin
	}
	return s.applyUser(command{Op: "delete_user", Name: name, Rules: cmdRules})
}

// SetGrants replaces a user's grants; ErrLastAdmin when that would leave no user
// holding admin on "*".
func (s *Store) SetGrants(name string, gs []auth.Grant) (auth.User, error) {
	if gs == nil {
		gs = []auth.Grant{}
	}
	if s.fsm.leavesNoAdmin(name, gs) {
		return auth.User{}, ErrLastAdmin
	}
	return s.applyUser(command{Op: "set_grants", Name: name, Grants: gs, Rules: cmdRules})
}

// RestoreAdmin is the break-glass for a cluster where no user holds admin on "*" (a
// data directory from a version that let the last admin go): it gives the user of
// u.Name (created if need be) the hash u.Hash and admin on "*". ErrUserExists, and no
// change, while any user holds admin on "*".
func (s *Store) RestoreAdmin(u auth.User) (auth.User, error) {
	return s.applyUser(command{Op: "restore_admin", User: &u, Rules: cmdRules})
}

// HasAdmin reports whether any user holds admin on "*".
func (s *Store) HasAdmin() bool { return s.fsm.hasAdmin() }

// SetPassword replaces a user's password hash.
func (s *Store) SetPassword(name string, hash []byte) (auth.User, error) {
	return s.applyUser(command{Op: "set_password", Name: name, Hash: hash})
}

// User returns the user of that name as this node knows it.
func (s *Store) User(name string) (auth.User, bool) { return s.fsm.user(name) }

// UserByID returns the user with that ID as this node knows it; false when no user has
// it (IDs are never reused, so a deleted user's ID finds nobody).
func (s *Store) UserByID(id uint64) (auth.User, bool) { return s.fsm.userByID(id) }

// Users returns every user, sorted by name.
func (s *Store) Users() []auth.User { return s.fsm.userList() }

// CreateTopic stores a new topic and returns it with its incarnation. With t.Parent set
// the topic is created attached to that parent, copying from start (the parent's next
// offset per partition), or not created at all.
func (s *Store) CreateTopic(t Topic, start ...uint64) (Topic, error) {
	return s.apply(command{Op: "create_topic", Topic: &t, Start: start})
}

// AttachChild links child under parent with a delay, copying from start (per parent
// partition), which was read from parent incarnation parentInc: the attach is refused
// with a ConflictError if the parent is another incarnation by then (0: not checked).
func (s *Store) AttachChild(parent string, parentInc uint64, child string, delayMs int64, start []uint64) (Topic, error) {
	return s.apply(command{Op: "attach_child", Name: parent, ParentInc: parentInc, Child: child, Delay: delayMs, Start: start})
}

// DetachChild unlinks child from parent. It returns the Raft index of the detach (what
// a node has applied once it applied the detach).
func (s *Store) DetachChild(parent, child string) (Topic, uint64, error) {
	res, err := s.applyCmd(command{Op: "detach_child", Name: parent, Child: child})
	return res.topic, res.index, err
}

// DeleteTopic removes the topic name; with incarnation != 0 only that incarnation. It
// returns the topic as it was and the Raft index of the delete (what a node has applied
// once it applied the delete).
func (s *Store) DeleteTopic(name string, incarnation uint64) (Topic, uint64, error) {
	res, err := s.applyCmd(command{Op: "delete_topic", Name: name, Topic: &Topic{Incarnation: incarnation}})
	return res.topic, res.index, err
}

// CheckAlter returns what AlterTopic(name, a) would be refused for on this node's
// state now, without changing anything: a caller that commits another change with it
// (a replication factor) asks first, so that a refused alter leaves nothing changed.
// The controller's state may be newer: Sync first.
func (s *Store) CheckAlter(name string, a Alter) error {
	c := command{Op: "alter_topic", Name: name, Alter: &a}
	if err := c.check(); err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	if err := s.gateCmd(c); err != nil {
		return err
	}
	s.fsm.mu.RLock()
	defer s.fsm.mu.RUnlock()
	_, err := s.fsm.altered(name, a)
	return err
}

// AlterTopic changes a topic's live-tunable settings.
func (s *Store) AlterTopic(name string, a Alter) (Topic, error) {
	return s.apply(command{Op: "alter_topic", Name: name, Alter: &a})
}

// AlterWithReplicationFactor changes a topic's live-tunable settings and its
// replication factor in one command: both or neither (cluster version 4,
// FeatureOneAlter).
func (s *Store) AlterWithReplicationFactor(name string, a Alter, rf int32) (Topic, error) {
	return s.apply(command{Op: "alter_with_replication_factor", Name: name, Alter: &a, MoveOp: &MoveOp{RF: rf, NowMs: nowMs()}})
}

// Topic returns the topic of that name as this node knows it.
func (s *Store) Topic(name string) (Topic, bool) { return s.fsm.topic(name) }

// Topics returns every topic, sorted by name.
func (s *Store) Topics() []Topic { return s.fsm.list() }

// Close stops the node's loops and its Raft node, and closes its stores.
func (s *Store) Close() error {
	var err error
	s.closeMu.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.ready.Store(false)
		err = s.raft.Shutdown().Error()
		if cerr := s.bolt.Close(); err == nil {
			err = cerr
		}
	})
	return err
}

// slogWriter adapts Raft's hclog output to the process logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn("raft", "line", string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
