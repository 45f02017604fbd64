package broker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// openWAL opens the node's write-ahead file and replays what it holds into the
// partitions' files, before any partition opens them.
func (b *Broker) openWAL(observe func(int, time.Duration)) error {
	fss, err := vfs.NewFSSyncer(filepath.Join(b.opts.DataDir, "topics"))
	if err != nil {
		return err
	}
	var holdOffLogged time.Time // OnHoldOff's, on the writer goroutine
	holdOffs := 0
	start := time.Now()
	w, rep, err := wal.Open(filepath.Join(b.opts.DataDir, "wal"), wal.Options{
		FS:            vfs.OS{},
		Root:          b.opts.DataDir,
		Syncer:        fss,
		Observe:       observe,
		HoldProcessor: !b.opts.WALNoHold,
		OnHoldOff: func(d time.Duration) {
			// At most a line a minute: a disk slow now and then starts a hold-off
			// every second.
			holdOffs++
			if now := time.Now(); now.Sub(holdOffLogged) >= time.Minute {
				b.log.Warn("write-ahead syncs took long: the writer does not keep its processor through them for a second or more after each, longer while the disk stalls (a slow or stalling disk)",
					"took", d.Round(time.Microsecond), "slow_syncs", holdOffs)
				holdOffLogged, holdOffs = now, 0
			}
		},
		OnFail: func(err error) {
			b.metrics.StorageErrors.WithLabelValues("wal").Inc()
			b.log.Error("the write-ahead file failed: no partition of this node can store a write until it restarts and replays the file", "err", err)
			b.walFailed <- err // buffered for the one call
		},
		OnCheckpointRetry: func(err error) {
			b.metrics.StorageErrors.WithLabelValues("wal_checkpoint_open").Inc()
			b.log.Warn("a checkpoint of the write-ahead file could not open a data file to sync it; trying again in a second (nothing is lost meanwhile)", "err", err)
		},
	})
	if err != nil {
		_ = fss.Close() // the open error is the one to report
		return fmt.Errorf("opening the write-ahead file: %w", err)
	}
	if rep.Records > 0 || rep.Skipped > 0 {
		b.log.Info("replayed the write-ahead file", "files", rep.Files, "records", rep.Records, "skipped", rep.Skipped, "took", time.Since(start))
	}
	b.reportWALDamage(rep)
	b.wal, b.walSyncer = w, fss
	walStats := w.Stats
	b.metrics.walStats.Store(&walStats)
	group := b.metrics.syncStats.Load()
	stats := func() vfs.SyncStats {
		ws := w.Stats()
		out := vfs.SyncStats{Rounds: ws.Rounds, Files: ws.Records, Time: ws.Time}
		if group != nil {
			gs := (*group)()
			out.Rounds, out.Files, out.Time = out.Rounds+gs.Rounds, out.Files+gs.Files, out.Time+gs.Time
		}
		return out
	}
	b.metrics.syncStats.Store(&stats)
	return nil
}

// replayWAL replays a write-ahead file left by an earlier start in wal mode, when
// this one runs without it (--sync-mode group or file): its records are appends that
// were answered, which the partitions' files may lack after a crash, and a log opened
// without them would cut them as a torn tail. It leaves the file freed.
func (b *Broker) replayWAL() error {
	dir := filepath.Join(b.opts.DataDir, "wal")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	w, rep, err := wal.Open(dir, wal.Options{FS: vfs.OS{}, Root: b.opts.DataDir})
	if err != nil {
		return fmt.Errorf("replaying the write-ahead file: %w", err)
	}
	if rep.Records > 0 || rep.Skipped > 0 {
		b.log.Info("replayed the write-ahead file of an earlier start in wal mode", "files", rep.Files, "records", rep.Records, "skipped", rep.Skipped)
	}
	b.reportWALDamage(rep)
	return w.Close()
}

// reportWALDamage logs and counts the records a replay skipped as damaged: their
// bytes were not redone, and a data file that lacked them shows a hole, which its
// partition reports as damaged records when it opens.
func (b *Broker) reportWALDamage(rep wal.Replayed) {
	if rep.DamagedHeaders > 0 {
		b.metrics.StorageErrors.WithLabelValues("wal_damaged").Add(float64(rep.DamagedHeaders))
		b.log.Error(wal.DamagedHeadersMessage, "files", rep.DamagedHeaders, "first", rep.FirstDamagedHeader)
	}
	if rep.Damaged == 0 {
		return
	}
	b.metrics.StorageErrors.WithLabelValues("wal_damaged").Add(float64(rep.Damaged))
	b.log.Error("the write-ahead file held records that failed their checks with valid ones after them (damaged at rest, or torn by a power cut within its last round, which was never answered): skipped, the records after them replayed; a partition whose file lacked a skipped record's bytes reports them as damaged when it opens",
		"damaged", rep.Damaged, "first", rep.FirstDamaged)
}

// walOrNil keeps a nil *wal.WAL from becoming a non-nil interface.
func (b *Broker) walOrNil() segment.Committer {
	if b.wal == nil {
		return nil
	}
	return b.wal
}

// raftWAL is the write-ahead file for the replicated partitions' Raft logs, or nil.
func (b *Broker) raftWAL() raftetcd.WAL {
	if b.wal == nil {
		return nil
	}
	return b.wal
}

// checkpointWAL makes every record of the write-ahead file durable in its data file
// and frees it, before data is removed whose paths may be written again (a
// partition moved back, a replica's snapshot): no record of the removed files is
// ever replayed into new ones. A failure fails the WAL closed (every later append
// reports it) and is logged; the caller must then not remove the data, which the
// next start does after its replay.
func (b *Broker) checkpointWAL(why string) error {
	if b.wal == nil {
		return nil
	}
	if err := b.wal.Checkpoint(); err != nil {
		b.log.Error("checkpointing the write-ahead file failed; the data stays until a restart", "before", why, "err", err)
		return err
	}
	return nil
}
