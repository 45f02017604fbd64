package partition

import (
	"context"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestARestoreMarksItsIndexAtTheSnapshotsEnd: OffsetAtIndex(index) is where the
// group's entries up to index put the message log's end (the leader reports a
// follower matched up to index as holding that far). A replica restoring its own
// snapshot at its start may hold records of later entries, applied before the
// restart and not replayed yet. On the old code the restore marked its index at the
// log's end then, past the snapshot's end: a follower matched up to that index was
// reported holding messages of later entries.
func TestARestoreMarksItsIndexAtTheSnapshotsEnd(t *testing.T) {
	g, leader, follower, memF := replicaPair(t)
	own, ownIndex := followerSnapshotAfterTwo(t, g, leader, follower)
	for i := range 4 { // offsets 2..5, one entry each, flushed on the follower
		if _, err := leader.Append([]segment.Record{{Value: []byte(fmt.Sprint("later-", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := follower.Flush(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.replicas = []*Partition{leader}
	g.mu.Unlock()
	_ = follower.closeFiles()

	f2 := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = f2.Close() })
	if err := f2.RestoreSnapshot(context.Background(), ownIndex, own, fetchFrom(leader, 100)); err != nil {
		t.Fatal(err)
	}
	if got := f2.OffsetAtIndex(ownIndex); got != 2 {
		t.Errorf("OffsetAtIndex(%d) = %d after restoring the snapshot taken there (its log ended at 2; it holds %d now, from later entries)", ownIndex, got, f2.Stats().End)
	}
	g.mu.Lock()
	for i := ownIndex; i < uint64(len(g.log)); i++ {
		f2.Apply(i+1, g.log[i])
	}
	g.mu.Unlock()
	for idx := ownIndex + 1; idx <= uint64(len(g.log)); idx++ {
		if got, want := f2.OffsetAtIndex(idx), idx; got != want {
			t.Errorf("OffsetAtIndex(%d) = %d after the replay, want %d", idx, got, want)
		}
	}
}
