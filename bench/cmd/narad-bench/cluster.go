package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/narad"
)

// clusterRun is what --cluster measures, and what its --json writes.
type clusterRun struct {
	load.Report               // Results are the single node's shapes
	Nodes       int           `json:"cluster_nodes"`
	Routes      []narad.Route `json:"routes,omitempty"`
	Cluster     []load.Result `json:"cluster_results"`
	// Counters is what each shape moved on the cluster's own counters, by shape.
	Counters map[string]narad.Counters `json:"cluster_counters,omitempty"`
}

// runCluster is `narad-bench --cluster N`: it measures, prints and writes the JSON.
func runCluster(ctx context.Context, o load.Options, bin, target, mode, jsonOut, profileDir string, nodes int, ro narad.RouteOptions) error {
	shapes, err := load.ParseShapes(mode)
	if err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	switch {
	case nodes < 2:
		return fmt.Errorf("--cluster needs at least 2 nodes, not %d", nodes)
	case target != "":
		return errors.New("--cluster starts its own nodes: give --narad, not --target")
	case bin == "":
		return errors.New("--cluster needs --narad, the binary to start the nodes from")
	}
	dir, err := os.MkdirTemp("", "narad-bench-cluster-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temp dir; the OS cleans it if this fails
	o.Log = os.Stderr
	run, err := measureCluster(ctx, o, bin, shapes, nodes, ro, dir, profileDir, os.Stdout, os.Stderr)
	run.Machine.LoadEnd = load.LoadAvg()
	printCluster(os.Stdout, run)
	if jsonOut != "" {
		b, jerr := json.MarshalIndent(run, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(jsonOut, append(b, '\n'), 0o644)
		}
		err = errors.Join(err, jerr)
	}
	return err
}

// measureCluster runs the shapes against a single node, then starts a cluster of
// nodes, measures the routes on it and runs the shapes against it, the clients spread
// over its nodes. Each server runs alone, with a fresh data directory under dir (and,
// with profileDir, CPU profiles of every node over each shape written there). out
// gets the machine line and a line per step; the nodes' output goes to log. What was
// measured before an error is returned with it.
func measureCluster(ctx context.Context, o load.Options, bin string, shapes []string, nodes int, ro narad.RouteOptions, dir, profileDir string, out, log io.Writer) (run clusterRun, err error) {
	run = clusterRun{Report: load.Report{Started: time.Now().UTC(), Options: o, Machine: load.NewMachine(dir, 2*time.Second)}, Nodes: nodes}
	fmt.Fprintln(out, run.Machine)
	fmt.Fprintf(out, "setup: %d producers, %d consumers, %d-byte messages, %d partitions, %s per shape, batches of %d; every 202 and 204 durable\n",
		o.Producers, o.Consumers, o.Size, o.Partitions, o.Duration, o.Batch)
	conns := o.Producers + o.Consumers + 8

	fmt.Fprintln(out, "\n== a single node")
	single, err := narad.Launch(bin, filepath.Join(dir, "single"), conns, log, profileDir)
	if err != nil {
		return run, err
	}
	run.Results, err = load.Run(ctx, single, shapes, o)
	err = errors.Join(err, single.Close()) // stopped before the cluster starts, so the two never share the machine
	if err != nil {
		return run, err
	}

	fmt.Fprintf(out, "\n== a cluster of %d nodes\n", nodes)
	c, err := narad.LaunchCluster(bin, filepath.Join(dir, "cluster"), nodes, conns, log, profileDir)
	if err != nil {
		return run, err
	}
	defer func() { err = errors.Join(err, c.Close()) }() // the figures are taken by then; Close reports a failed profile
	fmt.Fprintf(out, "cluster formed: nodes %s\n", strings.Join(c.Nodes(), ", "))
	if ro.Requests > 0 {
		fmt.Fprintf(out, "routes: %d requests per route after %d of warm-up, one at a time\n", ro.Requests, ro.Warmup)
		if run.Routes, err = c.MeasureRoutes(ctx, ro); err != nil {
			return run, err
		}
	}
	run.Cluster, err = load.Run(ctx, c, shapes, o)
	run.Counters = c.ShapeCounters()
	return run, err
}

// printCluster writes the route latencies, each target's tables and their comparison.
func printCluster(w io.Writer, run clusterRun) {
	if len(run.Routes) > 0 {
		r := run.Routes[0]
		fmt.Fprintf(w, "\nroutes, ms: one client, one request at a time, all sent to %s; local = to a partition %s holds, forwarded = to one the node in column 2 holds; %d measured per route after %d of warm-up, %d-byte messages\n",
			r.Entry, r.Entry, r.Requests, r.Warmup, r.Size)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "operation\tforwarded to\tlocal p50\tlocal p99\tforwarded p50\tforwarded p99\tadded p50\tadded p99\t")
		for _, r := range run.Routes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Op, r.Holder,
				msec(r.Local.P50), msec(r.Local.P99), msec(r.Forwarded.P50), msec(r.Forwarded.P99),
				msec(r.Forwarded.P50-r.Local.P50), msec(r.Forwarded.P99-r.Local.P99))
		}
		_ = tw.Flush() // w is stdout or a test's buffer
	}
	for _, rs := range [][]load.Result{run.Results, run.Cluster} {
		if len(rs) > 0 {
			fmt.Fprintln(w)
			load.PrintTable(w, rs)
		}
	}
	if len(run.Results) > 0 && len(run.Cluster) > 0 {
		fmt.Fprintf(w, "\n%d nodes (topics of the default replication_factor: min(3, nodes); clients spread over the nodes round robin) against 1 node, the same binary, one after the other:\n", run.Nodes)
		load.PrintComparison(w, []string{run.Cluster[0].Target, run.Results[0].Target}, [][]load.Result{run.Cluster, run.Results})
	}
	if len(run.Counters) > 0 {
		fmt.Fprintf(w, "\nthe cluster's own counters, moved while each shape ran (drain included), summed over the %d nodes:\n", run.Nodes)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "shape\tleaderships won\tliveness lapses\tforced campaigns\tnode-plane requests\tstream messages\tper message produced\tsync rounds\tfiles a round\tms a round\tper message produced\t")
		for _, r := range run.Cluster {
			c, ok := run.Counters[r.Shape]
			if !ok {
				continue
			}
			per, syncs, files, ms := "-", "-", "-", "-"
			if r.Produced > 0 {
				per = fmt.Sprintf("%.2f + %.2f", c.NodePlaneRequests/float64(r.Produced), c.StreamMessages/float64(r.Produced))
				syncs = fmt.Sprintf("%.2f", c.SyncRounds/float64(r.Produced))
			}
			if c.SyncRounds > 0 {
				files = fmt.Sprintf("%.2f", c.SyncFiles/c.SyncRounds)
				ms = fmt.Sprintf("%.3f", 1000*c.SyncSeconds/c.SyncRounds)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t%s\t%s\t%s\t\n", r.Shape, c.LeadershipsWon, c.LivenessLapses, c.ForcedCampaigns, c.NodePlaneRequests, c.StreamMessages, per, c.SyncRounds, files, ms, syncs)
		}
		_ = tw.Flush() // w is stdout or a test's buffer
		fmt.Fprintln(w, "(a shape's topic has elected its leaders before its window starts: a leadership won, a liveness lapse or a forced campaign here means partitions failed over during the figures)")
	}
	fmt.Fprintln(w)
	load.PrintLegend(w)
	fmt.Fprintf(w, "\nload average at the start: %s, at the end: %s\n", run.Machine.LoadStart, run.Machine.LoadEnd)
}

// msec formats d in milliseconds.
func msec(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
