package raftstore

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestReadsDuringWrites runs raft.Storage readers while one writer appends, cuts,
// compacts (run it with -race). Every read must be consistent: the entries
// returned are contiguous from lo with terms that never decrease, or the read
// fails only with ErrCompacted or ErrUnavailable because the log moved meanwhile.
func TestReadsDuringWrites(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s, _ := newWith(t, []raftpb.Entry{{}}, m.opts)
			stop := readWhileWriting(t, s, func(first uint64, i int, ents []raftpb.Entry) error {
				if e := ents[i]; e.Index != first+uint64(i) || (i > 0 && e.Term < ents[i-1].Term) {
					return errors.New("entries not contiguous from lo, or terms going back")
				}
				return nil
			})
			term := uint64(1)
			next, lastIdx := uint64(1), uint64(0)
			for round := range 60 {
				ents := withData(next, next+9, term)
				if err := s.Append(ents); err != nil {
					t.Fatal(err)
				}
				next += 10
				lastIdx = next - 1
				if round%7 == 3 { // a new leader overwrites the last 4
					term++
					next -= 4
				}
				if round%10 == 9 {
					if err := s.Compact(next - 8); err != nil {
						t.Fatal(err)
					}
				}
			}
			stop()
			log := logOf(t, s)
			if log[len(log)-1].Index != lastIdx {
				t.Fatalf("log ends at %d, want %d", log[len(log)-1].Index, lastIdx)
			}
		})
	}
}

// readWhileWriting runs three raft.Storage readers of s over its whole log until the
// returned stop is called; stop waits for them and fails t with the first error: of a
// read (other than ErrCompacted and ErrUnavailable, which a log moving meanwhile
// gives), or of check, asked about each entry i of a read from first.
func readWhileWriting(t *testing.T, s *Store, check func(first uint64, i int, ents []raftpb.Entry) error) (stop func()) {
	t.Helper()
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				first, _ := s.FirstIndex()
				last, _ := s.LastIndex()
				if last < first {
					continue
				}
				ents, err := s.Entries(first, last+1, 1<<20)
				if errors.Is(err, raft.ErrCompacted) || errors.Is(err, raft.ErrUnavailable) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				for i := range ents {
					if err := check(first, i, ents); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	return func() {
		t.Helper()
		done.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
