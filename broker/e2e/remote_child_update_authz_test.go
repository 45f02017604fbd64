package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRemoteChildUpdateNeedsConsume: changing where a remote child copies to is, like
// attaching one, a way to read the parent's messages (they are sent to the new URL, as
// the new user): it needs what attach needs, the parent's owner or an admin who may
// also consume it. An owner who may not consume the parent, whose child an admin
// attached (the copy runs while the admin may consume), could otherwise point it at a
// server of theirs, which echoes the cluster id the listing shows and takes every
// message from the cursor on.
func TestRemoteChildUpdateNeedsConsume(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createUser("owner", "owner-pass-1", grant("create", "orders"), grant("produce", "orders"))
	owner := &api{Client: p.src.Client().WithBasicAuth("owner", "owner-pass-1"), t: t}
	owner.createTopic("orders", map[string]any{"partitions": 1})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	var att remoteChildJSON
	if r := p.attach("orders", "copy.orders", nil); !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) || att.Remote == nil {
		t.FailNow()
	}
	owner.produce("orders", []byte("secret order"), "text/plain", "")
	waitFor(t, 30*time.Second, "the first copy", func() bool { return len(p.da.readAll("copy.orders", 0)) == 1 })

	var asked atomic.Int32
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/cluster":
			_, _ = w.Write([]byte(`{"cluster_id":"` + att.Remote.ClusterID + `"}`))
		default:
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	defer evil.Close()
	body, _ := json.Marshal(map[string]any{"url": evil.URL, "username": "evil", "password": "evil-pass-1"})
	route := topicPath("orders") + "/children/" + att.ID
	owner.Do(http.MethodPatch, route, body, "Content-Type", "application/json").ExpectError(t, http.StatusForbidden, "forbidden")
	if n := asked.Load(); n != 0 {
		t.Fatalf("the server the owner named was asked %d times", n)
	}
	if c, _, ok := p.sa.remoteChild("orders", att.ID); !ok || c.Remote == nil || c.Remote.URL != p.remoteURL {
		t.Fatalf("the child after the refused change: %+v", c)
	}
	// Given consume, the owner may (and could attach such a child anyway).
	p.sa.Do(http.MethodPut, "/v1/users/owner/grants", mustJSON(t, map[string]any{"grants": []map[string]any{
		grant("create", "orders"), grant("produce", "orders"), grant("consume", "orders")}}), "Content-Type", "application/json").Expect(t, http.StatusOK)
	owner.Do(http.MethodPatch, route, body, "Content-Type", "application/json").Expect(t, http.StatusOK)
	if asked.Load() == 0 {
		t.Fatal("an owner who may consume was not let through to the remote's checks")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRemoteChildUpdateRunsAsWhoChangedIt: with security on, a remote child copies
// while the user who attached it may consume its parent. One changed in place to
// another URL or user is, like a new attach, the changer's: when that user loses
// consume on the parent, the copy pauses, though the admin who attached it still may
// consume. Otherwise an owner could point an admin's child at a server of theirs and
// keep receiving the topic's messages after their consume grant was taken away.
func TestRemoteChildUpdateRunsAsWhoChangedIt(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createUser("owner", "owner-pass-1", grant("create", "orders"), grant("consume", "orders"), grant("produce", "orders"))
	owner := &api{Client: p.src.Client().WithBasicAuth("owner", "owner-pass-1"), t: t}
	owner.createTopic("orders", map[string]any{"partitions": 1})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	var att remoteChildJSON
	if r := p.attach("orders", "copy.orders", nil); !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	body := mustJSON(t, map[string]any{"url": p.dst.URL(), "password": p.copierPass})
	owner.Do(http.MethodPatch, topicPath("orders")+"/children/"+att.ID, body, "Content-Type", "application/json").Expect(t, http.StatusOK)
	owner.produce("orders", []byte("one"), "text/plain", "")
	waitFor(t, 30*time.Second, "the first copy", func() bool { return len(p.da.readAll("copy.orders", 0)) == 1 })

	p.sa.Do(http.MethodPut, "/v1/users/owner/grants", mustJSON(t, map[string]any{"grants": []map[string]any{
		grant("create", "orders"), grant("produce", "orders")}}), "Content-Type", "application/json").Expect(t, http.StatusOK)
	waitFor(t, 30*time.Second, "the copy to pause once the user who changed it may not consume", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "paused" && strings.Contains(c.PausedReason, "owner")
	})
	owner.produce("orders", []byte("two"), "text/plain", "")
	if c, _, _ := p.sa.remoteChild("orders", att.ID); c.Lag[0].ChildCursor != 1 {
		t.Fatalf("the paused copy moved on: %+v", c.Lag)
	}
}
