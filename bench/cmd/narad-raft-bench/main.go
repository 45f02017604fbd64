// Command narad-raft-bench measures the replication spike (broker/cmd/narad-spike):
// three node processes on loopback hosting N raft groups each, and three
// measurements — idle cost, failover after kill -9, RF 3 throughput. It only execs the
// spike binary and reads /proc, so it lives in the bench module. See
// docs/internals/replication.md for what each mode measures and how to read it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/proc"
)

type options struct {
	spike     string
	mode      string
	groups    int
	idle      time.Duration
	kills     int
	duration  time.Duration
	clients   int
	active    int
	size      int
	batch     int
	spikeArgs string
	keep      bool
}

func main() {
	var o options
	flag.StringVar(&o.spike, "spike", "../bin/narad-spike", "narad-spike binary")
	flag.StringVar(&o.mode, "mode", "idle,failover,throughput", "comma list of idle, failover, throughput")
	flag.IntVar(&o.groups, "groups", 300, "raft groups (partitions), RF 3, on 3 nodes")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "idle window")
	flag.IntVar(&o.kills, "kills", 20, "failover: leader kills")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "throughput: window per shape")
	flag.IntVar(&o.clients, "clients", 16, "throughput: concurrent clients")
	flag.IntVar(&o.active, "partitions", 6, "throughput: partitions written")
	flag.IntVar(&o.size, "size", 256, "throughput: payload bytes")
	flag.IntVar(&o.batch, "batch", 100, "throughput: messages per batched Apply")
	flag.StringVar(&o.spikeArgs, "spike-args", "", "extra flags for every node (e.g. '--heartbeat-timeout 1s')")
	flag.BoolVar(&o.keep, "keep", false, "keep the temp dir")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "narad-raft-bench:", err)
		os.Exit(1)
	}
}

// node is one spike process; restart keeps its id, ports and data.
type node struct {
	id, raftAddr, httpAddr, dir string
	args                        []string
	p                           *proc.Process
	log                         *os.File
}

type cluster struct {
	o     options
	nodes []*node
	hc    *http.Client
}

func freeUDP() (string, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }() // only the address was wanted
	return c.LocalAddr().String(), nil
}

type status struct {
	Groups     int      `json:"groups"`
	WithLeader int      `json:"with_leader"`
	Quiesced   int      `json:"quiesced"` // etcd engine only
	Leading    []string `json:"leading"`
	Raftnet    struct {
		RPCCalls, BatchCalls, BatchItems uint64
	} `json:"raftnet"`
}

func (c *cluster) status(ctx context.Context, n *node) (status, error) {
	var st status
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.httpAddr+"/status", nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (c *cluster) start(n *node) error {
	cmd := exec.Command(c.o.spike, n.args...)
	p, err := proc.Start(cmd, n.log, 120*time.Second, func(ctx context.Context) error {
		_, err := c.status(ctx, n)
		return err
	})
	n.p = p
	return err
}

func newCluster(o options, root string) (*cluster, error) {
	c := &cluster{o: o, hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	var peers []string
	for i := range 3 {
		ra, err := freeUDP()
		if err != nil {
			return nil, err
		}
		ha, err := proc.FreeAddr()
		if err != nil {
			return nil, err
		}
		n := &node{id: fmt.Sprintf("n%d", i+1), raftAddr: ra, httpAddr: ha, dir: filepath.Join(root, fmt.Sprintf("n%d", i+1))}
		peers = append(peers, n.id+"="+ra)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		n.args = append([]string{"--id", n.id, "--raft-addr", n.raftAddr, "--http-addr", n.httpAddr,
			"--data-dir", n.dir, "--peers", strings.Join(peers, ","), "--groups", fmt.Sprint(o.groups)},
			strings.Fields(o.spikeArgs)...)
		f, err := os.Create(filepath.Join(root, n.id+".log"))
		if err != nil {
			return nil, err
		}
		n.log = f
	}
	for _, n := range c.nodes {
		if err := c.start(n); err != nil {
			c.stop()
			return nil, fmt.Errorf("starting %s: %w", n.id, err)
		}
	}
	return c, nil
}

func (c *cluster) stop() {
	for _, n := range c.nodes {
		if n.p != nil {
			n.p.Stop()
		}
		_ = n.log.Close() // a node's log file, closed at the end of a run
	}
}

// waitLeaders polls until every node sees a leader for every group.
func (c *cluster) waitLeaders(bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		ok := true
		for _, n := range c.nodes {
			st, err := c.status(context.Background(), n)
			if err != nil || st.WithLeader != c.o.groups {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not every group had a leader after %v", bound)
}

// leaders maps each group to the node leading it.
func (c *cluster) leaders() map[string]*node {
	out := map[string]*node{}
	for _, n := range c.nodes {
		st, err := c.status(context.Background(), n)
		if err != nil {
			continue
		}
		for _, g := range st.Leading {
			out[g] = n
		}
	}
	return out
}

// post sends one Apply to n; ok is a 202.
func (c *cluster) post(ctx context.Context, n *node, path string, body []byte) (bool, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.httpAddr+path, bytes.NewReader(body))
	resp, err := c.hc.Do(req)
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusAccepted, nil
}

func run(o options) error {
	root, err := os.MkdirTemp("", "narad-raft-bench-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer func() { _ = os.RemoveAll(root) }() // a temp dir; nothing to do if it stays
	}
	fmt.Printf("narad-raft-bench: %d groups × RF 3 on 3 local nodes; spike args %q; dir %s\n", o.groups, o.spikeArgs, root)
	fmt.Printf("machine: %d CPUs, load %s, fsync %.0f/s (256 B write + fsync, 2 s, in %s)\n",
		cpus(), load.LoadAvg(), load.FsyncRate(root, 2*time.Second), root)
	c, err := newCluster(o, root)
	if err != nil {
		return err
	}
	defer c.stop()
	if err := c.waitLeaders(120 * time.Second); err != nil {
		return err
	}
	for _, m := range strings.Split(o.mode, ",") {
		switch strings.TrimSpace(m) {
		case "idle":
			err = c.idle()
		case "failover":
			err = c.failover()
		case "throughput":
			err = c.throughput()
		default:
			err = fmt.Errorf("unknown mode %q", m)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func cpus() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\nprocessor")) + 1
}

// idle writes one message to every group, waits for the followers to hear the commit,
// then samples CPU and RSS of the three processes over the idle window.
func (c *cluster) idle() error {
	ls := c.leaders()
	for g, n := range ls {
		if ok, err := c.post(context.Background(), n, "/p/"+g, []byte("one")); !ok {
			return fmt.Errorf("idle: first write to %s: %v", g, err)
		}
	}
	time.Sleep(3 * time.Second) // let the write's commit notices settle before the window
	for _, n := range c.nodes {
		if st, err := c.status(context.Background(), n); err == nil {
			fmt.Printf("  %s leads %d groups, %d quiesced\n", n.id, len(st.Leading), st.Quiesced)
		}
	}
	before := c.frames()
	var ss []*proc.Sampler
	for _, n := range c.nodes {
		ss = append(ss, proc.Sample(n.p.PID(), time.Second))
	}
	time.Sleep(c.o.idle) // the measured window
	after := c.frames()
	var total float64
	fmt.Printf("\nidle: %d groups (%d with a leader seen), one write each, %v window\n", c.o.groups, len(ls), c.o.idle)
	for i, s := range ss {
		u, ok := s.Stop()
		if !ok {
			return errors.New("idle: a node could not be sampled")
		}
		total += u.CPU
		fmt.Printf("  %s: CPU %.1f%% of one core, RSS %.1f MiB (peak %.1f)\n", c.nodes[i].id, 100*u.CPU, mib(u.RSSLast), mib(u.RSSPeak))
	}
	secs := c.o.idle.Seconds()
	fmt.Printf("  all three: CPU %.1f%% of one core = %.1f%% of a %d-CPU machine\n", 100*total, 100*total/float64(cpus()), cpus())
	fmt.Printf("  node plane: %.0f batch frames/s carrying %.0f heartbeats and commit notices/s; %.1f single RPCs/s\n",
		float64(after[1]-before[1])/secs, float64(after[2]-before[2])/secs, float64(after[0]-before[0])/secs)
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// frames sums the raftnet counters of every node: rpc calls, batch calls, batch items.
func (c *cluster) frames() [3]uint64 {
	var f [3]uint64
	for _, n := range c.nodes {
		st, err := c.status(context.Background(), n)
		if err != nil {
			continue
		}
		f[0] += st.Raftnet.RPCCalls
		f[1] += st.Raftnet.BatchCalls
		f[2] += st.Raftnet.BatchItems
	}
	return f
}

// failover kills the leader of a random group with SIGKILL and measures the time to the
// first 202 on that group, the client trying every node every 100 ms; the node is then
// restarted and every group given a leader before the next kill.
func (c *cluster) failover() error {
	fmt.Printf("\nfailover: %d kills of a partition's leader (kill -9), client retrying every 100 ms on every node\n", c.o.kills)
	var ds []time.Duration
	for k := range c.o.kills {
		ls := c.leaders()
		var gs []string
		for g := range ls {
			gs = append(gs, g)
		}
		if len(gs) == 0 {
			return errors.New("failover: no leaders")
		}
		sort.Strings(gs)
		g := gs[rand.IntN(len(gs))]
		victim := ls[g]
		killed := time.Now()
		if err := victim.p.Kill(); err != nil {
			return err
		}
		var d time.Duration
		for {
			if time.Since(killed) > 60*time.Second {
				return fmt.Errorf("failover: no 202 on %s within 60 s", g)
			}
			attempt := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var ok atomic.Bool
			var wg sync.WaitGroup
			for _, n := range c.nodes {
				if n == victim {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r, _ := c.post(ctx, n, "/p/"+g, []byte("failover")); r {
						ok.Store(true)
					}
				}()
			}
			wg.Wait()
			cancel()
			if ok.Load() {
				d = time.Since(killed)
				break
			}
			time.Sleep(time.Until(attempt.Add(100 * time.Millisecond)))
		}
		ds = append(ds, d)
		ledByVictim := 0
		for _, n := range ls {
			if n == victim {
				ledByVictim++
			}
		}
		fmt.Printf("  kill %2d: %s led %s (and %d groups in all); first 202 after %v\n", k+1, victim.id, g, ledByVictim, d.Round(time.Millisecond))
		if err := c.start(victim); err != nil {
			return fmt.Errorf("restarting %s: %w", victim.id, err)
		}
		if err := c.waitLeaders(120 * time.Second); err != nil {
			return err
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	fmt.Printf("  failover over %d kills: min %v, median %v, max %v\n", len(ds), ds[0].Round(time.Millisecond),
		ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	return nil
}

// throughput runs three shapes against the leaders of the first active partitions:
// produce (one Apply per message), flow (a produce Apply then a settle Apply per
// message) and batch (one Apply of `batch` messages, then one settle Apply for them).
func (c *cluster) throughput() error {
	ls := c.leaders()
	var gs []string
	for g := range ls {
		gs = append(gs, g)
	}
	sort.Strings(gs)
	if len(gs) < c.o.active {
		return fmt.Errorf("throughput: %d leaders seen, want %d", len(gs), c.o.active)
	}
	gs = gs[:c.o.active]
	payload := bytes.Repeat([]byte{'x'}, c.o.size)
	batch := bytes.Repeat(payload, c.o.batch)
	fmt.Printf("\nthroughput: RF 3, %d partitions, %d clients, %d B messages, %v per shape\n", c.o.active, c.o.clients, c.o.size, c.o.duration)
	shapes := []struct {
		name string
		per  int
		do   func(ctx context.Context, n *node, g string) (bool, error)
	}{
		{"produce", 1, func(ctx context.Context, n *node, g string) (bool, error) {
			return c.post(ctx, n, "/p/"+g, payload)
		}},
		{"flow", 1, func(ctx context.Context, n *node, g string) (bool, error) {
			if ok, err := c.post(ctx, n, "/p/"+g, payload); !ok {
				return ok, err
			}
			return c.post(ctx, n, "/a/"+g+"?n=1", nil)
		}},
		{"batch", c.o.batch, func(ctx context.Context, n *node, g string) (bool, error) {
			if ok, err := c.post(ctx, n, fmt.Sprintf("/b/%s?n=%d", g, c.o.batch), batch); !ok {
				return ok, err
			}
			return c.post(ctx, n, fmt.Sprintf("/a/%s?n=%d", g, c.o.batch), nil)
		}},
	}
	for _, sh := range shapes {
		var ss []*proc.Sampler
		for _, n := range c.nodes {
			ss = append(ss, proc.Sample(n.p.PID(), time.Second))
		}
		recs := make([]*load.Recorder, c.o.clients)
		var done, failed atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), c.o.duration)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range c.o.clients {
			recs[i] = &load.Recorder{}
			g := gs[i%len(gs)]
			n := ls[g]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					t := time.Now()
					ok, _ := sh.do(ctx, n, g)
					if ctx.Err() != nil {
						return
					}
					if !ok {
						failed.Add(1)
						continue
					}
					recs[i].Add(time.Since(t))
					done.Add(int64(sh.per))
				}
			}()
		}
		wg.Wait()
		cancel()
		wall := time.Since(start)
		var cpu float64
		for _, s := range ss {
			if u, ok := s.Stop(); ok {
				cpu += u.CPU
			}
		}
		sum := load.Summarize(recs...)
		fmt.Printf("  %-8s %8.0f msg/s  p50 %7v  p99 %7v  (per request; %d failed)  CPU all nodes %.0f%% of one core\n",
			sh.name, float64(done.Load())/wall.Seconds(), sum.P50.Round(10*time.Microsecond), sum.P99.Round(10*time.Microsecond), failed.Load(), 100*cpu)
	}
	return nil
}
