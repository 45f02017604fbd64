package main

import (
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// gcHeadroom bounds what a high --gc-percent may cost in memory: the collector's target
// is lowered, never below Go's default of 100, so that the heap grows at most this many
// bytes over what the last collection kept. A node with a small live heap (one node,
// a few partitions: tens of MB) keeps the full target and its CPU saving; one with a
// large live heap (a cluster node with many replicated partitions' Raft entries in flight) gets
// a target nearer Go's default instead of five times its live heap.
const gcHeadroom = 128 << 20

// gcTuneEvery is how often the tuner looks at the live heap.
const gcTuneEvery = time.Second

// gcTarget is the collector's target for a live heap of live bytes under a ceiling of
// max percent.
func gcTarget(max int, live uint64) int {
	if live == 0 {
		return max
	}
	bound := uint64(gcHeadroom) * 100 / live
	switch {
	case bound >= uint64(max):
		return max
	case bound <= 100:
		return min(max, 100)
	}
	return int(bound)
}

// gcTuner keeps the collector's target at gcTarget(max, the live heap).
type gcTuner struct {
	max    int
	cur    int
	sample []metrics.Sample
}

func newGCTuner(max int) *gcTuner {
	return &gcTuner{max: max, cur: -1, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
}

// apply reads the live heap, sets the target if it changed and returns it.
func (g *gcTuner) apply() int {
	metrics.Read(g.sample)
	var live uint64
	if g.sample[0].Value.Kind() == metrics.KindUint64 {
		live = g.sample[0].Value.Uint64()
	}
	if t := gcTarget(g.max, live); t != g.cur {
		debug.SetGCPercent(t)
		g.cur = t
	}
	return g.cur
}

// run applies the target every gcTuneEvery until stop is closed.
func (g *gcTuner) run(stop <-chan struct{}) {
	tick := time.NewTicker(gcTuneEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			g.apply()
		}
	}
}
