package meta

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/failpoint"
)

// StallWrite is how long one of the control plane's durable writes (a bbolt commit and
// its fsync, for Raft's log or its term and vote) takes, or has been taking, for
// Stalled to report the disk stalling; StalledFor is how long the verdict of a slow
// write that ended holds while no write ends after it. The same figures as the
// write-ahead file's (wal.ShedSync, wal.StalledFor): a healthy disk commits in
// milliseconds.
const (
	StallWrite = time.Second
	StalledFor = 10 * time.Second
)

// diskWatch times the control plane's durable writes for Stalled. The control plane
// writes rarely (a topic's create, a member's status, a move), so a mutex is cheap;
// writes that overlap count as one, from the first one's start until none is left.
type diskWatch struct {
	mu       sync.Mutex
	active   int       // writes in flight
	since    time.Time // when the oldest of them began (active > 0)
	slowEnd  time.Time // when the last write ended, if it was slow (zero: it was quick)
	stallFor time.Duration
}

func (d *diskWatch) began() time.Time {
	now := time.Now()
	d.mu.Lock()
	if d.active == 0 {
		d.since = now
	}
	d.active++
	d.mu.Unlock()
	return now
}

func (d *diskWatch) ended(start time.Time) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.active--
	if now.Sub(start) >= d.stallAfter() {
		d.slowEnd = now
	} else {
		d.slowEnd = time.Time{}
	}
}

func (d *diskWatch) stallAfter() time.Duration {
	if d.stallFor > 0 {
		return d.stallFor
	}
	return StallWrite
}

// stalled: a write has been in flight for StallWrite or more, or the last one to end
// took that long and ended less than StalledFor ago.
func (d *diskWatch) stalled() bool {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active > 0 && now.Sub(d.since) >= d.stallAfter() {
		return true
	}
	return !d.slowEnd.IsZero() && now.Sub(d.slowEnd) < StalledFor
}

// watchedStore is the bbolt store as Raft uses it (log and stable store), with every
// write timed for Stalled. The failpoint MetaStoreWrite makes its writes slow in tests
// and chaos runs (a sleep before the write, as a slow fsync would).
type watchedStore struct {
	raft.LogStore
	raft.StableStore
	w *diskWatch
}

func (s watchedStore) write(f func() error) error {
	start := s.w.began()
	defer s.w.ended(start)
	failpoint.Inject(failpoint.MetaStoreWrite)
	return f()
}

func (s watchedStore) StoreLog(l *raft.Log) error {
	return s.write(func() error { return s.LogStore.StoreLog(l) })
}

func (s watchedStore) StoreLogs(ls []*raft.Log) error {
	return s.write(func() error { return s.LogStore.StoreLogs(ls) })
}

func (s watchedStore) DeleteRange(lo, hi uint64) error {
	return s.write(func() error { return s.LogStore.DeleteRange(lo, hi) })
}

func (s watchedStore) Set(k, v []byte) error {
	return s.write(func() error { return s.StableStore.Set(k, v) })
}

func (s watchedStore) SetUint64(k []byte, v uint64) error {
	return s.write(func() error { return s.StableStore.SetUint64(k, v) })
}

// Stalled reports whether the disk under the control plane's Raft store is stalling
// (see diskWatch.stalled). Safe from any goroutine.
func (s *Store) Stalled() bool { return s.watch.stalled() }
