package partition

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestAReplicaTornInsideAnAppendCommandCatchesUp: a replica's message log is written
// without sync, and after a power loss the group's log is applied again from its last
// snapshot. The loss can keep part of one append command's records (the unsynced
// bytes of one write, torn at a sector, as vfs.Mem keeps a prefix; or a kill during a
// write of several pages): recovery cuts the torn record, and the log ends inside that
// command. The replica must write the rest of it when the command is applied again,
// and hold every later message. On the old code an append was written only at the
// log's end, so the torn command was skipped and every later one too: the replica
// never caught up, and once it led it answered 202 for messages stored at offsets
// where the other replica held others, lost at the next change of leader.
func TestAReplicaTornInsideAnAppendCommandCatchesUp(t *testing.T) {
	g, leader, f2 := tornFollower(t)
	t.Logf("after the restart the follower's log ends at %d", f2.Stats().End)
	rejoin(g, leader, f2)
	appendN(t, leader, 3) // offsets 6..8

	if l, f := leader.Stats().End, f2.Stats().End; f != l {
		t.Errorf("after applying the whole group log the follower's log ends at %d, the leader's at %d: the replicas diverged for good", f, l)
	}

	// The follower becomes leader (a failover, a planned balance) and takes a produce.
	g.mu.Lock()
	g.lead = 1
	g.mu.Unlock()
	leader.SetRole(false, 0)
	f2.SetRole(true, 2)
	off, err := f2.Append([]segment.Record{{Value: []byte("answered-202")}})
	if err != nil {
		t.Fatalf("produce on the new leader: %v", err)
	}
	t.Logf("the new leader answered 202 at offset %d", off)
	recs, err := leader.Read(off, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 || string(recs[0].Value) != "answered-202" {
		got := "nothing"
		if len(recs) > 0 {
			got = fmt.Sprintf("%q", recs[0].Value)
		}
		t.Errorf("a message answered 202 at offset %d is not on the other replica (it holds %s there): lost at the next change of leader", off, got)
	}
}

// TestAReplicaTellsATornCommandFromAStaleOne: once the replica knows the group's
// history (it restored a snapshot at its start), an append command that starts where
// that history puts the log's end is the group's next one, and one that starts
// elsewhere is stale (proposed at an offset another command took). After a power loss
// that kept part of a command's records, the torn command's rest is written, and a
// stale command whose first offset falls inside it changes nothing, even when its
// first messages equal those stored there: its proposer was told its outcome is
// unknown, and proposes it again. (Told by the log's end alone, as the first version of the
// repair did, the stale command's tail was written over the next one's offsets and
// answered 202 for messages stored nowhere.)
func TestAReplicaTellsATornCommandFromAStaleOne(t *testing.T) {
	g, leader, follower, memF := replicaPair(t)

	appendN(t, leader, 2) // offsets 0, 1
	// Both take a snapshot there (every 10,000 entries in the broker).
	if _, err := leader.SnapshotState(); err != nil {
		t.Fatal(err)
	}
	snap, err := follower.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	snapIndex := uint64(len(g.log))
	batch := make([]segment.Record, 4)
	for i := range batch {
		batch[i] = segment.Record{Value: []byte(fmt.Sprintf("batch-%d", i))}
	}
	if _, err := leader.Append(batch); err != nil { // offsets 2..5
		t.Fatal(err)
	}
	// A stale command: proposed at offset 4 (inside the batch), committed after it,
	// its first messages equal to the batch's last ones and one more. It changes
	// nothing on either replica.
	stale := []segment.Record{{Value: []byte("batch-2")}, {Value: []byte("batch-3")}, {Value: []byte("stale")}}
	g.mu.Lock()
	g.log = append(g.log, encodeAppendCmd(4, stale))
	for _, p := range g.replicas {
		p.Apply(uint64(len(g.log)), g.log[len(g.log)-1])
	}
	g.replicas = []*Partition{leader} // the follower goes down
	g.mu.Unlock()

	// The follower's power is cut; its disk kept two of the batch's four records.
	powerCutHalfway(t, memF, follower)

	// Restart: open, restore the snapshot (as the group does at its open), apply what
	// follows it, rejoin.
	f2 := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = f2.Close() })
	if end := f2.Stats().End; end <= 2 || end >= 6 {
		t.Fatalf("after the restart the follower's log ends at %d; the test needs it inside the batch (2..6)", end)
	}
	noFetch := func(context.Context, uint64) ([]segment.Record, error) {
		t.Error("the restore fetched: the snapshot's messages were durable")
		return nil, nil
	}
	if err := f2.RestoreSnapshot(context.Background(), snapIndex, snap, noFetch); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	for i := snapIndex; i < uint64(len(g.log)); i++ {
		f2.Apply(i+1, g.log[i])
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
	if len(got) != len(want) || len(want) != 9 {
		t.Fatalf("the follower holds %d messages, the leader %d; want 9 each", len(got), len(want))
	}
	for i := range want {
		if string(got[i].Value) != string(want[i].Value) {
			t.Errorf("offset %d: the follower holds %q, the leader %q", i, got[i].Value, want[i].Value)
		}
		if string(want[i].Value) == "stale" {
			t.Errorf("offset %d holds the stale command's message: it was taken for the group's next", i)
		}
	}
}

// replicaPair opens two replicas of one fake group on memory file systems, the first
// leading; the follower's file system is returned for a power cut.
// tornFollower makes a pair of replicas, appends two messages (durable on the
// follower) and then one command of four (offsets 2..5, applied unsynced on the
// follower), cuts the follower's power halfway through that write and opens it again
// (f2), its group's log not applied again yet.
func tornFollower(t *testing.T) (g *fakeGroup, leader, f2 *Partition) {
	t.Helper()
	g, leader, follower, memF := replicaPair(t)
	appendN(t, leader, 2) // offsets 0, 1
	// A snapshot (or anything else) made what was applied so far durable.
	if err := follower.Flush(); err != nil {
		t.Fatal(err)
	}
	// One command of four records, offsets 2..5, applied unsynced on the follower.
	batch := make([]segment.Record, 4)
	for i := range batch {
		batch[i] = segment.Record{Value: []byte(fmt.Sprintf("batch-%d", i))}
	}
	if _, err := leader.Append(batch); err != nil {
		t.Fatal(err)
	}
	// The follower's node loses power; its disk kept the first part of that pwrite.
	g.mu.Lock()
	g.replicas = []*Partition{leader} // the follower is down
	g.mu.Unlock()
	powerCutHalfway(t, memF, follower)
	f2 = mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = f2.Close() })
	return g, leader, f2
}

// rejoin applies the group's whole log to f2 again (no snapshot was taken) and makes it
// a replica the leader's appends reach.
func rejoin(g *fakeGroup, leader, f2 *Partition) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, cmd := range g.log {
		f2.Apply(uint64(i+1), cmd)
	}
	g.replicas = []*Partition{leader, f2}
}

// followerSnapshotAfterTwo appends two messages (offsets 0 and 1) through the leader
// of a replicaPair and returns the follower's snapshot then and its group index.
func followerSnapshotAfterTwo(t *testing.T, g *fakeGroup, leader, follower *Partition) ([]byte, uint64) {
	t.Helper()
	appendN(t, leader, 2)
	own, err := follower.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	return own, uint64(len(g.log))
}

func replicaPair(t *testing.T) (g *fakeGroup, leader, follower *Partition, memF *vfs.Mem) {
	t.Helper()
	memL := vfs.NewMem()
	memF = vfs.NewMem()
	g = &fakeGroup{}
	leader = mustOpen(t, memL, func(o *Options) { o.Group = member{g: g, i: 0} })
	t.Cleanup(func() { _ = leader.Close() })
	follower = mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	g.replicas = []*Partition{leader, follower}
	leader.SetRole(true, 1)
	return g, leader, follower, memF
}

// powerCutWithAHole cuts p's power: its first segment keeps everything written, but
// the middle of what was not synced reads as zeros (the disk wrote the later pages and
// lost an earlier one); nothing changes if everything was synced.
func powerCutWithAHole(t *testing.T, m *vfs.Mem, p *Partition) {
	t.Helper()
	seg := "/p/log/00000000000000000000.log"
	data, err := m.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	durable, err := m.Durable(seg)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > len(durable) {
		mid := len(durable) + (len(data)-len(durable))/2
		clear(data[mid:min(mid+8, len(data))])
	}
	_ = p.closeFiles() // as the power cut leaves it
	m.Crash()
	if err := m.WriteFile(seg, data); err != nil {
		t.Fatal(err)
	}
}

// powerCutHalfway cuts the follower's power: its files are left as they are, and its
// first segment keeps what was synced and half of what was not (as vfs.Mem's torn
// crash may keep a prefix of an unsynced write).
func powerCutHalfway(t *testing.T, memF *vfs.Mem, follower *Partition) {
	t.Helper()
	seg := "/p/log/00000000000000000000.log"
	data, err := memF.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	durable, err := memF.Durable(seg)
	if err != nil {
		t.Fatal(err)
	}
	_ = follower.closeFiles() // as the power cut leaves it
	memF.Crash()
	if err := memF.WriteFile(seg, data[:len(durable)+(len(data)-len(durable))/2]); err != nil {
		t.Fatal(err)
	}
}

// TestReplicasHoledByOnePowerCutComeBack: the power of every node of a group goes at
// once. Each replica's message log is written without sync and durable only up to its
// last snapshot, and a power loss may keep later pages of what followed and lose an
// earlier one. Such a hole past the snapshot is a torn write the group's log writes
// again: no replica may count it as damage, or every replica sets its data aside to
// be rebuilt from a peer that has none, and the partition never serves again (on the
// old code each replica reported damage here). Each must come back with every
// message, equal to the others'.
func TestReplicasHoledByOnePowerCutComeBack(t *testing.T) {
	g, leader, follower, memF := replicaPair(t)
	memL := leader.fs.(*vfs.Mem)
	put := func(p *Partition, from, to int) {
		for i := from; i < to; i++ {
			if _, err := p.Append([]segment.Record{{Value: []byte(fmt.Sprintf("m%d", i))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(leader, 0, 4)
	var snaps [2][]byte
	for i, p := range []*Partition{leader, follower} {
		s, err := p.SnapshotState()
		if err != nil {
			t.Fatal(err)
		}
		snaps[i] = s
	}
	snapIndex := uint64(len(g.log))
	put(leader, 4, 12)

	g.mu.Lock()
	g.replicas = nil // every node is down
	g.mu.Unlock()
	powerCutWithAHole(t, memL, leader)
	powerCutWithAHole(t, memF, follower)

	noFetch := func(context.Context, uint64) ([]segment.Record, error) {
		t.Error("a restore fetched: the snapshot's messages were durable")
		return nil, nil
	}
	var back [2]*Partition
	for i, m := range []*vfs.Mem{memL, memF} {
		p := mustOpen(t, m, func(o *Options) { o.Group = member{g: g, i: i} })
		t.Cleanup(func() { _ = p.Close() })
		if logD, journalD := p.Damage(); logD+journalD != 0 {
			t.Fatalf("replica %d reports %d damaged records and %d damaged settle records after the power cut: it would be set aside, as would the other", i, logD, journalD)
		}
		if err := p.RestoreSnapshot(context.Background(), snapIndex, snaps[i], noFetch); err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		for j := snapIndex; j < uint64(len(g.log)); j++ {
			p.Apply(j+1, g.log[j])
		}
		g.mu.Unlock()
		back[i] = p
	}
	g.mu.Lock()
	g.replicas = back[:]
	g.lead = 1
	g.mu.Unlock()
	back[1].SetRole(true, 2)
	put(back[1], 12, 14)
	for i, p := range back {
		recs, err := p.Read(0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 14 {
			t.Fatalf("replica %d holds %d messages after the restart, want 14", i, len(recs))
		}
		for j, r := range recs {
			if want := fmt.Sprintf("m%d", j); string(r.Value) != want {
				t.Errorf("replica %d, offset %d: %q, want %q", i, j, r.Value, want)
			}
		}
	}
}

// TestARestoredSnapshotIsDurableBeforeItReturns: a follower behind in the group's log
// installs the leader's snapshot. Its message log already holds every message the
// snapshot names (the entries it missed wrote none), so nothing is fetched; but those
// messages were applied from entries of its own log, written without sync, and the
// group drops those entries once the snapshot is installed. RestoreSnapshot promises
// its state is durable when it returns. If it is not, a power cut that loses an earlier
// page of those writes and keeps later ones leaves a hole past the log's flush point:
// opening cuts the log there as a torn write the group writes again, and the group
// will not (on the old code the hole was damage: reported, and the records after it
// kept). A forced takeover's survivor then applies its replaced group's log over a log
// that ends before the snapshot's end: every append command there is taken for a stale
// one and skipped, and the new group starts without those messages.
func TestARestoredSnapshotIsDurableBeforeItReturns(t *testing.T) {
	g, leader, follower, memF := replicaPair(t)
	put := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := leader.Append([]segment.Record{{Value: []byte(fmt.Sprintf("m%d", i))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(0, 4)
	if _, err := follower.SnapshotState(); err != nil { // its own snapshot: flushed up to 4
		t.Fatal(err)
	}
	put(4, 12) // applied on both; the follower's copy unsynced

	// The follower falls behind; the leader commits a command that writes no message
	// and snapshots, and the follower installs that snapshot.
	g.mu.Lock()
	g.replicas = []*Partition{leader}
	g.log = append(g.log, binary.BigEndian.AppendUint64([]byte{cmdMark}, 12))
	leader.Apply(uint64(len(g.log)), g.log[len(g.log)-1])
	g.mu.Unlock()
	snap, err := leader.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	snapIndex := uint64(len(g.log))
	noFetch := func(context.Context, uint64) ([]segment.Record, error) {
		t.Error("the restore fetched: the follower's log held every message of the snapshot")
		return nil, nil
	}
	if err := follower.RestoreSnapshot(context.Background(), snapIndex, snap, noFetch); err != nil {
		t.Fatal(err)
	}
	if end := follower.Stats().End; end != 12 {
		t.Fatalf("the follower's log ends at %d after the restore, want 12", end)
	}

	// Its power is cut: of what was not synced, the disk kept the later pages and lost
	// one earlier (nothing, if everything was synced).
	powerCutWithAHole(t, memF, follower)

	f2 := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = f2.Close() })
	if end := f2.Stats().End; end < 12 {
		t.Fatalf("after the power cut the follower's log ends at %d: it lost messages of a snapshot it had installed (up to 12), which no entry of its group's log writes again", end)
	}
}
