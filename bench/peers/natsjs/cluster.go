package natsjs

// The three-server target, "jetstream-r3-sync": what narad's RF 3 is held to.
//
// Three nats-server processes on 127.0.0.1 form one cluster (free client, route and
// monitoring ports, each server with its own store_dir), every server with
// sync_interval: always. Streams are created with 3 replicas, and a consumer of a
// replicated stream is replicated as its stream is, so a PubAck and a confirmed ack
// both pass through a raft group of the three servers. With sync_interval: always
// and more than one replica, nats-server 2.15 fsyncs the group's raft log on every
// write and lets the stream's own files be synced on snapshots, so the raft log is
// where a PubAck's durability comes from.
//
// The load engine samples one process; for a cluster that would be a third of the
// work, so the target samples the three servers itself and ApplyClusterUsage puts
// those figures in the results. The engine asks for PID once per shape, right after
// opening the shape's queue and as it starts the shape's clock (and for the latency
// shape, after filling the backlog), so a sampler starts there, for the queue opened
// last, and stops when that queue is deleted. Its window is the engine's plus the
// drain of the shapes that consume (consumers taking the last of the backlog).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/proc"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// clusterSize is the number of servers of a replicated target and its streams'
// replicas.
const clusterSize = 3

// clusterReadyTimeout bounds the wait for the cluster to place a 3-replica stream:
// a meta leader elected and every server known to it. Generous, as the machine may
// be busy.
const clusterReadyTimeout = 2 * time.Minute

// rssInterval is how often a cluster sampler reads the servers' RSS, as the load
// engine does for one process.
const rssInterval = 100 * time.Millisecond

// ErrClusterUsage is returned by ApplyClusterUsage when the sampled queues do not
// match the results one to one.
var ErrClusterUsage = errors.New("cluster usage does not match the results")

type clusterNode struct {
	name                     string
	client, route, monitor   string // host:port
	dir, confPath, storePath string
}

func launchCluster(o Options) (*Target, error) {
	nodes := make([]clusterNode, clusterSize)
	for i := range nodes {
		n := &nodes[i]
		n.name = fmt.Sprintf("n%d", i+1)
		for _, a := range []*string{&n.client, &n.route, &n.monitor} {
			addr, err := proc.FreeAddr()
			if err != nil {
				return nil, err
			}
			*a = addr
		}
		n.dir = filepath.Join(o.DataDir, n.name)
		n.confPath = filepath.Join(n.dir, "nats-server.conf")
		n.storePath = filepath.Join(n.dir, "jetstream")
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, err
		}
	}
	routes := make([]string, 0, len(nodes))
	for _, n := range nodes {
		routes = append(routes, fmt.Sprintf("%q", "nats-route://"+n.route))
	}
	sync, name := "", "jetstream-r3"
	if o.Sync {
		sync, name = "\n  sync_interval: always", "jetstream-r3-sync"
	}
	t := &Target{name: name, replicas: clusterSize, prefix: randomHex()}
	for _, n := range nodes {
		conf := fmt.Sprintf("listen: %q\nserver_name: %s\nhttp: %q\nlog_file: %q\n"+
			"jetstream {\n  store_dir: %q%s\n}\n"+
			"cluster {\n  name: narad-bench\n  listen: %q\n  routes: [%s]\n}\n",
			n.client, n.name, n.monitor, filepath.Join(n.dir, "nats-server.log"),
			n.storePath, sync, n.route, strings.Join(routes, ", "))
		if err := os.WriteFile(n.confPath, []byte(conf), 0o644); err != nil {
			_ = t.Close() // the write error is the one to report
			return nil, err
		}
		url := "nats://" + n.client
		// A server of a cluster cannot answer JetStream requests until a meta leader
		// is elected, which needs a second server: each is ready when it accepts
		// clients, and the cluster when it can place a 3-replica stream.
		node, err := proc.Start(exec.Command(o.Server, "-c", n.confPath), o.Log, readyTimeout, func(ctx context.Context) error {
			nc, err := nats.Connect(url, nats.Timeout(time.Second))
			if err != nil {
				return err
			}
			nc.Close()
			return nil
		})
		if err != nil {
			_ = t.Close() // stops the servers already started
			return nil, fmt.Errorf("starting nats-server %s: %w", n.name, err)
		}
		t.nodes = append(t.nodes, node)
		t.urls = append(t.urls, url)
		t.monitors = append(t.monitors, "http://"+n.monitor)
	}
	if err := t.connect(o.Conns); err != nil {
		_ = t.Close() // the connect error is the one to report
		return nil, err
	}
	if err := t.awaitPlacement(); err != nil {
		_ = t.Close() // the placement error is the one to report
		return nil, err
	}
	return t, nil
}

// awaitPlacement polls until the cluster creates a 3-replica stream whose two
// followers are current, then deletes that stream: until then the cluster would
// refuse or stall the first shape's streams.
func (t *Target) awaitPlacement() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	js := t.js[0]
	name := "bench-ready-" + t.prefix
	cfg := jetstream.StreamConfig{
		Name: name, Subjects: []string{"bench.ready." + t.prefix},
		Storage: jetstream.FileStorage, Replicas: t.replicas,
	}
	var last error
	for ctx.Err() == nil {
		// Until there is a meta leader a JetStream request gets no answer at all, so
		// each attempt has its own bound.
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := js.CreateStream(actx, cfg)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = s.Info(actx); err == nil {
				if err = Replicated(info.Cluster, t.replicas); err == nil {
					err = js.DeleteStream(actx, name)
					acancel()
					return err
				}
			}
		}
		acancel()
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("the cluster did not place a %d-replica stream in %s: %v", t.replicas, clusterReadyTimeout, last)
}

// Replicated reports whether c, the cluster view of a stream or a consumer, shows a
// leader and replicas-1 followers, each current and each a different server.
func Replicated(c *jetstream.ClusterInfo, replicas int) error {
	if c == nil || c.Leader == "" {
		return errors.New("no leader")
	}
	if len(c.Replicas) != replicas-1 {
		return fmt.Errorf("%d followers, want %d", len(c.Replicas), replicas-1)
	}
	seen := map[string]bool{c.Leader: true}
	for _, p := range c.Replicas {
		if !p.Current || p.Offline || seen[p.Name] {
			return fmt.Errorf("follower %s current %v, offline %v, leader %s", p.Name, p.Current, p.Offline, c.Leader)
		}
		seen[p.Name] = true
	}
	return nil
}

// MonitorURLs are the monitoring endpoints of a cluster's servers (nil for a single
// server), for checks of each server's own configuration (/varz).
func (t *Target) MonitorURLs() []string { return t.monitors }

// ApplyClusterUsage replaces the server usage of rs, the results of one load.Run on
// t, with the three servers' together: CPU summed, RSS the peak of the sum. Results
// pair in order with the samplers started since the last call, one per shape. When
// they do not pair, every Usage is cleared, since one server's figures would pass for
// the cluster's, and ErrClusterUsage says so. On a single server it does nothing.
func (t *Target) ApplyClusterUsage(rs []load.Result) error {
	if len(t.nodes) < 2 {
		return nil
	}
	us := t.usage.take()
	if len(us) != len(rs) {
		for i := range rs {
			rs[i].Usage = nil
		}
		return fmt.Errorf("%w: %d shapes sampled, %d results", ErrClusterUsage, len(us), len(rs))
	}
	for i := range rs {
		rs[i].Usage = us[i]
	}
	return nil
}

// clusterUsage samples the servers of a cluster for each shape's queue.
type clusterUsage struct {
	mu      sync.Mutex
	last    *queue            // opened last and not yet sampled
	started []*clusterSampler // in the order the shapes started, since the last take
}

// opened notes q as the queue the next begin samples for.
func (c *clusterUsage) opened(q *queue) {
	c.mu.Lock()
	c.last = q
	c.mu.Unlock()
}

// begin starts sampling nodes for the queue opened last; it does nothing when that
// queue is already sampled or was deleted.
func (c *clusterUsage) begin(nodes []*proc.Process) {
	c.mu.Lock()
	q := c.last
	c.last = nil
	c.mu.Unlock()
	if q == nil {
		return
	}
	s := &clusterSampler{start: time.Now(), stopc: make(chan struct{}), done: make(chan struct{})}
	for _, n := range nodes {
		s.pids = append(s.pids, n.PID())
	}
	s.cpu0, s.err = cpuSum(s.pids)
	go s.loop()
	c.mu.Lock()
	q.sampler = s
	c.started = append(c.started, s)
	c.mu.Unlock()
}

// end stops q's sampler, if it has one, and records its usage.
func (c *clusterUsage) end(q *queue) {
	c.mu.Lock()
	if c.last == q {
		c.last = nil
	}
	s := q.sampler
	c.mu.Unlock()
	if s == nil {
		return
	}
	s.stopOnce.Do(func() {
		close(s.stopc)
		<-s.done
		s.rss()
		cpu1, err := cpuSum(s.pids)
		if err != nil || s.err != nil || s.peak == 0 {
			return
		}
		wall := time.Since(s.start)
		u := &proc.Usage{CPU: (cpu1 - s.cpu0).Seconds() / wall.Seconds(), RSSPeak: s.peak, RSSLast: s.last}
		c.mu.Lock()
		s.usage = u
		c.mu.Unlock()
	})
}

// take returns the usage of each shape started since the last take, nil where the
// servers could not be read or the queue was not deleted.
func (c *clusterUsage) take() []*proc.Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*proc.Usage, len(c.started))
	for i, s := range c.started {
		out[i] = s.usage
	}
	c.started = nil
	return out
}

// clusterSampler watches every server of a cluster over one queue's life.
type clusterSampler struct {
	pids       []int
	start      time.Time
	cpu0       time.Duration
	err        error
	stopc      chan struct{}
	stopOnce   sync.Once
	done       chan struct{}
	peak, last int64
	usage      *proc.Usage
}

func (s *clusterSampler) loop() {
	defer close(s.done)
	tk := time.NewTicker(rssInterval)
	defer tk.Stop()
	for {
		s.rss()
		select {
		case <-s.stopc:
			return
		case <-tk.C:
		}
	}
}

// rss adds the servers' resident sizes; a server it cannot read spoils the sample.
func (s *clusterSampler) rss() {
	var total int64
	for _, pid := range s.pids {
		r, err := proc.RSS(pid)
		if err != nil {
			return
		}
		total += r
	}
	s.last = total
	s.peak = max(s.peak, total)
}

func cpuSum(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		d, err := proc.CPUTime(pid)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}
