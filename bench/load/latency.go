package load

import (
	"slices"
	"time"
)

// Recorder collects latency samples of one goroutine; recorders are merged once at the
// end of a phase, so the hot loop never takes a lock or sorts.
type Recorder struct {
	d []time.Duration
}

// Add records one sample.
func (r *Recorder) Add(d time.Duration) { r.d = append(r.d, d) }

// Len is the number of samples.
func (r *Recorder) Len() int { return len(r.d) }

// Summary is the distribution of one latency: nearest-rank percentiles.
type Summary struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// Summarize merges recorders and computes their percentiles; nil recorders are
// skipped. An empty set gives a zero Summary (N == 0).
func Summarize(rs ...*Recorder) Summary {
	n := 0
	for _, r := range rs {
		if r != nil {
			n += len(r.d)
		}
	}
	all := make([]time.Duration, 0, n)
	for _, r := range rs {
		if r != nil {
			all = append(all, r.d...)
		}
	}
	return summarize(all)
}

func summarize(all []time.Duration) Summary {
	if len(all) == 0 {
		return Summary{}
	}
	slices.Sort(all)
	return Summary{N: len(all), P50: rank(all, 50), P90: rank(all, 90), P99: rank(all, 99), Max: all[len(all)-1]}
}

// rank is the nearest-rank percentile p of sorted samples: the smallest sample with at
// least p% of the samples at or below it.
func rank(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p+99)/100 - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

// recorders makes n recorders, one per goroutine.
func recorders(n int) []*Recorder {
	rs := make([]*Recorder, n)
	for i := range rs {
		rs[i] = &Recorder{d: make([]time.Duration, 0, 1024)}
	}
	return rs
}
