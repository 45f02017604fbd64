package narad

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/narad-mq/narad/bench/load"
)

// buildNarad builds ../../broker/cmd/narad into the test's temp dir.
func buildNarad(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		//lint:ignore SA1019 a test binary runs on the machine that built it, so its GOROOT is the toolchain that runs the tests
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "narad")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/narad")
	cmd.Dir = filepath.Join("..", "..", "broker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build narad: %v\n%s", err, out)
	}
	return bin
}

// Every shape runs for about a second against a real node: something is measured,
// nothing confirmed is lost, the node's CPU and memory are read.
func TestSmokeEveryShape(t *testing.T) {
	if testing.Short() {
		t.Skip("builds narad and runs every shape against it")
	}
	bin := buildNarad(t)
	var log bytes.Buffer
	o := load.Defaults()
	o.Producers, o.Consumers, o.Batch = 4, 4, 20
	o.Duration, o.Drain = time.Second, 10*time.Second
	o.WakeRate = 20
	o.Log = &log
	tg, err := Launch(bin, filepath.Join(t.TempDir(), "data"), 16, os.Stderr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if tg.PID() == 0 {
		t.Fatal("a launched node has no PID")
	}
	rs, err := load.Run(context.Background(), tg, load.Shapes, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(load.Shapes) {
		t.Fatalf("%d results, want %d:\n%s", len(rs), len(load.Shapes), log.String())
	}
	for _, r := range rs {
		if r.ProducedRate <= 0 {
			t.Errorf("%s: nothing produced", r.Shape)
		}
		if r.Errors != 0 {
			t.Errorf("%s: %d errors, first: %s", r.Shape, r.Errors, r.FirstError)
		}
		if r.Usage == nil || r.Usage.RSSPeak <= 0 {
			t.Errorf("%s: server usage not measured: %+v", r.Shape, r.Usage)
		}
		if c := r.Check; c != nil && (c.Lost != 0 || c.Foreign != 0 || r.AckedRate <= 0) {
			t.Errorf("%s: account %+v, acked/s %f", r.Shape, c, r.AckedRate)
		}
	}
	var out bytes.Buffer
	load.PrintTable(&out, rs)
	t.Log("\n" + out.String())
}
