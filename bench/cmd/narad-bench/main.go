// Command narad-bench is the load generator behind `make bench`: it starts a narad
// node on a free loopback port with a fresh data directory (or uses --target), runs
// the workload shapes of package load against it over HTTP, and prints a table of
// throughput, latency percentiles, the account of every message and the node's CPU
// and memory, beside the machine's fsync rate measured in the same run.
//
// With --cluster N it measures cluster routing instead (issue 20, `make bench-cluster`):
// the latency a forwarded produce, consume and ack add over local ones on a cluster of
// N nodes, then the shapes against a single node and against the cluster, with the
// clients spread over the cluster's nodes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/narad"
)

func main() {
	o := load.Defaults()
	o.RegisterFlags(flag.CommandLine)
	bin := flag.String("narad", "", "path of the narad binary to start (ignored with --target)")
	target := flag.String("target", "", "base URL of a running node, e.g. http://127.0.0.1:7942 (its CPU and memory are not measured)")
	mode := flag.String("mode", "all", "shapes to run: all, or a comma-separated list of "+fmt.Sprint(load.Shapes))
	jsonOut := flag.String("json", "", "also write the results as JSON to this file")
	nodes := flag.Int("cluster", 0, "N > 1: measure cluster routing on N nodes started from --narad (forwarded vs local latency, then the shapes on 1 node and on N nodes)")
	profileDir := flag.String("profile-dir", "", "write a CPU profile of each narad node over each shape's measured window to this directory (<target>-<shape>-<node>.pprof; read with go tool pprof)")
	var ro narad.RouteOptions
	flag.IntVar(&ro.Requests, "route-requests", 2000, "with --cluster: measured requests per route (local, forwarded) and operation; 0 skips the routes")
	flag.IntVar(&ro.Warmup, "route-warmup", 200, "with --cluster: requests per route before the measured ones")
	flag.Parse()
	ro.Size = o.Size // the payload of the shapes
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *nodes != 0 {
		err = runCluster(ctx, o, *bin, *target, *mode, *jsonOut, *profileDir, *nodes, ro)
	} else {
		err = run(ctx, o, *bin, *target, *mode, *jsonOut, *profileDir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "narad-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o load.Options, bin, target, mode, jsonOut, profileDir string) (err error) {
	shapes, err := load.ParseShapes(mode)
	if err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	if target == "" && bin == "" {
		return errors.New("give --narad (a binary to start) or --target (a running node)")
	}
	if target != "" && profileDir != "" {
		return errors.New("--profile-dir profiles the nodes narad-bench starts: give --narad, not --target (a running node is profiled on its own --debug-addr)")
	}
	dir, err := os.MkdirTemp("", "narad-bench-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temp dir; the OS cleans it if this fails

	rep := load.Report{Started: time.Now().UTC(), Options: o, Machine: load.NewMachine(dir, 2*time.Second)}
	fmt.Println(rep.Machine)
	conns := o.Producers + o.Consumers + 8
	var t *narad.Target
	if target != "" {
		t = narad.New(target, conns)
	} else if t, err = narad.Launch(bin, filepath.Join(dir, "data"), conns, os.Stderr, profileDir); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, t.Close()) }() // the results are printed already; Close reports a failed profile
	fmt.Printf("setup: %d producers, %d consumers, %d-byte messages, %d partitions, %s per shape, batches of %d; every 202 and 204 durable\n\n",
		o.Producers, o.Consumers, o.Size, o.Partitions, o.Duration, o.Batch)
	o.Log = os.Stderr
	rep.Results, err = load.Run(ctx, t, shapes, o)
	load.PrintTable(os.Stdout, rep.Results)
	fmt.Println()
	load.PrintLegend(os.Stdout)
	rep.Machine.LoadEnd = load.LoadAvg()
	fmt.Printf("\nload average at the end: %s\n", rep.Machine.LoadEnd)
	if jsonOut != "" {
		if jerr := rep.WriteJSON(jsonOut); jerr != nil {
			return errors.Join(err, jerr)
		}
	}
	return err
}
