package broker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/partition"
)

// TestRemoteChildSkipsADamagedOldestMessageOnceAndCountsWhatExpired: the remote was out of
// reach while retention deleted messages past the copy's cursor, and the oldest message
// left is damaged (a lone partition: no replica holds it intact). The copy skipped the
// damaged message one offset at a time from its cursor, not from where the read
// started (the oldest held): one control-plane commit, one error line "a damaged
// message is skipped" and one damaged-record count per message retention had deleted
// (millions after a long outage, the copy held up meanwhile), and those messages never
// counted as expired. The messages retention deleted are expired (counted once), and the
// damaged one alone is skipped as damaged.
func TestRemoteChildSkipsADamagedOldestMessageOnceAndCountsWhatExpired(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1)), RetentionMs: ref(int64(3_600_000))})
	if err != nil {
		t.Fatal(err)
	}
	b = agedOutThenDamaged(t, b, dir, "orders", m.Incarnation)
	defer b.Close()

	// The child's cursor is at 0: offsets 0 to 4 expired, 5 is damaged, 6 and 7 are
	// copied.
	f := startFakeRemote(t)
	rc := attachFake(t, b, f, "orders", m.Incarnation, 0, "remote-password-42")
	waitUntil(t, "the copy to pass the new messages", func() bool {
		r, ok := b.meta.RemoteChild(rc.ID)
		return ok && r.Cursors[0] == 8
	})
	f.mu.Lock()
	stored := append([]apigen.MessageOrigin(nil), f.stored...)
	f.mu.Unlock()
	if len(stored) != 2 || stored[0].Offset != 6 || stored[1].Offset != 7 {
		t.Fatalf("the remote stored %+v, want offsets 6 and 7", stored)
	}
	if got := promtest.ToFloat64(b.metrics.Damaged.WithLabelValues("orders", "remote_child")); got != 1 {
		t.Fatalf("narad_damaged_records_total{kind=remote_child} is %v, want 1: only offset 5 is damaged", got)
	}
	r, _ := b.meta.RemoteChild(rc.ID)
	if r.Expired[0] != 5 {
		t.Fatalf("the control plane counts %d expired messages, want 5 (offsets 0 to 4, deleted by retention)", r.Expired[0])
	}
}

// agedOutThenDamaged stores in partition 0 of topic name (incarnation inc, retention an
// hour) of b five messages two hours old and waits for retention to delete them (its
// loop runs every 50 ms in tests), then three new ones, the first of them in its
// segment's first record; it closes b, damages offset 5's value on disk and returns the
// broker started again on dir.
func agedOutThenDamaged(t *testing.T, b *Broker, dir, name string, inc uint64) *Broker {
	t.Helper()
	ctx := context.Background()
	old := partition.WallMillis() - 2*3_600_000
	var msgs []Outgoing
	for range 5 {
		msgs = append(msgs, Outgoing{Partition: 0, Value: []byte("old"), Timestamp: old})
	}
	if _, err := b.Produce(ctx, name, msgs); err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "retention to delete the old messages", func() bool { return pt.parts()[0].Stats().Oldest == 5 })
	for range 3 {
		if _, err := b.Produce(ctx, name, []Outgoing{{Partition: 0, Value: []byte("new")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, "topics", strconv.FormatUint(inc, 10)+"-"+name, "0", "log", "00000000000000000005.log")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	data[36] ^= 0x01 // offset 5's value
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return mustStartBroker(t, dir)
}
