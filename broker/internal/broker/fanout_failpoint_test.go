//go:build failpoints

package broker

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
)

// countingHandler counts log records whose message starts with prefix.
type countingHandler struct {
	prefix string
	n      *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

func startBrokerWithLog(t *testing.T, dir string, h slog.Handler) *Broker {
	t.Helper()
	b, err := Open(Options{DataDir: dir, NodeID: "n1", Logger: slog.New(h), RetentionInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// keysFor returns one key hashing to each of n partitions.
func keysFor(n int) [][]byte {
	out := make([][]byte, n)
	found := 0
	for i := 0; found < n; i++ {
		k := []byte("k" + time.Duration(i).String())
		if p := PartitionForKey(k, n); out[p] == nil {
			out[p] = k
			found++
		}
	}
	return out
}

// TestFailpointFanoutRetryCopiesOnlyWhatFailed fails the copy into one of a child's two
// partitions for good (an EIO fails that partition's log closed) and lets the copier
// retry several times: the other child partition, whose append succeeded the first
// time, must hold each of its messages once, not once more per retry.
func TestFailpointFanoutRetryCopiesOnlyWhatFailed(t *testing.T) {
	defer failpoint.Set("")
	var retries atomic.Int64
	b := startBrokerWithLog(t, t.TempDir(), countingHandler{prefix: "fan-out copy failed", n: &retries})
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "p", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "c", Partitions: ptr[int32](2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	keys := keysFor(2)
	// Hit 1 is the parent's append, hits 2 and 3 the copy's two child appends: the
	// first of those fails, the other succeeds.
	if err := failpoint.Set(failpoint.SegmentAfterWrite + ":eio@2"); err != nil {
		t.Fatal(err)
	}
	msgs := []Outgoing{
		{Partition: -1, Key: keys[0], Value: []byte("a")},
		{Partition: -1, Key: keys[1], Value: []byte("b")},
		{Partition: -1, Key: keys[0], Value: []byte("c")},
	}
	if _, err := b.Produce(ctx, "p", msgs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for retries.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the copier retried %d times in 60 s, want at least 4", retries.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	ct, err := b.lookup("c")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]uint64{0: 2, 1: 1}
	failed, healthy := 0, 0
	for cp, p := range ct.parts() {
		switch end := p.Stats().End; end {
		case 0:
			failed++
		case want[cp]:
			healthy++
		default:
			t.Errorf("child partition %d holds %d messages after %d retries, want 0 (its append failed) or %d (copied once)", cp, end, retries.Load(), want[cp])
		}
	}
	if failed != 1 || healthy != 1 {
		t.Errorf("want one failed and one healthy child partition, got %d failed and %d healthy", failed, healthy)
	}
}

// TestFailpointFanoutFailedPartitionDoesNotStarveOthers fails child partition 0 for good: the
// copy from parent partition 1 into the healthy child partition 1 must go on.
func TestFailpointFanoutFailedPartitionDoesNotStarveOthers(t *testing.T) {
	defer failpoint.Set("")
	var retries atomic.Int64
	b := startBrokerWithLog(t, t.TempDir(), countingHandler{prefix: "fan-out copy failed", n: &retries})
	defer b.Close()
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](2)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	// Hit 1: the parent's partition 0; hit 2: its copy into child partition 0, which fails.
	if err := failpoint.Set(failpoint.SegmentAfterWrite + ":eio@2"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for retries.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the copy into child partition 0 never failed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 1, Value: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	ct, err := b.lookup("c")
	if err != nil {
		t.Fatal(err)
	}
	for ct.parts()[1].Stats().End != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("child partition 1 holds %d messages after %d failed rounds, want 1: the failed partition 0 holds up the copy", ct.parts()[1].Stats().End, retries.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if end := ct.parts()[0].Stats().End; end != 0 {
		t.Fatalf("child partition 0 holds %d messages; its append was failed", end)
	}
}
