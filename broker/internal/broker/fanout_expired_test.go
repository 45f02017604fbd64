package broker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/partition"
)

// TestFanoutSkipsADamagedOldestMessageOnceAfterRetentionPassedTheCursor: the copy was
// paused (its owner lost the parent's grant) while retention deleted messages past its
// cursor, and the oldest message left is damaged. The copier skipped "the damaged
// message" one offset at a time from its cursor, not from where the read started (the
// oldest held): a cursor sync, an error line and a damaged-record count for each
// message retention had deleted. The cursor moves past the deleted ones at once now,
// and only the damaged one counts.
func TestFanoutSkipsADamagedOldestMessageOnceAfterRetentionPassedTheCursor(t *testing.T) {
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	ctx := context.Background()
	full := []auth.Grant{{Action: auth.Consume, Topics: []string{"p", "c"}}}
	bob, err := b.CreateUser(ctx, "bob", "bob-password", full)
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "p", Partitions: ref(int32(1)), RetentionMs: ref(int64(3_600_000))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "c", OwnerID: bob.ID, Partitions: ref(int32(1))}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SetGrants(ctx, "bob", []auth.Grant{{Action: auth.Consume, Topics: []string{"c"}}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the copy to pause", func() bool { return childPaused(t, b, "p", "c") != "" })
	// Five messages two hours old, deleted by retention, then three new ones, the first
	// of them in its segment's first record.
	old := partition.WallMillis() - 2*3_600_000
	var msgs []Outgoing
	for range 5 {
		msgs = append(msgs, Outgoing{Partition: 0, Value: []byte("old"), Timestamp: old})
	}
	if _, err := b.Produce(ctx, "p", msgs); err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup("p")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "retention to delete the old messages", func() bool { return pt.parts()[0].Stats().Oldest == 5 })
	produceN(t, b, "p", 3)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, "topics", strconv.FormatUint(m.Incarnation, 10)+"-p", "0", "log", "00000000000000000005.log")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	data[36] ^= 0x01 // offset 5's value
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b = mustStartBroker(t, dir)
	defer b.Close()
	// The copy resumes at its cursor, 0: offsets 0 to 4 are gone, 5 is damaged, 6 and
	// 7 are copied.
	if _, err := b.SetGrants(ctx, "bob", full); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the new messages to reach the child", func() bool { return childEnd(t, b, "c") == 2 })
	if got := promtest.ToFloat64(b.metrics.Damaged.WithLabelValues("c", "fanout")); got != 1 {
		t.Fatalf("narad_damaged_records_total{kind=fanout} is %v, want 1: only offset 5 is damaged", got)
	}
}
