package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

const adminPass = "admin-secret-1"

// startSecured starts a broker with security on and returns it with an admin client.
func startSecured(t *testing.T, args ...string) (*testutil.Narad, *api) {
	t.Helper()
	n := testutil.StartNarad(t, testutil.Options{Args: args, Env: []string{"NARAD_ADMIN_PASSWORD=" + adminPass}})
	return n, &api{Client: n.Client().WithBasicAuth("admin", adminPass), t: t}
}

func (a *api) createUser(name, pass string, grants ...map[string]any) {
	a.t.Helper()
	if grants == nil {
		grants = []map[string]any{}
	}
	a.PostJSON("/v1/users", map[string]any{"username": name, "password": pass, "grants": grants}).Expect(a.t, http.StatusCreated)
}

func grant(action string, topics ...string) map[string]any {
	return map[string]any{"action": action, "topics": topics}
}

// TestAuthorizationTable runs every route as no one, a wrong password, a user without
// a grant, the user with the right grant (or the owner), and the admin, and checks that
// refusals are exactly 401 or 403 and that allowed calls get past authorization.
func TestAuthorizationTable(t *testing.T) {
	t.Parallel()
	// Failed-login slow-down is tested on its own (TestFailedLoginsSlowed); here it would
	// only stretch the run.
	n, admin := startSecured(t, "--auth-failure-delay", "0")
	admin.createTopic("t", map[string]any{"partitions": 1})
	admin.createUser("nogrant", "nogrant-pass")
	admin.createUser("producer", "producer-pass", grant("produce", "t"))
	admin.createUser("consumer", "consumer-pass", grant("consume", "t"))
	admin.createUser("creator", "creator-pass", grant("create", "own.*"), grant("consume", "own.*"))
	admin.createUser("pwuser", "pwuser-pass")
	admin.createUser("peer", "peer-pass", grant("consume", "own.*")) // sees own.x, owns nothing
	creator := &api{Client: n.Client().WithBasicAuth("creator", "creator-pass"), t: t}
	creator.createTopic("own.x", map[string]any{"partitions": 1})
	creator.createTopic("own.del", map[string]any{"partitions": 1})

	type identity struct{ user, pass string }
	none := identity{}
	wrong := identity{"admin", "not-the-password"}
	nogrant := identity{"nogrant", "nogrant-pass"}
	adm := identity{"admin", adminPass}
	users := map[string]identity{
		"producer": {"producer", "producer-pass"}, "consumer": {"consumer", "consumer-pass"},
		"creator": {"creator", "creator-pass"}, "pwuser": {"pwuser", "pwuser-pass"}, "nogrant": nogrant,
		"peer": {"peer", "peer-pass"},
	}
	handle := "AQAAAAAAAAAEAAAAAQAAAAAAAAAAAAAAAQAAAAAAAAABcutyBA" // well formed, never issued
	routes := []struct {
		method, path, body string
		allowed            []string // users (besides admin) who pass authorization
		denied             []string // users who get 403: they hold some grant on the topic, not this one
		hidden             []string // users who get 404 topic_not_found: they hold no grant on the topic at all
	}{
		{"GET", "/v1/topics", "", []string{"nogrant", "producer"}, nil, nil},
		{"POST", "/v1/topics", `{"name":"own.new"}`, []string{"creator"}, []string{"nogrant", "producer"}, nil},
		{"GET", "/v1/topics/t", "", []string{"producer", "consumer"}, nil, []string{"nogrant", "creator"}},
		{"PATCH", "/v1/topics/own.x", `{"visibility_timeout_ms":5000}`, []string{"creator"}, []string{"peer"}, []string{"nogrant", "producer", "consumer"}},
		{"DELETE", "/v1/topics/own.del", "", []string{"creator"}, []string{"peer"}, []string{"nogrant", "producer", "consumer"}},
		{"POST", "/v1/topics/t/produce", `{"a":1}`, []string{"producer"}, []string{"consumer"}, []string{"nogrant", "creator"}},
		{"POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1}]}`, []string{"producer"}, []string{"consumer"}, []string{"nogrant"}},
		{"GET", "/v1/topics/t/consume", "", []string{"consumer"}, []string{"producer"}, []string{"nogrant"}},
		{"GET", "/v1/topics/t/consume-batch", "", []string{"consumer"}, []string{"producer"}, []string{"nogrant"}},
		{"POST", "/v1/topics/t/ack?receipt_handle=" + handle, "", []string{"consumer"}, []string{"producer"}, []string{"nogrant"}},
		{"POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"` + handle + `"}]}`, []string{"consumer"}, []string{"producer"}, []string{"nogrant"}},
		{"GET", "/v1/topics/t/partitions/0/messages", "", []string{"consumer"}, []string{"producer"}, []string{"nogrant"}},
		{"POST", "/v1/topics/own.x/children", `{"child":"own.y"}`, []string{"creator"}, []string{"peer"}, []string{"nogrant", "consumer"}},
		{"GET", "/v1/topics/own.x/children", "", []string{"creator", "peer"}, nil, []string{"nogrant", "producer"}},
		{"DELETE", "/v1/topics/own.x/children/own.y", "", []string{"creator"}, []string{"peer"}, []string{"nogrant", "consumer"}},
		{"GET", "/v1/users", "", nil, []string{"nogrant", "producer", "creator"}, nil},
		{"POST", "/v1/users", `{"username":"made","password":"made-pass","grants":[]}`, nil, []string{"nogrant", "creator"}, nil},
		{"GET", "/v1/users/producer", "", []string{"producer"}, []string{"nogrant", "consumer"}, nil},
		{"PUT", "/v1/users/producer/grants", `{"grants":[{"action":"produce","topics":["t"]}]}`, nil, []string{"nogrant", "producer"}, nil},
		{"PUT", "/v1/users/pwuser/password", `{"current_password":"pwuser-pass","new_password":"pwuser-pass"}`, []string{"pwuser"}, []string{"nogrant", "producer"}, nil},
		{"DELETE", "/v1/users/made", "", nil, []string{"nogrant", "creator"}, nil},
		{"GET", "/v1/cluster", "", []string{"nogrant"}, nil, nil},
		{"GET", "/v1/cluster/members", "", []string{"nogrant"}, nil, nil},
		{"POST", "/v1/cluster/members", `{"id":"n2","address":"127.0.0.1:1"}`, nil, []string{"nogrant", "creator"}, nil},
		{"DELETE", "/v1/cluster/members/n2", "", nil, []string{"nogrant"}, nil},
		{"POST", "/v1/cluster/moves", `{"topic":"t","partition":0,"from":"a","to":"b"}`, nil, []string{"nogrant"}, nil},
		{"GET", "/v1/cluster/moves", "", nil, []string{"nogrant", "creator"}, nil},
		{"DELETE", "/v1/cluster/moves/7", "", nil, []string{"nogrant", "creator"}, nil},
		{"POST", "/v1/cluster/rebalance", "", nil, []string{"nogrant", "creator"}, nil},
		{"POST", "/v1/topics/t/partitions/0/force-leader", `{"node":"n1"}`, nil, []string{"nogrant", "producer", "creator"}, nil},
	}
	call := func(id identity, method, path, body string) *testutil.Response {
		c := n.Client()
		if id.user != "" {
			c = c.WithBasicAuth(id.user, id.pass)
		}
		var b []byte
		hdr := []string{}
		if body != "" {
			b = []byte(body)
			hdr = []string{"Content-Type", "application/json"}
		}
		return c.Do(method, path, b, hdr...)
	}
	missingTopic := call(adm, "GET", "/v1/topics/no.such.topic", "")
	missingTopic.ExpectError(t, http.StatusNotFound, "topic_not_found")
	for _, rt := range routes {
		name := rt.method + " " + rt.path
		for _, id := range []identity{none, wrong} {
			if r := call(id, rt.method, rt.path, rt.body); r.Status != http.StatusUnauthorized || r.ErrorCode() != "unauthenticated" || r.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s as %q: %d %s, want 401 unauthenticated with WWW-Authenticate", name, id.user, r.Status, r.Body)
			}
		}
		for _, u := range rt.denied {
			if r := call(users[u], rt.method, rt.path, rt.body); r.Status != http.StatusForbidden || r.ErrorCode() != "forbidden" {
				t.Errorf("%s as %s: %d %s, want 403 forbidden", name, u, r.Status, r.Body)
			}
		}
		for _, u := range rt.hidden {
			// Exactly the answer for a topic that does not exist: a user without a
			// grant on a topic cannot tell whether it exists.
			r := call(users[u], rt.method, rt.path, rt.body)
			if r.Status != http.StatusNotFound || r.ErrorCode() != "topic_not_found" || string(r.Body) != string(missingTopic.Body) {
				t.Errorf("%s as %s: %d %s, want 404 exactly as for a missing topic (%s)", name, u, r.Status, r.Body, missingTopic.Body)
			}
		}
		for _, u := range append(rt.allowed, "admin") {
			id := adm
			if u != "admin" {
				id = users[u]
			}
			if r := call(id, rt.method, rt.path, rt.body); r.Status == http.StatusUnauthorized || r.Status == http.StatusForbidden || r.Status >= 500 && r.Status != http.StatusNotImplemented {
				t.Errorf("%s as %s: %d %s, want it past authorization", name, u, r.Status, r.Body)
			}
		}
	}
	// Public routes stay open; /metrics (it lists every topic) is not one of them.
	for _, p := range []string{"/healthz", "/readyz"} {
		call(none, "GET", p, "").Expect(t, http.StatusOK)
	}
	call(none, "GET", "/metrics", "").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	// Without a grant, a missing topic and an existing one answer alike on every route.
	for _, p := range []string{"/v1/topics/t", "/v1/topics/no.such.topic"} {
		if r := call(nogrant, "POST", p+"/produce", "x"); r.Status != http.StatusNotFound || string(r.Body) != string(missingTopic.Body) {
			t.Errorf("POST %s/produce as nogrant: %d %s, want the missing topic's 404", p, r.Status, r.Body)
		}
	}
	// Listing shows a user only what they hold a grant on.
	var list struct{ Topics []topicJSON }
	call(users["producer"], "GET", "/v1/topics", "").JSON(t, &list)
	if len(list.Topics) != 1 || list.Topics[0].Name != "t" {
		t.Errorf("producer sees %+v, want only t", list.Topics)
	}
	// Failed logins are counted.
	if v, ok := metricValue(admin, "narad_auth_failures_total"); !ok || v < float64(len(routes)) {
		t.Errorf("narad_auth_failures_total = %v (%v), want at least %d", v, ok, len(routes))
	}
}

// TestFailedLoginsSlowed: a client that keeps sending wrong passwords waits longer for
// each answer, boundedly; other requests are not held up.
func TestFailedLoginsSlowed(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t, "--auth-failure-delay", "1s")
	bad := n.Client().WithBasicAuth("admin", "wrong-password")
	var last time.Duration
	for i := 0; i < 8; i++ {
		start := time.Now()
		bad.Get("/v1/topics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
		last = time.Since(start)
	}
	if last < 300*time.Millisecond {
		t.Errorf("the 8th wrong password was answered after %v; want it slowed (about 1 s)", last)
	}
	if last > 15*time.Second {
		t.Errorf("the 8th wrong password took %v; the delay is capped at 1 s", last)
	}
	admin.Get("/v1/topics").Expect(t, http.StatusOK)
}

// TestNoEscalation: nobody grants more than they hold, and grants stop working when
// revoked.
func TestNoEscalation(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	admin.createTopic("inv.a", map[string]any{"partitions": 1})
	admin.createTopic("other", map[string]any{"partitions": 1})
	admin.createUser("scoped", "scoped-pass", grant("admin", "inv.*"))
	scoped := n.Client().WithBasicAuth("scoped", "scoped-pass")
	// A topic-scoped admin manages its topics but not users.
	scoped.PatchJSON("/v1/topics/inv.a", map[string]any{"visibility_timeout_ms": 5000}).Expect(t, http.StatusOK)
	// A topic outside every grant answers as if it did not exist (users-and-access.md).
	scoped.PatchJSON("/v1/topics/other", map[string]any{"visibility_timeout_ms": 5000}).ExpectError(t, http.StatusNotFound, "topic_not_found")
	scoped.PostJSON("/v1/users", map[string]any{"username": "x", "password": "x-password", "grants": []any{grant("admin", "*")}}).ExpectError(t, http.StatusForbidden, "forbidden")
	scoped.Do("PUT", "/v1/users/scoped/grants", []byte(`{"grants":[{"action":"admin","topics":["*"]}]}`), "Content-Type", "application/json").ExpectError(t, http.StatusForbidden, "forbidden")
	// Wildcard edges: inv.* does not cover "inv" or "invx".
	admin.createTopic("invx", map[string]any{"partitions": 1})
	scoped.Do("POST", "/v1/topics/invx/produce", []byte("x")).ExpectError(t, http.StatusNotFound, "topic_not_found")
	// Revoking a grant takes effect on the next request.
	admin.createUser("p", "p-password", grant("produce", "other"))
	p := n.Client().WithBasicAuth("p", "p-password")
	p.Do("POST", "/v1/topics/other/produce", []byte("x")).Expect(t, http.StatusAccepted)
	admin.Do("PUT", "/v1/users/p/grants", []byte(`{"grants":[]}`), "Content-Type", "application/json").Expect(t, http.StatusOK)
	p.Do("POST", "/v1/topics/other/produce", []byte("x")).ExpectError(t, http.StatusNotFound, "topic_not_found")
	admin.Do("DELETE", "/v1/users/p", nil).Expect(t, http.StatusNoContent)
	p.Do("POST", "/v1/topics/other/produce", []byte("x")).ExpectError(t, http.StatusUnauthorized, "unauthenticated")
}

// TestPasswordRules: changing one's own password needs the current one; an admin resets
// without it; the old password stops working; bad passwords are refused.
func TestPasswordRules(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	admin.createUser("u", "first-pass")
	u := n.Client().WithBasicAuth("u", "first-pass")
	put := func(c *testutil.Client, body string) *testutil.Response {
		return c.Do("PUT", "/v1/users/u/password", []byte(body), "Content-Type", "application/json")
	}
	put(u, `{"new_password":"second-pass"}`).ExpectError(t, http.StatusBadRequest, "bad_request")
	put(u, `{"current_password":"wrong-pass","new_password":"second-pass"}`).ExpectError(t, http.StatusForbidden, "forbidden")
	put(u, `{"current_password":"first-pass","new_password":"short"}`).ExpectError(t, http.StatusBadRequest, "invalid_json")
	put(u, `{"current_password":"first-pass","new_password":"`+strings.Repeat("x", 73)+`"}`).ExpectError(t, http.StatusBadRequest, "invalid_json")
	put(u, `{"current_password":"first-pass","new_password":"second-pass"}`).Expect(t, http.StatusNoContent)
	u.Get("/v1/users/u").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	u2 := n.Client().WithBasicAuth("u", "second-pass")
	u2.Get("/v1/users/u").Expect(t, http.StatusOK)
	put(admin.Client, `{"new_password":"third-pass"}`).Expect(t, http.StatusNoContent)
	n.Client().WithBasicAuth("u", "third-pass").Get("/v1/users/u").Expect(t, http.StatusOK)
	// Passwords never come back.
	r := admin.Get("/v1/users")
	if strings.Contains(string(r.Body), "third-pass") || strings.Contains(string(r.Body), "hash") {
		t.Errorf("user list leaks secrets: %s", r.Body)
	}
	if strings.Contains(n.Log(), "third-pass") || strings.Contains(n.Log(), adminPass) {
		t.Error("a password reached the log")
	}
	// Malformed credentials are a 401, never a 500.
	for _, h := range []string{"Basic", "Basic !!!", "Basic " + "Og==", "Bearer x", "Basic " + strings.Repeat("QUFB", 100)} {
		n.Client().Do("GET", "/v1/topics", nil, "Authorization", h).ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	}
}

// TestSecuritySurvivesRestart: users persist, the admin is seeded only once.
func TestSecuritySurvivesRestart(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	admin.createUser("keep", "keep-pass", grant("create", "*"))
	// Change the admin password, restart with the old NARAD_ADMIN_PASSWORD: the seed
	// must not reset it.
	admin.Do("PUT", "/v1/users/admin/password", []byte(`{"new_password":"admin-secret-2"}`), "Content-Type", "application/json").Expect(t, http.StatusNoContent)
	n.Restart()
	n.Client().WithBasicAuth("keep", "keep-pass").Get("/v1/topics").Expect(t, http.StatusOK)
	n.Client().WithBasicAuth("admin", adminPass).Get("/v1/topics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	n.Client().WithBasicAuth("admin", "admin-secret-2").Get("/v1/users").Expect(t, http.StatusOK)
	n.Client().Get("/v1/topics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
}

// TestNonLoopbackWithoutAuthRefused: narad will not serve every interface without
// security. It exits before binding anything.
func TestNonLoopbackWithoutAuthRefused(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildNarad(t)
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--http-addr", "0.0.0.0:"+strconv.Itoa(port), "--data-dir", t.TempDir())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "refusing to serve") {
		t.Fatalf("narad on 0.0.0.0 without auth: err %v, output %s", err, out)
	}
}

// TestSlowlorisCutOff: a client that never finishes its headers is disconnected.
func TestSlowlorisCutOff(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t, "--read-header-timeout", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(bufio.NewReader(conn))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a client stuck in its headers was still connected after %v", time.Since(start))
	}
	// Others are still served.
	a.Get("/healthz").Expect(t, http.StatusOK)
}

// TestTLSAndReload: HTTPS with the given certificate, and a new certificate is served
// after SIGHUP without a restart.
func TestTLSAndReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeCert(t, certFile, keyFile, 1)
	bin := testutil.BuildNarad(t)
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "serve", "--http-addr", addr, "--data-dir", filepath.Join(dir, "data"), "--tls-cert", certFile, "--tls-key", keyFile)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NARAD_ADMIN_PASSWORD=" + adminPass}
	var out testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("narad output:\n%s", out.String())
		}
	})
	serial := func() (int64, bool) {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return 0, false
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), true
	}
	waitFor(t, 30*time.Second, "HTTPS to answer", func() bool { _, ok := serial(); return ok })
	if s, _ := serial(); s != 1 {
		t.Fatalf("served serial %d, want 1", s)
	}
	// A verifying client with the certificate's pool gets through.
	pem, _ := os.ReadFile(certFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /healthz over TLS: %v %v", resp, err)
	}
	resp.Body.Close()
	// TLS 1.2 offers AEAD suites only: CBC with SHA-1 (or SHA-256) is refused.
	for _, cs := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{cs}})
		if err == nil {
			conn.Close()
			t.Errorf("TLS 1.2 with %s was accepted", tls.CipherSuiteName(cs))
		}
	}
	for _, cs := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{cs}})
		if err != nil {
			t.Errorf("TLS 1.2 with %s: %v", tls.CipherSuiteName(cs), err)
			continue
		}
		conn.Close()
	}
	// Plain HTTP to the TLS port does not get data, and its refusal is the JSON error.
	if r, err := http.Get("http://" + addr + "/v1/topics"); err != nil {
		t.Errorf("plain HTTP to the TLS port: %v, want a 400 saying to use https", err)
	} else {
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		code, msg, perr := testutil.ParseError(body)
		if r.StatusCode != http.StatusBadRequest || r.Header.Get("Content-Type") != "application/json" || perr != nil || code != "bad_request" || !strings.Contains(msg, "https://") {
			t.Errorf("plain HTTP to the TLS port: %d %q %s, want 400 with the JSON error saying to use https://", r.StatusCode, r.Header.Get("Content-Type"), body)
		}
	}
	writeCert(t, certFile, keyFile, 2)
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 30*time.Second, "the new certificate to be served after SIGHUP", func() bool { s, _ := serial(); return s == 2 })
	// Without a signal, a changed file is noticed on its own (polled every 5 s).
	time.Sleep(1100 * time.Millisecond) // file times must differ from the last load's
	writeCert(t, certFile, keyFile, 3)
	waitFor(t, 30*time.Second, "the changed certificate file to be served", func() bool { s, _ := serial(); return s == 3 })
	// A rotation that keeps older file times (cp -p, rsync -t, a restored backup) is
	// noticed too: the broker compares contents, not times.
	fi, err := os.Stat(certFile)
	if err != nil {
		t.Fatal(err)
	}
	writeCertTimes(t, certFile, keyFile, 4, fi.ModTime().Add(-time.Hour))
	waitFor(t, 30*time.Second, "a certificate with an older file time to be served", func() bool { s, _ := serial(); return s == 4 })
}

func writeCert(t *testing.T, certFile, keyFile string, serial int64) {
	t.Helper()
	writeCertTimes(t, certFile, keyFile, serial, time.Time{})
}

// writeCertTimes is writeCert with both files' modification times set to mtime (when
// not zero) before they replace the old ones, as cp -p would leave them.
func writeCertTimes(t *testing.T, certFile, keyFile string, serial int64, mtime time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "narad-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Write the key first and the certificate last, each through a rename, so a reload
	// never pairs a new certificate with an old key for long.
	write := func(path, typ string, b []byte) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		if !mtime.IsZero() {
			if err := os.Chtimes(tmp, mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(keyFile, "EC PRIVATE KEY", kb)
	write(certFile, "CERTIFICATE", der)
}

// TestUsernamesBreakingTheRulesAreInvalidName: a username the rules refuse answers 400
// invalid_name, as the API lists it, whatever rule it breaks: one with a space answered
// bad_request, one too long invalid_json.
func TestUsernamesBreakingTheRulesAreInvalidName(t *testing.T) {
	t.Parallel()
	_, admin := startSecured(t)
	for _, name := range []string{"a b", "caf\u00e9", strings.Repeat("u", 129), ""} {
		admin.Do("POST", "/v1/users", []byte(`{"username":"`+name+`","password":"password-1"}`), "Content-Type", "application/json").
			ExpectError(t, http.StatusBadRequest, "invalid_name")
	}
}

// TestUsersNeedSecurity: on a node started without security, user management is refused
// (a user created there would turn security on at the next start with no admin).
func TestUsersNeedSecurity(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.PostJSON("/v1/users", map[string]any{"username": "bob", "password": "bob-password"}).ExpectError(t, http.StatusConflict, "conflict")
	a.Do("PUT", "/v1/users/bob/grants", []byte(`{"grants":[]}`), "Content-Type", "application/json").ExpectError(t, http.StatusConflict, "conflict")
	var l struct{ Users []any }
	if r := a.Get("/v1/users"); r.Expect(t, http.StatusOK) && r.JSON(t, &l) && len(l.Users) != 0 {
		t.Fatalf("users exist on an open node: %v", l.Users)
	}
}

// TestProtectedMetrics: with security on, /metrics (its labels name every topic) needs
// an admin unless --metrics-public; health stays open.
func TestProtectedMetrics(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	admin.createUser("plain", "plain-pass", grant("produce", "*"))
	n.Client().Get("/metrics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
	n.Client().WithBasicAuth("plain", "plain-pass").Get("/metrics").ExpectError(t, http.StatusForbidden, "forbidden")
	admin.Get("/metrics").Expect(t, http.StatusOK)
	n.Client().Get("/healthz").Expect(t, http.StatusOK)
	n.Client().Get("/readyz").Expect(t, http.StatusOK)

	open, _ := startSecured(t, "--metrics-public")
	open.Client().Get("/metrics").Expect(t, http.StatusOK)
	open.Client().Get("/v1/topics").ExpectError(t, http.StatusUnauthorized, "unauthenticated")
}

// TestDebugAddrNeedsLoopback: pprof has no authentication, so a non-loopback
// --debug-addr is refused at start unless --insecure.
func TestDebugAddrNeedsLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:6061"} {
		out, err := runNarad(t, "--http-addr", "127.0.0.1:0", "--debug-addr", addr)
		if err == nil || !strings.Contains(out, "--debug-addr") || !strings.Contains(out, "--insecure") {
			t.Errorf("--debug-addr %s: err %v, output %s; want a refusal naming --debug-addr and --insecure", addr, err, out)
		}
	}
}
