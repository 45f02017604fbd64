package broker

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/narad-mq/narad/broker/internal/partition"
)

// The stats route (GET /v1/topics/{topic}/stats) gives the console its sparklines
// without a Prometheus server: every StatsInterval the broker samples each open topic's
// produce and settle counters and its backlog into a ring of StatsSamples entries. The
// memory is bounded (StatsSamples samples per topic, topics bounded by the metadata),
// nothing is written to disk, and a topic's ring goes when the topic does: a restart or
// a delete starts it empty.

// Defaults of the stats sampler.
const (
	DefaultStatsInterval = 10 * time.Second
	// StatsSamples is how many samples a topic keeps: 15 minutes at the default interval.
	StatsSamples = 90
	// MinStatsInterval and MaxStatsInterval bound --stats-interval.
	MinStatsInterval = 50 * time.Millisecond
	MaxStatsInterval = time.Hour
)

// StatsSample is one interval of a topic as this node saw it.
type StatsSample struct {
	AtMs        int64   // end of the interval (Unix ms)
	Produced    uint64  // messages stored during the interval
	Acked       uint64  // messages settled by an ack during the interval
	ProduceHz   float64 // Produced per second of the interval
	AckHz       float64 // Acked per second of the interval
	Backlog     int64   // messages not yet settled at AtMs, over this node's partitions
	InFlight    int64   // messages leased at AtMs, over this node's partitions
	OldestAgeMs int64   // age of the oldest unsettled message at AtMs (0: none)
}

// TopicStats is a topic's samples, oldest first.
type TopicStats struct {
	Topic      string
	IntervalMs int64
	Samples    []StatsSample
}

// statsRing is one topic incarnation's samples.
type statsRing struct {
	lastMs            int64   // when the counters below were read
	produced, settled float64 // the counters' values then
	buf               []StatsSample
	next              int // where the next sample goes
	full              bool
}

func (r *statsRing) add(s StatsSample) {
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

func (r *statsRing) samples() []StatsSample {
	if !r.full {
		return append([]StatsSample(nil), r.buf[:r.next]...)
	}
	out := make([]StatsSample, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// statsRecorder holds the rings, keyed by the running topic so that a topic deleted
// and created again under its name starts a new ring.
type statsRecorder struct {
	interval time.Duration
	sampling sync.Mutex // one sampleStats at a time: it alone writes a ring's counters
	mu       sync.Mutex
	rings    map[*topic]*statsRing
	syncs    syncRounds // the node's shared sync rounds (see node.go)
}

func newStatsRecorder(interval time.Duration) *statsRecorder {
	if interval <= 0 {
		interval = DefaultStatsInterval
	}
	return &statsRecorder{interval: interval, rings: make(map[*topic]*statsRing), syncs: syncRounds{sinceMs: partition.WallMillis()}}
}

// track starts a topic's ring with its counters as they are now. The broker calls it
// when it opens a topic incarnation, before the topic is reachable, so the first sample
// counts every message of the incarnation (the counters are per name and carry over a
// delete).
func (s *statsRecorder) track(t *topic, nowMs int64) {
	r := &statsRing{lastMs: nowMs, produced: counterOf(t.metrics.produced), settled: counterOf(t.metrics.settled), buf: make([]StatsSample, StatsSamples)}
	s.mu.Lock()
	if _, ok := s.rings[t]; !ok {
		s.rings[t] = r
	}
	s.mu.Unlock()
}

// statsLoop samples every interval until the broker closes.
func (b *Broker) statsLoop() {
	defer b.wg.Done()
	tick := time.NewTicker(b.stats.interval)
	defer tick.Stop()
	b.sampleStats(partition.WallMillis())
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
			b.sampleStats(partition.WallMillis())
		}
	}
}

// sampleStats takes one sample of every open topic and of the node's sync rounds, and
// drops the rings of topics that closed.
func (b *Broker) sampleStats(nowMs int64) {
	b.stats.sampling.Lock()
	defer b.stats.sampling.Unlock()
	if b.syncer != nil {
		b.stats.syncs.take(nowMs)
	}
	b.mu.RLock()
	open := make([]*topic, 0, len(b.topics))
	for _, t := range b.topics {
		open = append(open, t)
	}
	b.mu.RUnlock()
	for _, t := range open {
		if closed(t.done) {
			continue // closing: its partitions are going
		}
		produced, settled := counterOf(t.metrics.produced), counterOf(t.metrics.settled)
		b.stats.mu.Lock()
		r, ok := b.stats.rings[t]
		b.stats.mu.Unlock()
		if !ok {
			b.stats.track(t, nowMs) // opened before tracking existed: counted from now
			continue
		}
		s := StatsSample{AtMs: nowMs, Produced: delta(produced, r.produced), Acked: delta(settled, r.settled)}
		if secs := float64(nowMs-r.lastMs) / 1000; secs > 0 {
			s.ProduceHz = float64(s.Produced) / secs
			s.AckHz = float64(s.Acked) / secs
		}
		oldest := int64(-1)
		for _, p := range t.parts() {
			if p == nil {
				continue // another node holds it and samples it
			}
			st := p.Stats()
			s.Backlog += int64(st.Backlog)
			s.InFlight += int64(st.InFlight)
			if ms, ok := p.FrontierTime(); ok && (oldest < 0 || ms < oldest) {
				oldest = ms
			}
		}
		if oldest >= 0 && nowMs > oldest {
			s.OldestAgeMs = nowMs - oldest
		}
		b.stats.mu.Lock()
		r.lastMs, r.produced, r.settled = nowMs, produced, settled
		r.add(s)
		b.stats.mu.Unlock()
	}
	// A ring goes with its topic's close (delete, or a new incarnation of the name). A
	// topic opened since the list above was read keeps the ring track gave it.
	b.stats.mu.Lock()
	for t := range b.stats.rings {
		if closed(t.done) {
			delete(b.stats.rings, t)
		}
	}
	b.stats.mu.Unlock()
}

// delta is a counter's increase; a counter that went down (it never should) counts 0.
func delta(now, before float64) uint64 {
	if now <= before {
		return 0
	}
	return uint64(now - before)
}

func counterOf(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}

// StatsInterval is the time between two samples of the stats route.
func (b *Broker) StatsInterval() time.Duration { return b.stats.interval }

// TopicStats returns a topic's samples as this node took them: the rates of what this
// node served and the backlog of the partitions it holds.
func (b *Broker) TopicStats(name string) (TopicStats, error) {
	t, err := b.lookup(name)
	if err != nil {
		return TopicStats{}, err
	}
	out := TopicStats{Topic: name, IntervalMs: b.stats.interval.Milliseconds(), Samples: []StatsSample{}}
	b.stats.mu.Lock()
	if r, ok := b.stats.rings[t]; ok {
		out.Samples = r.samples()
	}
	b.stats.mu.Unlock()
	return out, nil
}
