// Command conformance runs the SDK conformance scenarios through every driver: the wire
// tier against its scripted mock, the behaviour tier against a real narad behind a fault
// proxy. It prints a summary, writes JSON and JUnit XML, and exits 1 when any scenario
// fails that is not a listed known failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/narad-mq/narad/conformance/runner"
)

type driverFlags []runner.DriverSpec

func (d *driverFlags) String() string { return fmt.Sprint(*d) }

func (d *driverFlags) Set(v string) error {
	name, cmd, ok := strings.Cut(v, "=")
	if !ok || name == "" || strings.TrimSpace(cmd) == "" {
		return fmt.Errorf("want name=command, got %q", v)
	}
	*d = append(*d, runner.DriverSpec{Name: name, Argv: strings.Fields(cmd)})
	return nil
}

func main() { os.Exit(run()) }

// run does the work and returns the exit status, so deferred clean-up (the broker, its
// data dir) happens before the process exits.
func run() int {
	var drivers driverFlags
	flag.Var(&drivers, "driver", "a driver as name=command line (repeatable), e.g. go=./bin/driver-go")
	scenarios := flag.String("scenarios", "scenarios", "directory of scenario directories")
	narad := flag.String("narad", os.Getenv("NARAD_BIN"), "the narad binary, for the behaviour tier (default $NARAD_BIN)")
	tier := flag.String("tier", "all", "wire, behaviour, cluster, a comma-separated list of them, or all")
	only := flag.String("run", "", "only scenarios whose name matches this regexp")
	parallel := flag.Int("parallel", 4, "scenario runs at once")
	out := flag.String("out", "", "directory for results.json and junit.xml (none when empty)")
	matrix := flag.String("matrix", "", "write the SDK × scenario matrix (Markdown) here")
	known := flag.String("known", "known-failures.yaml", "the known failures list")
	spec := flag.String("spec", "SPEC.md", "the rules, for the coverage report")
	verbose := flag.Bool("v", false, "print every scenario's log, not only failures'")
	clusterN := flag.Int("cluster", 0, "run the behaviour tier against a cluster of this many nodes (requests go to each node in turn) instead of one node; the cluster tier uses it too when it has 3 or more")
	flag.Parse()
	if len(drivers) == 0 {
		fmt.Fprintln(os.Stderr, "conformance: no -driver given")
		return 2
	}
	for i := range drivers {
		// Relative driver programs are taken from the working directory.
		if p := drivers[i].Argv[0]; strings.Contains(p, "/") && !filepath.IsAbs(p) {
			if abs, err := filepath.Abs(p); err == nil {
				drivers[i].Argv[0] = abs
			}
		}
	}
	all, err := runner.LoadScenarios(*scenarios)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	var re *regexp.Regexp
	if *only != "" {
		re = regexp.MustCompile(*only)
	}
	tiers := map[string]bool{}
	for _, t := range strings.Split(*tier, ",") {
		tiers[strings.TrimSpace(t)] = true
	}
	var picked []*runner.Scenario
	needBroker, needCluster := false, false
	for _, sc := range all {
		if (!tiers["all"] && !tiers[sc.Tier]) || (re != nil && !re.MatchString(sc.Name)) {
			continue
		}
		picked = append(picked, sc)
		needBroker = needBroker || sc.Tier == "behaviour"
		needCluster = needCluster || sc.Tier == "cluster"
	}
	rules, err := runner.LoadRules(*spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	knownList, err := runner.LoadKnownFailures(*known)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	var printMu sync.Mutex
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	var env runner.Env
	// The cluster tier's nodes: the -cluster run's when it has three or more (its
	// scenarios then wait for the others to finish, and killed nodes are restarted
	// after each), else a fresh 3-node cluster for each scenario run, beside the rest:
	// the next one starts while the current one runs, and each is thrown away after
	// its scenario (a node restarted after kill -9 can take many seconds to be ready).
	shared := make(chan runner.Env, 1)
	ownCluster := needCluster && *narad != "" && *clusterN < 3
	if needCluster && *narad == "" {
		shared <- runner.Env{}
	}
	var clusterStartFailed atomic.Bool
	freshCluster := func() <-chan runner.Env {
		ch := make(chan runner.Env, 1)
		go func() {
			dir, err := os.MkdirTemp("", "narad-conformance-cluster-")
			if err == nil {
				var nodes []*runner.Broker
				nodes, err = runner.StartCluster(ctx, *narad, dir, 3)
				if err == nil {
					err = runner.WaitClusterAlive(ctx, nodes, time.Minute)
					if err == nil {
						ch <- runner.Env{Broker: nodes[0], Nodes: nodes, Disposable: true, Dir: dir}
						return
					}
					for _, n := range nodes {
						// What each node logged (warnings and errors) says why it
						// is not whole; nothing else keeps it once the dir is gone.
						fmt.Fprintf(os.Stderr, "conformance: the log of cluster node %s:\n%s\n", n.ID, n.Log())
						n.Discard()
					}
				}
				_ = os.RemoveAll(dir) // a temp dir; the OS cleans it if this fails
			}
			fmt.Fprintln(os.Stderr, "conformance: starting a narad cluster for the cluster tier:", err)
			clusterStartFailed.Store(true)
			ch <- runner.Env{}
		}()
		return ch
	}
	discard := func(e runner.Env) {
		for _, n := range e.Nodes {
			n.Discard()
		}
		if e.Dir != "" {
			_ = os.RemoveAll(e.Dir) // a temp dir; the OS cleans it if this fails
		}
	}
	if needBroker || (needCluster && !ownCluster) {
		if *narad == "" {
			fmt.Fprintln(os.Stderr, "conformance: the behaviour tier needs -narad or NARAD_BIN; behaviour scenarios will be n/a")
		} else {
			dir, err := os.MkdirTemp("", "narad-conformance-")
			if err != nil {
				fmt.Fprintln(os.Stderr, "conformance:", err)
				return 2
			}
			defer func() { _ = os.RemoveAll(dir) }() // a temp dir; the OS cleans it if this fails
			if *clusterN > 1 {
				nodes, err := runner.StartCluster(ctx, *narad, dir, *clusterN)
				if err != nil {
					fmt.Fprintln(os.Stderr, "conformance: starting a narad cluster:", err)
					return 2
				}
				for _, n := range nodes {
					defer n.Stop()
				}
				env.Broker, env.Nodes = nodes[0], nodes
				if needCluster && !ownCluster {
					shared <- env
				}
				var urls []string
				for _, n := range nodes {
					urls = append(urls, n.URL)
				}
				fmt.Printf("conformance: a %d-node narad cluster at %s (data in %s)\n", len(nodes), strings.Join(urls, " "), dir)
			} else {
				b, err := runner.StartBroker(ctx, *narad, dir)
				if err != nil {
					fmt.Fprintln(os.Stderr, "conformance: starting narad:", err)
					return 2
				}
				defer b.Stop()
				env.Broker = b
				fmt.Printf("conformance: narad at %s (data in %s)\n", b.URL, dir)
			}
		}
	}
	type job struct {
		sc  *runner.Scenario
		drv runner.DriverSpec
		i   int
	}
	results := make([]runner.Result, len(picked)*len(drivers))
	record := func(j job, r runner.Result) {
		results[j.i] = r
		printMu.Lock()
		fmt.Printf("  %-12s %-44s %s (%.1fs)\n", j.drv.Name, j.sc.Name, r.Outcome, float64(r.DurationMs)/1000)
		printMu.Unlock()
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for w := 0; w < max(*parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				record(j, runner.RunScenario(ctx, j.sc, j.drv, env))
			}
		}()
	}
	// Behaviour scenarios take longer: start them first so the slow tail is short. The
	// cluster tier kills nodes: its scenarios run one at a time, on their own clusters
	// from the start beside the rest, or after the rest when they share the -cluster
	// run's nodes.
	var mainJobs, clusterJobs []job
	i := 0
	for _, wantTier := range []string{"behaviour", "wire", "cluster"} {
		for _, sc := range picked {
			if sc.Tier != wantTier {
				continue
			}
			for _, d := range drivers {
				if wantTier == "cluster" {
					clusterJobs = append(clusterJobs, job{sc: sc, drv: d, i: i})
				} else {
					mainJobs = append(mainJobs, job{sc: sc, drv: d, i: i})
				}
				i++
			}
		}
	}
	var cwg sync.WaitGroup
	if len(clusterJobs) > 0 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			if !ownCluster {
				wg.Wait()
				cenv := <-shared
				for _, j := range clusterJobs {
					record(j, runner.RunScenario(ctx, j.sc, j.drv, cenv))
				}
				return
			}
			next := freshCluster()
			for k, j := range clusterJobs {
				cenv := <-next
				if k+1 < len(clusterJobs) {
					next = freshCluster()
				}
				record(j, runner.RunScenario(ctx, j.sc, j.drv, cenv))
				discard(cenv)
			}
		}()
	}
	for _, j := range mainJobs {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	cwg.Wait()
	runner.ApplyKnown(results, knownList)
	runner.WriteSummary(os.Stdout, results, rules, *verbose)
	fmt.Printf("conformance: %d scenarios × %d drivers in %.1fs\n", len(picked), len(drivers), time.Since(start).Seconds())
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err == nil {
			if err := runner.WriteJSON(filepath.Join(*out, "results.json"), results); err != nil {
				fmt.Fprintln(os.Stderr, "conformance:", err)
			}
			if err := runner.WriteJUnit(filepath.Join(*out, "junit.xml"), results); err != nil {
				fmt.Fprintln(os.Stderr, "conformance:", err)
			}
		}
	}
	if *matrix != "" {
		if err := runner.WriteMatrix(*matrix, results, rules); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
		}
	}
	if clusterStartFailed.Load() {
		return 2
	}
	if runner.Failed(results) {
		return 1
	}
	return 0
}
