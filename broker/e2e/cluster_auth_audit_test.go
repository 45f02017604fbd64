package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// startSecuredCluster starts three peers with security on, each with an admin client,
// and waits until they agree on their members.
func startSecuredCluster(t *testing.T) []*clusterNode {
	t.Helper()
	nodes := startPeersClusterEnv(t, 3, []string{"NARAD_ADMIN_PASSWORD=" + adminPass})
	for _, nd := range nodes {
		nd.api = &api{Client: nd.Client().WithBasicAuth("admin", adminPass), t: t}
	}
	agreed(t, wantMembers(nodes...), nodes...)
	return nodes
}

// appliedOn waits until nd has applied every metadata write made through from so far:
// it creates the topic mark through from and waits until nd shows it. The control plane
// applies in log order, so nd then holds every user change made before the mark.
func appliedOn(t *testing.T, from, nd *clusterNode, mark string) {
	t.Helper()
	from.api.createTopic(mark, map[string]any{"partitions": 1, "replication_factor": 1})
	waitFor(t, 30*time.Second, nd.id+" to apply the writes before "+mark, func() bool {
		r, err := nd.api.Try(http.MethodGet, topicPath(mark), nil)
		return err == nil && r.Status == http.StatusOK
	})
}

// as is a client of nd with user's credentials.
func as(t *testing.T, nd *clusterNode, user, pass string) *api {
	return &api{Client: nd.Client().WithBasicAuth(user, pass), t: t}
}

func statusOf(r *testutil.Response, err error) int {
	if err != nil {
		return -1
	}
	return r.Status
}

// TestClusterAuthChangesReachEveryNode: a password change, a revoked grant and a
// deleted user, made through one node, end the old credentials and rights on every
// other node as soon as that node has applied the change, even for a user whose login
// that node had just accepted (and remembers); a user deleted and created again under
// the same name gets nothing of the old one (grants, cached login, owned topics); and a
// node that was behind when a user was created lets the user in on the first try.
func TestClusterAuthChangesReachEveryNode(t *testing.T) {
	t.Parallel()
	nodes := startSecuredCluster(t)
	a, b := nodes[0], nodes[1]
	placed(t, nodes, "aud", map[string]any{"partitions": 1})
	a.api.createUser("bob", "bob-password-1",
		grant("consume", "aud"), grant("produce", "aud"), grant("create", "aud.*"))
	// bob logs in through every node, so each remembers the credential.
	for _, nd := range nodes {
		bob := as(t, nd, "bob", "bob-password-1")
		waitFor(t, 30*time.Second, "bob to consume through "+nd.id, func() bool {
			return statusOf(bob.Try(http.MethodGet, topicPath("aud")+"/consume", nil)) == http.StatusNoContent
		})
	}
	as(t, b, "bob", "bob-password-1").createTopic("aud.bobs", map[string]any{"partitions": 1, "replication_factor": 1})

	// A password change through a: once b has applied it, the old password is refused
	// at once, and the new one is let in.
	a.api.Do(http.MethodPut, "/v1/users/bob/password", []byte(`{"new_password":"bob-password-2"}`), "Content-Type", "application/json").Expect(t, http.StatusNoContent)
	for _, nd := range nodes[1:] {
		appliedOn(t, a, nd, "mark.pw."+nd.id)
		if st := statusOf(as(t, nd, "bob", "bob-password-1").Try(http.MethodGet, "/v1/topics", nil)); st != http.StatusUnauthorized {
			t.Fatalf("the old password via %s after it applied the change: %d, want 401", nd.id, st)
		}
		if st := statusOf(as(t, nd, "bob", "bob-password-2").Try(http.MethodGet, "/v1/topics", nil)); st != http.StatusOK {
			t.Fatalf("the new password via %s: %d, want 200", nd.id, st)
		}
	}

	// A grant revoked through a: refused on b once b has applied it.
	a.api.Do(http.MethodPut, "/v1/users/bob/grants", []byte(`{"grants":[{"action":"produce","topics":["aud"]}]}`), "Content-Type", "application/json").Expect(t, http.StatusOK)
	for _, nd := range nodes[1:] {
		appliedOn(t, a, nd, "mark.grant."+nd.id)
		if st := statusOf(as(t, nd, "bob", "bob-password-2").Try(http.MethodGet, topicPath("aud")+"/consume", nil)); st != http.StatusForbidden {
			t.Fatalf("consume via %s after it applied the revoke: %d, want 403", nd.id, st)
		}
	}

	// Deleted, then created again with the same name and password and other grants:
	// the new bob is another user.
	a.api.Do(http.MethodDelete, "/v1/users/bob", nil).Expect(t, http.StatusNoContent)
	for _, nd := range nodes[1:] {
		appliedOn(t, a, nd, "mark.del."+nd.id)
		if st := statusOf(as(t, nd, "bob", "bob-password-2").Try(http.MethodGet, "/v1/topics", nil)); st != http.StatusUnauthorized {
			t.Fatalf("a deleted user via %s after it applied the delete: %d, want 401", nd.id, st)
		}
	}
	a.api.createUser("bob", "bob-password-2", grant("create", "aud.*"))
	for _, nd := range nodes[1:] {
		newBob := as(t, nd, "bob", "bob-password-2")
		// No waiting: a node that has not applied the create yet catches up first.
		if st := statusOf(newBob.Try(http.MethodGet, "/v1/topics", nil)); st != http.StatusOK {
			t.Fatalf("the new bob via %s: %d, want 200", nd.id, st)
		}
		if st := statusOf(newBob.Try(http.MethodPost, topicPath("aud")+"/produce", []byte(`{}`), "Content-Type", "application/json")); st != http.StatusNotFound {
			t.Fatalf("the new bob produced via %s with the old bob's grant: %d, want 404", nd.id, st)
		}
		if st := statusOf(newBob.Try(http.MethodDelete, topicPath("aud.bobs"), nil)); st != http.StatusForbidden {
			t.Fatalf("the new bob deleted the old bob's topic via %s: %d, want 403", nd.id, st)
		}
	}

	// A node that is behind: c is stopped while carol is created through a, and carol
	// logs in through c the moment it runs again.
	ctl := controllerOf(t, nodes...)
	var c *clusterNode
	for _, nd := range nodes {
		if nd != ctl && nd != a {
			c = nd
		}
	}
	if c == nil { // a is the controller: any other node
		c = others(nodes, a)[0]
	}
	c.Pause()
	a.api.createUser("carol", "carol-password", grant("produce", "aud"))
	c.Resume()
	carol := as(t, c, "carol", "carol-password")
	if r, err := carol.Try(http.MethodGet, "/v1/topics", nil); err != nil || r.Status != http.StatusOK {
		t.Fatalf("carol, created while %s was stopped, logging in through it: %v %v, want 200 at once", c.id, err, r)
	}
}

// TestClusterLongPollEndsWithTheGrant: a consume parked in a long poll on one node was
// authorized when it arrived; a revoke of the user's consume grant, or the deletion of
// the user, made through another node ends it once the parked node has applied it. A
// message produced after that is not handed to the user who lost the right, and it is
// not hidden under their lease either: someone allowed takes it at once.
func TestClusterLongPollEndsWithTheGrant(t *testing.T) {
	t.Parallel()
	nodes := startSecuredCluster(t)
	// A long visibility timeout: a message leased to the parked consume and not given
	// back would stay hidden past the test. The consume parks on b, the node holding
	// the partition (a parked consume of a partition held elsewhere also looks again
	// every so often); the changes are made through another node, a.
	b := placed(t, nodes, "lp", map[string]any{"partitions": 1, "visibility_timeout_ms": 600000})[0]
	a := others(nodes, b)[0]
	for i, how := range []string{"revoke", "delete", "quiet"} {
		user := "dan" + strconv.Itoa(i)
		a.api.createUser(user, "dan-password", grant("consume", "lp"))
		dan := as(t, b, user, "dan-password")
		waitFor(t, 30*time.Second, user+" to consume through "+b.id, func() bool {
			return statusOf(dan.Try(http.MethodGet, topicPath("lp")+"/consume", nil)) == http.StatusNoContent
		})
		type answer struct {
			r   *testutil.Response
			err error
		}
		got := make(chan answer, 1)
		go func() {
			// The longest wait: the change and its application on b fit in it with
			// room to spare. In the quiet case nothing arrives and it ends with its wait.
			r, err := dan.Try(http.MethodGet, topicPath("lp")+"/consume?wait=20s", nil)
			got <- answer{r, err}
		}()
		waitParked(t, b.api, 1)
		switch how {
		case "revoke", "quiet":
			a.api.Do(http.MethodPut, "/v1/users/"+user+"/grants", []byte(`{"grants":[{"action":"produce","topics":["elsewhere"]}]}`), "Content-Type", "application/json").Expect(t, http.StatusOK)
		case "delete":
			a.api.Do(http.MethodDelete, "/v1/users/"+user, nil).Expect(t, http.StatusNoContent)
		}
		appliedOn(t, a, b, "mark.lp."+how)
		if how == "quiet" {
			var ans answer
			select {
			case ans = <-got:
			case <-time.After(60 * time.Second):
				t.Fatalf("quiet: the parked consume did not answer within 60 s")
			}
			if ans.err != nil || ans.r.Status != http.StatusNotFound {
				t.Fatalf("quiet: a poll parked when its grant was revoked, ending with its wait: %v %v, want 404 (not 204: the user may no longer consume)", ans.err, ans.r)
			}
			continue
		}
		a.api.produce("lp", []byte(`{"after":"`+how+`"}`), "application/json", "")
		var ans answer
		select {
		case ans = <-got:
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: the parked consume did not answer within 60 s", how)
		}
		if ans.err != nil {
			t.Fatalf("%s: the parked consume: %v", how, ans.err)
		}
		if ans.r.Status == http.StatusOK {
			t.Fatalf("%s: the parked consume of %s got a message produced after %s applied the %s: %s", how, user, b.id, how, ans.r.Body)
		}
		if ans.r.Status != http.StatusForbidden && ans.r.Status != http.StatusNotFound && ans.r.Status != http.StatusUnauthorized {
			t.Fatalf("%s: the parked consume answered %d %s, want 401, 403 or 404", how, ans.r.Status, ans.r.Body)
		}
		// The message is not hidden under a lease nobody holds.
		m := a.api.consume("lp", "wait=10s")
		if m == nil {
			t.Fatalf("%s: the message produced after the %s is not available to the admin", how, how)
		}
		var body map[string]string
		if err := json.Unmarshal(m.Payload, &body); err != nil || body["after"] != how {
			t.Fatalf("%s: the admin got %s, want the message produced after the %s", how, m.Payload, how)
		}
		a.api.mustAck("lp", m)
	}
}
