package partition

import (
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
	memL, memF := vfs.NewMem(), vfs.NewMem()
	g := &fakeGroup{}
	leader := mustOpen(t, memL, func(o *Options) { o.Group = member{g: g, i: 0} })
	t.Cleanup(func() { _ = leader.Close() })
	follower := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	g.replicas = []*Partition{leader, follower}
	leader.SetRole(true, 1)

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
	seg := "/p/log/00000000000000000000.log"
	data, err := memF.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	durable, err := memF.Durable(seg)
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.replicas = []*Partition{leader} // the follower is down
	g.mu.Unlock()
	_ = follower.closeFiles() // as the power cut leaves it
	memF.Crash()
	cut := len(durable) + (len(data)-len(durable))/2 // two of the four frames, as CrashTorn may keep
	if err := memF.WriteFile(seg, data[:cut]); err != nil {
		t.Fatal(err)
	}

	// Restart: open, apply the group's log again (no snapshot was taken), rejoin.
	f2 := mustOpen(t, memF, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = f2.Close() })
	t.Logf("after the restart the follower's log ends at %d", f2.Stats().End)
	g.mu.Lock()
	for i, cmd := range g.log {
		f2.Apply(uint64(i+1), cmd)
	}
	g.replicas = []*Partition{leader, f2}
	g.mu.Unlock()
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
