package raftetcd

import (
	"testing"
	"time"
)

// TestAsyncWritesToTheWALStoreAreSynced: with AsyncStorageWrites the append worker
// hands the store a Ready it builds itself. The prototype store (StoreWAL, the default)
// syncs only when the Ready says MustSync, so a worker that left it unset had every
// append acknowledged (here: committed and applied by a group of one) and every vote
// sent before anything reached the disk. Each proposal must cost a sync round.
func TestAsyncWritesToTheWALStoreAreSynced(t *testing.T) {
	ns := startNodes(t, 1, 1, func(o *Options) { o.AsyncStorageWrites = true }, func(int) {})
	n := ns[0]
	g := groupName(0)
	poll(t, 10*time.Second, "a leader", func() bool { i, _ := n.host.Info(g); return i.Leader })
	for k := range 5 {
		before := n.sg.Stats().Rounds
		propose(t, n, g)
		if after := n.sg.Stats().Rounds; after == before {
			t.Fatalf("proposal %d committed and applied with no sync round (rounds %d before, %d after)", k, before, after)
		}
	}
}
