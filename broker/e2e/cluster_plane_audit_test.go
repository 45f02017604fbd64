package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestClusterRemovedMemberIsServedNothing: a decommissioned node that leaves the
// members but whose process is left running still holds the cluster secret, and its copy
// of the metadata stops at its removal. The nodes that hold the partitions must not
// serve it: a user deleted after the removal must not replay a topic through it, with
// messages produced before or after the removal.
func TestClusterRemovedMemberIsServedNothing(t *testing.T) {
	t.Parallel()
	nodes := startSecuredCluster(t)
	holder := placed(t, nodes, "rmv", map[string]any{"partitions": 1})[0]
	ctl := controllerOf(t, nodes...)
	var gone *clusterNode
	for _, nd := range nodes {
		if nd != ctl && nd != holder {
			gone = nd
		}
	}
	holder.api.produce("rmv", []byte("before the removal"), "text/plain", "")
	ctl.api.createUser("eve", "eve-password-1", grant("consume", "rmv"))
	eve := as(t, gone, "eve", "eve-password-1")
	waitFor(t, 30*time.Second, "eve to replay through "+gone.id, func() bool {
		r, err := eve.Try(http.MethodGet, topicPath("rmv")+"/partitions/0/messages", nil)
		return err == nil && r.Status == http.StatusOK && strings.Contains(string(r.Body), "before the removal")
	})

	atVersion(t, ctl, 3) // decommissioning needs cluster version 3 (503 until it is committed)
	r := ctl.api.Do(http.MethodDelete, "/v1/cluster/members/"+gone.id, nil)
	if r.Status != http.StatusAccepted {
		t.Fatalf("DELETE /v1/cluster/members/%s: %d %s", gone.id, r.Status, r.Body)
	}
	waitFor(t, 120*time.Second, gone.id+" to leave the members", func() bool {
		return !strings.Contains(membersOf(t, ctl), gone.id+"@") && !strings.Contains(membersOf(t, holder), gone.id+"@")
	})
	// gone's process runs on; eve is deleted and a message produced after it left.
	ctl.api.Do(http.MethodDelete, "/v1/users/eve", nil).Expect(t, http.StatusNoContent)
	holder.api.produce("rmv", []byte("after the removal"), "text/plain", "")

	// Whatever gone answers (its copy of the users is frozen at its removal), it must
	// not be the partition's messages: the holder refuses a node that is no longer a
	// member. Asked at once, and again once gone knows it has no controller (it then
	// still serves replays of the topics it has open).
	replay := func(when string) {
		t.Helper()
		r, err := eve.Try(http.MethodGet, topicPath("rmv")+"/partitions/0/messages", nil)
		if err != nil {
			t.Fatalf("replay through %s %s: %v", gone.id, when, err)
		}
		if r.Status == http.StatusOK {
			var mr messageRange
			_ = json.Unmarshal(r.Body, &mr)
			t.Fatalf("%s: eve, deleted after %s was removed, replayed %d messages through it (%s)", when, gone.id, len(mr.Messages), r.Body)
		}
		if r.Status != http.StatusServiceUnavailable && r.Status != http.StatusUnauthorized {
			t.Fatalf("replay through the removed %s %s: %d %s, want 503 (or 401)", gone.id, when, r.Status, r.Body)
		}
		if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") == "" {
			t.Errorf("replay through the removed %s %s: 503 without Retry-After", gone.id, when)
		}
		t.Logf("replay through the removed %s %s: %d %s", gone.id, when, r.Status, r.Body)
	}
	replay("at once")
	waitFor(t, 60*time.Second, gone.id+" to know it has no controller", func() bool {
		r, err := gone.api.Try(http.MethodGet, "/readyz", nil)
		return err == nil && r.Status == http.StatusServiceUnavailable
	})
	replay("once not ready")
}
