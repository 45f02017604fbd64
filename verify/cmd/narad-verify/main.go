// Command narad-verify runs the kill-loop verification against a real narad and checks
// recorded histories again.
//
//	narad-verify run   [-seed N] [-messages N] [-kills N] [-duration D] [-keep] [-dir DIR] ...
//	narad-verify check HISTORY.jsonl
//	narad-verify doctor -kind KIND IN.jsonl OUT.jsonl   (KIND: see check.DoctorKinds)
//
// run exits 1 when the checker finds anything (the run's files are kept and named);
// check exits 1 when the history breaks a rule. doctor edits a real history the way a
// broker bug would, to show the checker catches it.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/narad-mq/narad/verify/check"
	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/netns"
	"github.com/narad-mq/narad/verify/scenario"
	"github.com/narad-mq/narad/verify/workload"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "run":
		os.Exit(runCmd(os.Args[2:]))
	case "check":
		os.Exit(checkCmd(os.Args[2:]))
	case "doctor":
		os.Exit(doctorCmd(os.Args[2:]))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: narad-verify run [flags] | check HISTORY | doctor -kind KIND IN OUT")
	os.Exit(2)
}

func runCmd(args []string) int {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	seed := fs.Int64("seed", time.Now().UnixNano()%1_000_000_007, "random seed (printed; reuse it to repeat a run's choices)")
	seeds := fs.Int("seeds", 1, "run this many seeds one after the other (seed, seed+1, ...)")
	messages := fs.Int("messages", 6000, "parent messages to produce (0: bounded by -duration only)")
	duration := fs.Duration("duration", 0, "produce for this long (soak); faults go on as long (a cluster's steps are repeated until then)")
	load := fs.Duration("load", 60*time.Second, "spread -messages over about this long")
	rate := fs.Int("rate", 0, "with -duration: produce this many parent messages a second (sets -messages and -load)")
	retention := fs.Int64("retention-ms", 1000, "retention of the short-retention topic (0: no such topic)")
	kills := fs.Int("kills", 20, "least number of kills (kill -9 and failpoint kills)")
	fpKills := fs.Int("failpoint-kills", -1, "least number of kills at failpoints (-1: half of -kills)")
	pauses := fs.Bool("pauses", true, "mix in SIGSTOP/SIGCONT")
	corrupt := fs.Bool("corrupt", true, "damage a stopped node's files: torn tails, bit flips in active segments and settle journals, a checkpoint ahead of its journal")
	disk := fs.Bool("disk", false, "inject EIO and ENOSPC at segment-after-write and 1.5 s stalls at wal-sync")
	clockShare := fs.Float64("clock-share", 0.25, "share of restarts that step the node's wall clock (back and forward in turn by 1s, 10s or 1h; 0: never)")
	recreate := fs.Duration("recreate-every", 4*time.Second, "delete and recreate the topic "+workload.Recycled+" about this often under load (0: no such topic)")
	minGap := fs.Duration("min-gap", 500*time.Millisecond, "least time between faults")
	maxGap := fs.Duration("max-gap", 2500*time.Millisecond, "most time between faults")
	producers := fs.Int("producers", 4, "producers")
	consumers := fs.Int("consumers", 6, "consumers")
	progress := fs.Duration("progress", 3*time.Minute, "report progress this often")
	drain := fs.Duration("drain-timeout", 5*time.Minute, "the final drain must finish within this (a clock stepped back holds delayed copies until the drain's node runs with the highest clock)")
	dir := fs.String("dir", "", "keep the run's files here (default: a temporary directory, removed when the run passes)")
	keep := fs.Bool("keep", false, "keep the files of a passing run too")
	bin := fs.String("bin", "", "a narad built with -tags failpoints,chaosnet (default: build one)")
	nodes := fs.Int("nodes", 1, "nodes: above 1, a cluster run (RF 3 topics orders and events, the cluster's fault steps; -kills, -pauses, -corrupt, -disk, -clock-share and -retention-ms do not apply)")
	steps := fs.String("steps", "leader-kill=4,controller-kill=2,node-kill=1,double-failover=1,pause=2,netcut=1,netdeaf=1,netmute=1,netlossy=1,netslow=1,wipe=1,kill-all=1,corrupt=1,clock=1",
		"a cluster run's fault steps, kind=count,... (kinds: "+strings.Join(workload.ClusterSteps, ", ")+")")
	chaosnet := fs.Bool("chaosnet", true, "a cluster run's nodes poll a node-plane rules file (needs a -tags chaosnet build), so net steps can cut them")
	netFor := fs.Duration("net-for", 4*time.Second, "how long a cluster run's network fault lasts")
	pauseFor := fs.Duration("pause-for", 3*time.Second, "how long a cluster run's SIGSTOP lasts")
	quiet := fs.Bool("quiet", false, "consumers ack everything at once (with no faults: each message delivered once)")
	visibility := fs.Int64("visibility-ms", 0, "every topic's lease (0: 1.5 s on one node, 2 s in a cluster)")
	delay := fs.Int64("delay-ms", 0, "the delay child's delay (0: 1 s on one node, 2 s in a cluster)")
	inNetns := fs.Bool("netns", false, "a cluster run on network namespaces (root, iproute2, iptables): each node in its own, this command in another; the net steps (but netslow) cut with iptables")
	inside := fs.String("netns-inside", "", "(set by -netns) the namespaces' prefix: this process runs inside them")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with usage
	var net *netns.Net
	if *inNetns && *nodes > 1 {
		names := []string{netnsVerifier}
		for i := range *nodes {
			names = append(names, fmt.Sprintf("n%d", i+1))
		}
		if *inside == "" {
			return inNamespaces(args, names)
		}
		net = netns.Layout(*inside, netnsSubnet, names)
	}
	stepCounts, err := workload.ParseSteps(*steps)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *nodes > 1 {
		if *visibility == 0 {
			*visibility = 2000
		}
		if *delay == 0 {
			*delay = 2000
		}
	}
	if *rate > 0 && *duration > 0 {
		*messages, *load = *rate*int(duration.Seconds()), *duration
	}
	if *fpKills < 0 {
		*fpKills = *kills / 2
	}
	if *nodes > 1 && len(stepCounts) > 0 {
		k := workload.ClusterFaultConfig{Steps: stepCounts}.Kills(*nodes)
		fmt.Printf("fault steps: about %d kills a schedule (%d over %d seeds)\n", k, k*(*seeds), *seeds)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed := 0
	for i := 0; i < *seeds; i++ {
		s := *seed + int64(i)
		d := *dir
		if d != "" && *seeds > 1 {
			d = fmt.Sprintf("%s/seed-%d", d, s)
		}
		fmt.Printf("== narad-verify run: seed %d\n", s)
		res := scenario.Run(ctx, scenario.Config{
			Dir: d, Keep: *keep, Bin: *bin, Nodes: *nodes, ChaosNet: *chaosnet, Netns: net,
			Log: func(format string, a ...any) { fmt.Printf(format+"\n", a...) },
			Workload: workload.Config{
				Seed: s, Messages: *messages, Duration: *duration, LoadDuration: *load, Producers: *producers, Consumers: *consumers, RetentionMs: *retention,
				RecreateEvery: *recreate, DrainTimeout: *drain, VisibilityMs: *visibility, DelayMs: *delay, Quiet: *quiet,
				ClusterFaults: workload.ClusterFaultConfig{Steps: stepCounts, MinGap: *minGap, MaxGap: *maxGap, NetFor: *netFor, PauseFor: *pauseFor, Repeat: *duration > 0},
				Progress:      func(line string) { fmt.Println("progress:", line) },
				ProgressEvery: *progress,
				Faults: workload.FaultConfig{Kills: *kills, MinFailpointKills: *fpKills, FailpointShare: 0.5, Pauses: *pauses,
					Corrupt: *corrupt, Disk: *disk, ClockShare: *clockShare, MinClockSteps: minSteps(*clockShare),
					MinGap: *minGap, MaxGap: *maxGap, Duration: *duration},
			},
		})
		var b bytes.Buffer
		scenario.Summary(&b, res)
		_, _ = os.Stdout.Write(b.Bytes()) // the verdict is the exit status; stdout is for people
		if !res.OK() {
			failed++
		}
		if ctx.Err() != nil {
			break
		}
	}
	if failed > 0 {
		fmt.Printf("narad-verify: %d of %d runs FAILED\n", failed, *seeds)
		return 1
	}
	return 0
}

// The network of a -netns run: the verifier's host, and a /24 inside namespaces of
// the run's own (runs side by side each have theirs).
const (
	netnsVerifier = "verify"
	netnsSubnet   = 77
)

// inNamespaces makes the network namespaces of a -netns run, runs this command again
// inside the verifier's (where the nodes' addresses are reachable), and removes every
// namespace when it ends, whatever its outcome; it returns the run's exit status.
func inNamespaces(args, names []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	prefix := fmt.Sprintf("nv%d", os.Getpid()%100000)
	net, err := netns.Setup(ctx, prefix, netnsSubnet, names)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() {
		if err := net.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "removing the run's network namespaces:", err)
		}
	}()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	h, _ := net.Host(netnsVerifier)
	fmt.Printf("== narad-verify: network namespaces %s-* (10.%d.0.0/24), this run inside %s\n", prefix, netnsSubnet, h.NS)
	cmd := net.Command(h, self, append(append([]string{"run"}, args...), "-netns-inside", prefix)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	go func() {
		<-ctx.Done()
		_ = cmd.Process.Signal(syscall.SIGTERM) // the run stops its nodes and reports
	}()
	if err := cmd.Wait(); err != nil {
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() > 0 {
			return cmd.ProcessState.ExitCode()
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// minSteps makes a run that steps the clock at all step it both ways at least once.
func minSteps(share float64) int {
	if share > 0 {
		return 2
	}
	return 0
}

func checkCmd(args []string) int {
	if len(args) != 1 {
		usage()
	}
	es, err := history.Read(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r := check.Check(es)
	r.Print(os.Stdout)
	if !r.OK() {
		return 1
	}
	return 0
}

func doctorCmd(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ExitOnError)
	kinds := make([]string, 0, len(check.DoctorKinds))
	for k := range check.DoctorKinds {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	kind := fs.String("kind", "acked-redelivery", strings.Join(kinds, ", "))
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with usage
	if fs.NArg() != 2 {
		usage()
	}
	es, err := history.Read(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	out, what, err := check.Doctor(es, *kind)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := history.Write(fs.Arg(1), out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("doctored:", what)
	return 0
}
