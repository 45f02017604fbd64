// Command narad-bench-peers runs the workload shapes of narad-bench against narad,
// NATS JetStream (default sync, then sync_interval: always, then a cluster of three
// servers with sync_interval: always and 3-replica streams) and Redis Streams
// (appendfsync always; only when redis-server is on PATH or REDIS_SERVER names it),
// one server at a time on the same machine in the same run, and prints each
// target's table and then one table of every figure side by side with narad/peer
// ratios.
//
// Run it from bench/peers with GOWORK=off (`make bench-peers` does).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/narad"
	"github.com/narad-mq/narad/bench/peers/natsjs"
	"github.com/narad-mq/narad/bench/peers/redisstreams"
)

// Target names, in run order.
const (
	tNarad    = "narad"
	tJS       = "jetstream"
	tJSSync   = "jetstream-sync"
	tJSR3Sync = "jetstream-r3-sync"
	tRedis    = "redis"
)

type config struct {
	o          load.Options
	narad      string
	natsServer string
	redis      string
	targets    string
	mode       string
	json       string
}

func main() {
	c := config{o: load.Defaults()}
	c.o.RegisterFlags(flag.CommandLine)
	redisDefault, _ := redisstreams.Find()
	flag.StringVar(&c.narad, "narad", "", "path of the narad binary to start")
	flag.StringVar(&c.natsServer, "nats-server", "", "nats-server binary (default: build the version pinned in bench/peers/go.mod)")
	flag.StringVar(&c.redis, "redis-server", redisDefault, "redis-server binary (default: $REDIS_SERVER, else redis-server on PATH; Redis is skipped without one)")
	flag.StringVar(&c.targets, "targets", strings.Join([]string{tNarad, tJS, tJSSync, tJSR3Sync, tRedis}, ","), "targets to run, in order; the first is the base of the ratios")
	flag.StringVar(&c.mode, "mode", "all", "shapes to run: all, or a comma-separated list of "+fmt.Sprint(load.Shapes))
	flag.StringVar(&c.json, "json", "", "also write the results as JSON to this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "narad-bench-peers:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	shapes, err := load.ParseShapes(c.mode)
	if err != nil {
		return err
	}
	if err := c.o.Validate(); err != nil {
		return err
	}
	names := strings.Split(c.targets, ",")
	for _, n := range names {
		switch n {
		case tNarad:
			if c.narad == "" {
				return errors.New("give --narad, the narad binary to start")
			}
		case tJS, tJSSync, tJSR3Sync, tRedis:
		default:
			return fmt.Errorf("unknown target %q", n)
		}
	}
	dir, err := os.MkdirTemp("", "narad-bench-peers-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temp dir; the OS cleans it if this fails
	rep := load.Report{Started: time.Now().UTC(), Options: c.o, Machine: load.NewMachine(dir, 2*time.Second)}
	fmt.Println(rep.Machine)

	if c.natsServer == "" && strings.Contains(c.targets, tJS) {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "building nats-server", natsjs.ServerModule, "...")
		if c.natsServer, err = natsjs.BuildServer(wd, dir); err != nil {
			return fmt.Errorf("%w (run from bench/peers, or give --nats-server)", err)
		}
	}
	fmt.Printf("setup: %d producers, %d consumers, %d-byte messages, %d partitions, %s per shape, batches of %d\n",
		c.o.Producers, c.o.Consumers, c.o.Size, c.o.Partitions, c.o.Duration, c.o.Batch)
	fmt.Println("narad: every 202 and 204 fsynced; jetstream: JetStream defaults (fsync every 2 min); jetstream-sync: sync_interval always;",
		"jetstream-r3-sync: 3 servers, streams of 3 replicas, sync_interval always (server CPU and RSS: the 3 together);",
		"redis: appendonly yes, appendfsync always")

	var (
		ran     []string
		results [][]load.Result
		notes   []string
	)
	o := c.o
	o.Log = os.Stderr
	conns := o.Producers + o.Consumers + 8
	for _, n := range names {
		if ctx.Err() != nil {
			break
		}
		data := filepath.Join(dir, n)
		if err := os.MkdirAll(data, 0o755); err != nil {
			return err
		}
		var t load.Target
		switch n {
		case tNarad:
			t, err = narad.Launch(c.narad, data, conns, os.Stderr, "")
		case tJS, tJSSync:
			t, err = natsjs.Launch(natsjs.Options{Server: c.natsServer, DataDir: data, Sync: n == tJSSync, Conns: 4, Log: os.Stderr})
		case tJSR3Sync:
			t, err = natsjs.Launch(natsjs.Options{Server: c.natsServer, DataDir: data, Sync: true, Replicas: 3, Conns: 4, Log: os.Stderr})
		case tRedis:
			if c.redis == "" {
				notes = append(notes, "redis: skipped, no redis-server on PATH and REDIS_SERVER unset")
				continue
			}
			t, err = redisstreams.Launch(redisstreams.Options{Server: c.redis, DataDir: data, Pool: conns, Log: os.Stderr})
		}
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: could not start: %v", n, err))
			ran, results = append(ran, n), append(results, nil)
			continue
		}
		rs, err := load.Run(ctx, t, shapes, o)
		if cl, ok := t.(*natsjs.Target); ok {
			if err := cl.ApplyClusterUsage(rs); err != nil {
				notes = append(notes, fmt.Sprintf("%s: server usage left out: %v", n, err))
			}
		}
		_ = t.Close() // the results are in; stopping a peer only frees the machine for the next
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: stopped: %v", n, err))
		}
		// Every target after the first is offered the latency-shape rate the first was
		// offered (half of its full flow's acked rate, unless --rate was given), so the
		// latency rows compare brokers under the same load.
		if o.Rate == 0 {
			if r, ok := offeredRate(rs); ok {
				o.Rate = r
			}
		}
		fmt.Println()
		load.PrintTable(os.Stdout, rs)
		ran, results = append(ran, n), append(results, rs)
		rep.Results = append(rep.Results, rs...)
	}
	if len(ran) > 1 {
		fmt.Printf("\ncomparison (ratios are %s/peer)\n", ran[0])
		load.PrintComparison(os.Stdout, ran, results)
	}
	for _, n := range notes {
		fmt.Println("note:", n)
	}
	fmt.Println()
	load.PrintLegend(os.Stdout)
	rep.Machine.LoadEnd = load.LoadAvg()
	fmt.Printf("\nload average at the end: %s\n", rep.Machine.LoadEnd)
	if c.json != "" {
		return rep.WriteJSON(c.json)
	}
	return ctx.Err()
}

func offeredRate(rs []load.Result) (float64, bool) {
	for _, r := range rs {
		if r.Shape == load.ShapeLatency && r.OfferedRate > 0 {
			return r.OfferedRate, true
		}
	}
	return 0, false
}
