package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestASoleReplicaDamagedAtOpenKeepsItsData: a replica found damaged at open is set
// aside and rebuilt from its group, but a group of one replica (a forced takeover's
// survivor, a group made over a partition whose replication factor was raised from 1,
// a replica set reduced to one) has no one to rebuild it from. It must keep its data
// and skip the damaged records, as a single node does, and serve the rest. On the old
// code its whole log was set aside: the group restored its snapshot, whose messages it
// fetched from no source for ever, and the partition never served again.
func TestASoleReplicaDamagedAtOpenKeepsItsData(t *testing.T) {
	t.Parallel()
	t.Run("bit flip", func(t *testing.T) { soleReplicaDamaged(t, false) })
	// No fault of the disk at all: the replica's log is written without sync, and a
	// power cut after a segment roll can leave the next segment's directory entry
	// durable (an ext4 journal commit, forced by any sync on the file system, carries
	// it) while the sealed segment's tail (delayed allocation) never reached the disk.
	// Opening then finds the sealed segment shorter than where the next one begins.
	// Past the log's last flush that is no damage but a torn write: the log is cut
	// there and the group's log writes the rest again, every message included.
	t.Run("sealed segment torn by a power cut", func(t *testing.T) { soleReplicaDamaged(t, true) })
}

func soleReplicaDamaged(t *testing.T, torn bool) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	h := soloRaftHost(t, dir, func(o *raftetcd.Options) { o.SnapshotEvery, o.SnapshotKeep = 16, 4 })
	b := &Broker{log: quiet, metrics: NewMetrics(), repl: &replication{host: h, nodes: map[uint64]string{1: "n1"}}}
	b.opts.NodeID = "n1"
	tp := &topic{name: "sole"}
	partDir := filepath.Join(dir, "part")
	raftDir := filepath.Join(partDir, "raft")
	popts := partition.Options{Dir: partDir, Queue: queue.Config{Visibility: time.Minute, MaxInFlight: 1 << 20, MaxAckedAhead: 1 << 20},
		Logger: quiet, Group: &partGroup{host: h, id: "g"}, SegmentBytes: 1024}

	open := func(p *partition.Partition) {
		t.Helper()
		if err := h.OpenGroup("g", raftetcd.GroupConfig{Voters: []uint64{1}, Dir: raftDir, Campaign: true,
			Apply:    func(index uint64, data []byte) any { return p.Apply(index, data) },
			Snapshot: p.SnapshotState,
			Restore: func(ctx context.Context, index uint64, data []byte, sources []uint64) error {
				return p.RestoreSnapshot(ctx, index, data, b.fetchFrom(tp, 0, sources))
			},
			OnRole: func(lead bool, term uint64) { p.SetRole(lead, term) },
		}); err != nil {
			t.Fatal(err)
		}
	}

	p, err := partition.Open(popts)
	if err != nil {
		t.Fatal(err)
	}
	open(p)
	const msgs = 60
	for i := range msgs {
		pollUntil(t, fmt.Sprintf("produce %d", i), func() error {
			_, err := p.Append([]segment.Record{{Value: []byte(fmt.Sprintf("message %03d answered 202", i))}})
			return err
		})
	}
	if info, _ := h.Info("g"); info.SnapshotIndex == 0 {
		t.Fatalf("no snapshot was taken (info %+v): the test needs the group's log compacted", info)
	}
	if !torn {
		// Flushed as a snapshot flushes it: the bit flips in records durable before it.
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	h.CloseGroup("g")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// One bit flips in the message log at rest (or a power cut leaves a sealed part of
	// the unsynced replica log torn): one damaged record, later records intact.
	segs, _ := filepath.Glob(filepath.Join(partDir, "log", "*.log"))
	sort.Strings(segs)
	if torn {
		if len(segs) < 2 {
			t.Fatalf("want a sealed segment, have %v", segs)
		}
		last := segs[len(segs)-2]
		fi, err := os.Stat(last)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(last, fi.Size()-100); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove(last[:len(last)-len(".log")] + ".index") // never synced either
		segs = nil
	}
	if segs != nil {
		// In the active segment, which Open scans (sealed ones are trusted through their index).
		f, err := os.OpenFile(segs[len(segs)-1], os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		one := make([]byte, 1)
		_, _ = f.ReadAt(one, fi.Size()/2)
		one[0] ^= 0x40
		_, _ = f.WriteAt(one, fi.Size()/2)
		_ = f.Close()
	}

	// The next start: open, and what opening found damaged is dealt with.
	p, err = partition.Open(popts)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(msgs - 1) // the damaged message is skipped
	switch logDamage, journalDamage := p.Damage(); {
	case torn && logDamage+journalDamage != 0:
		t.Fatalf("opening counted %d damaged records and %d damaged settle records in a log torn past its last flush", logDamage, journalDamage)
	case torn:
		want = msgs
	case logDamage+journalDamage == 0:
		t.Fatal("opening found nothing damaged: the test damaged nothing")
	}
	if p, err = b.rebuildIfDamaged(p, popts, meta.Placement{Group: true, Replicas: []string{"n1"}, Leader: "n1"}, "sole", 0); err != nil {
		t.Fatal(err)
	}
	open(p)
	t.Cleanup(func() { h.CloseGroup("g"); _ = p.Close() })

	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p.Leading() && int64(p.Stats().End) >= want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("30 s after the start the sole replica leads=%v and holds offsets up to %d of the %d messages answered 202 (set aside in %s?)",
		p.Leading(), p.Stats().End, msgs, filepath.Join(partDir, "damaged"))
}
