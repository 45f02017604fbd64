package partition

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// A replica's snapshot is referential: it does not carry the messages, only what a
// replica must hold once it has applied the group's log up to the snapshot's index.
// The messages themselves are fetched from another replica (Fetch), since every
// replica's message log holds the same committed records at the same offsets.
//
//	'P' | version u8 | oldest u64 | end u64 | delivered-to u64 | frontier u64 | n u32 | n × acked-ahead offset u64
//	    | m u32 | m × (fan-out attach id u64, next offset u64)
//	    | k u32 | k × (offset u64, deliveries u64): messages delivered more than once
//
// all big-endian.
const (
	snapKind    byte = 'P'
	snapVersion byte = 1
)

// A replica's snapshot also carries the fan-out cursors committed in its group, so a
// restored replica that comes to lead resumes each child's copy where it stood.

// snapState is a replica's state as a snapshot describes it.
type snapState struct {
	oldest, end uint64 // the message log holds [oldest, end)
	deliveredTo uint64
	frontier    uint64
	ackedAhead  []uint64
	fanout      [][2]uint64 // fan-out child attach id, next parent offset to copy
	attempts    [][2]uint64 // offset, committed deliveries (D) of an unsettled message
}

func (s snapState) encode() []byte {
	b := make([]byte, 0, 2+8*4+4+8*len(s.ackedAhead))
	b = append(b, snapKind, snapVersion)
	b = binary.BigEndian.AppendUint64(b, s.oldest)
	b = binary.BigEndian.AppendUint64(b, s.end)
	b = binary.BigEndian.AppendUint64(b, s.deliveredTo)
	b = binary.BigEndian.AppendUint64(b, s.frontier)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.ackedAhead)))
	for _, o := range s.ackedAhead {
		b = binary.BigEndian.AppendUint64(b, o)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.fanout)))
	for _, f := range s.fanout {
		b = binary.BigEndian.AppendUint64(b, f[0])
		b = binary.BigEndian.AppendUint64(b, f[1])
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.attempts)))
	for _, a := range s.attempts {
		b = binary.BigEndian.AppendUint64(b, a[0])
		b = binary.BigEndian.AppendUint64(b, a[1])
	}
	return b
}

var errBadSnapshot = fmt.Errorf("%w: malformed replica snapshot", ErrCorrupt)

func decodeSnapState(b []byte) (snapState, error) {
	if len(b) < 2+8*4+4+4 || b[0] != snapKind {
		return snapState{}, errBadSnapshot
	}
	if b[1] != snapVersion {
		return snapState{}, fmt.Errorf("%w: replica snapshot version %d (from a newer version?)", ErrCorrupt, b[1])
	}
	s := snapState{
		oldest:      binary.BigEndian.Uint64(b[2:]),
		end:         binary.BigEndian.Uint64(b[10:]),
		deliveredTo: binary.BigEndian.Uint64(b[18:]),
		frontier:    binary.BigEndian.Uint64(b[26:]),
	}
	n := binary.BigEndian.Uint32(b[34:])
	rest := b[38:]
	if uint64(len(rest)) < 8*uint64(n)+4 || s.oldest > s.end || s.frontier > s.end {
		return snapState{}, errBadSnapshot
	}
	for i := range n {
		s.ackedAhead = append(s.ackedAhead, binary.BigEndian.Uint64(rest[8*i:]))
	}
	rest = rest[8*n:]
	pairs := func() ([][2]uint64, bool) {
		if len(rest) < 4 {
			return nil, false
		}
		m := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(len(rest)) < 16*uint64(m) {
			return nil, false
		}
		var out [][2]uint64
		for i := range m {
			out = append(out, [2]uint64{binary.BigEndian.Uint64(rest[16*i:]), binary.BigEndian.Uint64(rest[16*i+8:])})
		}
		rest = rest[16*m:]
		return out, true
	}
	var ok bool
	if s.fanout, ok = pairs(); !ok {
		return snapState{}, errBadSnapshot
	}
	if s.attempts, ok = pairs(); !ok || len(rest) != 0 {
		return snapState{}, errBadSnapshot
	}
	return s, nil
}

// Flush makes everything applied to this replica's message log and settle journal
// durable: they are written without their own fsync while the group's log can replay
// them, and a replica about to leave a group whose log will never be replayed (a
// forced takeover) must have them on disk first.
func (p *Partition) Flush() error {
	if err := p.log.Flush(); err != nil {
		return storageErr(err)
	}
	if err := p.journal.Flush(); err != nil {
		return storageErr(err)
	}
	return nil
}

// SnapshotState makes everything this replica applied durable (its message log and
// settle journal are written without their own fsync) and returns the snapshot of
// it. The group calls it from its apply goroutine, so the state is exactly that of
// the entries applied so far; it then drops those entries from its own log.
func (p *Partition) SnapshotState() ([]byte, error) {
	r := p.repl
	if r == nil {
		return nil, errors.New("partition: only a replica of a group takes snapshots")
	}
	if r.failed.Load() {
		return nil, fmt.Errorf("%w: this replica stopped applying after a failed write; restart the node", ErrStorage)
	}
	if r.skipped.Load() {
		// Its queue counts a damaged message it skipped in memory as settled: a
		// snapshot of it, sent to a replica that needs one or restored by this one
		// once rebuilt, would lose that message though its peers hold it intact.
		return nil, fmt.Errorf("%w: this replica skipped a damaged message and waits to be rebuilt from its group; its state is not snapshotted until then", ErrStorage)
	}
	if r.vend.Load() == vendUnknown && r.replaying.Load() && !r.retainable.Load() {
		// Its group's log is being applied again from its first entry (a restart with
		// no snapshot): the message log still holds records of entries past the one
		// applied last, maybe the first records of a torn command. A snapshot now would
		// take the log's end for the group's end at this index, and this replica (and
		// any restoring the snapshot) skip that command's rest and every later append
		// as stale (a review, 7 December). The group tries again later.
		return nil, ErrReplaying
	}
	if err := p.Flush(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	s := snapState{oldest: p.log.Oldest(), end: p.log.Next(), deliveredTo: r.deliveredTo.Load(),
		frontier: p.q.Frontier(), ackedAhead: p.q.AckedAhead(), fanout: r.fanoutCursors(), attempts: r.committedAttempts()}
	p.mu.Unlock()
	if v := r.vend.Load(); v != vendUnknown && v < s.end {
		// The group's entries up to the one applied last put the log's end at v; the
		// log holds more: records of later entries applied before this start, which
		// the replay of the group's log has not reached yet (the last of them maybe
		// the first records of a torn command). The snapshot is the state at its
		// index: it ends at v, and the settlements of later messages are the later
		// entries' to apply (a review, 7 December: a snapshot ending inside a torn
		// command made every later append stale to the replica that restored it).
		s.end, s.oldest = v, min(s.oldest, v)
		s.frontier = min(s.frontier, v)
		s.ackedAhead = slices.DeleteFunc(s.ackedAhead, func(o uint64) bool { return o < s.frontier || o >= v })
	}
	// Taken in the apply goroutine at an applied entry: the log ends where the
	// group's history puts it (a command torn at this start was completed, or it
	// would not have got here: Apply), so the history is known from here on.
	r.vend.CompareAndSwap(vendUnknown, s.end)
	slices.Sort(s.ackedAhead)
	return s.encode(), nil
}

// ErrReplaying is SnapshotState's refusal while this replica applies its group's log
// again after a restart with no snapshot and its message log holds records of entries
// not applied yet: expected, and gone once the replay reached the log's end.
var ErrReplaying = errors.New("partition: this replica is applying its group's log again and its message log holds records of entries not applied yet; no snapshot until it caught up")

// Fetch reads committed records of another replica's message log from offset from
// on (a node-plane call to it). It returns them in offset order, starting at from or,
// when that replica no longer holds from (retention), at the oldest it holds.
type Fetch func(ctx context.Context, from uint64) ([]segment.Record, error)

// ErrSnapshotSource means the replica asked for records could not give the ones
// this replica lacks: another replica may.
var ErrSnapshotSource = errors.New("partition: the replica fetched from does not hold the records needed")

// AgedOutError is a Fetch's answer when the replica fetched from holds no record from
// the offset asked on because retention removed every record it held before Oldest,
// and it held none after (its log was empty, ending there): the records from the
// offset asked up to Oldest are gone from it for good, not merely not reached yet. It
// is an ErrSnapshotSource.
type AgedOutError struct{ Oldest uint64 }

func (e *AgedOutError) Error() string {
	return fmt.Sprintf("%v: every record before offset %d aged out there, and it held none after", ErrSnapshotSource, e.Oldest)
}

// Is makes an AgedOutError an ErrSnapshotSource.
func (e *AgedOutError) Is(target error) bool { return target == ErrSnapshotSource }

// ReplicaRead reads up to max committed records from offset from on for another
// replica restoring a snapshot (Fetch): from the oldest this replica holds when from
// aged out. When it holds nothing from there because every record from from on aged
// out, it says so with an AgedOutError, so the restoring replica starts its log past
// them instead of asking for them for ever.
func (p *Partition) ReplicaRead(from uint64, max int) ([]segment.Record, error) {
	recs, err := p.Read(from, max)
	if err != nil || len(recs) > 0 {
		return recs, err
	}
	if o := p.log.Oldest(); o > from {
		return nil, &AgedOutError{Oldest: o}
	}
	return nil, nil
}

// RestoreSnapshot makes this replica hold at least the state snapshot data (taken
// at group index) describes: the messages it lacks are fetched with fetch, the
// settlements are merged in, and all of it is durable before it returns, because the
// group has already dropped the entries that would have written it (also when the
// replica held every message already: they were applied without sync). It is
// idempotent: a replica that already holds the state (its own snapshot, or a restore
// that completed before a crash) fetches nothing, and writes nothing but the flush.
func (p *Partition) RestoreSnapshot(ctx context.Context, index uint64, data []byte, fetch Fetch) error {
	r := p.repl
	if r == nil {
		return errors.New("partition: only a replica of a group restores snapshots")
	}
	s, err := decodeSnapState(data)
	if err != nil {
		return err
	}
	// The snapshot replaces the group's entries before it, so none of them is applied
	// again and no torn command among them needs this replica's records: retention may
	// run (old records of this replica that its peers no longer hold wait for it).
	r.retainable.Store(true)
	fetched := false
	for p.log.Next() < s.end {
		if err := ctx.Err(); err != nil {
			return err
		}
		next := p.log.Next()
		if p.log.Oldest() == next && next < s.oldest {
			// Empty, and the group's messages before s.oldest are gone everywhere.
			if err := p.log.SetNext(s.oldest); err != nil {
				return storageErr(err)
			}
			continue
		}
		recs, err := fetch(ctx, next)
		var gone *AgedOutError
		if errors.As(err, &gone) && gone.Oldest > next && p.log.Oldest() == next {
			// Empty, and every message from next up to the source's oldest aged out
			// there, which holds none after it (an idle partition whose every message
			// aged out since the snapshot): nobody can send them, so the log starts
			// past them, at the snapshot's end at most (the group's entries after the
			// snapshot carry the rest). Asked for again and again, the restore never
			// completed, and this replica's group neither answered nor voted.
			if err := p.log.SetNext(min(gone.Oldest, s.end)); err != nil {
				return storageErr(err)
			}
			continue
		}
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return fmt.Errorf("%w: it has nothing from offset %d, and the snapshot ends at %d", ErrSnapshotSource, next, s.end)
		}
		if recs[0].Offset != next {
			if recs[0].Offset < next || p.log.Oldest() != next {
				// A gap inside this replica's log cannot be written: its records before
				// the gap aged out on the other replica. Retention here removes them soon.
				return fmt.Errorf("%w: it starts at offset %d, this replica's log ends at %d", ErrSnapshotSource, recs[0].Offset, next)
			}
			if err := p.log.SetNext(recs[0].Offset); err != nil {
				return storageErr(err)
			}
			next = recs[0].Offset
		}
		n := 0
		for n < len(recs) && recs[n].Offset == next+uint64(n) && recs[n].Offset < s.end {
			n++
		}
		if n == 0 {
			return fmt.Errorf("%w: its records do not follow offset %d", ErrSnapshotSource, next)
		}
		if _, err := p.log.Append(recs[:n]); err != nil {
			return storageErr(err)
		}
		fetched = true
	}
	// Durable before the group drops its entries, fetched or not: messages and settles
	// this replica applied from entries up to index, written without sync, are written
	// again by no entry of its log once the snapshot is installed, and past the flush
	// point a power loss cuts them as a torn write (a forced takeover's survivor then
	// applies its replaced group's log over a log ending before the snapshot's end).
	if err := p.Flush(); err != nil {
		return err
	}
	r.vend.Store(s.end)
	// The snapshot is the group's state at index: its mark replaces this replica's,
	// which an M or a handover's L committed since may have lowered (raised only, a
	// mark this replica applied before it fell behind counted messages below it as
	// delivered once more when it led: a review, 5 December).
	r.deliveredTo.Store(s.deliveredTo)
	// Leases an L command handed over are memory only (no snapshot carries them), and
	// the entries this snapshot stands for may hold the L that called that handover off
	// (ResumeAfterHandOver), after which its leader served on: nacks, renewals, new
	// leases. Kept, they were taken as handed to this replica when it won the next
	// term after that leader died: a nacked message held under the nacked handle, an
	// attempt count gone back (a review, 6 December). A handover's successor holds its
	// L in its log, and after it only the handover's last few entries: it never needs a
	// snapshot, so none is lost here.
	r.handMu.Lock()
	r.handed, r.handedTerm = nil, 0
	r.handMu.Unlock()
	for _, f := range s.fanout {
		r.setFanout(f[0], f[1])
	}
	if len(s.attempts) > 0 {
		r.attMu.Lock()
		if r.attempts == nil {
			r.attempts = map[uint64]uint32{}
		}
		for _, a := range s.attempts {
			r.attempts[a[0]] = max(r.attempts[a[0]], uint32(min(a[1], 1<<32-1)))
		}
		r.attMu.Unlock()
	}
	// Where the group's entries up to index put the log's end: the log may hold more,
	// records of later entries applied before this start (a follower matched up to
	// index was reported holding them).
	r.mark(index, s.end)
	// Settlements: whatever the snapshot settled and this replica has not.
	p.mu.Lock()
	frontier := max(p.q.Frontier(), s.frontier)
	acked := map[uint64]struct{}{}
	missing := p.q.Frontier() < s.frontier
	for _, o := range p.q.AckedAhead() {
		if o >= frontier {
			acked[o] = struct{}{}
		}
	}
	for _, o := range s.ackedAhead {
		if o >= frontier {
			if !p.q.IsSettled(o) {
				missing = true
			}
			acked[o] = struct{}{}
		}
	}
	if missing {
		list := make([]uint64, 0, len(acked))
		for o := range acked {
			list = append(list, o)
		}
		q := queue.New(p.q.Config(), p.q.Epoch(), frontier, list)
		q.Reset(0, max(p.q.Cursor(), frontier))
		q.SetBounds(p.log.Oldest(), p.log.Next())
		p.q = q
	} else {
		p.q.SetBounds(p.log.Oldest(), p.log.Next())
	}
	p.mu.Unlock()
	if missing {
		if err := p.Checkpoint(); err != nil {
			return err
		}
	}
	if fetched || missing {
		p.opts.Logger.Info("replica restored from a snapshot", "partition", p.opts.Index, "index", index,
			"log_end", p.log.Next(), "frontier", frontier)
	}
	p.notify()
	return nil
}

// Damage reports what opening this partition found damaged: records of its message
// log (whose offsets stay taken and are never served) and settle records of its
// journal (whose settlements are lost). Zero for both on a healthy partition.
func (p *Partition) Damage() (logRecords, journalRecords uint64) {
	return p.log.Stats().DamagedRecords, p.journalDamaged
}

// DiscardData moves a closed replica's message log, settle journal, checkpoint and
// epoch file into dir/damaged (replacing what an earlier discard left there), so the replica
// opens empty and its group rebuilds it: by applying its log again, or, when the log
// was compacted, by restoring the group's snapshot from another replica. A replica
// with damaged records must not lead with them (it would skip messages its peers
// hold intact) and it can fetch intact copies; a lone partition cannot, and keeps the
// single-node rule (skip, count, report).
func DiscardData(fsys vfs.FS, dir string) error {
	return discard(fsys, dir, ckptName, "journal", epochName, "log")
}

// DiscardQueueState is DiscardData for a replica whose message log is intact but
// whose queue state does not open (a checkpoint or epoch file that fails its checks,
// a settle journal missing what its checkpoint relies on): it keeps the log, the
// messages its group would otherwise fetch from a peer (which may be gone), and sets
// the rest aside. The group's snapshot and log put the settled state back, as they do
// after a crash that kept only the log.
func DiscardQueueState(fsys vfs.FS, dir string) error {
	return discard(fsys, dir, ckptName, "journal", epochName)
}

// discard moves names (those that exist) from dir into dir/damaged, replacing what an
// earlier discard left there.
func discard(fsys vfs.FS, dir string, names ...string) error {
	if fsys == nil {
		fsys = vfs.OS{}
	}
	aside := filepath.Join(dir, "damaged")
	if err := removeTree(fsys, aside); err != nil {
		return err
	}
	if err := fsys.MkdirAll(aside, 0o700); err != nil {
		return err
	}
	// Settlements first, the log last: a crash in between leaves a log that is still
	// damaged, so the next open discards again. The lease epoch goes too: a replica
	// leases only as its group's leader, in the epoch of its term.
	for _, name := range names {
		err := fsys.Rename(filepath.Join(dir, name), filepath.Join(aside, name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	// The entries in damaged/ first: synced only in dir, the moves were durable out of
	// dir and not into damaged/, and a power cut then lost what was set aside.
	if err := fsys.SyncDir(aside); err != nil {
		return err
	}
	return fsys.SyncDir(dir)
}

// removeTree removes name and everything under it; a missing name is no error.
func removeTree(fsys vfs.FS, name string) error {
	fi, err := fsys.Stat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir {
		entries, err := fsys.ReadDir(name)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := removeTree(fsys, filepath.Join(name, e.Name)); err != nil {
				return err
			}
		}
	}
	return fsys.Remove(name)
}
