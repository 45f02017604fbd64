package broker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestAReplicaWhoseStateDoesNotOpenIsRebuilt: a partition whose queue checkpoint or
// epoch file fails its checks refuses to open, as a lone partition must rather than
// guess what was settled. A replica's settled state is its group's, and another
// replica holds the partition: the replica sets its queue state aside in damaged/,
// keeps its intact messages, and opens, to have the settled state put back by its
// group. On the old code it refused to open, and with
// it every partition of its topic on this node, at every start. The only replica of a
// partition still refuses, its files left as they are.
func TestAReplicaWhoseStateDoesNotOpenIsRebuilt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		file     string
		replicas []string
		rebuilt  bool
	}{
		{"queue.ckpt", []string{"n1", "n2", "n3"}, true},
		{"epoch", []string{"n1", "n2"}, true},
		{"queue.ckpt", []string{"n1"}, false},
	} {
		t.Run(fmt.Sprintf("%s, %d replicas", c.file, len(c.replicas)), func(t *testing.T) {
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			b := &Broker{log: quiet, metrics: NewMetrics()}
			b.opts.NodeID = "n1"
			dir := t.TempDir()
			popts := partition.Options{Dir: dir, Queue: queue.Config{Visibility: time.Minute, MaxInFlight: 1 << 10, MaxAckedAhead: 1 << 10}, Logger: quiet}
			p, err := partition.Open(popts)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				if _, err := p.Append([]segment.Record{{Value: []byte(fmt.Sprint("m", i))}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			damaged := filepath.Join(dir, c.file)
			if err := os.WriteFile(damaged, []byte("not what it was"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := partition.Open(popts); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("opening over a damaged %s: %v, want an error of segment.ErrCorrupt", c.file, err)
			}

			p, err = b.openReplicaData(popts, meta.Placement{Group: true, Replicas: c.replicas, Leader: "n1"}, "t", 0)
			rebuilds := testutil.ToFloat64(b.metrics.ReplicaRebuilds.WithLabelValues("t"))
			if !c.rebuilt {
				if !errors.Is(err, segment.ErrCorrupt) {
					t.Fatalf("the only replica opened over a damaged %s (err %v): it has no group to rebuild it from", c.file, err)
				}
				if _, serr := os.Stat(damaged); serr != nil || rebuilds != 0 {
					t.Fatalf("the only replica's files were moved (%v) or counted rebuilt (%v)", serr, rebuilds)
				}
				return
			}
			if err != nil {
				t.Fatalf("a replica with a damaged %s did not open: %v", c.file, err)
			}
			defer func() { _ = p.Close() }()
			if end, backlog := p.Stats().End, p.Stats().Backlog; end != 5 || backlog != 5 || rebuilds != 1 {
				t.Fatalf("the replica opened holding offsets up to %d (backlog %d), counted %v rebuilds; want its 5 messages kept, nothing settled until its group says, counted once", end, backlog, rebuilds)
			}
			if _, err := os.Stat(filepath.Join(dir, "damaged", c.file)); err != nil {
				t.Fatalf("the damaged %s was not set aside in damaged/: %v", c.file, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "damaged", "log")); err == nil {
				t.Fatal("the intact message log was set aside with the queue state: its group would fetch it from a peer, which may be gone")
			}
		})
	}
}
