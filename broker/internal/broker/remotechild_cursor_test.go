package broker

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// remoteCopySetup creates topic orders (three partitions) in a cluster of three and
// attaches a remote child towards f on a node that is not the controller, copying a
// partition held there: it returns that node's index, the partition and the child.
func remoteCopySetup(t *testing.T, bs []*Broker, f *fakeRemote) (x, pp int, rc meta.RemoteChild) {
	t.Helper()
	ctl := controllerIndex(bs)
	m, err := bs[ctl].CreateTopic(context.Background(), TopicSpec{Name: "orders", Partitions: ptr[int32](3)})
	if err != nil {
		t.Fatal(err)
	}
	pp, x = -1, -1
	for i := range 3 {
		if h := holderIndex(t, bs, "orders", i); h != ctl {
			pp, x = i, h
			break
		}
	}
	if pp < 0 {
		t.Fatal("every partition of three was placed on the controller: the test needs one elsewhere")
	}
	b := bs[x]
	pollUntil(t, "the partition's holder to have the topic", func() error { return b.Exists("orders") })
	rc = meta.RemoteChild{Parent: "orders", ParentIncarnation: m.Incarnation, URL: f.srv.URL, Topic: "copy", Username: "copier",
		RemoteIncarnation: "1", RemotePartitions: 3, Start: "now", Cursors: []uint64{0, 0, 0}}
	if rc.Sealed, err = b.sealPassword("remote-password-42", remoteAAD(rc)); err != nil {
		t.Fatal(err)
	}
	if rc, err = b.meta.AttachRemoteChild(rc); err != nil {
		t.Fatal(err)
	}
	if err := b.reconcile(false); err != nil {
		t.Fatal(err)
	}
	return x, pp, rc
}

// copiesOf counts the copies of offset off of parent partition pp the remote stored.
func (f *fakeRemote) copiesOf(pp int, off int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.stored {
		if int(o.Partition) == pp && o.Offset == off {
			n++
		}
	}
	return n
}

// remoteCopyCluster starts a fake cluster of three and a fake remote, and attaches a
// remote child of "orders" (remoteCopySetup): it returns the plane, the remote, the
// parent partition's holder, that partition, the child and its name.
func remoteCopyCluster(t *testing.T) (*fakePlane, *fakeRemote, *Broker, int, meta.RemoteChild, string) {
	t.Helper()
	plane, bs := startFakeCluster(t, 3)
	f := startFakeRemote(t)
	x, pp, rc := remoteCopySetup(t, bs, f)
	return plane, f, bs[x], pp, rc, RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
}

// copiedCount reads narad_remote_child_copied_total of remote child name on b.
func copiedCount(b *Broker, name string) float64 {
	return promtest.ToFloat64(b.metrics.RemoteChild.Copied.WithLabelValues("orders", name))
}

// TestRemoteChildRetriesOnlyTheCursorSaveAfterA202: a batch the remote answered 202
// for, whose cursor cannot be saved through the control plane (the controller cannot
// be reached for writes), is not sent again while only the save fails: the save is
// retried with backoff, and the next batch is sent once the cursor moved. The old code
// failed the round and read the same batch again at the cursor, so the remote stored
// it once per retry (every 5 s, up to 1,000 messages each time) for as long as the
// control plane stayed out of reach, against "at most one batch per failure", and the
// messages produced meanwhile went with it.
func TestRemoteChildRetriesOnlyTheCursorSaveAfterA202(t *testing.T) {
	t.Parallel()
	plane, f, b, pp, rc, name := remoteCopyCluster(t)
	ctx := context.Background()
	saveFailures := func() float64 {
		return promtest.ToFloat64(b.metrics.RemoteChild.Failures.WithLabelValues("orders", name, "control_plane"))
	}

	// The controller takes no write from another node (each waits the apply timeout,
	// 5 s, and fails); the node stays ready, as its catch-ups go through.
	var refusing atomic.Bool
	refusing.Store(true)
	plane.mu.Lock()
	plane.refuseMeta = func(kind string) bool { return refusing.Load() && kind == "apply" }
	plane.mu.Unlock()
	if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: int32(pp), Value: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "m0's cursor save to fail", func() error {
		if saveFailures() < 1 {
			return fmt.Errorf("no failed save yet")
		}
		return nil
	})
	if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: int32(pp), Value: []byte("m1")}}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "a second failed save", func() error {
		if saveFailures() < 2 {
			return fmt.Errorf("%v failed saves", saveFailures())
		}
		return nil
	})
	if !b.Ready() {
		t.Fatal("the node stopped being ready: the test proves nothing about the save's retry")
	}
	if n := f.copiesOf(pp, 0); n != 1 {
		t.Errorf("m0 was answered 202 once and only its cursor's save failed since; the remote stored it %d times, want 1", n)
	}
	if n := f.copiesOf(pp, 1); n != 0 {
		t.Errorf("the remote stored m1 %d times before the cursor moved past m0, want 0", n)
	}

	// Once the controller takes writes again the cursor moves, and m1 follows.
	refusing.Store(false)
	pollUntil(t, "the cursor to pass m1", func() error {
		if r, ok := b.meta.RemoteChild(rc.ID); !ok || r.Cursors[pp] != 2 {
			return fmt.Errorf("cursor %v", r.Cursors)
		}
		return nil
	})
	if n0, n1 := f.copiesOf(pp, 0), f.copiesOf(pp, 1); n0 != 1 || n1 != 1 {
		t.Errorf("the remote stored m0 %d and m1 %d times, want each once", n0, n1)
	}
	// Counted once the move returned, a moment after it applied.
	pollUntil(t, "narad_remote_child_copied_total to count m0 and m1", func() error {
		if got := copiedCount(b, name); got != 2 {
			return fmt.Errorf("it is %v, want 2", got)
		}
		return nil
	})
}

// TestRemoteChildCountsABatchWhoseCursorMoveCommittedAfterAll: the remote answered
// 202 and the cursor's move committed on the controller, but its answer was lost: the
// copier saw a failure. At the next round the cursor stands past the batch, which must
// then count as copied (narad_remote_child_copied_total) and the partition be
// reported copying again, without another message. On the first version of the retry
// the batch was dropped from memory uncounted, and the partition stayed reported
// failing until the next batch.
func TestRemoteChildCountsABatchWhoseCursorMoveCommittedAfterAll(t *testing.T) {
	t.Parallel()
	plane, f, b, pp, rc, name := remoteCopyCluster(t)
	ctx := context.Background()
	var dropped atomic.Int32
	plane.mu.Lock()
	plane.dropMetaReply = func(kind string) bool { return kind == "apply" && dropped.Add(1) == 1 }
	plane.mu.Unlock()
	if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: int32(pp), Value: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the cursor to pass m0", func() error {
		if r, ok := b.meta.RemoteChild(rc.ID); !ok || r.Cursors[pp] != 1 {
			return fmt.Errorf("cursor %v", r.Cursors)
		}
		return nil
	})
	if dropped.Load() == 0 {
		t.Fatal("no cursor move's answer was lost: the test proves nothing")
	}
	pollUntil(t, "m0 counted as copied", func() error {
		if got := copiedCount(b, name); got != 1 {
			return fmt.Errorf("narad_remote_child_copied_total is %v, want 1", got)
		}
		return nil
	})
	if n := f.copiesOf(pp, 0); n != 1 {
		t.Errorf("the remote stored m0 %d times, want once", n)
	}
}

// TestRemoteChildCopiesNothingWhileItsNodeIsNotCurrent: a node cut off from the
// controller does not hear of a detach; from the time its metadata is not current
// (the metadata lease ran out) its remote copier sends nothing, as fan-out's, and
// once it caught up the copier is gone. The old code went on copying from the
// metadata it had: m0, which the remote refused before the cut, reached the remote
// after the detach answered.
func TestRemoteChildCopiesNothingWhileItsNodeIsNotCurrent(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 3)
	ctx := context.Background()
	// The first produce-batch request is held until release, then refused (503);
	// the next ones are stored.
	f := &fakeRemote{script: []int{http.StatusServiceUnavailable}}
	arrived, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if held.CompareAndSwap(false, true) {
			close(arrived)
			<-release
		}
		f.serve(w, r)
	}))
	t.Cleanup(f.srv.Close)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	x, pp, rc := remoteCopySetup(t, bs, f)
	b, ctl := bs[x], controllerIndex(bs)
	if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: int32(pp), Value: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("m0 never reached the remote")
	}

	undo := plane.isolateMeta(t, bs, x)
	defer undo()
	if err := bs[ctl].DetachRemoteChild(ctx, "orders", RemoteChildPrefix+strconv.FormatUint(rc.ID, 10)); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the cut-off node to stop counting as ready", func() error {
		if b.Ready() {
			return fmt.Errorf("it still does")
		}
		return nil
	})
	if _, ok := b.meta.RemoteChild(rc.ID); !ok {
		t.Fatal("the cut-off node applied the detach: the test cuts nothing")
	}
	close(release) // refused: the copier retries after 200 ms (300 at most)
	time.Sleep(2 * time.Second)
	if n := f.copiesOf(pp, 0); n != 0 {
		t.Errorf("a node whose metadata was not current sent m0 to the remote %d times after the child was detached", n)
	}

	undo()
	pollUntil(t, "the node to apply the detach", func() error {
		if _, ok := b.meta.RemoteChild(rc.ID); ok {
			return fmt.Errorf("it still has the child")
		}
		return nil
	})
	pollUntil(t, "the node to stop the copier", func() error {
		b.rcMu.Lock()
		defer b.rcMu.Unlock()
		if b.rcopiers[rc.ID] != nil {
			return fmt.Errorf("it still runs")
		}
		return nil
	})
	if n := f.copiesOf(pp, 0); n != 0 {
		t.Errorf("the remote stored m0 %d times after the detach, want 0", n)
	}
}
