package segment

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestGroupCommit has 16 goroutines append one record at a time against a disk
// whose fsync takes a while: offsets are unique and consecutive, every record
// is where its Append said, and far fewer fsyncs than appends were needed.
func TestGroupCommit(t *testing.T) {
	const writers, each = 16, 60
	m := vfs.NewMem()
	m.SetSyncDelay(500 * time.Microsecond)
	l := mustOpen(t, testDir, Options{FS: m})
	defer mustClose(t, l)

	offsets := make([][]uint64, writers)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				v := binary.BigEndian.AppendUint32(nil, uint32(w<<16|i))
				off, err := l.Append([]Record{{Value: v}})
				if err != nil {
					t.Error(err)
					return
				}
				offsets[w] = append(offsets[w], off)
			}
		}()
	}
	wg.Wait()

	seen := make(map[uint64]bool)
	for w := range offsets {
		for i, off := range offsets[w] {
			if seen[off] {
				t.Fatalf("offset %d handed out twice", off)
			}
			seen[off] = true
			if i > 0 && off <= offsets[w][i-1] {
				t.Fatalf("writer %d: offsets went back: %d after %d", w, off, offsets[w][i-1])
			}
			rec := mustRead(t, l, off, 1, 0)[0]
			if got := binary.BigEndian.Uint32(rec.Value); got != uint32(w<<16|i) {
				t.Fatalf("offset %d holds %x, want %x", off, got, w<<16|i)
			}
		}
	}
	for off := uint64(0); off < writers*each; off++ {
		if !seen[off] {
			t.Fatalf("offset %d never handed out", off)
		}
	}
	st := l.Stats()
	t.Logf("%d appends in %d groups, %d fsyncs", writers*each, st.Groups, st.Syncs)
	if st.Records != writers*each || st.Syncs > writers*each/4 || st.Syncs+st.RecoveryPoints != uint64(m.Syncs()) {
		t.Fatalf("stats %+v, mem fsyncs %d: want %d records and at most %d fsyncs", st, m.Syncs(), writers*each, writers*each/4)
	}
}

// TestCloseDrainsQueuedAppends closes the log while appends wait behind a slow
// fsync: each one either completes durably or fails with ErrClosed.
func TestCloseDrainsQueuedAppends(t *testing.T) {
	m := vfs.NewMem()
	m.SetSyncDelay(2 * time.Millisecond)
	l := mustOpen(t, testDir, Options{FS: m})
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[uint64]bool{}
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				off, err := l.Append([]Record{{Value: []byte("x")}})
				if err != nil {
					wantErr(t, err, ErrClosed)
					return
				}
				mu.Lock()
				acked[off] = true
				mu.Unlock()
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	mustClose(t, l)
	wg.Wait()
	m.Crash()
	l = mustOpen(t, testDir, Options{FS: m})
	defer mustClose(t, l)
	if l.Next() != uint64(len(acked)) {
		t.Fatalf("after close and crash: Next %d, %d appends acknowledged", l.Next(), len(acked))
	}
}

// TestConcurrentReadersAndWriters runs readers against appends, rolls and
// retention under the race detector: every record read is the one written.
func TestConcurrentReadersAndWriters(t *testing.T) {
	m := vfs.NewMem()
	l := mustOpen(t, testDir, memOptions(m))
	defer mustClose(t, l)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				from := l.Oldest()
				recs, err := l.Read(from, 20, 2000)
				if err != nil {
					wantErr(t, err, ErrOffsetOutOfRange) // retention overtook the reader
					continue
				}
				for _, r := range recs {
					want := testRecord(int(r.Offset))
					want.Offset = r.Offset
					if !sameRecord(r, want) {
						t.Errorf("read %+v, want %+v", r, want)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 600; i += 3 {
		appendTestRecords(t, l, i, i+3)
		if i%60 == 0 {
			if _, err := l.DeleteBefore(uint64(i / 2)); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
}
