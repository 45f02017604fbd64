package broker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// leaderWait bounds how long a request for a replicated partition looks for its
// leader (an election after a leader died takes about 1–1.5 s) before it answers 503.
const leaderWait = 4 * time.Second

// leaseLeaderWait is leaderWait for a lease: a consume passes over a partition without
// a leader for now (and rechecks while it waits) instead of blocking on it.
const leaseLeaderWait = 250 * time.Millisecond

// leaseLeaderWaitHook, when set (by serial tests, never with t.Parallel), replaces
// leaseLeaderWait.
var leaseLeaderWaitHook atomic.Pointer[time.Duration]

// replication runs this node's replicas of replicated partitions: one etcd-io/raft
// group per partition (raftetcd), on the node plane (docs/internals/replication.md).
type replication struct {
	host *raftetcd.Host
	sync *vfs.SyncGroup
	born int64 // when this data directory was made (Unix ms): see openReplica's join

	mu      sync.Mutex
	nodes   map[uint64]string // raft id → node id, of every member seen
	leaders map[string]string // group id → the leader last learned from another node
	handing map[string]bool   // group ids being handed over from here (claimHandOver)
	// refused is, by group id, the voter the last handover from here went to that did
	// not happen: the next one tries the others first (handOverTo).
	refused map[string]uint64

	// kick runs the placement pass at once (not at the next second): a replica that
	// failed a write must leave the leadership without waiting.
	kick chan struct{}
}

// kickPlacement has the replication loop follow the placement (and rebuild what is
// marked) now.
func (b *Broker) kickPlacement() {
	if b.repl == nil {
		return
	}
	select {
	case b.repl.kick <- struct{}{}:
	default: // one is pending already
	}
}

// raftID is a node's id in every partition group: a hash of its Raft server id
// ("<node id>/<disk id>"), so every node computes every other's from the members'
// records, and a node whose data directory was wiped comes back as a new member of
// its groups (it lost its votes and its log, and must never vote with them).
func raftID(serverID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(serverID)) // a hash never fails
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// groupID names partition i of a topic incarnation's group. The incarnation is in the
// name, so no frame of a deleted topic's group ever reaches a new topic's.
func groupID(inc uint64, i int) string { return strconv.FormatUint(inc, 10) + "/" + strconv.Itoa(i) }

// groupOf is the id of partition i's group as m places it: a forced takeover starts a
// new group, so no replica of the old one takes part in it ("" when not replicated).
func groupOf(m *meta.Topic, i int) string {
	if i >= len(m.Placement) || !m.Placement[i].Replicated() {
		return ""
	}
	if f := m.Placement[i].Forced; f > 0 {
		return groupID(m.Incarnation, i) + "/f" + strconv.FormatUint(f, 10)
	}
	return groupID(m.Incarnation, i)
}

// gid is the id of the group of partition i of t as now placed.
func (t *topic) gid(i int) string { return groupOf(t.cur.Load(), i) }

// raftDirOf is the name, in the partition's directory, of its group's Raft log.
func raftDirOf(m *meta.Topic, i int) string { return raftDirFor(m.Placement[i]) }

// raftDirFor is the directory, inside the partition's, of the group pl names.
func raftDirFor(pl meta.Placement) string {
	if f := pl.Forced; f > 0 {
		return "raft-f" + strconv.FormatUint(f, 10)
	}
	return "raft"
}

func (b *Broker) startReplication(node *transport.Node) error {
	sg := b.syncer
	if sg == nil {
		fss, err := vfs.NewFSSyncer(filepath.Join(b.opts.DataDir, "topics"))
		if err != nil {
			return err
		}
		sg = vfs.NewSyncGroup(fss)
	}
	born := time.Now().UnixMilli()
	if fi, err := os.Stat(filepath.Join(b.opts.DataDir, "node-id")); err == nil {
		born = fi.ModTime().UnixMilli()
	}
	host, err := raftetcd.New(raftetcd.Options{
		Node: node, ID: raftID(b.meta.ServerID()), Peers: map[uint64]string{raftID(b.meta.ServerID()): ""},
		Dir: filepath.Join(b.opts.DataDir, "topics"), Sync: sg, Store: raftetcd.StoreRaftstore,
		// With --sync-mode wal the Raft logs' appends go into the node's write-ahead
		// file too: one fdatasync a round for every log of the node.
		WAL:            b.raftWAL(),
		LazyHeartbeats: true, HeartbeatTick: 3, ParallelAppend: true, WallClock: partition.WallNanos,
		// Raft log writes off the Ready loop (docs/internals/replication.md): RF 3
		// produce +11 to +20 % against the serial loop (docs/performance.md).
		AsyncStorageWrites: true,
		SnapshotEvery:      b.opts.SnapshotEntries, SnapshotKeep: snapshotKeep(b.opts.SnapshotEntries),
		SnapshotsAllowed: func() bool { return b.meta.Allows(meta.FeatureReplicaSnapshots) },
		Logger:           b.log,
		DiskStalled:      b.diskStalled,
	})
	if err != nil {
		return err
	}
	b.repl = &replication{host: host, sync: sg, born: born, nodes: map[uint64]string{}, leaders: map[string]string{}, kick: make(chan struct{}, 1)}
	b.replHost.Store(host)
	return nil
}

// DefaultSnapshotEntries is Options.SnapshotEntries' default: entries a replicated
// partition's Raft log takes between two snapshots.
const DefaultSnapshotEntries = raftetcd.DefaultSnapshotEvery

// snapshotKeep is how many entries a group's log keeps behind its snapshot: enough
// for a follower a moment behind to catch up from the log instead of a snapshot.
func snapshotKeep(every int) int {
	if every <= 0 {
		return 0 // raftetcd's default
	}
	return max(1, min(raftetcd.DefaultSnapshotKeep, every/4))
}

// replicated reports whether partition i of m is a replicated partition (a Raft group).
func (b *Broker) replicated(m *meta.Topic, i int) bool {
	return b.repl != nil && i < len(m.Placement) && m.Placement[i].Replicated()
}

// syncPeers tells the replication host where every member is.
func (b *Broker) syncPeers() {
	if b.repl == nil {
		return
	}
	for _, m := range b.meta.Members() {
		id := raftID(m.ServerID)
		b.repl.mu.Lock()
		b.repl.nodes[id] = m.ID
		b.repl.mu.Unlock()
		if m.ID != b.opts.NodeID && m.ClusterAddr != "" {
			b.repl.host.AddPeer(id, m.ClusterAddr)
		}
	}
}

// openReplica opens this node's replica of partition i of m and joins its group.
func (b *Broker) openReplica(t *topic, m meta.Topic, i int, popts partition.Options) (*partition.Partition, error) {
	// A replica's log replaces files by snapshots; no record of the partition's
	// files from before it was replicated may be replayed into those. Only a
	// partition this process opened unreplicated can have such records: a start
	// replays and frees the write-ahead file first, and a directory is checkpointed
	// before it is removed. (The replicas' own Raft logs, which go through the WAL
	// too, take care of their files themselves: raftstore.Options.WAL.)
	if _, ok := b.walDirs.Load(popts.Dir); ok {
		if err := b.checkpointWAL("opening a replica"); err != nil {
			return nil, err
		}
		b.walDirs.Delete(popts.Dir)
	}
	gid := groupOf(&m, i)
	g := &partGroup{host: b.repl.host, id: gid}
	popts.Group = g
	popts.NewCommands = func() bool { return b.meta.Allows(meta.FeaturePartitionCommands) }
	popts.LeaderLeases = func() bool { return b.meta.Allows(meta.FeatureLeaderLease) }
	popts.NoLeaderLease = b.opts.NoLeaderLease
	raftDir := filepath.Join(popts.Dir, raftDirOf(&m, i))
	_, statErr := os.Stat(raftDir)
	// A replica made for a group that existed before this data directory did (the
	// node lost its disk) joins it: the group's leader makes it a voter in place of
	// its lost replica (reconcileVoters) and sends it the group's log.
	// So does a replica a move adds (a learner, or a voter of a replica set changed
	// since the group was made): bootstrapping it with today's voters would start a
	// second history.
	popts.OnFailed = func() {
		if len(t.cur.Load().Placement[i].Replicas) > 1 {
			// Its write of a committed command failed: its state stopped there, so it
			// must not lead (MayLead below), and is rebuilt from the others (a disk
			// still failing fails the reopening, and the group runs on without this
			// replica). A leader hands its leadership over now.
			t.markRebuild(i)
			b.kickPlacement()
		}
	}
	onDamaged := popts.OnDamaged
	popts.OnDamaged = func(log string, n int) {
		if onDamaged != nil {
			onDamaged(log, n)
		}
		if log == "messages" && t.parts()[i] != nil && len(t.cur.Load().Placement[i].Replicas) > 1 {
			// Met while serving (a replica opened with damage is rebuilt at once,
			// below): this replica skips the record in memory only, and must not lead
			// or vote with its damaged copy; its peers hold intact ones. (A group of
			// one replica has no intact copy to be rebuilt from.)
			t.markRebuild(i)
		}
	}
	pl := m.Placement[i]
	fresh := errors.Is(statErr, os.ErrNotExist)
	// Made before this disk was a member: decided on the metadata log's order (a topic's
	// incarnation is the index that created it). Only when this node has not recorded
	// that index yet does it fall back to wall clocks, its own against the creating
	// node's, which a skew between them can fool.
	older := m.CreatedAtMs+1000 < b.repl.born
	if since := b.meta.MemberSince(); since > 0 {
		older = m.Incarnation < since
	}
	join := fresh && (older || pl.Epoch > 1 || slices.Contains(pl.Learners, b.opts.NodeID))
	// The only replica of a group made over the data it holds (a replication factor
	// raised from 1, a forced takeover) starts the group alone, and its first snapshot
	// stands for that data: a replica added later restores it, fetching the messages,
	// instead of replaying a log that never held them.
	soleOverData := b.soleOverData(pl)
	onData := fresh && soleOverData
	if onData {
		join = false
	}
	if join && hasData(popts.Dir) {
		// Data from before this replica joined its group (a copy a move or a forced
		// takeover left behind, an old version's orphan) is no part of the group's
		// history and may diverge from it: set aside, never served or restored over.
		if err := partition.DiscardData(nil, popts.Dir); err != nil {
			return nil, fmt.Errorf("setting aside old data of partition %d of topic %q: %w", i, m.Name, err)
		}
		b.log.Warn("a replica joining its group found data from before it joined; set aside in damaged/ and copied afresh from the group",
			"topic", m.Name, "partition", i, "dir", popts.Dir)
	}
	p, err := b.openReplicaData(popts, pl, m.Name, i)
	if err != nil {
		return nil, err
	}
	if soleOverData && pl.Forced > 0 && (i >= len(t.openedAs) || t.openedAs[i] == "") {
		// Not yet open in the new group in this process: opened at a start, or
		// again by followPlacement as it left the replaced group.
		if err := b.applyReplacedLog(p, popts.Dir, raftDir, pl.Forced, m.Name, i); err != nil {
			_ = p.Close() // the error below is the one to report
			return nil, err
		}
	}
	voters, known := b.voters(m.Placement[i].Replicas)
	if !known {
		_ = p.Close() // the error below is the one to report
		return nil, fmt.Errorf("%w: a replica of partition %d of topic %q is on a node this node has no member record of yet", ErrUnavailable, i, m.Name)
	}
	var firstTerm func() (uint64, error)
	if soleOverData {
		// Not only when the Raft directory is new: raftetcd creates the group again
		// over a directory a crash left empty (made, but no entry written yet), and
		// asks for the first term only then.
		firstTerm = func() (uint64, error) {
			ft, err := b.termsAfterReplaced(popts.Dir, raftDir)
			if err != nil {
				return 0, fmt.Errorf("reading the terms of partition %d of topic %q's replaced group: %w", i, m.Name, err)
			}
			return ft, nil
		}
	}
	err = b.repl.host.OpenGroup(gid, raftetcd.GroupConfig{
		Voters: voters, Dir: raftDir, Join: join, Campaign: m.Placement[i].Leader == b.opts.NodeID, FirstTerm: firstTerm,
		// Also when opened again: a node that stopped between the group's first
		// entries and its first snapshot still owes that snapshot (raftetcd ignores
		// this once the group has one).
		SnapshotFirst: soleOverData,
		Apply:         func(index uint64, data []byte) any { return p.Apply(index, data) },
		Snapshot: func() ([]byte, error) {
			data, err := p.SnapshotState()
			return data, snapshotErr(err)
		},
		Restore: func(ctx context.Context, index uint64, data []byte, sources []uint64) error {
			return p.RestoreSnapshot(ctx, index, data, b.fetchFrom(t, i, sources))
		},
		OnRole: func(lead bool, term uint64) {
			if f := roleHook.Load(); f != nil && !(*f)(b.opts.NodeID, gid, lead) {
				return
			}
			handedOver := p.SetRole(lead, term)
			if lead {
				how := "election"
				if handedOver {
					how = "handover"
				}
				b.metrics.LeadershipsTaken.WithLabelValues(how).Inc()
				b.log.Info("leading partition", "topic", m.Name, "incarnation", m.Incarnation, "partition", i, "term", term, "by", how)
				if p.Failed() {
					b.kickPlacement() // it won before it failed: it hands the leadership over
				}
			}
			t.sig.broadcast()
		},
		// A replica that failed a write stands for no election until it is rebuilt: its
		// state stopped at the failed write, so as leader it could answer nothing.
		MayLead: func() bool {
			if f := mayLeadHook.Load(); f != nil && !(*f)(b.opts.NodeID, gid) {
				return false
			}
			return !p.Failed()
		},
	})
	if err != nil {
		_ = p.Close() // the group's error is the one to report
		return nil, err
	}
	return p, nil
}

// rebuildIfDamaged looks at what opening p found damaged. When another replica holds
// the partition, p's data is set aside in damaged/ and p opened again empty: the group
// rebuilds it (from its log, or a snapshot whose messages are fetched from a peer),
// instead of skipping what the damage took. A replica with no other one to rebuild
// from keeps its data and skips the damaged records, as a single node does (the
// partition counts and reports them): set aside, its messages were lost with it, and
// its group fetched its snapshot's messages from nobody, for ever (a review, 5
// December).
func (b *Broker) rebuildIfDamaged(p *partition.Partition, popts partition.Options, pl meta.Placement, topic string, i int) (*partition.Partition, error) {
	logDamage, journalDamage := p.Damage()
	if logDamage+journalDamage == 0 {
		return p, nil
	}
	if b.otherReplicas(pl) == 0 {
		b.log.Error("a replica's data is damaged and no other replica holds the partition; the damaged records are skipped, as on a single node",
			"topic", topic, "partition", i, "damaged_records", logDamage, "damaged_settle_records", journalDamage)
		return p, nil
	}
	if err := b.groupLogOpens(popts.Dir, pl); err != nil {
		_ = p.Close() // the group's log is what keeps the replica closed; its data stays as it is
		return nil, err
	}
	b.log.Error("a replica's data is damaged; it is set aside in damaged/ and rebuilt from the partition's group",
		"topic", topic, "partition", i, "damaged_records", logDamage, "damaged_settle_records", journalDamage)
	_ = p.Close() // its data is being set aside; the rebuilt partition is what counts
	if err := partition.DiscardData(nil, popts.Dir); err != nil {
		return nil, fmt.Errorf("setting aside the damaged data of partition %d of topic %q: %w", i, topic, err)
	}
	p, err := partition.Open(popts)
	if err != nil {
		return nil, err
	}
	b.metrics.ReplicaRebuilds.WithLabelValues(topic).Inc()
	return p, nil
}

// openReplicaData opens a replica's partition data and deals with what the opening
// found damaged (rebuildIfDamaged). A replica whose queue state is too damaged to
// open at all (a queue checkpoint or an epoch file that fails its checks, a settle
// journal missing records its checkpoint relies on: partition.Open refuses them with
// segment.ErrCorrupt, where a lone partition must not guess) sets that state aside
// when another replica holds the partition, keeps its messages, and opens: the
// settled state is its group's, whose snapshot and log put it back, and its group's
// own log (raft/, checked first: groupLogOpens) is intact, so its votes stay sound.
// (It refused to open before, and with it every partition of the topic on this node,
// at every start.)
func (b *Broker) openReplicaData(popts partition.Options, pl meta.Placement, topic string, i int) (*partition.Partition, error) {
	p, err := partition.Open(popts)
	if err != nil && errors.Is(err, segment.ErrCorrupt) && b.otherReplicas(pl) > 0 {
		if gerr := b.groupLogOpens(popts.Dir, pl); gerr != nil {
			return nil, fmt.Errorf("%w (its queue state does not open either: %w)", gerr, err)
		}
		b.log.Error("a replica's stored state is damaged and does not open; its queue state is set aside in damaged/ and rebuilt from the partition's group, its messages kept",
			"topic", topic, "partition", i, "err", err)
		if derr := partition.DiscardQueueState(nil, popts.Dir); derr != nil {
			return nil, fmt.Errorf("setting aside the damaged data of partition %d of topic %q (%w): %w", i, topic, err, derr)
		}
		b.metrics.ReplicaRebuilds.WithLabelValues(topic).Inc()
		p, err = partition.Open(popts)
	}
	if err != nil {
		return nil, err
	}
	return b.rebuildIfDamaged(p, popts, pl, topic, i)
}

// leaveClosed decides, when this node's replica of partition i of t did not open
// with err, whether the replica is left closed and the rest goes on (true), rather
// than failing the topic here, and with it the node's start: its group's own log is
// damaged (raftetcd.ErrCorrupt) and another replica holds the partition. The
// replica then neither votes nor serves, which is what a replica with a damaged log
// must not do, and the partition is served by the others. It is not rebuilt: under
// the same Raft identity an emptied log could vote a committed entry away; an
// operator moves the replica to another node, or replaces the node
// (docs/operating/recovery.md). Later placement passes leave it closed while it is
// placed here in that group (leftClosed), until the node starts again.
func (b *Broker) leaveClosed(t *topic, m meta.Topic, i int, err error) bool {
	if !b.replicated(&m, i) || !errors.Is(err, raftetcd.ErrCorrupt) || b.otherReplicas(m.Placement[i]) == 0 {
		return false
	}
	gid := groupOf(&m, i)
	t.rebuildMu.Lock()
	if t.closed == nil {
		t.closed = map[int]string{}
	}
	was, counted := t.closed[i]
	t.closed[i] = gid
	t.rebuildMu.Unlock()
	if was != gid {
		b.log.Error("a replica's Raft log is damaged; the replica is left closed (it neither votes nor serves) and its partition is served by the other replicas: move it to another node or replace this node (see docs/operating/recovery.md)",
			"topic", m.Name, "partition", i, "err", err)
	}
	if !counted {
		b.metrics.ReplicasClosed.WithLabelValues(m.Name).Inc()
	}
	return true
}

// leftClosed reports whether this node's replica of partition i of t is left closed
// (leaveClosed) in group gid, the partition's group as now placed. A mark of another
// group (a forced takeover made a new one, with a Raft log of its own) is dropped:
// the replica is opened again, and left closed again only if that fails the same way.
func (b *Broker) leftClosed(t *topic, i int, gid string) bool {
	t.rebuildMu.Lock()
	was, ok := t.closed[i]
	if ok && was != gid {
		delete(t.closed, i)
	}
	t.rebuildMu.Unlock()
	if ok && was != gid {
		b.metrics.ReplicasClosed.WithLabelValues(t.name).Dec()
	}
	return ok && was == gid
}

// forgetClosed drops the mark of a replica left closed that is no longer placed here
// (moved off, as the repair does, or left out of a forced takeover): the node no
// longer holds it, nor counts it, and a move that places the partition here again
// opens a new replica (the move off deleted the damaged copy; one still on disk is
// found damaged again and left closed again).
func (b *Broker) forgetClosed(t *topic, i int) {
	t.rebuildMu.Lock()
	_, ok := t.closed[i]
	delete(t.closed, i)
	t.rebuildMu.Unlock()
	if ok {
		b.metrics.ReplicasClosed.WithLabelValues(t.name).Dec()
		b.log.Info("a replica left closed is no longer placed here; it is no longer counted closed", "topic", t.name, "partition", i)
	}
}

// groupLogOpens checks, before a replica's data is set aside to be rebuilt from its
// group, that the group's own log (raft/) opens here: the rebuild relies on it (its
// entries are applied again, its snapshot restored), and a replica whose log is
// damaged too is left closed (leaveClosed) with its data as it is, which may be the
// last copy of some messages if its group is later lost and taken over by force on
// this node. An error of raftetcd.ErrCorrupt says so; nil when there is no log yet.
func (b *Broker) groupLogOpens(partDir string, pl meta.Placement) error {
	if b.repl == nil {
		return nil
	}
	_, err := b.repl.host.LastTerm(filepath.Join(partDir, raftDirFor(pl)))
	return err
}

// otherReplicas counts the replicas of a placement on other nodes than this one.
func (b *Broker) otherReplicas(pl meta.Placement) int {
	n := 0
	for _, r := range pl.Replicas {
		if r != b.opts.NodeID {
			n++
		}
	}
	return n
}

// snapshotErr hands raftetcd a partition's refusal of a snapshot while it applies
// its group's log again (partition.ErrReplaying) as a deferral: expected and tried
// again later, not logged as a failure at every try.
func snapshotErr(err error) error {
	if errors.Is(err, partition.ErrReplaying) {
		return fmt.Errorf("%w: %w", raftetcd.ErrSnapshotDeferred, err)
	}
	return err
}

// soleOverData reports whether this node is the only replica of a group made over
// the data it holds (a replication factor raised from 1, a forced takeover's
// survivor).
func (b *Broker) soleOverData(pl meta.Placement) bool {
	return pl.Group && len(pl.Replicas) == 1 && pl.Replicas[0] == b.opts.NodeID
}

// applyReplacedLog applies to p, the survivor of a forced takeover about to start the
// new group in raftDir, everything the replaced group's Raft log holds, committed or
// not (raftetcd's ApplyLogIn): entries it recorded with a majority that it had not yet
// heard were committed, produces in flight on it as leader. Both ways a survivor
// comes to the new group go through here: its placement pass, which closes the
// replaced group and opens the partition again, and a start of a node that stopped
// between the takeover and that pass (or was stopped when it was made). (The pass
// once applied the log itself as it closed the group, and went on into the new group
// when a write of it failed.) Only while the new group's log is empty: its first
// entries are written over this state. The log is read from its last snapshot, as a
// start replays it; what p already holds it takes again as then.
func (b *Broker) applyReplacedLog(p *partition.Partition, partDir, raftDir string, forced uint64, topic string, i int) error {
	if t, err := b.repl.host.LastTerm(raftDir); err != nil || t > 0 {
		return nil // the new group has begun (or its log is unreadable: opening it says so)
	}
	replaced, err := replacedRaftDir(partDir, forced)
	if err != nil || replaced == "" {
		return err
	}
	n, err := b.repl.host.ApplyLogIn(replaced, func(index uint64, data []byte) { p.Apply(index, data) })
	if err != nil {
		// A takeover follows a disaster; this log may be damaged. What it held past
		// the error is lost, as when the survivor's disk lost it.
		b.log.Error("reading the Raft log of a partition's replaced group failed; the new group starts without the rest of it",
			"topic", topic, "partition", i, "dir", replaced, "applied", n, "err", err)
	}
	if n == 0 {
		return nil
	}
	// Applied at the replaced group's indexes; the new group counts from 1.
	p.ForgetIndexes()
	if p.Failed() {
		// A write of it failed: the new group must not start over this state (its
		// first entries would end the log's reading here for good). The opening fails:
		// at a start the node stops, and its next start reads the log again; in a
		// placement pass the next pass tries again.
		return fmt.Errorf("%w: partition %d of topic %q failed a write while applying its replaced group's log", ErrUnavailable, i, topic)
	}
	b.log.Warn("applied a replaced group's log, committed or not, before the new group starts",
		"topic", topic, "partition", i, "entries", n)
	// The new group's first snapshot stands for this state: it must be on disk first.
	if err := p.Flush(); err != nil {
		return fmt.Errorf("flushing partition %d of topic %q after applying its replaced group's log: %w", i, topic, err)
	}
	return nil
}

// replacedRaftDir is the Raft log in partDir of the group a forced takeover at index
// forced replaced: of the logs of this partition's groups here, the latest before it
// (the original group's, "raft", counts as forced at 0). "" when there is none.
func replacedRaftDir(partDir string, forced uint64) (string, error) {
	ents, err := os.ReadDir(partDir)
	if err != nil {
		return "", err
	}
	best, found := uint64(0), ""
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() {
			continue
		}
		var f uint64
		switch n, ok := strings.CutPrefix(name, "raft-f"); {
		case name == "raft":
		case ok:
			if f, err = strconv.ParseUint(n, 10, 64); err != nil {
				continue
			}
		default:
			continue
		}
		if f < forced && (found == "" || f > best) {
			best, found = f, name
		}
	}
	if found == "" {
		return "", nil
	}
	return filepath.Join(partDir, found), nil
}

// replacedTermMargin is how many terms a group made over a replaced group's data (a
// forced takeover) starts above the highest term this node knew of the replaced one:
// its other replicas, lost now, may have held elections this node never heard of.
const replacedTermMargin = 1 << 10

// termsAfterReplaced is the first term for a group made in raftDir over the data in
// partDir: above every term of a group that held the data before (a forced takeover
// replaces one), so that no receipt handle one of its leaders gave out (a term and a
// sequence that starts again in each term) can equal a lease of the new group's. 0
// when no group held it (a replication factor raised from 1: the lone copy's lease
// epochs count seconds since 2024, far above any term). A replaced log that cannot be
// read (damaged) counts as having reached the seconds since 2024.
func (b *Broker) termsAfterReplaced(partDir, raftDir string) (uint64, error) {
	ents, err := os.ReadDir(partDir)
	if err != nil {
		return 0, err
	}
	var highest uint64
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || (name != "raft" && !strings.HasPrefix(name, "raft-f")) || filepath.Join(partDir, name) == raftDir {
			continue
		}
		t, err := b.repl.host.LastTerm(filepath.Join(partDir, name))
		if err != nil {
			// A forced takeover follows a disaster, and this log may be damaged: it
			// must not keep the new group from opening. Its terms are unknown, but a
			// term passes only with an election timeout (a second at least), and no
			// group is older than 2024: start above the seconds since then.
			floor := uint64(max(0, partition.WallMillis()/1000-time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Unix()))
			b.log.Error("the Raft log of a partition's replaced group cannot be read; the new group starts its terms above the seconds since 2024 instead",
				"dir", filepath.Join(partDir, name), "first_term", floor+replacedTermMargin, "err", err)
			t = floor
		}
		highest = max(highest, t)
	}
	if highest == 0 {
		return 0, nil
	}
	return highest + replacedTermMargin, nil
}

// fetchFrom returns the Fetch a replica of partition i of t restoring a snapshot
// reads the records it lacks with: from the first of sources (raft ids, the leader
// first) that answers with some, over the node plane.
func (b *Broker) fetchFrom(t *topic, i int, sources []uint64) partition.Fetch {
	return func(ctx context.Context, from uint64) ([]segment.Record, error) {
		var errs []error
		var gone *partition.AgedOutError // a source that holds nothing from there, all of it aged out
		for _, src := range sources {
			b.repl.mu.Lock()
			node := b.repl.nodes[src]
			b.repl.mu.Unlock()
			if node == "" || node == b.opts.NodeID {
				continue
			}
			req := b.dataReq(t, dataReplicaRead, i)
			req.Offset, req.Limit = from, replicaReadLimit
			resp, err := b.call(ctx, node, req, remoteCallTimeout)
			if err == nil && resp.Err != nil {
				err = fromWireErr(resp.Err)
			}
			if err == nil && len(resp.Records) > 0 {
				return resp.Records, nil
			}
			if err == nil && resp.Start > from {
				// Another source may still hold them: asked on, and this said only if
				// none does.
				if gone == nil || resp.Start > gone.Oldest {
					gone = &partition.AgedOutError{Oldest: resp.Start}
				}
				continue
			}
			if err == nil {
				err = fmt.Errorf("%w: node %q has no record from offset %d", partition.ErrSnapshotSource, node, from)
			}
			errs = append(errs, err)
		}
		if gone != nil {
			return nil, gone
		}
		if len(errs) == 0 {
			return nil, fmt.Errorf("%w: no other replica of partition %d of topic %q is known yet", partition.ErrSnapshotSource, i, t.name)
		}
		return nil, errors.Join(errs...)
	}
}

// closeReplica leaves the group partition i of t was opened in (before its partition
// closes, so nothing is applied to a closed partition). That is not always the group
// its placement names now: a replica a forced takeover left out (cut off, then back)
// sees a placement whose group is the new one, which it never joined; closing that
// one left its old group running for good, ticking and campaigning, over a closed
// partition whose data a move may delete. The caller holds placeMu, or the topic is
// not published yet.
func (b *Broker) closeReplica(t *topic, i int) {
	if b.repl == nil || i >= len(t.openedAs) {
		return
	}
	if g := t.openedAs[i]; g != "" {
		b.repl.host.CloseGroup(g)
		t.openedAs[i] = ""
	}
}

// partGroup is partition.Group over one raftetcd group.
type partGroup struct {
	host groupHost
	id   string
}

// groupHost is what partGroup uses of a raftetcd.Host (a test's stand-in too).
type groupHost interface {
	ProposeResult(ctx context.Context, id string, data []byte, submitted ...func()) (uint64, any, error)
	AppendedAgo(id string, index uint64) (time.Duration, bool)
	ConfirmLeader(ctx context.Context, id string) error
}

func (g *partGroup) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	proposed := false // set on this goroutine, before ProposeResult waits
	_, res, err := g.host.ProposeResult(ctx, g.id, cmd, func() {
		proposed = true
		if submitted != nil {
			submitted()
		}
	})
	if proposed && errors.Is(err, raftetcd.ErrClosed) {
		// The group closed (its topic deleted here, or the node stopping) after the
		// command went into its log: the other replicas may still commit it. Said "not
		// the leader", a produce was answered 503 unavailable (nothing stored) and sent
		// again by its client, and the first copy was delivered too (the cluster chaos
		// run's checker found it).
		return nil, fmt.Errorf("%w: the partition's group closed after the write was proposed: %w", partition.ErrOutcomeUnknown, err)
	}
	if errors.Is(err, raftetcd.ErrNotLeader) || errors.Is(err, raftetcd.ErrClosed) || errors.Is(err, raftetcd.ErrUnknownGroup) {
		return nil, fmt.Errorf("%w: %w", partition.ErrNotLeader, err)
	}
	return res, err
}

// ProposeCommitted is partition's committer: cmd replicated, answered once committed
// (before this node applies it).
func (g *partGroup) ProposeCommitted(ctx context.Context, cmd []byte) error {
	pc, ok := g.host.(interface {
		ProposeCommitted(ctx context.Context, id string, data []byte) (uint64, error)
	})
	if !ok {
		_, err := g.Propose(ctx, cmd, nil)
		return err
	}
	_, err := pc.ProposeCommitted(ctx, g.id, cmd)
	if errors.Is(err, raftetcd.ErrNotLeader) || errors.Is(err, raftetcd.ErrClosed) || errors.Is(err, raftetcd.ErrUnknownGroup) {
		return fmt.Errorf("%w: %w", partition.ErrNotLeader, err)
	}
	return err
}

// AppendedAgo is partition's appendAger: how long ago the entry at index reached this
// node's copy of the group's log.
func (g *partGroup) AppendedAgo(index uint64) (time.Duration, bool) {
	return g.host.AppendedAgo(g.id, index)
}

// LeaseHeld is partition's leaseHolder: whether this node leads the group under a
// leader lease now.
func (g *partGroup) LeaseHeld() bool {
	lh, ok := g.host.(interface{ LeaseHeld(id string) bool })
	return ok && lh.LeaseHeld(g.id)
}

// LeaseValid is partition's leaseValidator: LeaseHeld without counting a consume
// served under the lease.
func (g *partGroup) LeaseValid() bool {
	lv, ok := g.host.(interface{ LeaseValid(id string) bool })
	return ok && lv.LeaseValid(g.id)
}

func (g *partGroup) Confirm(ctx context.Context) error {
	err := g.host.ConfirmLeader(ctx, g.id)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", partition.ErrNotLeader, err)
	}
	return err
}

// leaderOf returns the node this node believes leads partition i of t: its own
// group's view when it holds a replica, else what another node last told it, else
// the placement's preferred leader. "" when none is known.
func (b *Broker) leaderOf(t *topic, i int) string {
	gid := t.gid(i)
	if info, ok := b.repl.host.Info(gid); ok {
		if info.Lead == 0 {
			return ""
		}
		b.repl.mu.Lock()
		defer b.repl.mu.Unlock()
		return b.repl.nodes[info.Lead]
	}
	b.repl.mu.Lock()
	l := b.repl.leaders[gid]
	b.repl.mu.Unlock()
	if l != "" {
		return l
	}
	if m := t.cur.Load(); i < len(m.Placement) {
		return m.Placement[i].Leader
	}
	return ""
}

func (b *Broker) learnLeader(t *topic, i int, node string) {
	b.repl.mu.Lock()
	b.repl.leaders[t.gid(i)] = node
	b.repl.mu.Unlock()
}

// route runs one step on partition p of t where the partition is served. A partition
// of one replica runs here when held here, else on its holder. A replicated one runs
// here while this node leads it, else on its leader: a replica that does not lead
// answers not_leader with the leader it knows, and the request follows it; while no
// leader is known (an election) it is tried again until leaderWait, then 503.
// local runs the step on a partition held here and reports false when that partition
// turned out not to lead (the step was not done).
func (b *Broker) route(ctx context.Context, t *topic, p int, req *dataReq, timeout time.Duration, local func(*partition.Partition) bool) (*dataResp, error) {
	wait := leaderWait
	if req.Kind == dataLease {
		// A consume serves the partitions that have a leader and waits (its long poll)
		// on all: it does not stall on one that is electing.
		wait = leaseLeaderWait
		if w := leaseLeaderWaitHook.Load(); w != nil {
			wait = *w
		}
	}
	m := t.cur.Load()
	if !b.replicated(m, p) {
		if lp := t.parts()[p]; lp != nil && local(lp) {
			return nil, nil
		}
		return b.call(ctx, b.holderOf(t, p), req, timeout)
	}
	deadline := time.Now().Add(wait)
	reps := m.Placement[p].Replicas
	hint := ""
	hops := 0 // hints followed in a row: two replicas with stale views may name each other
	for try := 0; ; try++ {
		if lp := t.parts()[p]; lp != nil && lp.Leading() && local(lp) {
			return nil, nil
		}
		node := hint
		if node == "" {
			node = b.leaderOf(t, p)
		}
		if node == "" || (node == b.opts.NodeID && try > 0) {
			node = reps[try%len(reps)]
		}
		hint = ""
		if node != b.opts.NodeID {
			resp, err := b.call(ctx, node, req, timeout)
			switch {
			case err == nil && resp.Err != nil && resp.Err.Code == "not_leader":
				if resp.Err.Leader != node {
					hint = resp.Err.Leader
				}
			case err != nil && errors.Is(err, ErrPartitionDown):
			default:
				if err == nil {
					b.learnLeader(t, p, node)
				}
				return resp, err
			}
		}
		if hint != "" && hops < 3 && time.Now().Before(deadline) {
			hops++
			continue
		}
		hops = 0
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: partition %d of topic %q has no leader this node can reach (an election may be running, or too few of its replicas are up)", ErrUnavailable, p, t.name)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// notLeader is the answer of a replica asked for a step it cannot take because it
// does not lead: the leader it knows goes with it.
func (b *Broker) notLeader(t *topic, p int, err error) *wireErr {
	w := toWireErr(err)
	if w != nil && w.Code == "not_leader" && b.repl != nil {
		w.Leader = b.leaderOf(t, p)
	}
	return w
}

// MaxReplicationFactor is the largest replication_factor a topic may ask for.
const MaxReplicationFactor = 7

func (b *Broker) maxReplicationFactor() int32 {
	if b.repl == nil {
		return 1
	}
	return MaxReplicationFactor
}

// replicationFactor is the replica count of a new topic: asked, or min(3, members).
// More than the cluster's members is a conflict (the replicas would not be on
// distinct nodes); more than its live members is a 503 to retry: a node that has not
// reported in yet (a cluster just started) or is down for now. The default counts the
// members, not the live ones, so a topic created while a node is away never gets
// fewer replicas for good.
func (b *Broker) replicationFactor(asked *int32) (int32, error) {
	if b.repl == nil {
		return 1, nil
	}
	var members, live int32
	for _, m := range b.meta.Members() {
		if m.Status == meta.StatusDead || m.Status == meta.StatusDecommissioning {
			continue
		}
		members++
		if m.Status == meta.StatusAlive || m.Status == meta.StatusJoining {
			live++
		}
	}
	if members == 0 {
		return 0, fmt.Errorf("%w: this node has not learned the cluster's members yet; retry in a moment", ErrUnavailable)
	}
	rf := min(3, members)
	if asked != nil {
		rf = *asked
	}
	if rf > members {
		return 0, &ConflictError{Msg: fmt.Sprintf("replication_factor %d is more than the %d nodes of the cluster: every replica needs its own node; ask for at most %d, or add nodes first", rf, members, members)}
	}
	if rf > live {
		return 0, fmt.Errorf("%w: replication_factor %d needs %d live nodes and %d of the cluster's %d are live now (the others have not reported in yet, or are down): retry when they are back, or ask for replication_factor %d or less",
			ErrUnavailable, rf, rf, live, members, max(1, live))
	}
	return rf, nil
}

// ReplicaInfo is a replicated partition's state as its leader sees it.
type ReplicaInfo struct {
	Epoch     uint64         `json:"epoch"` // the leader's Raft term
	Followers []FollowerInfo `json:"followers"`
	// Leader is the node that answered as the leader ("" from a node of an earlier
	// build): a replica deposed without knowing it yet sends the request on, so the
	// node asked is not always the one that answered.
	Leader string `json:"leader,omitempty"`
}

// FollowerInfo is one follower's progress: the message offset its log is known to
// match up to, and how many messages it is behind the high watermark.
type FollowerInfo struct {
	Node        string `json:"node"`
	MatchOffset uint64 `json:"match_offset"`
	Lag         uint64 `json:"lag"`
}

// localReplicaInfo is the ReplicaInfo of partition p of t, led here (nil when it is
// not replicated or not led here).
func (b *Broker) localReplicaInfo(t *topic, p int) *ReplicaInfo {
	if b.repl == nil || !b.replicated(t.cur.Load(), p) || !t.leads(p) {
		return nil
	}
	info, ok := b.repl.host.Info(t.gid(p))
	if !ok || !info.Leader {
		return nil
	}
	lp := t.parts()[p]
	hw := lp.Stats().End
	ri := &ReplicaInfo{Epoch: info.Term, Followers: []FollowerInfo{}, Leader: b.opts.NodeID}
	self := raftID(b.meta.ServerID())
	b.repl.mu.Lock()
	defer b.repl.mu.Unlock()
	for id, match := range info.Match {
		if id == self {
			continue
		}
		node := b.repl.nodes[id]
		if m, ok := b.meta.Member(node); !ok || raftID(m.ServerID) != id {
			continue // the replica of a data directory since wiped, being replaced
		}
		off := min(lp.OffsetAtIndex(match), hw)
		ri.Followers = append(ri.Followers, FollowerInfo{Node: node, MatchOffset: off, Lag: hw - off})
	}
	sort.Slice(ri.Followers, func(i, j int) bool { return ri.Followers[i].Node < ri.Followers[j].Node })
	return ri
}

// voters returns the raft ids of the replicas on nodes, as the members' records name
// their current data directories, and false when one of the nodes has no member
// record here (its id cannot be known).
func (b *Broker) voters(nodes []string) ([]uint64, bool) {
	out := make([]uint64, 0, len(nodes))
	for _, n := range nodes {
		m, ok := b.meta.Member(n)
		if !ok || m.ServerID == "" {
			return nil, false
		}
		out = append(out, raftID(m.ServerID))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, true
}

// reconcileVoters makes every group led here have the members its placement names:
// the learners a move adds, and the voters (a replica whose node came back with a new
// data directory, or the replica set a move switched to) in one joint change (old and
// new majorities both agree), after which the new members catch up from this leader.
// A leader that its placement no longer names hands its leadership (and its live
// leases) to a voter that stays first. It then takes this leader's steps of the
// partition's move, if one is under way (steerMoves).
func (b *Broker) reconcileVoters() {
	if b.repl == nil {
		return
	}
	ts := b.topicList()
	var active map[string]meta.Move
	for _, mv := range b.meta.Moves() {
		if mv.Active() {
			if active == nil {
				active = map[string]meta.Move{}
			}
			active[groupID(mv.Incarnation, int(mv.Partition))] = mv // keyed by partition
		}
	}
	self := raftID(b.meta.ServerID())
	for _, t := range ts {
		m := t.cur.Load()
		for i := range t.parts() {
			if !b.replicated(m, i) || !t.leads(i) {
				continue
			}
			gid := t.gid(i)
			info, ok := b.repl.host.Info(gid)
			if !ok || !info.Leader {
				continue
			}
			want, known := b.voters(m.Placement[i].Replicas)
			learners, lknown := b.voters(m.Placement[i].Learners)
			if !known || !lknown {
				continue // never change members on a partial view
			}
			mv, hasMove := active[groupID(t.incarnation, i)]
			if info.Joint {
				continue // raft leaves a joint change on its own
			}
			var c raftetcd.ConfChange
			for _, v := range info.Voters {
				if !slices.Contains(want, v) {
					c.RemoveVoters = append(c.RemoveVoters, v)
				}
			}
			for _, v := range want {
				if !slices.Contains(info.Voters, v) {
					c.AddVoters = append(c.AddVoters, v)
				}
			}
			for _, v := range learners {
				if info.SnapshotPending {
					break // its first snapshot stands for data no entry holds: learners wait for it
				}
				if !slices.Contains(info.Learners, v) && !slices.Contains(info.Voters, v) {
					c.AddLearners = append(c.AddLearners, v)
				}
			}
			for _, v := range info.Learners {
				if !slices.Contains(learners, v) && !slices.Contains(want, v) {
					c.RemoveLearners = append(c.RemoveLearners, v)
				}
			}
			changes := len(c.RemoveVoters)+len(c.AddVoters)+len(c.AddLearners)+len(c.RemoveLearners) > 0
			// Adding a learner is harmless on any view (it never votes); every other
			// change waits for a placement confirmed current.
			onlyLearners := len(c.RemoveVoters)+len(c.AddVoters)+len(c.RemoveLearners) == 0
			if changes && !onlyLearners && !b.placementCurrent(t, i, m.Placement[i].Epoch) {
				continue // the next tick acts on the current placement
			}
			if slices.Contains(c.RemoveVoters, self) {
				stays := false
				for _, v := range want {
					stays = stays || slices.Contains(info.Voters, v)
				}
				if !stays && len(c.AddVoters) > 0 {
					// A group of one moving: its new replica becomes a voter first, so
					// there is one to hand the leadership to.
					if err := b.repl.host.ChangeConf(gid, raftetcd.ConfChange{AddVoters: c.AddVoters}); err != nil {
						b.log.Warn("changing a partition's replicas failed; retrying", "topic", t.name, "partition", i, "err", err)
					}
					continue
				}
				b.handOverTo(t, i, info, want, "its placement no longer names this node")
				continue
			}
			if !changes && !hasMove && b.leaderPreferredElsewhere(m.Placement[i], info) {
				pref, _ := b.voters([]string{m.Placement[i].Leader})
				b.handOverTo(t, i, info, pref, "a rebalance chose another leader")
				continue
			}
			if !changes {
				b.steerMoves(t, i, info, mv, hasMove)
				continue
			}
			b.log.Info("changing the replicas of a partition to its placement", "topic", t.name, "partition", i,
				"remove", c.RemoveVoters, "add", c.AddVoters, "add_learners", c.AddLearners, "remove_learners", c.RemoveLearners)
			if err := b.repl.host.ChangeConf(gid, c); err != nil {
				b.log.Warn("changing a partition's replicas failed; retrying", "topic", t.name, "partition", i, "err", err)
			}
		}
	}
}

// handOverTo moves the leadership of partition i of t, led here, to the most caught-up
// voter in want (after committing its live leases, so nothing in flight is delivered
// again); why says in the log why it leaves this node.
func (b *Broker) handOverTo(t *topic, i int, info raftetcd.GroupInfo, want []uint64, why string) {
	// A voter that did not take the last handover (it may refuse for good: a replica
	// that failed a write and is not rebuilt) is tried only when no other fits: a
	// leader its group no longer counts commits nothing until another leads.
	to := b.handOverChoice(t.gid(i), placedOf(t, i), info, want)
	if to == 0 {
		return
	}
	lp := t.parts()[i]
	if lp == nil {
		return
	}
	release, ok := b.claimHandOver(t.gid(i))
	if !ok {
		return // another handover of it is under way
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOverWait)
	defer cancel()
	if err := lp.HandOver(ctx); err != nil {
		b.log.Warn("handing over a partition's leases failed; they lapse as in a crash", "topic", t.name, "partition", i, "err", err)
	}
	b.log.Info("handing over the leadership of a partition", "topic", t.name, "partition", i, "to", b.nodeOf(to), "why", why)
	b.repl.host.TransferLeader(t.gid(i), to)
	wait := time.Now().Add(moveHandOverWait)
	for t.leads(i) && time.Now().Before(wait) {
		time.Sleep(20 * time.Millisecond)
	}
	moved := !t.leads(i) // read once: what is recorded and what is done must agree
	b.repl.mu.Lock()
	if moved {
		delete(b.repl.refused, t.gid(i))
	} else {
		if b.repl.refused == nil || len(b.repl.refused) > 1024 {
			b.repl.refused = map[string]uint64{} // bounded: only an order of preference
		}
		b.repl.refused[t.gid(i)] = to
	}
	b.repl.mu.Unlock()
	if moved {
		release()
		return
	}
	if b.removedFromGroup(t.gid(i)) {
		// Its group's configuration no longer counts this leader (its own removal
		// committed under its leadership): etcd-io/raft drops its every proposal, so
		// calling the handover off could never succeed, and holding the claim while
		// trying would keep every later handover from being tried: the partition
		// would take no write for good. The transfer may simply have been refused:
		// raft does not campaign while a committed configuration change is not yet
		// applied, and the target can get the MsgTimeoutNow just before it applies its
		// removal of this node. The next pass transfers again.
		b.log.Warn("a leader its group no longer counts did not hand its leadership over; tried again at the next pass",
			"topic", t.name, "partition", i, "to", b.nodeOf(to))
		release()
		return
	}
	// The transfer did not happen: serve on, and try again at the next tick, rather
	// than lease nothing until an election. Calling the handover off is a write; while
	// it fails the partition leases nothing, and it is tried again in the background
	// (holding the claim, so no other handover of the partition starts meanwhile).
	if b.callOffHandOver(t, i, lp, to) {
		release()
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer release()
		for t.leads(i) && !b.closing.Load() {
			select {
			case <-b.stop:
				return
			case <-time.After(time.Second):
			}
			if b.removedFromGroup(t.gid(i)) || b.callOffHandOver(t, i, lp, to) {
				return // removed meanwhile: see above; the next pass transfers again
			}
		}
	}()
}

// handOverChoice picks the voter of want that takes the leadership of group gid over
// from this node: one that did not refuse the last handover, is fit to lead and is one
// of the nodes placed (the partition's replicas), the most caught-up of those
// (handOverTarget); failing that, one that did not refuse and is fit; failing that, the
// most caught-up fit one.
//
// A replica the placement no longer names is a move's source on its way out: handed
// the leadership while its removal is proposed or under way, it leads a group that no
// longer counts it, and its own handover after the removal cannot commit the leases,
// so they lapse in a planned change (a review, 6 December).
func (b *Broker) handOverChoice(gid string, placed []string, info raftetcd.GroupInfo, want []uint64) uint64 {
	b.repl.mu.Lock()
	last := b.repl.refused[gid]
	b.repl.mu.Unlock()
	leaving := func(uint64) bool { return false }
	if ids, ok := b.voters(placed); ok && len(ids) > 0 {
		leaving = func(id uint64) bool { return !slices.Contains(ids, id) }
	}
	refusedOrUnfit := func(id uint64) bool { return id == last || b.unfitLeader(id) }
	to := handOverTarget(info, want, func(id uint64) bool { return refusedOrUnfit(id) || leaving(id) })
	if refusedOrUnfit(to) || leaving(to) {
		to = handOverTarget(info, want, refusedOrUnfit)
	}
	if refusedOrUnfit(to) {
		to = handOverTarget(info, want, b.unfitLeader) // no other fits: chosen as before
	}
	return to
}

// placedOf returns the nodes partition i of t is placed on, as this node knows them.
func placedOf(t *topic, i int) []string {
	if m := t.cur.Load(); i < len(m.Placement) {
		return m.Placement[i].Replicas
	}
	return nil
}

// removedFromGroup reports whether this node's replica of group gid is open and its
// group's configuration, as applied here, does not count it as a voter.
func (b *Broker) removedFromGroup(gid string) bool {
	info, ok := b.repl.host.Info(gid)
	return ok && !slices.Contains(info.Voters, raftID(b.meta.ServerID()))
}

// callOffHandOver lets the leader of partition i of t lease again after its handover
// to node to did not happen (partition.ResumeAfterHandOver: it first commits that
// nothing is handed over), and reports whether it did.
func (b *Broker) callOffHandOver(t *topic, i int, lp *partition.Partition, to uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), handOverWait)
	defer cancel()
	if err := lp.ResumeAfterHandOver(ctx); err != nil {
		b.log.Warn("a partition's leadership did not move, and calling its handover off failed: it leases nothing until that succeeds (tried again every second) or its leadership changes",
			"topic", t.name, "partition", i, "to", b.nodeOf(to), "err", err)
		return false
	}
	b.log.Warn("a partition's leadership did not move; it goes on serving here and tries again", "topic", t.name, "partition", i, "to", b.nodeOf(to))
	return true
}

// handOverTarget picks who takes a partition's leadership over from this node: of the
// candidates that are voters with a known match, the most caught-up one (it needs no
// catching up first) among those unfit does not rule out (b.unfitLeader: a node the
// node-pair liveness finds silent, or one whose disk stalls). A transfer to a stopped
// node cannot happen, and the leases handed over would lapse as in a crash; only when
// every candidate is unfit is the most caught-up one tried anyway (a stalling disk
// leads slowly, which beats leases lost). Ties go to the first candidate in order, not
// to map order.
func handOverTarget(info raftetcd.GroupInfo, candidates []uint64, unfit func(uint64) bool) uint64 {
	var to, best, anyTo, anyBest uint64
	for _, id := range candidates {
		match, ok := info.Match[id]
		if !ok || !slices.Contains(info.Voters, id) {
			continue
		}
		if anyTo == 0 || match > anyBest {
			anyTo, anyBest = id, match
		}
		if !unfit(id) && (to == 0 || match > best) {
			to, best = id, match
		}
	}
	if to == 0 {
		return anyTo
	}
	return to
}

// leaderBalanceWindow is how long after a rebalance chose a partition's preferred
// leader its leader hands the leadership to it. Outside it, leadership stays where
// elections put it (a failover is not undone by a transfer of its own).
const leaderBalanceWindow = time.Minute

// leaderPreferredElsewhere reports whether this leader should hand its leadership to
// the preferred leader a rebalance chose lately: that replica is a voter that holds
// everything committed.
func (b *Broker) leaderPreferredElsewhere(pl meta.Placement, info raftetcd.GroupInfo) bool {
	if pl.LeaderSetAtMs == 0 || pl.Leader == b.opts.NodeID || time.Since(time.UnixMilli(pl.LeaderSetAtMs)) > leaderBalanceWindow {
		return false
	}
	pref, ok := b.voters([]string{pl.Leader})
	if !ok || !slices.Contains(info.Voters, pref[0]) || b.unfitLeader(pref[0]) {
		return false
	}
	return info.Match[pref[0]] >= info.Commit
}

// unfitLeader reports whether the node of raft id should not be handed a leadership
// now: the node-pair liveness finds it silent, or it said its disk stalls.
func (b *Broker) unfitLeader(id uint64) bool {
	return b.repl.host.PeerSilent(id) || b.repl.host.PeerStalled(id)
}

// claimHandOver makes the caller the one handing the partition of group gid over, until
// it calls release; false when another handover of it is under way. Two at once would
// mix up: the first to give up lets the leader lease again (ResumeAfterHandOver) while
// the other's transfer may still happen, and the leases granted in between would not
// be handed over.
func (b *Broker) claimHandOver(gid string) (release func(), ok bool) {
	b.repl.mu.Lock()
	defer b.repl.mu.Unlock()
	if b.repl.handing[gid] {
		return nil, false
	}
	if b.repl.handing == nil {
		b.repl.handing = map[string]bool{}
	}
	b.repl.handing[gid] = true
	return func() {
		b.repl.mu.Lock()
		delete(b.repl.handing, gid)
		b.repl.mu.Unlock()
	}, true
}

// mayLeadHook, set only by serial tests (never with t.Parallel), can keep the replica
// of node in group from taking a leadership handed to it (or from standing for
// election), as raft itself does while a committed configuration change is not yet
// applied there.
var mayLeadHook atomic.Pointer[func(node, group string) bool]

// roleHook, set only by serial tests, can keep a change of role of node's replica in
// group from reaching the partition (false): a leader deposed while it was paused that
// has not learnt it yet.
var roleHook atomic.Pointer[func(node, group string, lead bool) bool]

// moveHandOverWait bounds how long a leader a move takes off waits for its leadership
// to move before it serves again.
const moveHandOverWait = 3 * time.Second

// placementCurrent reports whether partition i of t still has placement epoch epoch
// once this node's metadata is confirmed current (a read of the controller): a
// leader never changes its group's members on a placement it may have read stale.
func (b *Broker) placementCurrent(t *topic, i int, epoch uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := b.meta.Sync(ctx); err != nil {
		b.log.Warn("a partition's replicas wait to change until this node's metadata is confirmed current", "topic", t.name, "partition", i, "err", err)
		return false
	}
	m, ok := b.meta.Topic(t.name)
	return ok && m.Incarnation == t.incarnation && i < len(m.Placement) && m.Placement[i].Epoch == epoch
}

// replicationLoop checks the groups led here every second (a change of leader or of
// a member's data directory may need their voters changed).
func (b *Broker) replicationLoop() {
	defer b.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var kick chan struct{} // nil (never ready) on a node without replicated partitions
	if b.repl != nil {
		kick = b.repl.kick
	}
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
			b.syncPeers()
			b.reconcileVoters()
			b.followPlacement()
		case <-kick:
			b.followPlacement()
		}
	}
}

// handOverWait bounds how long a stopping node hands over the partitions it leads.
const handOverWait = 5 * time.Second

// handOverLeadership moves the leadership of every replicated partition led here to
// another live replica before this node stops (SIGTERM, a rolling restart): each
// leader commits its live leases first (partition.HandOver), so the next leader
// honours their receipt handles and nothing in flight is delivered again. A partition
// whose leadership does not move within d is left to the election that follows the
// stop (its leases are then lost, as in a crash).
func (b *Broker) handOverLeadership(d time.Duration) {
	if b.repl == nil {
		return
	}
	ts := b.topicList()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for _, t := range ts {
		for i := range t.parts() {
			if !b.replicated(t.cur.Load(), i) || !t.leads(i) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.handOver(ctx, t, i)
			}()
		}
	}
	wg.Wait()
}

func (b *Broker) handOver(ctx context.Context, t *topic, i int) {
	gid := t.gid(i)
	info, ok := b.repl.host.Info(gid)
	if !ok || !info.Leader {
		return
	}
	self := raftID(b.meta.ServerID())
	var others []uint64
	for _, id := range info.Voters {
		if id != self {
			others = append(others, id)
		}
	}
	to := b.handOverChoice(gid, placedOf(t, i), info, others)
	if to == 0 {
		return
	}
	release, ok := b.claimHandOver(gid)
	if !ok {
		return // another handover of it is under way; the stop waits for none
	}
	defer release()
	if err := t.parts()[i].HandOver(ctx); err != nil {
		b.log.Warn("handing over a partition's leases failed; they lapse as in a crash", "topic", t.name, "partition", i, "err", err)
	}
	b.repl.host.TransferLeader(gid, to)
	for t.leads(i) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	if t.leads(i) {
		b.log.Warn("a partition's leadership did not move before the stop; the other replicas elect a leader", "topic", t.name, "partition", i)
	} else {
		b.log.Info("handed over a partition's leadership", "topic", t.name, "partition", i, "to", b.nodeOf(to))
	}
}

func (b *Broker) nodeOf(id uint64) string {
	b.repl.mu.Lock()
	defer b.repl.mu.Unlock()
	return b.repl.nodes[id]
}
