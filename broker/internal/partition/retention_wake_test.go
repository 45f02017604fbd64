package partition

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestRetentionThatFreesLeasesWakesConsumers: retention that removes leased messages
// ends their leases, and one that moves the frontier moves the acked-ahead window: either
// may make messages leasable that were not (the in-flight cap was reached, or the
// window). Waiting consumes must be woken then, as an ack wakes them. On the old code
// retention woke nobody: a long poll on a partition at its cap (a shorter retention_ms
// set to purge messages leased by consumers that had died, under a long visibility
// timeout) slept on to the end of its wait, up to 20 s, with messages to deliver.
func TestRetentionThatFreesLeasesWakesConsumers(t *testing.T) {
	fs := vfs.NewMem()
	now := int64(1_000_000)
	var woken atomic.Int32
	p := mustOpen(t, fs, func(o *Options) {
		o.WallClock = func() int64 { return now }
		o.SegmentBytes = 4096
		o.Queue = queue.Config{Visibility: time.Hour, MaxInFlight: 1, MaxAckedAhead: 1024}
		o.OnAvailable = func() { woken.Add(1) }
	})
	defer p.Close()
	for range 100 {
		if _, err := p.Append([]segment.Record{{Value: make([]byte, 100)}}); err != nil {
			t.Fatal(err)
		}
	}
	if ds, err := p.Lease(1, time.Hour, 1<<20); err != nil || len(ds) != 1 {
		t.Fatalf("lease: %v %v", ds, err)
	}
	now += 10_000
	appendN(t, p, 1)
	if p.Available() {
		t.Fatal("precondition: the partition is at its in-flight cap, yet available")
	}
	woken.Store(0)
	n, err := p.EnforceRetention(now - 5_000)
	if err != nil || n == 0 {
		t.Fatalf("retention removed %d: %v", n, err)
	}
	if !p.Available() {
		t.Fatal("retention removed the leased message, yet nothing is available")
	}
	if woken.Load() == 0 {
		t.Error("retention ended the lease that held the partition at its cap, and woke no consumer")
	}
}
