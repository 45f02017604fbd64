package partition

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestACheckpointRacingACloseWritesNothingAfterIt: a queue checkpoint that a settle
// started in the background can take the checkpoint lock after Close's own
// checkpoint, and copy the state before the close marks the partition closed. The
// close did not wait for it: Close returned while it still had its queue.ckpt to
// write, and the partition opened again on the same directory at once (a replica
// reopened in a new group, or after its data was set aside) wrote newer checkpoints
// and compacted its journal under it. The late write then put the old state back:
// after a crash the partition refused to open ("settle journal starts at 45, after
// checkpoint position 5"), and a replica with no other copy kept its whole topic
// closed at every start. Two checkpoints writing queue.ckpt.tmp at once could also
// leave a checkpoint that fails its CRC. Close now waits for such a checkpoint.
func TestACheckpointRacingACloseWritesNothingAfterIt(t *testing.T) {
	defer func(n int64) { journalSegmentBytes = n }(journalSegmentBytes)
	journalSegmentBytes = 300 // a journal segment every dozen settles or so
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, 100)
	settle := func(p *Partition, n int) {
		t.Helper()
		for range n {
			ds, err := p.Lease(1, time.Minute, 1<<20)
			if err != nil || len(ds) != 1 {
				t.Fatalf("lease: %v %v", ds, err)
			}
			if err := settleOne(p, ds[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	settle(p, 5)

	var (
		closing, copying atomic.Bool
		copied           = make(chan struct{})
		release          = make(chan struct{})
		releaseOnce      sync.Once
		late             = make(chan error, 1)
	)
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free()
	testHooks.race = func(op string) {
		switch {
		case op == "close" && closing.Swap(false):
			// The background checkpoint comes now, after Close's own.
			copying.Store(true)
			go func() { late <- p.Checkpoint() }()
			<-copied
		case op == "checkpoint" && copying.Swap(false):
			close(copied)
			<-release // held with its copy of the state until the test lets it go
		case op == "close waits for a checkpoint":
			free() // the close waits for it: it may write now, before Close returns
		}
	}
	t.Cleanup(func() { testHooks.race = nil })

	closing.Store(true)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Opened again at once on the same directory; more settles roll the journal, and
	// a checkpoint compacts it.
	p2 := mustOpen(t, fs)
	settle(p2, 40)
	if err := p2.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	want := p2.Stats().Frontier
	free()
	if err := <-late; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	_ = p2.closeFiles() // a crash: no checkpoint at the close
	p3, err := Open(Options{Dir: "/p", FS: fs, Queue: testQueue})
	if err != nil {
		t.Fatalf("the partition does not open after a checkpoint of its closed predecessor wrote late: %v", err)
	}
	defer p3.Close()
	if got := p3.Stats().Frontier; got != want {
		t.Fatalf("frontier %d after the restart; want %d", got, want)
	}
}
