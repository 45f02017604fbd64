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
