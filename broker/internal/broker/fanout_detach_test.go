package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// detachSetup makes, on a fake cluster of three, a parent of one partition held by a
// node that is not the controller and a child of one partition held by another node,
// attaches the child (no delay), and waits until one message is copied. It returns the
// controller's index, the parent's holder's, and the two names.
func detachSetup(t *testing.T, bs []*Broker) (leader, hp int, parent, child string) {
	t.Helper()
	ctx := context.Background()
	leader = controllerIndex(bs)
	hp = leader
	for i := 0; hp == leader; i++ {
		if i == 10 {
			t.Fatal("ten parents in a row were placed on the controller")
		}
		parent = fmt.Sprintf("par%d", i)
		if _, err := bs[leader].CreateTopic(ctx, TopicSpec{Name: parent, Partitions: ptr[int32](1)}); err != nil {
			t.Fatal(err)
		}
		hp = holderIndex(t, bs, parent, 0)
	}
	for i, hc := 0, hp; hc == hp; i++ {
		if i == 10 {
			t.Fatal("ten children in a row were placed on the parent's holder")
		}
		child = fmt.Sprintf("kid%d", i)
		if _, err := bs[leader].CreateTopic(ctx, TopicSpec{Name: child, Partitions: ptr[int32](1)}); err != nil {
			t.Fatal(err)
		}
		hc = holderIndex(t, bs, child, 0)
	}
	if _, err := bs[leader].AttachChild(ctx, parent, child, 0); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the parent's holder to open the parent", func() error { _, err := bs[hp].lookupLocal(parent); return err })
	if _, err := bs[hp].Produce(ctx, parent, []Outgoing{{Partition: 0, Value: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "m0 to be copied", func() error { return childHolds(bs[leader], child, 1) })
	return leader, hp, parent, child
}

// childHolds checks that child's one partition holds exactly n messages.
func childHolds(b *Broker, child string, n int) error {
	from := uint64(0)
	ds, _, err := readRange(b, context.Background(), child, 0, &from, nil, 10)
	if err != nil {
		return err
	}
	if len(ds) != n {
		return fmt.Errorf("the child holds %d messages; want %d", len(ds), n)
	}
	return nil
}

// copierOf returns the copier node b runs for child's attachment attachID (nil: none).
func copierOf(b *Broker, child string, attachID uint64) *copier {
	b.copiersMu.Lock()
	defer b.copiersMu.Unlock()
	for k, c := range b.copiers {
		if k.child == child && k.attachID == attachID {
			return c
		}
	}
	return nil
}

// TestACopyHeldAcrossADetachAndAReattachIsRefused: a copy the parent's holder sent
// before a detach, and which reached the child's holder only after the child was
// attached again as a delay child, must not be stored: the parent message it carries
// was not due yet. On the old code the copy named only the child's incarnation, and
// it was stored at once.
func TestACopyHeldAcrossADetachAndAReattachIsRefused(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 3)
	ctx := context.Background()
	leader, hp, parent, child := detachSetup(t, bs)
	old, _ := bs[leader].meta.Topic(child)

	held, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	defer let() // a failure below must not leave the copier held (Close waits for it)
	plane.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
		if req.Kind == dataAppend && req.Topic == child {
			once.Do(func() { close(held) })
			<-release
		}
		return deliver(ctx)
	})
	if _, err := bs[hp].Produce(ctx, parent, []Outgoing{{Partition: 0, Value: []byte("m1")}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the parent's holder sent no copy of m1 within 30 s")
	}
	detached := make(chan error, 1)
	go func() { detached <- bs[leader].DetachChild(ctx, parent, child) }()
	pollUntil(t, "the detach to apply on the controller", func() error {
		if m, _ := bs[leader].meta.Topic(child); m.Parent != "" {
			return fmt.Errorf("the child still has parent %q", m.Parent)
		}
		return nil
	})
	// The attach answers with the child's lag, which asks the parent's holder, whose
	// reconcile waits for the held copy: it answers once the copy is let go.
	attached := make(chan error, 1)
	go func() {
		_, err := bs[leader].AttachChild(ctx, parent, child, 10*60*1000)
		attached <- err
	}()
	var now meta.Topic
	pollUntil(t, "the attach again to apply on the controller", func() error {
		if now, _ = bs[leader].meta.Topic(child); now.Parent != parent {
			return fmt.Errorf("the child has parent %q", now.Parent)
		}
		return nil
	})
	let()
	for what, ch := range map[string]chan error{"detach": detached, "attach": attached} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("the %s: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the %s did not answer within 30 s", what)
		}
	}
	pollUntil(t, "the parent's holder to run the delay child's copier", func() error {
		if c := copierOf(bs[hp], child, now.AttachID); c == nil || c.rounds.Load() == 0 {
			return fmt.Errorf("no round of the new attachment's copier yet")
		}
		if copierOf(bs[hp], child, old.AttachID) != nil {
			return fmt.Errorf("the old attachment's copier still runs")
		}
		return nil
	})
	if err := childHolds(bs[leader], child, 1); err != nil {
		t.Errorf("after the detach and an attach with a 10-minute delay: %v (m1 came early)", err)
	}
}

// TestACopierCutOffFromTheControllerCopiesNothingAfterADetach: the parent's holder is
// cut off from the control plane, so it never hears of the detach and keeps its
// copier. The detach answers after the metadata lease without its word (counted), and
// from then on that copier must not copy: its node's metadata is not current. On the
// old code the detach answered at once, and the copier copied m1, left behind by a
// failing copy, into the detached child as soon as the copy could go through (into a
// child attached again as a delay child meanwhile, it came early).
func TestACopierCutOffFromTheControllerCopiesNothingAfterADetach(t *testing.T) {
	t.Parallel()
	plane, bs := startFakeCluster(t, 3)
	ctx := context.Background()
	leader, hp, parent, child := detachSetup(t, bs)
	old, _ := bs[leader].meta.Topic(child)
	c := copierOf(bs[hp], child, old.AttachID)
	if c == nil {
		t.Fatal("the parent's holder runs no copier")
	}

	var refusing, counting atomic.Bool
	var tried, copied atomic.Int64
	refusing.Store(true)
	plane.setHook(func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error) {
		if req.Kind == dataAppend && req.Topic == child {
			tried.Add(1)
			if counting.Load() {
				copied.Add(1)
			}
			if refusing.Load() {
				return nil, fmt.Errorf("%w: held back by the test", meta.ErrNotDelivered)
			}
		}
		return deliver(ctx)
	})
	if _, err := bs[hp].Produce(ctx, parent, []Outgoing{{Partition: 0, Value: []byte("m1")}}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "a copy of m1 to be tried", func() error {
		if tried.Load() == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	undo := plane.isolateMeta(t, bs, hp)
	defer undo()
	if err := bs[leader].DetachChild(ctx, parent, child); err != nil {
		t.Fatal(err)
	}
	if n := promtest.ToFloat64(bs[leader].metrics.DetachesUnconfirmed); n != 1 {
		t.Errorf("narad_fanout_detaches_unconfirmed_total is %v; want 1 (the parent's holder could not confirm)", n)
	}
	pollUntil(t, "the cut-off node to stop counting as ready", func() error {
		if bs[hp].Ready() {
			return fmt.Errorf("it still does")
		}
		return nil
	})
	if copierOf(bs[hp], child, old.AttachID) != c {
		t.Fatal("the cut-off node no longer runs the old attachment's copier; the test cuts nothing")
	}
	counting.Store(true)
	refusing.Store(false)
	r0 := c.rounds.Load()
	pollUntil(t, "two more rounds of the old copier", func() error {
		if c.rounds.Load() < r0+2 {
			return fmt.Errorf("%d rounds since", c.rounds.Load()-r0)
		}
		return nil
	})
	if n := copied.Load(); n > 0 {
		t.Errorf("a node whose metadata was not current sent %d copies for an attachment detached meanwhile", n)
	}
	if err := childHolds(bs[leader], child, 1); err != nil {
		t.Errorf("after the detach answered: %v", err)
	}
}
