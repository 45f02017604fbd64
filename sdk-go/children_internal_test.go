package narad

import (
	"testing"

	"github.com/narad-mq/narad/sdk-go/api"
)

// TestChildOfShowsAPause: a paused child's state and reason reach Child; a broker that
// does not send them leaves both empty.
func TestChildOfShowsAPause(t *testing.T) {
	paused, why := api.ChildStatePaused, "the owner alice may no longer consume orders; grant it again"
	got := childOf(api.Child{Child: "orders.copy", State: &paused, PausedReason: &why})
	if got.State != "paused" || got.PausedReason != why {
		t.Fatalf("paused child: %+v", got)
	}
	if got := childOf(api.Child{Child: "orders.copy"}); got.State != "" || got.PausedReason != "" {
		t.Fatalf("child without a state: %+v", got)
	}
}

// TestChildOfShowsARemoteChild: a remote child's id, other end and per-partition state
// reach Child.
func TestChildOfShowsARemoteChild(t *testing.T) {
	id, user, secs, reason, lastErr, expired := "remote:7", "copier", 1.5, "the remote cannot be reached", "dial tcp: refused", int64(3)
	failing, st := api.ChildStateFailing, api.ChildLagStateFailing
	got := childOf(api.Child{Child: "orders", Id: &id, State: &failing,
		Remote: &api.RemoteChild{Url: "https://dr:7942", Topic: "orders", Username: &user, Incarnation: "9", Start: api.RemoteChildStartNow},
		Lag:    &[]api.ChildLag{{Partition: 0, ParentNextOffset: 10, ChildCursor: 4, Lag: 6, LagSeconds: &secs, State: &st, Reason: &reason, LastError: &lastErr, Expired: &expired}}})
	if got.ID != id || got.State != "failing" || got.Remote == nil || got.Remote.URL != "https://dr:7942" || got.Remote.Username != user || got.Remote.Start != "now" {
		t.Fatalf("remote child: %+v", got)
	}
	if l := got.Lag[0]; l.LagSeconds != secs || l.State != "failing" || l.Reason != reason || l.LastError != lastErr || l.Expired != expired || l.Lag != 6 {
		t.Fatalf("remote child's lag: %+v", l)
	}
}
