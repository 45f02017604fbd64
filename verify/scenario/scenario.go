// Package scenario runs one verification: build narad with failpoints, start it in a
// fresh directory, run the workload and its faults, drain, stop, and check the history.
// A failing run keeps everything it needs to be understood and re-checked: the history,
// the node's log, its data directory and the seed (in report.txt).
package scenario

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/narad-mq/narad/verify/check"
	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/netns"
	"github.com/narad-mq/narad/verify/node"
	"github.com/narad-mq/narad/verify/workload"
)

// Config is one run.
type Config struct {
	Workload workload.Config
	// Dir is where the run keeps its files; empty: a new directory under TMPDIR.
	Dir string
	// Keep keeps the directory even when the run passes.
	Keep bool
	// Bin is a narad built with the failpoints tag; empty: build one (once per process).
	Bin string
	// Args are extra `narad serve` flags.
	Args []string
	// Log receives progress lines; nil: discard.
	Log func(format string, args ...any)
	// Nodes > 1 runs a cluster of that many nodes (RunCluster); Workload.Cluster is set.
	Nodes int
	// ChaosNet gives every cluster node a node-plane rules file (the binary must be
	// built with -tags chaosnet), so the net steps can cut and degrade it.
	ChaosNet bool
	// Netns runs each cluster node in its own network namespace of this network (a
	// host named by the node's id) and has the net steps cut with iptables there; this
	// process runs inside the network's "verify" host (narad-verify run -netns).
	Netns *netns.Net
}

// Result is what a run found.
type Result struct {
	Report   *check.Report
	Stats    *workload.Stats
	Dir      string // kept when the run failed or Keep was set
	Duration time.Duration
	Err      error // the harness failed (the node would not start, ...)
}

// OK reports whether the run passed.
func (r *Result) OK() bool {
	return r.Err == nil && r.Report != nil && r.Report.OK() && r.Stats != nil && r.Stats.Drained
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// Binary returns a narad built with the failpoints and chaosnet tags: $NARAD_FAILPOINT_BIN if set,
// otherwise one built once per process into a temporary directory.
func Binary(ctx context.Context) (string, error) {
	if b := os.Getenv("NARAD_FAILPOINT_BIN"); b != "" {
		return b, nil
	}
	buildOnce.Do(func() {
		dir, err := node.FindBrokerDir()
		if err != nil {
			buildErr = err
			return
		}
		tmp, err := os.MkdirTemp("", "narad-verify-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(tmp, "narad")
		// The cluster tier cuts the node plane too; the chaosnet tag does nothing unless
		// a rules file is named (NARAD_CHAOSNET_FILE).
		buildErr = node.BuildTags(ctx, dir, builtBin, "failpoints", "chaosnet")
	})
	return builtBin, buildErr
}

// DefaultArgs are the serve flags of a verification node: small segments so rolls,
// index writes and retention happen all the time; a quick retention pass.
var DefaultArgs = []string{"--segment-bytes", "65536", "--retention-interval", "500ms", "--log-level", "warn", "--shutdown-grace", "5s"}

// Run runs one verification.
func Run(ctx context.Context, cfg Config) *Result {
	if cfg.Nodes > 1 {
		return RunCluster(ctx, cfg)
	}
	started := time.Now()
	res := &Result{}
	logf := cfg.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bin, dir, histPath, rec, err := runFiles(ctx, cfg.Bin, cfg.Dir, "narad-verify-", cfg.Workload.Seed)
	if dir != "" {
		res.Dir = dir
	}
	if err != nil {
		res.Err = err
		return res
	}
	cfg.Bin = bin
	clk := history.NewClock()
	args := append(append([]string(nil), DefaultArgs...), cfg.Args...)
	n, err := node.New(node.Options{Bin: cfg.Bin, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "node.log"), Args: args})
	if err != nil {
		res.Err = err
		return res
	}
	rec.Add(history.Entry{Kind: history.KindRun, Run: &history.RunInfo{
		Seed: cfg.Workload.Seed, WallStart: clk.Start().UnixNano(), Topics: cfg.Workload.Topics(),
		Settings: map[string]any{"messages": cfg.Workload.Messages, "kills": cfg.Workload.Faults.Kills, "args": args,
			"clock_share": cfg.Workload.Faults.ClockShare, "recreate_every": cfg.Workload.RecreateEvery.String()},
	}})
	t0 := clk.Now()
	if err := n.Start(cfg.Workload.Faults.Env...); err == nil {
		err = n.WaitReady(60 * time.Second)
		if err != nil {
			res.Err = err
		}
	} else {
		res.Err = err
	}
	rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultRestart, Call: t0, Return: clk.Now(), Target: "node", Detail: "first start", Partition: -1, Offset: -1})
	if res.Err == nil {
		logf("run %d: node at %s, files in %s", cfg.Workload.Seed, n.URL(), dir)
		cfg.Workload.Checkpoint = checkpoint(rec, histPath)
		res.Stats, res.Err = workload.Run(ctx, cfg.Workload, []*node.Node{n}, rec, clk)
	}
	if err := n.Stop(30 * time.Second); err != nil && res.Err == nil {
		res.Err = fmt.Errorf("stopping the node: %w", err)
	}
	_ = n.Close() // stopped just above (its error is in res.Err); this closes the log
	if err := rec.Close(); err != nil && res.Err == nil {
		res.Err = err
	}
	es, err := history.Read(histPath)
	if err != nil && res.Err == nil {
		res.Err = err
	}
	res.Report = check.Check(es)
	res.Duration = time.Since(started)

	var b bytes.Buffer
	Summary(&b, res)
	_ = os.WriteFile(filepath.Join(dir, "report.txt"), b.Bytes(), 0o644) // a copy of res.Report, which the caller prints
	if res.OK() && !cfg.Keep {
		_ = os.RemoveAll(dir) // a passing run's files; the OS cleans the temp dir if this fails
		res.Dir = ""
	}
	return res
}

// Summary writes a run's report.
func Summary(b *bytes.Buffer, res *Result) {
	if res.Report != nil {
		res.Report.Print(b)
	}
	if res.Stats != nil {
		fmt.Fprintf(b, "drain:             %v (drained: %v)\n", res.Stats.Drain.Round(time.Millisecond), res.Stats.Drained)
		for _, n := range res.Stats.Notes {
			fmt.Fprintf(b, "note:              %s\n", n)
		}
	}
	if res.Err != nil {
		fmt.Fprintf(b, "harness error:     %v\n", res.Err)
	}
	fmt.Fprintf(b, "run time:          %v\n", res.Duration.Round(time.Second))
	if res.Dir != "" {
		fmt.Fprintf(b, "files:             %s (history.jsonl, node.log, data/)\n", res.Dir)
	}
}

// runFiles finds the narad binary (bin, or the one Binary builds) and makes a run's
// directory (dir, or a new temporary one named prefix<seed>-…) and its history file:
// the single node's run and the cluster's alike.
func runFiles(ctx context.Context, bin, dir, prefix string, seed int64) (string, string, string, *history.Writer, error) {
	if bin == "" {
		b, err := Binary(ctx)
		if err != nil {
			return "", "", "", nil, err
		}
		bin = b
	}
	if dir == "" {
		d, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, seed))
		if err != nil {
			return "", "", "", nil, err
		}
		dir = d
	} else {
		// A failed run keeps its files for inspection; a run started into the same
		// directory would start its nodes on the failed run's data directories, whose
		// peers are gone, and never get ready (a process run after a failed one, 7
		// December). So they move aside, to dir.<time>.
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
			if err := os.Rename(dir, dir+"."+time.Now().UTC().Format("20060102T150405.000")); err != nil {
				return "", "", "", nil, fmt.Errorf("moving the last run's files aside: %w", err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", "", "", nil, err
		}
	}
	histPath := filepath.Join(dir, "history.jsonl")
	rec, err := history.Create(histPath)
	if err != nil {
		return bin, dir, "", nil, err
	}
	return bin, dir, histPath, rec, nil
}

// checkpoint returns what a progress line adds while a run goes on: the checker's
// duplicates by cause and violations on the history written so far (the rules that
// need the run's end, a drain or the replicas, are left out).
func checkpoint(rec *history.Writer, path string) func() string {
	return func() string {
		if err := rec.Flush(); err != nil {
			return "checker: " + err.Error()
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "checker: " + err.Error()
		}
		// Lines added since the flush may be cut where the buffer filled: whole ones only.
		es, err := history.Decode(bytes.NewReader(b[:bytes.LastIndexByte(b, '\n')+1]))
		if err != nil {
			return "checker: " + err.Error()
		}
		r := check.Check(es)
		v := map[string]int{}
		for k, n := range r.Violations {
			if k != "incomplete-history" && k != "replicas-unread" {
				v[k] = n
			}
		}
		return fmt.Sprintf("duplicates=%v violations=%v unexpected=%d replayed=%d", r.Duplicates, v, r.Unexpected, r.Replayed)
	}
}
