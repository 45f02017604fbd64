package broker

import (
	"errors"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
)

// TestAReplayingPartitionDefersItsSnapshot: a replicated partition refusing a snapshot
// while it applies its group's log again (partition.ErrReplaying) reaches raftetcd as
// a deferral (raftetcd.ErrSnapshotDeferred), which it tries again without logging a
// failure at every try; any other refusal stays a failure.
func TestAReplayingPartitionDefersItsSnapshot(t *testing.T) {
	err := snapshotErr(partition.ErrReplaying)
	if !errors.Is(err, raftetcd.ErrSnapshotDeferred) || !errors.Is(err, partition.ErrReplaying) {
		t.Errorf("a refusal mid-replay reaches raftetcd as %v; want a deferral that still says why", err)
	}
	other := fmt.Errorf("%w: a write failed", partition.ErrStorage)
	if err := snapshotErr(other); errors.Is(err, raftetcd.ErrSnapshotDeferred) || !errors.Is(err, partition.ErrStorage) {
		t.Errorf("a failed snapshot reaches raftetcd as %v; want it unchanged", err)
	}
	if snapshotErr(nil) != nil {
		t.Error("a snapshot taken reaches raftetcd as a failure")
	}
}
