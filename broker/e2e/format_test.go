package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/format"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// formatFixtures are data directories written by each released format, made by
// testdata/mkfixture with the binary of that format (testdata/README.md). Each holds the
// same content; TestFormatFixtures checks all of it.
var formatFixtures = []struct {
	file   string
	format int
}{
	{"format-1.tar.gz", 1}, // commit 7cfc66e, the last binary without a FORMAT file
	{"format-2.tar.gz", 2},
	{"format-3.tar.gz", 3}, // the first binary with the write-ahead file
}

// fixturePassword is mkfixture's AdminPassword.
const fixturePassword = "admin-secret-1"

// readFormat returns the format in dir's FORMAT file, or 0 when there is none.
func readFormat(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "FORMAT"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Format int `json:"format"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("FORMAT holds %q: %v", b, err)
	}
	return st.Format
}

// TestFormatFixtures: the current binary opens a data directory of every released
// format with every topic, message, ack, user and child intact, upgrades it (logged)
// to the current format, and keeps all of it across a restart.
func TestFormatFixtures(t *testing.T) {
	t.Parallel()
	if got := formatFixtures[len(formatFixtures)-1].format; got != format.Current {
		t.Errorf("the newest fixture is format %d, the binary writes %d: add testdata/format-%d.tar.gz", got, format.Current, format.Current)
	}
	for _, fx := range formatFixtures {
		t.Run(fx.file, func(t *testing.T) {
			t.Parallel()
			checkFixture(t, unpackFixture(t, fx.file), fx.format, testutil.Options{})
		})
	}
}

// checkFixture starts the fixture unpacked in dir with opts (its data directory and
// the admin password are set here) and checks all of it, across a restart. It returns
// the running node and an admin client.
func checkFixture(t *testing.T, dir string, was int, opts testutil.Options) (*testutil.Narad, *api) {
	if got, want := readFormat(t, dir), map[bool]int{true: 0, false: was}[was == 1]; got != want {
		t.Fatalf("the fixture's FORMAT reads %d before the start, want %d (0: none)", got, want)
	}
	opts.DataDir = dir
	opts.Env = append(opts.Env, "NARAD_ADMIN_PASSWORD="+fixturePassword)
	n := testutil.StartNarad(t, opts)
	if got := readFormat(t, dir); got != format.Current {
		t.Errorf("FORMAT reads %d after the start, want %d", got, format.Current)
	}
	upgraded := strings.Contains(n.Log(), "upgrading the data directory")
	if upgraded != (was < format.Current) {
		t.Errorf("format %d: the log says upgraded %v, want %v", was, upgraded, was < format.Current)
	}
	admin := &api{Client: n.Client().WithBasicAuth("admin", fixturePassword), t: t}
	alice := &api{Client: n.Client().WithBasicAuth("alice", "alice-password"), t: t}
	bob := &api{Client: n.Client().WithBasicAuth("bob", "bob-password"), t: t}

	// Topics and their settings.
	names := admin.topicNames()
	sort.Strings(names)
	if fmt.Sprint(names) != "[bob.t events orders orders.copy orders.later plain raw]" {
		t.Errorf("topics %v", names)
	}
	for name, parts := range map[string]int32{"orders": 2, "orders.copy": 2, "orders.later": 1, "plain": 1} {
		if got := admin.topic(name).Partitions; got != parts {
			t.Errorf("%s has %d partitions, want %d", name, got, parts)
		}
	}
	if got := admin.topic("plain").VisibilityTimeoutMs; got != 600000 {
		t.Errorf("plain's visibility timeout is %d ms, want 600000", got)
	}
	children := map[string]int64{}
	for _, c := range admin.children("orders") {
		children[c.Child] = c.FanoutDelayMs
	}
	if fmt.Sprint(children) != "map[orders.copy:0 orders.later:1000]" {
		t.Errorf("children of orders: %v", children)
	}
	admin.Do("POST", "/v1/topics/events/produce", []byte(`{"no":1}`), "Content-Type", "application/json").ExpectError(t, http.StatusBadRequest, "schema_violation")

	// Every message, by replay.
	want := map[string]string{} // id -> key
	for i := 0; i < 10; i++ {
		want["o"+strconv.Itoa(i)] = "k" + strconv.Itoa(i%3)
	}
	parentPart := map[string]int32{}
	for _, topic := range []string{"orders", "orders.copy", "orders.later"} {
		got := map[string]string{}
		for p := 0; p < int(admin.topic(topic).Partitions); p++ {
			for _, m := range admin.readAll(topic, p) {
				id := payloadID(t, &m)
				if _, dup := got[id]; dup {
					t.Errorf("%s holds %s twice", topic, id)
				}
				if m.Key != nil {
					got[id] = *m.Key
				}
				switch topic {
				case "orders":
					parentPart[id] = m.Partition
				case "orders.copy":
					if m.Partition != parentPart[id] {
						t.Errorf("orders.copy holds %s in partition %d, its parent in %d", id, m.Partition, parentPart[id])
					}
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s replays %v, want %v", topic, got, want)
		}
	}
	var ids []string
	for i, m := range admin.readAll("plain", 0) {
		ids = append(ids, payloadID(t, &m))
		if m.Offset != int64(i) {
			t.Errorf("plain: %s at offset %d, want %d", payloadID(t, &m), m.Offset, i)
		}
	}
	if fmt.Sprint(ids) != "[p0 p1 p2 p3 p4]" {
		t.Errorf("plain replays %v", ids)
	}
	if ms := admin.readAll("events", 0); len(ms) != 1 || payloadID(t, &ms[0]) != "e0" {
		t.Errorf("events replays %d messages, want e0", len(ms))
	}
	raw := admin.readAll("raw", 0)
	if len(raw) != 2 || !bytes.Equal(raw[0].bytesOf(t), []byte{0, 1, 2, 0xff}) || !bytes.Equal(raw[1].bytesOf(t), []byte("raw-1")) {
		t.Errorf("raw replays %d messages, want the two byte payloads", len(raw))
	}

	// Users: logins and grants.
	r := admin.Get("/v1/users")
	var users struct {
		Users []struct {
			Username string `json:"username"`
			Grants   []struct {
				Action string   `json:"action"`
				Topics []string `json:"topics"`
			} `json:"grants"`
		} `json:"users"`
	}
	if r.Expect(t, http.StatusOK) && r.JSON(t, &users) {
		got := map[string]string{}
		for _, u := range users.Users {
			got[u.Username] = fmt.Sprint(u.Grants)
		}
		wantUsers := map[string]string{
			"admin": "[{admin [*]}]",
			"alice": "[{produce [orders]} {consume [orders orders.copy orders.later]}]",
			"bob":   "[{create [bob.*]} {consume [plain]}]",
		}
		if fmt.Sprint(got) != fmt.Sprint(wantUsers) {
			t.Errorf("users %v, want %v", got, wantUsers)
		}
	}
	alice.Get("/v1/users/alice").Expect(t, http.StatusOK)
	bob.Get("/v1/users/bob").Expect(t, http.StatusOK)
	n.Client().WithBasicAuth("alice", "bob-password").Get("/v1/users/alice").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	// bob still owns the topic he created.
	bob.PatchJSON("/v1/topics/bob.t", map[string]any{"visibility_timeout_ms": 5000}).Expect(t, http.StatusOK)

	// Acks: p0 and p1 were acked, p3 acked ahead of p2, whose lease ended with the
	// restart. Only p2 and p4 come.
	var got []string
	for _, m := range bob.consumeBatch("plain", 10, "1s") {
		got = append(got, payloadID(t, &m))
		bob.mustAck("plain", &m)
	}
	sort.Strings(got)
	if fmt.Sprint(got) != "[p2 p4]" {
		t.Errorf("plain delivers %v, want [p2 p4]: acked messages came again or unacked ones were lost", got)
	}
	if m := bob.consume("plain", "wait=200ms"); m != nil {
		t.Errorf("plain delivers %s after everything was acked", payloadID(t, m))
	}

	// Children: orders.copy was drained, so it delivers only what orders gets now (a lost
	// cursor would copy everything again); orders.later delivers every copy once, the
	// new one no earlier than its delay.
	alice.produceJSON("orders", map[string]any{"id": "o10"}, "key=k1")
	waitFor(t, 60*time.Second, "the children to copy o10", func() bool {
		return admin.lagOf("orders", "orders.copy") == 0 && admin.lagOf("orders", "orders.later") == 0
	})
	if got := alice.drainIDs("orders.copy"); fmt.Sprint(got) != "map[o10:1]" {
		t.Errorf("orders.copy delivers %v, want only o10: the fan-out cursor did not survive", got)
	}
	later := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for len(later) < 11 && time.Now().Before(deadline) {
		for _, m := range alice.consumeBatch("orders.later", 100, "1s") {
			later[payloadID(t, &m)]++
			alice.mustAck("orders.later", &m)
		}
	}
	for i := 0; i <= 10; i++ {
		if id := "o" + strconv.Itoa(i); later[id] != 1 {
			t.Errorf("orders.later delivered %s %d times, want once (all: %v)", id, later[id], later)
		}
	}

	// A second start of the upgraded directory changes nothing and loses nothing.
	n.Restart()
	if strings.Count(n.Log(), "upgrading the data directory") > 1 {
		t.Errorf("the directory was upgraded again at the second start")
	}
	if got := readFormat(t, dir); got != format.Current {
		t.Errorf("FORMAT reads %d after a restart, want %d", got, format.Current)
	}
	for _, topic := range []string{"plain", "orders.copy", "orders.later"} {
		consumer := alice
		if topic == "plain" {
			consumer = bob
		}
		if m := consumer.consume(topic, "wait=200ms"); m != nil {
			t.Errorf("%s delivers %s after a restart, though everything was acked", topic, payloadID(t, m))
		}
	}
	if got := len(admin.readAll("orders", 0)) + len(admin.readAll("orders", 1)); got != 11 {
		t.Errorf("orders holds %d messages after a restart, want 11", got)
	}
	return n, admin
}

// TestFormatTooNewRefused: a data directory of a format newer than the binary knows is
// refused at start (exit 1), naming both formats and the binary that wrote it, and is
// left untouched.
func TestFormatTooNewRefused(t *testing.T) {
	t.Parallel()
	dir := unpackFixture(t, formatFixtures[len(formatFixtures)-1].file)
	newer := format.Current + 1
	stamp := fmt.Sprintf(`{"format":%d,"written_by":"narad 9.9.9"}`+"\n", newer)
	if err := os.WriteFile(filepath.Join(dir, "FORMAT"), []byte(stamp), 0o600); err != nil {
		t.Fatal(err)
	}
	raftBefore, err := os.ReadFile(filepath.Join(dir, "meta", "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.BuildNarad(t), "serve", "--http-addr", "127.0.0.1:"+strconv.Itoa(port), "--data-dir", dir)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NARAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "NARAD_ADMIN_PASSWORD="+fixturePassword)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("narad on a format-%d directory: %v, want exit status 1; output:\n%s", newer, err, stderr.String())
	}
	for _, want := range []string{
		fmt.Sprintf("is at format %d", newer),
		"narad 9.9.9",
		fmt.Sprintf("knows formats up to %d", format.Current),
		"restore a backup",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, stderr.String())
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "FORMAT")); err != nil || string(got) != stamp {
		t.Errorf("FORMAT became %q (%v), want it untouched", got, err)
	}
	if raftAfter, err := os.ReadFile(filepath.Join(dir, "meta", "raft.db")); err != nil || !bytes.Equal(raftAfter, raftBefore) {
		t.Errorf("the refused directory's metadata changed (%v)", err)
	}
}

// TestFormatDowngradeForARollback: `narad downgrade-format --to 2` refuses a node that
// runs; on the directory of a node killed with -9 it takes the format back to 2 with
// wal/ folded in and removed, and a start on it loses nothing and redelivers no ack.
// (The cluster-tagged TestClusterRollingUpgradeFromPreviousRelease starts a binary of
// format 2 itself on such a directory.)
func TestFormatDowngradeForARollback(t *testing.T) {
	t.Parallel()
	n := testutil.StartNarad(t, testutil.Options{})
	a := &api{Client: n.Client(), t: t}
	a.createTopic("d", map[string]any{"partitions": 2})
	for i := 0; i < 20; i++ {
		a.produceJSON("d", map[string]any{"id": "m" + strconv.Itoa(i)}, "")
	}
	acked := map[string]bool{}
	for len(acked) < 5 {
		m := a.mustConsume("d", "2s")
		a.mustAck("d", m)
		acked[payloadID(t, m)] = true
	}
	dir := n.DataDir()
	downgrade := func() (string, int) {
		t.Helper()
		cmd := exec.Command(testutil.BuildNarad(t), "downgrade-format", "--to", "2", "--data-dir", dir)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := downgrade(); code != 1 || !strings.Contains(out, "stop the node") {
		t.Fatalf("a downgrade of a running node's directory: exit %d, output %q; want exit 1 saying to stop the node", code, out)
	}
	if got := readFormat(t, dir); got != format.Current {
		t.Fatalf("FORMAT reads %d after a refused downgrade", got)
	}
	n.Kill()
	if out, code := downgrade(); code != 0 || !strings.Contains(out, "at format 2 now") {
		t.Fatalf("a downgrade of a killed node's directory: exit %d, output %q", code, out)
	}
	if got := readFormat(t, dir); got != 2 {
		t.Fatalf("FORMAT reads %d after the downgrade, want 2", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("wal/ after the downgrade: %v; want it gone", err)
	}
	n.RestartAfterKill()
	if !strings.Contains(n.Log(), "upgrading the data directory") || readFormat(t, dir) != format.Current {
		t.Errorf("the start after the downgrade did not upgrade the directory again (FORMAT %d)", readFormat(t, dir))
	}
	got := map[string]int{}
	for _, m := range a.drain("d") {
		got[payloadID(t, &m)]++
	}
	for i := 0; i < 20; i++ {
		id := "m" + strconv.Itoa(i)
		if want := map[bool]int{true: 0, false: 1}[acked[id]]; got[id] != want {
			t.Errorf("%s delivered %d times after the downgrade and restart, want %d (acked: %v)", id, got[id], want, acked[id])
		}
	}
}

// TestSecondServeOnADirectoryInUse: a second `narad serve` on a running node's data
// directory exits at once with status 1, saying the directory is locked, and the
// running node serves on, its write-ahead file untouched (before the directory lock
// the second replayed it, then hung on the control-plane store).
func TestSecondServeOnADirectoryInUse(t *testing.T) {
	t.Parallel()
	n := testutil.StartNarad(t, testutil.Options{})
	a := &api{Client: n.Client(), t: t}
	a.createTopic("busy", nil)
	a.produceJSON("busy", map[string]any{"id": "before"}, "")
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	refusedAsLocked(t, nil, "serve", "--http-addr", "127.0.0.1:"+strconv.Itoa(port), "--data-dir", n.DataDir())
	a.produceJSON("busy", map[string]any{"id": "after"}, "")
	got := map[string]int{}
	for _, m := range a.drain("busy") {
		got[payloadID(t, &m)]++
	}
	if fmt.Sprint(got) != "map[after:1 before:1]" {
		t.Errorf("the running node delivers %v after the refused second start, want before and after once", got)
	}
	n.Kill()
	n.RestartAfterKill() // the write-ahead file the second start left alone replays cleanly
	if m := a.consume("busy", "wait=200ms"); m != nil {
		t.Errorf("after a kill and restart the node delivered %s again, though it was acked", payloadID(t, m))
	}
}

// TestSecondClusterServeOnADirectoryInUse: a cluster node started twice with the same
// flags is told its data directory is locked, before it starts a node plane (which
// used to fail first, on "address already in use", naming the wrong cause).
func TestSecondClusterServeOnADirectoryInUse(t *testing.T) {
	t.Parallel()
	nd := startPeersCluster(t, 1)[0]
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--http-addr", "127.0.0.1:" + strconv.Itoa(port), "--data-dir", nd.DataDir()},
		clusterArgs(nd.id, nd.addr, "--peers", nd.id+"@"+nd.addr)...)
	refusedAsLocked(t, clusterEnv(clusterSecret), args...)
	if _, err := nd.cluster(); err != nil {
		t.Errorf("the running node after the refused second start: %v", err)
	}
}

// refusedAsLocked runs narad with args (no NARAD_ variable of this environment, env
// added) and fails the test unless it exits with status 1 within 30 s, saying the data
// directory is locked by another process.
func refusedAsLocked(t *testing.T, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.BuildNarad(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NARAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("narad %v on a directory in use: %v (context %v), want exit status 1 at once; output:\n%s", args, err, ctx.Err(), out.String())
	}
	if !strings.Contains(out.String(), "is locked by another process") {
		t.Errorf("the refusal does not say the directory is locked:\n%s", out.String())
	}
}
