package raftetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// soleHost starts one node hosting groups of which it is the only voter, a snapshot
// due every 2 applied entries, logging to logger.
func soleHost(t *testing.T, async bool, logger *slog.Logger) (*Host, string, *vfs.SyncGroup) {
	t.Helper()
	return soleHostWith(t, func(o *Options) {
		o.SnapshotEvery, o.SnapshotKeep, o.AsyncStorageWrites = 2, 1, async
		if logger != nil {
			o.Logger = logger
		}
	})
}

// soleHostWith starts one node hosting groups of which it is the only voter, on a
// temp directory, its options changed by tweak.
func soleHostWith(t *testing.T, tweak func(*Options)) (*Host, string, *vfs.SyncGroup) {
	t.Helper()
	n, err := transport.New(transport.Options{NodeID: "n1", ListenAddr: "127.0.0.1:0", Secret: testSecret, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	dir := t.TempDir()
	fss, err := vfs.NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	sg := vfs.NewSyncGroup(fss)
	t.Cleanup(sg.Close)
	opts := Options{Node: n, ID: 1, Peers: map[uint64]string{1: n.Addr()}, Dir: dir, Sync: sg, Store: StoreRaftstore,
		Tick: testTick, LivenessInterval: 100 * time.Millisecond, LivenessTimeout: time.Second, Logger: quiet()}
	tweak(&opts)
	h, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, dir, sg
}

// TestNoSnapshotBeforeTheReplayReachesWhatWasApplied: a group opened again applies its
// log again from its last snapshot while the application may hold the effects of
// later entries (a replicated partition's message log, its last command maybe torn).
// A snapshot in that replay would stamp the application's state with an earlier
// index; the partition can refuse it itself except in a group made over data it held
// before, whose log's end at the start may be that data. So no snapshot is taken
// before the replay reached the commit index stored when the group was opened, and a
// group that still owes its first snapshot (SnapshotFirst) waits for its log's last
// index: its stored commit index may lag what it applied (a commit-only hard state is
// not synced, and the async loop applies before it is written), modelled here by
// writing a lower one. Entries of 600 KB make the replay come in several batches (raft
// hands 1 MiB at a time); on the old code the snapshot was taken after the first,
// at index 3.
func TestNoSnapshotBeforeTheReplayReachesWhatWasApplied(t *testing.T) {
	t.Parallel()
	for _, async := range []bool{false, true} {
		h, dir, sg := soleHost(t, async, nil)
		for _, c := range []struct {
			name               string
			snapshotFirst, lag bool
		}{
			{"periodic", false, false},
			{"first", true, false},
			{"first, stored commit lagging", true, true},
		} {
			name := fmt.Sprintf("async %v, %s", async, c.name)
			raftDir := filepath.Join(dir, "part", strings.NewReplacer(" ", "", ",", "-").Replace(name))
			g := "g-" + name
			app := &snapApp{}
			app.apps = map[uint64]*snapApp{1: app}
			var allow atomic.Bool
			var mu sync.Mutex
			var takenAt []uint64 // the applied index at each snapshot taken after the reopen
			snapshot := func() ([]byte, error) {
				if !allow.Load() {
					return nil, errors.New("the node stops before its first snapshot")
				}
				gr := h.group(g)
				gr.mu.Lock()
				applied := gr.applied
				gr.mu.Unlock()
				mu.Lock()
				takenAt = append(takenAt, applied)
				mu.Unlock()
				return app.snapshot()
			}
			cfg := GroupConfig{Voters: []uint64{1}, Dir: raftDir, Campaign: true, SnapshotFirst: c.snapshotFirst,
				Apply: app.apply, Snapshot: snapshot, Restore: app.restore}
			if err := h.OpenGroup(g, cfg); err != nil {
				t.Fatal(err)
			}
			poll(t, 20*time.Second, name+": the new group to lead", func() bool {
				info, _ := h.Info(g)
				return info.Leader
			})
			big := strings.Repeat("x", 600<<10)
			for i := range 6 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := h.Propose(ctx, g, []byte(fmt.Sprint(i, big)))
				cancel()
				if err != nil {
					t.Fatalf("%s: write %d: %v", name, i, err)
				}
			}
			info, _ := h.Info(g)
			commit, last := info.Commit, info.Last
			if info.SnapshotIndex != 0 || commit < 8 || last < commit {
				t.Fatalf("%s: before the reopen: %+v; want no snapshot, 8 entries committed", name, info)
			}
			h.CloseGroup(g)
			// The commit index stored (the async loop's last commit-only hard state may
			// not have been written), and what a crash can leave: the entries (synced
			// before they were applied) without the hard state that covered them.
			st, err := openSegStore(vfs.OS{}, filepath.Dir(raftDir), filepath.Base(raftDir), sg, nil)
			if err != nil {
				t.Fatal(err)
			}
			hs, _, err := st.InitialState()
			if err != nil {
				t.Fatal(err)
			}
			want := hs.Commit
			if c.lag {
				hs.Commit = 3
				if err := st.persist(raft.Ready{HardState: hs}); err != nil {
					t.Fatal(err)
				}
				want = last
			}
			if err := st.close(); err != nil {
				t.Fatal(err)
			}
			if want < 7 {
				t.Fatalf("%s: the group's log holds %d entries, %d committed, %d stored as committed: the test needs at least 7", name, last, commit, want)
			}
			allow.Store(true)
			if err := h.OpenGroup(g, cfg); err != nil {
				t.Fatal(err)
			}
			poll(t, 20*time.Second, name+": the reopened group to take a snapshot", func() bool {
				info, _ := h.Info(g)
				return !info.SnapshotPending && info.Snapshots > 0
			})
			mu.Lock()
			at := takenAt[0]
			mu.Unlock()
			if at < want {
				t.Errorf("%s: the reopened group took a snapshot at applied index %d, before its replay reached %d (what it applied before)", name, at, want)
			}
			h.CloseGroup(g)
		}
	}
}
