package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

func mustStartBroker(t *testing.T, dir string) *Broker {
	t.Helper()
	return mustStart(t, Options{DataDir: dir, NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetentionInterval: 50 * time.Millisecond})
}

// mustStart opens a broker with opts and starts it (within 30 s).
func mustStart(t *testing.T, opts Options) *Broker {
	t.Helper()
	b, err := Open(opts)
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

func ptr[T any](v T) *T { return &v }

func produceN(t *testing.T, b *Broker, topic string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := b.Produce(context.Background(), topic, []Outgoing{{Partition: -1, Value: []byte(strconv.Itoa(i))}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestConcurrentFlowUnderRace runs producers, consumers, acks, nacks, an alter and
// inspects at once (run with -race), then checks every message was settled exactly once
// and nothing is left.
func TestConcurrentFlowUnderRace(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "work", Partitions: ptr[int32](4), VisibilityMs: ptr[int64](2000)}); err != nil {
		t.Fatal(err)
	}
	const producers, per = 4, 200
	var settled sync.Map
	var dup atomic.Bool
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				id := fmt.Sprintf("%d-%d", p, i)
				if _, err := b.Produce(ctx, "work", []Outgoing{{Partition: -1, Key: []byte(id), Value: []byte(id)}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var done atomic.Int64
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for c := 0; c < 6; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < producers*per && cctx.Err() == nil {
				ds, err := b.Consume(cctx, "work", 3, 200*time.Millisecond)
				if err != nil {
					if cctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				reqs := make([]AckReq, 0, len(ds))
				for i, d := range ds {
					if c == 0 && i == 0 && d.Attempt == 1 {
						// Some nacks, so redeliveries mix in.
						if errs := b.Ack("work", []AckReq{{Handle: d.Handle, Mode: ExtendBy}}); errs[0] != nil {
							t.Error(errs[0])
						}
						continue
					}
					reqs = append(reqs, AckReq{Handle: d.Handle})
				}
				values := make(map[string]string, len(ds))
				for _, d := range ds {
					values[d.Handle] = string(d.Value)
				}
				for i, err := range b.Ack("work", reqs) {
					if err != nil {
						t.Errorf("ack: %v", err)
						continue
					}
					if _, loaded := settled.LoadOrStore(values[reqs[i].Handle], true); loaded {
						dup.Store(true)
					}
					done.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for done.Load() < producers*per && cctx.Err() == nil {
			if _, _, err := b.Topic("work"); err != nil {
				t.Error(err)
				return
			}
			if _, err := b.AlterTopic(ctx, "work", TopicAlter{VisibilityMs: ptr[int64](3000)}); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()
	if dup.Load() {
		t.Fatal("a message was settled twice")
	}
	if got := done.Load(); got != producers*per {
		t.Fatalf("settled %d of %d", got, producers*per)
	}
	_, parts, _ := b.Topic("work")
	for _, p := range parts {
		if p.Stats.Backlog != 0 || p.Stats.InFlight != 0 || p.Stats.Frontier != p.Stats.End {
			t.Fatalf("partition %d not drained: %+v", p.Index, p.Stats)
		}
	}
}

// TestDeleteRecreateIsolation checks contract 6: nothing of a deleted incarnation reaches
// a new topic of the same name, and its handles are stale.
func TestDeleteRecreateIsolation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	ctx := context.Background()
	old, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](1)})
	if err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 3)
	ds, err := b.Consume(ctx, "t", 1, 0)
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	if err := b.DeleteTopic(ctx, "t", 0); err != nil {
		t.Fatal(err)
	}
	if errs := b.Ack("t", []AckReq{{Handle: ds[0].Handle}}); !errors.Is(errs[0], ErrTopicNotFound) {
		t.Fatalf("ack while the topic is gone: %v", errs[0])
	}
	nw, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](1)})
	if err != nil || nw.Incarnation == old.Incarnation {
		t.Fatalf("recreate: %+v %v", nw, err)
	}
	if errs := b.Ack("t", []AckReq{{Handle: ds[0].Handle}}); !errors.Is(errs[0], ErrLeaseLost) {
		t.Fatalf("ack with a handle of the old incarnation: %v", errs[0])
	}
	if got, _ := b.Consume(ctx, "t", 10, 0); len(got) != 0 {
		t.Fatalf("new topic delivered %d old messages", len(got))
	}
	// And across a restart, the old incarnation's data is gone for good.
	b.Close()
	b = mustStartBroker(t, dir)
	defer b.Close()
	if got, _, _ := readRange(b, ctx, "t", 0, nil, nil, 10); len(got) != 0 {
		t.Fatalf("replay after restart shows %d old messages", len(got))
	}
}

// TestLongPollWakesOnProduce checks a parked consume returns as soon as a message is
// produced, well before its wait.
func TestLongPollWakesOnProduce(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](3)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan []Delivered, 1)
	go func() {
		ds, err := b.Consume(ctx, "t", 1, 15*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- ds
	}()
	// Wait until the consumer is parked, then produce.
	deadline := time.Now().Add(10 * time.Second)
	for testutilGauge(b) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	produceN(t, b, "t", 1)
	select {
	case ds := <-got:
		if len(ds) != 1 {
			t.Fatalf("woke with %d messages", len(ds))
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("woke %v after the produce", el)
		}
	case <-time.After(14 * time.Second):
		t.Fatal("the parked consume never woke")
	}
}

func testutilGauge(b *Broker) float64 {
	return promtest.ToFloat64(b.metrics.ConsumeWaiting)
}

// TestFairAcrossPartitions checks that single-message consumes rotate over partitions.
func TestFairAcrossPartitions(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](3)}); err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 3; p++ {
		for i := 0; i < 10; i++ {
			if _, err := b.Produce(ctx, "t", []Outgoing{{Partition: p, Value: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[int32]int{}
	for i := 0; i < 9; i++ {
		ds, err := b.Consume(ctx, "t", 1, 0)
		if err != nil || len(ds) != 1 {
			t.Fatal(ds, err)
		}
		seen[ds[0].Partition]++
	}
	for p := int32(0); p < 3; p++ {
		if seen[p] != 3 {
			t.Fatalf("partition share over 9 consumes: %v", seen)
		}
	}
}

// TestLongPollCap checks that past MaxLongPolls a consume that would wait answers
// unavailable at once instead of parking.
func TestLongPollCap(t *testing.T) {
	t.Parallel()
	b, err := Open(Options{DataDir: t.TempDir(), NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxLongPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t"}); err != nil {
		t.Fatal(err)
	}
	parked := make(chan error, 1)
	go func() { _, err := b.Consume(ctx, "t", 1, 15*time.Second); parked <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for testutilGauge(b) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := b.Consume(ctx, "t", 1, time.Second); !errors.Is(err, ErrTooManyLongPolls) {
		t.Fatalf("second long poll: %v", err)
	}
	if ds, err := b.Consume(ctx, "t", 1, 0); err != nil || len(ds) != 0 {
		t.Fatalf("a consume without wait must still answer: %v %v", ds, err)
	}
	cancel()
	<-parked
}

// TestSweepKeepsDataTheMetadataDoesNotKnow (RELIABILITY A7, C17): topic data whose
// incarnation is newer than anything the metadata applied is kept, not deleted, as
// happens when the metadata store lost entries.
func TestSweepKeepsDataTheMetadataDoesNotKnow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "gone", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteTopic(context.Background(), "gone", 0); err != nil {
		t.Fatal(err)
	}
	b.Close()
	// One directory the metadata created and deleted (left by a crash), one it never saw.
	known := filepath.Join(dir, "topics", "3-gone")
	unknown := filepath.Join(dir, "topics", "999999-future")
	for _, d := range []string{known, unknown} {
		if err := os.MkdirAll(filepath.Join(d, "0"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b = mustStartBroker(t, dir)
	defer b.Close()
	if _, err := os.Stat(known); !os.IsNotExist(err) {
		t.Errorf("the data of a deleted topic was not swept: %v", err)
	}
	if _, err := os.Stat(unknown); err != nil {
		t.Errorf("data newer than the metadata was deleted: %v", err)
	}
}

// TestSyncModes checks that the default mode sends the partitions' writes through the
// node's shared sync group (its rounds show in the metrics), that "file" mode does not,
// that messages survive a reopen in both, and that an unknown mode has no Syncer.
func TestSyncModes(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, ok := SyncerFor("fast"); ok {
		t.Fatal("SyncerFor(fast): a syncer for an unknown mode")
	}
	for _, mode := range []string{"", SyncFile, SyncWAL} {
		t.Run("mode="+mode, func(t *testing.T) {
			dir := t.TempDir()
			m := NewMetrics()
			open := func() *Broker {
				syncer, _ := SyncerFor(mode)
				b, err := Open(Options{DataDir: dir, NodeID: "n1", Logger: quiet, Metrics: m, Syncer: syncer, WAL: mode == SyncWAL})
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				return b
			}
			b := open()
			if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t", Partitions: ptr[int32](3)}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for p := 0; p < 6; p++ {
				wg.Add(1)
				go func() { defer wg.Done(); produceN(t, b, "t", 20) }()
			}
			wg.Wait()
			rounds := counterValue(t, m, "narad_storage_sync_rounds_total")
			if mode == SyncFile && rounds != 0 {
				t.Fatalf("file mode: %v shared sync rounds", rounds)
			}
			if mode != SyncFile && rounds == 0 {
				t.Fatalf("%s mode: no shared sync rounds after 120 produces", mode)
			}
			b.Close()
			b = open()
			defer b.Close()
			_, parts, err := b.Topic("t")
			if err != nil {
				t.Fatal(err)
			}
			var n uint64
			for _, p := range parts {
				n += p.Stats.End
			}
			if n != 120 {
				t.Fatalf("%d messages after reopen, want 120", n)
			}
		})
	}
}

func counterValue(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestKeylessBatchOnePartition: a request's keyless messages go to one partition (one
// append), successive requests take the partitions in turn, and keyed or pinned
// messages of the same request still go where their key or index says.
func TestKeylessBatchOnePartition(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ptr[int32](4)}); err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for req := 0; req < 4; req++ {
		msgs := make([]Outgoing, 10)
		for i := range msgs {
			msgs[i] = Outgoing{Partition: -1, Value: []byte("v")}
		}
		msgs[3] = Outgoing{Partition: -1, Key: []byte("k"), Value: []byte("keyed")}
		msgs[7] = Outgoing{Partition: 2, Value: []byte("pinned")}
		res, err := b.Produce(ctx, "t", msgs)
		if err != nil {
			t.Fatal(err)
		}
		sticky := res[0].Partition
		for i, r := range res {
			want := sticky
			switch i {
			case 3:
				want = int32(PartitionForKey([]byte("k"), 4))
			case 7:
				want = 2
			}
			if r.Partition != want {
				t.Fatalf("request %d, message %d: partition %d, want %d", req, i, r.Partition, want)
			}
		}
		seen[sticky] = true
	}
	if len(seen) != 4 {
		t.Fatalf("4 requests used partitions %v, want all 4 in turn", seen)
	}
}

// readRange is Read in the shape tests use: the messages from an offset (or time) and
// where to continue.
func readRange(b *Broker, ctx context.Context, name string, part int32, from *uint64, fromTimeMs *int64, max int) ([]Delivered, uint64, error) {
	got, err := b.Read(ctx, name, part, ReadSpec{From: from, FromTimeMs: fromTimeMs, Max: max})
	return got.Messages, got.Next, err
}

// TestWALMetricsCountBytesAndCheckpoints: the write-ahead file's bytes and checkpoints
// are exported, so an operator can tell how much it writes and how often a full file's
// data files are synced. A little over one 8 MiB file of appends must fill a file and
// get it checkpointed.
func TestWALMetricsCountBytesAndCheckpoints(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := NewMetrics()
	syncer, _ := SyncerFor(SyncWAL)
	b, err := Open(Options{DataDir: t.TempDir(), NodeID: "n1", Logger: quiet, Metrics: m, Syncer: syncer, WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t", Partitions: ptr[int32](2)}); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, m, "narad_storage_wal_checkpoints_total"); got != 0 {
		t.Fatalf("%v checkpoints before any file filled", got)
	}
	const size, n = 64 << 10, 160 // 10 MiB
	value := bytes.Repeat([]byte("w"), size)
	for i := 0; i < n; i++ {
		if _, err := b.Produce(context.Background(), "t", []Outgoing{{Partition: -1, Value: value}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := counterValue(t, m, "narad_storage_wal_bytes_total"); got < size*n {
		t.Fatalf("narad_storage_wal_bytes_total %v after %d bytes of appends", got, size*n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for counterValue(t, m, "narad_storage_wal_checkpoints_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no write-ahead file checkpointed 30 s after 10 MiB of appends")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
