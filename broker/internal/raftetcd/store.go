package raftetcd

import (
	"fmt"
	"path/filepath"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/raftstore"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// The group log stores (Options.Store).
const (
	// StoreWAL is the spike's prototype: an append-only file per group replayed into
	// etcd-io/raft's MemoryStorage (the whole log in memory, never compacted).
	StoreWAL = "wal"
	// StoreRaftstore is the build's store (internal/raftstore): segment files, the
	// crash-safe cut of a divergent suffix, compaction, a bounded cache.
	StoreRaftstore = "raftstore"
)

// WAL is the node's write-ahead file as the groups' logs use it (Options.WAL).
type WAL = raftstore.WAL

// logStore is a group's raft.Storage and the write side of its Ready loop.
type logStore interface {
	raft.Storage
	// persist makes a Ready's hard state and entries durable as raft requires
	// before its messages are sent.
	persist(rd raft.Ready) error
	// snapshot stores data as the application's snapshot at index i with
	// configuration cs; compact drops the entries up to i.
	snapshot(i uint64, cs raftpb.ConfState, data []byte) error
	compact(i uint64) error
	// trimCache lets the entries below i go from memory (they stay in the log);
	// cachedBytes is what the store holds in memory of its log now.
	trimCache(i uint64)
	cachedBytes() int
	close() error
}

// bootstrap is the snapshot every group starts from: index 1, term 1, holding the
// membership on every node alike, so no configuration entry is ever replicated in
// the spike.
func bootstrap(voters []uint64) raftpb.Snapshot {
	return raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: voters}}}
}

// walStore is the prototype store: the wal file and MemoryStorage.
type walStore struct {
	*raft.MemoryStorage
	w *wal
}

func openWALStore(dir, id string, sync *vfs.SyncGroup, voters []uint64) (logStore, error) {
	w, hs, ents, err := openWAL(filepath.Join(dir, id+".wal"), sync)
	if err != nil {
		return nil, err
	}
	ents, err = replayed(ents)
	if err != nil {
		_ = w.close() // the error being returned is the one to report
		return nil, fmt.Errorf("%w: %s: %v", ErrBadMessage, id, err)
	}
	ms := raft.NewMemoryStorage()
	err = ms.ApplySnapshot(bootstrap(voters))
	if err == nil && len(ents) > 0 {
		err = ms.Append(ents)
	}
	if err == nil && !raft.IsEmptyHardState(hs) {
		err = ms.SetHardState(hs)
	}
	if err != nil {
		_ = w.close() // the error being returned is the one to report
		return nil, err
	}
	return &walStore{MemoryStorage: ms, w: w}, nil
}

// replayed is the log that the wal's entries leave when written in turn: an entry at
// an index already written replaces it and everything after it (a new leader's entries
// over a divergent tail). MemoryStorage.Append would not do that within one call: it
// places entries by the first one's index, so a replay holding a rewritten suffix
// would put entry i at position i+1 and raft would hand the same index out for ever.
func replayed(ents []raftpb.Entry) ([]raftpb.Entry, error) {
	var out []raftpb.Entry
	for _, e := range ents {
		if n := len(out); n > 0 && e.Index > out[n-1].Index+1 {
			return nil, fmt.Errorf("entry %d follows entry %d", e.Index, out[n-1].Index)
		}
		out = mergeEntries(out, []raftpb.Entry{e})
	}
	return out, nil
}

func (s *walStore) persist(rd raft.Ready) error {
	hasHS := !raft.IsEmptyHardState(rd.HardState)
	if hasHS || len(rd.Entries) > 0 {
		if rd.MustSync {
			if err := s.w.save(rd.HardState, hasHS, rd.Entries); err != nil {
				return err
			}
		} else if err := s.w.write(rd.HardState, hasHS, rd.Entries); err != nil {
			return err
		}
	}
	if len(rd.Entries) > 0 {
		if err := s.Append(rd.Entries); err != nil {
			return err
		}
	}
	if hasHS {
		return s.SetHardState(rd.HardState)
	}
	return nil
}

func (s *walStore) close() error { return s.w.close() }

// The spike's store never compacts (its wal file holds the whole log).
func (s *walStore) snapshot(uint64, raftpb.ConfState, []byte) error { return errNoSnapshots }
func (s *walStore) compact(uint64) error                            { return errNoSnapshots }

// The spike's store holds its whole log in memory, by design.
func (s *walStore) trimCache(uint64) {}
func (s *walStore) cachedBytes() int { return 0 }

// segStore is the build's store.
type segStore struct{ *raftstore.Store }

func openSegStore(fsys vfs.FS, dir, id string, sync *vfs.SyncGroup, w raftstore.WAL) (logStore, error) {
	st, err := raftstore.Open(filepath.Join(dir, id), raftstore.Options{FS: fsys, Sync: sync, WAL: w})
	if err != nil {
		return nil, err
	}
	// A new group starts empty: OpenGroup bootstraps it with configuration entries
	// (RawNode.Bootstrap), which followers added later receive with the rest of the
	// log; a snapshot naming the first voters would be refused by a replica not in it.
	if err != nil {
		_ = st.Close() // the error being returned is the one to report
		return nil, err
	}
	return segStore{st}, nil
}

func (s segStore) persist(rd raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		// A leader's snapshot (a joining replica gets the group's bootstrap this way).
		if err := s.ApplySnapshot(rd.Snapshot); err != nil {
			return err
		}
	}
	if raft.IsEmptyHardState(rd.HardState) && len(rd.Entries) == 0 {
		return nil
	}
	return s.Save(rd.HardState, rd.Entries)
}

func (s segStore) close() error { return s.Close() }

func (s segStore) snapshot(i uint64, cs raftpb.ConfState, data []byte) error {
	_, err := s.CreateSnapshot(i, &cs, data)
	return err
}

func (s segStore) compact(i uint64) error { return s.Compact(i) }

func (s segStore) trimCache(i uint64) { s.TrimCache(i) }
func (s segStore) cachedBytes() int   { return s.CachedBytes() }
