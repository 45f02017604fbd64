package meta

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/auth"
)

func mustOpen(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTopicsSurviveRestartAndIncarnationsDiffer(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	a, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 3}})
	if err != nil || a.Incarnation == 0 {
		t.Fatalf("create: %+v %v", a, err)
	}
	if _, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 1}}); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	v := int64(5000)
	if got, err := s.AlterTopic("orders", Alter{VisibilityMs: &v}); err != nil || got.VisibilityMs != 5000 || got.Partitions != 3 {
		t.Fatalf("alter: %+v %v", got, err)
	}
	if _, _, err := s.DeleteTopic("orders", a.Incarnation+1); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("delete of another incarnation: %v", err)
	}
	if _, _, err := s.DeleteTopic("orders", 0); err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 1}})
	if err != nil || b.Incarnation <= a.Incarnation {
		t.Fatalf("recreate: %+v %v (first incarnation %d)", b, err, a.Incarnation)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, dir)
	defer s.Close()
	got, ok := s.Topic("orders")
	if !ok || got.Incarnation != b.Incarnation || got.Partitions != 1 {
		t.Fatalf("after restart: %+v %v, want incarnation %d", got, ok, b.Incarnation)
	}
	if n := len(s.Topics()); n != 1 {
		t.Fatalf("%d topics after restart", n)
	}
}

func TestSnapshotRestore(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s.CreateTopic(Topic{Name: n, TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.DeleteTopic("b", 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, dir)
	defer s.Close()
	ts := s.Topics()
	if len(ts) != 2 || ts[0].Name != "a" || ts[1].Name != "c" {
		t.Fatalf("after snapshot + log replay: %+v", ts)
	}
}

func TestUsersAndSeedOnce(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	admin := auth.User{Name: "admin", Hash: []byte("h1"), Grants: []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}}
	if _, err := s.CreateUser(admin, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUser(auth.User{Name: "admin"}, false); !errors.Is(err, ErrUserExists) {
		t.Fatalf("duplicate user: %v", err)
	}
	if _, err := s.SetPassword("admin", []byte("h2")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUser(auth.User{Name: "ops", Hash: []byte("ho"), Grants: admin.Grants}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteUser("admin"); err != nil {
		t.Fatal(err)
	}
	// A restart with the same --admin-password must not bring a deleted admin back.
	if _, err := s.CreateUser(admin, true); !errors.Is(err, ErrUserExists) {
		t.Fatalf("second seed: %v", err)
	}
	if _, err := s.CreateUser(auth.User{Name: "bob", Hash: []byte("hb")}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetGrants("bob", []auth.Grant{{Action: auth.Produce, Topics: []string{"a"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, dir)
	defer s.Close()
	u, ok := s.User("bob")
	if !ok || string(u.Hash) != "hb" || len(u.Grants) != 1 {
		t.Fatalf("bob after restart: %+v %v", u, ok)
	}
	if _, err := s.CreateUser(admin, true); !errors.Is(err, ErrUserExists) {
		t.Fatalf("seed after snapshot restore: %v", err)
	}
	if _, ok := s.User("admin"); ok {
		t.Fatal("deleted admin came back")
	}
}

func TestAttachRules(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	defer s.Close()
	mk := func(name string, retention int64, schema string) {
		t.Helper()
		tp := Topic{Name: name, TopicConfig: TopicConfig{Partitions: 2, RetentionMs: retention}}
		if schema != "" {
			tp.Schema = json.RawMessage(schema)
		}
		if _, err := s.CreateTopic(tp); err != nil {
			t.Fatal(err)
		}
	}
	week := int64(7 * 24 * 3600 * 1000)
	mk("p", week, "")
	mk("c1", week, "")
	mk("c2", week, "")
	mk("short", 2*3600*1000, "")
	mk("typed", week, `{"type":"object"}`)
	start := []uint64{0, 0}
	isConflict := func(err error) bool { var c *ConflictError; return errors.As(err, &c) }
	if _, err := s.AttachChild("p", 0, "c1", 0, start); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AttachChild("p", 0, "c1", 0, start); !isConflict(err) {
		t.Fatalf("second parent: %v", err)
	}
	if _, err := s.AttachChild("c1", 0, "c2", 0, start); !isConflict(err) {
		t.Fatalf("chain under a child: %v", err)
	}
	if _, err := s.AttachChild("c2", 0, "p", 0, start); !isConflict(err) {
		t.Fatalf("a parent as a child: %v", err)
	}
	if _, err := s.AttachChild("short", 0, "c2", 3600*1000+1, start); !isConflict(err) {
		t.Fatalf("delay past parent retention: %v", err)
	}
	if _, err := s.AttachChild("p", 0, "typed", 0, start); !isConflict(err) {
		t.Fatalf("schema mismatch: %v", err)
	}
	if _, err := s.AttachChild("p", 0, "c2", 5000, start); err != nil {
		t.Fatal(err)
	}
	r := int64(3600 * 1000)
	if _, err := s.AlterTopic("p", Alter{RetentionMs: &r}); !isConflict(err) {
		t.Fatalf("retention below delay + 1h: %v", err)
	}
	if _, _, err := s.DetachChild("p", "short"); !errors.Is(err, ErrChildNotFound) {
		t.Fatalf("detach of a non-child: %v", err)
	}
	if _, _, err := s.DetachChild("p", "c1"); err != nil {
		t.Fatal(err)
	}
	// Create-with-parent is all or nothing.
	bad := Topic{Name: "new", TopicConfig: TopicConfig{Partitions: 1, RetentionMs: week, Parent: "c2"}}
	if _, err := s.CreateTopic(bad, 0); !isConflict(err) {
		t.Fatalf("create under a child: %v", err)
	}
	if _, ok := s.Topic("new"); ok {
		t.Fatal("a refused create-with-parent left the topic behind")
	}
	// Deleting the parent detaches its children.
	if _, _, err := s.DeleteTopic("p", 0); err != nil {
		t.Fatal(err)
	}
	if c2, _ := s.Topic("c2"); c2.Parent != "" || c2.AttachID != 0 {
		t.Fatalf("child still linked to a deleted parent: %+v", c2)
	}
}

// TestApplyRefusesDamagedCommands: a command lacking what its op needs, or whose bytes
// fail their checksum, stops the node with a meta: panic instead of being applied (a
// damaged create_topic could otherwise make a nameless topic and drop real ones' data).
func TestApplyRefusesDamagedCommands(t *testing.T) {
	for _, js := range []string{`{"op":"create_topic"}`, `{"op":"alter_topic","name":"a"}`, `{"op":"create_user"}`, `{"op":"create_topic","topic":{"name":"","partitions":1}}`} {
		if msg := applyRecover(newFSM(), 1, frame([]byte(js))); !strings.HasPrefix(msg, "meta: ") {
			t.Errorf("%s: panic %q, want a meta: refusal", js, msg)
		}
	}
	good := frame([]byte(`{"op":"create_topic","topic":{"name":"a","partitions":1}}`))
	good[len(good)-3] ^= 1
	if msg := applyRecover(newFSM(), 1, good); !strings.Contains(msg, "checksum") {
		t.Errorf("a flipped bit: panic %q, want a checksum refusal", msg)
	}
}

// TestLastAdminAndRestore: the store refuses to delete or demote the last user holding
// admin on *, yet replays an older version's log that did so as it applied then; the
// break-glass RestoreAdmin then gives "admin" back its rights, and only then.
func TestLastAdminAndRestore(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	all := []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}
	if _, err := s.CreateUser(auth.User{Name: "admin", Hash: []byte("h1"), Grants: all}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteUser("admin"); !errors.Is(err, ErrLastAdmin) {
		t.Fatalf("deleting the last admin: %v, want ErrLastAdmin", err)
	}
	if _, err := s.SetGrants("admin", []auth.Grant{{Action: auth.Admin, Topics: []string{"a.*"}}}); !errors.Is(err, ErrLastAdmin) {
		t.Fatalf("demoting the last admin: %v, want ErrLastAdmin", err)
	}
	if _, err := s.RestoreAdmin(auth.User{Name: "admin", Hash: []byte("h9")}); !errors.Is(err, ErrUserExists) {
		t.Fatalf("restore while an admin exists: %v, want ErrUserExists", err)
	}
	if u, _ := s.User("admin"); string(u.Hash) != "h1" {
		t.Fatalf("a refused restore changed the hash to %q", u.Hash)
	}
	// An older version's commands carry no rules: they apply as they did then.
	if _, err := s.CreateUser(auth.User{Name: "bob", Hash: []byte("hb")}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.applyUser(command{Op: "set_grants", Name: "admin", Grants: []auth.Grant{}}); err != nil {
		t.Fatalf("an old set_grants demoting the last admin: %v", err)
	}
	if s.HasAdmin() {
		t.Fatal("HasAdmin after the last admin was demoted")
	}
	s.Close()
	s = mustOpen(t, dir)
	defer s.Close()
	if s.HasAdmin() {
		t.Fatal("the replayed log brought an admin back")
	}
	u, err := s.RestoreAdmin(auth.User{Name: "admin", Hash: []byte("h9")})
	if err != nil || u.Name != "admin" || string(u.Hash) != "h9" || !u.IsAdmin() {
		t.Fatalf("restore: %+v %v", u, err)
	}
	if b, _ := s.User("bob"); b.IsAdmin() {
		t.Fatal("the restore touched another user")
	}
	// The state machine refuses on its own too (for changes racing each other).
	f := newFSM()
	f.apply(1, command{Op: "create_user", User: &auth.User{Name: "a", Grants: all}})
	if r := f.apply(2, command{Op: "delete_user", Name: "a", Rules: cmdRules}); !errors.Is(r.err, ErrLastAdmin) {
		t.Fatalf("state machine deleting the last admin: %v", r.err)
	}
	if r := f.apply(3, command{Op: "set_grants", Name: "a", Grants: []auth.Grant{}, Rules: cmdRules}); !errors.Is(r.err, ErrLastAdmin) {
		t.Fatalf("state machine demoting the last admin: %v", r.err)
	}
	// With no user named admin at all, the restore creates one.
	s2 := mustOpen(t, t.TempDir())
	defer s2.Close()
	if _, err := s2.CreateUser(auth.User{Name: "bob", Hash: []byte("hb")}, false); err != nil {
		t.Fatal(err)
	}
	if u, err := s2.RestoreAdmin(auth.User{Name: "admin", Hash: []byte("h9")}); err != nil || !u.IsAdmin() {
		t.Fatalf("restore with no admin user: %+v %v", u, err)
	}
}

// TestUserIDsAndLegacyOwners: every user gets an ID that is never reused (a user created
// under a deleted user's name gets a new one, across restarts and snapshots), and
// topics whose owner an older version stored by name, in its log or its snapshot, get
// that user's ID, or no owner when the user no longer exists.
func TestUserIDsAndLegacyOwners(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	bob, err := s.CreateUser(auth.User{Name: "bob"}, false)
	if err != nil || bob.ID == 0 {
		t.Fatalf("create bob: %+v %v", bob, err)
	}
	// An older version's create_topic names its owner.
	if _, err := s.apply(command{Op: "create_topic", Topic: &Topic{Name: "old", Owner: "bob", TopicConfig: TopicConfig{Partitions: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.apply(command{Op: "create_topic", Topic: &Topic{Name: "orphan", Owner: "gone", TopicConfig: TopicConfig{Partitions: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteUser("bob"); err != nil {
		t.Fatal(err)
	}
	bob2, err := s.CreateUser(auth.User{Name: "bob"}, false)
	if err != nil || bob2.ID == bob.ID || bob2.ID == 0 {
		t.Fatalf("bob created again: %+v %v; want an ID other than %d", bob2, err, bob.ID)
	}
	check := func(when string) {
		t.Helper()
		if o, _ := s.Topic("old"); o.OwnerID != bob.ID || o.Owner != "" {
			t.Errorf("%s: old's owner %d %q, want the first bob's ID %d", when, o.OwnerID, o.Owner, bob.ID)
		}
		if o, _ := s.Topic("orphan"); o.OwnerID != 0 || o.Owner != "" {
			t.Errorf("%s: orphan's owner %d %q, want none", when, o.OwnerID, o.Owner)
		}
		if u, _ := s.User("bob"); u.ID != bob2.ID {
			t.Errorf("%s: bob's ID %d, want %d", when, u.ID, bob2.ID)
		}
	}
	check("applied")
	s.Close()
	s = mustOpen(t, dir)
	check("after the log replayed")
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, dir)
	check("after a snapshot")
	carol, err := s.CreateUser(auth.User{Name: "carol"}, false)
	if err != nil || carol.ID <= bob2.ID {
		t.Fatalf("a user created after the snapshot: %+v %v; want an ID past %d", carol, err, bob2.ID)
	}
	s.Close()

	// A snapshot written before user IDs.
	legacy := `{"topics":[{"name":"a","incarnation":5,"owner":"zed","partitions":1},{"name":"b","incarnation":6,"owner":"amy","partitions":1},{"name":"c","incarnation":7,"owner":"nobody","partitions":1},{"name":"d","incarnation":8,"partitions":1}],
		"users":[{"name":"zed","hash":"AA=="},{"name":"amy","hash":"AA=="}],"seeded":true}`
	f := newFSM()
	if err := f.Restore(io.NopCloser(strings.NewReader(legacy))); err != nil {
		t.Fatal(err)
	}
	amy, _ := f.user("amy")
	zed, _ := f.user("zed")
	if amy.ID == 0 || zed.ID == 0 || amy.ID == zed.ID {
		t.Fatalf("legacy users got IDs %d and %d; want two distinct ones", amy.ID, zed.ID)
	}
	want := map[string]uint64{"a": zed.ID, "b": amy.ID, "c": 0, "d": 0}
	for name, id := range want {
		if tp, _ := f.topic(name); tp.OwnerID != id || tp.Owner != "" {
			t.Errorf("legacy topic %s: owner %d %q, want %d", name, tp.OwnerID, tp.Owner, id)
		}
	}
	res := f.apply(9, command{Op: "create_user", User: &auth.User{Name: "new"}})
	if res.err != nil || res.user.ID == amy.ID || res.user.ID == zed.ID || res.user.ID == 0 {
		t.Fatalf("a user created after a legacy restore: %+v %v", res.user, res.err)
	}
}

// TestUsernamesUniqueRegardlessOfCase: a new user's name may not equal an existing one's
// but for case, while an older version's log that created both replays as it applied.
func TestUsernamesUniqueRegardlessOfCase(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	defer s.Close()
	if _, err := s.CreateUser(auth.User{Name: "dave"}, false); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Dave", "DAVE", "dAvE"} {
		if _, err := s.CreateUser(auth.User{Name: name}, false); !errors.Is(err, ErrUserExists) {
			t.Errorf("create %s while dave exists: %v, want ErrUserExists", name, err)
		}
	}
	f := newFSM()
	f.apply(1, command{Op: "create_user", User: &auth.User{Name: "dave"}, Rules: cmdRules})
	if r := f.apply(2, command{Op: "create_user", User: &auth.User{Name: "Dave"}, Rules: cmdRules}); !errors.Is(r.err, ErrUserExists) {
		t.Errorf("state machine: create Dave after dave: %v, want ErrUserExists", r.err)
	}
	if r := f.apply(3, command{Op: "create_user", User: &auth.User{Name: "Dave"}}); r.err != nil {
		t.Errorf("an older version's create of Dave after dave: %v, want it applied as then", r.err)
	}
	if _, ok := f.user("Dave"); !ok {
		t.Error("the older version's Dave is missing")
	}
}

// TestSyncIfExists: a missing control-plane store is no error (a new node); an
// existing one is synced (a directory instead of a file makes the sync, or the open
// for writing, fail: the error is reported, not taken for "missing").
func TestSyncIfExists(t *testing.T) {
	dir := t.TempDir()
	if err := syncIfExists(filepath.Join(dir, "raft.db")); err != nil {
		t.Fatalf("a missing store: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "raft.db"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syncIfExists(filepath.Join(dir, "raft.db")); err != nil {
		t.Fatalf("an existing store: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syncIfExists(filepath.Join(dir, "dir.db")); err == nil {
		t.Fatal("a store that cannot be opened for writing was not reported")
	}
}
