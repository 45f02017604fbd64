// Package broker ties the control plane (topics in Raft) to the data plane (open
// partitions) and implements the operations the HTTP API serves: produce with partition
// routing, consume across partitions with long polling, settle, replay.
package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/format"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// Options configures a Broker.
type Options struct {
	// DataDir holds everything the node stores: meta/ (Raft) and topics/.
	DataDir string
	// NodeID names this node; empty means the one stored in DataDir, or a new one.
	NodeID string
	// Logger receives the broker's logs; nil means slog.Default().
	Logger *slog.Logger
	// Defaults fills the settings a create leaves out.
	Defaults TopicDefaults
	// SegmentBytes is the message log segment size (0: the storage default).
	SegmentBytes int64
	// NoLeaderLease keeps the partitions this node leads from serving consumes under
	// their leader lease (docs/internals/replication.md): each consume then commits its
	// deliveries through a quorum first. For a node whose machine may be frozen longer
	// than the lease's margin (a hypervisor that stops guests, live migration).
	NoLeaderLease bool
	// SnapshotEntries is how many entries a replicated partition's Raft log takes
	// between two snapshots (0: raftetcd's default).
	SnapshotEntries int
	// RetentionInterval is how often retention runs (default 10 s).
	RetentionInterval time.Duration
	// Metrics receives counters; nil means a private registry.
	Metrics *Metrics
	// MaxLongPolls caps consume requests parked at once (default 10000); past it a
	// consume that would wait answers 503 with Retry-After.
	MaxLongPolls int
	// Syncer makes the sync that partition writes share; the binary chooses it
	// (--sync-mode). nil means GroupSync.
	Syncer Syncer
	// WAL makes the appends of every partition that is not replicated (message logs
	// and settle journals) durable through the node's one write-ahead file
	// (DataDir/wal, package storage/wal; --sync-mode wal) instead of a sync of each
	// file they went to. The Syncer still serves every other file, and the
	// write-ahead file's checkpoints.
	WAL bool
	// WALNoHold makes the write-ahead file's rounds sync the plain way
	// (--wal-hold-processor=false) instead of holding the writer's processor through
	// each sync (wal.Options.HoldProcessor).
	WALNoHold bool
	// Version names this binary in the data directory's FORMAT file and in format
	// errors (e.g. "1.4.0"; empty: "unknown").
	Version string
	// UpgradeFormat lets Open run a data-directory upgrade that only a backup can undo
	// (format.Options.AllowUpgrade); upgrades that can be rolled back run without it.
	UpgradeFormat bool
	// Cluster says how this node finds and talks to the other nodes of its control
	// plane; the zero value is a lone node.
	Cluster meta.Cluster
	// Peers reaches the other nodes' data planes. With it, this node opens only the
	// partitions placed on it and forwards the rest; without it (a lone node) it holds
	// every partition.
	Peers Peers
	// Node is the node plane partitions replicate over (with Peers, in a cluster):
	// with it, a topic's partitions have replication_factor replicas, each a Raft
	// group (replication.go). Without it every partition has one replica.
	Node *transport.Node
	// MaxPeerInflight bounds the forwarded requests in flight to one node (default
	// DefaultMaxPeerInflight); past it a forwarded request answers 503.
	MaxPeerInflight int
	// Unlock, when set, says the caller already holds the data directory's lock
	// (format.Lock; the binary takes it before it starts the node plane) and releases
	// it: Open owns it from then on, releasing it when it fails and in Close. Without
	// it Open takes the lock itself.
	Unlock func()
	// StatsInterval is how often the stats route's samples are taken (default
	// DefaultStatsInterval; see stats.go).
	StatsInterval time.Duration
	// SecretKeys reads the cluster secrets, which remote children's passwords are
	// sealed under (credentials.go); nil on a lone node, which keeps its own key.
	SecretKeys SecretKeys
}

// The sync modes: the names --sync-mode takes.
const (
	SyncGroup = "group"
	SyncFile  = "file"
	SyncWAL   = "wal"
)

// A Syncer makes the sync shared by the partitions under topicsDir, and what must be
// closed after it; Open calls it once the data directory is prepared (the directory
// exists then). A nil group means every write gets its own fdatasync.
type Syncer func(topicsDir string) (*vfs.SyncGroup, io.Closer, error)

// GroupSync shares one file-system sync between every partition that has writes
// waiting (syncfs(2) through topicsDir, held open from the start so every write-back
// error is seen; per-file fdatasync where the kernel cannot report its errors).
func GroupSync(topicsDir string) (*vfs.SyncGroup, io.Closer, error) {
	fss, err := vfs.NewFSSyncer(topicsDir)
	if err != nil {
		return nil, nil, err
	}
	return vfs.NewSyncGroup(fss), fss, nil
}

// FileSync gives every write its own fdatasync: no shared group.
func FileSync(string) (*vfs.SyncGroup, io.Closer, error) { return nil, nil, nil }

// SyncerFor returns the Syncer of a sync mode's name (false for an unknown name).
func SyncerFor(mode string) (Syncer, bool) {
	switch mode {
	case SyncGroup, SyncWAL, "":
		return GroupSync, true
	case SyncFile:
		return FileSync, true
	}
	return nil, false
}

// TopicDefaults are the settings of a topic created without them.
type TopicDefaults struct {
	Partitions    int32
	RetentionMs   int64
	VisibilityMs  int64
	MaxInFlight   int32
	MaxAckedAhead int32
}

// DefaultTopicDefaults are the documented defaults.
var DefaultTopicDefaults = TopicDefaults{
	Partitions:    3,
	RetentionMs:   7 * 24 * 3600 * 1000,
	VisibilityMs:  30_000,
	MaxInFlight:   1024,
	MaxAckedAhead: 1024,
}

// Broker is a single node's broker. It is safe for concurrent use.
type Broker struct {
	opts    Options
	log     *slog.Logger
	meta    *meta.Store
	metrics *Metrics
	unlock  func() // releases the data directory's lock (format.Lock)

	// forceLeaderWrite, when set (by tests), stands for meta's ForceLeader.
	forceLeaderWrite func(topic string, incarnation uint64, p int32, node string) (meta.Topic, error)

	// placeMu orders the changes of which partitions this node holds (opening a
	// topic, a move adding or removing a replica here, closing a topic).
	placeMu sync.Mutex
	// moveReports is when this node last recorded each move's progress.
	moveReports struct {
		sync.Mutex
		at map[uint64]time.Time
	}

	mu     sync.RWMutex
	topics map[string]*topic

	syncer     *vfs.SyncGroup // nil in file sync mode
	syncCloser io.Closer      // what the Syncer opened for the group (nil: nothing)
	wal        *wal.WAL       // nil unless Options.WAL
	// walDirs holds the directories of the partitions opened unreplicated, whose
	// appends went through the WAL, since this process started (openReplica).
	walDirs   sync.Map
	walSyncer io.Closer    // the syncfs descriptor of the WAL's checkpoints
	walFailed chan error   // receives the WAL's failure, once (StorageFailed)
	repl      *replication // nil without Options.Node
	// replHost is repl.host for the control plane's goroutines, which start before
	// repl is set (Cluster.PeerUnfit).
	replHost    atomic.Pointer[raftetcd.Host]
	longPolls   atomic.Int64
	copiersMu   sync.Mutex
	copiers     map[copierKey]*copier
	reconcileMu sync.Mutex
	ready       atomic.Bool
	closing     atomic.Bool
	stop        chan struct{}
	draining    chan struct{}
	drainOnce   sync.Once
	wg          sync.WaitGroup
	changed     chan struct{}
	// retainKick asks the retention loop for a pass now (a topic's settings changed).
	retainKick chan struct{}
	// sweepPending: a deleted topic's data was kept because the metadata was not
	// current then; the reconcile loop sweeps once it is.
	sweepPending atomic.Bool
	remote       *remote
	// reconciled wakes whoever waits for the reconcile loop to open (or close) what
	// the metadata now holds; it fires after every pass.
	reconciled signal
	// reconciledThrough is the metadata index the last finished reconcile pass
	// covered: everything the metadata held at that index is open, closed or changed.
	reconciledThrough atomic.Uint64
	stats             *statsRecorder
	// Remote children (remotechild.go): their copiers by ID, and the lock of the
	// node's credentials key file.
	rcMu     sync.Mutex
	rcopiers map[uint64]*remoteCopier
	credMu   sync.Mutex
}

// topic is the running form of one topic incarnation.
type topic struct {
	name        string
	incarnation uint64
	cur         atomic.Pointer[meta.Topic] // settings; replaced whole on alter
	schema      atomic.Pointer[compiledSchema]
	dir         string
	// partsP holds the partitions, nil where another node holds the partition (the
	// topic's placement names which). It is replaced whole (copy on write) when a
	// move adds or removes a replica here; parts() reads it.
	partsP atomic.Pointer[[]*partition.Partition]
	// openedAs is, per partition held here, the group it was opened in ("" for a
	// partition of one replica that is no group): a change (a replication factor
	// raised from 1, a forced takeover) reopens it. Guarded by Broker.placeMu once
	// the topic is published.
	openedAs []string
	// rebuild holds the partitions whose replica here met a damaged record while it
	// served: followPlacement sets its data aside and reopens it, and its group
	// rebuilds it from the intact copies.
	rebuildMu sync.Mutex
	rebuild   map[int]bool
	// closed holds the partitions whose replica here is left closed, with the group
	// whose own log (raft/) is damaged (leaveClosed). Guarded by rebuildMu.
	closed  map[int]string
	waiting atomic.Int32  // consumes parked on this topic
	produce atomic.Uint32 // round-robin for keyless produce
	consume atomic.Uint32 // first partition tried by the next consume
	att     *attendance   // who consumes the partitions (attend.go)
	// sig is broadcast when a message may have become available, and when what this
	// node leads or holds of the topic changes (a leadership won or lost, a replica
	// opened or set aside): parked consumes and the copiers wake on it.
	sig     signal
	done    chan struct{} // closed when the incarnation is closed
	metrics *topicMetrics
}

// parts returns the topic's partitions as they are now (see partsP): index i is nil
// where this node holds no replica of partition i.
func (t *topic) parts() []*partition.Partition { return *t.partsP.Load() }

// markRebuild asks for this node's replica of partition i to be rebuilt.
func (t *topic) markRebuild(i int) {
	t.rebuildMu.Lock()
	defer t.rebuildMu.Unlock()
	if t.rebuild == nil {
		t.rebuild = map[int]bool{}
	}
	t.rebuild[i] = true
}

// damagedOnReplica reports whether partition i is a replica with peers, and then marks
// it for a rebuild: a record damaged here is intact on them, so a copy of the partition
// (fan-out, a remote child) must not skip it for good as a lone copy does. This replica
// hands its leadership over and is rebuilt; the next leader copies the record from its
// own copy.
func (t *topic) damagedOnReplica(i int) bool {
	m := t.cur.Load()
	if i >= len(m.Placement) || len(m.Placement[i].Replicas) < 2 {
		return false
	}
	t.markRebuild(i)
	return true
}

// takeRebuild reports, once, whether partition i was marked for a rebuild.
func (t *topic) takeRebuild(i int) bool {
	t.rebuildMu.Lock()
	defer t.rebuildMu.Unlock()
	if !t.rebuild[i] {
		return false
	}
	delete(t.rebuild, i)
	return true
}

// setPart replaces partition i (nil: none held here). The caller serializes changes.
func (t *topic) setPart(i int, p *partition.Partition) {
	next := slices.Clone(t.parts())
	next[i] = p
	t.partsP.Store(&next)
}

// Open opens (or creates) the node's data directory and starts serving once its
// metadata and partitions are recovered; Ready reports when.
func Open(opts Options) (*Broker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Defaults == (TopicDefaults{}) {
		opts.Defaults = DefaultTopicDefaults
	}
	if opts.RetentionInterval == 0 {
		opts.RetentionInterval = 10 * time.Second
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.MaxLongPolls <= 0 {
		opts.MaxLongPolls = 10_000
	}
	if opts.Syncer == nil {
		opts.Syncer = GroupSync
	}
	if opts.MaxPeerInflight <= 0 {
		opts.MaxPeerInflight = DefaultMaxPeerInflight
	}
	// The directory's lock first: a second process on a directory in use (a node
	// started twice, a downgrade-format) would replay the write-ahead file under the
	// first one's feet. It is held until Close has closed everything.
	unlock := opts.Unlock
	opened := false
	defer func() {
		if !opened && unlock != nil {
			unlock()
		}
	}()
	if err := vfs.MkdirAllSync(vfs.OS{}, opts.DataDir, 0o700); err != nil {
		return nil, err
	}
	if unlock == nil {
		var err error
		if unlock, err = format.Lock(opts.DataDir); err != nil {
			return nil, err
		}
	}
	// Files installed by a rename (node-id, FORMAT, the credentials key,
	// meta/identity.json, meta/member-since) whose directory entry a killed process
	// did not sync yet read as present from the page cache; a node acting on them (a
	// node that joins under an identity) would be contradicted by a power loss (it
	// comes back as another). Their directories are synced before they are read.
	for _, d := range []string{opts.DataDir, filepath.Join(opts.DataDir, "meta")} {
		if err := (vfs.OS{}).SyncDir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("syncing %s before reading it: %w", d, err)
		}
	}
	// The format is checked before anything in the directory is read or written, so a
	// newer directory is never misread and an older one is upgraded first.
	version := opts.Version
	if version == "" {
		version = "unknown"
	}
	if _, err := format.Prepare(opts.DataDir, format.Options{
		WrittenBy:    "narad " + version,
		Logger:       opts.Logger,
		AllowUpgrade: opts.UpgradeFormat,
	}); err != nil {
		return nil, err
	}
	if err := vfs.MkdirAllSync(vfs.OS{}, filepath.Join(opts.DataDir, "topics"), 0o700); err != nil {
		return nil, err
	}
	id, err := nodeID(opts.DataDir, opts.NodeID)
	if err != nil {
		return nil, err
	}
	opts.NodeID = id
	b := &Broker{
		opts:       opts,
		log:        opts.Logger,
		metrics:    opts.Metrics,
		topics:     make(map[string]*topic),
		copiers:    make(map[copierKey]*copier),
		stop:       make(chan struct{}),
		draining:   make(chan struct{}),
		changed:    make(chan struct{}, 1),
		retainKick: make(chan struct{}, 1),
		remote:     newRemote(),
		walFailed:  make(chan error, 1),
		stats:      newStatsRecorder(opts.StatsInterval),
	}
	// Partition data lives under topics/, which exists now.
	if b.syncer, b.syncCloser, err = opts.Syncer(filepath.Join(opts.DataDir, "topics")); err != nil {
		return nil, err
	}
	observe := func(files int, d time.Duration) {
		b.metrics.SyncDuration.Observe(d.Seconds())
		b.metrics.SyncGroupFiles.Observe(float64(files))
		b.stats.syncs.observe(files, d)
	}
	if b.syncer != nil {
		stats := b.syncer.Stats
		b.metrics.syncStats.Store(&stats)
		b.syncer.Observe(observe)
	}
	if opts.WAL {
		err = b.openWAL(observe)
	} else {
		err = b.replayWAL()
	}
	if err != nil {
		b.closeSyncer()
		return nil, err
	}
	mc := opts.Cluster
	if opts.Node != nil {
		mc.Ends = b.replicaEnds
	}
	mc.DiskStalled = b.walStalled
	mc.PeerUnfit = func(serverID string) bool {
		h := b.replHost.Load() // set once replication starts, after the control plane
		return h != nil && (h.PeerSilent(raftID(serverID)) || h.PeerStalled(raftID(serverID)))
	}
	b.meta, err = meta.Open(meta.Options{
		Dir:      filepath.Join(opts.DataDir, "meta"),
		NodeID:   id,
		Logger:   opts.Logger,
		OnChange: b.metaChanged,
		Cluster:  mc,
	})
	if err != nil {
		b.closeSyncer()
		return nil, err
	}
	if opts.Node != nil {
		if err := b.startReplication(opts.Node); err != nil {
			_ = b.meta.Close() // the replication error is the one to report
			b.closeSyncer()
			return nil, err
		}
	}
	b.metrics.broker.Store(b) // the state gauges of /metrics read this broker now
	b.unlock, opened = unlock, true
	return b, nil
}

func (b *Broker) closeSyncer() {
	if b.wal != nil {
		if err := b.wal.Close(); err != nil {
			b.log.Error("closing the write-ahead file: its last checkpoint failed; the next start replays it", "err", err)
		}
		_ = b.walSyncer.Close() // the directory held for syncfs
	}
	if b.syncer != nil {
		b.syncer.Close()
	}
	if b.syncCloser != nil {
		_ = b.syncCloser.Close() // the directory held for syncfs; every write was synced before it was acknowledged
	}
}

// syncerOrNil keeps a nil *vfs.SyncGroup from becoming a non-nil interface.
func (b *Broker) syncerOrNil() segment.Syncer {
	if b.syncer == nil {
		return nil
	}
	return b.syncer
}

// Start waits for the control plane to be current, opens every partition, removes data
// of topics that no longer exist, and starts background work. It returns once the node
// is ready.
func (b *Broker) Start(ctx context.Context) error {
	if err := b.meta.WaitReady(ctx); err != nil {
		return err
	}
	if err := b.reconcile(true); err != nil {
		return err
	}
	b.wg.Add(5)
	go b.diskStallLoop()
	go b.replicationLoop()
	go b.retentionLoop()
	go b.reconcileLoop()
	go b.statsLoop()
	b.ready.Store(true)
	return nil
}

// Ready reports whether the node serves requests: it started, is not closing, and its
// metadata is current (caught up with the controller; see meta.Store.Ready) as far as
// its open topics go: the reconcile pass that opened and closed them has processed a
// catch-up with the controller that started less than the metadata lease ago. A topic
// deleted on the controller before that catch-up is closed here.
func (b *Broker) Ready() bool {
	return b.ready.Load() && !b.closing.Load() && b.meta.Ready() && b.meta.CurrentThrough(b.reconciledThrough.Load())
}

// Drain starts a graceful stop: the node reports not ready, new requests get 503, and
// parked long polls return at once, so an HTTP server shutdown finishes quickly.
func (b *Broker) Drain() {
	b.drainOnce.Do(func() {
		b.ready.Store(false)
		close(b.draining)
	})
}

// StorageFailed receives, once, the error that failed the node's write-ahead file
// closed (--sync-mode wal): from then on no partition of the node can store a write
// until the process starts again and replays the file. `narad serve` exits at once
// when it receives it (fail-stop), as after a crash. Without a write-ahead file it
// never receives.
func (b *Broker) StorageFailed() <-chan error { return b.walFailed }

// NodeID returns this node's id.
func (b *Broker) NodeID() string { return b.opts.NodeID }

// Metrics returns the broker's metrics.
func (b *Broker) Metrics() *Metrics { return b.metrics }

func (b *Broker) metaChanged() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

func (b *Broker) reconcileLoop() {
	defer b.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-b.changed:
			if err := b.reconcile(false); err != nil {
				b.log.Error("applying topic changes failed", "err", err)
			}
		case <-tick.C:
			if b.sweepPending.Load() && b.meta.Ready() {
				b.sweepPending.Store(false)
				if err := b.reconcile(true); err != nil {
					b.log.Error("removing data of deleted topics failed", "err", err)
				}
			}
		}
	}
}

// reconcile makes the open partitions match the control plane's topics: it opens new
// incarnations, closes and deletes the data of removed ones, and pushes changed
// settings. With sweep it also deletes directories no topic owns (left by a crash
// between a delete and its clean-up); only call it once the metadata is current.
func (b *Broker) reconcile(sweep bool) error {
	b.syncPeers()
	b.reconcileMu.Lock()
	defer b.reconcileMu.Unlock()
	// Read before the topics: the state read next holds at least this much.
	through := b.meta.AppliedIndex()
	defer b.reconciled.broadcast()
	defer func() { b.reconciledThrough.Store(max(b.reconciledThrough.Load(), through)) }()
	want := b.meta.Topics()
	wantDirs := make(map[string]bool, len(want))

	b.mu.RLock()
	var stale []*topic
	live := make(map[string]bool, len(want))
	for _, m := range want {
		live[m.Name] = true
		wantDirs[topicDirName(m)] = true
		if t, ok := b.topics[m.Name]; ok && t.incarnation != m.Incarnation {
			stale = append(stale, t)
		}
	}
	for name, t := range b.topics {
		if !live[name] {
			stale = append(stale, t)
		}
	}
	b.mu.RUnlock()

	for _, t := range stale {
		b.mu.Lock()
		if b.topics[t.name] == t {
			delete(b.topics, t.name)
		}
		b.mu.Unlock()
		// Deleting files is the one step that cannot be undone: take it only on
		// metadata that is current; otherwise keep the data for a later sweep.
		remove := b.meta.Ready()
		if !remove {
			b.sweepPending.Store(true)
			b.log.Warn("keeping a deleted topic's data until the metadata is current", "topic", t.name, "incarnation", t.incarnation)
		}
		b.closeTopic(t, remove)
	}

	var firstErr error
	for _, m := range want {
		b.mu.RLock()
		t, ok := b.topics[m.Name]
		b.mu.RUnlock()
		if ok {
			if !reflect.DeepEqual(*t.cur.Load(), m) {
				b.applySettings(t, m)
			}
			b.refreshSchema(t, m, want)
			continue
		}
		t, err := b.openTopic(m)
		if err != nil {
			b.log.Error("opening topic failed", "topic", m.Name, "incarnation", m.Incarnation, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		b.refreshSchema(t, m, want)
		b.stats.track(t, partition.WallMillis()) // before any produce can reach it
		b.mu.Lock()
		b.topics[m.Name] = t
		b.mu.Unlock()
	}
	b.reconcileCopiers(want)
	b.reconcileRemoteChildren()

	if sweep && !b.meta.Ready() {
		b.sweepPending.Store(true)
		sweep = false
	}
	if sweep {
		root := filepath.Join(b.opts.DataDir, "topics")
		entries, err := os.ReadDir(root)
		if err != nil {
			return err
		}
		applied := b.meta.AppliedIndex()
		for _, e := range entries {
			if !wantDirs[e.Name()] {
				// A directory is deleted only when this node has applied the command that
				// created it (its incarnation) and, since the topic is not in the state,
				// the one that deleted it. A newer incarnation than the metadata knows
				// means the metadata lost entries (damage, a bad restore): keep the data.
				inc, _, _ := strings.Cut(e.Name(), "-")
				if n, err := strconv.ParseUint(inc, 10, 64); err != nil || n > applied {
					b.log.Error("keeping topic data the metadata does not know; the metadata store may be damaged or restored from an older backup",
						"dir", e.Name(), "metadata_applied_index", applied)
					continue
				}
				b.log.Info("removing data of a deleted topic", "dir", e.Name())
				if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
					b.log.Error("removing data of a deleted topic failed", "dir", e.Name(), "err", err)
				}
			}
		}
	}
	return firstErr
}

func topicDirName(m meta.Topic) string {
	return strconv.FormatUint(m.Incarnation, 10) + "-" + m.Name
}

func queueConfig(m meta.Topic) queue.Config {
	return queue.Config{
		Visibility:    time.Duration(m.VisibilityMs) * time.Millisecond,
		MaxInFlight:   int(m.MaxInFlight),
		MaxAckedAhead: int(m.MaxAckedAhead),
	}
}

// openPart opens this node's partition i of t (m is t's metadata): a replica of its
// group when it is replicated.
func (b *Broker) openPart(t *topic, m meta.Topic, i int32) (*partition.Partition, error) {
	if h := openPartHook.Load(); h != nil {
		if err := (*h)(b, m.Name, i); err != nil {
			return nil, err
		}
	}
	popts := partition.Options{
		Dir:          filepath.Join(t.dir, strconv.Itoa(int(i))),
		Index:        uint32(i),
		Queue:        queueConfig(m),
		SegmentBytes: b.opts.SegmentBytes,
		Syncer:       b.syncerOrNil(),
		WAL:          b.walOrNil(),
		Logger:       b.log.With("topic", m.Name, "partition", i),
		OnAvailable:  t.sig.broadcast,
		OnDamaged: func(log string, n int) {
			b.metrics.Damaged.WithLabelValues(m.Name, log).Add(float64(n))
		},
		OnExpired:    func(n int) { t.metrics.expiries.Add(float64(n)) },
		OnLateLeases: func(n int) { t.metrics.late.Add(float64(n)) },
	}
	if b.replicated(&m, int(i)) {
		return b.openReplica(t, m, int(i), popts)
	}
	if b.wal != nil {
		b.walDirs.Store(popts.Dir, true)
	}
	return partition.Open(popts)
}

// openPartHook, set only by serial tests (never with t.Parallel), runs as a partition
// is opened (a slow open, or a failing one: its error is the open's).
var openPartHook atomic.Pointer[func(b *Broker, topic string, i int32) error]

func (b *Broker) openTopic(m meta.Topic) (*topic, error) {
	t := &topic{name: m.Name, incarnation: m.Incarnation, dir: filepath.Join(b.opts.DataDir, "topics", topicDirName(m)), done: make(chan struct{})}
	t.metrics = b.metrics.forTopic(m.Name)
	t.cur.Store(&m)
	parts := make([]*partition.Partition, m.Partitions)
	t.partsP.Store(&parts)
	t.att = newAttendance(int(m.Partitions))
	t.openedAs = make([]string, m.Partitions)
	for i := int32(0); i < m.Partitions; i++ {
		if !b.holds(m, i) {
			b.warnOrphan(m, i, filepath.Join(t.dir, strconv.Itoa(int(i))))
			continue
		}
		p, err := b.openPart(t, m, i)
		if err != nil && b.leaveClosed(t, m, int(i), err) {
			continue
		}
		if err != nil {
			for j, q := range parts {
				if q != nil {
					b.closeReplica(t, j)
					_ = q.Close() // the open error is the one to report
				}
			}
			return nil, err
		}
		parts[i] = p
		t.openedAs[i] = groupOf(&m, int(i))
	}
	return t, nil
}

// holds reports whether partition i of topic m is this node's to open: every partition
// on a lone node (or one placed before the cluster had members), else the partitions
// the placement gives this node.
func (b *Broker) holds(m meta.Topic, i int32) bool {
	if b.opts.Peers == nil || int(i) >= len(m.Placement) {
		return true
	}
	if b.replicated(&m, int(i)) {
		return slices.Contains(m.Placement[i].Replicas, b.opts.NodeID) || slices.Contains(m.Placement[i].Learners, b.opts.NodeID)
	}
	return m.Placement[i].Leader == b.opts.NodeID
}

// warnOrphan says, once per open, that this node keeps data of a partition placed on
// another node: a node of a version that kept a copy of every partition took
// messages there, and they are not served from here. The data stays untouched.
func (b *Broker) warnOrphan(m meta.Topic, i int32, dir string) {
	if !hasData(dir) {
		return
	}
	b.log.Warn("this node holds data of a partition placed on another node; it is not served from here and is left on disk (see docs/operating/cluster.md)",
		"topic", m.Name, "partition", i, "dir", dir, "placed_on", m.Placement[i].Leader)
}

// hasData reports whether a partition directory holds any non-empty file.
func hasData(dir string) bool {
	found := false
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || found {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			if info, err := d.Info(); err == nil && info.Size() > 0 {
				found = true
			}
		}
		return nil
	})
	return found
}

func sameTopic(a, b meta.Topic) bool {
	return a.Incarnation == b.Incarnation && a.RetentionMs == b.RetentionMs && a.VisibilityMs == b.VisibilityMs &&
		a.MaxInFlight == b.MaxInFlight && a.MaxAckedAhead == b.MaxAckedAhead && string(a.Schema) == string(b.Schema)
}

func (b *Broker) applySettings(t *topic, m meta.Topic) {
	old := t.cur.Swap(&m)
	if sameTopic(*old, m) {
		return // only the fan-out links changed
	}
	for _, p := range t.parts() {
		if p != nil {
			p.SetConfig(queueConfig(m))
		}
	}
	// A shorter retention is enforced by the retention loop, asked for a pass now.
	// Enforced here, inside the reconcile pass (which holds reconcileMu, and which the
	// alter's answer waits for), a retention shortened on a large backlog held the
	// alter's answer and every create, alter and delete through this node until its
	// segments were deleted: seconds to minutes (a review, 6 December).
	select {
	case b.retainKick <- struct{}{}:
	default: // a pass is asked for already
	}
}

// compiledSchema is a topic's effective schema (its own, or its parent's for a child
// without one), compiled once.
type compiledSchema struct {
	raw    string
	schema *topicSchema
	err    error // why a stored schema does not compile; produce is refused
}

func (b *Broker) refreshSchema(t *topic, m meta.Topic, all []meta.Topic) {
	raw := m.Schema
	if len(raw) == 0 && m.Parent != "" {
		for _, p := range all {
			if p.Name == m.Parent {
				raw = p.Schema
			}
		}
	}
	if cur := t.schema.Load(); cur != nil && cur.raw == string(raw) {
		return
	}
	s, err := compileSchema(raw)
	if err != nil {
		// Schemas are checked before they are stored, so this is one an older version
		// accepted and this one refuses (or a bug). The topic stays up for consumers;
		// produce is refused, since nothing unchecked may be written, until the schema
		// is replaced.
		b.log.Error("stored schema refused; produce to this topic is refused until its schema is replaced", "topic", m.Name, "err", err)
		t.schema.Store(&compiledSchema{raw: string(raw), err: err})
		return
	}
	t.schema.Store(&compiledSchema{raw: string(raw), schema: s})
}

// closeTopic closes a topic's partitions, wakes its waiting consumers, and with remove
// deletes its data.
func (b *Broker) closeTopic(t *topic, remove bool) {
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	close(t.done)
	t.sig.broadcast()
	t.rebuildMu.Lock()
	if len(t.closed) > 0 {
		b.metrics.ReplicasClosed.WithLabelValues(t.name).Sub(float64(len(t.closed)))
	}
	t.rebuildMu.Unlock()
	for i, p := range t.parts() {
		if p == nil {
			continue
		}
		b.closeReplica(t, i)
		if err := p.Close(); err != nil {
			b.log.Warn("closing partition", "topic", t.name, "err", err)
		}
	}
	if remove {
		if err := b.checkpointWAL("deleting a topic's data"); err != nil {
			return
		}
		if err := os.RemoveAll(t.dir); err != nil {
			b.log.Error("removing topic data failed; it is retried at the next start", "dir", t.dir, "err", err)
		} else if err := (vfs.OS{}).SyncDir(filepath.Dir(t.dir)); err != nil {
			b.log.Warn("syncing the directory of a removed topic failed; a power loss may bring its data back until the next start removes it", "dir", t.dir, "err", err)
		}
	}
}

func (b *Broker) retentionLoop() {
	defer b.wg.Done()
	tick := time.NewTicker(b.opts.RetentionInterval)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		case <-b.retainKick:
		}
		for _, t := range b.topicList() {
			b.enforceRetention(t)
		}
	}
}

// retentionHook, set only by serial tests (never with t.Parallel), runs as retention
// starts on a topic (a slow pass).
var retentionHook atomic.Pointer[func(topic string)]

func (b *Broker) enforceRetention(t *topic) {
	if h := retentionHook.Load(); h != nil {
		(*h)(t.name)
	}
	cutoff := partition.WallMillis() - t.cur.Load().RetentionMs
	for i, p := range t.parts() {
		if p == nil {
			continue // its holder enforces it
		}
		n, err := p.EnforceRetention(cutoff)
		if err != nil && !errors.Is(err, partition.ErrClosed) {
			b.log.Error("retention failed", "topic", t.name, "partition", i, "err", err)
		}
		if n > 0 {
			t.metrics.retained.Add(float64(n))
			b.log.Info("retention removed messages", "topic", t.name, "partition", i, "messages", n)
		}
	}
}

// Close stops background work and closes every partition; the data stays.
func (b *Broker) Close() error {
	if b.closing.Swap(true) {
		return nil
	}
	b.Drain()
	b.handOverLeadership(handOverWait)
	close(b.stop)
	b.wg.Wait()
	b.stopCopiers()
	b.stopRemoteCopiers()
	b.mu.Lock()
	ts := b.topics
	b.topics = map[string]*topic{}
	b.mu.Unlock()
	for _, t := range ts {
		b.closeTopic(t, false)
	}
	if b.repl != nil {
		b.repl.host.Close()
		if b.repl.sync != b.syncer {
			b.repl.sync.Close()
		}
	}
	b.closeSyncer()
	err := b.meta.Close()
	b.unlock()
	return err
}

// nodeID returns the node id stored in dataDir, storing want (or a new random id) on
// first start. A different want than the stored id is refused: the id is part of the
// node's identity in the cluster.
func nodeID(dataDir, want string) (string, error) {
	path := filepath.Join(dataDir, "node-id")
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if want != "" && want != id {
			return "", fmt.Errorf("data dir %s belongs to node %q, not %q", dataDir, id, want)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	id := want
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, time.Now().UnixNano()%1_000_000)
	}
	if err := vfs.WriteFileSync(path, []byte(id+"\n")); err != nil {
		return "", err
	}
	return id, nil
}

// signal wakes every goroutine waiting for "something may be available".
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed by the next broadcast.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) broadcast() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}
