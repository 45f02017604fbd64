package partition

import (
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

var testQueue = queue.Config{Visibility: time.Minute, MaxInFlight: 1 << 20, MaxAckedAhead: 1 << 20}

func mustOpen(t *testing.T, fs vfs.FS, opts ...func(*Options)) *Partition {
	t.Helper()
	o := Options{Dir: "/p", FS: fs, Queue: testQueue}
	for _, f := range opts {
		f(&o)
	}
	p, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func appendN(t *testing.T, p *Partition, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := p.Append([]segment.Record{{Value: []byte(fmt.Sprint(i))}}); err != nil {
			t.Fatal(err)
		}
	}
}

func leaseAll(t *testing.T, p *Partition) []Delivery {
	t.Helper()
	ds, err := p.Lease(1<<20, time.Minute, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func offsets(ds []Delivery) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.Record.Offset
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func settleOne(p *Partition, d Delivery) error {
	return p.Settle([]SettleReq{{Offset: d.Record.Offset, Nonce: d.Nonce}})[0]
}

// TestSettledNeverRedeliveredAfterRestart covers contract items 2 and 5 across a clean
// close and across a crash (unsynced data dropped): a settle that returned nil is never
// delivered again; every unsettled message is.
func TestSettledNeverRedeliveredAfterRestart(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			fs := vfs.NewMem()
			p := mustOpen(t, fs)
			appendN(t, p, 10)
			ds := leaseAll(t, p)
			if len(ds) != 10 {
				t.Fatalf("leased %d", len(ds))
			}
			for _, i := range []int{0, 1, 2, 5, 9} {
				if err := settleOne(p, ds[i]); err != nil {
					t.Fatal(err)
				}
			}
			epoch := p.Epoch()
			if crash {
				fs.Crash()
				p.closeFiles()
			} else if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			p = mustOpen(t, fs)
			defer p.Close()
			if p.Epoch() <= epoch {
				t.Fatalf("epoch %d after %d: nonces could repeat", p.Epoch(), epoch)
			}
			got := offsets(leaseAll(t, p))
			want := []uint64{3, 4, 6, 7, 8}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("redelivered %v, want %v", got, want)
			}
			// A handle from before the restart is stale.
			if err := settleOne(p, ds[3]); !errors.Is(err, queue.ErrLeaseLost) {
				t.Fatalf("settle with a pre-restart handle: %v", err)
			}
			if st := p.Stats(); st.Frontier != 3 || st.End != 10 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestCheckpointCompactsJournal checks that checkpoints keep the replay short and lose
// nothing: the state after many checkpoints and a crash equals the settles made.
func TestCheckpointCompactsJournal(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs, func(o *Options) { o.CheckpointEvery = 7 })
	appendN(t, p, 300)
	ds := leaseAll(t, p)
	rng := rand.New(rand.NewSource(1))
	rng.Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	settled := map[uint64]bool{}
	for _, d := range ds[:200] {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
		settled[d.Record.Offset] = true
	}
	if err := p.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds[200:250] {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
		settled[d.Record.Offset] = true
	}
	fs.Crash()
	p.closeFiles()
	p = mustOpen(t, fs)
	defer p.Close()
	for _, d := range leaseAll(t, p) {
		if settled[d.Record.Offset] {
			t.Fatalf("settled offset %d redelivered after crash", d.Record.Offset)
		}
		delete(settled, d.Record.Offset)
		settled[d.Record.Offset] = true
	}
	if len(settled) != 300 {
		t.Fatalf("%d offsets accounted for, want 300", len(settled))
	}
}

// TestRacingSettlesKeepFrontierMonotonic races settles of the same and of adjacent
// offsets from many goroutines: each lease settles exactly once and the frontier never
// moves back.
func TestRacingSettlesKeepFrontierMonotonic(t *testing.T) {
	p := mustOpen(t, vfs.NewMem())
	defer p.Close()
	const n = 400
	appendN(t, p, n)
	ds := leaseAll(t, p)
	var wins atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var back atomic.Bool
	go func() {
		last := uint64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			f := p.Stats().Frontier
			if f < last {
				back.Store(true)
			}
			last = f
		}
	}()
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Half the goroutines go backwards, so adjacent offsets settle in reverse.
			for k := 0; k < n; k++ {
				i := k
				if g%2 == 1 {
					i = n - 1 - k
				}
				if settleOne(p, ds[i]) == nil {
					wins.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if wins.Load() != n {
		t.Fatalf("%d settles succeeded for %d leases", wins.Load(), n)
	}
	if back.Load() {
		t.Fatal("the frontier moved back")
	}
	if st := p.Stats(); st.Frontier != n || st.AckedAhead != 0 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFailedJournalWriteRedelivers checks contract 5 under a failed fsync: the settle
// reports ErrStorage (so no 204 is written) and the message is delivered again.
func TestFailedJournalWriteRedelivers(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	defer p.Close()
	appendN(t, p, 1)
	d := leaseAll(t, p)[0]
	fs.FailSync(1)
	if err := settleOne(p, d); !errors.Is(err, ErrStorage) {
		t.Fatalf("settle with a failing fsync: %v", err)
	}
	again := leaseAll(t, p)
	if len(again) != 1 || again[0].Record.Offset != 0 {
		t.Fatalf("not redelivered after a failed settle: %v", offsets(again))
	}
}

// TestFailedAppendIsNotVisible checks contract 1: a batch whose fsync failed is neither
// acknowledged nor delivered.
func TestFailedAppendIsNotVisible(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	defer p.Close()
	appendN(t, p, 2)
	fs.FailSync(1)
	if _, err := p.Append([]segment.Record{{Value: []byte("lost")}}); !errors.Is(err, ErrStorage) {
		t.Fatalf("append with a failing fsync: %v", err)
	}
	if got := offsets(leaseAll(t, p)); fmt.Sprint(got) != "[0 1]" {
		t.Fatalf("delivered %v", got)
	}
}

// TestLapsedLeaseWakesWaiters checks that a lapsed lease returns to the queue on its own
// timer and signals OnAvailable, without any consume polling for it.
func TestLapsedLeaseWakesWaiters(t *testing.T) {
	woke := make(chan struct{}, 16)
	p := mustOpen(t, vfs.NewMem(), func(o *Options) {
		o.OnAvailable = func() {
			select {
			case woke <- struct{}{}:
			default:
			}
		}
	})
	defer p.Close()
	appendN(t, p, 1)
	ds, err := p.Lease(1, 50*time.Millisecond, 1<<40)
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	for len(woke) > 0 {
		<-woke
	}
	deadline := time.After(10 * time.Second)
	for !p.Available() {
		select {
		case <-woke:
		case <-deadline:
			t.Fatal("lapsed lease never came back")
		}
	}
	again, _ := p.Lease(1, time.Minute, 1<<40)
	if len(again) != 1 || again[0].Attempt != 2 {
		t.Fatalf("redelivery %+v", again)
	}
}

// TestRetentionSettlesAgedOut checks that messages removed by retention count as settled
// and stay so across restart.
func TestRetentionSettlesAgedOut(t *testing.T) {
	fs := vfs.NewMem()
	now := int64(1_000_000)
	clock := func(o *Options) {
		o.WallClock = func() int64 { return now }
		o.SegmentBytes = 4096
	}
	p := mustOpen(t, fs, clock)
	for i := 0; i < 200; i++ {
		if _, err := p.Append([]segment.Record{{Value: make([]byte, 100)}}); err != nil {
			t.Fatal(err)
		}
	}
	now += 10_000
	appendN(t, p, 1)
	n, err := p.EnforceRetention(now - 5_000)
	if err != nil || n == 0 {
		t.Fatalf("retention removed %d: %v", n, err)
	}
	st := p.Stats()
	if st.Frontier != st.Oldest || st.Oldest == 0 {
		t.Fatalf("stats after retention %+v", st)
	}
	p.Close()
	p = mustOpen(t, fs, clock)
	defer p.Close()
	ds := leaseAll(t, p)
	if len(ds) == 0 || ds[0].Record.Offset != st.Oldest {
		t.Fatalf("after restart first delivery %v, want from %d", offsets(ds), st.Oldest)
	}
}

func TestSettleRecordCodec(t *testing.T) {
	for _, offs := range [][]uint64{{0}, {5, 3, 9, 1 << 40}, {7, 7}} {
		got, err := decodeSettle(encodeSettle(offs))
		if err != nil || fmt.Sprint(got) != fmt.Sprint(offs) {
			t.Fatalf("%v -> %v %v", offs, got, err)
		}
	}
	for _, bad := range [][]byte{nil, {5}, {1, 0, 0}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
		if _, err := decodeSettle(bad); err == nil {
			t.Fatalf("decoded garbage %v", bad)
		}
	}
}

func FuzzDecodeSettle(f *testing.F) {
	f.Add(encodeSettle([]uint64{1, 2, 3}))
	f.Fuzz(func(t *testing.T, b []byte) {
		offs, err := decodeSettle(b)
		if err != nil {
			return
		}
		again, err := decodeSettle(encodeSettle(offs))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(offs) {
			t.Fatalf("round trip of %v: %v %v", offs, again, err)
		}
	})
}

// TestLostLogTailDoesNotSwallowNewMessages: if the message log comes back shorter than
// the settled state (a disk that lost confirmed writes), new messages reuse those offsets
// and must be delivered, not skipped as settled.
func TestLostLogTailDoesNotSwallowNewMessages(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs, func(o *Options) { o.SegmentBytes = 4096 })
	appendN(t, p, 5)
	for _, d := range leaseAll(t, p) {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Wipe the message log, as a lying disk might.
	infos, err := fs.ReadDir("/p/log")
	if err != nil {
		t.Fatal(err)
	}
	for _, fi := range infos {
		if err := fs.Remove("/p/log/" + fi.Name); err != nil {
			t.Fatal(err)
		}
	}
	p = mustOpen(t, fs)
	defer p.Close()
	appendN(t, p, 2)
	if got := offsets(leaseAll(t, p)); fmt.Sprint(got) != "[0 1]" {
		t.Fatalf("new messages after a lost log: delivered %v, want [0 1]", got)
	}
}

// TestLeaseAcrossSegments leases a run of offsets spanning many segment files in one
// call: every leased message must be delivered, none left leased but unsent.
func TestLeaseAcrossSegments(t *testing.T) {
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.SegmentBytes = 4096 })
	defer p.Close()
	for i := 0; i < 300; i++ {
		if _, err := p.Append([]segment.Record{{Value: make([]byte, 100)}}); err != nil {
			t.Fatal(err)
		}
	}
	ds := leaseAll(t, p)
	if len(ds) != 300 {
		t.Fatalf("delivered %d of 300 leased", len(ds))
	}
	for i, d := range ds {
		if d.Record.Offset != uint64(i) {
			t.Fatalf("delivery %d has offset %d", i, d.Record.Offset)
		}
	}
	if st := p.Stats(); st.InFlight != 300 {
		t.Fatalf("in flight %d", st.InFlight)
	}
}

// TestIdlePartitionAgesOut: a partition whose every message is older than retention
// loses them all, even though they sit in the active segment.
func TestIdlePartitionAgesOut(t *testing.T) {
	fs := vfs.NewMem()
	now := int64(1_000_000)
	p := mustOpen(t, fs, func(o *Options) { o.WallClock = func() int64 { return now } })
	defer p.Close()
	appendN(t, p, 5)
	now += 10_000
	n, err := p.EnforceRetention(now - 5_000)
	if err != nil || n != 5 {
		t.Fatalf("removed %d: %v", n, err)
	}
	if st := p.Stats(); st.Oldest != 5 || st.Frontier != 5 || st.Backlog != 0 {
		t.Fatalf("stats %+v", st)
	}
	appendN(t, p, 1)
	if got := offsets(leaseAll(t, p)); fmt.Sprint(got) != "[5]" {
		t.Fatalf("after aging out, delivered %v", got)
	}
}

// TestRestoredBackupNeverReusesEpochs: a data dir restored from an older copy must not
// open with an epoch already used after that copy, or stale handles could match new
// leases.
func TestRestoredBackupNeverReusesEpochs(t *testing.T) {
	fs := vfs.NewMem()
	now := uint32(1000)
	defer func(f func() uint32) { epochFloor = f }(epochFloor)
	epochFloor = func() uint32 { return now }
	p := mustOpen(t, fs)
	p.Close()
	backup, err := fs.ReadFile("/p/epoch")
	if err != nil {
		t.Fatal(err)
	}
	used := uint32(0)
	for i := 0; i < 3; i++ {
		now += 5 // restarts some seconds apart
		p = mustOpen(t, fs)
		used = p.Epoch()
		p.Close()
	}
	now += 60 // the restore happens later still
	if err := fs.WriteFile("/p/epoch", backup); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, fs)
	defer p.Close()
	if p.Epoch() <= used {
		t.Fatalf("after restoring an old epoch file the partition opened with epoch %d, already used up to %d", p.Epoch(), used)
	}
}

// TestDiskFullRecovers (RELIABILITY 20): a full disk refuses the produce and the settle
// with ErrDiskFull, stores nothing, and the partition works again once space returns.
func TestDiskFullRecovers(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	defer p.Close()
	appendN(t, p, 2)
	d := leaseAll(t, p)
	fs.SetFreeSpace(10)
	if _, err := p.Append([]segment.Record{{Value: make([]byte, 100)}}); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("append on a full disk: %v", err)
	}
	if err := settleOne(p, d[0]); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("settle on a full disk: %v", err)
	}
	fs.SetFreeSpace(-1)
	if _, err := p.Append([]segment.Record{{Value: []byte("after")}}); err != nil {
		t.Fatalf("append after space returned: %v", err)
	}
	again := leaseAll(t, p)
	if got := offsets(again); fmt.Sprint(got) != "[0 2]" {
		t.Fatalf("after the refused settle, delivered %v; want offset 0 again and the new 2", got)
	}
	if err := settleOne(p, again[0]); err != nil {
		t.Fatalf("settle after space returned: %v", err)
	}
}

// TestDamagedRecordDoesNotBlockNeighbours: a record failing its CRC is never served, and
// the good records leased in the same run are delivered.
func TestDamagedRecordDoesNotBlockNeighbours(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs, func(o *Options) { o.SegmentBytes = 4096 })
	for i := 0; i < 60; i++ { // several segments, so the damage sits in a sealed one
		if _, err := p.Append([]segment.Record{{Value: make([]byte, 100)}}); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	infos, _ := fs.ReadDir("/p/log")
	var first string
	for _, fi := range infos {
		if strings.HasSuffix(fi.Name, ".log") {
			first = "/p/log/" + fi.Name
			break
		}
	}
	// Flip a byte inside the third record's value (frames are about 140 bytes).
	if err := fs.FlipByte(first, 3*140-20, 0x40); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, fs)
	defer p.Close()
	ds, err := p.Lease(100, time.Minute, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]bool{}
	for _, d := range ds {
		got[d.Record.Offset] = true
	}
	if got[2] {
		t.Fatal("the damaged record was served")
	}
	// Records after a damaged one are reachable again from the next sparse index entry
	// (every 4 KiB, about 29 records here): everything before the damage and everything
	// from the next index entry on must be delivered in this same lease run.
	for _, o := range []uint64{0, 1, 30, 45, 59} {
		if !got[o] {
			t.Fatalf("offset %d, outside the damaged index block, was not delivered (%d of 60 were)", o, len(ds))
		}
	}
	if _, err := p.Read(2, 10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("replay of the damaged record: %v, want ErrCorrupt", err)
	}
}

// TestLeaseByteBudget: a consume never reads more than its byte budget into memory (the
// first message always goes); messages past it stay queued, not counted as attempts.
func TestLeaseByteBudget(t *testing.T) {
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.SegmentBytes = 8192 })
	defer p.Close()
	for i := 0; i < 20; i++ {
		if _, err := p.Append([]segment.Record{{Value: make([]byte, 1000)}}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := p.Lease(20, time.Minute, 4500)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) < 4 || len(ds) > 6 {
		t.Fatalf("a 4500-byte budget gave %d messages of 1000 bytes", len(ds))
	}
	if st := p.Stats(); st.InFlight != len(ds) {
		t.Fatalf("%d in flight after %d delivered: the rest were not handed back", st.InFlight, len(ds))
	}
	rest, _ := p.Lease(100, time.Minute, 1<<40)
	if len(ds)+len(rest) != 20 || rest[0].Attempt != 1 {
		t.Fatalf("then %d more (attempt %d); want all 20 in total, first attempts", len(rest), rest[0].Attempt)
	}
	if one, _ := p.Lease(1, time.Minute, 1); len(one) != 0 {
		t.Fatalf("everything is leased, yet %d more", len(one))
	}
}
