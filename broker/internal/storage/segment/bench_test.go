package segment

import (
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// BenchmarkAppendDurable has 16 goroutines append 256-byte records one at a
// time to a log on the real file system, with fsync on: the figure a partition
// leader sees under concurrent producers.
func BenchmarkAppendDurable(b *testing.B) {
	const writers, size = 16, 256
	l := mustOpen(b, b.TempDir(), Options{})
	defer l.Close()
	value := make([]byte, size)
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs := []Record{{Value: value}}
			for left.Add(-1) >= 0 {
				if _, err := l.Append(recs); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	st := l.Stats()
	b.ReportMetric(float64(b.N)/secs, "appends/s")
	b.ReportMetric(float64(b.N)*size/secs/1e6, "MB/s")
	b.ReportMetric(float64(st.Syncs)/secs, "fsyncs/s")
	b.ReportMetric(float64(b.N)/float64(max(st.Syncs, 1)), "appends/fsync")
}

// BenchmarkFsync measures the machine's raw rate of small durable writes: 256
// bytes written and then synced, in a loop, with fdatasync (what the log uses)
// and with a full fsync. It bounds what one commit group per fsync can reach.
func BenchmarkFsync(b *testing.B) {
	b.Run("fdatasync", func(b *testing.B) {
		f, err := vfs.OS{}.OpenFile(filepath.Join(b.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		benchSyncLoop(b, f.WriteAt, f.Sync)
	})
	b.Run("fsync", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(b.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		benchSyncLoop(b, f.WriteAt, f.Sync)
	})
}

func benchSyncLoop(b *testing.B, writeAt func([]byte, int64) (int, error), sync func() error) {
	buf := make([]byte, 256)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := writeAt(buf, int64(i)*256); err != nil {
			b.Fatal(err)
		}
		if err := sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "fsyncs/s")
}

// BenchmarkRead reads 256-byte records at random offsets of a 200k-record log
// on the real file system (in the page cache): batches of 100, single records,
// and single records from concurrent readers.
func BenchmarkRead(b *testing.B) {
	const records, size = 200_000, 256
	dir := b.TempDir()
	l := mustOpen(b, dir, Options{SegmentBytes: 8 << 20, NoSync: true})
	defer l.Close()
	batch := make([]Record, 1000)
	for i := range batch {
		batch[i] = Record{Timestamp: int64(i), Key: []byte("key"), Value: make([]byte, size)}
	}
	for l.Next() < records {
		mustAppend(b, l, batch...)
	}
	run := func(name string, maxRecords int, parallel bool) {
		b.Run(name, func(b *testing.B) {
			var got atomic.Int64
			b.ResetTimer()
			start := time.Now()
			body := func(r *rand.Rand, n *int64) {
				recs, err := l.Read(uint64(r.Intn(records-maxRecords)), maxRecords, 1<<20)
				if err != nil || len(recs) != maxRecords {
					b.Fatalf("read %d records: %v", len(recs), err)
				}
				*n += int64(len(recs))
			}
			if parallel {
				b.RunParallel(func(pb *testing.PB) {
					r := rand.New(rand.NewSource(rand.Int63()))
					var n int64
					for pb.Next() {
						body(r, &n)
					}
					got.Add(n)
				})
			} else {
				r := rand.New(rand.NewSource(1))
				var n int64
				for i := 0; i < b.N; i++ {
					body(r, &n)
				}
				got.Add(n)
			}
			secs := time.Since(start).Seconds()
			b.ReportMetric(float64(got.Load())/secs, "records/s")
			b.ReportMetric(float64(got.Load())*size/secs/1e6, "MB/s")
		})
	}
	run("batch100", 100, false)
	run("single", 1, false)
	run("single-parallel", 1, true)
}

// BenchmarkOpen opens a 10 GiB log: 159 sealed segments of 64 MiB (sparse
// files with real index files, since Open must not read sealed data) and a full
// 64 MiB active segment of real records, which Open scans.
func BenchmarkOpen(b *testing.B) {
	const sealed, segBytes, frame = 159, 64 << 20, 292 // 256-byte values, no key
	dir := b.TempDir()
	perSeg := uint64(segBytes / frame)
	for k := uint64(0); k < sealed; k++ {
		ix := indexFile{base: k * perSeg, next: (k + 1) * perSeg, size: int64(perSeg * frame)}
		for rel := uint64(0); rel < perSeg; rel += 4096/frame + 1 {
			ix.entries = append(ix.entries, indexEntry{rel: uint32(rel), pos: uint32(rel * frame), ts: int64(ix.base + rel)})
		}
		ix.lastTS = int64(ix.next - 1)
		name := filepath.Join(dir, segmentName(ix.base, logExt))
		if err := os.WriteFile(name, nil, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(name, ix.size); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, segmentName(ix.base, indexExt)), encodeIndex(&ix), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	// The active segment, written through a log of its own and moved in.
	tmp := b.TempDir()
	l := mustOpen(b, tmp, Options{NoSync: true})
	if err := l.SetNext(sealed * perSeg); err != nil {
		b.Fatal(err)
	}
	batch := make([]Record, 1000)
	for i := range batch {
		batch[i] = Record{Timestamp: int64(sealed * perSeg), Value: make([]byte, 256)}
	}
	for l.Next() < (sealed+1)*perSeg-1000 {
		mustAppend(b, l, batch...)
	}
	mustClose(b, l)
	active := segmentName(sealed*perSeg, logExt)
	if err := os.Rename(filepath.Join(tmp, active), filepath.Join(dir, active)); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		l := mustOpen(b, dir, Options{})
		if l.Stats().Segments != sealed+1 {
			b.Fatalf("%d segments", l.Stats().Segments)
		}
		mustClose(b, l)
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(b.N), "ms/open")
	b.ReportMetric(float64((sealed+1)*segBytes)/(1<<30), "GiB")
}

// BenchmarkAppendSixLogs has 16 goroutines append 256-byte records, one at a time,
// spread over six logs (a topic's six partitions), with fsync on: each log syncing its
// own file, the six sharing a vfs.SyncGroup (one syncfs per round on Linux), and the
// six sharing the write-ahead file, its rounds gathered (wal.GatherYields) or not.
func BenchmarkAppendSixLogs(b *testing.B) {
	for _, mode := range []string{"file", "group", "wal", "wal-nogather"} {
		b.Run(mode, func(b *testing.B) {
			const writers, logs, size = 16, 6, 256
			var g *vfs.SyncGroup
			var w *wal.WAL
			opts := Options{}
			root := b.TempDir()
			if strings.HasPrefix(mode, "wal") {
				fss, err := vfs.NewFSSyncer(root)
				if err != nil {
					b.Fatal(err)
				}
				defer fss.Close()
				w, _, err = wal.Open(filepath.Join(root, "wal"), wal.Options{FS: vfs.OS{}, Root: root, Syncer: fss, NoGather: mode == "wal-nogather"})
				if err != nil {
					b.Fatal(err)
				}
				defer w.Close()
				opts.WAL = w
			}
			if mode == "group" {
				fss, err := vfs.NewFSSyncer(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				defer fss.Close()
				g = vfs.NewSyncGroup(fss)
				defer g.Close()
				opts.Syncer = g
			}
			ls := make([]*Log, logs)
			for i := range ls {
				ls[i] = mustOpen(b, filepath.Join(root, strconv.Itoa(i)), opts)
				defer ls[i].Close()
			}
			value := make([]byte, size)
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					recs := []Record{{Value: value}}
					for n := left.Add(-1); n >= 0; n = left.Add(-1) {
						if _, err := ls[n%logs].Append(recs); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			secs := time.Since(start).Seconds()
			b.ReportMetric(float64(b.N)/secs, "appends/s")
			var syncs uint64
			for _, l := range ls {
				syncs += l.Stats().Syncs
			}
			if g != nil {
				syncs = g.Stats().Rounds
			}
			if w != nil {
				syncs = w.Stats().Rounds
			}
			b.ReportMetric(float64(syncs)/secs, "syncs/s")
			b.ReportMetric(float64(b.N)/float64(max(syncs, 1)), "appends/sync")
		})
	}
}
