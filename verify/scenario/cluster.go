package scenario

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/narad-mq/narad/verify/check"
	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/netns"
	"github.com/narad-mq/narad/verify/node"
	"github.com/narad-mq/narad/verify/workload"
)

// clusterSecret is the verification clusters' secret (NARAD_CLUSTER_SECRET).
const clusterSecret = "narad-verify-cluster-secret-0123"

// The ports of a node in its own network namespace (the namespace is the run's, so
// they are free; not narad's default 7942).
const (
	nsHTTPPort    = 7100
	nsClusterPort = 7200
)

// ChaosNetEnv names the rules file a narad built with -tags chaosnet polls (it mirrors
// broker/internal/transport.ChaosNetEnvVar).
const ChaosNetEnv = "NARAD_CHAOSNET_FILE"

// FailpointsFileEnv names the failpoints file a narad built with -tags failpoints polls
// (it mirrors broker/internal/failpoint.FileEnvVar).
const FailpointsFileEnv = "NARAD_FAILPOINTS_FILE"

// RunCluster runs one verification on a cluster of cfg.Nodes real narad processes on
// loopback: the cluster workload under its fault schedule, the drain, then a quiesce
// (every follower caught up, every node reporting the same markers), a graceful stop of
// every node, and a read of every replica's segment files, which the checker compares.
// A failing run keeps every node's log and data directory, the history and the seed.
func RunCluster(ctx context.Context, cfg Config) *Result {
	started := time.Now()
	res := &Result{}
	logf := cfg.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	cfg.Workload.Cluster = true
	bin, dir, histPath, rec, err := runFiles(ctx, cfg.Bin, cfg.Dir, "narad-verify-cluster-", cfg.Workload.Seed)
	if dir != "" {
		res.Dir = dir
	}
	if err != nil {
		res.Err = err
		return res
	}
	cfg.Bin = bin
	clk := history.NewClock()

	ids := make([]string, cfg.Nodes)
	addrs := make([]string, cfg.Nodes)
	var peers []string
	hosts := make([]netns.Host, cfg.Nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%d", i+1)
		if cfg.Netns != nil {
			// A namespace of its own: its address, and ports nothing else uses there.
			h, ok := cfg.Netns.Host(ids[i])
			if !ok {
				res.Err = fmt.Errorf("the network has no host %s for node %s", ids[i], ids[i])
				return res
			}
			hosts[i], addrs[i] = h, h.IP+":"+strconv.Itoa(nsClusterPort)
		} else {
			p, err := node.FreeUDPPort()
			if err != nil {
				res.Err = err
				return res
			}
			addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
		}
		peers = append(peers, ids[i]+"@"+addrs[i])
	}
	rules, fps := map[string]string{}, map[string]string{}
	nodes := make([]*node.Node, cfg.Nodes)
	var args []string
	for i, id := range ids {
		// At INFO, each node logs the partition leaderships it takes and how (the
		// KindLeader lines the checker reads).
		args = append(append([]string(nil), DefaultArgs...), "--log-level", "info", "--node-id", id, "--cluster-addr", addrs[i], "--peers", strings.Join(peers, ","))
		if cfg.Netns != nil {
			// Not loopback, but a network of the run's own that nothing else reaches.
			args = append(args, "--insecure")
		}
		args = append(args, cfg.Args...)
		env := []string{"NARAD_CLUSTER_SECRET=" + clusterSecret}
		if cfg.ChaosNet {
			rules[id] = filepath.Join(dir, "chaosnet-"+id+".rules")
			if err := os.WriteFile(rules[id], nil, 0o644); err != nil {
				res.Err = err
				return res
			}
			env = append(env, ChaosNetEnv+"="+rules[id])
			// The same build has the failpoints tag: a file of each node's arms its
			// failpoints while it runs (the slowdisk step).
			fps[id] = filepath.Join(dir, "failpoints-"+id)
			if err := os.WriteFile(fps[id], nil, 0o644); err != nil {
				res.Err = err
				return res
			}
			env = append(env, FailpointsFileEnv+"="+fps[id])
		}
		opts := node.Options{Bin: cfg.Bin, ID: id, DataDir: filepath.Join(dir, "data-"+id), LogPath: filepath.Join(dir, "node-"+id+".log"), Args: args, Env: env}
		if cfg.Netns != nil {
			opts.Netns, opts.Host, opts.Port = hosts[i].NS, hosts[i].IP, nsHTTPPort
		}
		n, err := node.New(opts)
		if err != nil {
			res.Err = err
			return res
		}
		nodes[i] = n
	}
	cfg.Workload.ClusterFaults.ChaosNet = rules
	cfg.Workload.ClusterFaults.Failpoints = fps
	cfg.Workload.ClusterFaults.Netns = cfg.Netns
	cfg.Workload.ClusterFaults.PlaneAddrs = map[string]string{}
	for i, id := range ids {
		cfg.Workload.ClusterFaults.PlaneAddrs[id] = addrs[i]
	}
	rec.Add(history.Entry{Kind: history.KindRun, Run: &history.RunInfo{
		Seed: cfg.Workload.Seed, WallStart: clk.Start().UnixNano(), Topics: cfg.Workload.Topics(), Nodes: ids,
		Settings: map[string]any{"messages": cfg.Workload.Messages, "steps": cfg.Workload.ClusterFaults.Steps, "args": args,
			"visibility_ms": cfg.Workload.VisibilityMs, "quiet": cfg.Workload.Quiet, "chaosnet": cfg.ChaosNet, "netns": cfg.Netns != nil},
	}})
	t0 := clk.Now()
	// The nodes read the machine's wall clock as they start: whatever it moved against
	// the monotonic clock since the run's clock started is part of their offsets too
	// (the injector records it at every later start).
	machine := clk.WallDrift()
	if machine < time.Millisecond && machine > -time.Millisecond {
		machine = 0
	}
	cfg.Workload.ClusterFaults.FirstStartDrift = machine
	for _, n := range nodes {
		var env []string
		off, drift := cfg.Workload.ClusterFaults.ClockOffsets[n.ID()], cfg.Workload.ClusterFaults.ClockDrifts[n.ID()]
		if off != 0 || drift != 0 || machine != 0 {
			// Written before the node starts: it runs with the offset from the line on
			// (a drift counts from the run's start, which the injector assumes too).
			rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: 0, Return: t0, Target: n.ID(),
				Detail:      fmt.Sprintf("%s's wall clock %v against the run's from its first start (the machine's %v of it), gaining %+.0f ms a second", n.ID(), off+machine, machine, 1000*drift),
				ClockOffset: int64(off + machine), ClockDrift: drift, Partition: -1, Offset: -1})
		}
		if off != 0 || drift != 0 {
			env = append(env, workload.ClockEnvVar+"="+off.String())
			if drift != 0 {
				env = append(env, workload.ClockDriftEnvVar+"="+strconv.FormatFloat(drift, 'f', -1, 64))
			}
		}
		if err := n.Start(env...); err != nil && res.Err == nil {
			res.Err = err
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = n.WaitReady(120 * time.Second) }()
	}
	wg.Wait()
	for i, n := range nodes {
		if errs[i] != nil && res.Err == nil {
			res.Err = errs[i]
		}
		rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultRestart, Call: t0, Return: clk.Now(), Target: n.ID(), Detail: "first start", Partition: -1, Offset: -1})
	}
	if res.Err == nil {
		// Ready is not enough to create a topic with a replica on every node: the
		// controller must have heard each member (see workload.MembersAlive).
		deadline := time.Now().Add(time.Minute)
		for err := workload.MembersAlive(ctx, nodes); err != nil; err = workload.MembersAlive(ctx, nodes) {
			if time.Now().After(deadline) {
				res.Err = fmt.Errorf("the cluster's members were not all alive within a minute: %w", err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if res.Err == nil {
		logf("cluster run %d: nodes %s, files in %s", cfg.Workload.Seed, strings.Join(peers, ","), dir)
		cfg.Workload.Checkpoint = checkpoint(rec, histPath)
		res.Stats, res.Err = workload.Run(ctx, cfg.Workload, nodes, rec, clk)
	}
	if res.Err == nil {
		quiesce(ctx, nodes, cfg.Workload.Topics(), rec, clk)
	}
	// Freeze every node at once, then kill them: a graceful stop, one node after the
	// other, would move leaderships, and a parent's new leader copies into its children
	// again (fanout-recopy), so the replicas would differ by what was written after the
	// first node stopped.
	freezeKill(nodes)
	for _, n := range nodes {
		_ = n.Close() // killed just above; this closes the log
	}
	for _, n := range nodes {
		t := clk.Now()
		for _, l := range n.TakeLeads() {
			rec.Add(history.Entry{Kind: history.KindLeader, Node: n.ID(), Topic: l.Topic, Incarnation: l.Incarnation, Partition: l.Partition,
				Epoch: l.Term, Detail: l.How, Call: t, Return: t, Offset: -1})
		}
	}
	if res.Err == nil {
		for _, n := range nodes {
			for _, e := range ReadReplicas(n.ID(), n.DataDir(), clk.Now()) {
				rec.Add(e)
			}
		}
	}
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

// freezeKill stops every node with SIGSTOP (all at once), then kills them.
func freezeKill(nodes []*node.Node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); _ = n.Pause() }() // one that exited already is killed below all the same
	}
	wg.Wait()
	for _, n := range nodes {
		_ = n.Kill() // a stopped process dies of SIGKILL too
	}
}

// quiesceStable is how long the nodes' readings must stay the same before the nodes
// are frozen: followers apply a commit they learn of a heartbeat later.
const quiesceStable = time.Second

// quiesce waits (up to 2 minutes) until every follower has caught up and every node
// reports the same high watermark, frontier and next offset for every partition, the
// same for at least quiesceStable, and writes a KindQuiesce line saying whether that
// happened (the checker flags one that did not). The last reading of each node is
// written as stats lines, so the markers' checks (and the replicas' lengths) use them.
func quiesce(ctx context.Context, nodes []*node.Node, topics []history.TopicInfo, rec *history.Writer, clk *history.Clock) {
	deadline := time.Now().Add(2 * time.Minute)
	why, prev := "", ""
	var since time.Time
	for {
		why = ""
		if err := workload.ClusterSettled(ctx, nodes, topics, 0); err != nil {
			why = err.Error()
		} else {
			fp, w := agree(ctx, nodes, topics, nil, clk)
			switch {
			case w != "":
				why = w
			case fp != prev:
				prev, since, why = fp, time.Now(), "the readings changed"
			case time.Since(since) < quiesceStable:
				why = "the readings have not stayed the same for long enough"
			default:
				agree(ctx, nodes, topics, rec, clk) // recorded
			}
		}
		if why == "" || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	detail := "ok"
	if why != "" {
		detail = "the nodes did not agree within 2 minutes: " + why
	}
	t := clk.Now()
	rec.Add(history.Entry{Kind: history.KindQuiesce, Call: t, Return: t, Detail: detail, Partition: -1, Offset: -1})
}

// agree reads every topic through every node and returns "" when all agree (and the
// followers' match offsets equal the high watermark), with a fingerprint of what they
// said; then it records the readings (when rec is not nil).
func agree(ctx context.Context, nodes []*node.Node, topics []history.TopicInfo, rec *history.Writer, clk *history.Clock) (string, string) {
	var fp strings.Builder
	type reading struct {
		node string
		st   []workload.PartitionStats
		call int64
		ret  int64
	}
	var rs []reading
	for _, t := range topics {
		var first *reading
		for _, n := range nodes {
			call := clk.Now()
			st, ok := workload.ReadTopic(ctx, n.URL(), t.Name)
			r := reading{n.ID(), st, call, clk.Now()}
			if !ok {
				return "", fmt.Sprintf("%s does not answer for %s", n.ID(), t.Name)
			}
			for _, s := range st {
				for _, f := range s.Followers {
					if f.Match != s.HighWatermark {
						return "", fmt.Sprintf("%s/%d: follower %s matches %d, high watermark %d", t.Name, s.Partition, f.Node, f.Match, s.HighWatermark)
					}
				}
				if s.Next != s.HighWatermark {
					return "", fmt.Sprintf("%s/%d: next offset %d, high watermark %d", t.Name, s.Partition, s.Next, s.HighWatermark)
				}
			}
			if first == nil {
				first = &r
			} else {
				for p := range st {
					a, b := first.st[p], st[p]
					if a.HighWatermark != b.HighWatermark || a.Frontier != b.Frontier || a.Next != b.Next || a.Leader != b.Leader || a.Epoch != b.Epoch {
						return "", fmt.Sprintf("%s/%d: %s reports hw %d frontier %d next %d leader %s epoch %d, %s reports hw %d frontier %d next %d leader %s epoch %d",
							t.Name, p, first.node, a.HighWatermark, a.Frontier, a.Next, a.Leader, a.Epoch, r.node, b.HighWatermark, b.Frontier, b.Next, b.Leader, b.Epoch)
					}
				}
			}
			rs = append(rs, r)
		}
		for _, s := range first.st {
			fmt.Fprintf(&fp, "%s/%d %d %d %d %s %d;", t.Name, s.Partition, s.HighWatermark, s.Frontier, s.Next, s.Leader, s.Epoch)
		}
		for _, r := range rs[len(rs)-len(nodes):] {
			if rec == nil {
				break
			}
			for _, s := range r.st {
				rec.Add(history.Entry{Kind: history.KindStats, Client: "quiesce", Topic: t.Name, Partition: s.Partition, Call: r.call, Return: r.ret, Status: 200,
					HighWatermark: s.HighWatermark, Frontier: s.Frontier, Oldest: s.Oldest, Backlog: s.Backlog, InFlight: s.InFlight, Offset: s.Next,
					Node: r.node, Target: s.Leader, Epoch: s.Epoch})
			}
		}
	}
	return fp.String(), ""
}

// ReadReplicas reads a stopped node's data directory: one KindReplica line per
// partition of each topic's newest incarnation there, with the message id of each
// record and a digest of every record's bytes.
func ReadReplicas(id, dataDir string, at int64) []history.Entry {
	var out []history.Entry
	parts, incs := workload.DataDirIncarnations(dataDir)
	var topics []string
	for t := range parts {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	for _, t := range topics {
		var ps []int32
		for p := range parts[t] {
			ps = append(ps, p)
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		for _, p := range ps {
			e := history.Entry{Kind: history.KindReplica, Node: id, Topic: t, Partition: p, Call: at, Return: at, Offset: -1, Incarnation: incs[t]}
			first, frames, err := readLog(parts[t][p])
			h := sha256.New()
			if err != nil {
				e.Err = err.Error()
			}
			e.Offset = first
			for _, f := range frames {
				h.Write(f.raw)
				var pl struct {
					ID string `json:"id"`
				}
				_ = json.Unmarshal(f.value, &pl) // a payload without an id shows as ""
				e.IDs = append(e.IDs, pl.ID)
			}
			e.Detail = hex.EncodeToString(h.Sum(nil))[:16]
			out = append(out, e)
		}
	}
	return out
}

type frame struct {
	offset     uint64
	raw, value []byte
}

// readLog reads every record of a partition's log directory in offset order; the
// offsets must follow each other with no gap.
func readLog(dir string) (first int64, out []frame, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1, nil, err
	}
	var segs []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".log") {
			segs = append(segs, e.Name())
		}
	}
	sort.Strings(segs)
	first = -1
	for _, s := range segs {
		b, err := os.ReadFile(filepath.Join(dir, s))
		if err != nil {
			return first, out, err
		}
		fs := workload.Frames(b)
		end := 0
		for _, f := range fs {
			if first < 0 {
				first = int64(f.Offset)
			} else if want := uint64(first) + uint64(len(out)); f.Offset != want {
				return first, out, fmt.Errorf("%s: offset %d where %d was due", s, f.Offset, want)
			}
			out = append(out, frame{f.Offset, b[f.Pos : f.Pos+f.Size], f.Value})
			end = f.Pos + f.Size
		}
		if end != len(b) {
			return first, out, fmt.Errorf("%s: %d bytes after the last whole record", s, len(b)-end)
		}
	}
	return first, out, nil
}
