// Command narad-bench is the load generator behind `make bench`: it starts a narad
// node on a free loopback port with a fresh data directory (or uses --target), runs
// the workload shapes of package load against it over HTTP, and prints a table of
// throughput, latency percentiles, the account of every message and the node's CPU
// and memory, beside the machine's fsync rate measured in the same run.
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
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, *bin, *target, *mode, *jsonOut); err != nil {
		fmt.Fprintln(os.Stderr, "narad-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o load.Options, bin, target, mode, jsonOut string) error {
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
	} else if t, err = narad.Launch(bin, filepath.Join(dir, "data"), conns, os.Stderr); err != nil {
		return err
	}
	defer func() { _ = t.Close() }() // the results are printed already
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
