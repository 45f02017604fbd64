package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/auth"
)

// fsmState is everything the state machine replicates, read out of its maps for a deep
// comparison.
type fsmState struct {
	Topics    map[string]Topic
	Users     map[string]auth.User
	Seeded    bool
	NextUser  uint64
	ClusterID string
	Members   map[string]Member
	Remotes   map[uint64]RemoteChild
	Moves     map[uint64]Move
	Removed   map[string]bool
	Version   int
	Applied   uint64
}

// fsmFields sorts the fields of fsm: replicated ones must be in fsmState (and so in
// snapshots), local ones are this node's own. A field added to fsm fails
// TestStateOfKnowsEveryField until it is put in one of the two.
var fsmFields = map[string]bool{
	"topics": true, "users": true, "seeded": true, "nextUser": true, "clusterID": true, "members": true,
	"remotes": true, "moves": true, "removed": true, "version": true, "applied": true,
	"mu": false, "maxVersion": false, "halted": false, "onChange": false, "beforeApply": false,
	"self": false, "selfSince": false, "onSelf": false, // membersince.go: this disk's own
}

func TestStateOfKnowsEveryField(t *testing.T) {
	ty := reflect.TypeOf(fsm{})
	for i := range ty.NumField() {
		if _, ok := fsmFields[ty.Field(i).Name]; !ok {
			t.Errorf("fsm.%s is neither replicated nor local in fsmFields: add it to fsmState (and to the snapshot) or mark it local", ty.Field(i).Name)
		}
	}
	if n := len(fsmFields); n != ty.NumField() {
		t.Errorf("fsmFields names %d fields, fsm has %d", n, ty.NumField())
	}
}

// stateOf copies the replicated state out of f, with empty maps as nil and schemas in
// one JSON spelling (a round trip through encoding/json may escape them differently).
func stateOf(f *fsm) fsmState {
	f.mu.RLock()
	defer f.mu.RUnlock()
	st := fsmState{Seeded: f.seeded, NextUser: f.nextUser, ClusterID: f.clusterID, Version: f.version, Applied: f.applied.Load()}
	st.Topics = cloneMap(f.topics)
	for n, tp := range st.Topics {
		tp.Schema = normal([]Topic{tp})[0].Schema
		st.Topics[n] = tp
	}
	st.Users, st.Members, st.Remotes, st.Moves, st.Removed = cloneMap(f.users), cloneMap(f.members), cloneMap(f.remotes), cloneMap(f.moves), cloneMap(f.removed)
	// Deep: a later command that changed a slice of the state in place would change
	// the copy too, and a comparison with it would see nothing.
	return deepCopy(reflect.ValueOf(st)).Interface().(fsmState)
}

// deepCopy copies v with every slice, map and pointer in it, keeping nil as nil.
func deepCopy(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Slice:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		out := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			out.Index(i).Set(deepCopy(v.Index(i)))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		out := reflect.MakeMapWithSize(v.Type(), v.Len())
		for _, k := range v.MapKeys() {
			out.SetMapIndex(k, deepCopy(v.MapIndex(k)))
		}
		return out
	case reflect.Pointer:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		out := reflect.New(v.Type().Elem())
		out.Elem().Set(deepCopy(v.Elem()))
		return out
	case reflect.Struct:
		out := reflect.New(v.Type()).Elem()
		for i := range v.NumField() {
			out.Field(i).Set(deepCopy(v.Field(i)))
		}
		return out
	}
	return v
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	if len(m) == 0 {
		return nil
	}
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func sameState(t *testing.T, what string, want, got fsmState) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		w, _ := json.MarshalIndent(want, "", " ")
		g, _ := json.MarshalIndent(got, "", " ")
		t.Fatalf("%s: the state differs\nwant %s\ngot  %s", what, w, g)
	}
}

func snapshotRestore(t *testing.T, f *fsm) *fsm {
	t.Helper()
	return snapshotRestoreAs(t, f, "")
}

// snapshotRestoreAs is snapshotRestore into the state machine of the node whose Raft
// server id is self (what it keeps for itself, membersince.go, depends on it).
func snapshotRestoreAs(t *testing.T, f *fsm, self string) *fsm {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM()
	g.self = self
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	return g
}

func applyAt(t *testing.T, f *fsm, index uint64, c command) applyResult {
	t.Helper()
	b, err := encodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	return f.Apply(&raft.Log{Index: index, Data: b}).(applyResult)
}

func mv(op string, o MoveOp) command { return command{Op: op, MoveOp: &o} }

func fullMember(id string, st MemberStatus) *Member {
	return &Member{ID: id, ServerID: id + "/d", ClusterAddr: id + ":1", HTTPAddr: id + ":2", Status: st, Voter: id < "n4", MinVersion: 1, MaxVersion: 3}
}

func ptr[T any](v T) *T { return &v }

// builder writes a history, applying each command as it goes (at index = its position
// from 1, as Raft would) so later commands can name what earlier ones made.
type builder struct {
	t    *testing.T
	f    *fsm
	cmds []command
}

func (b *builder) next() uint64 { return uint64(len(b.cmds) + 1) }

// add applies c and keeps it; it must apply without error.
func (b *builder) add(c command) applyResult {
	b.t.Helper()
	r := applyAt(b.t, b.f, b.next(), c)
	b.cmds = append(b.cmds, c)
	if r.err != nil {
		b.t.Fatalf("history step %d %s: %v", len(b.cmds), c.Op, r.err)
	}
	return r
}

func (b *builder) placement(topic string, p int) Placement {
	tp, ok := b.f.topic(topic)
	if !ok {
		b.t.Fatalf("no topic %s", topic)
	}
	return tp.Placement[p]
}

// spare returns a member holding no replica or learner of the partition.
func (b *builder) spare(pl Placement) string {
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		if !slices.Contains(pl.Replicas, id) && !slices.Contains(pl.Learners, id) {
			return id
		}
	}
	b.t.Fatalf("no spare member for %+v", pl)
	return ""
}

// history returns a log that uses every command and leaves every field of the state
// set: topics placed with learners, forced and grouped partitions, a preferred leader
// set at a time, a child with its attachment, users with grants and a seeded admin,
// members of every status and a removed one, remote children with moved cursors and
// counted expiries, paused and resealed, moves of every status with progress, the
// cluster id and version. It returns the commands and the state they leave.
func history(t *testing.T) ([]command, *fsm) {
	b := &builder{t: t, f: newFSM()}
	big := int64(10 * 3600 * 1000)
	b.add(command{Op: "create_topic", Topic: &Topic{Name: "legacy", CreatedAtMs: 5, TopicConfig: TopicConfig{Partitions: 2}}})
	b.add(command{Op: "create_user", User: &auth.User{Name: "bob", Hash: []byte("h1")}, Rules: cmdRules})
	b.add(command{Op: "restore_admin", User: &auth.User{Name: "root", Hash: []byte("h0")}, Rules: cmdRules})
	admin := b.add(command{Op: "create_user", User: &auth.User{Name: "admin", Grants: []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}}, Seed: true, Rules: cmdRules}).user
	b.add(command{Op: "set_grants", Name: "bob", Grants: []auth.Grant{{Action: auth.Produce, Topics: []string{"p", "c*"}}}, Rules: cmdRules})
	b.add(command{Op: "set_grants", Name: "root", Grants: []auth.Grant{}, Rules: cmdRules})
	b.add(command{Op: "set_password", Name: "bob", Hash: []byte("h2")})
	b.add(command{Op: "create_user", User: &auth.User{Name: "carol"}, Rules: cmdRules})
	b.add(command{Op: "delete_user", Name: "carol", Rules: cmdRules})
	b.add(command{Op: "init_cluster", ClusterID: "cid", Members: []Member{*fullMember("n1", StatusAlive)}})
	for _, id := range []string{"n2", "n3", "n4"} {
		b.add(command{Op: "set_member", Member: fullMember(id, StatusAlive)})
	}
	b.add(command{Op: "set_cluster_version", Version: 2})
	b.add(command{Op: "set_cluster_version", Version: 3})
	p := b.add(command{Op: "create_topic", Topic: &Topic{Name: "p", OwnerID: admin.ID, CreatedAtMs: 6,
		TopicConfig: TopicConfig{Partitions: 2, RetentionMs: big, ReplicationFactor: 3, Schema: json.RawMessage(`{"type":"object","title":"a & b"}`)}}}).topic
	b.add(command{Op: "create_topic", Topic: &Topic{Name: "c", Owner: "bob", TopicConfig: TopicConfig{Partitions: 1, Parent: "p", ParentIncarnation: p.Incarnation, FanoutDelayMs: 5000}}, Start: []uint64{5, 6}})
	tt := b.add(command{Op: "create_topic", Topic: &Topic{Name: "t", TopicConfig: TopicConfig{Partitions: 4, ReplicationFactor: 2}}}).topic
	ft := b.add(command{Op: "create_topic", Topic: &Topic{Name: "f", TopicConfig: TopicConfig{Partitions: 2, ReplicationFactor: 3}}}).topic
	k := b.add(command{Op: "create_topic", Topic: &Topic{Name: "k", TopicConfig: TopicConfig{Partitions: 1}}}).topic
	b.add(command{Op: "attach_child", Name: "p", ParentInc: p.Incarnation, Child: "k", Delay: 0, Start: []uint64{1, 2}})
	b.add(command{Op: "detach_child", Name: "p", Child: "k"})
	b.add(command{Op: "alter_topic", Name: "t", Alter: &Alter{Incarnation: tt.Incarnation, VisibilityMs: ptr(int64(9000)), MaxInFlight: ptr(int32(7)), MaxAckedAhead: ptr(int32(3))}})
	b.add(command{Op: "alter_topic", Name: "p", Alter: &Alter{RetentionMs: ptr(big + 1)}})
	b.add(command{Op: "delete_topic", Name: "k", Topic: &Topic{Incarnation: k.Incarnation}})
	b.add(command{Op: "set_replication_factor", Name: "t", Topic: &Topic{Incarnation: tt.Incarnation}, MoveOp: &MoveOp{RF: 3, NowMs: 10}})

	// Moves of t, one per status, each partition from its first replica to a spare.
	startOn := func(p int) Move {
		pl := b.placement("t", p)
		return b.add(mv("start_move", MoveOp{Move: &Move{Topic: "t", Incarnation: tt.Incarnation, Partition: int32(p), From: pl.Replicas[0], To: b.spare(pl), Cause: CauseRF}, NowMs: 11})).move
	}
	copying := startOn(0)
	b.add(mv("move_progress", MoveOp{ID: copying.ID, Progress: 0.25, Lag: 40, NowMs: 12}))
	switching := startOn(1)
	b.add(mv("switch_move", MoveOp{ID: switching.ID, NowMs: 13}))
	removing := startOn(2)
	b.add(mv("switch_move", MoveOp{ID: removing.ID, NowMs: 13}))
	b.add(mv("move_status", MoveOp{ID: removing.ID, Status: MoveRemoving, NowMs: 14}))
	done := startOn(3)
	b.add(mv("switch_move", MoveOp{ID: done.ID, NowMs: 13}))
	b.add(mv("move_status", MoveOp{ID: done.ID, Status: MoveDone, NowMs: 15}))
	cancelled := startOn(3)
	b.add(mv("move_status", MoveOp{ID: cancelled.ID, Status: MoveCancelled, Reason: "asked", NowMs: 16}))
	failed := startOn(3)
	b.add(mv("move_status", MoveOp{ID: failed.ID, Status: MoveFailed, Reason: "target died", NowMs: 17}))
	// A remove-only move (switching from its start), and one that adds only.
	pl := b.placement("f", 0)
	b.add(mv("start_move", MoveOp{Move: &Move{Topic: "f", Incarnation: ft.Incarnation, Partition: 0, From: pl.Replicas[2]}, NowMs: 18}))
	pl = b.placement("f", 1)
	b.add(mv("start_move", MoveOp{Move: &Move{Topic: "f", Incarnation: ft.Incarnation, Partition: 1, To: b.spare(pl)}, NowMs: 18}))
	// A forced takeover of p's partition 1 and a preferred leader of p's partition 0.
	pl = b.placement("p", 1)
	b.add(mv("force_leader", MoveOp{Move: &Move{Topic: "p", Incarnation: p.Incarnation, Partition: 1}, Node: pl.Replicas[1], NowMs: 19}))
	pl = b.placement("p", 0)
	b.add(mv("set_leader", MoveOp{Move: &Move{Topic: "p", Incarnation: p.Incarnation, Partition: 0}, Node: pl.Replicas[2], NowMs: 20}))

	// Members: a decommissioned one removed, one decommissioning, one joining, one
	// suspect, one dead.
	for _, id := range []string{"n5", "n6", "n7"} {
		b.add(command{Op: "set_member", Member: fullMember(id, StatusJoining)})
	}
	b.add(command{Op: "set_status", Name: "n5", ServerID: "n5/d", Status: StatusDecommissioning})
	b.add(command{Op: "remove_member", Name: "n5", ServerID: "n5/d", MoveOp: &MoveOp{NowMs: 21}})
	b.add(command{Op: "set_status", Name: "n6", ServerID: "n6/d", Status: StatusDecommissioning})
	b.add(command{Op: "set_status", Name: "n4", ServerID: "n4/d", Status: StatusSuspect})
	b.add(command{Op: "set_member", Member: fullMember("n8", StatusDead)})

	// Remote children of p: one with moved cursors, paused and resealed; one detached.
	rc := RemoteChild{Parent: "p", ParentIncarnation: p.Incarnation, URL: "https://dr:1", Topic: "p", Username: "copier", Sealed: []byte("s1"),
		CAPEM: "pem", RemoteIncarnation: "77", RemoteClusterID: "rc", RemotePartitions: 3, Start: "earliest", OwnerID: admin.ID, CreatedAtMs: 22, Cursors: []uint64{0, 4}}
	r := b.add(command{Op: "attach_remote", Remote: &rc}).remote
	b.add(command{Op: "move_remote_cursor", RemoteOp: &RemoteOp{ID: r.ID, Partition: 1, From: 4, To: 10, Expired: 2}})
	b.add(command{Op: "pause_remote", RemoteOp: &RemoteOp{ID: r.ID, Paused: true}})
	b.add(command{Op: "reseal_remote", RemoteOp: &RemoteOp{ID: r.ID, Sealed: []byte("s2")}})
	b.add(command{Op: "update_remote", RemoteOp: &RemoteOp{ID: r.ID, URL: "https://dr-moved:1", Username: "copier2", CAPEM: "pem2",
		Sealed: []byte("s4"), PrevSealed: []byte("s2"), OwnerID: 3}})
	rc2 := rc
	rc2.URL = "https://other:1"
	r2 := b.add(command{Op: "attach_remote", Remote: &rc2}).remote
	b.add(command{Op: "detach_remote", Name: "p", RemoteOp: &RemoteOp{ID: r2.ID}})
	rc3 := rc
	rc3.URL, rc3.Sealed, rc3.CAPEM = "http://third:1", []byte("s3"), ""
	b.add(command{Op: "attach_remote", Remote: &rc3})

	// Version 4: an alter with a replication factor in one command.
	b.add(command{Op: "set_cluster_version", Version: 4})
	b.add(command{Op: "alter_with_replication_factor", Name: "f", Alter: &Alter{Incarnation: ft.Incarnation, VisibilityMs: ptr(int64(7000))}, MoveOp: &MoveOp{RF: 2, NowMs: 23}})
	return b.cmds, b.f
}

// checkOpsCovered fails unless cmds use every op that command.check knows (read from
// fsm.go, so an op added there must be added to the history too).
func checkOpsCovered(t *testing.T, cmds []command) {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "fsm.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		fd, ok := n.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "check" || fd.Recv == nil {
			return true
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if cc, ok := n.(*ast.CaseClause); ok {
				for _, e := range cc.List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						op, _ := strconv.Unquote(lit.Value)
						known[op] = true
					}
				}
			}
			return true
		})
		return false
	})
	if len(known) < 20 {
		t.Fatalf("found only %d ops in command.check", len(known))
	}
	used := map[string]bool{}
	for _, c := range cmds {
		used[c.Op] = true
	}
	for op := range known {
		if !used[op] {
			t.Errorf("the history never uses %s", op)
		}
	}
}

// TestSnapshotKeepsEveryField: a state using every field, snapshotted and restored
// into a fresh state machine, is the same state, deeply; so is every state on the way.
// A field Snapshot or Restore forgot would leave a node restored from a snapshot
// different from one that replayed the log.
func TestSnapshotKeepsEveryField(t *testing.T) {
	cmds, full := history(t)
	checkOpsCovered(t, cmds)
	st := stateOf(full)
	// Every field is set (a zero one would compare equal however it was restored).
	v := reflect.ValueOf(st)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("the history leaves fsmState.%s unset", v.Type().Field(i).Name)
		}
	}
	f := newFSM()
	for i, c := range cmds {
		applyAt(t, f, uint64(i+1), c)
		sameState(t, "restored after step "+strconv.Itoa(i+1)+" "+c.Op, stateOf(f), stateOf(snapshotRestore(t, f)))
	}
	sameState(t, "replayed", st, stateOf(f))
}

// TestEveryCommandAppliedTwice: each command of the history applied a second time
// right after the first (a write sent again: the forwarder's or the caller's retry) and
// applied again on a state restored from a snapshot taken just after it (a replay)
// leaves the state the single application left, whatever it answers.
func TestEveryCommandAppliedTwice(t *testing.T) {
	cmds, _ := history(t)
	for i, c := range cmds {
		index := uint64(i + 1)
		once := newFSM()
		for j, d := range cmds[:i+1] {
			applyAt(t, once, uint64(j+1), d)
		}
		want := stateOf(once)
		replayed := snapshotRestore(t, once)
		applyAt(t, replayed, index, c)
		sameState(t, "step "+strconv.Itoa(int(index))+" "+c.Op+" replayed on its own snapshot", want, stateOf(replayed))

		r := applyAt(t, once, index+1, c)
		got := stateOf(once)
		got.Applied = want.Applied
		sameState(t, "step "+strconv.Itoa(int(index))+" "+c.Op+" applied again ("+errString(r.err)+")", want, got)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// TestHaltKeepsTheStateBeforeTheEntry: an entry of an op this binary does not know, at
// any point of the history, halts the state machine with the state the entry before it
// left (nothing of it or after it applied), refuses snapshots, and a node that
// restarts from a snapshot taken before it and replays the log halts at the same entry
// with the same state. A node that speaks cluster version 2 halts the same way at the
// commit of version 3.
func TestHaltKeepsTheStateBeforeTheEntry(t *testing.T) {
	cmds, _ := history(t)
	future := frame([]byte(`{"op":"from_the_future","name":"p"}`))
	entries := func(k int) []*raft.Log { // the history with the unknown entry at index k
		var out []*raft.Log
		for i, c := range cmds {
			if i+1 == k {
				out = append(out, &raft.Log{Index: uint64(k), Data: future})
			}
			b, err := encodeCommand(c)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, &raft.Log{Index: uint64(len(out) + 1), Data: b})
		}
		return out
	}
	for k := 1; k <= len(cmds); k++ {
		before := newFSM()
		for i, c := range cmds[:k-1] {
			applyAt(t, before, uint64(i+1), c)
		}
		want := stateOf(before)
		var snap *fsm // restored from a snapshot taken at index k/2, before the entry
		f := newFSM()
		for _, l := range entries(k) {
			f.Apply(l)
			if l.Index == uint64(k/2) {
				snap = snapshotRestore(t, f)
			}
		}
		halt := "Raft log entry " + strconv.Itoa(k) + " is"
		if err := f.haltedErr(); !errors.Is(err, ErrHalted) || !strings.Contains(err.Error(), halt) {
			t.Fatalf("unknown op at %d: halted with %v", k, err)
		}
		sameState(t, "halted at "+strconv.Itoa(k), want, stateOf(f))
		if _, err := f.Snapshot(); !errors.Is(err, ErrHalted) {
			t.Fatalf("halted at %d: snapshot %v", k, err)
		}
		if snap == nil {
			snap = newFSM()
		}
		for _, l := range entries(k)[snap.applied.Load():] {
			snap.Apply(l)
		}
		if err := snap.haltedErr(); !errors.Is(err, ErrHalted) || !strings.Contains(err.Error(), halt) {
			t.Fatalf("restarted, unknown op at %d: halted with %v", k, err)
		}
		sameState(t, "restarted and halted at "+strconv.Itoa(k), want, stateOf(snap))
	}

	old := newFSM()
	old.maxVersion = 2
	at := 0
	for i, c := range cmds {
		r := applyAt(t, old, uint64(i+1), c)
		if c.Op == "set_cluster_version" && c.Version == 3 {
			at = i + 1
			if !errors.Is(r.err, ErrVersionUnsupported) {
				t.Fatalf("a node speaking 2 applied version 3: %v", r.err)
			}
		}
	}
	before := newFSM()
	for i, c := range cmds[:at-1] {
		applyAt(t, before, uint64(i+1), c)
	}
	sameState(t, "a node speaking 2 halted at version 3", stateOf(before), stateOf(old))
}

// TestHaltAfterASnapshotSurvivesRestart: a node that took a snapshot, then met a
// command from a newer version, restarts from the snapshot and halts at the same entry
// with what came before it, and nothing after it.
func TestHaltAfterASnapshotSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if _, err := s.CreateTopic(Topic{Name: "before", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTopic(Topic{Name: "between", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	fut := s.raft.Apply(frame([]byte(`{"op":"from_the_future"}`)), 5*time.Second)
	if err := fut.Error(); err != nil {
		t.Fatal(err)
	}
	halt := fut.Index()
	if err := s.raft.Apply(frame([]byte(`{"op":"create_topic","topic":{"name":"after","partitions":1}}`)), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	applied := s.AppliedIndex()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := "Raft log entry " + strconv.FormatUint(halt, 10) + " is"
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := s.fsm.haltedErr(); err != nil {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("halted at another entry: %v, want %q", err, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted node did not halt")
		}
		time.Sleep(10 * time.Millisecond) // polls the condition
	}
	for name, exists := range map[string]bool{"before": true, "between": true, "after": false} {
		if _, ok := s.Topic(name); ok != exists {
			t.Fatalf("topic %s exists %v after the restart, want %v", name, ok, exists)
		}
	}
	if got := s.AppliedIndex(); got != applied || got != halt-1 {
		t.Fatalf("applied index %d after the restart, want %d (the entry before the halt)", got, halt-1)
	}
}

// TestCommandsOfAnOldIncarnationLeaveTheNewOneAlone: every command proposed for a
// topic's incarnation and applied after the topic was deleted and created again
// (under the same name, a new incarnation) leaves the new incarnation, and the rest of
// the state, as they were.
func TestCommandsOfAnOldIncarnationLeaveTheNewOneAlone(t *testing.T) {
	cmds, f := history(t)
	index := uint64(len(cmds))
	old := map[string]Topic{}
	for _, name := range []string{"t", "p", "f"} {
		tp, _ := f.topic(name)
		old[name] = tp
		index++
		if r := applyAt(t, f, index, command{Op: "delete_topic", Name: name, Topic: &Topic{Incarnation: tp.Incarnation}}); r.err != nil {
			t.Fatal(r.err)
		}
		index++
		if r := applyAt(t, f, index, command{Op: "create_topic", Topic: &Topic{Name: name, TopicConfig: TopicConfig{Partitions: tp.Partitions, RetentionMs: tp.RetentionMs, ReplicationFactor: 2}}}); r.err != nil {
			t.Fatal(r.err)
		}
	}
	var stale []command
	for _, name := range []string{"t", "p", "f"} {
		o := old[name]
		for p := range o.Placement {
			part := func() *Move { return &Move{Topic: name, Incarnation: o.Incarnation, Partition: int32(p)} }
			nw, _ := f.topic(name)
			npl := nw.Placement[p]
			for _, to := range []string{"n1", "n2", "n3", "n4"} {
				for _, from := range append([]string{""}, npl.Replicas...) {
					m := part()
					m.From, m.To = from, to
					if from != to {
						stale = append(stale, mv("start_move", MoveOp{Move: m, NowMs: 30}))
					}
				}
				if len(npl.Replicas) > 1 {
					m := part()
					m.From = npl.Replicas[0]
					stale = append(stale, mv("start_move", MoveOp{Move: m, NowMs: 30}))
				}
				stale = append(stale,
					mv("force_leader", MoveOp{Move: part(), Node: to, NowMs: 30}),
					mv("set_leader", MoveOp{Move: part(), Node: to, NowMs: 30}))
			}

		}
		stale = append(stale,
			command{Op: "set_replication_factor", Name: name, Topic: &Topic{Incarnation: o.Incarnation}, MoveOp: &MoveOp{RF: 1, NowMs: 30}},
			command{Op: "set_replication_factor", Name: name, Topic: &Topic{Incarnation: o.Incarnation}, MoveOp: &MoveOp{RF: 3, NowMs: 30}},
			command{Op: "alter_topic", Name: name, Alter: &Alter{Incarnation: o.Incarnation, RetentionMs: ptr(int64(1)), VisibilityMs: ptr(int64(1))}},
			command{Op: "delete_topic", Name: name, Topic: &Topic{Incarnation: o.Incarnation}},
			command{Op: "attach_remote", Remote: &RemoteChild{Parent: name, ParentIncarnation: o.Incarnation, URL: "http://x", Topic: "y", Cursors: make([]uint64, o.Partitions)}},
			command{Op: "attach_child", Name: name, ParentInc: o.Incarnation, Child: "c", Start: make([]uint64, o.Partitions)},
			command{Op: "create_topic", Topic: &Topic{Name: "new-child-of-" + name, TopicConfig: TopicConfig{Partitions: 1, Parent: name, ParentIncarnation: o.Incarnation}}, Start: make([]uint64, o.Partitions)},
		)
	}
	for _, m := range f.moveList() {
		for _, st := range []string{MoveRemoving, MoveDone, MoveCancelled, MoveFailed} {
			stale = append(stale, mv("move_status", MoveOp{ID: m.ID, Status: st, NowMs: 30}))
		}
		stale = append(stale, mv("switch_move", MoveOp{ID: m.ID, NowMs: 30}), mv("move_progress", MoveOp{ID: m.ID, Progress: 0.5, Lag: 1, NowMs: 30}))
	}
	for _, c := range stale {
		if err := c.check(); err != nil {
			t.Fatalf("a stale command the store would not propose: %+v: %v", c, err)
		}
		want := stateOf(f)
		index++
		r := applyAt(t, f, index, c)
		got := stateOf(f)
		got.Applied = want.Applied
		js, _ := json.Marshal(c)
		// move_status of an old move (failed when its topic was deleted) may only fail it
		// again; nothing else of the state changes.
		sameState(t, string(js)+" ("+errString(r.err)+")", want, got)
	}
}

// TestSnapshotIsNotChangedByLaterCommands: hashicorp/raft persists a snapshot on its
// own goroutine while the state machine goes on applying, so the snapshot must share
// nothing that a later command changes in place. At every step of the history, the
// snapshot taken then and persisted after the rest applied holds exactly the state of
// that step.
func TestSnapshotIsNotChangedByLaterCommands(t *testing.T) {
	cmds, _ := history(t)
	for k := range cmds {
		f := newFSM()
		for i, c := range cmds[:k+1] {
			applyAt(t, f, uint64(i+1), c)
		}
		// As bytes now: stateOf copies the maps, not the slices in their values.
		want, err := json.Marshal(stateOf(f))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range cmds[k+1:] {
			applyAt(t, f, uint64(k+2+i), c)
		}
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			t.Fatal(err)
		}
		g := newFSM()
		if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
			t.Fatal(err)
		}
		if got, _ := json.Marshal(stateOf(g)); !bytes.Equal(want, got) {
			t.Fatalf("the snapshot of step %d %s, persisted after the rest applied, differs:\nwant %s\ngot  %s", k+1, cmds[k].Op, want, got)
		}
	}
}
