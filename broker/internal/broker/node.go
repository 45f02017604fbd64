package broker

import (
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// The node's health for the stats route and the console (GET /v1/stats): whether it
// serves, the space left on its data volume, and how long its shared sync rounds took
// over the last stats interval. The /metrics histograms hold the same rounds, but a
// reader without Prometheus needs them already summed; the stats sampler does that once
// per interval, next to the topics' samples.

// NodeStats is the node's health as the stats route answers it.
type NodeStats struct {
	NodeID string
	Ready  bool
	// DiskFreeBytes and DiskSizeBytes are the data directory's file system (free for the
	// node, as df shows it); DiskKnown is false when the system could not say.
	DiskFreeBytes, DiskSizeBytes uint64
	DiskKnown                    bool
	// SyncMode is "wal" (appends share rounds of one write-ahead file), "group"
	// (partitions share sync rounds) or "file" (each write syncs
	// its own file, and no rounds are counted).
	SyncMode string
	// Sync is the shared sync rounds of the last stats interval; nil in file sync mode
	// and before the first sample.
	Sync *SyncSample
}

// SyncSample is the node's shared sync rounds over one stats interval.
type SyncSample struct {
	AtMs       int64   // end of the interval (Unix ms)
	IntervalMs int64   // length of the interval
	Rounds     uint64  // sync rounds that ended in the interval
	Files      uint64  // files those rounds made durable
	RoundsHz   float64 // Rounds per second of the interval
	Mean, Max  time.Duration
}

// syncRounds sums the rounds as the sync group reports them (observe) until the
// sampler takes them (take). observe runs on the group's one goroutine before the
// round's writers are answered, so it only adds under a short lock.
type syncRounds struct {
	mu      sync.Mutex
	sinceMs int64 // start of the interval being summed
	rounds  uint64
	files   uint64
	total   time.Duration
	max     time.Duration
	last    *SyncSample
}

func (s *syncRounds) observe(files int, d time.Duration) {
	s.mu.Lock()
	s.rounds++
	s.files += uint64(files)
	s.total += d
	if d > s.max {
		s.max = d
	}
	s.mu.Unlock()
}

// take ends the interval at nowMs: its sums become the last sample, and a new interval
// starts empty.
func (s *syncRounds) take(nowMs int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &SyncSample{AtMs: nowMs, IntervalMs: nowMs - s.sinceMs, Rounds: s.rounds, Files: s.files, Max: s.max}
	if s.rounds > 0 {
		out.Mean = s.total / time.Duration(s.rounds)
	}
	if out.IntervalMs > 0 {
		out.RoundsHz = float64(s.rounds) / (float64(out.IntervalMs) / 1000)
	}
	s.last = out
	s.sinceMs, s.rounds, s.files, s.total, s.max = nowMs, 0, 0, 0, 0
}

func (s *syncRounds) lastSample() *SyncSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return nil
	}
	c := *s.last
	return &c
}

// diskUsage is the free and total bytes of the file system holding dir.
func diskUsage(dir string) (free, size uint64, err error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(filepath.Clean(dir), &fs); err != nil {
		return 0, 0, err
	}
	return uint64(fs.Bavail) * uint64(fs.Bsize), uint64(fs.Blocks) * uint64(fs.Bsize), nil
}

// NodeStats returns the node's health: ready, its data volume's space, and its shared
// sync rounds over the last stats interval.
func (b *Broker) NodeStats() NodeStats {
	out := NodeStats{NodeID: b.opts.NodeID, Ready: b.Ready(), SyncMode: "file"}
	if free, size, err := diskUsage(b.opts.DataDir); err == nil {
		out.DiskFreeBytes, out.DiskSizeBytes, out.DiskKnown = free, size, true
	}
	if b.syncer != nil {
		out.SyncMode = "group"
		if b.wal != nil {
			out.SyncMode = "wal"
		}
		out.Sync = b.stats.syncs.lastSample()
	}
	return out
}
