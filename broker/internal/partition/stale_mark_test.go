package partition

import (
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestAStaleAppendCommandMarksNoOffsetPastTheLog: OffsetAtIndex says how far a
// follower whose log matches the group's up to an index holds the messages (the
// leader reports each follower's match offset and lag from it). A stale append
// command (proposed at an offset another command took) writes nothing, so after it
// the log ends where it ended before. On the old code a replica that knew nothing yet
// of its group's history (no snapshot since it opened) marked the stale command's
// index at the end the command would have reached: past the log, so a follower
// matched up to that index was reported holding messages it did not hold (with a lag
// of 0 once the leader's log reached that far).
func TestAStaleAppendCommandMarksNoOffsetPastTheLog(t *testing.T) {
	g, leader := openLagGroup(t)

	// Batch A (two records) times out but is in the group's log (index 1); batch B
	// (five records) is proposed at the same offset (index 2, stale) and again at the
	// right one (index 3).
	g.mu.Lock()
	g.timeOutNext = true
	g.mu.Unlock()
	if _, err := leader.Append([]segment.Record{{Value: []byte("A0")}, {Value: []byte("A1")}}); err == nil {
		t.Fatal("the first append was meant to time out")
	}
	var b []segment.Record
	for i := range 5 {
		b = append(b, segment.Record{Value: []byte(fmt.Sprintf("B%d", i))})
	}
	if _, err := leader.Append(b); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	entries := g.applied
	g.mu.Unlock()
	if entries != 3 {
		t.Fatalf("the group's log holds %d entries, the test expects 3", entries)
	}
	for i, p := range g.replicas {
		// After entry 1 (A) and entry 2 (stale B) the log ends at 2; after entry 3 at 7.
		for idx, want := range map[uint64]uint64{1: 2, 2: 2, 3: 7} {
			if got := p.OffsetAtIndex(idx); got != want {
				t.Errorf("replica %d: OffsetAtIndex(%d) = %d, want %d (its log ended at %d after that entry)", i, idx, got, want, want)
			}
		}
	}
}
