// Package partition is one partition of a topic as a state machine fed by commands:
// message batches go to the segment log, settle batches to the settle journal, and both
// are applied to the in-memory queue state (leases, frontier, acked-ahead set). A
// checkpoint of the queue state lets a restart replay only the journal's tail. See
// DESIGN.md beside this file.
package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// ErrClosed means the partition was closed (its topic deleted, or the broker stopping).
var ErrClosed = errors.New("partition: closed")

// ErrStorage means a disk write failed and nothing of the request was stored; the
// partition fails closed until it is reopened.
var ErrStorage = errors.New("partition: storage failed")

// ErrDiskFull means the disk ran out of space: nothing of the request was stored, and
// the partition takes writes again once space returns.
var ErrDiskFull = errors.New("partition: disk full")

// ErrCorrupt means a stored record failed its checks; it is never served.
var ErrCorrupt = errors.New("partition: stored record is damaged")

// Options configures a partition.
type Options struct {
	// Dir holds the partition's files: log/, journal/, queue.ckpt, epoch.
	Dir string
	// Index is the partition's number within its topic.
	Index uint32
	// Queue holds the lease and cap settings.
	Queue queue.Config
	// FS does the file I/O; nil means the real file system.
	FS vfs.FS
	// SegmentBytes is the message log's segment size (0: the segment package default).
	SegmentBytes int64
	// Syncer, when set, makes the log's and the journal's writes durable; a
	// vfs.SyncGroup shared by every partition of a node lets one file-system sync
	// serve all of them. Nil: each file is synced by itself.
	Syncer segment.Syncer
	// WAL, when set and the partition is not replicated, makes the log's and the
	// journal's appends durable through the node's write-ahead file instead.
	WAL segment.Committer
	// CheckpointEvery is how many settle records the journal may gain between
	// checkpoints of the queue state (default 4096).
	CheckpointEvery int
	// Logger receives warnings; nil means slog.Default().
	Logger *slog.Logger
	// OnAvailable is called, without locks held, when a message may have become
	// available to lease (an append, a lapsed or handed-back lease, a freed in-flight
	// slot). It must not block.
	OnAvailable func()
	// NewCommands, for a replica, reports whether every replica of its group runs a
	// version that knows this version's group commands (a handover carrying its term);
	// until then the older forms are written. Nil: yes.
	NewCommands func() bool
	// LeaderLeases, for a replica, reports whether every replica of its group runs a
	// version that holds its vote for its leader's lease and knows the commands that
	// go with it: only then may the leader serve a consume under its lease instead of
	// committing the deliveries first (docs/internals/replication.md). Nil: yes.
	LeaderLeases func() bool
	// NoLeaderLease keeps this replica from serving consumes under its leader lease
	// (a node whose machine may be frozen longer than the lease's margin); it still
	// holds its vote for the others' leases.
	NoLeaderLease bool
	// OnDamaged is called, without locks held, when damaged records are skipped: log is
	// "messages" for a message skipped at lease time (it is settled without being
	// served), "journal" for a settle record skipped by the replay on open. It must not
	// block. Nil: not reported beyond the error log line.
	OnDamaged func(log string, records int)
	// OnFailed, for a replica, is called once when it stops applying the group's
	// commands after a failed write (its state stops there until it is opened again);
	// from the group's apply goroutine: it must not block.
	OnFailed func()
	// OnLateLeases is called with the number of leases a replicated partition granted
	// but did not hand out, because they ended before its replicas confirmed them.
	OnLateLeases func(leases int)
	// OnExpired is called with the number of leases that lapsed (their visibility
	// timeout ended unacked), with the partition's lock held: it must only count.
	OnExpired func(leases int)
	// Clock is the monotonic time in nanoseconds; nil means time since process start.
	Clock func() int64
	// WallClock is the Unix time in milliseconds stamped on records; nil means time.Now.
	WallClock func() int64
	// Group, when set, makes the partition one replica of a replicated partition
	// (replica.go): appends and settles are proposed to the group and written when it
	// applies them (Apply), and only the leading replica leases. Its message log and
	// settle journal are then written without their own fsync: every command is
	// durable in the group's log before it is applied, and the group applies its whole
	// log again at each start (an append lands only at the log's end, a settle of a
	// settled offset changes nothing), so whatever a power loss took from them comes
	// back.
	Group Group
}

// journalSegmentBytes is the settle journal's segment size (a test shrinks it, to
// roll and compact the journal within a few settles).
var journalSegmentBytes int64 = 4 << 20

var processStart = time.Now()

// wallStart is the wall clock read at start; only failpoint builds shift it (a test's
// clock step, see failpoint.ClockEnvVar).
var wallStart = processStart.Add(failpoint.ClockOffset())

func monotonic() int64 { return int64(time.Since(processStart)) }

// WallMillis is the broker's notion of Unix time in milliseconds: the wall clock read
// once at process start plus the monotonic time since. A wall-clock jump while the
// process runs (a bad NTP step, an operator's date command) therefore neither stamps
// records out of order nor makes retention delete early; a restart re-reads the clock.
func WallMillis() int64 {
	// One truncation, not two: adding two rounded-down parts could stamp a record up to
	// 1 ms before the wall clock of the client that sent it.
	return wallNow().UnixMilli()
}

// wallNow is the wall clock read at start plus the monotonic time since.
func wallNow() time.Time {
	since := time.Since(processStart)
	if d := failpoint.ClockDrift(); d != 0 {
		since += time.Duration(float64(since) * d) // a failpoints build's drifting clock
	}
	return wallStart.Add(since)
}

func wallMillis() int64 { return WallMillis() }

// WallNanos is WallMillis in nanoseconds: the clock the node stamps records with, for
// measuring how far apart two nodes' stamps run.
func WallNanos() int64 { return wallNow().UnixNano() }

// Partition is safe for concurrent use.
type Partition struct {
	opts    Options
	fs      vfs.FS
	log     *segment.Log
	journal *segment.Log

	// gate is held shared by every settle from its begin to its commit, and exclusively
	// by a checkpoint while it copies the queue state, so a checkpoint never misses a
	// settle that is durable in the journal but not yet applied.
	gate sync.RWMutex

	mu          sync.Mutex
	q           *queue.State
	timer       *time.Timer
	timerAt     int64
	closed      bool
	sinceCkpt   int
	checkpoints sync.Mutex // one checkpoint at a time
	ckptRunning bool

	journalDamaged uint64 // damaged settle records skipped by the replay on Open

	// leadEnd is where the message log ended when this partition started serving: at
	// Open for a partition of its own, when it started leading for a replica (all
	// that was committed before applied). See LeadEnd.
	leadEnd atomic.Uint64

	repl *replica // nil for a partition of its own
}

// LeadEnd returns where the message log ended when this partition started serving as
// it does now: at Open for a partition of its own, at the start of its current (or
// last) leadership for a replica. Every message committed before then is below it, so
// a copy cursor (kept outside the partition) found past it at that start means the
// log went back under the cursor: a restore of an older backup, or a forced takeover
// onto a replica that lacked messages the copy had sent.
func (p *Partition) LeadEnd() uint64 { return p.leadEnd.Load() }

// Delivery is one leased message.
type Delivery struct {
	Record  segment.Record
	Nonce   queue.Nonce
	Attempt uint32
}

// Open opens or creates the partition in opts.Dir and rebuilds its queue state: the last
// checkpoint plus the settle journal after it.
func Open(opts Options) (*Partition, error) {
	if opts.FS == nil {
		opts.FS = vfs.OS{}
	}
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = 4096
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = monotonic
	}
	if opts.WallClock == nil {
		opts.WallClock = wallMillis
	}
	p := &Partition{opts: opts, fs: opts.FS}
	if opts.Group != nil {
		p.repl = &replica{group: opts.Group}
		p.repl.vend.Store(vendUnknown)
	}
	// The topic's and the partition's directory entries must be durable before the
	// first append is acknowledged, or a power loss drops them with every file inside.
	if err := vfs.MkdirAllSync(p.fs, opts.Dir, 0o700); err != nil {
		return nil, err
	}
	epoch, err := p.bumpEpoch()
	if err != nil {
		return nil, err
	}
	var wal segment.Committer
	if opts.Group == nil {
		wal = opts.WAL
	}
	p.log, err = segment.Open(filepath.Join(opts.Dir, "log"), segment.Options{FS: p.fs, SegmentBytes: opts.SegmentBytes, Syncer: opts.Syncer, WAL: wal, NoSync: opts.Group != nil})
	if err != nil {
		return nil, fmt.Errorf("partition %d: opening log: %w", opts.Index, err)
	}
	p.journal, err = segment.Open(filepath.Join(opts.Dir, "journal"), segment.Options{FS: p.fs, SegmentBytes: journalSegmentBytes, Syncer: opts.Syncer, WAL: wal, NoSync: opts.Group != nil})
	if err != nil {
		_ = p.log.Close() // the journal's open error is the one to report
		return nil, fmt.Errorf("partition %d: opening journal: %w", opts.Index, err)
	}
	p.reportRecovery("message log", p.log)
	p.reportRecovery("settle journal", p.journal)
	ck, err := p.readCheckpoint()
	if err != nil {
		p.closeLogs()
		return nil, err
	}
	// The disk may have lost writes it had confirmed: the log may end before offsets
	// that were settled, and the journal before the position the checkpoint covers.
	// Offsets from the log's end on will be taken again by new messages, which must not
	// count as settled, now or at any later start.
	end := p.log.Next()
	lost := false
	if ck.frontier > end {
		opts.Logger.Error("message log ends before the ack frontier; the disk lost confirmed data",
			"partition", opts.Index, "log_end", end, "frontier", ck.frontier)
		ck.frontier = end
		lost = true
	}
	kept := ck.ackedAhead[:0]
	for _, o := range ck.ackedAhead {
		if o < end {
			kept = append(kept, o)
		}
	}
	if len(kept) < len(ck.ackedAhead) {
		opts.Logger.Error("message log ends before messages settled out of order; the disk lost confirmed data",
			"partition", opts.Index, "log_end", end, "dropped_settles", len(ck.ackedAhead)-len(kept))
		lost = true
	}
	ck.ackedAhead = kept
	if jn := p.journal.Next(); jn < ck.journalNext {
		// Settles written from jn on would land at positions the checkpoint claims to
		// cover, and the next start would skip them.
		opts.Logger.Error("settle journal ends before the position the checkpoint covers; the disk lost confirmed data",
			"partition", opts.Index, "journal_end", jn, "checkpoint_position", ck.journalNext)
		lost = true
	}
	p.q = queue.New(opts.Queue, epoch, ck.frontier, ck.ackedAhead)
	dropped, err := p.replayJournal(ck.journalNext)
	if err != nil {
		p.closeLogs()
		return nil, err
	}
	if dropped > 0 {
		opts.Logger.Error("settle journal names offsets the message log no longer holds; the disk lost confirmed data",
			"partition", opts.Index, "log_end", end, "dropped_settles", dropped)
		lost = true
	}
	// A damaged settle record is skipped once: the checkpoint below covers it, so later
	// starts neither report nor count it again.
	lost = lost || p.journalDamaged > 0
	p.q.SetBounds(p.log.Oldest(), p.log.Next())
	p.leadEnd.Store(p.log.Next())
	if lost {
		// Record the cut-back state before anything new is written: a checkpoint at the
		// journal's real end, so no old settle is replayed against a reused offset and
		// new settles land past what it covers. Without it the guard above would hold
		// for this start only.
		if err := p.Checkpoint(); err != nil {
			p.closeLogs()
			return nil, fmt.Errorf("partition %d: recording the state cut back after lost data: %w", opts.Index, err)
		}
	}
	return p, nil
}

func (p *Partition) closeLogs() {
	_ = p.log.Close() // only on a failed Open, whose error is the one to report
	_ = p.journal.Close()
}

// reportRecovery logs what opening a log found: damaged records (acknowledged, so an
// error: the disk lost data it had confirmed) and a torn write cut off its end (the
// normal trace of a crash).
func (p *Partition) reportRecovery(what string, l *segment.Log) {
	const maxLines = 20
	damage := l.Damaged()
	for i, d := range damage {
		if i == maxLines {
			p.opts.Logger.Error("more damaged records; the count above covers them all", "partition", p.opts.Index, "log", what, "runs_not_listed", len(damage)-maxLines)
			break
		}
		p.opts.Logger.Error("damaged records found on open; their offsets stay taken and they are never served",
			"partition", p.opts.Index, "log", what, "from_offset", d.From, "to_offset", d.To-1, "damaged_records", l.Stats().DamagedRecords)
	}
	if n := l.Stats().TornBytes; n > 0 {
		p.opts.Logger.Info("cut a torn write off the end of a log", "partition", p.opts.Index, "log", what, "bytes", n, "next_offset", l.Next())
	}
}

// replayJournal applies the settle records from journal position from on. It returns
// how many settles named offsets at or past the log's end, which it drops (see Open).
func (p *Partition) replayJournal(from uint64) (dropped int, err error) {
	end := p.log.Next()
	if from < p.journal.Oldest() {
		// The checkpoint says it covers up to from, and compaction only deletes what a
		// durable checkpoint covers; a journal starting later means files were lost.
		return 0, fmt.Errorf("partition %d: settle journal starts at %d, after checkpoint position %d: %w", p.opts.Index, p.journal.Oldest(), from, segment.ErrCorrupt)
	}
	for from < p.journal.Next() {
		recs, err := p.journal.Read(from, 256, 1<<20)
		if errors.Is(err, segment.ErrCorrupt) {
			// A damaged settle record: the settles it held are lost, and those messages
			// will be delivered again (at least once, never lost). Refusing to start
			// would stop the whole partition for what a redelivery repairs.
			p.opts.Logger.Error("a damaged settle record is skipped; the messages it settled will be delivered again",
				"partition", p.opts.Index, "journal_offset", from, "err", err)
			p.journalDamaged++
			if p.opts.OnDamaged != nil {
				p.opts.OnDamaged("journal", 1)
			}
			from++
			continue
		}
		if err != nil {
			return dropped, fmt.Errorf("partition %d: replaying settle journal: %w", p.opts.Index, err)
		}
		for _, r := range recs {
			offs, err := decodeSettle(r.Value)
			if err != nil {
				return dropped, fmt.Errorf("partition %d: settle record %d: %w", p.opts.Index, r.Offset, err)
			}
			for _, o := range offs {
				if o < end { // see the lost-data checks in Open
					p.q.Settled(o)
				} else {
					dropped++
				}
			}
			from = r.Offset + 1
		}
	}
	return dropped, nil
}

// Append writes records durably and returns the first offset. The messages are
// deliverable when it returns. A record's timestamp is now, or the one it carries (a
// copy from another cluster keeps its source's) when that is not in the future.
func (p *Partition) Append(recs []segment.Record) (uint64, error) {
	if p.repl != nil {
		return p.appendReplicated(recs)
	}
	now := p.opts.WallClock()
	for i := range recs {
		if ts := recs[i].Timestamp; ts <= 0 || ts > now {
			recs[i].Timestamp = now
		}
	}
	first, err := p.log.Append(recs)
	if err != nil {
		return 0, storageErr(err)
	}
	failpoint.Inject(failpoint.PartitionAfterAppend)
	p.mu.Lock()
	p.q.SetBounds(p.log.Oldest(), p.log.Next())
	p.mu.Unlock()
	p.notify()
	return first, nil
}

// storageErr maps a segment log error to the partition's: closed, disk full (nothing
// stored, the partition stays usable) or failed (closed until reopened).
func storageErr(err error) error {
	switch {
	case errors.Is(err, segment.ErrClosed):
		return ErrClosed
	case errors.Is(err, segment.ErrNoSpace):
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return fmt.Errorf("%w: %w", ErrStorage, err) // %w: callers tell segment.ErrNotUndone apart
}

func (p *Partition) notify() {
	if p.opts.OnAvailable != nil {
		p.opts.OnAvailable()
	}
}

// Lease reserves up to limit messages for d and reads them, up to about maxBytes of
// payload: the first message always goes, and the ones that do not fit are handed back
// unsent (not counted as attempts). A message whose record is damaged is skipped: it is
// settled without being served, logged and counted (OnDamaged), and the lease goes on to
// the next message. It returns no deliveries (and no error) when nothing is available.
func (p *Partition) Lease(limit int, d time.Duration, maxBytes int) ([]Delivery, error) {
	for {
		out, skipped, err := p.leaseOnce(limit, d, maxBytes)
		if len(out) > 0 || err != nil || skipped == 0 {
			return out, err
		}
		// Every message leased was damaged and is now settled: lease again, so one
		// damaged record never answers a consume with nothing while others wait.
	}
}

// leaseOnce is one round of Lease; it also returns how many damaged records it skipped.
func (p *Partition) leaseOnce(limit int, d time.Duration, maxBytes int) ([]Delivery, int, error) {
	if !p.Leading() || p.handingOver() {
		return nil, 0, ErrNotLeader
	}
	if r := p.repl; r != nil && r.failed.Load() {
		// Its state stopped at the failed write: settles committed since are not in
		// it, so it must lease nothing (the partition fails closed here until the node
		// restarts and applies the group's log again).
		return nil, 0, errReplicaFailed
	}
	raceHook("lease")
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, 0, ErrClosed
	}
	if p.handingOver() {
		// Again under p.mu, where HandOver reads the live leases: a handover that began
		// after the check above would not hand this lease over, and the next leader
		// would deliver the message again under it.
		p.mu.Unlock()
		return nil, 0, ErrNotLeader
	}
	now := p.opts.Clock()
	if p.expire(now) > 0 {
		defer p.notify()
	}
	grants := p.q.LeaseFor(now, limit, d)
	p.armTimerLocked()
	if p.repl != nil && len(grants) > 0 {
		// Counted under p.mu, where HandOver sets handingOver: it waits for this
		// consume's D command, so that the handover's exact mark comes after it.
		p.repl.confirming.Add(1)
		defer p.repl.confirming.Add(-1)
	}
	p.mu.Unlock()
	if len(grants) == 0 {
		return nil, 0, nil
	}
	if p.repl != nil {
		if err := p.confirmLeases(grants); err != nil {
			return nil, 0, err
		}
		if grants = p.liveGrants(grants); len(grants) == 0 {
			return nil, 0, nil
		}
	}
	skipped := 0
	out := make([]Delivery, 0, len(grants))
	used := 0
	var readErr error
	deliver := func(r segment.Record, g queue.Grant) {
		out = append(out, Delivery{Record: r, Nonce: g.Nonce, Attempt: g.Attempt})
		used += len(r.Key) + len(r.Value)
	}
	for i := 0; i < len(grants); {
		if len(out) > 0 && used >= maxBytes {
			p.unleaseGrants(grants[i:])
			break
		}
		// Read runs of consecutive offsets in one call.
		j := i + 1
		for j < len(grants) && grants[j].Offset == grants[j-1].Offset+1 {
			j++
		}
		budget := maxBytes - used
		if len(out) == 0 {
			budget = max(budget, 1)
		}
		recs, err := p.readRun(grants[i].Offset, j-i, budget)
		for k, r := range recs {
			if r.Offset != grants[i+k].Offset {
				return nil, skipped, fmt.Errorf("%w: read offset %d for lease on %d", ErrStorage, r.Offset, grants[i+k].Offset)
			}
			deliver(r, grants[i+k])
		}
		switch {
		case err == nil && len(recs) < j-i:
			// The byte budget ran out inside the run.
			p.unleaseGrants(grants[i+len(recs):])
			return out, skipped, nil
		case err != nil && errors.Is(err, segment.ErrOffsetOutOfRange):
			// Retention removed them after they were reserved: they are gone for good,
			// and their leases end with them. The rest of the run, which retention
			// left, is read from the new oldest offset: skipped, it stayed leased to
			// nobody until the lease lapsed, and its first delivery then counted
			// attempt 2.
			p.mu.Lock()
			oldest := p.log.Oldest()
			p.q.SetBounds(oldest, p.log.Next())
			p.mu.Unlock()
			k := i + len(recs)
			for k < j && grants[k].Offset < oldest {
				k++
			}
			if k < j {
				i = k
				continue
			}
		case err != nil:
			// Read the rest one by one: one damaged record must not hold back its
			// neighbours. A damaged record is skipped for good (see skipDamaged). A
			// record that cannot be read for another reason (an I/O error) is not served
			// now; its lease lapses and it is tried again then, so a failing disk does not
			// spin the consumer.
			for k := len(recs); k < j-i; k++ {
				g := grants[i+k]
				one, err := p.readRun(g.Offset, 1, 1)
				switch {
				case err != nil && errors.Is(err, segment.ErrCorrupt):
					p.skipDamaged(g.Offset, err)
					skipped++
				case err != nil:
					p.opts.Logger.Error("a leased message cannot be read; it is not served now", "partition", p.opts.Index, "offset", g.Offset, "err", err)
					readErr = readError(err)
				default:
					deliver(one[0], g)
				}
			}
		}
		i = j
	}
	if len(out) == 0 && readErr != nil {
		return nil, skipped, readErr
	}
	return out, skipped, nil
}

// skipDamaged settles a leased message whose record failed its checks: it can never be
// served, and left in the queue it would pin the frontier, so that after MaxAckedAhead
// later acks every ack would be refused. The skip is written to the settle journal like
// an ack (under the gate, so a checkpoint sees all of it or none): otherwise a restart
// would set the frontier back to it. If that write fails, it is skipped in memory only,
// and a restart finds and skips it again.
func (p *Partition) skipDamaged(off uint64, err error) {
	if p.repl != nil {
		// The other replicas may hold the record intact: this one skips it in memory
		// only (a later leader serves it from its own copy; a restart finds it again).
		p.repl.skipped.Store(true)
		p.mu.Lock()
		p.q.Skip(off)
		p.mu.Unlock()
		p.opts.Logger.Error("a damaged message is skipped on this replica until it restarts", "partition", p.opts.Index, "offset", off, "err", err)
		if p.opts.OnDamaged != nil {
			p.opts.OnDamaged("messages", 1)
		}
		return
	}
	p.gate.RLock()
	_, jerr := p.journal.Append([]segment.Record{{Value: encodeSettle([]uint64{off}), Timestamp: p.opts.WallClock()}})
	p.mu.Lock()
	p.q.Skip(off)
	if jerr == nil {
		p.sinceCkpt++
	}
	p.mu.Unlock()
	p.gate.RUnlock()
	p.opts.Logger.Error("a damaged message is skipped: it is never delivered and counts as settled",
		"partition", p.opts.Index, "offset", off, "err", err)
	if jerr != nil && !errors.Is(jerr, segment.ErrClosed) {
		p.opts.Logger.Error("the skip of a damaged message could not be written; a restart will skip it again",
			"partition", p.opts.Index, "offset", off, "err", jerr)
	}
	if p.opts.OnDamaged != nil {
		p.opts.OnDamaged("messages", 1)
	}
}

func (p *Partition) unleaseGrants(gs []queue.Grant) {
	if len(gs) == 0 {
		return
	}
	p.mu.Lock()
	for _, g := range gs {
		p.q.Unlease(g.Offset, g.Nonce)
	}
	p.mu.Unlock()
	p.notify()
}

// readError maps a failed read: a damaged record is ErrCorrupt, anything else ErrStorage.
func readError(err error) error {
	if errors.Is(err, segment.ErrCorrupt) {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return fmt.Errorf("%w: %w", ErrStorage, err)
}

// readRun reads n records from off, across segment boundaries, stopping early (with no
// error) once maxBytes of records were read (at least one is); on error it returns the
// records read before it.
func (p *Partition) readRun(off uint64, n, maxBytes int) ([]segment.Record, error) {
	var out []segment.Record
	used := 0
	for len(out) < n && (len(out) == 0 || used < maxBytes) {
		recs, err := p.log.Read(off+uint64(len(out)), n-len(out), max(maxBytes-used, 1))
		if err != nil {
			return out, err
		}
		if len(recs) == 0 {
			return out, fmt.Errorf("offset %d: %w", off+uint64(len(out)), segment.ErrCorrupt)
		}
		for _, r := range recs {
			used += len(r.Key) + len(r.Value)
		}
		out = append(out, recs...)
	}
	return out, nil
}

// Available reports whether Lease would find a message now.
func (p *Partition) Available() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && p.q.Available()
}

// SettleReq names one lease to settle.
type SettleReq struct {
	Offset uint64
	Nonce  queue.Nonce
}

// Settle settles leases durably: one journal write (one fsync, shared with concurrent
// settles) for the batch. The result has one error per request: nil (settled),
// queue.ErrLeaseLost, queue.ErrAckedAheadFull, ErrStorage or ErrClosed.
func (p *Partition) Settle(reqs []SettleReq) []error {
	if p.repl != nil {
		return p.settleReplicated(reqs)
	}
	p.gate.RLock()
	defer p.gate.RUnlock()
	errs, begun, _, expired := p.beginSettles(reqs)
	if expired {
		defer p.notify()
	}
	if len(begun) == 0 {
		return errs
	}

	_, err := p.journal.Append([]segment.Record{{Value: encodeSettle(begun), Timestamp: p.opts.WallClock()}})
	failpoint.Inject(failpoint.PartitionAfterSettle)

	p.mu.Lock()
	for _, o := range begun {
		if err != nil {
			p.q.AbortSettle(o)
		} else {
			p.q.CommitSettle(o)
		}
	}
	p.sinceCkpt++
	wantCkpt := err == nil && p.sinceCkpt >= p.opts.CheckpointEvery && !p.ckptRunning
	if wantCkpt {
		p.ckptRunning = true
	}
	p.armTimerLocked()
	p.mu.Unlock()

	if err != nil {
		err = storageErr(err)
		if !errors.Is(err, ErrClosed) {
			p.opts.Logger.Error("settle journal write failed; the settles were not stored", "partition", p.opts.Index, "err", err)
		}
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	if wantCkpt {
		go func() {
			if err := p.Checkpoint(); err != nil && !errors.Is(err, ErrClosed) {
				p.opts.Logger.Error("queue checkpoint failed", "partition", p.opts.Index, "err", err)
			}
		}()
	}
	p.notify()
	return errs
}

// beginSettles pins the leases reqs name (queue.BeginSettle) after expiring overdue
// ones, for a settle to make durable: the journal on a partition of its own, the
// group on a replica. errs has one error per request (nil for each one pinned: the
// caller commits or aborts it); begun lists the offsets pinned, and cursor is the
// queue's delivery cursor then. On a closed partition every error is ErrClosed.
func (p *Partition) beginSettles(reqs []SettleReq) (errs []error, begun []uint64, cursor uint64, expired bool) {
	errs = make([]error, len(reqs))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.handingOver() {
		// Handing over (checked where HandOver reads the live leases): the successor
		// holds the leases, and the ack goes to it. Pinned here, a settle raft drops
		// for the transfer would take the lease out of this queue, and the ack sent
		// again to this node, which leads until the transfer completes, would answer
		// 410 while the lease runs on at the successor.
		err := ErrClosed
		if !p.closed {
			err = ErrNotLeader
		}
		for i := range errs {
			errs[i] = err
		}
		return errs, nil, 0, false
	}
	now := p.opts.Clock()
	expired = p.expire(now) > 0
	begun = make([]uint64, 0, len(reqs))
	for i, r := range reqs {
		if errs[i] = p.q.BeginSettle(r.Offset, r.Nonce, now); errs[i] == nil {
			begun = append(begun, r.Offset)
		}
	}
	return errs, begun, p.q.Cursor(), expired
}

// Extend renews a lease to end d from now; d == 0 hands the message back at once.
func (p *Partition) Extend(off uint64, n queue.Nonce, d time.Duration) error {
	if !p.Leading() || p.handingOver() || p.laterLeader(n) {
		return ErrNotLeader // during a handover: on the next leader, which has the lease
	}
	raceHook("extend")
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if p.handingOver() {
		// Checked again where HandOver reads the leases: a renewal after that read
		// would not reach the next leader, which would let the lease lapse early.
		p.mu.Unlock()
		return ErrNotLeader
	}
	now := p.opts.Clock()
	expired := p.expire(now)
	err := p.q.Extend(off, n, now, d)
	p.armTimerLocked()
	reads := p.handoverReads()
	p.mu.Unlock()
	if expired > 0 || (err == nil && d == 0) {
		p.notify()
	}
	if err == nil && p.repl != nil && d == 0 {
		return p.confirmHandBack(reads)
	}
	if err == nil && p.repl != nil {
		// A leader deposed without knowing it must not say a lease was renewed: its
		// successor may deliver the message again meanwhile.
		if err := p.confirmLeader(); err != nil {
			return err
		}
		if d > 0 && !p.holds(off, n) {
			// The confirmation outlasted the renewed lease (a stalled group, as for
			// liveGrants): the message may be leased again already, so the renewal is
			// not reported as one.
			return queue.ErrLeaseLost
		}
	}
	return err
}

// holds reports whether the lease (off, n) is held now.
func (p *Partition) holds(off uint64, n queue.Nonce) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.q.Holds(off, n, p.opts.Clock())
}

// HandBack ends a lease whose message never reached its client (the client went while
// it was leased): the message is deliverable again at once, and the lease does not
// count as a delivery attempt. It returns queue.ErrLeaseLost if (off, n) is no longer
// the lease.
func (p *Partition) HandBack(off uint64, n queue.Nonce) error {
	if !p.Leading() || p.handingOver() || p.laterLeader(n) {
		return ErrNotLeader
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if p.handingOver() {
		p.mu.Unlock()
		return ErrNotLeader // as in Extend: the next leader has the lease as handed over
	}
	now := p.opts.Clock()
	p.expire(now)
	err := p.q.HandBack(off, n, now)
	p.armTimerLocked()
	reads := p.handoverReads()
	p.mu.Unlock()
	p.notify()
	if err == nil && p.repl != nil {
		return p.confirmHandBack(reads)
	}
	return err
}

// handoverReads is the number of handover reads of the live leases so far (0 for a
// partition that is not replicated). Read under p.mu.
func (p *Partition) handoverReads() uint64 {
	if p.repl == nil {
		return 0
	}
	return p.repl.handoverReads.Load()
}

// Read returns up to max records from offset from, without leases. from below the oldest
// retained offset starts at the oldest.
func (p *Partition) Read(from uint64, max int) ([]segment.Record, error) {
	for {
		if o := p.log.Oldest(); from < o {
			from = o
		}
		recs, err := p.log.Read(from, max, 4<<20)
		if errors.Is(err, segment.ErrOffsetOutOfRange) {
			continue // retention moved the start while we read: start again from it
		}
		if errors.Is(err, segment.ErrClosed) {
			return nil, ErrClosed
		}
		if err != nil && len(recs) == 0 {
			return nil, readError(err)
		}
		return recs, nil // what was read before a damaged record; the next read reports it
	}
}

// OffsetForTime returns the first offset written at or after ms. Its errors are the
// partition's, as Read's are: ErrClosed for a log closed under it (its topic deleted,
// its replica moved or rebuilt), ErrCorrupt or ErrStorage for what the look met. The
// segment log's own were answered 500 by the API.
func (p *Partition) OffsetForTime(ms int64) (uint64, error) {
	o, err := p.log.OffsetForTime(ms)
	if err == nil {
		return o, nil
	}
	if errors.Is(err, segment.ErrClosed) {
		return 0, ErrClosed
	}
	return 0, readError(err)
}

// Stats returns the queue's counters.
func (p *Partition) Stats() queue.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.q.Stats()
}

// SetConfig changes the lease and cap settings for leases taken from now on.
func (p *Partition) SetConfig(c queue.Config) {
	p.mu.Lock()
	p.q.SetConfig(c)
	p.mu.Unlock()
	p.notify()
}

// Config returns the partition's queue settings.
func (p *Partition) Config() queue.Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.q.Config()
}

// Epoch returns the lease epoch of this opening of the partition.
func (p *Partition) Epoch() uint32 { return p.q.Epoch() }

// EnforceRetention deletes whole segments whose messages are all older than cutoffMs
// (Unix ms). Messages it deletes count as settled.
func (p *Partition) EnforceRetention(cutoffMs int64) (uint64, error) {
	if r := p.repl; r != nil && r.vend.Load() == vendUnknown && !r.retainable.Load() {
		// A replica that knows nothing yet of its group's history (no snapshot since
		// it opened) and has not applied again the command that reaches its log's end:
		// after a power loss its last records may be the first of a torn command, which
		// Apply tells from a stale one only by reading them. Removed first (the leader
		// not heard from yet, the node down past the retention period), the command was
		// taken for a stale one and skipped, and every later one with it: the replica
		// never held another message. Its group's log catches it up, then retention runs.
		return 0, nil
	}
	// The active segment is never deleted; when everything in the log is past the
	// cutoff, seal it so an idle partition ages out too.
	if p.log.Oldest() < p.log.Next() {
		if first, err := p.log.OffsetForTime(cutoffMs); err == nil && first == p.log.Next() {
			if err := p.log.Roll(); err != nil {
				return 0, retentionErr(err)
			}
		}
	}
	n, err := p.log.DeleteOlderThan(cutoffMs)
	err = retentionErr(err)
	if n > 0 {
		oldest := p.log.Oldest()
		p.mu.Lock()
		p.q.SetBounds(oldest, p.log.Next())
		p.mu.Unlock()
		if r := p.repl; r != nil {
			// Aged out is settled for good: the committed delivery counts of those
			// messages go too (kept, they rode in every snapshot until a change of
			// leader).
			r.attMu.Lock()
			for o := range r.attempts {
				if o < oldest {
					delete(r.attempts, o)
				}
			}
			r.attMu.Unlock()
		}
		// The leases it ended and the frontier it moved may let messages be leased
		// that could not be (the in-flight cap, the acked-ahead window): waiting
		// consumes look again, as after an ack (a review, 6 December: a long poll slept
		// on to the end of its wait).
		p.notify()
	}
	return n, err
}

// retentionErr is ErrClosed for a log closed under retention (its topic deleted, its
// replica moved off the node), which the retention pass passes over.
func retentionErr(err error) error {
	if errors.Is(err, segment.ErrClosed) {
		return ErrClosed
	}
	return err
}

// armTimerLocked makes sure the lapse timer fires at the earliest lease deadline, so
// lapsed leases return to the queue (and wake waiting consumers) without a consume.
func (p *Partition) armTimerLocked() {
	at, ok := p.q.NextDeadline()
	if !ok || p.closed {
		return
	}
	if p.timer != nil && p.timerAt != 0 && p.timerAt <= at {
		return
	}
	d := time.Duration(at - p.opts.Clock())
	if d < 0 {
		d = 0
	}
	p.timerAt = at
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.onTimer)
	} else {
		p.timer.Reset(d)
	}
}

func (p *Partition) onTimer() {
	p.mu.Lock()
	p.timerAt = 0
	if p.closed {
		p.mu.Unlock()
		return
	}
	n := p.expire(p.opts.Clock())
	p.armTimerLocked()
	p.mu.Unlock()
	if n > 0 {
		p.notify()
	}
}

// liveGrants returns the grants whose leases are still held once the replicas
// confirmed them. The confirmation is a replicated write: when the group stalls (a
// follower paused, a quorum just short) it can outlast the visibility timeout, and by
// then the lease lapsed and the message may be leased to another consumer. Handing it
// out anyway would give a consumer a message someone else holds, with a receipt handle
// dead on arrival; it is left out instead (its lapse returned it to the queue, and its
// delivery_attempt counts the grant), logged, and counted (OnLateLeases). A lease that
// ended before its deadline went with its message (retention removed it meanwhile): it
// is left out too, and neither logged nor counted as late.
func (p *Partition) liveGrants(grants []queue.Grant) []queue.Grant {
	p.mu.Lock()
	now := p.opts.Clock()
	live := grants[:0:0]
	dead := 0
	var lapsed int64 // the first lapsed lease's deadline
	for _, g := range grants {
		switch {
		case p.q.Holds(g.Offset, g.Nonce, now):
			live = append(live, g)
		case g.Deadline <= now:
			if dead == 0 {
				lapsed = g.Deadline
			}
			dead++
		}
	}
	p.mu.Unlock()
	if dead > 0 {
		p.opts.Logger.Warn("leases ended before their replicas confirmed them; those messages were not handed out and come back",
			"leases", dead, "confirm_late_by", time.Duration(now-lapsed).Round(time.Millisecond))
		if p.opts.OnLateLeases != nil {
			p.opts.OnLateLeases(dead)
		}
	}
	return live
}

// expire returns lapsed leases to the queue and reports how many (OnExpired). The
// caller holds p.mu.
func (p *Partition) expire(now int64) int {
	n := p.q.Expire(now)
	if n > 0 && p.opts.OnExpired != nil {
		p.opts.OnExpired(n)
	}
	return n
}

// LogStats returns the message log's counters: segment files and their bytes.
func (p *Partition) LogStats() segment.Stats { return p.log.Stats() }

// FrontierTime returns the write time (Unix ms) of the oldest unsettled message, and
// false when every message is settled or it cannot be read. It reads one record.
func (p *Partition) FrontierTime() (int64, bool) {
	st := p.Stats()
	if st.Frontier >= st.End {
		return 0, false
	}
	recs, err := p.log.Read(max(st.Frontier, p.log.Oldest()), 1, 1)
	if err != nil || len(recs) == 0 {
		return 0, false
	}
	return recs[0].Timestamp, true
}

// Close checkpoints the queue state and closes the files. Later calls return ErrClosed
// from every method.
func (p *Partition) Close() error {
	ckErr := p.Checkpoint()
	err := p.closeFiles()
	if err == nil && ckErr != nil && !errors.Is(ckErr, ErrClosed) {
		err = ckErr
	}
	return err
}

// closeFiles closes the partition without a checkpoint, as a crash would leave it.
func (p *Partition) closeFiles() error {
	raceHook("close")
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	// A checkpoint that copied the state before the close (one a settle started in the
	// background, which may take the lock after Close's own) finishes first: written
	// after Close returned, its queue.ckpt would put an old state back over the
	// checkpoints of a partition opened again on this directory, which may have
	// compacted the journal it names. Later ones find the partition closed.
	raceHook("close waits for a checkpoint")
	p.checkpoints.Lock()
	defer p.checkpoints.Unlock()
	// Wait for settles in flight to finish before closing the journal under them.
	p.gate.Lock()
	defer p.gate.Unlock()
	err := p.log.Close()
	if jerr := p.journal.Close(); err == nil {
		err = jerr
	}
	return err
}

// encodeSettle encodes a settle batch: a count, then the offsets as zig-zag deltas.
func encodeSettle(offs []uint64) []byte {
	b := make([]byte, 0, 2+len(offs)*3)
	b = binary.AppendUvarint(b, uint64(len(offs)))
	prev := int64(0)
	for _, o := range offs {
		b = binary.AppendVarint(b, int64(o)-prev)
		prev = int64(o)
	}
	return b
}

func decodeSettle(b []byte) ([]uint64, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("bad settle record count")
	}
	b = b[k:]
	out := make([]uint64, 0, n)
	prev := int64(0)
	for i := uint64(0); i < n; i++ {
		d, k := binary.Varint(b)
		if k <= 0 {
			return nil, errors.New("truncated settle record")
		}
		b = b[k:]
		prev += d
		if prev < 0 {
			return nil, errors.New("negative offset in settle record")
		}
		out = append(out, uint64(prev))
	}
	if len(b) != 0 {
		return nil, errors.New("trailing bytes in settle record")
	}
	return out, nil
}
