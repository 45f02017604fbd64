package e2e

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// clientFrom returns a plain HTTP client whose connections come from the loopback
// address ip (Linux routes all of 127/8 to lo), so a test can play a second client host.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: d.DialContext, MaxIdleConnsPerHost: 200,
	}}
}

type rawAnswer struct {
	status     int
	code       string
	retryAfter string
}

func rawDo(hc *http.Client, method, url, user, pass, body string) (rawAnswer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return rawAnswer{}, err
	}
	req.SetBasicAuth(user, pass)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return rawAnswer{}, err
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &e)
	return rawAnswer{resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After")}, nil
}

// burst sends n requests at once from hc and reports how many were refused
// unhashed (503 unavailable with Retry-After) before the rest are answered. It returns
// once n-bound were refused, or every request was answered, and reports how many had
// been answered by then; the rest keep running until the caller calls wait.
func burst(t *testing.T, n int, send func(i int) (rawAnswer, error)) (refused func() int, answered func() int, wait func() map[int]int) {
	t.Helper()
	var refusedN, answeredN atomic.Int32
	var mu sync.Mutex
	byStatus := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			a, err := send(i)
			if err != nil {
				t.Errorf("flood request %d: %v", i, err)
				answeredN.Add(1)
				return
			}
			if a.status == http.StatusServiceUnavailable {
				if a.code != "unavailable" || a.retryAfter == "" {
					t.Errorf("refused flood request: %d %s Retry-After %q; want 503 unavailable with Retry-After", a.status, a.code, a.retryAfter)
				}
				refusedN.Add(1)
			}
			mu.Lock()
			byStatus[a.status]++
			mu.Unlock()
			answeredN.Add(1)
		}(i)
	}
	return func() int { return int(refusedN.Load()) }, func() int { return int(answeredN.Load()) },
		func() map[int]int {
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			return byStatus
		}
}

// floodBoundE2E is the most unproven password checks from one address the tests let
// the broker admit at once (its own bound is lower).
const floodBoundE2E = 8

// TestLoginFloodDoesNotLockOutUsers: a burst of wrong passwords from one address (a
// second loopback address) is refused past a small bound before any bcrypt, with 503
// and Retry-After, and while the admitted attempts are still waiting, a user who never
// logged in and the admin log in from another address.
func TestLoginFloodDoesNotLockOutUsers(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t, "--auth-failure-delay", "20s")
	admin.createUser("newcomer", "newcomer-pass")
	flood := clientFrom("127.0.0.2")
	url := n.URL() + "/v1/topics"
	// A few sequential failures first, so the burst's admitted attempts wait (1.6 s
	// and more) before they hash and are still in flight when the others log in.
	for i := 0; i < 7; i++ {
		if a, err := rawDo(flood, "GET", url, "admin", fmt.Sprintf("warm-up-%d", i), ""); err != nil || a.status != http.StatusUnauthorized {
			t.Fatalf("warm-up wrong password %d: %+v %v, want 401", i, a, err)
		}
	}
	const total = 100
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refused, answered, wait := burst(t, total, func(i int) (rawAnswer, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.SetBasicAuth("admin", fmt.Sprintf("guess-%03d", i))
		resp, err := flood.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return rawAnswer{status: -1}, nil // cancelled by the test after its checks
			}
			return rawAnswer{}, err
		}
		defer resp.Body.Close()
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		return rawAnswer{resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After")}, nil
	})
	waitFor(t, 60*time.Second, fmt.Sprintf("all but %d of %d flood requests to be answered", floodBoundE2E, total), func() bool {
		return answered() >= total-floodBoundE2E
	})
	if r := refused(); r < total-floodBoundE2E {
		t.Errorf("%d of %d simultaneous wrong passwords from one address were refused with 503; want all but %d refused before hashing", r, total, floodBoundE2E)
	}
	// The admitted attempts are still waiting out their delay: others log in meanwhile.
	n.Client().WithBasicAuth("newcomer", "newcomer-pass").Get("/v1/topics").Expect(t, http.StatusOK)
	admin.Get("/v1/users").Expect(t, http.StatusOK)
	if a := answered(); a >= total {
		t.Errorf("every flood request was answered before the other logins; the test wants some in flight")
	}
	cancel()
	wait()
	if v, ok := metricValue(admin, "narad_auth_throttled_total"); !ok || v < total-floodBoundE2E {
		t.Errorf("narad_auth_throttled_total = %v (%v), want at least %d", v, ok, total-floodBoundE2E)
	}
}

// TestPasswordChangeGuessesBounded: wrong current_password guesses on the password
// route go through the same bound, delay and failure count as wrong logins. A burst of
// them from one low-privilege user is refused past the bound with 503 before hashing,
// every wrong guess that was hashed counts in narad_auth_failures_total, and the admin
// is served meanwhile.
func TestPasswordChangeGuessesBounded(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t, "--auth-failure-delay", "20s")
	admin.createUser("low", "low-password")
	hc := clientFrom("127.0.0.3")
	url := n.URL() + "/v1/users/low/password"
	guess := func(i int) (rawAnswer, error) {
		return rawDo(hc, "PUT", url, "low", "low-password", fmt.Sprintf(`{"current_password":"guess-%03d","new_password":"new-password-1"}`, i))
	}
	before, _ := metricValue(admin, "narad_auth_failures_total")
	for i := 0; i < 7; i++ {
		if a, err := guess(1000 + i); err != nil || a.status != http.StatusForbidden {
			t.Fatalf("wrong current_password %d: %+v %v, want 403", i, a, err)
		}
	}
	if v, _ := metricValue(admin, "narad_auth_failures_total"); v < before+7 {
		t.Errorf("7 wrong current_password guesses moved narad_auth_failures_total from %v to %v; want them counted", before, v)
	}
	const total = 64
	refused, answered, wait := burst(t, total, guess)
	waitFor(t, 60*time.Second, fmt.Sprintf("all but %d of %d guesses to be answered", floodBoundE2E, total), func() bool {
		return answered() >= total-floodBoundE2E
	})
	if r := refused(); r < total-floodBoundE2E {
		t.Errorf("%d of %d simultaneous current_password guesses were refused with 503; want all but %d refused before hashing", r, total, floodBoundE2E)
	}
	admin.Get("/v1/users").Expect(t, http.StatusOK)
	got := wait()
	if got[http.StatusNoContent] != 0 {
		t.Errorf("a wrong current_password changed the password: %v", got)
	}
	// The right current password still works, and the new one logs in.
	if a, err := rawDo(hc, "PUT", url, "low", "low-password", `{"current_password":"low-password","new_password":"new-password-1"}`); err != nil || a.status != http.StatusNoContent {
		t.Errorf("the right current_password: %+v %v, want 204", a, err)
	}
	n.Client().WithBasicAuth("low", "new-password-1").Get("/v1/users/low").Expect(t, http.StatusOK)
}

// TestLastAdminKept: the last user holding admin on * can be neither deleted nor
// demoted (409): the node would be locked out of user management for good.
func TestLastAdminKept(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	putGrants := func(c *api, user, body string) *testutil.Response {
		return c.Do("PUT", "/v1/users/"+user+"/grants", []byte(body), "Content-Type", "application/json")
	}
	admin.Do("DELETE", "/v1/users/admin", nil).ExpectError(t, http.StatusConflict, "conflict")
	putGrants(admin, "admin", `{"grants":[{"action":"admin","topics":["orders.*"]}]}`).ExpectError(t, http.StatusConflict, "conflict")
	admin.Get("/v1/users/admin").Expect(t, http.StatusOK)
	// With a second full admin, either may go, but not both.
	admin.createUser("ops", "ops-password", grant("admin", "*"))
	ops := &api{Client: n.Client().WithBasicAuth("ops", "ops-password"), t: t}
	putGrants(admin, "admin", `{"grants":[{"action":"produce","topics":["*"]}]}`).Expect(t, http.StatusOK)
	ops.Do("DELETE", "/v1/users/ops", nil).ExpectError(t, http.StatusConflict, "conflict")
	putGrants(ops, "ops", `{"grants":[]}`).ExpectError(t, http.StatusConflict, "conflict")
	ops.Do("DELETE", "/v1/users/admin", nil).Expect(t, http.StatusNoContent)
	ops.Get("/v1/users").Expect(t, http.StatusOK)
}

// unpackFixture extracts a data directory made by an older narad into a new temp dir.
func unpackFixture(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, os.FileMode(h.Mode)&0o777); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The fixture testdata/legacy-7cfc66e.tar.gz is the data directory of a narad built
// from commit 7cfc66e after these steps, with NARAD_ADMIN_PASSWORD=admin-secret-1:
// admin created bob (create and consume on bob.*), carol (create on carol.*), dave and
// Dave (no grants); bob created bob.t, carol created carol.t; admin deleted carol, then
// deleted admin, the last admin, which that version allowed.
const legacyFixture = "legacy-7cfc66e.tar.gz"

// TestBreakGlassRestoresAdmin: a data directory left with no admin (by an older version)
// gets its admin back from NARAD_ADMIN_PASSWORD at the next start; once an admin exists,
// later starts change nothing.
func TestBreakGlassRestoresAdmin(t *testing.T) {
	t.Parallel()
	dir := unpackFixture(t, legacyFixture)
	n := testutil.StartNarad(t, testutil.Options{DataDir: dir, Env: []string{"NARAD_ADMIN_PASSWORD=break-glass-1"}})
	n.Client().WithBasicAuth("admin", "break-glass-1").Get("/v1/users").Expect(t, http.StatusOK)
	if !strings.Contains(n.Log(), "no user held admin on *") {
		t.Errorf("the restore of the admin left no log line")
	}
	// The restored admin changes its password; a start with another password leaves it.
	n.Client().WithBasicAuth("admin", "break-glass-1").Do("PUT", "/v1/users/admin/password", []byte(`{"new_password":"admin-secret-3"}`), "Content-Type", "application/json").Expect(t, http.StatusNoContent)
	n.Restart()
	n.Client().WithBasicAuth("admin", "admin-secret-3").Get("/v1/users").Expect(t, http.StatusOK)
	n.Client().WithBasicAuth("admin", "break-glass-1").Get("/v1/users").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	// The other users came through the upgrade.
	n.Client().WithBasicAuth("bob", "bob-password").Get("/v1/topics").Expect(t, http.StatusOK)
}

// TestOwnershipNeedsTheUserAndAGrant: a topic's owner is the user who created it, not
// whoever holds the name later, and owner rights last only while the owner still holds
// create on the topic. Topics owned by name in an older data directory go to that
// user, or to nobody when the user is gone.
func TestOwnershipNeedsTheUserAndAGrant(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	as := func(user, pass string) *api { return &api{Client: n.Client().WithBasicAuth(user, pass), t: t} }
	visibility := map[string]any{"visibility_timeout_ms": 5000}

	// A new user under a deleted user's name does not inherit the topic.
	admin.createUser("eve", "eve-password-1", grant("create", "eve.*"))
	as("eve", "eve-password-1").createTopic("eve.t", map[string]any{"partitions": 1})
	admin.Do("DELETE", "/v1/users/eve", nil).Expect(t, http.StatusNoContent)
	admin.createUser("eve", "eve-password-2", grant("create", "eve.*"))
	eve2 := as("eve", "eve-password-2")
	eve2.Do("DELETE", "/v1/topics/eve.t", nil).ExpectError(t, http.StatusForbidden, "forbidden")
	eve2.PatchJSON("/v1/topics/eve.t", visibility).ExpectError(t, http.StatusForbidden, "forbidden")
	admin.Get("/v1/topics/eve.t").Expect(t, http.StatusOK)

	// An owner whose grants were taken away has no owner rights left.
	admin.createUser("frank", "frank-password", grant("create", "frank.*"))
	frank := as("frank", "frank-password")
	frank.createTopic("frank.t", map[string]any{"partitions": 1})
	frank.PatchJSON("/v1/topics/frank.t", visibility).Expect(t, http.StatusOK)
	admin.Do("PUT", "/v1/users/frank/grants", []byte(`{"grants":[]}`), "Content-Type", "application/json").Expect(t, http.StatusOK)
	// Holding no grant that matches the topic and no owner rights, frank learns nothing
	// of it: 404, as for a topic that does not exist (users-and-access.md, 403 or 404).
	frank.PatchJSON("/v1/topics/frank.t", visibility).ExpectError(t, http.StatusNotFound, "topic_not_found")
	frank.Do("DELETE", "/v1/topics/frank.t", nil).ExpectError(t, http.StatusNotFound, "topic_not_found")
	frank.Get("/v1/topics/frank.t").ExpectError(t, http.StatusNotFound, "topic_not_found")
	admin.Get("/v1/topics/frank.t").Expect(t, http.StatusOK)
	// Given create again, the same user (not just the name) is the owner again.
	admin.Do("PUT", "/v1/users/frank/grants", []byte(`{"grants":[{"action":"create","topics":["frank.*"]}]}`), "Content-Type", "application/json").Expect(t, http.StatusOK)
	frank.PatchJSON("/v1/topics/frank.t", visibility).Expect(t, http.StatusOK)
}

// TestOwnersUpgradedFromNames: in a data directory from 7cfc66e, which stored owners by
// name, bob still owns bob.t, and carol.t (its owner carol was deleted) has no owner: a
// new carol cannot delete it.
func TestOwnersUpgradedFromNames(t *testing.T) {
	t.Parallel()
	dir := unpackFixture(t, legacyFixture)
	n := testutil.StartNarad(t, testutil.Options{DataDir: dir, Env: []string{"NARAD_ADMIN_PASSWORD=break-glass-1"}})
	admin := &api{Client: n.Client().WithBasicAuth("admin", "break-glass-1"), t: t}
	bob := &api{Client: n.Client().WithBasicAuth("bob", "bob-password"), t: t}
	bob.PatchJSON("/v1/topics/bob.t", map[string]any{"visibility_timeout_ms": 5000}).Expect(t, http.StatusOK)
	admin.createUser("carol", "carol-password-2", grant("create", "carol.*"))
	carol := &api{Client: n.Client().WithBasicAuth("carol", "carol-password-2"), t: t}
	carol.Do("DELETE", "/v1/topics/carol.t", nil).ExpectError(t, http.StatusForbidden, "forbidden")
	// The same after a restart (the log replays) and after a snapshot would: still so.
	n.Restart()
	bob.PatchJSON("/v1/topics/bob.t", map[string]any{"visibility_timeout_ms": 6000}).Expect(t, http.StatusOK)
	carol.Do("DELETE", "/v1/topics/carol.t", nil).ExpectError(t, http.StatusForbidden, "forbidden")
	admin.Get("/v1/topics/carol.t").Expect(t, http.StatusOK)
}

// TestUsernamesDifferingInCase: a name equal to an existing one but for case is refused
// (409 user_exists); logins match the name exactly. A data directory from 7cfc66e that
// already holds dave and Dave keeps both, each with its own password.
func TestUsernamesDifferingInCase(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	admin.createUser("bob", "bob-password")
	for _, name := range []string{"Bob", "BOB", "Admin"} {
		admin.PostJSON("/v1/users", map[string]any{"username": name, "password": "other-password"}).ExpectError(t, http.StatusConflict, "user_exists")
	}
	n.Client().WithBasicAuth("Bob", "bob-password").Get("/v1/topics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	n.Client().WithBasicAuth("bob", "bob-password").Get("/v1/topics").Expect(t, http.StatusOK)

	old := testutil.StartNarad(t, testutil.Options{DataDir: unpackFixture(t, legacyFixture), Env: []string{"NARAD_ADMIN_PASSWORD=break-glass-1"}})
	old.Client().WithBasicAuth("dave", "dave-password").Get("/v1/users/dave").Expect(t, http.StatusOK)
	old.Client().WithBasicAuth("Dave", "Dave-password").Get("/v1/users/Dave").Expect(t, http.StatusOK)
	oldAdmin := &api{Client: old.Client().WithBasicAuth("admin", "break-glass-1"), t: t}
	oldAdmin.PostJSON("/v1/users", map[string]any{"username": "DAVE", "password": "other-password"}).ExpectError(t, http.StatusConflict, "user_exists")
}
