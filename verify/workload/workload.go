// Package workload drives a real narad node while faults hit it, and records every HTTP
// attempt in a history: producers (single and batch, keyed and not, retrying an unknown
// outcome with the same message id), consumers that ack, nack, renew, forget (never
// ack) or are slow past their lease, a stats sampler, and a final drain that runs with
// no faults until every topic is empty. Topology: a parent topic with a fan-out child
// and a delay child, a short-retention topic so retention deletes under load, and a
// topic that is deleted and recreated under the same name while it is used.
package workload

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/node"
)

// Topic names of the workload.
const (
	Parent    = "orders"
	Copy      = "orders.copy"
	Delayed   = "orders.later"
	Ephemeral = "ephemeral"
	Recycled  = "recycled"
	// Events is the cluster workload's second topic, produced to beside Parent.
	Events = "events"
)

const opTimeout = 30 * time.Second

// Config is one run's workload.
type Config struct {
	Seed     int64
	Messages int           // parent messages to produce; 0 with Duration: no limit
	Duration time.Duration // producers stop after this (0: only Messages bounds them)
	// LoadDuration spreads Messages evenly over about this long, so faults keep hitting
	// a node under load (0: as fast as the node takes them).
	LoadDuration time.Duration
	Producers    int
	Consumers    int
	// VisibilityMs is the lease of every topic; DelayMs the delay child's delay.
	VisibilityMs int64
	DelayMs      int64
	// RetentionMs > 0 adds the Ephemeral topic with this retention.
	RetentionMs int64
	// RecreateEvery > 0 adds the Recycled topic, which is deleted and created again under
	// the same name about this often (between half and one and a half times) while a
	// producer and the consumers use it.
	RecreateEvery time.Duration
	// DrainTimeout bounds the final drain.
	DrainTimeout time.Duration
	Faults       FaultConfig
	// Cluster runs the cluster workload on several nodes: Parent and Events with
	// ClusterPartitions partitions each and Replication replicas, Parent's fan-out and
	// delay children, Recycled with RecreateEvery, no Ephemeral topic; ClusterFaults
	// replaces Faults.
	Cluster           bool
	ClusterPartitions int // 0: 6
	Replication       int // 0: 3
	ClusterFaults     ClusterFaultConfig
	// Quiet makes every consumer ack everything it gets at once (no nack, renew,
	// forgotten or late ack): with no faults, each message is delivered exactly once.
	Quiet bool
	// Progress, when set, is called every ProgressEvery with a one-line summary.
	Progress      func(string)
	ProgressEvery time.Duration
	// Checkpoint, when set, is called with each progress line and its answer added to
	// it: the checker's findings on the history so far.
	Checkpoint func() string
}

func (c *Config) defaults() {
	if c.Producers == 0 {
		c.Producers = 4
	}
	if c.Consumers == 0 {
		c.Consumers = 6
	}
	if c.Cluster && c.VisibilityMs == 0 {
		c.VisibilityMs = 2000
	}
	if c.Cluster && c.DelayMs == 0 {
		c.DelayMs = 2000
	}
	if c.VisibilityMs == 0 {
		c.VisibilityMs = 1500
	}
	if c.DelayMs == 0 {
		c.DelayMs = 1000
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 2 * time.Minute
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = 3 * time.Minute
	}
	if c.ClusterPartitions == 0 {
		c.ClusterPartitions = 6
	}
	if c.Replication == 0 {
		c.Replication = 3
	}
	if c.Cluster {
		c.RetentionMs = 0
	}
}

// Topics returns the workload's topics as the history's run line describes them.
func (c Config) Topics() []history.TopicInfo {
	c.defaults()
	if c.Cluster {
		week := int64(7 * 24 * 3600 * 1000)
		p, rf := c.ClusterPartitions, c.Replication
		ts := []history.TopicInfo{
			{Name: Parent, Partitions: p, VisibilityMs: c.VisibilityMs, RetentionMs: week, Replication: rf},
			{Name: Copy, Partitions: p, VisibilityMs: c.VisibilityMs, RetentionMs: week, Parent: Parent, Replication: rf},
			{Name: Delayed, Partitions: max(1, p/2), VisibilityMs: c.VisibilityMs, RetentionMs: week, Parent: Parent, DelayMs: c.DelayMs, Replication: rf},
			{Name: Events, Partitions: p, VisibilityMs: c.VisibilityMs, RetentionMs: week, Replication: rf},
		}
		if c.RecreateEvery > 0 {
			ts = append(ts, history.TopicInfo{Name: Recycled, Partitions: 2, VisibilityMs: c.VisibilityMs, RetentionMs: week, Recreated: true, Replication: rf})
		}
		return ts
	}
	ts := []history.TopicInfo{
		{Name: Parent, Partitions: 3, VisibilityMs: c.VisibilityMs, RetentionMs: 7 * 24 * 3600 * 1000},
		{Name: Copy, Partitions: 3, VisibilityMs: c.VisibilityMs, RetentionMs: 7 * 24 * 3600 * 1000, Parent: Parent},
		{Name: Delayed, Partitions: 2, VisibilityMs: c.VisibilityMs, RetentionMs: 7 * 24 * 3600 * 1000, Parent: Parent, DelayMs: c.DelayMs},
	}
	if c.RetentionMs > 0 {
		ts = append(ts, history.TopicInfo{Name: Ephemeral, Partitions: 1, VisibilityMs: c.VisibilityMs, RetentionMs: c.RetentionMs})
	}
	if c.RecreateEvery > 0 {
		ts = append(ts, history.TopicInfo{Name: Recycled, Partitions: 2, VisibilityMs: c.VisibilityMs, RetentionMs: 7 * 24 * 3600 * 1000, Recreated: true})
	}
	return ts
}

// Stats sums up what a run did, for its report.
type Stats struct {
	Produced   int64          // produce attempts answered 202 (messages)
	Deliveries int64          // deliveries seen
	Faults     map[string]int // by kind
	Failpoints map[string]int // failpoint kills by point
	Drain      time.Duration  // how long the final drain took
	Drained    bool           // every topic empty at the end
	Recreated  int            // times the Recycled topic was deleted and created again
	// NetLeaderMoved counts network faults of a partition's leader during which another
	// node took the partition over (a cluster run).
	NetLeaderMoved int
	Notes          []string           // harness problems (a node that would not start, ...)
	Latency        map[string][]int64 // op → sorted latencies of answered attempts (ns)
}

// Run creates the topics, runs producers, consumers and the fault injector until the
// producers are done and the faults are spent, then drains with no faults. With one
// node it runs the single-node workload and faults; with cfg.Cluster, the cluster's
// (every node a member of one cluster).
func Run(ctx context.Context, cfg Config, nodes []*node.Node, rec *history.Writer, clk *history.Clock) (*Stats, error) {
	cfg.defaults()
	w := &run{cfg: cfg, n: nodes[0], nodes: nodes, rec: rec, clk: clk, rng: rand.New(rand.NewSource(cfg.Seed)),
		stats:    &Stats{Faults: map[string]int{}, Failpoints: map[string]int{}, Latency: map[string][]int64{}},
		acked202: map[string]int64{}, delivered: map[string]bool{}}
	for _, n := range nodes {
		w.eps = append(w.eps, endpoint{id: n.ID(), url: n.URL()})
	}
	w.budget.Store(int64(cfg.Messages))
	if err := w.setup(ctx); err != nil {
		return w.stats, err
	}
	if cfg.Cluster {
		w.settle(ctx)
	}
	return w.stats, w.loop(ctx)
}

type run struct {
	cfg   Config
	n     *node.Node   // the single node (the first node of a cluster)
	nodes []*node.Node // every node
	eps   []endpoint
	rec   *history.Writer
	clk   *history.Clock
	rng   *rand.Rand // the injector's; each worker has its own, seeded from Seed
	stats *Stats

	budget   atomic.Int64
	prodDone atomic.Bool
	draining atomic.Bool
	// gen counts the Recycled topic's incarnations the recycler made; its producer puts
	// the one it believes it writes to in each message id (the checker relies on timing).
	gen atomic.Int64

	mu        sync.Mutex
	acked202  map[string]int64 // id → 202 time, for progress reports
	delivered map[string]bool
	lat       map[string][]int64
}

func (w *run) setup(ctx context.Context) error {
	c := newClient("admin", w.eps, w.rec, w.clk)
	defer c.close()
	for _, t := range w.cfg.Topics() {
		body := topicBody(t)
		if t.Recreated {
			if _, r := c.createTopic(ctx, body); r.status != http.StatusCreated {
				return fmt.Errorf("creating %s: %s %s", t.Name, r.err, r.body)
			}
			continue
		}
		if r := c.admin(ctx, http.MethodPost, "/v1/topics", body); r.status != http.StatusCreated {
			return fmt.Errorf("creating %s: %s %s", t.Name, r.err, r.body)
		}
		if t.Parent != "" && t.DelayMs == 0 {
			if r := c.admin(ctx, http.MethodPost, "/v1/topics/"+t.Parent+"/children", map[string]any{"child": t.Name}); r.status/100 != 2 {
				return fmt.Errorf("attaching %s: %s", t.Name, r.err)
			}
		}
	}
	return nil
}

func topicBody(t history.TopicInfo) map[string]any {
	body := map[string]any{"name": t.Name, "partitions": t.Partitions, "visibility_timeout_ms": t.VisibilityMs, "retention_ms": t.RetentionMs}
	if t.Replication > 0 {
		body["replication_factor"] = t.Replication
	}
	if t.DelayMs > 0 {
		body["parent"], body["fanout_delay_ms"] = t.Parent, t.DelayMs
	}
	return body
}

func (w *run) seed(i int) *rand.Rand { return rand.New(rand.NewSource(w.cfg.Seed*1000003 + int64(i))) }

func (w *run) loop(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	w.rec.Add(history.Entry{Kind: history.KindPhase, Detail: "load", Call: w.clk.Now()})

	var prod sync.WaitGroup
	for i := 0; i < w.cfg.Producers; i++ {
		prod.Add(1)
		go func() { defer prod.Done(); w.producer(ctx, i, start) }()
	}
	if w.cfg.RetentionMs > 0 {
		prod.Add(1)
		go func() { defer prod.Done(); w.ephemeralProducer(ctx, start) }()
	}
	var recycler sync.WaitGroup
	recCtx, stopRecycler := context.WithCancel(ctx)
	defer stopRecycler()
	if w.cfg.RecreateEvery > 0 {
		prod.Add(1)
		go func() { defer prod.Done(); w.recycledProducer(ctx, start) }()
		recycler.Add(1)
		go func() { defer recycler.Done(); w.recycler(recCtx) }()
	}
	go func() { prod.Wait(); w.prodDone.Store(true) }()

	var cons sync.WaitGroup
	consCtx, stopCons := context.WithCancel(ctx)
	defer stopCons()
	for i := 0; i < w.cfg.Consumers; i++ {
		cons.Add(1)
		go func() { defer cons.Done(); w.consumer(consCtx, i) }()
	}
	sampCtx, stopSamp := context.WithCancel(ctx)
	var samp sync.WaitGroup
	samp.Add(2)
	go func() { defer samp.Done(); w.sampler(sampCtx) }()
	go func() { defer samp.Done(); w.replayer(sampCtx) }()
	if w.cfg.Progress != nil {
		samp.Add(1)
		go func() { defer samp.Done(); w.progress(sampCtx, start) }()
	}

	var inj faulter = &injector{w: w, cfg: w.cfg.Faults, rng: w.rng}
	if w.cfg.Cluster {
		inj = &clusterInjector{w: w, cfg: w.cfg.ClusterFaults, rng: w.rng}
	}
	injErr := inj.run(ctx)
	if injErr != nil {
		// The faults could not go on (a node did not come back): the run has failed, and
		// its workers, which retry until the cluster answers, end now rather than wait
		// for a node nobody restarts.
		cancel()
	}
	prod.Wait()

	// Drain: no faults, every node up (and unarmed), every consumer acking.
	w.rec.Add(history.Entry{Kind: history.KindPhase, Detail: "drain", Call: w.clk.Now()})
	w.draining.Store(true)
	if injErr == nil {
		injErr = inj.ensureUp(ctx, false)
	}
	// The recycler finishes its round (the topic exists again) before the drain counts,
	// within the drain's bound: a cluster that refuses to create the topic again (a
	// node it counts dead) fails the run instead of holding it for ever.
	if !waitGroupFor(&recycler, w.cfg.DrainTimeout) {
		stopRecycler()
		recycler.Wait()
		if injErr == nil {
			injErr = fmt.Errorf("the recycler could not create %s again within %v (see its create-topic answers in the history)", Recycled, w.cfg.DrainTimeout)
		}
	}
	drainStart := time.Now()
	if injErr == nil {
		w.stats.Drained = w.waitDrained(ctx)
		if !w.stats.Drained {
			w.stats.Notes = append(w.stats.Notes, fmt.Sprintf("the drain did not finish within %v", w.cfg.DrainTimeout))
		}
	}
	w.stats.Drain = time.Since(drainStart)
	stopCons()
	cons.Wait()
	stopSamp()
	samp.Wait()
	inj.recordSkips()
	w.rec.Add(history.Entry{Kind: history.KindPhase, Detail: "done", Call: w.clk.Now()})
	w.mu.Lock()
	for op, l := range w.lat {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		w.stats.Latency[op] = l
	}
	w.mu.Unlock()
	return injErr
}

func (w *run) latency(op string, r result) {
	if r.status == 0 {
		return
	}
	w.mu.Lock()
	if w.lat == nil {
		w.lat = map[string][]int64{}
	}
	w.lat[op] = append(w.lat[op], r.ret-r.call)
	w.mu.Unlock()
}

// retryable reports whether an attempt's outcome calls for the same request again: no
// answer, or a 5xx. A 4xx would be a workload bug, and is recorded, not retried.
func retryable(r result) bool { return r.status == 0 || r.status >= 500 }

func backoff(ctx context.Context, try int) bool {
	d := time.Duration(min(20<<min(try, 4), 250)) * time.Millisecond
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (w *run) producing(start time.Time) bool {
	if w.cfg.Duration > 0 && time.Since(start) >= w.cfg.Duration {
		return false
	}
	return true
}

// pace waits until producing more keeps to Messages per LoadDuration.
func (w *run) pace(ctx context.Context, start time.Time) {
	if w.cfg.LoadDuration <= 0 || w.cfg.Messages == 0 {
		return
	}
	rate := float64(w.cfg.Messages) / w.cfg.LoadDuration.Seconds()
	for ctx.Err() == nil {
		taken := int64(w.cfg.Messages) - w.budget.Load()
		if float64(taken) <= rate*time.Since(start).Seconds() {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// take reserves up to n messages of the budget.
func (w *run) take(n int) int {
	if w.cfg.Messages == 0 {
		return n
	}
	for {
		left := w.budget.Load()
		if left <= 0 {
			return 0
		}
		k := min(int64(n), left)
		if w.budget.CompareAndSwap(left, left-k) {
			return int(k)
		}
	}
}

func (w *run) producer(ctx context.Context, i int, start time.Time) {
	rng := w.seed(100 + i)
	name := fmt.Sprintf("p%d", i)
	c := newClient(name, w.eps, w.rec, w.clk)
	defer c.close()
	seq := 0
	for ctx.Err() == nil && w.producing(start) {
		batch := 1
		if rng.Intn(10) < 3 || w.cfg.Quiet && rng.Intn(10) < 8 {
			batch = 2 + rng.Intn(9)
		}
		w.pace(ctx, start)
		batch = w.take(batch)
		if batch == 0 {
			return
		}
		ids, keys := make([]string, batch), make([]string, batch)
		for k := range ids {
			ids[k] = fmt.Sprintf("%s-%d", name, seq)
			seq++
			if rng.Intn(2) == 0 {
				keys[k] = fmt.Sprintf("k%d", rng.Intn(16))
			}
		}
		pad := strings.Repeat("x", rng.Intn(200))
		// In a cluster, two thirds go to Events: a change of Parent's leader copies
		// Parent's history into its children again (fanout-recopy), so a smaller
		// Parent keeps the drain short.
		topic := Parent
		if w.cfg.Cluster && rng.Intn(3) != 0 {
			topic = Events
		}
		for try := 1; ctx.Err() == nil; try++ {
			var r result
			if batch == 1 {
				r = c.produce(ctx, topic, ids[0], keys[0], pad, try)
			} else {
				r = c.produceBatch(ctx, topic, ids, keys, pad, try)
			}
			w.latency(history.OpProduce, r)
			if r.status == http.StatusAccepted {
				w.mu.Lock()
				for _, id := range ids {
					w.acked202[id] = r.ret
				}
				w.stats.Produced += int64(len(ids))
				w.mu.Unlock()
				break
			}
			if !retryable(r) || !backoff(ctx, try) {
				break
			}
		}
	}
}

// ephemeralProducer writes a slow stream to the short-retention topic, so retention
// deletes segments (and may be killed while doing it) during the run.
func (w *run) ephemeralProducer(ctx context.Context, start time.Time) {
	c := newClient("pe", w.eps, w.rec, w.clk)
	defer c.close()
	pad := strings.Repeat("e", 900)
	for seq := 0; ctx.Err() == nil && w.producing(start) && (w.cfg.Messages == 0 || w.budget.Load() > 0); seq++ {
		id := fmt.Sprintf("pe-%d", seq)
		for try := 1; ctx.Err() == nil; try++ {
			r := c.produce(ctx, Ephemeral, id, "", pad, try)
			if r.status == http.StatusAccepted {
				w.mu.Lock()
				w.stats.Produced++
				w.mu.Unlock()
				break
			}
			if !retryable(r) || !backoff(ctx, try) {
				break
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// recycledProducer writes to the Recycled topic while the recycler deletes and creates it
// again. An id names the incarnation the producer believed it wrote to
// (pr-g<generation>-<n>), for people reading a history; the checker does not trust it,
// since a produce racing a delete may land in either incarnation: it places a message by
// the times of its attempts and of the creates and deletes. A 404 (no topic right now)
// drops the message; no answer or a 5xx is retried with the same id.
func (w *run) recycledProducer(ctx context.Context, start time.Time) {
	rng := w.seed(300)
	c := newClient("pr", w.eps, w.rec, w.clk)
	defer c.close()
	pad := strings.Repeat("r", 100)
	seq := 0
	for ctx.Err() == nil && w.producing(start) && (w.cfg.Messages == 0 || w.budget.Load() > 0) {
		batch := 1
		if rng.Intn(10) < 3 {
			batch = 2 + rng.Intn(4)
		}
		gen := w.gen.Load()
		ids, keys := make([]string, batch), make([]string, batch)
		for k := range ids {
			ids[k] = fmt.Sprintf("pr-g%d-%d", gen, seq)
			seq++
			if rng.Intn(2) == 0 {
				keys[k] = fmt.Sprintf("k%d", rng.Intn(8))
			}
		}
		for try := 1; ctx.Err() == nil; try++ {
			var r result
			if batch == 1 {
				r = c.produce(ctx, Recycled, ids[0], keys[0], pad, try)
			} else {
				r = c.produceBatch(ctx, Recycled, ids, keys, pad, try)
			}
			w.latency(history.OpProduce, r)
			if r.status == http.StatusAccepted {
				w.mu.Lock()
				w.stats.Produced += int64(batch)
				w.mu.Unlock()
				break
			}
			if !retryable(r) || !backoff(ctx, try) {
				break
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(15 * time.Millisecond):
		}
	}
}

// replayer reads old messages back (a replay, without leases) from a random offset of
// a random partition of the parent, its fan-out copy or, in a cluster, events, every
// 100–400 ms: each message must be the one the run saw at that offset, written by an
// attempt that started before the read answered.
func (w *run) replayer(ctx context.Context) {
	rng := w.seed(401)
	c := newClient("replay", w.eps, w.rec, w.clk)
	defer c.close()
	topics := []string{Parent, Copy}
	if w.cfg.Cluster {
		topics = append(topics, Events)
	}
	next := map[string][]int64{} // the partitions' next offsets, as last read
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100*time.Millisecond + time.Duration(rng.Int63n(int64(300*time.Millisecond)))):
		}
		t := topics[rng.Intn(len(topics))]
		if i%10 == 0 || next[t] == nil {
			if st, ok := c.stats(ctx, t); ok && len(st) > 0 {
				next[t] = next[t][:0]
				for _, s := range st {
					next[t] = append(next[t], s.Next)
				}
			}
		}
		if len(next[t]) == 0 {
			continue
		}
		p := rng.Intn(len(next[t]))
		from := int64(0)
		if n := next[t][p]; n > 0 {
			from = rng.Int63n(n)
		}
		c.read(ctx, t, int32(p), from, 1+rng.Intn(20))
	}
}

// recycler deletes the Recycled topic and creates it again, about every RecreateEvery,
// until the producers are done; the topic exists when it returns. Before each delete it
// takes a few leases of the current incarnation and keeps them; once the new
// incarnation holds messages at the same offsets it acks, renews or nacks them with the
// old handles, which must answer 404 or 410 and never settle a new message.
func (w *run) recycler(ctx context.Context) {
	rng := w.seed(301)
	c := newClient("recycler", w.eps, w.rec, w.clk)
	defer c.close()
	var body map[string]any
	for _, t := range w.cfg.Topics() {
		if t.Name == Recycled {
			body = topicBody(t)
		}
	}
	every := w.cfg.RecreateEvery
	for ctx.Err() == nil && !w.prodDone.Load() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every/2 + time.Duration(rng.Int63n(int64(every)))):
		}
		if w.prodDone.Load() {
			return
		}
		var held []delivery
		if ds, r := c.consume(ctx, Recycled, 1+rng.Intn(4), 0); r.status == http.StatusOK {
			held = ds
		}
		if !w.recreate(ctx, c, body) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200*time.Millisecond + time.Duration(rng.Int63n(int64(300*time.Millisecond)))):
		}
		for _, d := range held {
			op := []string{history.OpAck, history.OpAck, history.OpExtend, history.OpNack}[rng.Intn(4)]
			w.settleRetry(ctx, c, d, op)
		}
	}
}

// recreate deletes the Recycled topic (until 204, or 404: an attempt without an answer
// did it) and creates it again (until 201, or 409: an attempt without an answer did it,
// and then reads the topic so the history has its incarnation).
func (w *run) recreate(ctx context.Context, c *client, body map[string]any) bool {
	for try := 1; ; try++ {
		r := c.deleteTopic(ctx, Recycled)
		if r.status == http.StatusNoContent || r.status == http.StatusNotFound {
			break
		}
		if !retryable(r) {
			w.note("deleting %s: %s", Recycled, r.err)
			return false
		}
		if !backoff(ctx, try) {
			return false
		}
	}
	for try := 1; ; try++ {
		_, r := c.createTopic(ctx, body)
		if r.status == http.StatusCreated {
			break
		}
		if r.status == http.StatusConflict {
			// Either an attempt without an answer created it, or the topic cannot be
			// created now (its replication factor is more than the live nodes): the
			// topic's own answer tells which.
			if exists, ok := w.recycledExists(ctx, c); !ok {
				return false
			} else if exists {
				break
			}
		} else if !retryable(r) {
			w.note("creating %s: %s", Recycled, r.err)
			return false
		}
		if !backoff(ctx, try) {
			return false
		}
	}
	w.gen.Add(1)
	w.mu.Lock()
	w.stats.Recreated++
	w.mu.Unlock()
	return true
}

// recycledExists reads the Recycled topic until it answers 200 (true) or 404 (false);
// ok is false when ctx ended first.
func (w *run) recycledExists(ctx context.Context, c *client) (exists, ok bool) {
	for try := 1; ; try++ {
		_, _, r := c.topicInfo(ctx, Recycled)
		switch r.status {
		case http.StatusOK:
			return true, true
		case http.StatusNotFound:
			return false, true
		}
		if !backoff(ctx, try) {
			return false, false
		}
	}
}

func (w *run) note(format string, args ...any) {
	w.mu.Lock()
	w.stats.Notes = append(w.stats.Notes, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// consumer behaviours, by index: 0 acks everything, 1 nacks and renews some, 2 forgets
// some (never acks), 3 is slow past its lease for some; the rest ack everything. In the
// drain, everyone acks everything at once.
func (w *run) consumer(ctx context.Context, i int) {
	rng := w.seed(200 + i)
	c := newClient(fmt.Sprintf("c%d", i), w.eps, w.rec, w.clk)
	defer c.close()
	topics := []string{Parent, Parent, Copy, Delayed}
	if w.cfg.Cluster {
		topics = append(topics, Events, Events)
	}
	if w.cfg.RetentionMs > 0 && !w.cfg.Cluster {
		topics = append(topics, Ephemeral)
	}
	if w.cfg.RecreateEvery > 0 {
		topics = append(topics, Recycled)
	}
	vis := time.Duration(w.cfg.VisibilityMs) * time.Millisecond
	fails, stay := 0, 0
	k := rng.Intn(len(topics))
	for ctx.Err() == nil {
		// Stay on a topic while it has messages (a few rounds at most, to be fair to
		// the others); move on after an empty answer.
		if stay >= 8 {
			k, stay = k+1, 0
		}
		topic := topics[k%len(topics)]
		max := 1
		if x := rng.Intn(10); x < 4 || w.draining.Load() {
			max = 2 + rng.Intn(19)
		}
		if w.cfg.Quiet || (w.cfg.Cluster && w.draining.Load()) {
			// A quiet run and a cluster's drain take many at once: a cluster commits
			// every ack on a quorum, so one at a time would make them the slow part.
			max = 20 + rng.Intn(31)
		}
		ds, r := c.consume(ctx, topic, max, 300*time.Millisecond)
		w.latency(history.OpConsume, r)
		stay++
		if retryable(r) {
			fails++
			if !backoff(ctx, fails) {
				return
			}
			continue
		}
		if len(ds) == 0 {
			k, stay = k+1, 0
		}
		fails = 0
		if len(ds) == 0 {
			continue
		}
		w.mu.Lock()
		for _, d := range ds {
			w.delivered[d.id] = true
		}
		w.stats.Deliveries += int64(len(ds))
		w.mu.Unlock()
		var toAck []delivery
		for _, d := range ds {
			if w.draining.Load() || w.cfg.Quiet {
				toAck = append(toAck, d)
				continue
			}
			switch i % 6 {
			case 1:
				switch x := rng.Intn(100); {
				case x < 20:
					w.settleRetry(ctx, c, d, history.OpNack)
					continue
				case x < 30:
					if r := w.settleRetry(ctx, c, d, history.OpExtend); r.status != http.StatusNoContent {
						continue
					}
				}
			case 2:
				if rng.Intn(100) < 15 {
					continue // forgotten: the lease lapses
				}
			case 3:
				if rng.Intn(100) < 10 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(vis + 200*time.Millisecond):
					}
					w.settleRetry(ctx, c, d, history.OpAck) // expect 410
					continue
				}
			}
			toAck = append(toAck, d)
		}
		if len(toAck) > 1 && (rng.Intn(2) == 0 || w.cfg.Quiet || w.cfg.Cluster && w.draining.Load()) {
			r := c.ackBatch(ctx, topic, toAck)
			w.latency(history.OpAck, r)
			if r.status == http.StatusOK {
				continue
			}
		}
		for _, d := range toAck {
			w.settleRetry(ctx, c, d, history.OpAck)
		}
	}
}

// settleRetry settles a delivery, retrying an unknown outcome or a 503 a few times
// (a retried ack of one handle must answer 204 or 410, never settle a later lease).
func (w *run) settleRetry(ctx context.Context, c *client, d delivery, op string) result {
	var r result
	for try := 1; try <= 5 && ctx.Err() == nil; try++ {
		r = c.settle(ctx, d, op)
		w.latency(history.OpAck, r)
		if !retryable(r) || !backoff(ctx, try) {
			break
		}
	}
	return r
}

func (w *run) sampler(ctx context.Context) {
	c := newClient("stats", w.eps, w.rec, w.clk)
	defer c.close()
	for ctx.Err() == nil {
		for _, t := range w.cfg.Topics() {
			c.stats(ctx, t.Name)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (w *run) progress(ctx context.Context, start time.Time) {
	t := time.NewTicker(w.cfg.ProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		overdue := 0
		cut := w.clk.Now() - int64(2*time.Minute)
		for id, at := range w.acked202 {
			if at < cut && !w.delivered[id] {
				overdue++
			}
		}
		var p99 time.Duration
		if l := append([]int64(nil), w.lat[history.OpProduce]...); len(l) > 0 {
			sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
			p99 = time.Duration(l[len(l)*99/100])
		}
		produced, deliveries := w.stats.Produced, w.stats.Deliveries
		dups := deliveries - int64(len(w.delivered))
		faults := fmt.Sprint(w.stats.Faults)
		w.mu.Unlock()
		var rss int64
		var files int
		for _, n := range w.nodes {
			r, f := n.Usage()
			rss, files = rss+r, files+f
		}
		line := fmt.Sprintf("t=%v messages=%d deliveries=%d redeliveries=%d overdue(202'd >2m ago, undelivered)=%d produce_p99=%v rss=%dMiB open_files=%d faults=%s",
			time.Since(start).Round(time.Second), produced, deliveries, dups, overdue, p99.Round(time.Millisecond), rss>>20, files, faults)
		if w.cfg.Checkpoint != nil {
			line += " " + w.cfg.Checkpoint()
		}
		w.cfg.Progress(line)
	}
}

// waitDrained waits until every topic is empty and nothing is in flight, fan-out has
// caught up, and the delay child's last copies are due — twice in a row.
func (w *run) waitDrained(ctx context.Context) bool {
	c := newClient("drain", w.eps, w.rec, w.clk)
	defer c.close()
	deadline := time.Now().Add(w.cfg.DrainTimeout)
	lastProduce := time.Now()
	ok := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		empty := time.Since(lastProduce) > time.Duration(w.cfg.DelayMs)*time.Millisecond+time.Second
		for _, t := range w.cfg.Topics() {
			st, good := c.stats(ctx, t.Name)
			if !good {
				empty = false
				break
			}
			for _, s := range st {
				if s.Backlog != 0 || s.InFlight != 0 || s.unavailable() {
					empty = false
				}
			}
		}
		if lag, good := c.childLag(ctx, Parent); !good || lag != 0 {
			empty = false
		}
		if empty {
			ok++
			if ok == 3 {
				return true
			}
		} else {
			ok = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(400 * time.Millisecond):
		}
	}
	return false
}

// waitGroupFor waits for wg at most d; it reports whether wg finished.
func waitGroupFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
