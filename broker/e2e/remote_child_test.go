package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// Remote children: two single-node clusters on loopback, the source copying a topic to
// the remote through a TCP proxy the tests cut and restore. The 3 + 3 node version of
// these tests waits for partition replication.

const (
	srcAdminPass = "source-admin-1"
	dstAdminPass = "remote-admin-1"
	copierPass   = "copier-pass-1"
)

// remotePair is a source and a remote cluster, one node each, with security on, a user
// "copier" on the remote that may produce to topics copy.* (and only consume from
// "other"), and a proxy in front of the
// remote.
type remotePair struct {
	src, dst   *testutil.Narad
	sa, da     *api
	proxy      *tcpProxy
	remoteURL  string
	copierPass string
}

func startRemotePair(t *testing.T, srcArgs ...string) *remotePair {
	t.Helper()
	ns := testutil.StartNarads(t,
		testutil.Options{Env: []string{"NARAD_ADMIN_PASSWORD=" + srcAdminPass}, Args: srcArgs},
		testutil.Options{Env: []string{"NARAD_ADMIN_PASSWORD=" + dstAdminPass}})
	p := &remotePair{src: ns[0], dst: ns[1], copierPass: copierPass}
	p.sa = &api{Client: p.src.Client().WithBasicAuth("admin", srcAdminPass), t: t}
	p.da = &api{Client: p.dst.Client().WithBasicAuth("admin", dstAdminPass), t: t}
	p.da.PostJSON("/v1/users", map[string]any{"username": "copier", "password": copierPass,
		"grants": []map[string]any{{"action": "produce", "topics": []string{"copy.*"}}, {"action": "consume", "topics": []string{"other"}}}}).Expect(t, http.StatusCreated)
	p.proxy = startTCPProxy(t, strings.TrimPrefix(p.dst.URL(), "http://"))
	p.remoteURL = "http://" + p.proxy.addr
	return p
}

func (p *remotePair) attach(parent, child string, extra map[string]any) *testutil.Response {
	rm := map[string]any{"url": p.remoteURL, "username": "copier", "password": p.copierPass}
	for k, v := range extra {
		rm[k] = v
	}
	return p.sa.PostJSON(topicPath(parent)+"/children", map[string]any{"child": child, "remote": rm})
}

type remoteChildJSON struct {
	Child         string `json:"child"`
	ID            string `json:"id"`
	State         string `json:"state"`
	PausedReason  string `json:"paused_reason"`
	FanoutDelayMs int64  `json:"fanout_delay_ms"`
	Remote        *struct {
		URL         string `json:"url"`
		Topic       string `json:"topic"`
		Username    string `json:"username"`
		Incarnation string `json:"incarnation"`
		ClusterID   string `json:"cluster_id"`
		Start       string `json:"start"`
	} `json:"remote"`
	Lag []struct {
		Partition        int32   `json:"partition"`
		ParentNextOffset int64   `json:"parent_next_offset"`
		ChildCursor      int64   `json:"child_cursor"`
		Lag              int64   `json:"lag"`
		LagSeconds       float64 `json:"lag_seconds"`
		State            string  `json:"state"`
		Reason           string  `json:"reason"`
		LastError        string  `json:"last_error"`
		Expired          int64   `json:"expired"`
	} `json:"lag"`
}

// remoteChild returns parent's remote child id as listed, and the raw body of the list.
func (a *api) remoteChild(parent, id string) (remoteChildJSON, []byte, bool) {
	a.t.Helper()
	r, err := a.Try(http.MethodGet, topicPath(parent)+"/children", nil)
	if err != nil || r.Status != http.StatusOK {
		return remoteChildJSON{}, nil, false
	}
	var l struct {
		Children []remoteChildJSON `json:"children"`
	}
	if !r.JSON(a.t, &l) {
		return remoteChildJSON{}, r.Body, false
	}
	for _, c := range l.Children {
		if c.ID == id {
			return c, r.Body, true
		}
	}
	return remoteChildJSON{}, r.Body, false
}

func (c remoteChildJSON) totalLag() int64 {
	n := int64(0)
	for _, l := range c.Lag {
		n += l.Lag
	}
	return n
}

// TestRemoteChildCopiesThroughFailures: under a steady load, the remote is killed -9
// and restarted, the network between the clusters is cut and restored, and the source
// is killed -9 and restarted. Afterwards every message the source answered 202 is in
// the remote topic, in the same partition, with its key and timestamp; the copy's lag
// returns to zero; and per source partition the copies arrive without a gap,
// duplicates only as whole re-sent batches (at most one per failure).
func TestRemoteChildCopiesThroughFailures(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createTopic("orders", map[string]any{"partitions": 2})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 2})
	r := p.attach("orders", "copy.orders", nil)
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	if att.ID == "" || att.Remote == nil || att.Remote.Topic != "copy.orders" || bytes.Contains(r.Body, []byte(copierPass)) {
		t.Fatalf("attach answer: %s", r.Body)
	}

	// The producer counts only what the source answered 202; batches of 20, keyed.
	type sent struct {
		part   int32
		offset int64
	}
	var mu sync.Mutex
	acked := map[string]sent{}
	stop := make(chan struct{})
	var producedN atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		pc := p.src.Client().WithBasicAuth("admin", srcAdminPass)
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			var msgs []map[string]any
			var ids []string
			for i := 0; i < 20; i++ {
				id := fmt.Sprintf("m%d-%d", seq, i)
				ids = append(ids, id)
				msgs = append(msgs, map[string]any{"payload": map[string]any{"id": id}, "key": "k" + strconv.Itoa(i%5)})
			}
			body, _ := json.Marshal(map[string]any{"messages": msgs})
			resp, err := pc.Try(http.MethodPost, topicPath("orders")+"/produce-batch", body, "Content-Type", "application/json")
			if err != nil || resp.Status != http.StatusAccepted {
				time.Sleep(20 * time.Millisecond) // the source is down or restarting: the producer backs off
				continue
			}
			var res struct {
				Results []produced `json:"results"`
			}
			if err := json.Unmarshal(resp.Body, &res); err != nil || len(res.Results) != len(ids) {
				t.Errorf("produce-batch answer: %s", resp.Body)
				return
			}
			mu.Lock()
			for i, id := range ids {
				acked[id] = sent{part: res.Results[i].Partition, offset: res.Results[i].Offset}
			}
			mu.Unlock()
			producedN.Add(int64(len(ids)))
			time.Sleep(5 * time.Millisecond)
		}
	}()
	progress := func(what string, n int64) {
		t.Helper()
		at := producedN.Load()
		waitFor(t, 30*time.Second, what, func() bool { return producedN.Load() >= at+n })
	}
	copiedSome := func(what string) {
		t.Helper()
		waitFor(t, 60*time.Second, what, func() bool {
			c, _, ok := p.sa.remoteChild("orders", att.ID)
			return ok && c.State == "running" && c.totalLag() < 200
		})
	}
	progress("the first messages", 400)
	copiedSome("the copy to run")

	// 1. The remote is killed -9 and restarted: the copy reports failing, then catches up.
	p.dst.Kill()
	progress("messages while the remote is down", 200)
	waitFor(t, 30*time.Second, "the child to report failing", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "failing" && c.PausedReason != ""
	})
	p.dst.RestartAfterKill()
	copiedSome("the copy to catch up after the remote restarted")

	// 2. The network between the clusters is cut, then restored.
	p.proxy.Stop()
	progress("messages while the network is cut", 200)
	waitFor(t, 30*time.Second, "the child to report the cut", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "failing"
	})
	p.proxy.Start()
	copiedSome("the copy to catch up after the network returned")

	// 3. The source is killed -9 and restarted: the cursor is where the control plane
	// last committed it.
	p.src.Kill()
	p.src.RestartAfterKill()
	progress("messages after the source restarted", 400)
	close(stop)
	<-done

	var final remoteChildJSON
	waitFor(t, 60*time.Second, "the copy's lag to return to zero", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		final = c
		return ok && c.State == "running" && c.totalLag() == 0
	})
	for _, l := range final.Lag {
		if l.LagSeconds != 0 || l.Expired != 0 || l.State != "copying" {
			t.Errorf("partition %d after catching up: %+v", l.Partition, l)
		}
	}

	// The checker. Every message the source holds (those it answered 202 and those a
	// kill cut off before the answer) is in the remote, in the same partition, with its
	// key; the first copy carries its timestamp. Per partition the remote holds the
	// source's offsets in order, each run either continuing or starting again within
	// the last batch (a batch sent again). Every acked message is held by the source.
	type pos struct {
		part   int32
		offset int64
		m      message
	}
	srcOf := map[string]pos{}
	idOf := func(m message) string {
		var v struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(m.Payload, &v); err != nil || v.ID == "" {
			t.Fatalf("%s: payload %s", m.where(), m.Payload)
		}
		return v.ID
	}
	for part := int32(0); part < 2; part++ {
		for _, m := range p.sa.readAll("orders", int(part)) {
			srcOf[idOf(m)] = pos{part: part, offset: m.Offset, m: m}
		}
	}
	mu.Lock()
	for id, s := range acked {
		if got, ok := srcOf[id]; !ok || got.part != s.part || got.offset != s.offset {
			t.Errorf("%s: acked at %d/%d, held by the source at %+v (%v)", id, s.part, s.offset, got, ok)
		}
	}
	mu.Unlock()
	byID := map[string]int{}
	resent := 0
	for part := int32(0); part < 2; part++ {
		next := int64(-1) // the next source offset expected: -1 before the first
		for _, m := range p.da.readAll("copy.orders", int(part)) {
			id := idOf(m)
			byID[id]++
			s, ok := srcOf[id]
			if !ok {
				t.Fatalf("remote %s: %s is not a message of the source", m.where(), id)
			}
			if s.part != part {
				t.Errorf("%s: copied into partition %d, stored in %d", id, part, s.part)
			}
			// A re-sent copy's timestamp is raised to the partition's newest (they never
			// decrease): the first copy carries the source's.
			if byID[id] == 1 && (m.Key == nil || s.m.Key == nil || *m.Key != *s.m.Key || m.Timestamp != s.m.Timestamp) {
				t.Errorf("%s: key %v timestamp %d at the remote, %v %d at the source", id, m.Key, m.Timestamp, s.m.Key, s.m.Timestamp)
			}
			switch {
			case next < 0 || s.offset == next:
			case s.offset > next:
				t.Fatalf("partition %d: a gap: source offsets %d to %d never reached the remote", part, next, s.offset-1)
			case next-s.offset > 1000:
				t.Fatalf("partition %d: offset %d sent again after %d: more than one batch", part, s.offset, next-1)
			default:
				resent++
			}
			if s.offset+1 > next {
				next = s.offset + 1
			}
		}
	}
	missing := 0
	for id := range srcOf {
		if byID[id] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of the %d messages the source holds never reached the remote", missing, len(srcOf))
	}
	t.Logf("%d messages acked, %d held by the source, all copied; %d copies were re-sent batches", len(acked), len(srcOf), resent)
}

// TestRemoteChildRefusalsAndStates: an attach is refused with a clear 409 for a wrong
// password, a user without a produce grant, a missing remote topic and an unreachable
// remote, and with 400 for a URL with credentials; pause and resume; a remote topic
// deleted and created again is reported, never written; the password is in no answer
// and not in clear in the control plane's files; a ring of remote children (A to B to
// A) copies each message once; detach forgets the child.
func TestRemoteChildRefusalsAndStates(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createTopic("orders", map[string]any{"partitions": 1})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	p.da.createTopic("other", map[string]any{"partitions": 1})

	wrong := *p
	wrong.copierPass = "not-the-password"
	expectRefusal := func(r *testutil.Response, status int, code, says string) {
		t.Helper()
		if !r.ExpectError(t, status, code) {
			return
		}
		if !strings.Contains(string(r.Body), says) || strings.Contains(string(r.Body), "not-the-password") {
			t.Errorf("refusal %s does not say %q (or shows the password)", r.Body, says)
		}
	}
	expectRefusal(wrong.attach("orders", "copy.orders", nil), http.StatusConflict, "conflict", "refused the credentials")
	expectRefusal(p.attach("orders", "other", nil), http.StatusConflict, "conflict", "may not produce")
	expectRefusal(p.attach("orders", "copy.nope", nil), http.StatusConflict, "conflict", "does not exist on the remote")
	dead := *p
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead.remoteURL = "http://127.0.0.1:" + strconv.Itoa(port)
	expectRefusal(dead.attach("orders", "copy.orders", nil), http.StatusConflict, "conflict", "cannot be reached")
	creds := *p
	creds.remoteURL = "http://copier:x@" + p.proxy.addr
	expectRefusal(creds.attach("orders", "copy.orders", nil), http.StatusBadRequest, "invalid_parameter", "must not hold credentials")
	if got := p.sa.children("orders"); len(got) != 0 {
		t.Fatalf("refused attaches left children: %+v", got)
	}

	// Attach from the earliest message: what the parent already holds is copied too.
	p.sa.produceJSON("orders", map[string]any{"id": "before"}, "")
	r := p.attach("orders", "copy.orders", map[string]any{"start": "earliest"})
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	expectRefusal(p.attach("orders", "copy.orders", nil), http.StatusConflict, "conflict", "already a remote child")
	p.sa.produce("orders", []byte("plain text"), "text/plain", "key=k1")
	p.sa.produce("orders", []byte{0, 1, 2, 255}, "application/octet-stream", "")
	waitFor(t, 30*time.Second, "the copy", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.totalLag() == 0 && len(p.da.readAll("copy.orders", 0)) == 3
	})
	got := p.da.readAll("copy.orders", 0)
	if string(got[0].Payload) != `{"id":"before"}` || string(got[1].Payload) != `"plain text"` || got[1].Key == nil || *got[1].Key != "k1" ||
		!bytes.Equal(got[2].bytesOf(t), []byte{0, 1, 2, 255}) {
		t.Fatalf("copies do not keep their payload kinds and keys: %+v", got)
	}

	// Pause and resume.
	id := topicPath("orders") + "/children/" + att.ID
	p.sa.Do(http.MethodPost, id+"/pause", nil).Expect(t, http.StatusNoContent)
	p.sa.produceJSON("orders", map[string]any{"id": "while-paused"}, "")
	waitFor(t, 30*time.Second, "the child to show paused", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "paused" && c.totalLag() == 1 && c.Lag[0].State == "paused"
	})
	if n := len(p.da.readAll("copy.orders", 0)); n != 3 {
		t.Fatalf("a paused child got a copy: %d messages", n)
	}
	p.sa.Do(http.MethodPost, topicPath("orders")+"/children/copy.orders/pause", nil).ExpectError(t, http.StatusConflict, "conflict")
	p.sa.Do(http.MethodPost, id+"/resume", nil).Expect(t, http.StatusNoContent)
	waitFor(t, 30*time.Second, "the copy to resume", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "running" && c.totalLag() == 0
	})

	// A ring: the remote copies its topic back into the source's. Each message is
	// copied once each way, never again.
	p.sa.PostJSON("/v1/users", map[string]any{"username": "back", "password": "back-pass-1",
		"grants": []map[string]any{{"action": "produce", "topics": []string{"orders"}}}}).Expect(t, http.StatusCreated)
	r = p.da.PostJSON(topicPath("copy.orders")+"/children", map[string]any{"child": "orders",
		"remote": map[string]any{"url": p.src.URL(), "username": "back", "password": "back-pass-1"}})
	var back remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &back) {
		t.FailNow()
	}
	p.sa.produceJSON("orders", map[string]any{"id": "ring-source"}, "")
	p.da.produceJSON("copy.orders", map[string]any{"id": "ring-remote"}, "")
	waitFor(t, 30*time.Second, "the ring to settle", func() bool {
		a, _, ok1 := p.sa.remoteChild("orders", att.ID)
		b, _, ok2 := p.da.remoteChild("copy.orders", back.ID)
		return ok1 && ok2 && a.totalLag() == 0 && b.totalLag() == 0 &&
			len(p.da.readAll("copy.orders", 0)) == 6 && len(p.sa.readAll("orders", 0)) == 6
	})
	// Each side holds its own messages and one copy of the other's, never a copy of a
	// copy.
	for _, side := range []struct {
		a     *api
		topic string
	}{{p.sa, "orders"}, {p.da, "copy.orders"}} {
		ids := map[string]int{}
		for _, m := range side.a.readAll(side.topic, 0) {
			ids[string(m.Payload)]++
		}
		for id, n := range ids {
			if n != 1 {
				t.Errorf("%s holds %s %d times", side.topic, id, n)
			}
		}
		if ids[`{"id":"ring-source"}`] != 1 || ids[`{"id":"ring-remote"}`] != 1 {
			t.Errorf("%s lacks a side of the ring: %v", side.topic, ids)
		}
	}
	p.da.Do(http.MethodDelete, topicPath("copy.orders")+"/children/"+back.ID, nil).Expect(t, http.StatusNoContent)

	// The remote topic deleted and created again: reported, nothing written into it.
	p.da.Do(http.MethodDelete, topicPath("copy.orders"), nil).Expect(t, http.StatusNoContent)
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	p.sa.produceJSON("orders", map[string]any{"id": "after-recreate"}, "")
	waitFor(t, 30*time.Second, "the child to report the recreated remote topic", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "failing" && strings.Contains(c.PausedReason, "deleted and created again") &&
			strings.Contains(c.Lag[0].LastError, "incarnation_mismatch")
	})
	if n := len(p.da.readAll("copy.orders", 0)); n != 0 {
		t.Fatalf("the new remote topic got %d copies", n)
	}

	// The password is in no answer, and not in clear in the control plane's files.
	_, body, _ := p.sa.remoteChild("orders", att.ID)
	if bytes.Contains(body, []byte(copierPass)) {
		t.Fatal("the children list shows the password")
	}
	if m := p.sa.Get("/metrics"); bytes.Contains(m.Body, []byte(copierPass)) {
		t.Fatal("the metrics show the password")
	}
	err = filepath.WalkDir(filepath.Join(p.src.DataDir(), "meta"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(copierPass)) {
			return errors.New(path + " holds the password in clear")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(p.src.Log(), copierPass) {
		t.Fatal("the source's log shows the password")
	}

	// Detach forgets it.
	p.sa.Do(http.MethodDelete, id, nil).Expect(t, http.StatusNoContent)
	if _, _, ok := p.sa.remoteChild("orders", att.ID); ok {
		t.Fatal("the child is still listed after detach")
	}
	p.sa.Do(http.MethodDelete, id, nil).ExpectError(t, http.StatusNotFound, "child_not_found")
}

// tcpProxy forwards connections to a target; Stop cuts every connection and refuses
// new ones until Start, on the same address.
type tcpProxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func startTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	p := &tcpProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.Stop)
	return p
}

func (p *tcpProxy) Start() {
	p.t.Helper()
	var ln net.Listener
	var err error
	// The port was ours a moment ago; on a loaded machine rebinding may take a few tries.
	if !testutil.Poll(10*time.Second, func() bool { ln, err = net.Listen("tcp", p.addr); return err == nil }) {
		p.t.Fatalf("proxy: listening again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
}

func (p *tcpProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // stopped meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Stop closes the listener and cuts every connection.
func (p *tcpProxy) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// TestRemoteChildCLI: `narad topic attach --remote-url` attaches a remote child with the
// password from NARAD_REMOTE_PASSWORD, `children` lists it by id, `pause`, `resume`
// and `detach` take the id; a wrong password exits non-zero with the remote's reason.
func TestRemoteChildCLI(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createTopic("orders", map[string]any{"partitions": 1})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	cli := newCLI(t, p.src.URL(), "NARAD_USER=admin", "NARAD_PASSWORD="+srcAdminPass, "NARAD_REMOTE_PASSWORD="+copierPass)
	type child struct {
		Name   string `json:"name"`
		ID     string `json:"id"`
		State  string `json:"state"`
		Remote *struct {
			URL string `json:"url"`
		} `json:"remote"`
	}
	got := decode[[]child](t, cli.ok("topic", "attach", "orders", "copy.orders", "--remote-url", p.remoteURL, "--remote-user", "copier", "-o", "json"))
	if len(got) != 1 || !strings.HasPrefix(got[0].ID, "remote:") || got[0].Remote == nil || got[0].Remote.URL != p.remoteURL {
		t.Fatalf("attach printed %+v", got)
	}
	id := got[0].ID
	list := decode[[]child](t, cli.ok("topic", "children", "orders", "-o", "json"))
	if len(list) != 1 || list[0].ID != id {
		t.Fatalf("children: %+v", list)
	}
	cli.ok("topic", "pause", "orders", id)
	waitFor(t, 30*time.Second, "the child to show paused", func() bool {
		l := decode[[]child](t, cli.ok("topic", "children", "orders", "-o", "json"))
		return len(l) == 1 && l[0].State == "paused"
	})
	cli.ok("topic", "resume", "orders", id)
	cli.ok("topic", "remote-password", "orders", id) // the same password, from NARAD_REMOTE_PASSWORD
	bad := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(bad, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := cli.exits(1, "topic", "remote-password", "orders", id, "--remote-password-file", bad); !strings.Contains(r.stderr, "new password (401)") ||
		strings.Contains(r.stderr+r.stdout, "not-the-password") {
		t.Fatalf("a wrong new password: %q", r.stderr)
	}
	// The remote is reached at another address from now on: changed in place, the copy
	// goes on from its cursor. Another cluster at the new address is refused.
	copied := func(n int64) func() bool {
		return func() bool {
			c, _, ok := p.sa.remoteChild("orders", id)
			return ok && len(c.Lag) == 1 && c.Lag[0].ParentNextOffset == n && c.Lag[0].ChildCursor == n
		}
	}
	p.sa.produce("orders", []byte("one"), "text/plain", "")
	waitFor(t, 30*time.Second, "the first message to be copied", copied(1))
	// The source cluster has the copier user too, and a topic of the remote's name:
	// only its cluster id tells it apart.
	p.sa.PostJSON("/v1/users", map[string]any{"username": "copier", "password": copierPass,
		"grants": []map[string]any{{"action": "produce", "topics": []string{"copy.*"}}}}).Expect(t, http.StatusCreated)
	p.sa.createTopic("copy.orders", map[string]any{"partitions": 1})
	if r := cli.exits(1, "topic", "remote-update", "orders", id, "--remote-url", p.src.URL()); !strings.Contains(r.stderr, "attach its topic as a new child") {
		t.Fatalf("a new URL reaching another cluster: %q", r.stderr)
	}
	p.proxy.Stop()
	p.sa.produce("orders", []byte("two"), "text/plain", "")
	moved := decode[[]child](t, cli.ok("topic", "remote-update", "orders", id, "--remote-url", p.dst.URL(), "-o", "json"))
	if len(moved) != 1 || moved[0].ID != id || moved[0].Remote == nil || moved[0].Remote.URL != p.dst.URL() {
		t.Fatalf("remote-update printed %+v", moved)
	}
	waitFor(t, 30*time.Second, "the copy to go on at the new address", copied(2))
	var texts []string
	for _, m := range p.da.consumeBatch("copy.orders", 10, "2s") {
		texts = append(texts, string(m.Payload))
	}
	if strings.Join(texts, ",") != `"one","two"` {
		t.Fatalf("the remote topic holds %v, want one and two, once each", texts)
	}
	p.proxy.Start() // for the attach below
	cli.ok("topic", "detach", "orders", id)
	if l := decode[[]child](t, cli.ok("topic", "children", "orders", "-o", "json")); len(l) != 0 {
		t.Fatalf("children after detach: %+v", l)
	}
	wrong := newCLI(t, p.src.URL(), "NARAD_USER=admin", "NARAD_PASSWORD="+srcAdminPass, "NARAD_REMOTE_PASSWORD=not-the-password")
	r := wrong.exits(1, "topic", "attach", "orders", "copy.orders", "--remote-url", p.remoteURL, "--remote-user", "copier")
	if !strings.Contains(r.stderr, "refused the credentials") || strings.Contains(r.stderr+r.stdout, "not-the-password") {
		t.Fatalf("a wrong password: %q", r.stderr)
	}
}

// TestRemoteChildFailsOnePartitionAlone: a message the remote refuses (its schema)
// stops the copy of its partition only, which is reported failing with the reason and
// retried with backoff, not at the pace of the other partition's progress; once the
// remote takes it again, the copy catches up.
func TestRemoteChildFailsOnePartitionAlone(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createTopic("orders", map[string]any{"partitions": 2})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 2,
		"schema": map[string]any{"type": "object", "required": []string{"id"}}})
	r := p.attach("orders", "copy.orders", nil)
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	p.sa.produceJSON("orders", map[string]any{"no-id": 1}, "partition=0")
	waitFor(t, 30*time.Second, "partition 0 to fail", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "failing" && c.Lag[0].State == "failing" && strings.Contains(c.Lag[0].Reason, "refuses the copy")
	})
	failures := func() float64 {
		for _, line := range strings.Split(string(p.sa.Get("/metrics").Body), "\n") {
			if strings.HasPrefix(line, "narad_remote_child_failures_total{") && strings.Contains(line, `reason="refused"`) {
				f, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				return f
			}
		}
		return 0
	}
	before, start := failures(), time.Now()
	for i := 0; time.Since(start) < 3*time.Second; i++ {
		p.sa.produceJSON("orders", map[string]any{"id": strconv.Itoa(i)}, "partition=1")
	}
	// Backoff from 200 ms doubling (±50%) allows about 5 retries in 3 s; retrying at
	// each of partition 1's batches would be hundreds.
	if n := failures() - before; n > 20 {
		t.Fatalf("partition 0 was retried %v times in 3 s while partition 1 copied", n)
	}
	c, _, _ := p.sa.remoteChild("orders", att.ID)
	if c.Lag[1].State != "copying" || c.Lag[0].Lag != 1 {
		t.Fatalf("partition 1 is held up by partition 0, or partition 0 lost its message: %+v", c.Lag)
	}
	p.da.PatchJSON(topicPath("copy.orders"), map[string]any{"schema": map[string]any{}}).Expect(t, http.StatusOK)
	waitFor(t, 30*time.Second, "the copy to catch up once the remote takes the message", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "running" && c.totalLag() == 0
	})
	if got := p.da.readAll("copy.orders", 0); len(got) != 1 || string(got[0].Payload) != `{"no-id":1}` {
		t.Fatalf("partition 0 of the remote: %+v", got)
	}
}

// TestRemoteChildCountsWhatRetentionDeleted: messages the parent's retention deletes
// while the copy is paused are never copied, and are counted (in the list while they
// wait, then in the child's expired count and the metric) and logged; the copy goes on
// from the oldest message left, and every message still held reaches the remote.
func TestRemoteChildCountsWhatRetentionDeleted(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t, "--segment-bytes", "4096", "--retention-interval", "100ms")
	p.sa.createTopic("orders", map[string]any{"partitions": 1, "retention_ms": 1000})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	r := p.attach("orders", "copy.orders", nil)
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	id := topicPath("orders") + "/children/" + att.ID
	p.sa.Do(http.MethodPost, id+"/pause", nil).Expect(t, http.StatusNoContent)
	pad := strings.Repeat("x", 200)
	for i := 0; i < 60; i++ {
		p.sa.produceJSON("orders", map[string]any{"id": i, "pad": pad}, "")
	}
	var waiting remoteChildJSON
	waitFor(t, 30*time.Second, "retention to delete messages the paused copy has not taken", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		waiting = c
		return ok && c.Lag[0].Expired > 0
	})
	// Nothing more is produced, so the segment being written stays: what retention
	// deleted now is all it deletes.
	oldest := p.sa.topic("orders").PartitionStats[0].OldestOffset
	if waiting.Lag[0].Expired > oldest {
		t.Fatalf("listed %d expired, but the oldest offset held is %d", waiting.Lag[0].Expired, oldest)
	}
	p.sa.Do(http.MethodPost, id+"/resume", nil).Expect(t, http.StatusNoContent)
	p.sa.produceJSON("orders", map[string]any{"id": 60, "pad": pad}, "")
	var done remoteChildJSON
	waitFor(t, 30*time.Second, "the copy to catch up", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		done = c
		return ok && c.State == "running" && c.totalLag() == 0
	})
	got := p.da.readAll("copy.orders", 0)
	expired := done.Lag[0].Expired
	if expired == 0 || expired+int64(len(got)) != 61 {
		t.Fatalf("%d expired and %d copied of 61", expired, len(got))
	}
	// What was copied is the tail, in order: the messages after those deleted.
	for i, m := range got {
		var v struct {
			ID int64 `json:"id"`
		}
		if err := json.Unmarshal(m.Payload, &v); err != nil || v.ID != expired+int64(i) {
			t.Fatalf("copy %d is message %d (%v), want %d", i, v.ID, err, expired+int64(i))
		}
	}

	// Paused again until retention deleted everything the copy had not taken: with
	// nothing left to read, the copy still counts them and its lag returns to 0.
	p.sa.Do(http.MethodPost, id+"/pause", nil).Expect(t, http.StatusNoContent)
	for i := 0; i < 30; i++ {
		p.sa.produceJSON("orders", map[string]any{"id": 61 + i, "pad": pad}, "")
	}
	waitFor(t, 30*time.Second, "retention to delete every message held", func() bool {
		s := p.sa.topic("orders").PartitionStats[0]
		return s.OldestOffset == s.NextOffset
	})
	p.sa.Do(http.MethodPost, id+"/resume", nil).Expect(t, http.StatusNoContent)
	waitFor(t, 30*time.Second, "the copy's lag to return to 0 with nothing left to copy", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		done = c
		return ok && c.State == "running" && c.totalLag() == 0
	})
	if done.Lag[0].Expired != expired+30 || len(p.da.readAll("copy.orders", 0)) != len(got) {
		t.Fatalf("expired %d (want %d), the remote holds %d (want %d)", done.Lag[0].Expired, expired+30, len(p.da.readAll("copy.orders", 0)), len(got))
	}
	expired += 30
	if m := string(p.sa.Get("/metrics").Body); !strings.Contains(m, fmt.Sprintf(`narad_remote_child_expired_total{child=%q,parent="orders"} %d`, att.ID, expired)) {
		t.Fatalf("the metric does not count %d expired:\n%s", expired, m)
	}
	if !strings.Contains(p.src.Log(), "deleted by retention before the remote child copied them") {
		t.Fatal("no log line about the messages retention deleted")
	}
}

// TestRemoteChildFromACluster: a source cluster of three nodes, whose parent has two
// partitions of three replicas, copies both to a remote node: each partition's leader
// copies it and commits its cursor through the control plane, and any node lists the
// child. The leader of partition 0 is killed -9: the next leader goes on from the
// cursor and every message reaches the remote. The password is sealed under the
// cluster secret: no node keeps a key file, and no node's meta/ holds it in clear.
func TestRemoteChildFromACluster(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	dst := testutil.StartNarad(t, testutil.Options{Env: []string{"NARAD_ADMIN_PASSWORD=" + dstAdminPass}})
	da := &api{Client: dst.Client().WithBasicAuth("admin", dstAdminPass), t: t}
	da.PostJSON("/v1/users", map[string]any{"username": "copier", "password": copierPass,
		"grants": []map[string]any{{"action": "produce", "topics": []string{"copy.*"}}}}).Expect(t, http.StatusCreated)
	da.createTopic("copy.orders", map[string]any{"partitions": 2})
	a := nodes[0].api
	a.createTopic("orders", map[string]any{"partitions": 2}) // 3 replicas each
	r := a.PostJSON(topicPath("orders")+"/children", map[string]any{"child": "copy.orders",
		"remote": map[string]any{"url": dst.URL(), "username": "copier", "password": copierPass}})
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	// A produce answered 503 during the failover may be stored: it is sent again (a
	// duplicate at the source is a message of its own for the copy).
	produce := func(via *clusterNode, from, to int) {
		for i := from; i < to; i++ {
			body := []byte(fmt.Sprintf(`{"id":%d}`, i))
			waitFor(t, 30*time.Second, fmt.Sprint("message ", i, " accepted"), func() bool {
				r, err := via.api.Try(http.MethodPost, topicPath("orders")+"/produce?partition="+strconv.Itoa(i%2), body, "Content-Type", "application/json")
				return err == nil && r.Status == http.StatusAccepted
			})
		}
	}
	copied := func(via *clusterNode, n int64) bool {
		c, _, ok := via.api.remoteChild("orders", att.ID)
		return ok && c.totalLag() == 0 && len(c.Lag) == 2 && c.Lag[0].ChildCursor >= n && c.Lag[1].ChildCursor >= n
	}
	produce(nodes[1], 0, 20)
	waitFor(t, 60*time.Second, "both partitions to be copied", func() bool { return copied(nodes[1], 10) })
	// The leader of partition 0 copies it; it dies, and the next leader goes on from
	// the cursor the control plane holds.
	lead := leaderOf(t, nodes, "orders", 0)
	lead.Kill()
	via := others(nodes, lead)[0]
	produce(via, 20, 40)
	waitFor(t, 60*time.Second, "the copy to go on after the leader of partition 0 was killed", func() bool { return copied(via, 20) })
	for part := 0; part < 2; part++ {
		ids := map[string]bool{}
		msgs := da.readAll("copy.orders", part)
		for _, m := range msgs {
			ids[string(m.Payload)] = true
		}
		if len(ids) != 20 {
			t.Fatalf("remote partition %d holds %d copies of %d distinct messages, want all 20", part, len(msgs), len(ids))
		}
	}
	lead.Launch()
	if err := lead.WaitReady(); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		if _, err := os.Stat(filepath.Join(nd.DataDir(), "credentials.key")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("node %s keeps a credentials key file (%v); a cluster seals under its secret", nd.id, err)
		}
		err := filepath.WalkDir(filepath.Join(nd.DataDir(), "meta"), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err == nil && bytes.Contains(b, []byte(copierPass)) {
				return errors.New(path + " holds the password in clear")
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
