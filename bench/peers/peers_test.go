// Package peers_test runs every shape briefly against each peer the machine can
// start: JetStream always (nats-server is built from this module), Redis when
// redis-server is on PATH or REDIS_SERVER names it.
package peers_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/peers/natsjs"
	"github.com/narad-mq/narad/bench/peers/redisstreams"
)

func shortOptions() load.Options {
	o := load.Defaults()
	o.Producers, o.Consumers, o.Batch = 4, 8, 20 // 8 consumers over 6 partitions: pinned
	o.Duration, o.Drain = time.Second, 10*time.Second
	o.Rate, o.WakeRate = 500, 20
	return o
}

func check(t *testing.T, tg load.Target, o load.Options) {
	t.Helper()
	defer tg.Close()
	rs, err := load.Run(context.Background(), tg, load.Shapes, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(load.Shapes)-1 { // no fan-out
		t.Fatalf("%d results, want %d", len(rs), len(load.Shapes)-1)
	}
	for _, r := range rs {
		if r.ProducedRate <= 0 || r.Errors != 0 {
			t.Errorf("%s: %f produced/s, %d errors (%s)", r.Shape, r.ProducedRate, r.Errors, r.FirstError)
		}
		if r.Usage == nil || r.Usage.RSSPeak <= 0 {
			t.Errorf("%s: server usage not measured", r.Shape)
		}
		if c := r.Check; c != nil && (c.Lost != 0 || c.Foreign != 0 || r.AckedRate <= 0) {
			t.Errorf("%s: account %+v, acked/s %f", r.Shape, c, r.AckedRate)
		}
	}
	var out bytes.Buffer
	load.PrintTable(&out, rs)
	t.Log("\n" + out.String())
}

func TestJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and runs every shape")
	}
	wd, _ := os.Getwd()
	bin, err := natsjs.BuildServer(wd, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, sync := range []bool{false, true} {
		tg, err := natsjs.Launch(natsjs.Options{Server: bin, DataDir: t.TempDir(), Sync: sync, Conns: 2, Log: os.Stderr})
		if err != nil {
			t.Fatal(err)
		}
		t.Run(tg.Name(), func(t *testing.T) { check(t, tg, shortOptions()) })
	}
}

// Fewer consumers than partitions: consumers rotate, and the drain still finds every
// message.
func TestJetStreamRotatingConsumers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	wd, _ := os.Getwd()
	bin, err := natsjs.BuildServer(wd, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tg, err := natsjs.Launch(natsjs.Options{Server: bin, DataDir: t.TempDir(), Conns: 1, Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	o := shortOptions()
	o.Consumers = 2
	rs, err := load.Run(context.Background(), tg, []string{load.ShapeFlow}, o)
	if err != nil {
		t.Fatal(err)
	}
	if c := rs[0].Check; c.Lost != 0 || rs[0].DrainTimedOut {
		t.Fatalf("account %+v, drain timed out %v", c, rs[0].DrainTimedOut)
	}
}

func TestRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every shape")
	}
	bin, ok := redisstreams.Find()
	if !ok {
		t.Skip("no redis-server on PATH and REDIS_SERVER unset")
	}
	tg, err := redisstreams.Launch(redisstreams.Options{Server: bin, DataDir: t.TempDir(), Pool: 32, Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	check(t, tg, shortOptions())
}
