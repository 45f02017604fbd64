// Package natsjs is the benchmark's NATS JetStream target: a single nats-server
// process, or a cluster of three, with JetStream on file storage, driven with the
// official client (github.com/nats-io/nats.go/jetstream).
//
// How the shapes map onto JetStream:
//
//   - a queue of P partitions is P streams, one subject each, with work-queue
//     retention and file storage (replicas 1, or 3 on the cluster), each with one
//     durable pull consumer (explicit ack, ack wait 30 s as narad's default lease,
//     max ack pending 100000 as the benchmark sets narad's in-flight cap). A partition is a stream because a
//     stream, like a narad partition, is one log with its own writer and its own syncs.
//   - produce is a publish that waits for the PubAck; a producer rotates over the
//     streams. A batch is that many async publishes to one stream, the batch
//     confirmed when every PubAck arrived.
//   - consume is a Fetch on the consumer's stream. Consumer i is pinned to stream
//     i mod P (so every stream has consumers parked on it) when there are at least
//     as many consumers as streams; otherwise it rotates. A batch consume is a
//     FetchNoWait of up to n, then, when nothing was waiting, a Fetch of 1 that long
//     polls (a Fetch of n would hold the answer until n messages arrived).
//   - ack is a confirmed ack (DoubleAck, AckSync in the old API): it returns once
//     the server answered the ack, as a narad ack returns on the durable 204. With
//     work-queue retention an acked message is removed from the stream at once; with
//     sync_interval: always that removal (a tombstone) is fsynced before the answer.
//     A batch ack is that many confirmed acks in parallel.
//
// Durability differs by configuration, and the targets say which: "jetstream"
// runs JetStream's default (the PubAck means the message is in the server's memory
// and its file's page cache; files are fsynced every 2 minutes), "jetstream-sync"
// runs sync_interval: always (every write is fsynced before its PubAck, one by one,
// with no group commit across publishers). "jetstream-r3-sync" is three servers in
// one cluster with sync_interval: always and streams (and so their consumers) of 3
// replicas: see cluster.go.
package natsjs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/proc"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ServerModule is the module path BuildServer builds the server's main package of.
const ServerModule = "github.com/nats-io/nats-server/v2"

const readyTimeout = 30 * time.Second

// BuildServer builds nats-server (the version pinned in this module's go.mod) into
// dir and returns its path. It runs `go build` in moduleDir, the bench/peers module.
func BuildServer(moduleDir, dir string) (string, error) {
	bin := filepath.Join(dir, "nats-server")
	cmd := exec.Command("go", "build", "-o", bin, ServerModule)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", ServerModule, err, out)
	}
	return bin, nil
}

// Options configures Launch.
type Options struct {
	Server  string // nats-server binary
	DataDir string // JetStream store_dir and the server's config and log
	Sync    bool   // sync_interval: always
	// Replicas is 1 (or 0) for a single server, or 3 for a cluster of three servers
	// whose streams have 3 replicas.
	Replicas int
	Conns    int       // client connections shared by the goroutines (at least 1)
	Log      io.Writer // the server's stdout and stderr
}

// Target drives one nats-server, or a cluster of them. It implements load.Target.
type Target struct {
	name     string
	nodes    []*proc.Process
	replicas int
	urls     []string // client URL of each node
	monitors []string // monitoring URL of each node (clusters only)
	conns    []*nats.Conn
	js       []jetstream.JetStream
	prefix   string
	seq      atomic.Int64
	usage    clusterUsage // the cluster's CPU and RSS per shape (clusters only)
}

var _ load.Target = (*Target)(nil)

// Launch writes a config, starts nats-server on a free loopback port and connects.
// With Replicas 3 it starts a cluster instead (launchCluster).
func Launch(o Options) (*Target, error) {
	switch o.Replicas {
	case 0, 1:
	case 3:
		return launchCluster(o)
	default:
		return nil, fmt.Errorf("replicas must be 1 or 3, not %d", o.Replicas)
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	store := filepath.Join(o.DataDir, "jetstream")
	sync := ""
	name := "jetstream"
	if o.Sync {
		sync, name = "\n  sync_interval: always", "jetstream-sync"
	}
	conf := fmt.Sprintf("listen: %q\nserver_name: bench\nlog_file: %q\njetstream {\n  store_dir: %q%s\n}\n",
		addr, filepath.Join(o.DataDir, "nats-server.log"), store, sync)
	confPath := filepath.Join(o.DataDir, "nats-server.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	t := &Target{name: name, replicas: 1, prefix: randomHex(), urls: []string{"nats://" + addr}}
	node, err := proc.Start(exec.Command(o.Server, "-c", confPath), o.Log, readyTimeout, func(ctx context.Context) error {
		nc, err := nats.Connect(t.urls[0], nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		_, err = js.AccountInfo(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("starting nats-server: %w", err)
	}
	t.nodes = []*proc.Process{node}
	if err := t.connect(o.Conns); err != nil {
		_ = t.Close() // the connect error is the one to report
		return nil, err
	}
	return t, nil
}

// connect opens n client connections (at least 1), connection i to node i mod the
// number of nodes first, so a cluster's clients are spread over its servers as an
// application's would be; the other nodes are the connection's fallbacks.
func (t *Target) connect(n int) error {
	for i := 0; i < max(n, 1); i++ {
		servers := make([]string, 0, len(t.urls))
		for j := range t.urls {
			servers = append(servers, t.urls[(i+j)%len(t.urls)])
		}
		nc, err := nats.Connect(strings.Join(servers, ","), nats.Name(fmt.Sprintf("narad-bench-%d", i)),
			nats.DontRandomize(), nats.MaxReconnects(-1))
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			nc.Close()
			return err
		}
		t.conns, t.js = append(t.conns, nc), append(t.js, js)
	}
	return nil
}

func randomHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name is "jetstream", "jetstream-sync" or "jetstream-r3-sync".
func (t *Target) Name() string { return t.name }

// PID is the nats-server process; of a cluster, the first node's. The load engine
// samples that one process, so on a cluster PID also starts sampling every server
// for the queue opened last (see clusterUsage).
func (t *Target) PID() int {
	if len(t.nodes) > 1 {
		t.usage.begin(t.nodes)
	}
	return t.nodes[0].PID()
}

// URLs are the client URLs of the servers, one per node.
func (t *Target) URLs() []string { return t.urls }

// Close disconnects and stops the servers, each by its own process.
func (t *Target) Close() error {
	for _, nc := range t.conns {
		nc.Close()
	}
	for _, n := range t.nodes {
		n.Stop()
	}
	return nil
}

// Open creates partitions streams with a durable pull consumer each.
func (t *Target) Open(ctx context.Context, partitions int) (load.Queue, error) {
	n := t.seq.Add(1)
	q := &queue{t: t}
	js := t.js[0]
	for p := 0; p < partitions; p++ {
		name := fmt.Sprintf("bench-%s-%d-p%d", t.prefix, n, p)
		subject := fmt.Sprintf("bench.%s.%d.p%d", t.prefix, n, p)
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: name, Subjects: []string{subject},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: t.replicas,
		})
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", name, err)
		}
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: 30 * time.Second, MaxAckPending: 100000, MaxWaiting: 4096,
		}); err != nil {
			return nil, fmt.Errorf("create consumer on %s: %w", name, err)
		}
		q.streams, q.subjects = append(q.streams, name), append(q.subjects, subject)
	}
	if len(t.nodes) > 1 {
		t.usage.opened(q)
	}
	return q, nil
}

type queue struct {
	t                 *Target
	streams, subjects []string
	sampler           *clusterSampler // set by clusterUsage.begin; nil on a single server
}

func (q *queue) Producer(i int) load.Producer {
	return &producer{q: q, js: q.t.js[i%len(q.t.js)], next: i}
}

func (q *queue) Consumer(i, n int) load.Consumer {
	return &consumer{q: q, i: i, pinned: n >= len(q.streams), js: q.t.js[i%len(q.t.js)], cons: make([]jetstream.Consumer, len(q.streams))}
}

// Delete stops the cluster's sampler, if one runs, then deletes the streams.
func (q *queue) Delete(ctx context.Context) error {
	if len(q.t.nodes) > 1 {
		q.t.usage.end(q)
	}
	var errs []error
	for _, s := range q.streams {
		errs = append(errs, q.t.js[0].DeleteStream(ctx, s))
	}
	return errors.Join(errs...)
}

type producer struct {
	q    *queue
	js   jetstream.JetStream
	next int
}

func (p *producer) subject() string {
	s := p.q.subjects[p.next%len(p.q.subjects)]
	p.next++
	return s
}

// Produce publishes and waits for the PubAck.
func (p *producer) Produce(ctx context.Context, payload []byte) error {
	_, err := p.js.Publish(ctx, p.subject(), payload)
	return err
}

// ProduceBatch publishes every payload asynchronously to one stream and waits for
// every PubAck.
func (p *producer) ProduceBatch(ctx context.Context, payloads [][]byte) error {
	subj := p.subject()
	fs := make([]jetstream.PubAckFuture, 0, len(payloads))
	for _, b := range payloads {
		f, err := p.js.PublishAsync(subj, b)
		if err != nil {
			return err
		}
		fs = append(fs, f)
	}
	var first error
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if first == nil {
				first = err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return first
}

type consumer struct {
	q      *queue
	i      int
	pinned bool
	js     jetstream.JetStream
	cons   []jetstream.Consumer // per stream, looked up on first use
	turn   int
}

// part is the stream this consume reads.
func (c *consumer) part() int {
	if c.pinned {
		return c.i % len(c.q.streams)
	}
	c.turn++
	return (c.i + c.turn) % len(c.q.streams)
}

// Consume fetches from one stream: Fetch(1) long polls for one message; for more,
// FetchNoWait takes what is waiting and, when nothing was, Fetch(1) long polls.
func (c *consumer) Consume(ctx context.Context, maxN int, wait time.Duration) ([]load.Delivery, error) {
	p := c.part()
	cons := c.cons[p]
	if cons == nil {
		var err error
		if cons, err = c.js.Consumer(ctx, c.q.streams[p], "bench"); err != nil {
			return nil, err
		}
		c.cons[p] = cons
	}
	if maxN > 1 {
		b, err := cons.FetchNoWait(maxN)
		if err != nil {
			return nil, err
		}
		if ds, err := collect(b, p, maxN); err != nil || len(ds) > 0 {
			return ds, err
		}
	}
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		return nil, err
	}
	return collect(b, p, 1)
}

func collect(b jetstream.MessageBatch, part, maxN int) ([]load.Delivery, error) {
	var out []load.Delivery
	for m := range b.Messages() {
		if out == nil {
			out = make([]load.Delivery, 0, maxN)
		}
		out = append(out, load.Delivery{Payload: m.Data(), Part: part, Ref: m})
	}
	return out, b.Error()
}

// Ack sends confirmed acks (DoubleAck), in parallel when there are several.
func (c *consumer) Ack(ctx context.Context, ds []load.Delivery) (int, error) {
	if len(ds) == 1 {
		if err := ds[0].Ref.(jetstream.Msg).DoubleAck(ctx); err != nil {
			return 0, err
		}
		return 1, nil
	}
	var (
		wg    sync.WaitGroup
		n     atomic.Int64
		once  sync.Once
		first error
	)
	for _, d := range ds {
		wg.Add(1)
		go func(m jetstream.Msg) {
			defer wg.Done()
			if err := m.DoubleAck(ctx); err != nil {
				once.Do(func() { first = err })
				return
			}
			n.Add(1)
		}(d.Ref.(jetstream.Msg))
	}
	wg.Wait()
	return int(n.Load()), first
}
