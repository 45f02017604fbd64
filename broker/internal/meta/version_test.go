package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func member(id string, st MemberStatus, lo, hi int) Member {
	return Member{ID: id, ServerID: id + "/d", ClusterAddr: "addr-" + id, Status: st, Voter: true, MinVersion: lo, MaxVersion: hi}
}

// TestDecideVersion: the controller's rule for committing a cluster version, member
// by member.
func TestDecideVersion(t *testing.T) {
	v2 := versionRange{1, 2}
	v1 := versionRange{1, 1}
	fresh := func(rs map[string]versionRange) map[string]versionRange {
		out := map[string]versionRange{}
		for id, r := range rs {
			out[id+"/d"] = r
		}
		return out
	}
	cases := []struct {
		name    string
		active  int
		ms      []Member
		fresh   map[string]versionRange
		commit  int
		waiting string // a part of the reason, when not committed
	}{
		{"every member speaks 2 and reported it", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusAlive, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2, "n3": v2}), 2, ""},
		{"a member reports 1 only (not upgraded yet)", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusAlive, 0, 0)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2, "n3": v1}), 0, "n3 (alive, speaks 1)"},
		{"a member rolled back before the commit: its heartbeat beats its record", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusAlive, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2, "n3": v1}), 0, "n3 (alive, speaks 1)"},
		{"an alive member not heard this term (its record may be stale)", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusAlive, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2}), 0, "n3 has not reported to this controller yet"},
		{"a dead member that never reported a range holds the cluster at 1", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusDead, 0, 0)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2}), 0, "n3 (dead, speaks 1)"},
		{"a dead member counts by the range it last reported", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusDead, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2}), 2, ""},
		{"a dead member's old heartbeat of this term does not override its record", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusDead, 0, 0)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2, "n3": v2}), 0, "n3 (dead, speaks 1)"},
		{"a suspect member may be restarting with another binary", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n3", StatusSuspect, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2, "n3": v2}), 0, "n3 is suspect"},
		{"a joining member has not reported yet", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2), member("n4", StatusJoining, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2}), 0, "n4 has not reported yet"},
		{"the version is committed already", 2,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 1, 2)},
			fresh(map[string]versionRange{"n1": v2, "n2": v2}), 0, ""},
		{"never lowered, even when a member speaks less (it halted)", 2,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 0, 0)},
			fresh(map[string]versionRange{"n1": v2, "n2": v1}), 0, "n2"},
		{"a member that no longer speaks the target (its lowest is higher)", 1,
			[]Member{member("n1", StatusAlive, 1, 2), member("n2", StatusAlive, 3, 3)},
			fresh(map[string]versionRange{"n1": v2, "n2": {3, 3}}), 0, "n2 speaks 3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := decideVersion(c.active, "n1/d", c.ms, c.fresh)
			if d.Commit != c.commit {
				t.Fatalf("commit %d, want %d (waiting: %q)", d.Commit, c.commit, d.Waiting)
			}
			if c.waiting != "" && !strings.Contains(d.Waiting, c.waiting) {
				t.Fatalf("waiting %q, want it to say %q", d.Waiting, c.waiting)
			}
			if c.commit != 0 && d.Waiting != "" {
				t.Fatalf("committing %d yet waiting %q", d.Commit, d.Waiting)
			}
		})
	}
}

// TestFSMHaltsAtAVersionItDoesNotSpeak: a node that speaks up to version 1 (a binary of
// that release, or one held there) halts at the commit of version 2, naming both, and
// keeps the entry; one that speaks 2 applies it, and never lowers the version.
func TestFSMHaltsAtAVersionItDoesNotSpeak(t *testing.T) {
	entry := func(i uint64, c command) *raft.Log {
		b, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		return &raft.Log{Index: i, Type: raft.LogCommand, Data: b}
	}
	old := newFSM()
	old.maxVersion = 1
	res := old.Apply(entry(1, command{Op: "set_cluster_version", Version: 2})).(applyResult)
	if !errors.Is(res.err, ErrHalted) || !errors.Is(res.err, ErrVersionUnsupported) {
		t.Fatalf("a node speaking 1 applied set_cluster_version 2: %v", res.err)
	}
	if msg := res.err.Error(); !strings.Contains(msg, "needs cluster version 2") || !strings.Contains(msg, "this node speaks 1") {
		t.Fatalf("the halt does not name both versions: %s", msg)
	}
	if _, err := old.Snapshot(); err == nil {
		t.Fatal("a halted state machine took a snapshot (Raft could drop the entry a newer binary needs)")
	}
	if v := old.clusterVersion(); v != 1 {
		t.Fatalf("the halted node holds version %d", v)
	}

	cur := newFSM()
	for i, v := range []int{2, 2} {
		if res := cur.Apply(entry(uint64(i+1), command{Op: "set_cluster_version", Version: v})).(applyResult); res.err != nil {
			t.Fatal(res.err)
		}
	}
	if v := cur.clusterVersion(); v != 2 {
		t.Fatalf("version %d after committing 2", v)
	}
	// The version survives a snapshot; a node speaking 1 restoring it halts.
	snap, err := cur.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	again := newFSM()
	if err := again.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil || again.clusterVersion() != 2 {
		t.Fatalf("restored: version %d, %v", again.clusterVersion(), err)
	}
	held := newFSM()
	held.maxVersion = 1
	if err := held.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if err := held.haltedErr(); !errors.Is(err, ErrVersionUnsupported) || !strings.Contains(err.Error(), "holds cluster version 2, this node speaks 1") {
		t.Fatalf("a node speaking 1 restored a version-2 snapshot without halting: %v", err)
	}
}

// TestGatedCommandRefusedBeforeCommit: a control-plane command of version 2 is not
// proposed, through this node or forwarded, while the cluster runs 1.
func TestGatedCommandRefusedBeforeCommit(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), NodeID: "solo", Cluster: Cluster{VersionMax: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	waitReady(t, s)
	_, err = s.applyCmd(command{Op: "set_cluster_version", Version: 2})
	if !errors.Is(err, ErrVersionGated) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a version-2 command on a version-1 cluster: %v, want ErrVersionGated", err)
	}
	b, _ := encodeCommand(command{Op: "set_cluster_version", Version: 2})
	if resp := s.handle(context.Background(), fwdRequest{Kind: kindApply, Cmd: b}); !errors.Is(fromWire(resp.Err), ErrVersionGated) {
		t.Fatalf("a forwarded version-2 command on a version-1 cluster: %+v", resp.Err)
	}
	if s.ClusterVersion() != 1 || s.Allows(FeatureStatsBatch) || s.Speaks(FeatureStatsBatch) {
		t.Fatalf("a lone node held at 1: version %d, allows %v, speaks %v", s.ClusterVersion(), s.Allows(FeatureStatsBatch), s.Speaks(FeatureStatsBatch))
	}
}

// TestLoneNodeCommitsItsVersion: a node of its own commits the highest version it
// speaks at once, and says so in its member record.
func TestLoneNodeCommitsItsVersion(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), NodeID: "solo"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	waitReady(t, s)
	eventually(t, "version 2 committed", func() error {
		if v := s.ClusterVersion(); v != VersionMax {
			return fmt.Errorf("version %d", v)
		}
		return nil
	})
	if m, _ := s.Member("solo"); m.MinVersion != VersionMin || m.MaxVersion != VersionMax || !s.Allows(FeatureStatsBatch) {
		t.Fatalf("member record %+v, allows stats_batch %v", m, s.Allows(FeatureStatsBatch))
	}
	if _, err := Open(Options{Dir: t.TempDir(), NodeID: "x", Cluster: Cluster{VersionMax: VersionMax + 1}}); err == nil {
		t.Fatal("a node offering a version its binary does not speak was opened")
	}
}

// waitingFor waits until the controller among ss says it waits because of every one of
// reasons, with the cluster still at version 1.
func waitingFor(t *testing.T, ss []*Store, reasons ...string) {
	t.Helper()
	eventually(t, "the controller waiting for "+strings.Join(reasons, ", "), func() error {
		l := leaderOf(ss...)
		if l == nil {
			return errors.New("no controller")
		}
		l.ctl.mu.Lock()
		w := l.ctl.waiting
		l.ctl.mu.Unlock()
		for _, r := range reasons {
			if !strings.Contains(w, r) {
				return fmt.Errorf("waiting %q", w)
			}
		}
		for _, s := range ss {
			if v := s.ClusterVersion(); v != 1 {
				return fmt.Errorf("%s holds version %d while waiting", s.NodeID(), v)
			}
		}
		return nil
	})
}

// TestRollingUpgradeCommitsOnceEveryMemberSpeaks: three nodes of the previous release
// (held at version 1) are upgraded one by one; one is rolled back before the commit and
// runs on; version 2 is committed only once the last speaks it; a node that cannot
// speak it is then refused a join, and a member restarted with such a binary halts,
// both naming the versions.
//
// The upgraded binary is this one held at version 2 (the release that brought version
// 2); n6, added at the end, offers every version this binary speaks.
func TestRollingUpgradeCommitsOnceEveryMemberSpeaks(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var peers []Peer
	for i := range dirs {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), Addr: raft.ServerAddress(fmt.Sprintf("addr%d", i+1))})
	}
	ss := make([]*Store, 3)
	for i, p := range peers {
		s, err := net.open(dirs[i], p.ID, p.Addr, Cluster{Peers: peers, VersionMax: 1})
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = s
	}
	waitReady(t, ss...)
	if _, err := ss[0].CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 3}}); err != nil {
		t.Fatal(err)
	}
	waitingFor(t, ss, "version 2 waits for members speaking at most 1", "n1", "n2", "n3")

	restart := func(i, versionMax int) {
		t.Helper()
		net.close(ss[i])
		s, err := net.open(dirs[i], peers[i].ID, peers[i].Addr, Cluster{VersionMax: versionMax})
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = s
		waitReady(t, s)
	}
	// n1 and n2 upgraded: n3 holds the cluster at 1.
	restart(0, 2)
	restart(1, 2)
	waitingFor(t, ss, "n3 (alive, speaks 1)")
	// n2 rolled back before the commit: it runs, ready, with its metadata.
	restart(1, 1)
	waitingFor(t, ss, "n2 (alive, speaks 1)", "n3 (alive, speaks 1)")
	if _, ok := ss[1].Topic("orders"); !ok || !ss[1].Ready() {
		t.Fatalf("the rolled-back node is not serving: ready %v", ss[1].Ready())
	}
	// Upgraded again, with n3: version 2 on every node.
	restart(1, 2)
	restart(2, 2)
	eventually(t, "version 2 committed on every node", func() error {
		for _, s := range ss {
			if v := s.ClusterVersion(); v != 2 || !s.Allows(FeatureStatsBatch) {
				return fmt.Errorf("%s holds version %d", s.NodeID(), v)
			}
		}
		return nil
	})
	for _, s := range ss {
		if m, _ := ss[0].Member(s.NodeID()); m.MaxVersion != 2 {
			t.Fatalf("member record of %s: %+v", s.NodeID(), m)
		}
	}

	// A new node whose binary speaks only 1 is refused, naming both versions.
	j, err := net.open(t.TempDir(), "n4", "addr4", Cluster{Join: ss[0].addr, VersionMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	err = j.WaitReady(ctx)
	cancel()
	if !errors.Is(err, ErrVersionUnsupported) || !strings.Contains(err.Error(), "speaks cluster versions 1 and the cluster runs version 2") {
		t.Fatalf("a node speaking only 1 joining a version-2 cluster: %v", err)
	}
	net.close(j)
	if _, ok := ss[0].Member("n4"); ok {
		t.Fatal("the refused node has a member record")
	}

	// Added by address (POST /v1/cluster/members): the controller reads the node's
	// versions from its identity, refuses one that speaks only 1, admits one that speaks 2.
	held, err := net.open(t.TempDir(), "n5", "addr5", Cluster{WaitForAdd: true, VersionMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ss[1].AddMember(context.Background(), "n5", "addr5"); !errors.Is(err, ErrVersionUnsupported) || !strings.Contains(err.Error(), "node n5 speaks cluster versions 1 and the cluster runs version 2") {
		t.Fatalf("adding a node speaking only 1 to a version-2 cluster: %v", err)
	}
	net.close(held)
	fresh, err := net.open(t.TempDir(), "n6", "addr6", Cluster{WaitForAdd: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ss[1].AddMember(context.Background(), "n6", "addr6"); err != nil {
		t.Fatalf("adding a node speaking 2 to a version-2 cluster: %v", err)
	}
	waitReady(t, fresh)
	net.close(fresh)

	// A member restarted with a binary that speaks only 1 halts at the commit.
	net.close(ss[2])
	s, err := net.open(dirs[2], "n3", "addr3", Cluster{VersionMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	ss[2] = s
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	err = s.WaitReady(ctx)
	cancel()
	if !errors.Is(err, ErrHalted) || !errors.Is(err, ErrVersionUnsupported) || !strings.Contains(err.Error(), "this node speaks 1") {
		t.Fatalf("a member speaking only 1 restarted on a version-2 cluster: %v", err)
	}
}

// TestDocsNameTheVersionsAndFeatures: the operator's and the internals' pages say which
// cluster versions this binary speaks, and the internals' table lists every gated
// feature in a row of its version: a rolling upgrade is planned from them.
func TestDocsNameTheVersionsAndFeatures(t *testing.T) {
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	flat := func(s string) string { return strings.Join(strings.Fields(s), " ") } // lines wrap anywhere
	upgrades, internals := read("operating/upgrades.md"), read("internals/control-plane.md")
	for _, want := range []string{
		fmt.Sprintf("This release speaks %d to %d", VersionMin, VersionMax),
		fmt.Sprintf("(`cluster versions %d to %d`)", VersionMin, VersionMax),
	} {
		if !strings.Contains(flat(upgrades), want) {
			t.Errorf("docs/operating/upgrades.md does not say %q", want)
		}
	}
	if want := fmt.Sprintf("`VersionMax` (today %d to %d)", VersionMin, VersionMax); !strings.Contains(flat(internals), want) {
		t.Errorf("docs/internals/control-plane.md does not say %q", want)
	}
	for _, f := range []Feature{FeatureStatsBatch, FeatureReplicaSnapshots, FeaturePartitionCommands, FeatureMoves,
		FeatureGroupOnData, FeatureDeleteFence, FeatureLeaderLease, FeatureRemoteUpdate, FeatureOneAlter} {
		row := fmt.Sprintf("| %d | ", f.Since)
		found := false
		for _, line := range strings.Split(internals, "\n") {
			if strings.HasPrefix(line, row) && strings.Contains(strings.SplitN(line[len(row):], "|", 2)[0], "`"+f.Name+"`") {
				found = true
			}
		}
		if !found {
			t.Errorf("the cluster versions' table of docs/internals/control-plane.md names %s in no row of version %d", f.Name, f.Since)
		}
	}
}
