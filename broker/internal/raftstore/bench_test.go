package raftstore

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// BenchmarkAppendSync is one Ready's worth of entries (256 B payloads) appended and
// made durable on the real disk, per batch size: what a partition's Ready loop
// pays per round. "groups" runs 8 stores at once, as the node's partitions do:
// through one SyncGroup with syncfs, or committing to one write-ahead file
// (--sync-mode wal); it reports batches per second and sync rounds per batch.
func BenchmarkAppendSync(b *testing.B) {
	payload := make([]byte, 256)
	batchOf := func(next uint64, n int) []raftpb.Entry {
		ents := make([]raftpb.Entry, n)
		for i := range ents {
			ents[i] = raftpb.Entry{Index: next + uint64(i), Term: 1, Data: payload}
		}
		return ents
	}
	for _, n := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("batch=%d/alone", n), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.SetBytes(int64(n * len(payload)))
			b.ResetTimer()
			next := uint64(1)
			for range b.N {
				if err := s.Append(batchOf(next, n)); err != nil {
					b.Fatal(err)
				}
				next += uint64(n)
			}
		})
		for _, mode := range []string{"syncfs", "wal"} {
			b.Run(fmt.Sprintf("batch=%d/groups=8/%s", n, mode), func(b *testing.B) {
				dir := b.TempDir()
				syncer, err := vfs.NewFSSyncer(dir)
				if err != nil {
					b.Fatal(err)
				}
				defer syncer.Close()
				sg := vfs.NewSyncGroup(syncer)
				defer sg.Close()
				opts := Options{Sync: sg}
				rounds := func() uint64 { return sg.Stats().Rounds }
				if mode == "wal" {
					w, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{FS: vfs.OS{}, Root: dir, Syncer: syncer})
					if err != nil {
						b.Fatal(err)
					}
					defer w.Close()
					opts.WAL = w
					rounds = func() uint64 { return w.Stats().Rounds }
				}
				const groups = 8
				stores := make([]*Store, groups)
				for g := range stores {
					if stores[g], err = Open(filepath.Join(dir, fmt.Sprint(g)), opts); err != nil {
						b.Fatal(err)
					}
					defer stores[g].Close()
				}
				b.SetBytes(int64(n * len(payload)))
				before := rounds()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for g, s := range stores {
					wg.Add(1)
					go func() {
						defer wg.Done()
						next := uint64(1)
						for i := g; i < b.N; i += groups {
							if err := s.Append(batchOf(next, n)); err != nil {
								b.Error(err)
								return
							}
							next += uint64(n)
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "batches/s")
				b.ReportMetric(float64(rounds()-before)/float64(b.N), "rounds/batch")
			})
		}
	}
}
