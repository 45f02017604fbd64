package raftstore

import (
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// dyingWAL forwards to a real WAL until die is set; then a commit records nothing and
// answers an unknown-outcome error, as the round whose fdatasync failed before the
// node exits with status 74 (or a process killed before its round was durable).
type dyingWAL struct {
	w   *wal.WAL
	die bool
}

func (d *dyingWAL) Commit(spans []wal.Span) error {
	if d.die {
		return fmt.Errorf("%w: %w", wal.ErrFailed, errors.New("fdatasync: EIO (simulated)"))
	}
	return d.w.Commit(spans)
}
func (d *dyingWAL) Checkpoint() error { return d.w.Checkpoint() }
func (d *dyingWAL) SyncOwn(what string, sync func() error) error {
	return d.w.SyncOwn(what, sync)
}

// openWALOn opens the write-ahead file of m (replaying what it holds).
func openWALOn(t *testing.T, m *vfs.Mem) *wal.WAL {
	t.Helper()
	w, _, err := wal.Open("/wal", wal.Options{FS: m, Root: "/"})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// durableThenDying opens a store on m whose entries 1..last (term 1, vote 1) are
// durable in their segment (checkpointed), and whose write-ahead file then dies.
func durableThenDying(t *testing.T, m *vfs.Mem, last uint64) *Store {
	t.Helper()
	w := openWALOn(t, m)
	dw := &dyingWAL{w: w}
	s := openOn(t, m, Options{WAL: dw, CacheEntries: -1})
	if err := s.Save(raftpb.HardState{Term: 1, Vote: 1}, withData(1, last, 1)); err != nil {
		t.Fatal(err)
	}
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	dw.die = true
	return s
}

// TestKilledWritesAreDurableOnceRead: frames written into a segment whose commit never
// reached the write-ahead file stay in the page cache when the process dies (kill -9,
// or the exit after a failed sync). A store opened again reads them as entries (raft
// may then tell its leader they are stored, without writing anything), and appends
// after them are recorded in the write-ahead file without making them durable, so a
// power loss before a checkpoint lost them (and, with an append after, left a hole
// the next start refused as damage). Open now makes the last segment durable before
// it reads it. (Found in review; both cases fail on the code before.)
func TestKilledWritesAreDurableOnceRead(t *testing.T) {
	for _, appendAfter := range []bool{false, true} {
		t.Run(fmt.Sprintf("appendAfter=%v", appendAfter), func(t *testing.T) {
			m := vfs.NewMem()
			s := durableThenDying(t, m, 10)
			if err := s.Append(withData(11, 11, 1)); err == nil {
				t.Fatal("append over a dying WAL succeeded")
			}
			// kill -9 / exit 74: the process is gone, the page cache stays. (The
			// first WAL is abandoned, not closed: Close would checkpoint.)
			w2 := openWALOn(t, m)
			s2 := openOn(t, m, Options{WAL: w2, CacheEntries: -1})
			last, _ := s2.LastIndex()
			t.Logf("after the restart LastIndex = %d (entry 11 is in the page cache only)", last)
			want := 11
			if appendAfter {
				if err := s2.Append(withData(12, 12, 1)); err != nil { // acknowledged
					t.Fatal(err)
				}
				want = 12
			}
			// Power loss before any checkpoint or kernel write-back.
			m.Crash()
			_ = w2.Close()                // stops its goroutines; its handles are dead
			defer openWALOn(t, m).Close() // the replay after the power loss
			s3, err := Open(testDir, Options{FS: m, CacheEntries: -1})
			if err != nil {
				t.Fatalf("after the power loss the store does not open (entries up to %d were reported durable): %v", want, err)
			}
			defer s3.Close()
			if got, _ := s3.LastIndex(); got != uint64(want) {
				t.Fatalf("after the power loss LastIndex = %d; entries up to %d were reported durable (LastIndex %d after the restart)", got, want, last)
			}
		})
	}
}

// TestKilledStateWriteIsDurableOnceRead: the same for the state file: a term and vote
// whose commit never reached the write-ahead file were read back after the process
// died and given to raft as its hard state, then taken back by a power loss (a node
// could vote twice in a term). Open now makes the state file durable before reading it.
func TestKilledStateWriteIsDurableOnceRead(t *testing.T) {
	m := vfs.NewMem()
	s := durableThenDying(t, m, 3)
	if err := s.SetHardState(raftpb.HardState{Term: 2, Vote: 2}); err == nil {
		t.Fatal("state write over a dying WAL succeeded")
	}
	w2 := openWALOn(t, m)
	s2 := openOn(t, m, Options{WAL: w2, CacheEntries: -1})
	hs2 := s2.HardState()
	m.Crash()
	_ = w2.Close()
	defer openWALOn(t, m).Close() // the replay after the power loss
	s3 := openOn(t, m, Options{CacheEntries: -1})
	defer s3.Close()
	if hs3 := s3.HardState(); hs3.Term < hs2.Term || hs3.Vote != hs2.Vote {
		t.Fatalf("hard state after the restart %+v (given to raft), after a later power loss %+v: term/vote went back", hs2, hs3)
	}
}
