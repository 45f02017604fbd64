package partition

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// lagGroup is a group whose log commits in order, but whose next proposal, when
// timeOutNext is set, stays in the log uncommitted and its proposer is told the
// deadline passed (raft keeps the entry; it commits with the next one, as after a
// slow follower or a short loss of quorum).
type lagGroup struct {
	mu          sync.Mutex
	replicas    []*Partition
	pending     [][]byte
	applied     int
	timeOutNext bool
}

type lagMember struct {
	g *lagGroup
	i int
}

func (m lagMember) Propose(_ context.Context, cmd []byte, submitted func()) (any, error) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending = append(g.pending, append([]byte(nil), cmd...))
	if submitted != nil {
		submitted()
	}
	if g.timeOutNext {
		g.timeOutNext = false
		return nil, context.DeadlineExceeded // in the log, not committed yet
	}
	var mine any
	for g.applied < len(g.pending) {
		c := g.pending[g.applied]
		g.applied++
		for i, p := range g.replicas {
			res := p.Apply(uint64(g.applied), c)
			if i == m.i {
				mine = res
			}
		}
	}
	return mine, nil
}

func (m lagMember) Confirm(context.Context) error { return nil }

// TestAStaleAppendCommandIsNotTakenForATornOne: an append whose proposal timed out
// (outcome unknown) stays in the group's log and commits later; the leader's next
// append, proposed meanwhile, names the same first offset (the leader's next offset
// was reset). The later command, stale once the first is written, must change nothing
// and be proposed again, and its producer answered with offsets that hold its own
// messages. The first version of the repair of a torn command (told by the log's end
// alone) wrote its tail after the other batch and answered 202 at offsets holding the
// other batch's messages: two of its messages were stored nowhere (a review, 5
// December).
func TestAStaleAppendCommandIsNotTakenForATornOne(t *testing.T) {
	g, leader := openLagGroup(t)

	// Batch A (two records): its proposal times out, but it is in the log.
	g.mu.Lock()
	g.timeOutNext = true
	g.mu.Unlock()
	if _, err := leader.Append([]segment.Record{{Value: []byte("A0")}, {Value: []byte("A1")}}); err == nil {
		t.Fatal("the first append was meant to time out")
	} else {
		t.Logf("batch A: %v (outcome unknown: it may be stored, and it is)", err)
	}
	// Batch B (five records) is answered as stored.
	var b []segment.Record
	for i := range 5 {
		b = append(b, segment.Record{Value: []byte(fmt.Sprintf("B%d", i))})
	}
	first, err := leader.Append(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("batch B answered 202 at offsets %d..%d", first, first+4)
	recs, err := leader.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%d:%s", r.Offset, r.Value))
	}
	t.Logf("the log holds %v", got)
	for i := range 5 {
		off := first + uint64(i)
		if off >= uint64(len(recs)) || string(recs[off].Value) != fmt.Sprintf("B%d", i) {
			t.Errorf("message B%d answered 202 at offset %d is not there (lost)", i, off)
		}
	}
}

// openLagGroup opens two replicas in a lagGroup and makes the first its leader.
func openLagGroup(t *testing.T) (*lagGroup, *Partition) {
	t.Helper()
	g := &lagGroup{}
	for i := range 2 {
		p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = lagMember{g: g, i: i} })
		t.Cleanup(func() { _ = p.Close() })
		g.replicas = append(g.replicas, p)
	}
	leader := g.replicas[0]
	leader.SetRole(true, 1)
	return g, leader
}

// TestAStaleAppendPastTheEndChangesNothingOnceTheHistoryIsKnown: an append command
// that names an offset past the log's end (its proposer chose it after an earlier
// proposal that raft then dropped, a change of leader or a transfer in between) is
// stale like one naming an offset already taken: it writes nothing, and its proposer
// proposes it again at the right offset. TestReplicaApplyIsIdempotent covers it on a
// replica that has not yet learnt the group's history; this covers one that has (it
// took or restored a snapshot since its start), where Apply takes another branch.
// Taken there for a log that lost records, it stopped the replica from applying
// anything more until a restart, and the restart, restoring its snapshot, met the same
// entry again: every replica that had snapshotted stopped, and the partition with them.
func TestAStaleAppendPastTheEndChangesNothingOnceTheHistoryIsKnown(t *testing.T) {
	g, ps := openGroup(t, 2)
	appendN(t, ps[0], 3)
	for _, p := range ps {
		if _, err := p.SnapshotState(); err != nil { // the history is known from here on
			t.Fatal(err)
		}
	}
	gap := encodeAppendCmd(5, []segment.Record{{Value: []byte("gap")}})
	g.mu.Lock()
	g.log = append(g.log, gap)
	for i, p := range ps {
		res, _ := p.Apply(uint64(len(g.log)), gap).(appliedAppend)
		if res.ok || res.err != nil {
			t.Errorf("replica %d: a command for offset 5 at the log's end 3 answered ok %v, error %v; want neither (stale)", i, res.ok, res.err)
		}
	}
	g.mu.Unlock()
	for i, p := range ps {
		if p.Failed() {
			t.Errorf("replica %d stopped applying after a stale append command", i)
		}
	}
	appendN(t, ps[0], 2) // offsets 3, 4
	for i, p := range ps {
		if st := p.Stats(); st.End != 5 {
			t.Errorf("replica %d: the log ends at %d after two more appends, want 5", i, st.End)
		}
	}
	sameState(t, "the follower after a stale append", ps[1], ps[0])
}
