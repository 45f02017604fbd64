package meta

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Cluster versions gate what a rolling upgrade may use. Every binary speaks a range of
// cluster versions; every member reports its range to the controller (in its heartbeat,
// kept in its member record); the controller commits the cluster's version (the Raft
// command set_cluster_version) once every member supports it. A node-plane operation or
// Raft command introduced in version v is used only once the committed version is at
// least v, so a node of the previous release never meets one it does not know, and a
// rollback before the commit needs nothing but the old binary.
//
// Version 1 is what the releases before cluster versions speak: every operation and
// command they know. A member that reports no range (a binary of that time) counts as
// speaking 1 to 1; a cluster without a set_cluster_version in its log runs version 1.
const (
	// VersionMin is the lowest cluster version this binary can run in.
	VersionMin = 1
	// VersionMax is the highest cluster version this binary speaks.
	VersionMax = 4
)

// Feature is something a node may use only once the cluster runs version Since.
type Feature struct {
	Name  string
	Since int
}

// The features of versions after 1. Control-plane commands are gated by opSince
// (below); node-plane operations and partition-group commands by these, through
// Store.Allows before a node sends one and Store.Speaks when it receives one.
var (
	// FeatureStatsBatch: a node asks another for the counters of all the partitions
	// it leads of a topic in one node-plane request ("stats_batch"), instead of one
	// request per partition.
	FeatureStatsBatch = Feature{Name: "stats_batch", Since: 2}
	// FeatureReplicaSnapshots: a replicated partition's group takes snapshots and
	// compacts its log, and a replica behind the cut restores the snapshot by fetching
	// records from another ("replica_read"). A version-1 replica would install such a
	// snapshot without the messages it stands for.
	FeatureReplicaSnapshots = Feature{Name: "replica_snapshots", Since: 2}
	// FeaturePartitionCommands: the partition-group commands of version 2, the fan-out
	// cursor (F) and a handover that carries its leader's term (L with a term), which a
	// version-1 replica would refuse, and stop applying at.
	FeaturePartitionCommands = Feature{Name: "partition_commands", Since: 2}
	// FeatureMoves: partition moves, replication factor changes, decommissions and
	// forced takeovers (moves.go, steer.go): a partition's group gains learners and
	// changes voters on the control plane's word.
	FeatureMoves = Feature{Name: "moves", Since: 3}
	// FeatureGroupOnData: a partition of one replica becomes a Raft group over the
	// data it holds (its replication factor raised, or a forced takeover), and the
	// group's first snapshot stands for that data.
	FeatureGroupOnData = Feature{Name: "group_on_data", Since: 3}
	// FeatureDeleteFence: a topic's delete answers once a majority of every partition's
	// replicas confirm they applied it and closed their copy ("applied"), so no produce
	// sent after the answer is stored in the deleted incarnation.
	FeatureDeleteFence = Feature{Name: "delete_fence", Since: 3}
	// FeatureLeaderLease: every replica holds its vote for its leader's lease, so a
	// leader may serve consumes under its lease instead of committing the deliveries
	// first (raftetcd lease.go).
	FeatureLeaderLease = Feature{Name: "leader_lease", Since: 3}
	// FeatureRemoteUpdate: a remote child's URL, username and CA certificates are
	// changed in place, its cursor kept (the control-plane command update_remote).
	FeatureRemoteUpdate = Feature{Name: "remote_update", Since: 3}
	// FeatureOneAlter: an alter that changes a topic's replication factor and other
	// settings is one command (alter_with_replication_factor), refused or applied
	// whole; before it, two.
	FeatureOneAlter = Feature{Name: "one_alter", Since: 4}
)

// opSince names the control-plane commands of versions after 1 and the version each
// came in. A command is proposed only when the committed version allows it (gateCmd),
// and a node that speaks less halts at one, as a binary that does not know it would.
// set_cluster_version is proposed by the controller alone, by its own decision
// (decideVersion), never through gateCmd.
var opSince = map[string]int{
	"set_cluster_version": 2,
	// Moves, replication factor changes, decommission and forced takeover (moves.go).
	"start_move":             3,
	"switch_move":            3,
	"move_status":            3,
	"move_progress":          3,
	"set_replication_factor": 3,
	"force_leader":           3,
	"remove_member":          3,
	"set_leader":             3,
	// A remote child's URL, username and CA certificates changed in place.
	"update_remote": 3,
	// A topic's settings and replication factor changed in one command.
	"alter_with_replication_factor": 4,
}

// ErrVersionGated means the feature needs a cluster version the cluster has not
// committed yet (some member runs an older binary). It is a kind of ErrUnavailable:
// the HTTP API answers 503 until every member is upgraded and the version committed.
var ErrVersionGated = fmt.Errorf("%w: the cluster has not committed the version this needs", ErrUnavailable)

// ErrVersionUnsupported means a node cannot speak the cluster's committed version: a
// join is refused with it, and a member's state machine halts with it.
var ErrVersionUnsupported = errors.New("meta: this node cannot speak the cluster's version")

// versionRange is the cluster versions a binary speaks, lo to hi.
type versionRange struct{ lo, hi int }

func (r versionRange) has(v int) bool { return r.lo <= v && v <= r.hi }

func (r versionRange) String() string {
	if r.lo == r.hi {
		return fmt.Sprint(r.lo)
	}
	return fmt.Sprintf("%d–%d", r.lo, r.hi)
}

// reported turns a reported range into one: none reported (0, 0) is a binary from
// before cluster versions, which speaks 1 only.
func reported(lo, hi int) versionRange {
	if hi <= 0 {
		return versionRange{1, 1}
	}
	return versionRange{max(lo, 1), hi}
}

// Versions returns the cluster versions the member last reported it speaks (1 to 1
// when it reported none: a binary from before cluster versions).
func (m Member) Versions() (lo, hi int) {
	r := reported(m.MinVersion, m.MaxVersion)
	return r.lo, r.hi
}

// versionDecision is what the controller concludes about the cluster version.
type versionDecision struct {
	// Commit is the version to commit now, or 0 for none.
	Commit int
	// Waiting says why a version this controller speaks is not committed yet ("" when
	// the cluster runs the highest every member speaks).
	Waiting string
}

// decideVersion is the controller's rule for committing a cluster version higher than
// active: the highest version every member speaks, committed only when
//
//   - every member has a range that includes it, a dead one included: a member that
//     reported none (a binary of an older release, or one never heard from) speaks 1
//     only, and a dead member may come back with the binary it last ran;
//   - no member is joining (it has not reported yet) or suspect (it went silent and may
//     be restarting with another binary, as in a rollback);
//   - every alive member other than the controller has reported its range to this
//     controller, during its term (fresh), so a record written by an earlier
//     controller, or before the member was rolled back, is never the reason.
//
// A dead member counts by the range in its record. The version never goes down.
func decideVersion(active int, self string, ms []Member, fresh map[string]versionRange) versionDecision {
	if len(ms) == 0 {
		return versionDecision{}
	}
	target := VersionMax
	var blocked []string
	for _, m := range ms {
		r := reported(m.MinVersion, m.MaxVersion)
		if f, ok := fresh[m.ServerID]; ok && m.Status != StatusDead {
			r = f
		}
		target = min(target, r.hi)
		switch {
		case m.ServerID == self:
		case m.Status == StatusJoining:
			blocked = append(blocked, fmt.Sprintf("member %s has not reported yet (joining)", m.ID))
		case m.Status == StatusSuspect:
			blocked = append(blocked, fmt.Sprintf("member %s is suspect", m.ID))
		case m.Status == StatusDead:
		default:
			if _, ok := fresh[m.ServerID]; !ok {
				blocked = append(blocked, fmt.Sprintf("member %s has not reported to this controller yet", m.ID))
			}
		}
	}
	if target <= active {
		if target < VersionMax {
			return versionDecision{Waiting: fmt.Sprintf("version %d waits for %s", target+1, lowest(ms, fresh, target))}
		}
		return versionDecision{}
	}
	for _, m := range ms {
		r := reported(m.MinVersion, m.MaxVersion)
		if f, ok := fresh[m.ServerID]; ok && m.Status != StatusDead {
			r = f
		}
		if !r.has(target) {
			blocked = append(blocked, fmt.Sprintf("member %s speaks %v", m.ID, r))
		}
	}
	if len(blocked) > 0 {
		sort.Strings(blocked)
		return versionDecision{Waiting: fmt.Sprintf("version %d waits: %s", target, strings.Join(blocked, "; "))}
	}
	return versionDecision{Commit: target}
}

// lowest names the members whose highest version is v (what holds the cluster there).
func lowest(ms []Member, fresh map[string]versionRange, v int) string {
	var ids []string
	for _, m := range ms {
		r := reported(m.MinVersion, m.MaxVersion)
		if f, ok := fresh[m.ServerID]; ok && m.Status != StatusDead {
			r = f
		}
		if r.hi == v {
			ids = append(ids, fmt.Sprintf("%s (%s, speaks %v)", m.ID, m.Status, r))
		}
	}
	sort.Strings(ids)
	return "members speaking at most " + fmt.Sprint(v) + ": " + strings.Join(ids, ", ")
}

// speaks refuses a command of a cluster version above the highest this node speaks:
// the state machine halts at it, as a binary that does not know the command would.
func (f *fsm) speaks(c command) error {
	v := opSince[c.Op]
	if c.Op == "set_cluster_version" {
		v = max(v, c.Version)
	}
	if v > f.maxVersion {
		return fmt.Errorf("%w: %s needs cluster version %d, and this node speaks %v", ErrVersionUnsupported, c.Op, v, versionRange{VersionMin, f.maxVersion})
	}
	return nil
}

// clusterVersion is the committed cluster version (1 when none was committed).
func (f *fsm) clusterVersion() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return max(f.version, 1)
}

// ClusterVersion returns the cluster version this node's replica of the metadata holds
// committed (1 until the controller commits a higher one).
func (s *Store) ClusterVersion() int { return s.fsm.clusterVersion() }

// Versions returns the cluster versions this node speaks (its VersionMax may be lowered
// by Cluster.VersionMax).
func (s *Store) Versions() (lo, hi int) { return VersionMin, s.opts.Cluster.VersionMax }

// Allows reports whether this node may use feature f now: the committed cluster
// version includes it, so every member speaks it. Before that the node uses the form
// of the older version, or answers that the feature is not available yet.
func (s *Store) Allows(f Feature) bool { return s.fsm.clusterVersion() >= f.Since }

// Speaks reports whether this node speaks feature f. A node that does not answers a
// request using it as a binary of its version would: as unknown.
func (s *Store) Speaks(f Feature) bool { return f.Since <= s.opts.Cluster.VersionMax }

// gateCmd refuses a control-plane command of a cluster version the cluster has not
// committed (ErrVersionGated): proposed, it would halt every member that does not know
// it. set_cluster_version never passes here (the controller proposes it directly).
func (s *Store) gateCmd(c command) error {
	v, ok := opSince[c.Op]
	if !ok {
		return nil
	}
	if active := s.fsm.clusterVersion(); active < v {
		return fmt.Errorf("%w: %s needs cluster version %d and the cluster runs %d; it is committed once every member runs a binary that speaks it", ErrVersionGated, c.Op, v, active)
	}
	return nil
}
