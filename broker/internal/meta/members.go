package meta

import (
	"slices"
	"sort"
	"strings"
)

// MemberStatus is what the controller last concluded about a member.
type MemberStatus string

// Member statuses. The controller moves a member from alive to suspect when it has not
// heard from it for Cluster.SuspectAfter, and to dead after Cluster.DeadAfter; a
// heartbeat makes it alive again. A member is joining from its admission until its
// first heartbeat. decommissioning is reserved for the decommission work.
const (
	StatusAlive           MemberStatus = "alive"
	StatusSuspect         MemberStatus = "suspect"
	StatusDead            MemberStatus = "dead"
	StatusJoining         MemberStatus = "joining"
	StatusDecommissioning MemberStatus = "decommissioning"
)

func (s MemberStatus) valid() bool {
	switch s {
	case StatusAlive, StatusSuspect, StatusDead, StatusJoining, StatusDecommissioning:
		return true
	}
	return false
}

// Member is one node of the cluster as the control plane records it.
type Member struct {
	// ID is the node id (--node-id).
	ID string `json:"id"`
	// ServerID is the node's Raft identity, "<node id>/<disk id>": a node whose data
	// directory was wiped comes back with a new one (see identity.go).
	ServerID string `json:"server_id"`
	// ClusterAddr is the node-plane address the Raft transport reaches it at.
	ClusterAddr string `json:"cluster_addr"`
	// HTTPAddr is the address it serves the HTTP API at, as it advertises it.
	HTTPAddr string       `json:"http_addr,omitempty"`
	Status   MemberStatus `json:"status"`
	Voter    bool         `json:"voter"`
	// MinVersion and MaxVersion are the cluster versions the member last reported it
	// speaks (version.go); both 0 when it reported none (a binary from before cluster
	// versions, which speaks 1 only). A binary of that time drops them when it rewrites
	// the record, which only makes the member count as speaking 1 again.
	MinVersion int `json:"min_version,omitempty"`
	MaxVersion int `json:"max_version,omitempty"`
}

func (m Member) check() error {
	if m.ID == "" || m.ServerID == "" || !m.Status.valid() {
		return errBadMember
	}
	return nil
}

// Placement is where one partition lives: its replica set (node ids), the replica
// preferred to lead it (where requests go first; the partition's Raft group elects
// the actual leader), and an epoch for changes of the replica set. A partition with
// one replica is a plain single-node partition; with more, one Raft group.
type Placement struct {
	Replicas []string `json:"replicas"`
	Leader   string   `json:"leader"`
	Epoch    uint64   `json:"epoch"`
	// Learners are the nodes a move is adding: they copy the partition's log but do
	// not vote until the move switches them in (moves.go).
	Learners []string `json:"learners,omitempty"`
	// Forced is the Raft index of the forced takeover that made the current replica
	// set (0: none). A takeover starts a new group, so replicas of the old one cannot
	// take part in it.
	Forced uint64 `json:"forced,omitempty"`
	// Group marks a partition that is a Raft group even with one replica: one whose
	// replication factor was raised from 1 (it became a group over its data), or one
	// taken over by force. A partition placed with more replicas always is one.
	Group bool `json:"group,omitempty"`
	// LeaderSetAtMs is when a rebalance last chose Leader (set_leader): the
	// partition's leader hands its leadership to Leader for a minute after that, and
	// otherwise leaves it where elections put it.
	LeaderSetAtMs int64 `json:"leader_set_at_ms,omitempty"`
}

// Replicated reports whether the partition is a Raft group (see Group).
func (p Placement) Replicated() bool { return len(p.Replicas) > 1 || p.Group }

// applyCluster applies init_cluster, set_member and set_status. Each is idempotent: the
// same command applied again leaves the same state. A decommissioning member stays so
// until remove_member (cluster version 3, so every node applies this rule). Called with
// f.mu held.
func (f *fsm) applyCluster(c command) applyResult {
	switch c.Op {
	case "init_cluster":
		// The first one wins; a second (a controller that raced a change of leader)
		// changes nothing.
		if f.clusterID != "" {
			return applyResult{clusterID: f.clusterID}
		}
		f.clusterID = c.ClusterID
		for _, m := range c.Members {
			if _, ok := f.members[m.ID]; !ok {
				f.members[m.ID] = m
			}
		}
		// Upgrade: topics of a single-node log have no placement; put each on the
		// members now (on a cluster of one, this node).
		for _, name := range f.sortedTopicNames() {
			t := f.topics[name]
			if len(t.Placement) == 0 {
				t.Placement = f.place(t.Partitions, 1)
				f.topics[name] = t
			}
		}
		return applyResult{clusterID: f.clusterID}
	case "set_member":
		m := *c.Member
		if f.removed[m.ServerID] {
			// Removed (decommissioned or replaced): a record read before the removal (a
			// heartbeat, the reconcile of the Raft configuration) must not bring it back.
			return applyResult{err: ErrMemberNotFound}
		}
		if old, ok := f.members[m.ID]; ok && old.ServerID == m.ServerID && old.Status == StatusDecommissioning {
			// A record read before the decommission committed (a heartbeat, the
			// reconcile of the Raft configuration) must not undo it.
			m.Status = StatusDecommissioning
		}
		f.members[m.ID] = m
		return applyResult{}
	case "set_status":
		m, ok := f.members[c.Name]
		if !ok || (c.ServerID != "" && c.ServerID != m.ServerID) {
			return applyResult{err: ErrMemberNotFound}
		}
		if m.Status == StatusDecommissioning && c.Status != StatusDecommissioning {
			// Decommissioning ends only with the member's removal. The controller
			// judges liveness on a read of the state: a suspect or dead judged before
			// the decommission committed would undo it, and the member would keep its
			// replicas and never be removed.
			return conflict("member %s is decommissioning; its status stays until it is removed", c.Name)
		}
		m.Status = c.Status
		f.members[c.Name] = m
		return applyResult{}
	}
	return applyResult{}
}

// place spreads n new partitions of rf replicas each over the alive members: each
// replica on the member holding the fewest replicas (ties by id), never two of one
// partition on one member, and the leader on the replica that leads the fewest, so
// both spread evenly. rf is capped at the alive members (the broker refuses more
// before proposing). It reads only the replicated state, so every replica computes
// the same placement. With no alive member (a log from before init_cluster) the
// partitions stay unplaced until init_cluster. Called with f.mu held.
func (f *fsm) place(n, rf int32) []Placement {
	var live []string
	for id, m := range f.members {
		// A replicated partition may be placed on a member that has not sent its first
		// heartbeat yet (a cluster just bootstrapped); a single replica only on one known
		// alive, as before replication, so old logs place the same.
		if m.Status == StatusAlive || (rf > 1 && m.Status == StatusJoining) {
			live = append(live, id)
		}
	}
	if len(live) == 0 {
		return nil
	}
	sort.Strings(live)
	rf = max(1, min(rf, int32(len(live))))
	held := f.heldCounts()
	led := map[string]int{}
	for _, t := range f.topics {
		for _, p := range t.Placement {
			led[p.Leader]++
		}
	}
	out := make([]Placement, n)
	for i := range out {
		var reps []string
		for range rf {
			best := ""
			for _, id := range live {
				if slices.Contains(reps, id) {
					continue
				}
				if best == "" || held[id] < held[best] {
					best = id
				}
			}
			held[best]++
			reps = append(reps, best)
		}
		leader := reps[0]
		for _, id := range reps[1:] {
			if led[id] < led[leader] {
				leader = id
			}
		}
		led[leader]++
		out[i] = Placement{Replicas: reps, Leader: leader, Epoch: 1}
	}
	return out
}

// heldCounts counts the partition replicas each node holds. Called with f.mu held.
func (f *fsm) heldCounts() map[string]int {
	held := make(map[string]int)
	for _, t := range f.topics {
		for _, p := range t.Placement {
			for _, r := range p.Replicas {
				held[r]++
			}
		}
	}
	return held
}

func (f *fsm) sortedTopicNames() []string {
	names := make([]string, 0, len(f.topics))
	for n := range f.topics {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (f *fsm) memberList() []Member {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]Member, 0, len(f.members))
	for _, m := range f.members {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (f *fsm) member(id string) (Member, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.members[id]
	return m, ok
}

func (f *fsm) cluster() string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.clusterID
}

func (f *fsm) haltedErr() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.halted
}

// MemberLoad is how many partition replicas a member holds and how many it leads.
type MemberLoad struct{ Held, Led int }

func (f *fsm) loads() map[string]MemberLoad {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]MemberLoad)
	for _, t := range f.topics {
		for _, p := range t.Placement {
			for _, r := range p.Replicas {
				l := out[r]
				l.Held++
				out[r] = l
			}
			l := out[p.Leader]
			l.Led++
			out[p.Leader] = l
		}
	}
	return out
}

// nodeOfServer returns the node id part of a Raft server id "<node id>/<disk id>" (the
// whole id for a server id of the single-node version, which was the node id).
func nodeOfServer(sid string) string {
	if i := strings.LastIndexByte(sid, '/'); i >= 0 {
		return sid[:i]
	}
	return sid
}
