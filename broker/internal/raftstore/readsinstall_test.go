package raftstore

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestReadsDuringInstallsAndCuts runs raft.Storage readers while the writer appends,
// cuts at segment boundaries and inside segments, compacts and installs snapshots
// (run it with -race). Every entry read must be the one its index and term name
// (no cut entry from the cache or a removed segment), contiguous from lo.
func TestReadsDuringInstallsAndCuts(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, _ := newWith(t, []raftpb.Entry{{}}, m.opts)
			stop := readWhileWriting(t, s, func(first uint64, i int, ents []raftpb.Entry) error {
				if e := ents[i]; e.Index != first+uint64(i) || string(e.Data) != fmt.Sprintf("e%d-t%d", e.Index, e.Term) {
					return fmt.Errorf("entry %d/%d with data %q read at position %d from %d", e.Index, e.Term, e.Data, i, first)
				}
				return nil
			})
			term, next := uint64(1), uint64(1)
			for round := range 80 {
				ents := withData(next, next+4, term)
				if err := s.Append(ents); err != nil {
					t.Fatal(err)
				}
				next += 5
				switch round % 9 {
				case 3, 6: // a new leader overwrites a divergent tail
					term++
					next -= uint64(1 + round%4)
				case 8:
					term++
					idx := next + 2
					if err := s.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: idx, Term: term}}); err != nil {
						t.Fatal(err)
					}
					next = idx + 1
				case 5:
					if err := s.Compact(next - 3); err != nil {
						t.Fatal(err)
					}
				}
			}
			stop()
		})
	}
}
