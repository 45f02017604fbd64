// Package peers_test runs every shape briefly against each peer the machine can
// start: JetStream always (nats-server is built from this module; one server, and a
// cluster of three), Redis when redis-server is on PATH or REDIS_SERVER names it.
package peers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/peers/natsjs"
	"github.com/narad-mq/narad/bench/peers/redisstreams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	if js, ok := tg.(*natsjs.Target); ok {
		if err := js.ApplyClusterUsage(rs); err != nil {
			t.Error(err)
		}
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

// Three servers with sync_interval: always and streams of 3 replicas. It fails if a
// server does not run sync always or is not one of a meta group of three, if a
// stream or its consumer is not on three different servers with both followers
// current, or if a shape loses a message.
func TestJetStreamR3(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and runs every shape on three servers")
	}
	wd, _ := os.Getwd()
	bin, err := natsjs.BuildServer(wd, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tg, err := natsjs.Launch(natsjs.Options{Server: bin, DataDir: t.TempDir(), Sync: true, Replicas: 3, Conns: 3, Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if tg.Name() != "jetstream-r3-sync" || len(tg.URLs()) != 3 {
		t.Fatalf("target %s with %d servers", tg.Name(), len(tg.URLs()))
	}

	names := map[string]bool{}
	for _, u := range tg.MonitorURLs() {
		v := varz(t, u)
		if !v.JetStream.Config.SyncAlways || v.JetStream.Meta.ClusterSize != 3 {
			t.Errorf("%s (%s): sync always %v, meta group of %d", v.Name, u, v.JetStream.Config.SyncAlways, v.JetStream.Meta.ClusterSize)
		}
		names[v.Name] = true
	}
	if len(names) != 3 {
		t.Fatalf("servers %v, want 3 different", names)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := shortOptions()
	q, err := tg.Open(ctx, o.Partitions)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(tg.URLs()[2]) // a different server than the target's streams were created through
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var streams []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		streams = append(streams, name)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	if len(streams) != o.Partitions {
		t.Fatalf("streams %v, want %d", streams, o.Partitions)
	}
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("stream %s: %d replicas configured", name, r)
		}
		// Followers catch up on their own: poll until both are current.
		awaitReplicated(ctx, t, "stream "+name, func() (*jetstream.ClusterInfo, error) {
			info, err := s.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		})
		awaitReplicated(ctx, t, "consumer of "+name, func() (*jetstream.ClusterInfo, error) {
			c, err := s.Consumer(ctx, "bench")
			if err != nil {
				return nil, err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		})
	}
	if err := q.Delete(ctx); err != nil {
		t.Fatal(err)
	}

	check(t, tg, o)
}

func awaitReplicated(ctx context.Context, t *testing.T, what string, cluster func() (*jetstream.ClusterInfo, error)) {
	t.Helper()
	var last error
	for ctx.Err() == nil {
		c, err := cluster()
		if err == nil {
			if err = natsjs.Replicated(c, 3); err == nil {
				return
			}
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s: not on 3 servers with current followers: %v", what, last)
}

// serverVarz is the part of a nats-server's /varz the R3 test checks.
type serverVarz struct {
	Name      string `json:"server_name"`
	JetStream struct {
		Config struct {
			SyncAlways bool `json:"sync_always"`
		} `json:"config"`
		Meta struct {
			ClusterSize int `json:"cluster_size"`
		} `json:"meta"`
	} `json:"jetstream"`
}

func varz(t *testing.T, monitor string) serverVarz {
	t.Helper()
	resp, err := http.Get(monitor + "/varz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v serverVarz
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s/varz: status %d, %v", monitor, resp.StatusCode, err)
	}
	return v
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
