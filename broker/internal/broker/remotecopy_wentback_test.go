package broker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// TestRemoteChildReportsALogThatWentBackAndPassedTheCursor: a parent partition whose
// log went back (a restore of an older backup, a forced takeover onto a replica that
// lacked messages) and grew past the copy's cursor before the copy looked at it (the
// child was paused meanwhile; or, after a forced takeover, producers reached the new
// leader first) had the messages stored below the cursor never copied, silently: no
// failing state, no metric, no log line, although remote-children.md says they are
// logged and named in last_error. The copy knows where the log ended when the
// partition it reads started leading, and reports the gap.
func TestRemoteChildReportsALogThatWentBackAndPassedTheCursor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup("orders")
	if err != nil {
		t.Fatal(err)
	}
	produce := func(n int) {
		t.Helper()
		for range n {
			if _, err := b.Produce(ctx, "orders", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	partDir := filepath.Join(dir, "topics", strconv.FormatUint(m.Incarnation, 10)+"-orders", "0")
	backup := filepath.Join(t.TempDir(), "backup")
	f := startFakeRemote(t)
	rc := attachFake(t, b, f, "orders", m.Incarnation, 0, "remote-password-42")
	id := RemoteChildPrefix + strconv.FormatUint(rc.ID, 10)
	cursor := func() uint64 {
		r, _ := b.meta.RemoteChild(rc.ID)
		return r.Cursors[0]
	}

	// Two messages, then a backup of the partition (closed for it), then three more:
	// all five copied.
	produce(2)
	reopenPart(t, b, pt, 0, func() {
		if err := os.CopyFS(backup, os.DirFS(partDir)); err != nil {
			t.Fatal(err)
		}
	})
	produce(3)
	waitUntil(t, "the five messages to be copied", func() bool { return cursor() == 5 })

	// The child is paused; the partition is restored from the older backup (its log
	// ends at 2, before the cursor); five new messages take offsets 2 to 6; then the
	// child is resumed.
	if err := b.PauseRemoteChild(ctx, "orders", id, true); err != nil {
		t.Fatal(err)
	}
	reopenPart(t, b, pt, 0, func() {
		if err := os.RemoveAll(partDir); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(partDir, os.DirFS(backup)); err != nil {
			t.Fatal(err)
		}
	})
	if end := pt.parts()[0].Stats().End; end != 2 {
		t.Fatalf("the restored partition's log ends at %d, want 2", end)
	}
	produce(5)
	if err := b.PauseRemoteChild(ctx, "orders", id, false); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the copy to go on from its cursor", func() bool { return cursor() == 7 })

	f.mu.Lock()
	stored := append([]apigen.MessageOrigin(nil), f.stored...)
	f.mu.Unlock()
	if len(stored) != 7 || stored[5].Offset != 5 || stored[6].Offset != 6 {
		t.Fatalf("the remote stored %+v, want offsets 0 to 4, then 5 and 6", stored)
	}
	infos, err := b.RemoteChildren("orders")
	if err != nil || len(infos) != 1 {
		t.Fatalf("children: %v %v", infos, err)
	}
	if l := infos[0].Lag[0]; !strings.Contains(l.LastError, "offsets 2 to 4") {
		t.Fatalf("last_error %q (state %s): the new messages at offsets 2 to 4, below the cursor, are never copied and nothing says so", l.LastError, l.State)
	}
	if got := promtest.ToFloat64(b.metrics.RemoteChild.Failures.WithLabelValues("orders", id, "source_behind")); got < 1 {
		t.Fatalf("narad_remote_child_failures_total{reason=source_behind} is %v, want 1 or more", got)
	}
}
