package broker

import (
	"context"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/auth"
)

// TestFanoutSkipsADamagedOldestMessageOnceAfterRetentionPassedTheCursor: the copy was
// paused (its owner lost the parent's grant) while retention deleted messages past its
// cursor, and the oldest message left is damaged. The copier skipped "the damaged
// message" one offset at a time from its cursor, not from where the read started (the
// oldest held): a cursor sync, an error line and a damaged-record count for each
// message retention had deleted. The cursor moves past the deleted ones at once now,
// and only the damaged one counts.
func TestFanoutSkipsADamagedOldestMessageOnceAfterRetentionPassedTheCursor(t *testing.T) {
	t.Parallel()
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
	b = agedOutThenDamaged(t, b, dir, "p", m.Incarnation)
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
