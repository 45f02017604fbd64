package broker

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// TestRemoteChildUpdateNeverSendsTheStoredPasswordElsewhere: the stored password of a
// remote child is never shown, so a change of where it is sent (a new URL, or new CA
// certificates that decide which server is trusted) must come with the password: a
// user who may change the child but does not know the remote user's password (the
// parent's owner, when an admin attached it) could otherwise point the child at a
// server of theirs and read the password from the Basic auth header of the first
// request. The server named is not even asked.
func TestRemoteChildUpdateNeverSendsTheStoredPasswordElsewhere(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "the-secret-password-1"
	dr := startFakeRemote(t)
	dr.cluster, dr.password = "dr-cluster", secret
	rc := attachFake(t, b, dr, "orders", m.Incarnation, 0, secret)
	id := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)

	// The attacker's server: it tells the child's cluster id (shown in every listing)
	// and takes any produce, and keeps every password it is sent.
	var mu sync.Mutex
	var got []string
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, p, ok := r.BasicAuth(); ok {
			mu.Lock()
			got = append(got, p)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/cluster" {
			_, _ = w.Write([]byte(`{"cluster_id":"dr-cluster"}`))
			return
		}
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{}`))
	}))
	defer evil.Close()
	str := func(s string) *string { return &s }
	var ie *InvalidError
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(evil.URL)}); !errors.As(err, &ie) {
		t.Errorf("a new URL without the password: %v, want an invalid argument", err)
	}
	mu.Lock()
	sent := append([]string(nil), got...)
	mu.Unlock()
	for _, p := range sent {
		if p == secret {
			t.Fatalf("the stored password was sent to the server a new URL named: %q", sent)
		}
	}
	if r, _ := b.meta.RemoteChild(rc.ID); r.URL != dr.srv.URL {
		t.Fatalf("the child now copies to %s", r.URL)
	}

	// New CA certificates decide which server an https URL's password goes to: the
	// password too, then.
	ca := testCAPEM(t)
	hrc := meta.RemoteChild{Parent: "orders", ParentIncarnation: m.Incarnation, URL: "https://127.0.0.1:1", Topic: "copy", Username: "copier",
		CAPEM: ca, RemoteIncarnation: "1", RemotePartitions: 1, Start: "earliest", Cursors: []uint64{0}}
	if hrc.Sealed, err = b.sealPassword(secret, remoteAAD(hrc)); err != nil {
		t.Fatal(err)
	}
	if hrc, err = b.meta.AttachRemoteChild(hrc); err != nil {
		t.Fatal(err)
	}
	hid := RemoteChildPrefix + strconv.FormatUint(hrc.ID, 10)
	for _, pem := range []string{"", ca + "\n"} { // none (the system's CAs), or other ones
		if _, err := b.UpdateRemoteChild(ctx, "orders", hid, RemoteUpdate{CAPEM: str(pem)}); !errors.As(err, &ie) {
			t.Errorf("ca_pem %.30q without the password: %v, want an invalid argument", pem, err)
		}
	}
	if r, _ := b.meta.RemoteChild(hrc.ID); r.CAPEM != ca {
		t.Fatal("the https child's CA certificates changed")
	}
	// With the password, a new URL is asked (and refused here: the produce is refused).
	dr2 := startFakeRemote(t, 403)
	dr2.cluster = "dr-cluster"
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(dr2.srv.URL), Password: str(secret)}); !errors.Is(err, ErrRemoteRefused) {
		t.Errorf("a new URL with the password: %v, want it asked (and refused)", err)
	}
}

// testCAPEM is the PEM of a test server's certificate.
func testCAPEM(t *testing.T) string {
	t.Helper()
	s := httptest.NewTLSServer(http.NotFoundHandler())
	defer s.Close()
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}))
}

// TestRemoteChildUpdateNeedsTheClusterIDItRecorded: a child whose remote told its
// cluster id at attach is moved only to a URL that tells the same id. A remote that
// does not answer it (an error, a 503 while it starts, a proxy that refuses the route)
// cannot show it is the same cluster; the topic incarnation alone does not (another
// cluster's topic of that name, made the same way, has the same one), and a child
// moved there would go on from its cursor into another cluster's topic.
func TestRemoteChildUpdateNeedsTheClusterIDItRecorded(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	const pass = "the-copier-password-1"
	rc := meta.RemoteChild{Parent: "orders", ParentIncarnation: m.Incarnation, URL: "http://127.0.0.1:1", Topic: "copy", Username: "copier",
		RemoteIncarnation: "1", RemoteClusterID: "dr-cluster", RemotePartitions: 1, Start: "earliest", Cursors: []uint64{0}}
	if rc.Sealed, err = b.sealPassword(pass, remoteAAD(rc)); err != nil {
		t.Fatal(err)
	}
	if rc, err = b.meta.AttachRemoteChild(rc); err != nil {
		t.Fatal(err)
	}
	id := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
	silent := startFakeRemote(t) // no cluster id: GET /v1/cluster answers 400
	str := func(s string) *string { return &s }
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(silent.srv.URL), Password: str(pass)}); !errors.Is(err, ErrRemoteRefused) {
		t.Fatalf("a URL that does not tell its cluster id: %v, want ErrRemoteRefused", err)
	}
	if r, _ := b.meta.RemoteChild(rc.ID); r.URL != rc.URL {
		t.Fatalf("the child moved to %s", r.URL)
	}
	silent.mu.Lock()
	silent.cluster = "dr-cluster"
	silent.mu.Unlock()
	if _, err := b.UpdateRemoteChild(ctx, "orders", id, RemoteUpdate{URL: str(silent.srv.URL), Password: str(pass)}); err != nil {
		t.Fatalf("the same URL once it tells the recorded id: %v", err)
	}
}
