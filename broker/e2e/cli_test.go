package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// cliRun is one finished run of the narad CLI.
type cliRun struct {
	stdout, stderr string
	code           int
}

// cliEnv runs the CLI (the same binary as the broker) with an environment of its own:
// no NARAD_* variable of the developer's, a private contexts file, a private HOME.
type cliEnv struct {
	t   *testing.T
	bin string
	env []string
}

func newCLI(t *testing.T, url string, env ...string) *cliEnv {
	t.Helper()
	dir := t.TempDir()
	base := []string{"HOME=" + dir, "NARAD_CLI_CONFIG=" + filepath.Join(dir, "narad", "contexts.json")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NARAD_") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			base = append(base, kv)
		}
	}
	if url != "" {
		base = append(base, "NARAD_URL="+url)
	}
	return &cliEnv{t: t, bin: testutil.BuildNarad(t), env: append(base, env...)}
}

// runIn runs the CLI with stdin and returns what it printed and its exit code.
func (c *cliEnv) runIn(stdin string, args ...string) cliRun {
	c.t.Helper()
	cmd := exec.Command(c.bin, args...)
	cmd.Env = c.env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("narad %v: %v", args, err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		c.t.Fatalf("narad %v: still running after 60s; stderr: %s", args, errOut.String())
	}
	r := cliRun{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("narad %v: %v", args, err)
	}
	return r
}

func (c *cliEnv) run(args ...string) cliRun { c.t.Helper(); return c.runIn("", args...) }

// ok runs the CLI and fails the test unless it exits 0.
func (c *cliEnv) ok(args ...string) string {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("narad %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// exits runs the CLI and fails the test unless it exits with code.
func (c *cliEnv) exits(code int, args ...string) cliRun {
	c.t.Helper()
	r := c.run(args...)
	if r.code != code {
		c.t.Fatalf("narad %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	if code != 0 && !strings.Contains(r.stderr, "narad") {
		c.t.Fatalf("narad %s: exit %d without a message on stderr: %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not the JSON expected (%v): %s", err, s)
	}
	return v
}

// lines decodes JSON Lines.
func lines[T any](t *testing.T, s string) []T {
	t.Helper()
	var out []T
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l != "" {
			out = append(out, decode[T](t, l))
		}
	}
	return out
}

type cliTopic struct {
	Name                string `json:"name"`
	Incarnation         string `json:"incarnation"`
	Partitions          int    `json:"partitions"`
	RetentionMs         int64  `json:"retention_ms"`
	VisibilityTimeoutMs int64  `json:"visibility_timeout_ms"`
	MaxInFlight         int    `json:"max_in_flight_per_partition"`
	Parent              string `json:"parent"`
	FanoutDelayMs       int64  `json:"fanout_delay_ms"`
	CreatedAt           string `json:"created_at"`
	PartitionStats      []struct {
		Partition  int32 `json:"partition"`
		NextOffset int64 `json:"next_offset"`
		Backlog    int64 `json:"backlog"`
		InFlight   int64 `json:"in_flight"`
	} `json:"partition_stats"`
}

type cliMessage struct {
	Topic           string  `json:"topic"`
	Partition       int32   `json:"partition"`
	Offset          int64   `json:"offset"`
	Key             *string `json:"key"`
	Timestamp       string  `json:"timestamp"`
	DeliveryAttempt int     `json:"delivery_attempt"`
	Payload         *string `json:"payload"`
	PayloadBase64   *string `json:"payload_base64"`
}

type cliProduced struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
}

func payloads(ms []cliMessage) []string {
	var out []string
	for _, m := range ms {
		if m.Payload != nil {
			out = append(out, *m.Payload)
		}
	}
	slices.Sort(out)
	return out
}

// TestCLITopics drives every topic subcommand against a real node, with their JSON
// shapes and exit codes.
func TestCLITopics(t *testing.T) {
	n := testutil.StartNarad(t, testutil.Options{})
	c := newCLI(t, "")
	u := "--url=" + n.URL()

	tp := decode[cliTopic](t, c.ok("topic", "create", "orders", "--partitions", "2", "--retention", "12h", "--visibility", "30s", "--max-in-flight", "7", u, "-o", "json"))
	if tp.Name != "orders" || tp.Partitions != 2 || tp.RetentionMs != 12*3600*1000 || tp.VisibilityTimeoutMs != 30000 || tp.MaxInFlight != 7 || tp.Incarnation == "" || tp.CreatedAt == "" {
		t.Fatalf("created %+v", tp)
	}
	c.exits(1, "topic", "create", "orders", u) // exists: a conflict
	if out := c.ok("topic", "list", u); !strings.Contains(out, "orders") || !strings.Contains(out, "12h") || !strings.Contains(out, "30s") {
		t.Fatalf("topic list table:\n%s", out)
	}
	if list := decode[[]cliTopic](t, c.ok("topic", "list", u, "--output=json")); len(list) != 1 || list[0].Name != "orders" {
		t.Fatalf("topic list json %+v", list)
	}
	if raw := c.ok("topic", "list", u, "-o", "raw"); raw != "orders\n" {
		t.Fatalf("topic list raw %q", raw)
	}
	got := decode[cliTopic](t, c.ok("topic", "get", "orders", u, "-o", "json"))
	if len(got.PartitionStats) != 2 || got.PartitionStats[1].Partition != 1 {
		t.Fatalf("topic get %+v", got)
	}
	alt := decode[cliTopic](t, c.ok("topic", "alter", "orders", "--visibility", "45s", "--retention", "2h", u, "-o", "json"))
	if alt.VisibilityTimeoutMs != 45000 || alt.RetentionMs != 2*3600000 || alt.MaxInFlight != 7 {
		t.Fatalf("altered %+v", alt)
	}
	c.exits(2, "topic", "alter", "orders", u) // nothing to change

	// Fan-out: attach, children with lag, detach; create with a parent.
	c.ok("topic", "create", "audit", u)
	ch := decode[[]struct {
		Name          string `json:"name"`
		FanoutDelayMs int64  `json:"fanout_delay_ms"`
		Lag           []struct {
			Partition int32 `json:"partition"`
			Lag       int64 `json:"lag"`
		} `json:"lag"`
	}](t, c.ok("topic", "attach", "orders", "audit", u, "-o", "json"))
	if len(ch) != 1 || ch[0].Name != "audit" {
		t.Fatalf("attach %+v", ch)
	}
	if out := c.ok("topic", "children", "orders", u, "-o", "raw"); out != "audit\n" {
		t.Fatalf("children raw %q", out)
	}
	c.ok("topic", "detach", "orders", "audit", u)
	if out := c.ok("topic", "children", "orders", u, "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("children after detach %q", out)
	}
	kid := decode[cliTopic](t, c.ok("topic", "create", "orders.later", "--parent", "orders", "--delay", "2s", u, "-o", "json"))
	if kid.Parent != "orders" || kid.FanoutDelayMs != 2000 {
		t.Fatalf("child %+v", kid)
	}
	c.exits(3, "topic", "children", "nope", u)
	c.exits(3, "topic", "detach", "orders", "audit", u) // no longer a child

	// Deletes, and what is gone answers 3.
	if out := c.ok("topic", "delete", "audit", u, "-o", "json"); decode[map[string]string](t, out)["deleted"] != "audit" {
		t.Fatalf("delete json %q", out)
	}
	c.exits(3, "topic", "get", "audit", u)
	c.exits(3, "topic", "delete", "audit", u)
	c.exits(3, "topic", "alter", "audit", "--retention", "1h", u)

	// Usage errors answer 2 before any request.
	c.exits(2, "topic")
	c.exits(2, "topic", "frobnicate")
	c.exits(2, "topic", "get")
	c.exits(2, "topic", "get", "a", "b", u)
	c.exits(2, "topic", "create", "x", "--partitions", "many", u)
	c.exits(2, "topic", "list", "-o", "yaml", u)
	c.exits(2, "topic", "create", "x", "--delay", "1s", u)
	if r := c.run("topic", "create", "--help"); r.code != 0 || !strings.Contains(r.stderr, "-retention duration") {
		t.Fatalf("help: %+v", r)
	}
	c.exits(1, "topic", "create", "bad name!", u) // the broker refuses: 400
}

// TestCLIProduceConsumeReplay writes messages every way the CLI offers and reads them
// back as a consumer (acking), a bystander (--peek) and by replay.
func TestCLIProduceConsumeReplay(t *testing.T) {
	n := testutil.StartNarad(t, testutil.Options{})
	c := newCLI(t, n.URL())
	c.ok("topic", "create", "jobs", "--partitions", "2", "--visibility", "2s")

	// An argument, with a key and a pinned partition.
	p := decode[cliProduced](t, c.ok("produce", "jobs", "first", "--partition", "1", "--key", "k1", "-o", "json"))
	if p.Partition != 1 || p.Offset != 0 {
		t.Fatalf("produced %+v", p)
	}
	// Lines of stdin, one at a time and in batches.
	r := c.runIn("a\nb\n\nc\n", "produce", "jobs", "--partition", "0", "-o", "json")
	if r.code != 0 || len(lines[cliProduced](t, r.stdout)) != 3 {
		t.Fatalf("stdin lines: %+v", r)
	}
	r = c.runIn("d\ne\n", "produce", "jobs", "--batch", "--batch-size", "1", "--partition", "0", "-o", "json")
	if ps := lines[cliProduced](t, r.stdout); r.code != 0 || len(ps) != 2 || ps[1].Offset != 4 {
		t.Fatalf("batch: %+v", r)
	}
	// A binary file as one message.
	bin := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(bin, []byte{0, 1, 2, 0xff, 0xfe}, 0o600); err != nil {
		t.Fatal(err)
	}
	c.ok("produce", "jobs", "--file", bin, "--partition", "1")
	// --count with --rate: 5 messages at 50/s take at least ~80 ms.
	start := time.Now()
	if ps := lines[cliProduced](t, c.ok("produce", "jobs", "--count", "5", "--rate", "50", "--partition", "1", "-o", "json")); len(ps) != 5 {
		t.Fatalf("count: %d", len(ps))
	}
	if el := time.Since(start); el < 80*time.Millisecond {
		t.Fatalf("--rate 50 sent 5 messages in %v", el)
	}
	c.exits(2, "produce", "jobs", "x", "--file", bin)
	c.exits(3, "produce", "nope", "x")

	// Replay reads without leases: a range of one partition, then from a time.
	ms := lines[cliMessage](t, c.ok("replay", "jobs", "--partition", "1", "--from", "0", "--to", "1", "-o", "json"))
	if len(ms) != 2 || *ms[0].Payload != "first" || *ms[0].Key != "k1" || ms[1].PayloadBase64 == nil || ms[1].Payload != nil || ms[0].DeliveryAttempt != 0 {
		t.Fatalf("replay range %+v", ms)
	}
	if *ms[1].PayloadBase64 != "AAEC//4=" {
		t.Fatalf("binary payload %q", *ms[1].PayloadBase64)
	}
	if got := lines[cliMessage](t, c.ok("replay", "jobs", "--from-time", "1h", "-o", "json")); len(got) != 12 {
		t.Fatalf("replay from an hour ago: %d messages, want 12", len(got))
	}
	if got := lines[cliMessage](t, c.ok("replay", "jobs", "--from-time", time.Now().Add(time.Hour).Format(time.RFC3339), "-o", "json")); len(got) != 0 {
		t.Fatalf("replay from the future: %+v", got)
	}
	raw := c.ok("replay", "jobs", "--partition", "1", "--from", "1", "--to", "1", "-o", "raw")
	if raw != "\x00\x01\x02\xff\xfe\n" {
		t.Fatalf("raw to a pipe %q", raw)
	}
	c.exits(3, "replay", "jobs", "--partition", "7")
	c.exits(2, "replay", "jobs", "--from", "3")
	c.exits(2, "replay", "jobs", "--partition", "0", "--from", "1", "--from-time", "1h")

	// A consumer: --no-ack leaves the leases to lapse, then a real consume acks everything.
	ms = lines[cliMessage](t, c.ok("consume", "jobs", "--max", "3", "--no-ack", "-o", "json"))
	if len(ms) != 3 || ms[0].DeliveryAttempt != 1 {
		t.Fatalf("no-ack consume %+v", ms)
	}
	got := decode[cliTopic](t, c.ok("topic", "get", "jobs", "-o", "json"))
	if got.PartitionStats[0].InFlight+got.PartitionStats[1].InFlight != 3 {
		t.Fatalf("after --no-ack %+v", got.PartitionStats)
	}
	var all []cliMessage
	testutil.WaitFor(t, 30*time.Second, "every message consumed once the leases lapse", func() bool {
		all = append(all, lines[cliMessage](t, c.ok("consume", "jobs", "--wait", "500ms", "-o", "json"))...)
		return len(all) >= 12
	})
	if want := []string{"a", "b", "c", "d", "e", "first", "message 1", "message 2", "message 3", "message 4", "message 5"}; !slices.Equal(payloads(all), want) {
		t.Fatalf("consumed %v, want %v", payloads(all), want)
	}
	got = decode[cliTopic](t, c.ok("topic", "get", "jobs", "-o", "json"))
	for _, s := range got.PartitionStats {
		if s.Backlog != 0 || s.InFlight != 0 {
			t.Fatalf("after consuming everything %+v", got.PartitionStats)
		}
	}
	if out := c.ok("consume", "jobs", "--wait", "100ms"); out != "" {
		t.Fatalf("an empty topic printed %q", out)
	}
	c.exits(3, "consume", "nope", "--wait", "100ms")
	c.exits(2, "consume", "jobs", "--wait", "1m")

	// A bystander: --peek shows what is produced after it started and leases nothing.
	peek := exec.Command(c.bin, "consume", "jobs", "--peek", "--max", "2", "-o", "json")
	peek.Env = c.env
	var peekOut, peekErr testutil.LockedBuffer
	peek.Stdout, peek.Stderr = &peekOut, &peekErr
	if err := peek.Start(); err != nil {
		t.Fatal(err)
	}
	peekDone := make(chan error, 1)
	go func() { peekDone <- peek.Wait() }()
	t.Cleanup(func() {
		if peek.ProcessState == nil {
			peek.Process.Kill()
		}
	})
	testutil.WaitFor(t, 30*time.Second, "peek says it is watching", func() bool { return strings.Contains(peekErr.String(), "peeking at 2 partitions") })
	c.ok("produce", "jobs", "seen-1", "--partition", "0")
	c.ok("produce", "jobs", "seen-2", "--partition", "1")
	select {
	case err := <-peekDone:
		if err != nil {
			t.Fatalf("peek: %v; %s", err, peekErr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("peek did not end after 2 messages; out %q err %q", peekOut.String(), peekErr.String())
	}
	if got := payloads(lines[cliMessage](t, peekOut.String())); !slices.Equal(got, []string{"seen-1", "seen-2"}) {
		t.Fatalf("peek saw %v", got)
	}
	got = decode[cliTopic](t, c.ok("topic", "get", "jobs", "-o", "json"))
	if got.PartitionStats[0].Backlog+got.PartitionStats[1].Backlog != 2 || got.PartitionStats[0].InFlight+got.PartitionStats[1].InFlight != 0 {
		t.Fatalf("peek took leases or consumed: %+v", got.PartitionStats)
	}
	// The table form shows a binary payload as a placeholder, never its bytes.
	c.ok("produce", "jobs", "--file", bin)
	out := c.ok("consume", "jobs", "--max", "3")
	if !strings.Contains(out, "seen-1") || !strings.Contains(out, "<5 bytes, binary") || strings.ContainsRune(out, 0) {
		t.Fatalf("table consume %q", out)
	}
}

// TestCLIUsersContextsAndAuth runs the user commands on a secured node, with
// credentials from flags, variables, a password file and a saved context; wrong ones
// exit 4.
func TestCLIUsersContextsAndAuth(t *testing.T) {
	n := testutil.StartNarad(t, testutil.Options{Env: []string{"NARAD_ADMIN_PASSWORD=admin-pw-1"}})
	c := newCLI(t, n.URL())
	admin := []string{"--user", "admin", "--password", "admin-pw-1"}
	as := func(creds []string, args ...string) []string { return append(args, creds...) }

	c.exits(4, "topic", "list") // no credentials
	c.exits(4, as([]string{"--user", "admin", "--password", "wrong"}, "topic", "list")...)
	c.ok(as(admin, "topic", "create", "inv.a")...)

	type user struct {
		Name   string `json:"username"`
		Grants []struct {
			Action string   `json:"action"`
			Topics []string `json:"topics"`
		} `json:"grants"`
	}
	u := decode[user](t, c.ok(as(admin, "user", "create", "alice", "--new-password", "alice-pw-1", "--grant", "consume:inv.*", "--grant", "produce:inv.a,inv.b", "-o", "json")...))
	if u.Name != "alice" || len(u.Grants) != 2 || u.Grants[1].Action != "produce" || !slices.Equal(u.Grants[1].Topics, []string{"inv.a", "inv.b"}) {
		t.Fatalf("created %+v", u)
	}
	if r := c.runIn("bob-pw-1\n", as(admin, "user", "create", "bob", "--new-password-stdin")...); r.code != 0 {
		t.Fatalf("create from stdin: %+v", r)
	}
	c.exits(1, as(admin, "user", "create", "bob", "--new-password", "x-long-enough")...) // exists
	c.exits(2, as(admin, "user", "create", "carol", "--grant", "sing:inv.a", "--new-password", "pw-carol-1")...)
	if users := decode[[]user](t, c.ok(as(admin, "user", "list", "-o", "json")...)); len(users) != 3 {
		t.Fatalf("users %+v", users)
	}
	if u := decode[user](t, c.ok(as(admin, "user", "grant", "bob", "--grant", "consume:inv.a", "-o", "json")...)); len(u.Grants) != 1 || u.Grants[0].Action != "consume" {
		t.Fatalf("granted %+v", u)
	}
	if u := decode[user](t, c.ok(as(admin, "user", "get", "bob", "-o", "json")...)); len(u.Grants) != 1 {
		t.Fatalf("get %+v", u)
	}
	c.exits(3, as(admin, "user", "get", "nobody")...)

	// alice by variables: she may produce to inv.a, not create topics.
	alice := newCLI(t, n.URL(), "NARAD_USER=alice", "NARAD_PASSWORD=alice-pw-1")
	alice.ok("produce", "inv.a", "hi")
	alice.exits(4, "topic", "create", "inv.z")
	alice.ok("user", "password", "alice", "--current", "alice-pw-1", "--new-password", "alice-pw-2")
	alice.exits(4, "produce", "inv.a", "old password")

	// bob by a password file.
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("bob-pw-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ms := lines[cliMessage](t, c.ok("consume", "inv.a", "--user", "bob", "--password-file", pwFile, "-o", "json", "--wait", "1s")); len(ms) != 1 || *ms[0].Payload != "hi" {
		t.Fatalf("bob consumed %+v", ms)
	}

	// Contexts: saved with mode 0600, used by name or as the current one.
	plain := newCLI(t, "")
	plain.ok("context", "add", "prod", "--url", n.URL(), "--user", "admin", "--password", "admin-pw-1")
	plain.ok("context", "add", "bobs", "--url", "http://127.0.0.1:1,"+n.URL(), "--user", "bob", "--password-file", pwFile)
	cfg := strings.TrimPrefix(plain.env[1], "NARAD_CLI_CONFIG=")
	st, err := os.Stat(cfg)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("contexts file %v mode %v", err, st)
	}
	type ctxRow struct {
		Name     string   `json:"name"`
		Current  bool     `json:"current"`
		URLs     []string `json:"urls"`
		Password string   `json:"password"`
	}
	rows := decode[[]ctxRow](t, plain.ok("context", "list", "-o", "json"))
	if len(rows) != 2 || rows[0].Name != "bobs" || rows[0].Current || !rows[1].Current || len(rows[0].URLs) != 2 || rows[1].Password != "saved" {
		t.Fatalf("contexts %+v", rows)
	}
	if b, _ := os.ReadFile(cfg); bytes.Contains([]byte(plain.ok("context", "list")), []byte("admin-pw-1")) || !bytes.Contains(b, []byte("admin-pw-1")) {
		t.Fatalf("context list shows a password, or the file lacks it")
	}
	plain.ok("user", "list") // the current context: prod, an admin
	plain.exits(4, "user", "list", "--context", "bobs")
	plain.ok("topic", "get", "inv.a", "--context", "bobs") // fails over past the dead first URL
	plain.ok("context", "use", "bobs")
	plain.exits(4, "user", "list")
	plain.exits(3, "context", "use", "nope")
	plain.exits(2, "user", "list", "--context", "nope")
	plain.ok("context", "remove", "bobs")
	plain.exits(3, "context", "remove", "bobs")
	if rows := decode[[]ctxRow](t, plain.ok("context", "list", "-o", "json")); len(rows) != 1 || rows[0].Current {
		t.Fatalf("after remove %+v", rows)
	}

	c.ok(as(admin, "user", "delete", "bob")...)
	c.exits(3, as(admin, "user", "delete", "bob")...)
	c.exits(4, "topic", "list", "--user", "bob", "--password-file", pwFile)
}

// TestCLIExitCodeUnavailable: no node at the URL exits 5, quickly.
func TestCLIExitCodeUnavailable(t *testing.T) {
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := newCLI(t, fmt.Sprintf("http://127.0.0.1:%d", port))
	start := time.Now()
	c.exits(5, "topic", "list")
	c.exits(5, "produce", "t", "x")
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("two commands against no node took %v", el)
	}
}

// TestCLIClusterBenchCompletion covers the rest: cluster commands answer what a single
// node offers, bench measures, completion scripts come out for every shell.
func TestCLIClusterBenchCompletion(t *testing.T) {
	n := testutil.StartNarad(t, testutil.Options{})
	c := newCLI(t, n.URL())
	members := decode[[]struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		Controller bool   `json:"controller"`
		MinVersion int    `json:"min_version"`
		MaxVersion int    `json:"max_version"`
	}](t, c.ok("cluster", "members", "-o", "json"))
	top := meta.VersionMax
	if len(members) != 1 || members[0].Status != "alive" || !members[0].Controller || members[0].MinVersion != 1 || members[0].MaxVersion != top {
		t.Fatalf("members %+v", members)
	}
	// A node of its own commits the highest cluster version it speaks within moments.
	var table string
	waitFor(t, 30*time.Second, fmt.Sprintf("the members table to show cluster version %d", top), func() bool {
		table = c.ok("cluster", "members")
		return strings.Contains(table, fmt.Sprintf("cluster version %d\n", top)) && strings.Contains(table, "VERSIONS") && strings.Contains(table, fmt.Sprintf(" 1-%d\n", top))
	})
	if r := c.run("cluster", "decommission", "no-such-node"); r.code != 3 && r.code != 1 {
		t.Fatalf("decommission: %+v", r)
	}
	c.ok("topic", "create", "m")
	if r := c.run("cluster", "move", "--topic", "m", "--partition", "0", "--from", members[0].ID, "--to", "other"); r.code == 0 || r.code == 2 {
		t.Fatalf("a move to a node that does not exist: %+v", r)
	}
	c.exits(2, "cluster", "move", "--topic", "m")

	res := decode[struct {
		Messages int `json:"messages"`
		Produce  struct {
			Count   int     `json:"count"`
			Rate    float64 `json:"messages_per_second"`
			Latency struct {
				P50, P95, P99 float64
			} `json:"latency_ms"`
		} `json:"produce"`
		Consume struct {
			Count   int `json:"count"`
			Latency struct {
				P50, P99 float64
			} `json:"latency_ms"`
		} `json:"consume"`
	}](t, c.ok("bench", "b", "--messages", "300", "--producers", "4", "--consumers", "2", "-o", "json"))
	if res.Messages != 300 || res.Produce.Count != 300 || res.Consume.Count != 300 || res.Produce.Rate <= 0 ||
		res.Produce.Latency.P50 <= 0 || res.Produce.Latency.P99 < res.Produce.Latency.P50 || res.Consume.Latency.P99 < res.Consume.Latency.P50 {
		t.Fatalf("bench %+v", res)
	}

	bash := c.ok("completion", "bash")
	for _, want := range []string{"complete -o default -F _narad narad", `"topic") echo "create list get alter force-leader delete children attach pause resume remote-password remote-update detach"`, "--retention", "--peek"} {
		if !strings.Contains(bash, want) {
			t.Fatalf("bash completion lacks %q:\n%s", want, bash)
		}
	}
	if sh, err := exec.LookPath("bash"); err == nil {
		cmd := exec.Command(sh, "-n")
		cmd.Stdin = strings.NewReader(bash)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("bash -n: %v %s", err, out)
		}
		// Complete `narad topic cr` in a real bash.
		script := bash + "\nCOMP_WORDS=(narad topic cr); COMP_CWORD=2; _narad; echo \"${COMPREPLY[@]}\"\nCOMP_WORDS=(narad consume t --pe); COMP_CWORD=3; _narad; echo \"${COMPREPLY[@]}\"\n"
		out, err := exec.Command(sh, "-c", script).CombinedOutput()
		if err != nil || string(out) != "create\n--peek\n" {
			t.Fatalf("bash completion answered %q (%v)", out, err)
		}
	}
	if zsh := c.ok("completion", "zsh"); !strings.Contains(zsh, "bashcompinit") {
		t.Fatalf("zsh completion:\n%s", zsh)
	}
	if fish := c.ok("completion", "fish"); !regexp.MustCompile(`complete -c narad -n "__fish_seen_subcommand_from topic; and __fish_seen_subcommand_from create" -l retention`).MatchString(fish) {
		t.Fatalf("fish completion:\n%s", fish)
	}
	c.exits(2, "completion", "tcsh")
}

// TestCLIServeDev starts the playground: loopback, security off, a temporary data
// directory that is gone after SIGTERM.
func TestCLIServeDev(t *testing.T) {
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := newCLI(t, url, "NARAD_ADMIN_PASSWORD=should-be-ignored")
	cmd := exec.Command(c.bin, "serve", "--dev", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port))
	cmd.Env = c.env
	var errOut testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &errOut, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-done
		}
	})
	testutil.WaitFor(t, 30*time.Second, "the dev node answers", func() bool { return c.run("topic", "list").code == 0 })
	c.ok("topic", "create", "play")
	c.ok("produce", "play", "hello")
	m := regexp.MustCompile(`data in (\S+) `).FindStringSubmatch(errOut.String())
	if m == nil {
		t.Fatalf("no data dir in the output:\n%s", errOut.String())
	}
	if _, err := os.Stat(m[1]); err != nil {
		t.Fatalf("the dev data dir: %v", err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve --dev exited with %v:\n%s", err, errOut.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatal("serve --dev did not stop on SIGTERM")
	}
	if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dev data dir is still there: %v", err)
	}
	if r := c.run("serve", "--dev", "--data-dir", t.TempDir()); r.code == 0 || !strings.Contains(r.stderr, "--dev") {
		t.Fatalf("serve --dev --data-dir: %+v", r)
	}
}

// TestCLIConsumeFollowStopsOnSignal: a following consumer prints and acks what arrives
// and exits 0 on SIGINT, the way to stop it.
func TestCLIConsumeFollowStopsOnSignal(t *testing.T) {
	n := testutil.StartNarad(t, testutil.Options{})
	c := newCLI(t, n.URL())
	c.ok("topic", "create", "f", "--partitions", "1")
	cmd := exec.Command(c.bin, "consume", "f", "--follow", "--wait", "1s", "-o", "raw")
	cmd.Env = c.env
	var out, errOut testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	c.ok("produce", "f", "one")
	testutil.WaitFor(t, 30*time.Second, "the follower prints the message", func() bool { return out.String() == "one\n" })
	c.ok("produce", "f", "two")
	testutil.WaitFor(t, 30*time.Second, "the follower prints the second message", func() bool { return out.String() == "one\ntwo\n" })
	cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("consume --follow after SIGINT: %v; %s", err, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consume --follow did not stop on SIGINT")
	}
	got := decode[cliTopic](t, c.ok("topic", "get", "f", "-o", "json"))
	if s := got.PartitionStats[0]; s.Backlog != 0 || s.InFlight != 0 {
		t.Fatalf("the follower did not ack: %+v", s)
	}
}

// TestCLIConsumeIntoAClosedPipeHandsBack: `narad consume | head -1`. The reader goes
// after one line; the consumer's next write meets a closed pipe. It hands back what it
// did not write and acks what it did, instead of dying of SIGPIPE with a batch leased
// for the visibility timeout (10 minutes here).
func TestCLIConsumeIntoAClosedPipeHandsBack(t *testing.T) {
	n := testutil.StartNarad(t, testutil.Options{})
	c := newCLI(t, n.URL())
	c.ok("topic", "create", "piped", "--partitions", "1", "--visibility", "10m")
	// 2,000 lines of 100 bytes: more than a pipe holds, so the consumer cannot finish
	// before the reader goes.
	line := strings.Repeat("x", 99) + "\n"
	if r := c.runIn(strings.Repeat(line, 2000), "produce", "piped", "--batch", "--quiet"); r.code != 0 {
		t.Fatalf("produce: %+v", r)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(c.bin, "consume", "piped", "-o", "raw", "--batch", "10")
	cmd.Env = c.env
	var errOut testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = pw, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	buf := make([]byte, 100)
	if _, err := io.ReadFull(pr, buf); err != nil || string(buf) != line {
		t.Fatalf("the first line: %q %v", buf, err)
	}
	pr.Close() // head -1 has its line and exits
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errOut.String(), "narad consume") {
			t.Fatalf("consume into a closed pipe: %v; stderr %q", err, errOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("consume into a closed pipe did not stop")
	}
	got := decode[cliTopic](t, c.ok("topic", "get", "piped", "-o", "json"))
	if s := got.PartitionStats[0]; s.InFlight != 0 || s.Backlog == 0 {
		t.Fatalf("after the pipe closed: %+v (leases left until the visibility timeout, or everything acked)", s)
	}
}
