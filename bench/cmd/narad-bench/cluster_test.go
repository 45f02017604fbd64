package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/narad"
)

// buildNarad builds ../../../broker/cmd/narad into the test's temp dir.
func buildNarad(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		//lint:ignore SA1019 a test binary runs on the machine that built it, so its GOROOT is the toolchain that runs the tests
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "narad")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/narad")
	cmd.Dir = filepath.Join("..", "..", "..", "broker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build narad: %v\n%s", err, out)
	}
	return bin
}

// lockedBuffer takes the output of several node processes at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// What `make bench-cluster` runs, briefly: the routes are measured on a 3-node cluster
// (every request answered, the forwarded ones through another node), and the produce,
// flow and batch shapes run against a single node and against the cluster with no
// failed request, every confirmed message delivered, and the nodes' usage read.
func TestClusterRoutingBrief(t *testing.T) {
	bin := buildNarad(t)
	var log lockedBuffer
	o := load.Defaults()
	o.Producers, o.Consumers, o.Batch = 6, 6, 20
	o.Duration, o.Drain = time.Second, 20*time.Second
	o.Log = &log
	ro := narad.RouteOptions{Requests: 50, Warmup: 5, Size: o.Size}
	shapes := []string{load.ShapeProduce, load.ShapeFlow, load.ShapeBatch}
	var out bytes.Buffer
	profiles := t.TempDir()
	run, err := measureCluster(context.Background(), o, bin, shapes, 3, ro, t.TempDir(), profiles, &out, &log)
	defer func() {
		if t.Failed() {
			t.Logf("output:\n%s\nlog:\n%s", out.String(), log.String())
		}
	}()
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]bool{narad.RouteProduce: true, narad.RouteConsume: true, narad.RouteAck: true, narad.RouteConsumeAck: true}
	for _, r := range run.Routes {
		if !want[r.Op] {
			t.Errorf("unexpected route %q", r.Op)
		}
		delete(want, r.Op)
		if r.Local.N != ro.Requests || r.Forwarded.N != ro.Requests {
			t.Errorf("%s: %d local and %d forwarded samples, want %d each", r.Op, r.Local.N, r.Forwarded.N, ro.Requests)
		}
		if r.Entry == "" || r.Holder == "" || r.Entry == r.Holder {
			t.Errorf("%s: sent to %q, forwarded to %q: want another node", r.Op, r.Entry, r.Holder)
		}
	}
	if len(want) != 0 {
		t.Errorf("routes not measured: %v", want)
	}

	for _, rs := range [][]load.Result{run.Results, run.Cluster} {
		if len(rs) != len(shapes) {
			t.Fatalf("%d results, want %d", len(rs), len(shapes))
		}
		for _, r := range rs {
			if r.ProducedRate <= 0 {
				t.Errorf("%s %s: nothing produced", r.Target, r.Shape)
			}
			if r.Errors != 0 {
				t.Errorf("%s %s: %d failed requests, first: %s", r.Target, r.Shape, r.Errors, r.FirstError)
			}
			if r.Usage == nil || r.Usage.RSSPeak <= 0 {
				t.Errorf("%s %s: server usage not measured: %+v", r.Target, r.Shape, r.Usage)
			}
			if c := r.Check; c != nil {
				if c.Delivered < c.Confirmed || c.Lost != 0 || c.Unconfirmed != 0 || c.Foreign != 0 || r.AckedRate <= 0 {
					t.Errorf("%s %s: account %+v, acked/s %f", r.Target, r.Shape, c, r.AckedRate)
				}
			} else if r.Shape != load.ShapeProduce {
				t.Errorf("%s %s: no account of the messages", r.Target, r.Shape)
			}
		}
	}
	if got := run.Cluster[0].Target; got != "narad-3nodes" {
		t.Errorf("cluster target named %q", got)
	}
	// Each shape's counters were read; its partitions replicate over the node plane.
	// (Leaderships are not asserted: a node of a loaded machine may miss a liveness
	// call, and the figure is there to show it.)
	for _, s := range shapes {
		if c, ok := run.Counters[s]; !ok || c.NodePlaneRequests <= 0 || c.StreamMessages <= 0 {
			t.Errorf("the cluster's counters over %s: %+v (read: %v); want node-plane requests and stream messages", s, c, ok)
		}
	}
	// --profile-dir: a CPU profile of every node over every shape, as go tool pprof
	// reads them (gzipped protocol buffers).
	for _, shape := range shapes {
		for _, name := range []string{"narad-" + shape + "-node", "narad-3nodes-" + shape + "-n1", "narad-3nodes-" + shape + "-n2", "narad-3nodes-" + shape + "-n3"} {
			b, err := os.ReadFile(filepath.Join(profiles, name+".pprof"))
			if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
				t.Errorf("profile %s: %d bytes, err %v; want a gzipped pprof profile", name, len(b), err)
			}
		}
	}
	printCluster(&out, run)
	t.Log("\n" + out.String())
}
