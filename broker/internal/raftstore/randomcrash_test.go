package raftstore

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// rmodel is what the test knows the store must hold.
type rmodel struct {
	log        map[uint64]uint64 // index -> term, for (first-1 .. last]
	first      uint64            // compaction point + 1
	last       uint64
	term, vote uint64
	commit     uint64
	snap       uint64
}

func (m rmodel) clone() rmodel {
	n := m
	n.log = make(map[uint64]uint64, len(m.log))
	for k, v := range m.log {
		n.log[k] = v
	}
	return n
}

type rop struct {
	kind  string
	hs    raftpb.HardState
	ents  []raftpb.Entry
	cutAt uint64
	i     uint64
	snap  raftpb.Snapshot
}

// genOp makes a random operation valid for m, and the model after it.
func genOp(rng *rand.Rand, m rmodel) (rop, rmodel) {
	n := m.clone()
	switch r := rng.Intn(10); {
	case r < 6 || m.last < m.first:
		lo := max(m.first, m.commit+1)
		from := m.last + 1
		if rng.Intn(3) == 0 && m.last >= lo {
			from = lo + uint64(rng.Intn(int(m.last-lo+1)))
		}
		prev := m.log[from-1]
		t := max(prev, 1) + uint64(rng.Intn(2))
		if from <= m.last && rng.Intn(2) == 0 {
			t = max(prev, m.term) + 1 // a new leader
		}
		cnt := 1 + rng.Intn(5)
		ents := withData(from, from+uint64(cnt)-1, t)
		for k := m.last + 1; k < from+uint64(cnt) || k <= m.last; k++ {
			delete(n.log, k)
		}
		for i := from; i <= m.last; i++ {
			delete(n.log, i)
		}
		for _, e := range ents {
			n.log[e.Index] = e.Term
		}
		n.last = from + uint64(cnt) - 1
		hs := raftpb.HardState{Term: max(m.term, t), Vote: m.vote, Commit: m.commit}
		if hs.Term > m.term {
			hs.Vote = uint64(1 + rng.Intn(3))
		} else if m.vote == 0 && rng.Intn(2) == 0 {
			hs.Vote = uint64(1 + rng.Intn(3))
		}
		hs.Commit = m.commit + uint64(rng.Intn(int(n.last-m.commit+1)))
		n.term, n.vote, n.commit = hs.Term, hs.Vote, hs.Commit
		op := rop{kind: "save", hs: hs, ents: ents}
		if from <= m.last {
			op.cutAt = from
		}
		return op, n
	case r < 8 && min(m.commit, m.snap) >= m.first:
		i := m.first + uint64(rng.Intn(int(min(m.commit, m.snap)-m.first+1)))
		n.first = i + 1
		for k := range n.log {
			if k < i {
				delete(n.log, k)
			}
		}
		return rop{kind: "compact", i: i}, n
	case r < 9 && m.commit > m.snap && m.commit >= m.first-1:
		i := max(m.snap+1, m.first-1) + uint64(rng.Intn(int(m.commit-max(m.snap+1, m.first-1)+1)))
		n.snap = i
		return rop{kind: "createsnap", i: i}, n
	default:
		idx := max(m.commit, m.snap) + 1 + uint64(rng.Intn(4))
		t := max(m.term, m.log[m.last]) + uint64(rng.Intn(2))
		if lt, ok := m.log[idx]; ok && lt == t {
			t++ // raft ignores a snapshot its log already matches
		}
		n.log = map[uint64]uint64{idx: t}
		n.first, n.last, n.snap = idx+1, idx, idx
		n.commit = idx
		return rop{kind: "install", snap: raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: idx, Term: t, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}}, n
	}
}

func (o rop) run(s *Store) error {
	switch o.kind {
	case "save":
		return s.Save(o.hs, o.ents)
	case "compact":
		return s.Compact(o.i)
	case "createsnap":
		_, err := s.CreateSnapshot(o.i, nil, []byte("d"))
		return err
	default:
		return s.ApplySnapshot(o.snap)
	}
}

func (o rop) String() string {
	switch o.kind {
	case "save":
		return fmt.Sprintf("save(hs %d/%d/%d,%s)", o.hs.Term, o.hs.Vote, o.hs.Commit, describe(o.ents))
	case "install":
		return fmt.Sprintf("install(%d/%d)", o.snap.Metadata.Index, o.snap.Metadata.Term)
	}
	return fmt.Sprintf("%s(%d)", o.kind, o.i)
}

// TestRandomCrashes runs random saves, cuts, compactions and installs, crashes at
// a random I/O step, and checks the recovered store against the model: it opens,
// raft accepts it, term and vote are the last acknowledged or the one in flight, and
// the log is the old one (or, for a cut, a prefix through the cut) or the new one.
func TestRandomCrashes(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 40
	}
	for _, d := range durability {
		for _, mode := range []crashMode{crashClean, crashTorn, crashWriteback} {
			for seed := 1; seed <= seeds; seed++ {
				randomCrash(t, d.wal, mode, int64(seed))
			}
		}
	}
}

func randomCrash(t *testing.T, withWAL bool, mode crashMode, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	mem := vfs.NewMem()
	cfs := newCrashFS(mem, mode, seed)
	opts := Options{SegmentBytes: 100 + int64(rng.Intn(3))*60, CacheEntries: []int{-1, 3, 4096}[rng.Intn(3)], FS: cfs}
	var w *wal.WAL
	if withWAL {
		var err error
		if w, _, err = wal.Open("/wal", wal.Options{FS: cfs, Root: "/", FileBytes: crashWALBytes}); err != nil {
			t.Fatal(err)
		}
		opts.WAL = w
	}
	s, err := Open(testDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	m := rmodel{log: map[uint64]uint64{0: 0}, first: 1}
	cfs.arm(1 + rng.Intn(400))
	var hist []string
	var op rop
	var next rmodel
	crashed := false
	for range 40 {
		op, next = genOp(rng, m)
		hist = append(hist, op.String())
		if err := op.run(s); err != nil {
			if !cfs.crashedNow() {
				t.Fatalf("seed %d: %s: %v", seed, op, err)
			}
			crashed = true
			break
		}
		m = next
	}
	where := fmt.Sprintf("wal=%v mode=%s seed %d: ops %s", withWAL, mode, seed, strings.Join(hist, " "))
	if !crashed {
		cfs.disarm()
		_ = s.Close()
		op, next = rop{kind: "none"}, m
	}
	if w != nil {
		_ = w.Close()
		w2, _, err := wal.Open("/wal", wal.Options{FS: mem, Root: "/", FileBytes: crashWALBytes})
		if err != nil {
			t.Fatalf("%s: replay: %v", where, err)
		}
		_ = w2.Close()
	}
	if crashed && rng.Intn(2) == 0 {
		// The restart crashes too, somewhere in its recovery.
		cfs2 := newCrashFS(mem, mode, seed+7)
		o2 := opts
		o2.FS, o2.WAL = cfs2, nil
		var w2 *wal.WAL
		if withWAL {
			var err error
			if w2, _, err = wal.Open("/wal", wal.Options{FS: cfs2, Root: "/", FileBytes: crashWALBytes}); err != nil {
				t.Fatalf("%s: replay before the second crash: %v", where, err)
			}
			o2.WAL = w2
		}
		cfs2.arm(1 + rng.Intn(10))
		if s3, err := Open(testDir, o2); err == nil {
			cfs2.disarm()
			_ = s3.Close()
		} else if !cfs2.crashedNow() {
			t.Fatalf("%s: reopen before the second crash: %v", where, err)
		} else {
			where += " (and a crash in recovery)"
		}
		cfs2.disarm()
		if w2 != nil {
			_ = w2.Close()
			w3, _, err := wal.Open("/wal", wal.Options{FS: mem, Root: "/", FileBytes: crashWALBytes})
			if err != nil {
				t.Fatalf("%s: replay: %v", where, err)
			}
			_ = w3.Close()
		}
	}
	ropts := opts
	ropts.FS, ropts.WAL = mem, nil
	s2, err := Open(testDir, ropts)
	if err != nil {
		t.Fatalf("%s: reopen: %v", where, err)
	}
	defer func() { _ = s2.Close() }()
	hs := s2.HardState()
	if !(hs.Term == m.term && hs.Vote == m.vote) && !(hs.Term == next.term && hs.Vote == next.vote) {
		t.Fatalf("%s: hard state %d/%d, want %d/%d or %d/%d", where, hs.Term, hs.Vote, m.term, m.vote, next.term, next.vote)
	}
	first, _ := s2.FirstIndex()
	last, _ := s2.LastIndex()
	matches := func(mm rmodel, minLast uint64) bool {
		if last < minLast || last > mm.last || first < mm.first && mm.first > 0 && first-1 < mm.first-1 {
			return false
		}
		for i := first - 1; i <= last; i++ {
			tm, err := s2.Term(i)
			want, ok := mm.log[i]
			if err != nil || !ok || tm != want {
				return false
			}
		}
		return true
	}
	minOld := m.last
	if op.kind == "save" && op.cutAt != 0 {
		minOld = op.cutAt - 1
	}
	minNew := next.last
	if op.kind == "save" {
		minNew = op.ents[0].Index - 1
	}
	if !matches(m, minOld) && !matches(next, minNew) {
		var got []string
		for i := first - 1; i <= last; i++ {
			tm, _ := s2.Term(i)
			got = append(got, fmt.Sprintf("%d/%d", i, tm))
		}
		t.Fatalf("%s: recovered log [%s] (first %d last %d) matches neither the old (first %d last %d) nor the new (first %d last %d)", where, strings.Join(got, " "), first, last, m.first, m.last, next.first, next.last)
	}
	if last >= first {
		if _, err := s2.Entries(first, last+1, ^uint64(0)); err != nil {
			t.Fatalf("%s: Entries: %v", where, err)
		}
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("%s: raft panics on the recovered store: %v", where, r)
			}
		}()
		sn, _ := s2.Snapshot()
		if _, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: s2, Applied: sn.Metadata.Index, MaxInflightMsgs: 16, MaxSizePerMsg: 1 << 20, Logger: discard{}}); err != nil {
			t.Fatalf("%s: NewRawNode: %v", where, err)
		}
	}()
}

type discard struct{ raft.Logger }

func (discard) Debug(...any)              {}
func (discard) Debugf(string, ...any)     {}
func (discard) Info(...any)               {}
func (discard) Infof(string, ...any)      {}
func (discard) Warning(...any)            {}
func (discard) Warningf(string, ...any)   {}
func (discard) Error(...any)              {}
func (discard) Errorf(string, ...any)     {}
func (discard) Fatal(v ...any)            { panic(fmt.Sprint(v...)) }
func (discard) Fatalf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
func (discard) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (discard) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
