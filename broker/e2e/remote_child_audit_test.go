package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// TestRemoteChildNewPassword: the remote user's password changes; the copy fails with
// a reason that says what to do; the new password given with PUT …/credentials (by the
// parent's owner or an admin only, checked against the remote first) lets the copy go
// on from its cursor: every message reaches the remote once, none lost, none again.
func TestRemoteChildNewPassword(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createTopic("orders", map[string]any{"partitions": 1})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1})
	r := p.attach("orders", "copy.orders", nil)
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	p.sa.produceJSON("orders", map[string]any{"id": 1}, "")
	waitFor(t, 30*time.Second, "the first copy", func() bool { return len(p.da.readAll("copy.orders", 0)) == 1 })

	// The remote's admin changes the copier's password.
	const newPass = "copier-pass-2"
	body, _ := json.Marshal(map[string]any{"new_password": newPass})
	p.da.Do(http.MethodPut, "/v1/users/copier/password", body, "Content-Type", "application/json").Expect(t, http.StatusNoContent)
	p.sa.produceJSON("orders", map[string]any{"id": 2}, "")
	p.sa.produceJSON("orders", map[string]any{"id": 3}, "")
	waitFor(t, 30*time.Second, "the copy to fail on the old password", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "failing" && strings.Contains(c.PausedReason, "refused the credentials") &&
			strings.Contains(c.PausedReason, "/credentials")
	})

	route := topicPath("orders") + "/children/" + att.ID + "/credentials"
	put := func(a *api, pass string) *testutil.Response {
		b, _ := json.Marshal(map[string]any{"password": pass})
		return a.Do(http.MethodPut, route, b, "Content-Type", "application/json")
	}
	// A user who may consume the parent but does not own it may not.
	p.sa.PostJSON("/v1/users", map[string]any{"username": "reader", "password": "reader-pass-1",
		"grants": []map[string]any{{"action": "consume", "topics": []string{"orders"}}}}).Expect(t, http.StatusCreated)
	reader := &api{Client: p.src.Client().WithBasicAuth("reader", "reader-pass-1"), t: t}
	put(reader, newPass).ExpectError(t, http.StatusForbidden, "forbidden")
	// A password the remote refuses is not stored, and not shown.
	if r := put(p.sa, "still-wrong-9"); r.ExpectError(t, http.StatusConflict, "conflict") &&
		(!strings.Contains(string(r.Body), "new password (401)") || strings.Contains(string(r.Body), "still-wrong-9")) {
		t.Errorf("refusal %s does not say why (or shows the password)", r.Body)
	}
	put(p.sa, "short").ExpectError(t, http.StatusBadRequest, "invalid_json")
	put(p.sa, newPass).Expect(t, http.StatusNoContent)

	waitFor(t, 30*time.Second, "the copy to go on with the new password", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "running" && c.totalLag() == 0
	})
	got := p.da.readAll("copy.orders", 0)
	if len(got) != 3 {
		t.Fatalf("the remote holds %d messages, want 3 (each once)", len(got))
	}
	for i, m := range got {
		if want := `{"id":` + string(rune('1'+i)) + `}`; string(m.Payload) != want {
			t.Fatalf("message %d is %s, want %s", i, m.Payload, want)
		}
	}
	if strings.Contains(p.src.Log(), newPass) || strings.Contains(p.src.Log(), "still-wrong-9") {
		t.Fatal("the source's log shows a password")
	}
}

// TestRemoteChildLastErrorNeedsConsume: a remote child's last_error carries the remote's
// words, which can quote a message (a schema refusal quotes the value that did not
// match): the children list shows it only to a user who may read the parent's messages
// (consume) or an admin; a user with another grant on the parent sees the child, its
// state and reason, but not the remote's message.
func TestRemoteChildLastErrorNeedsConsume(t *testing.T) {
	t.Parallel()
	p := startRemotePair(t)
	p.sa.createTopic("orders", map[string]any{"partitions": 1})
	p.da.createTopic("copy.orders", map[string]any{"partitions": 1,
		"schema": map[string]any{"type": "object", "properties": map[string]any{"card": map[string]any{"type": "string", "pattern": "^x"}}}})
	r := p.attach("orders", "copy.orders", nil)
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	const secret = "4111-1111-secret"
	p.sa.produceJSON("orders", map[string]any{"card": secret}, "")
	waitFor(t, 30*time.Second, "the copy to fail on the remote's schema, quoting the value", func() bool {
		c, _, ok := p.sa.remoteChild("orders", att.ID)
		return ok && c.State == "failing" && strings.Contains(c.Lag[0].LastError, secret)
	})
	p.sa.PostJSON("/v1/users", map[string]any{"username": "writer", "password": "writer-pass-1",
		"grants": []map[string]any{{"action": "produce", "topics": []string{"orders"}}}}).Expect(t, http.StatusCreated)
	p.sa.PostJSON("/v1/users", map[string]any{"username": "reader", "password": "reader-pass-1",
		"grants": []map[string]any{{"action": "consume", "topics": []string{"orders"}}}}).Expect(t, http.StatusCreated)
	writer := &api{Client: p.src.Client().WithBasicAuth("writer", "writer-pass-1"), t: t}
	reader := &api{Client: p.src.Client().WithBasicAuth("reader", "reader-pass-1"), t: t}
	c, body, ok := writer.remoteChild("orders", att.ID)
	if !ok || c.State != "failing" || c.Lag[0].Reason == "" {
		t.Fatalf("a producer of the parent sees %s, want the child failing with its reason", body)
	}
	if strings.Contains(string(body), secret) || c.Lag[0].LastError != "" {
		t.Fatalf("a user who may not consume the parent reads a message through last_error: %s", body)
	}
	if c, _, ok := reader.remoteChild("orders", att.ID); !ok || !strings.Contains(c.Lag[0].LastError, secret) {
		t.Fatalf("a consumer of the parent does not see last_error: %+v", c)
	}
}

// TestRemoteChildCopiesAMovedPartition: a parent partition moved to another node is
// copied by that node from the cursor the control plane holds: every message reaches
// the remote, before and after the move.
func TestRemoteChildCopiesAMovedPartition(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 2, "--auto-rebalance=false")
	atVersion(t, nodes[0], 3)
	dst := testutil.StartNarad(t, testutil.Options{Env: []string{"NARAD_ADMIN_PASSWORD=" + dstAdminPass}})
	da := &api{Client: dst.Client().WithBasicAuth("admin", dstAdminPass), t: t}
	da.PostJSON("/v1/users", map[string]any{"username": "copier", "password": copierPass,
		"grants": []map[string]any{{"action": "produce", "topics": []string{"copy.*"}}}}).Expect(t, http.StatusCreated)
	da.createTopic("copy.orders", map[string]any{"partitions": 1})
	a := nodes[0].api
	a.createTopic("orders", map[string]any{"partitions": 1, "replication_factor": 1})
	r := a.PostJSON(topicPath("orders")+"/children", map[string]any{"child": "copy.orders",
		"remote": map[string]any{"url": dst.URL(), "username": "copier", "password": copierPass}})
	var att remoteChildJSON
	if !r.Expect(t, http.StatusCreated) || !r.JSON(t, &att) {
		t.FailNow()
	}
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			body := []byte(fmt.Sprintf(`{"id":%d}`, i))
			waitFor(t, 30*time.Second, fmt.Sprint("message ", i, " accepted"), func() bool {
				r, err := a.Try(http.MethodPost, topicPath("orders")+"/produce", body, "Content-Type", "application/json")
				return err == nil && r.Status == http.StatusAccepted
			})
		}
	}
	copied := func(n int) bool { return len(da.readAll("copy.orders", 0)) >= n }
	produce(0, 5)
	waitFor(t, 60*time.Second, "the first copies", func() bool { return copied(5) })

	from := leaderOf(t, nodes, "orders", 0)
	to := others(nodes, from)[0]
	mv := startMove(t, nodes[0], "orders", 0, from.id, to.id)
	waitFor(t, 120*time.Second, "the move to end", func() bool {
		for _, m := range moves(nodes[0]) {
			if m.ID == mv.ID {
				if m.Status == "failed" || m.Status == "cancelled" {
					t.Fatalf("move ended %s: %s", m.Status, m.Reason)
				}
				return m.Status == "done"
			}
		}
		return false
	})
	if got := replicasOf(nodes[0], "orders", 0); len(got) != 1 || got[0] != to.id {
		t.Fatalf("partition 0 is on %v after the move, want [%s]", got, to.id)
	}
	produce(5, 10)
	waitFor(t, 60*time.Second, "the copy to go on from the node the partition moved to", func() bool {
		c, _, ok := a.remoteChild("orders", att.ID)
		return ok && c.totalLag() == 0 && c.Lag[0].ChildCursor >= 10 && copied(10)
	})
	ids := map[string]bool{}
	for _, m := range da.readAll("copy.orders", 0) {
		ids[string(m.Payload)] = true
	}
	if len(ids) != 10 {
		t.Fatalf("the remote holds %d distinct messages, want all 10", len(ids))
	}
}
