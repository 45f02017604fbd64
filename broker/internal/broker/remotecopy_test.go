package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
)

// fakeRemote is another cluster's produce-batch route, as a remote child's copy meets
// it: it answers each request with the status its script gives (202 once the script is
// used up) and keeps the origins of the messages it accepted.
type fakeRemote struct {
	srv *httptest.Server

	mu       sync.Mutex
	password string // when set, the only password taken (401 otherwise)
	cluster  string // when set, the cluster id GET /v1/cluster answers
	script   []int  // statuses of the next produce-batch requests
	produces int
	auths    []string // the password of each produce-batch request
	stored   []apigen.MessageOrigin
}

func startFakeRemote(t *testing.T, script ...int) *fakeRemote {
	t.Helper()
	f := &fakeRemote{script: script}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRemote) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	cluster := f.cluster
	f.mu.Unlock()
	if r.Method == http.MethodGet && r.URL.Path == "/v1/cluster" && cluster != "" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"cluster_id":"` + cluster + `"}`))
		return
	}
	var req apigen.ProduceBatchRequest
	if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, `{"error":{"code":"invalid_json","message":"not a produce-batch"}}`, http.StatusBadRequest)
		return
	}
	_, pass, _ := r.BasicAuth()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.produces++
	f.auths = append(f.auths, pass)
	status := http.StatusAccepted
	if f.password != "" && pass != f.password {
		status = http.StatusUnauthorized
	} else if len(f.script) > 0 {
		status, f.script = f.script[0], f.script[1:]
	}
	if status == http.StatusAccepted && (req.ValidateOnly == nil || !*req.ValidateOnly) {
		for _, m := range req.Messages {
			if m.Origin != nil {
				f.stored = append(f.stored, *m.Origin)
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"scripted answer"}}`))
}

func (f *fakeRemote) counts() (produces, stored int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.produces, len(f.stored)
}

// attachFake stores a remote child of parent (one partition) towards f with the given
// cursor, as an attach would once the remote's checks passed.
func attachFake(t *testing.T, b *Broker, f *fakeRemote, parent string, inc, cursor uint64, password string) meta.RemoteChild {
	t.Helper()
	return attachRemoteAt(t, b, f.srv.URL, 1, parent, inc, cursor, password)
}

// attachRemoteAt is attachFake for a remote at url whose topic has remoteParts
// partitions.
func attachRemoteAt(t *testing.T, b *Broker, url string, remoteParts int32, parent string, inc, cursor uint64, password string) meta.RemoteChild {
	t.Helper()
	rc := meta.RemoteChild{Parent: parent, ParentIncarnation: inc, URL: url, Topic: "copy", Username: "copier",
		RemoteIncarnation: "1", RemotePartitions: remoteParts, Start: "earliest", Cursors: []uint64{cursor}}
	var err error
	if rc.Sealed, err = b.sealPassword(password, remoteAAD(rc)); err != nil {
		t.Fatal(err)
	}
	if rc, err = b.meta.AttachRemoteChild(rc); err != nil {
		t.Fatal(err)
	}
	if err := b.reconcile(false); err != nil {
		t.Fatal(err)
	}
	return rc
}

// TestRemoteChildCountsExpiredOnceThroughRetries: messages retention deleted before a
// remote child copied them are counted (metric and log) once, when the cursor moves past
// them, not again at every retry of the batch after them that the remote refused.
func TestRemoteChildCountsExpiredOnceThroughRetries(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1)), RetentionMs: ref(int64(3_600_000))})
	if err != nil {
		t.Fatal(err)
	}
	// Five messages two hours old: retention deletes them (the retention loop runs
	// every 50 ms here).
	old := partition.WallMillis() - 2*3_600_000
	var msgs []Outgoing
	for range 5 {
		msgs = append(msgs, Outgoing{Partition: 0, Value: []byte("old"), Timestamp: old})
	}
	if _, err := b.Produce(ctx, "orders", msgs); err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup("orders")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "retention to delete the old messages", func() bool { return pt.parts()[0].Stats().Oldest == 5 })
	if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: 0, Value: []byte("new")}, {Partition: 0, Value: []byte("new")}}); err != nil {
		t.Fatal(err)
	}

	// The remote refuses the first three batches (503), then takes them.
	f := startFakeRemote(t, http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	rc := attachFake(t, b, f, "orders", m.Incarnation, 0, "remote-password-42")
	name := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
	waitUntil(t, "the copy to pass the new messages", func() bool {
		r, ok := b.meta.RemoteChild(rc.ID)
		return ok && r.Cursors[0] == 7
	})
	if produces, stored := f.counts(); produces != 4 || stored != 2 {
		t.Fatalf("the remote got %d produce-batch requests and stored %d messages, want 4 and 2", produces, stored)
	}
	r, _ := b.meta.RemoteChild(rc.ID)
	if r.Expired[0] != 5 {
		t.Fatalf("the control plane counts %d expired messages, want 5", r.Expired[0])
	}
	// The metric is counted just after the cursor's move commits, so a reader can see
	// the move before the count: wait for it. Once the cursor passed the new messages
	// nothing is retried, so a count above 5 would stay.
	expired := b.metrics.RemoteChild.Expired.WithLabelValues("orders", name)
	waitUntil(t, "the expired messages to be counted", func() bool { return promtest.ToFloat64(expired) >= 5 })
	if got := promtest.ToFloat64(expired); got != 5 {
		t.Fatalf("narad_remote_child_expired_total is %v after the remote refused three batches, want 5 (each expired message counted once)", got)
	}
}

// TestRemoteChildReportsAParentLogThatWentBack: a copy whose cursor is past its
// partition's log end (the parent lost messages the copy had sent: a forced takeover,
// a restore of an older backup) reports it as failing, with a metric, instead of
// showing a healthy copy while the messages stored below the cursor are never copied;
// once the log reaches the cursor the copy goes on and last_error keeps which offsets
// were not copied.
func TestRemoteChildReportsAParentLogThatWentBack(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	one := []Outgoing{{Partition: 0, Value: []byte("m")}}
	for range 2 {
		if _, err := b.Produce(ctx, "orders", one); err != nil {
			t.Fatal(err)
		}
	}
	// The cursor stands at 5 (the copy had sent offsets 0 to 4), the log ends at 2.
	f := startFakeRemote(t)
	rc := attachFake(t, b, f, "orders", m.Incarnation, 5, "remote-password-42")
	name := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
	lag := func() RemoteLag {
		infos, err := b.RemoteChildren("orders")
		if err != nil || len(infos) != 1 {
			t.Fatalf("children: %v %v", infos, err)
		}
		return infos[0].Lag[0]
	}
	waitUntil(t, "the copy to report the log behind its cursor", func() bool {
		l := lag()
		return l.State == "failing" && l.Reason == sourceBehind
	})
	if got := promtest.ToFloat64(b.metrics.RemoteChild.Failures.WithLabelValues("orders", name, "source_behind")); got < 1 {
		t.Fatalf("narad_remote_child_failures_total{reason=source_behind} is %v, want 1 or more", got)
	}
	// Four more messages: offsets 2 to 4 are below the cursor, 5 is copied.
	for range 4 {
		if _, err := b.Produce(ctx, "orders", one); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the copy to go on from its cursor", func() bool {
		r, ok := b.meta.RemoteChild(rc.ID)
		return ok && r.Cursors[0] == 6
	})
	f.mu.Lock()
	stored := append([]apigen.MessageOrigin(nil), f.stored...)
	f.mu.Unlock()
	if len(stored) != 1 || stored[0].Offset != 5 {
		t.Fatalf("the remote stored %+v, want only offset 5", stored)
	}
	waitUntil(t, "the copy to be copying again", func() bool { return lag().State == "copying" })
	if l := lag(); l.LastError != "messages at offsets 2 to 4 were stored after this partition's log went back, below the copy's cursor, and are never copied" {
		t.Fatalf("last_error %q, want it to name the offsets not copied", l.LastError)
	}
}

// TestRemoteChildCredentialsUpdatedInPlace: when the remote user's password changes the
// copy fails with 401 (unauthenticated, with the reason saying what to do); once the
// new password is given for the child it goes on from its cursor, so every message
// reaches the remote once: none lost, none sent again. A password the remote refuses
// is not stored.
func TestRemoteChildCredentialsUpdatedInPlace(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	f := startFakeRemote(t)
	f.password = "first-password-1"
	rc := attachFake(t, b, f, "orders", m.Incarnation, 0, "first-password-1")
	id := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
	produce := func(n int) {
		for range n {
			if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cursor := func() uint64 {
		r, _ := b.meta.RemoteChild(rc.ID)
		return r.Cursors[0]
	}
	produce(3)
	waitUntil(t, "the first three messages to be copied", func() bool { return cursor() == 3 })

	// The remote's password changes: the copy is refused.
	f.mu.Lock()
	f.password = "second-password-2"
	f.mu.Unlock()
	produce(3)
	waitUntil(t, "the copy to fail on the old password", func() bool {
		infos, err := b.RemoteChildren("orders")
		return err == nil && len(infos) == 1 && infos[0].State == "failing" && infos[0].Lag[0].Reason != "" &&
			promtest.ToFloat64(b.metrics.RemoteChild.Failures.WithLabelValues("orders", id, "unauthenticated")) >= 1
	})

	// A password the remote refuses is not stored.
	before, _ := b.meta.RemoteChild(rc.ID)
	if err := b.UpdateRemoteCredentials(ctx, "orders", id, "wrong-password-3"); !errors.Is(err, ErrRemoteRefused) {
		t.Fatalf("a password the remote refuses: %v, want ErrRemoteRefused", err)
	}
	if after, _ := b.meta.RemoteChild(rc.ID); !bytes.Equal(after.Sealed, before.Sealed) {
		t.Fatal("a password the remote refused was stored")
	}
	if err := b.UpdateRemoteCredentials(ctx, "orders", "remote:999", "second-password-2"); !errors.Is(err, ErrChildNotFound) {
		t.Fatalf("an unknown remote child: %v, want ErrChildNotFound", err)
	}

	// The new password: the copy goes on from its cursor.
	if err := b.UpdateRemoteCredentials(ctx, "orders", id, "second-password-2"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the copy to go on with the new password", func() bool { return cursor() == 6 })
	waitUntil(t, "the child to be running again", func() bool {
		infos, err := b.RemoteChildren("orders")
		return err == nil && len(infos) == 1 && infos[0].State == "running"
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.stored) != 6 {
		t.Fatalf("the remote stored %d messages, want 6 (each once)", len(f.stored))
	}
	for i, o := range f.stored {
		if o.Offset != int64(i) {
			t.Fatalf("the remote stored offsets %+v, want 0 to 5 once each", f.stored)
		}
	}
	if r, _ := b.meta.RemoteChild(rc.ID); bytes.Contains(r.Sealed, []byte("second-password-2")) {
		t.Fatal("the new password is stored in clear")
	}
}

// TestRemoteClientFollowsNoRedirect: a remote that answers a redirect does not send the
// copy, or the credentials, elsewhere (here another port of the same host, to which Go's
// client would forward the Authorization header): the answer is a refusal the child
// reports.
func TestRemoteClientFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var elsewhere []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pass, _ := r.BasicAuth()
		mu.Lock()
		elsewhere = append(elsewhere, r.Method+" "+r.URL.Path+" password="+pass)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer other.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	cl, err := newRemoteClient(redirecting.URL, "orders", "copier", "remote-password-42", "")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	err = cl.produceBody(context.Background(), []byte(`{"messages":[{"payload":1}]}`))
	var ae *RemoteAnswerError
	if !errors.As(err, &ae) || ae.Status != http.StatusTemporaryRedirect {
		t.Errorf("produce through a redirect: %v, want the 307 as the remote's answer", err)
	}
	if class, reason := remoteFailure(err, remoteTarget{url: redirecting.URL, topic: "orders", user: "copier"}); class != "refused" || !strings.Contains(reason, "redirect") {
		t.Errorf("a redirect is reported as %s: %s", class, reason)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(elsewhere) != 0 {
		t.Fatalf("the redirect's target got %v", elsewhere)
	}
}

// TestRemoteURLRefusesLinkLocal: a remote child cannot make a node send requests to a
// link-local address, where clouds serve instance metadata and the node's credentials:
// refused at attach for an address in the URL, and at each connection for a name that
// resolves there (checked on the dialled address, so DNS rebinding does not pass).
// Loopback and private addresses, where clusters live, stay allowed.
func TestRemoteURLRefusesLinkLocal(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://169.254.169.254", "http://169.254.169.254:80", "https://[fe80::1%25eth0]:7942",
		"http://[::ffff:169.254.169.254]", "http://[fd00:ec2::254]"} {
		if _, err := checkRemoteURL(u); err == nil || !strings.Contains(err.Error(), "link-local") {
			t.Errorf("%s: %v, want a refusal naming link-local", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:7942", "http://10.1.2.3:7942", "https://[::1]:7942", "https://dr.example:7942"} {
		if _, err := checkRemoteURL(u); err != nil {
			t.Errorf("%s: %v, want it allowed", u, err)
		}
	}
	// A name that resolved to a link-local address: the connection is refused before
	// it is made (the base is set past the URL check, as a rebinding name would pass it).
	cl, err := newRemoteClient("http://127.0.0.1:1", "orders", "copier", "remote-password-42", "")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	cl.base = "http://169.254.169.254:80"
	start := time.Now()
	if err := cl.produceBody(context.Background(), []byte(`{}`)); !errors.Is(err, errForbiddenRemote) {
		t.Fatalf("a connection to a link-local address: %v, want errForbiddenRemote", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the refusal took %v: the connection was tried", d)
	}
}

// reopenPart does to partition i of t what followPlacement does when a move places a
// replica on this node or its group changes: the partition object is replaced in the
// same topic (the old one closed first; none held while pause runs).
func reopenPart(t *testing.T, b *Broker, pt *topic, i int, pause func()) {
	t.Helper()
	if lp := pt.parts()[i]; lp != nil {
		pt.setPart(i, nil)
		if err := lp.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if pause != nil {
		pause()
	}
	p, err := b.openPart(pt, *pt.cur.Load(), int32(i))
	if err != nil {
		t.Fatal(err)
	}
	pt.setPart(i, p)
	pt.sig.broadcast()
}

// TestRemoteChildFollowsAReopenedPartition: a parent partition replaced on this node (a
// move placed a replica here, or its group was made again by a forced takeover) is
// copied on: the copy follows the partition the topic holds now, not the one it started
// with, and a partition not held here when the copy started is copied once it is.
func TestRemoteChildFollowsAReopenedPartition(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup("orders")
	if err != nil {
		t.Fatal(err)
	}
	produce := func() {
		t.Helper()
		if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
			t.Fatal(err)
		}
	}
	f := startFakeRemote(t)
	var rc meta.RemoteChild
	// Not held here when the child is attached (and its copy starts): held a moment
	// later.
	reopenPart(t, b, pt, 0, func() { rc = attachFake(t, b, f, "orders", m.Incarnation, 0, "remote-password-42") })
	cursor := func() uint64 {
		r, _ := b.meta.RemoteChild(rc.ID)
		return r.Cursors[0]
	}
	produce()
	waitUntil(t, "the partition placed here after the attach to be copied", func() bool { return cursor() == 1 })
	// Replaced while the copy runs.
	reopenPart(t, b, pt, 0, nil)
	produce()
	waitUntil(t, "the reopened partition to be copied", func() bool { return cursor() == 2 })
	if _, stored := f.counts(); stored != 2 {
		t.Fatalf("the remote stored %d messages, want 2", stored)
	}
}

// TestRemoteChildMetricsGoWithIt: a detached remote child leaves no metric series
// behind (each attach is a new child id: the series would pile up).
func TestRemoteChildMetricsGoWithIt(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	f := startFakeRemote(t, http.StatusServiceUnavailable)
	rc := attachFake(t, b, f, "orders", m.Incarnation, 0, "remote-password-42")
	if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the copy", func() bool {
		r, _ := b.meta.RemoteChild(rc.ID)
		return r.Cursors[0] == 1
	})
	series := func() int {
		rm := b.metrics.RemoteChild
		return promtest.CollectAndCount(rm.Copied) + promtest.CollectAndCount(rm.Failures) + promtest.CollectAndCount(rm.Expired) +
			promtest.CollectAndCount(rm.State) + promtest.CollectAndCount(rm.Lag)
	}
	if n := series(); n < 4 {
		t.Fatalf("%d remote-child series while attached, want copied, failures, state and lag", n)
	}
	if err := b.DetachRemoteChild(ctx, "orders", RemoteChildPrefix+strconv.FormatUint(rc.ID, 10)); err != nil {
		t.Fatal(err)
	}
	if n := series(); n != 0 {
		t.Fatalf("%d remote-child series left after the detach, want 0", n)
	}
}
