package meta

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// controller is the memory the Raft leader keeps to judge members' liveness. It is
// not replicated: a new controller starts afresh, giving every member a full
// SuspectAfter from its own election before judging it.
type controller struct {
	mu       sync.Mutex
	leading  bool
	since    time.Time            // when this node became controller
	lastSeen map[string]time.Time // Raft server id → its last heartbeat
	// versions are the cluster versions each member (by Raft server id) reported in a
	// heartbeat during this term: what decideVersion trusts besides the records.
	versions map[string]versionRange
	// waiting is the last reason decideVersion gave for not committing (logged once
	// per change).
	waiting string
	// versionMu orders admissions, version commits, the records of the configuration's
	// servers (recordServers) and decommissions (applyLocal): a node is admitted (its range
	// checked, its server added, its record written) wholly before or wholly after a
	// version is decided and committed, so no node that cannot speak the version
	// slips in between the decision and the commit.
	versionMu sync.Mutex
	// ends is the highest log end any replica reported of each partition group, this
	// term (see joinRequest.Ends).
	ends map[string]uint64
	// handedOver is when this node, halted, last handed the controller over
	// (controlTick); guarded by mu.
	handedOver time.Time
	// beforeRecord, when set (tests), runs in admit after the new server is in the
	// configuration and before its member record is written.
	beforeRecord atomic.Pointer[func(joinRequest)]
}

// heardEnds records the log ends a member reported.
func (c *controller) heardEnds(ends map[string]uint64) {
	if len(ends) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ends == nil {
		c.ends = map[string]uint64{}
	}
	for g, e := range ends {
		c.ends[g] = max(c.ends[g], e)
	}
}

func (c *controller) maxEnd(group string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ends[group]
}

func (c *controller) init() {
	c.lastSeen = make(map[string]time.Time)
	c.versions = make(map[string]versionRange)
}

// lead marks the start of this node's term as controller (once per term).
func (c *controller) lead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leading {
		c.leading, c.since = true, time.Now()
		c.versions = make(map[string]versionRange)
	}
}

// heardVersions records the versions member sid reported in a heartbeat this term.
func (c *controller) heardVersions(sid string, r versionRange) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.versions[sid] = r
}

func (c *controller) freshVersions() map[string]versionRange {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]versionRange, len(c.versions))
	for k, v := range c.versions {
		out[k] = v
	}
	return out
}

// heardThisTerm reports whether the controller heard from server sid since it was
// elected.
func (c *controller) heardThisTerm(sid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.lastSeen[sid]
	return ok && t.After(c.since)
}

// seen returns when the controller last heard from server sid (its election when never).
func (c *controller) seen(sid string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.lastSeen[sid]; ok && t.After(c.since) {
		return t
	}
	return c.since
}

// controlLoop runs the controller's duties while this node leads.
func (s *Store) controlLoop() {
	tick := max(s.opts.Cluster.HeartbeatInterval/2, 20*time.Millisecond)
	for s.sleep(tick) {
		if !s.Leader() {
			s.ctl.mu.Lock()
			s.ctl.leading = false
			s.ctl.mu.Unlock()
			continue
		}
		s.ctl.lead()
		if err := s.controlTick(); err != nil && !errors.Is(err, ErrNotLeader) {
			s.opts.Logger.Warn("meta: controller step failed; retrying", "err", err)
		}
	}
}

func (s *Store) configuration() (raft.Configuration, error) {
	fut := s.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return raft.Configuration{}, err
	}
	return fut.Configuration(), nil
}

// controlTick makes the cluster id (once), records the Raft configuration's servers as
// members, judges liveness, and promotes non-voters while voters are missing.
func (s *Store) controlTick() error {
	if err := s.fsm.haltedErr(); err != nil {
		return s.handOverHalted(err)
	}
	if s.diskStalled() && s.handOverStalled() {
		return nil
	}
	conf, err := s.configuration()
	if err != nil {
		return err
	}
	self := s.ServerID()
	if s.fsm.cluster() == "" {
		// Bootstrap, or the first start of a data directory of the single-node version:
		// the cluster gets its id, members, and its topics a placement.
		var ms []Member
		for _, srv := range conf.Servers {
			ms = append(ms, s.memberOf(srv, srv.ID == raft.ServerID(self)))
		}
		if _, err := s.applyLocal(command{Op: "init_cluster", ClusterID: randomID() + randomID(), Members: ms}); err != nil {
			return err
		}
	}
	if err := s.recordServers(); err != nil {
		return err
	}
	now := time.Now()
	c := s.opts.Cluster
	for _, m := range s.fsm.memberList() {
		if m.ServerID == self || m.Status == StatusDead || m.Status == StatusDecommissioning {
			continue
		}
		age := now.Sub(s.ctl.seen(m.ServerID))
		next := m.Status
		switch {
		case age > c.DeadAfter:
			next = StatusDead
		case age > c.SuspectAfter && m.Status == StatusAlive:
			next = StatusSuspect
		}
		if next != m.Status {
			s.opts.Logger.Warn("meta: member status changed", "member", m.ID, "from", m.Status, "to", next, "silent_for", age.Round(time.Millisecond))
			// A conflict: the member was decommissioned since the read; it stays so.
			if _, err := s.applyLocal(command{Op: "set_status", Name: m.ID, ServerID: m.ServerID, Status: next}); err != nil && !isConflict(err) {
				return err
			}
		}
	}
	if err := s.commitVersion(); err != nil {
		return err
	}
	if err := s.promote(conf); err != nil {
		return err
	}
	return s.steer()
}

// recordServers writes the member record the Raft configuration implies for each of
// its servers that has none, or whose record differs. It holds versionMu, as admit
// does and as a decommission's commit waits for (applyLocal): the configuration and
// the records it reads are then not those of an admission half done, and no
// decommission commits between its read of a record and its write of it (the
// write would drop it when it names a new server: a wiped node's).
func (s *Store) recordServers() error {
	s.ctl.versionMu.Lock()
	defer s.ctl.versionMu.Unlock()
	conf, err := s.configuration()
	if err != nil {
		return err
	}
	self := s.ServerID()
	for _, srv := range conf.Servers {
		want := s.memberOf(srv, string(srv.ID) == self)
		m, ok := s.fsm.member(want.ID)
		if ok && m.ServerID == want.ServerID {
			want.Status, want.HTTPAddr = m.Status, m.HTTPAddr
			want.MinVersion, want.MaxVersion = m.MinVersion, m.MaxVersion
			if string(srv.ID) == self {
				want.HTTPAddr = s.opts.Cluster.HTTPAddr
				want.MinVersion, want.MaxVersion = s.Versions()
				if m.Status != StatusDecommissioning {
					// Decommissioning ends only with the removal: the controller
					// decommissioning itself hands over first (removeDecommissioned).
					want.Status = StatusAlive
				}
			}
		}
		if ok && m.ServerID != want.ServerID && m.Status == StatusDecommissioning {
			// The node's new server (its disk was wiped) added while the node was
			// being decommissioned, its member record not written yet: it stays
			// decommissioning (admit).
			want.Status = StatusDecommissioning
		}
		if ok && m == want {
			continue
		}
		// ErrMemberNotFound: a server removed from the members; it stays removed.
		if _, err := s.applyLocal(command{Op: "set_member", Member: &want}); err != nil && !errors.Is(err, ErrMemberNotFound) {
			return err
		}
	}
	return nil
}

// handOverHalted hands the controller to another voter: a node whose state machine
// halted cannot apply what it would commit, and would judge members, versions and
// moves from a state that stopped at the halt. Raft elects it like any other, so it
// hands over whenever it wins; at most once per ten election timeouts, so a cluster
// whose every node halted does not hand the controller round without end.
func (s *Store) handOverHalted(halted error) error {
	s.ctl.mu.Lock()
	due := time.Since(s.ctl.handedOver) > 10*s.opts.Cluster.RaftTimeout
	if due {
		s.ctl.handedOver = time.Now()
	}
	s.ctl.mu.Unlock()
	if !due {
		return nil
	}
	conf, err := s.configuration()
	if err != nil {
		return leaderErr(err)
	}
	others := 0
	for _, srv := range conf.Servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != s.ServerID() {
			others++
		}
	}
	if others == 0 {
		return nil // a lone node: nobody to hand over to; it refuses writes (ErrHalted)
	}
	if err := s.raft.LeadershipTransfer().Error(); err != nil {
		// A lone node, or no voter caught up: it stays, refusing writes (ErrNotLeader).
		s.opts.Logger.Warn("meta: this node's state machine is halted and could not hand the controller over; it refuses writes", "halted", halted, "err", err)
		return nil
	}
	s.opts.Logger.Warn("meta: this node's state machine is halted; handed the controller over", "halted", halted)
	return nil
}

// diskStalled reports whether this node's disk stalls: its control-plane writes
// (Stalled) or, when the node says, its other writes (Cluster.DiskStalled).
func (s *Store) diskStalled() bool {
	return s.Stalled() || (s.opts.Cluster.DiskStalled != nil && s.opts.Cluster.DiskStalled())
}

// handOverStalled hands the controller to a voter on a healthy node while this node's
// disk stalls, and reports whether it did. Raft knows nothing of the disk: its
// heartbeats go on while each of the controller's log writes takes seconds, and every
// metadata write (a topic's create or delete, a member's status, a move's step) waits
// for them. The voter must be alive in the members' records and fit as the node plane
// hears it (Cluster.PeerUnfit); with none, this node stays controller (a slow one is
// better than none). At most once per ten Raft timeouts, as handOverHalted, so that
// nodes whose disks all stall do not hand it round without end; the node may be
// elected again later like any other, and hands over again then.
//
// Nor before it has been controller for DeadAfter: a new controller counts every
// member's silence from its own election, so controllers handed round faster than
// that (two nodes whose disks stall in turn) would never find a dead member dead, and
// nothing would be moved off it.
func (s *Store) handOverStalled() bool {
	s.ctl.mu.Lock()
	due := time.Since(s.ctl.handedOver) > 10*s.opts.Cluster.RaftTimeout &&
		time.Since(s.ctl.since) > s.opts.Cluster.DeadAfter+s.opts.Cluster.HeartbeatInterval
	s.ctl.mu.Unlock()
	if !due {
		return false
	}
	conf, err := s.configuration()
	if err != nil {
		return false
	}
	alive := map[string]bool{}
	for _, m := range s.fsm.memberList() {
		alive[m.ServerID] = m.Status == StatusAlive
	}
	var to *raft.Server
	for _, srv := range sortedServers(conf.Servers) {
		id := string(srv.ID)
		if srv.Suffrage != raft.Voter || id == s.ServerID() || !alive[id] {
			continue
		}
		if s.opts.Cluster.PeerUnfit != nil && s.opts.Cluster.PeerUnfit(id) {
			continue
		}
		to = &srv
		break
	}
	if to == nil {
		return false
	}
	s.ctl.mu.Lock()
	s.ctl.handedOver = time.Now()
	s.ctl.mu.Unlock()
	// The transfer's own bound is one election timeout, which a leader blocked in a
	// slow write of its log can pass although its target did take over: what counts is
	// whether this node still leads.
	if err := s.raft.LeadershipTransferToServer(to.ID, to.Address).Error(); err != nil && s.Leader() {
		s.opts.Logger.Warn("meta: this node's disk is stalling and the controller could not be handed over; it stays controller and tries again later", "to", to.ID, "err", err)
		return false
	}
	s.opts.Logger.Warn("meta: this node's disk is stalling: handed the controller over, so metadata writes do not wait for this disk", "to", to.ID)
	return true
}

// commitVersion commits the highest cluster version every member speaks, when
// decideVersion allows it, and logs why it waits when it does not (once per reason).
func (s *Store) commitVersion() error {
	s.ctl.versionMu.Lock()
	defer s.ctl.versionMu.Unlock()
	conf, err := s.configuration()
	if err != nil {
		return err
	}
	active := s.fsm.clusterVersion()
	ms := s.fsm.memberList()
	d := decideVersion(active, s.ServerID(), ms, s.ctl.freshVersions())
	if d.Commit != 0 {
		// A server in the Raft configuration gets the command whether or not it has a
		// member record yet (one being admitted): it must have reported too.
		recorded := map[string]bool{}
		for _, m := range ms {
			recorded[m.ServerID] = true
		}
		for _, srv := range conf.Servers {
			if !recorded[string(srv.ID)] {
				d = versionDecision{Waiting: fmt.Sprintf("version %d waits: Raft server %s has no member record yet", d.Commit, srv.ID)}
				break
			}
		}
	}
	s.ctl.mu.Lock()
	changed := d.Waiting != s.ctl.waiting
	s.ctl.waiting = d.Waiting
	s.ctl.mu.Unlock()
	if d.Commit == 0 {
		if changed && d.Waiting != "" {
			s.opts.Logger.Info("meta: cluster version not raised yet", "version", active, "why", d.Waiting)
		}
		return nil
	}
	if _, err := s.applyLocal(command{Op: "set_cluster_version", Version: d.Commit}); err != nil {
		return err
	}
	s.opts.Logger.Info("meta: committed cluster version; the features of this version are in use from now on, and a node with an older binary can no longer join",
		"version", d.Commit, "was", active, "members", len(s.fsm.memberList()))
	return nil
}

// memberOf is the member record the configuration implies for srv (status joining
// until it is heard from; this node is alive).
func (s *Store) memberOf(srv raft.Server, self bool) Member {
	m := Member{ID: nodeOfServer(string(srv.ID)), ServerID: string(srv.ID), ClusterAddr: string(srv.Address), Status: StatusJoining, Voter: srv.Suffrage == raft.Voter}
	if self {
		m.Status, m.HTTPAddr = StatusAlive, s.opts.Cluster.HTTPAddr
		m.MinVersion, m.MaxVersion = s.Versions()
	}
	return m
}

// promote makes alive non-voters voters while the configuration has fewer than
// MaxVoters voters (after a voter was removed).
func (s *Store) promote(conf raft.Configuration) error {
	voters := 0
	for _, srv := range conf.Servers {
		if srv.Suffrage == raft.Voter {
			voters++
		}
	}
	for _, srv := range conf.Servers {
		if voters >= s.opts.Cluster.MaxVoters {
			return nil
		}
		if srv.Suffrage == raft.Voter {
			continue
		}
		if m, ok := s.fsm.member(nodeOfServer(string(srv.ID))); !ok || m.ServerID != string(srv.ID) || m.Status != StatusAlive {
			continue
		}
		if err := s.awaitWrite(s.raft.AddVoter(srv.ID, srv.Address, 0, s.opts.ApplyTimeout), "promote "+string(srv.ID)); err != nil {
			return err
		}
		voters++
	}
	return nil
}

// joinsAsVoter decides a new server's suffrage: a voter while the configuration has
// fewer than maxVoters voters, else a non-voter (it replicates the metadata but does not
// vote, so elections and commits stay quick).
func joinsAsVoter(conf raft.Configuration, maxVoters int) bool {
	voters := 0
	for _, srv := range conf.Servers {
		if srv.Suffrage == raft.Voter {
			voters++
		}
	}
	return voters < maxVoters
}

// admit adds a node to the cluster; the controller runs it.
//
// A node id is one member. When the node id joins with a new Raft server id (its data
// directory was wiped, so its disk id is new), the old server is removed from the
// configuration first, so the new one never stands in for a history it lost. That is
// refused (ErrNodeIDInUse) while the old server is alive: heard from within
// SuspectAfter, or it is this controller. A wiped node that restarts at once is thus
// admitted once its old server has been silent for SuspectAfter; its join retries.
func (s *Store) admit(ctx context.Context, j joinRequest) error {
	if j.NodeID == "" || j.ClusterAddr == "" || nodeOfServer(j.ServerID) != j.NodeID || j.ServerID == j.NodeID {
		return fmt.Errorf("meta: a join needs a node id, a server id \"<node id>/<disk id>\" and a cluster address (got %+v)", j)
	}
	s.ctl.versionMu.Lock()
	defer s.ctl.versionMu.Unlock()
	// The version read must be the committed one, not one a new controller has not
	// applied yet.
	if err := s.awaitRead(s.raft.Barrier(s.opts.ApplyTimeout), "barrier"); err != nil {
		return err
	}
	if s.fsm.wasRemoved(j.ServerID) {
		return &ConflictError{Msg: fmt.Sprintf("node %s (Raft server %s) was removed from the cluster (decommissioned or replaced); its data is refused: wipe its data directory and start it again to join as a new member", j.NodeID, j.ServerID)}
	}
	if r, active := reported(j.MinVersion, j.MaxVersion), s.fsm.clusterVersion(); !r.has(active) {
		// It would halt at the first command it cannot apply, or not know the
		// operations the others use: refused before it is in the configuration.
		return fmt.Errorf("%w: node %s speaks cluster versions %v and the cluster runs version %d; start it with a binary that speaks version %d",
			ErrVersionUnsupported, j.NodeID, r, active, active)
	}
	conf, err := s.configuration()
	if err != nil {
		return leaderErr(err)
	}
	// A node being decommissioned whose disk was wiped (and that came back) stays
	// decommissioned under its new server: the operator asked for the node to go, and
	// its moves go on. It joins as a non-voter, which is never promoted, and is removed
	// like any decommissioned member once it holds nothing.
	old, known := s.fsm.member(j.NodeID)
	decommissioning := known && old.Status == StatusDecommissioning && old.ServerID != j.ServerID
	for _, srv := range conf.Servers {
		if nodeOfServer(string(srv.ID)) != j.NodeID || string(srv.ID) == j.ServerID {
			continue
		}
		age := time.Since(s.ctl.seen(string(srv.ID)))
		if string(srv.ID) == s.ServerID() || age < s.opts.Cluster.SuspectAfter {
			return fmt.Errorf("%w: node %s is a live member as Raft server %s (heard %v ago); a second node cannot take its id. If its data directory was wiped, it is admitted once the old server has been silent for %v",
				ErrNodeIDInUse, j.NodeID, srv.ID, age.Round(time.Millisecond), s.opts.Cluster.SuspectAfter)
		}
		s.opts.Logger.Warn("meta: node rejoined with a new data directory; removing its old Raft server", "node", j.NodeID, "old", srv.ID, "new", j.ServerID)
		if err := s.awaitWrite(s.raft.RemoveServer(srv.ID, 0, s.opts.ApplyTimeout), "remove "+string(srv.ID)); err != nil {
			return err
		}
		if conf, err = s.configuration(); err != nil {
			return leaderErr(err)
		}
	}
	var present *raft.Server
	for i, srv := range conf.Servers {
		if string(srv.ID) == j.ServerID {
			present = &conf.Servers[i]
		}
	}
	voter := joinsAsVoter(conf, s.opts.Cluster.MaxVoters) && !decommissioning
	if present != nil {
		voter = present.Suffrage == raft.Voter
	}
	if present == nil || present.Address != raft.ServerAddress(j.ClusterAddr) {
		var fut raft.IndexFuture
		if voter {
			fut = s.raft.AddVoter(raft.ServerID(j.ServerID), raft.ServerAddress(j.ClusterAddr), 0, s.opts.ApplyTimeout)
		} else {
			fut = s.raft.AddNonvoter(raft.ServerID(j.ServerID), raft.ServerAddress(j.ClusterAddr), 0, s.opts.ApplyTimeout)
		}
		if err := s.awaitWrite(fut, "add "+j.ServerID); err != nil {
			return err
		}
	}
	if hook := s.ctl.beforeRecord.Load(); hook != nil {
		(*hook)(j)
	}
	m := Member{ID: j.NodeID, ServerID: j.ServerID, ClusterAddr: j.ClusterAddr, HTTPAddr: j.HTTPAddr, Status: StatusJoining, Voter: voter, MinVersion: j.MinVersion, MaxVersion: j.MaxVersion}
	switch {
	case known && old.ServerID == j.ServerID && old.Status == StatusAlive:
		m.Status = StatusAlive
	case decommissioning:
		m.Status = StatusDecommissioning
		s.opts.Logger.Warn("meta: a decommissioning node rejoined with a new data directory; it stays decommissioning and is removed once it holds nothing", "node", j.NodeID, "old", old.ServerID, "new", j.ServerID)
	}
	_, err = s.applyLocal(command{Op: "set_member", Member: &m})
	return err
}

// addByAddress admits the node at a cluster address (POST /v1/cluster/members): it
// asks that node who it is, checks it is the node id the operator named, and admits it.
func (s *Store) addByAddress(ctx context.Context, a addRequest) error {
	resp, err := s.forward(ctx, raft.ServerAddress(a.ClusterAddr), fwdRequest{Kind: kindIdentity})
	if err != nil {
		return err
	}
	info := resp.Info
	switch {
	case info == nil:
		return fmt.Errorf("%w: %s did not say who it is", ErrUnavailable, a.ClusterAddr)
	case info.NodeID != a.NodeID:
		return &ConflictError{Msg: fmt.Sprintf("the node at %s is %q, not %q", a.ClusterAddr, info.NodeID, a.NodeID)}
	}
	if info.Formed {
		if m, ok := s.fsm.member(a.NodeID); ok && m.ServerID == info.ServerID {
			return nil // a member already
		}
		return &ConflictError{Msg: fmt.Sprintf("node %s at %s is in a cluster of its own already; start it with an empty data directory and the join option (or wait-for-add) to add it", a.NodeID, a.ClusterAddr)}
	}
	return s.admit(ctx, joinRequest{NodeID: info.NodeID, ServerID: info.ServerID, ClusterAddr: a.ClusterAddr, HTTPAddr: info.HTTPAddr,
		MinVersion: info.MinVersion, MaxVersion: info.MaxVersion})
}

// heard records a member's heartbeat; the controller runs it. A member that was
// suspect, dead or joining is alive again. ErrMemberNotFound tells a node that is not a
// member under that server id.
func (s *Store) heard(b joinRequest) error {
	s.ctl.mu.Lock()
	s.ctl.lastSeen[b.ServerID] = time.Now()
	s.ctl.mu.Unlock()
	s.ctl.heardEnds(b.Ends)
	m, ok := s.fsm.member(b.NodeID)
	if !ok || m.ServerID != b.ServerID {
		return ErrMemberNotFound
	}
	// The versions count for this term from now, whatever the record says: the record
	// follows below (a heartbeat without versions is a binary that speaks 1 only).
	s.ctl.heardVersions(b.ServerID, reported(b.MinVersion, b.MaxVersion))
	sameVersions := m.MinVersion == b.MinVersion && m.MaxVersion == b.MaxVersion
	if m.Status == StatusAlive && m.HTTPAddr == b.HTTPAddr && sameVersions || m.Status == StatusDecommissioning && sameVersions {
		return nil
	}
	if m.Status != StatusDecommissioning {
		m.Status = StatusAlive
	}
	m.HTTPAddr, m.MinVersion, m.MaxVersion = b.HTTPAddr, b.MinVersion, b.MaxVersion
	_, err := s.applyLocal(command{Op: "set_member", Member: &m})
	return err
}

func (s *Store) self() joinRequest {
	lo, hi := s.Versions()
	j := joinRequest{NodeID: s.opts.NodeID, ServerID: s.ServerID(), ClusterAddr: string(s.addr), HTTPAddr: s.opts.Cluster.HTTPAddr, MinVersion: lo, MaxVersion: hi}
	if f := s.opts.Cluster.Ends; f != nil {
		j.Ends = f()
	}
	return j
}

// heartbeatLoop tells the controller, every HeartbeatInterval, that this node is alive.
func (s *Store) heartbeatLoop() {
	// refused: the controller answered the last heartbeat that it knows no member of
	// this server id; only then is the configuration read (standingInFor), not on
	// every tick of a healthy node.
	standIn, refused := false, false
	for s.sleep(s.opts.Cluster.HeartbeatInterval) {
		if s.Leader() {
			_ = s.heard(s.self())
			continue
		}
		addr, _ := s.raft.LeaderWithID()
		if addr == "" || s.opts.Cluster.Forwarder == nil {
			continue
		}
		old := ""
		if refused || standIn {
			old = s.standingInFor()
		}
		if old != "" {
			// The controller admits the new server once the old one has been silent
			// for SuspectAfter (its heartbeats stopped with the old process).
			if !standIn {
				s.opts.Logger.Warn("meta: the Raft configuration names another server of this node id and not this one (a wiped data directory the leader reached before it joined, or a node replaced since); asking the controller to admit this one", "named", old, "this", s.ServerID())
			}
			standIn = true
			_ = s.joinOnce(addr)
			continue
		}
		standIn = false
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.Cluster.HeartbeatInterval)
		b := s.self()
		_, err := s.forward(ctx, addr, fwdRequest{Kind: kindHeartbeat, Beat: &b})
		cancel()
		refused = errors.Is(err, ErrMemberNotFound)
		if err != nil && !refused {
			s.opts.Logger.Debug("meta: heartbeat to the controller failed", "controller", addr, "err", err)
		}
	}
}

// ClusterID returns the cluster's id ("" until the controller made it).
func (s *Store) ClusterID() string { return s.fsm.cluster() }

// Members returns the members as this node knows them, by id.
func (s *Store) Members() []Member { return s.fsm.memberList() }

// Member returns the member of node id id as this node's replica knows it.
func (s *Store) Member(id string) (Member, bool) { return s.fsm.member(id) }

// MemberLoads returns, per node id, the partitions it holds and leads.
func (s *Store) MemberLoads() map[string]MemberLoad { return s.fsm.loads() }

// Controller returns the node id of the controller as this node knows it ("" when
// none is known).
func (s *Store) Controller() string {
	_, id := s.raft.LeaderWithID()
	if id == "" {
		return ""
	}
	return nodeOfServer(string(id))
}

// AddMember admits the node nodeID at cluster address addr through the controller.
func (s *Store) AddMember(ctx context.Context, nodeID, addr string) error {
	req := fwdRequest{Kind: kindAdd, Add: &addRequest{NodeID: nodeID, ClusterAddr: addr}}
	if s.Leader() {
		return fromWire(s.handle(ctx, req).Err)
	}
	leader, _ := s.raft.LeaderWithID()
	if leader == "" {
		return fmt.Errorf("%w: no controller known", ErrUnavailable)
	}
	_, err := s.forward(ctx, leader, req)
	return err
}

// sortedServers orders a configuration's servers by id, so every node bootstrapping from
// the same peers writes the same configuration.
func sortedServers(ss []raft.Server) []raft.Server {
	sort.Slice(ss, func(i, j int) bool { return ss[i].ID < ss[j].ID })
	return ss
}

// MaxReportedEnd returns the highest log end any replica of partition group reported
// to the controller during its term (0 when none did: a lower bound, nothing more). It
// asks the controller, trying again for up to ApplyTimeout while one is being elected
// or does not answer.
func (s *Store) MaxReportedEnd(ctx context.Context, group string) (uint64, error) {
	deadline := time.Now().Add(s.opts.ApplyTimeout)
	var last error
	for {
		if s.Leader() {
			return s.ctl.maxEnd(group), nil
		}
		if addr, _ := s.raft.LeaderWithID(); addr != "" {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := s.forward(actx, addr, fwdRequest{Kind: kindMaxEnd, Group: group})
			cancel()
			if err == nil {
				return resp.Index, nil
			}
			last = err
		} else {
			last = fmt.Errorf("%w: no controller known", ErrUnavailable)
		}
		if time.Now().After(deadline) {
			return 0, last
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
