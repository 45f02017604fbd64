package partition

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestASnapshotDuringReplayDescribesTheAppliedEntriesOnly: after a power cut that
// tore an append command, a replica with no snapshot of its group applies the
// group's log again from its first entry. Its message log still holds the records
// of entries it has not applied again yet (what the disk kept of them, up to a torn
// one). raftetcd takes a snapshot once enough entries were applied since the last
// (every Options.SnapshotEvery, or the owed first snapshot of a group made over
// data), which can fall in the middle of that replay (the applied entries come in
// batches). The snapshot is the state at its index: it must not take the log's end
// then for the group's end there. On the old code it did, and set the replica's idea
// of where the group's next append starts (vend) inside the torn command: that
// command, and every later one, was taken for a stale one and skipped. The replica
// never held another message (and, leading, stored new ones at offsets where the
// others held none); a replica restoring that snapshot did the same.
func TestASnapshotDuringReplayDescribesTheAppliedEntriesOnly(t *testing.T) {
	g, leader, f2 := tornFollower(t)
	end := f2.Stats().End
	t.Logf("after the restart the follower's log ends at %d (inside the command at 2..5)", end)
	if end <= 2 || end >= 6 {
		t.Fatalf("the test needs the follower's log to end inside the torn command (2..6), it ends at %d", end)
	}
	// The replay's first batch: the two entries before the torn command. A snapshot
	// is due there.
	g.mu.Lock()
	f2.Apply(1, g.log[0])
	f2.Apply(2, g.log[1])
	g.mu.Unlock()
	snap, snapErr := f2.SnapshotState()
	if snapErr == nil {
		s, err := decodeSnapState(snap)
		if err != nil {
			t.Fatal(err)
		}
		if s.end != 2 {
			t.Errorf("a snapshot at index 2 (the group's log ends at offset 2 there) says the log ends at %d", s.end)
		}
	} else {
		t.Logf("the snapshot is refused mid-replay: %v", snapErr)
	}
	// The rest of the replay, then the replica takes appends again.
	g.mu.Lock()
	for i := 2; i < len(g.log); i++ {
		f2.Apply(uint64(i+1), g.log[i])
	}
	g.replicas = []*Partition{leader, f2}
	g.mu.Unlock()
	appendN(t, leader, 3) // offsets 6..8

	want, err := leader.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f2.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("the follower holds %d messages, the leader %d: it skipped the torn command's rest and every later append", len(got), len(want))
	}
	for i := range want {
		if string(got[i].Value) != string(want[i].Value) {
			t.Errorf("offset %d: the follower holds %q, the leader %q", i, got[i].Value, want[i].Value)
		}
	}
	// Caught up, it snapshots again, at the group's end.
	if s, err := f2.SnapshotState(); err != nil {
		t.Errorf("a caught-up replica takes no snapshot: %v", err)
	} else if st, err := decodeSnapState(s); err != nil || st.end != leader.Stats().End {
		t.Errorf("a caught-up replica's snapshot ends at %d (%v), the leader's log at %d", st.end, err, leader.Stats().End)
	}
	// A replica restoring that snapshot must not be led astray either.
	if snapErr == nil {
		fresh := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 2} })
		t.Cleanup(func() { _ = fresh.Close() })
		if err := fresh.RestoreSnapshot(context.Background(), 2, snap, fetchFrom(leader, 100)); err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		for i := 2; i < len(g.log); i++ {
			fresh.Apply(uint64(i+1), g.log[i])
		}
		g.mu.Unlock()
		if got := fresh.Stats().End; got != leader.Stats().End {
			t.Errorf("a replica restoring the snapshot taken mid-replay ends at %d, the leader at %d", got, leader.Stats().End)
		}
	}
}

// TestASnapshotDuringReplayAfterARestoreEndsAtTheGroupsEnd: the same as
// TestASnapshotDuringReplayDescribesTheAppliedEntriesOnly for a replica that restored
// its own snapshot at its start (so it knows where the group's history puts the log's
// end): a snapshot due before the replay reached the torn command must say the log
// ends where the group's entries up to its index put it, not where the log ends now.
// On the old code it said the latter; the replica restoring it at its next start took
// that offset, inside the torn command, for the group's next append's: the command's
// rest and every later append were skipped as stale.
func TestASnapshotDuringReplayAfterARestoreEndsAtTheGroupsEnd(t *testing.T) {
	g, leader, follower, memF := replicaPair(t)
	own, ownIndex := followerSnapshotAfterTwo(t, g, leader, follower)
	batch := make([]segment.Record, 4)
	for i := range batch {
		batch[i] = segment.Record{Value: []byte(fmt.Sprintf("batch-%d", i))}
	}
	if _, err := leader.Append(batch); err != nil { // offsets 2..5, unsynced on the follower
		t.Fatal(err)
	}
	g.mu.Lock()
	g.replicas = []*Partition{leader}
	g.mu.Unlock()
	powerCutHalfway(t, memF, follower)

	restart := func(snapIndex uint64, snap []byte, stopAt uint64) (*Partition, []byte) {
		p := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
		if err := p.RestoreSnapshot(context.Background(), snapIndex, snap, fetchFrom(leader, 100)); err != nil {
			t.Fatal(err)
		}
		var mid []byte
		g.mu.Lock()
		defer g.mu.Unlock()
		for i := snapIndex; i < uint64(len(g.log)); i++ {
			if i == stopAt {
				// A snapshot falls due here, before the torn command is applied again.
				if s, err := p.SnapshotState(); err == nil {
					mid = s
				} else {
					t.Logf("the snapshot is refused mid-replay: %v", err)
				}
			}
			p.Apply(i+1, g.log[i])
		}
		return p, mid
	}
	f2, mid := restart(ownIndex, own, ownIndex)
	if end := f2.Stats().End; end != 6 {
		t.Fatalf("after the replay the follower's log ends at %d, want 6", end)
	}
	if mid == nil {
		return
	}
	s, err := decodeSnapState(mid)
	if err != nil {
		t.Fatal(err)
	}
	if s.end != 2 {
		t.Errorf("a snapshot at index %d (where the group's log ends at offset 2) says the log ends at %d", ownIndex, s.end)
	}
	// The follower's next start restores that snapshot (its newest), and applies what
	// follows it.
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	f3, _ := restart(ownIndex, mid, 0)
	t.Cleanup(func() { _ = f3.Close() })
	g.mu.Lock()
	g.replicas = []*Partition{leader, f3}
	g.mu.Unlock()
	appendN(t, leader, 3) // offsets 6..8
	if got, want := f3.Stats().End, leader.Stats().End; got != want {
		t.Errorf("the follower's log ends at %d, the leader's at %d: it skipped appends as stale", got, want)
	}
}

// TestASnapshotRefusedMidReplayIsErrReplaying: the refusal of a snapshot while the
// replica applies its group's log again is ErrReplaying, which the broker hands to
// raftetcd as a deferral (tried again later, not logged as a failure each time); once
// the replay reached the log's end the snapshot is taken.
func TestASnapshotRefusedMidReplayIsErrReplaying(t *testing.T) {
	g, _, f2 := tornFollower(t)
	g.mu.Lock()
	f2.Apply(1, g.log[0])
	f2.Apply(2, g.log[1])
	g.mu.Unlock()
	if _, err := f2.SnapshotState(); !errors.Is(err, ErrReplaying) {
		t.Fatalf("a snapshot in the middle of the replay: %v; want ErrReplaying", err)
	}
	g.mu.Lock()
	for i := 2; i < len(g.log); i++ {
		f2.Apply(uint64(i+1), g.log[i])
	}
	g.mu.Unlock()
	if _, err := f2.SnapshotState(); err != nil {
		t.Fatalf("a snapshot once the replay reached the log's end: %v", err)
	}
}

// TestASnapshotDuringReplayAfterARestoreSettlesNothingPastItsEnd: as
// TestASnapshotDuringReplayAfterARestoreEndsAtTheGroupsEnd, with the messages of the
// later entries acked before the stop. The replica's settle journal gives those acks
// back at its start, so its queue's frontier is past where the group's entries up to
// the snapshot's index put the log's end. The snapshot must cut its frontier and
// acked-ahead offsets to that end (the acks are the later entries' to apply): a
// frontier past the snapshot's end makes a snapshot no replica can restore (raftetcd
// retries a failed restore for ever, so a replica needing it never catches up), and
// this replica restores its newest snapshot at every start.
func TestASnapshotDuringReplayAfterARestoreSettlesNothingPastItsEnd(t *testing.T) {
	g, leader, follower, memF := replicaPair(t)
	own, ownIndex := followerSnapshotAfterTwo(t, g, leader, follower)
	appendN(t, leader, 4) // offsets 2..5
	ds := leaseAll(t, leader)
	if len(ds) != 6 {
		t.Fatalf("leased %d, want 6", len(ds))
	}
	for _, d := range ds[:5] { // 0..4 acked, 5 is not
		if err := settleOne(leader, d); err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	g.replicas = []*Partition{leader}
	g.mu.Unlock()
	if err := follower.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}

	// The follower's next start restores its own snapshot (its log ends at offset 2
	// there), and a snapshot falls due before the replay applies the entry after it.
	f2 := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = f2.Close() })
	if err := f2.RestoreSnapshot(context.Background(), ownIndex, own, fetchFrom(leader, 100)); err != nil {
		t.Fatal(err)
	}
	if st := f2.Stats(); st.Frontier != 5 {
		t.Fatalf("frontier %d after the start, want 5 (the journal's acks)", st.Frontier)
	}
	mid, err := f2.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeSnapState(mid)
	if err != nil {
		t.Fatalf("the snapshot taken at index %d does not decode: %v", ownIndex, err)
	}
	if s.end != 2 || s.frontier != 2 || len(s.ackedAhead) != 0 {
		t.Errorf("a snapshot at index %d (the log ends at offset 2 there) says end %d, frontier %d, acked ahead %v; want 2, 2, none",
			ownIndex, s.end, s.frontier, s.ackedAhead)
	}

	// A replica restoring it, then applying the entries after it, holds what the
	// leader holds: five messages acked, the sixth not.
	fresh := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 2} })
	t.Cleanup(func() { _ = fresh.Close() })
	if err := fresh.RestoreSnapshot(context.Background(), ownIndex, mid, fetchFrom(leader, 100)); err != nil {
		t.Fatalf("restoring the snapshot taken mid-replay: %v", err)
	}
	g.mu.Lock()
	for i := ownIndex; i < uint64(len(g.log)); i++ {
		fresh.Apply(i+1, g.log[i])
	}
	g.mu.Unlock()
	if st, want := fresh.Stats(), leader.Stats(); st.End != want.End || st.Frontier != want.Frontier || st.Backlog != want.Backlog {
		t.Errorf("the replica restoring the snapshot: end %d, frontier %d, backlog %d; the leader: %d, %d, %d",
			st.End, st.Frontier, st.Backlog, want.End, want.Frontier, want.Backlog)
	}
}
