package broker

import (
	"sync"
	"time"
)

// diskStallCheck is how often the node looks at its disk's health (wal.Stalled).
const diskStallCheck = 250 * time.Millisecond

// diskStalled reports whether this node's disk stalls now: a write-ahead sync has been
// taking a second or more, or the last one did (wal.Stalled). Always false without the
// write-ahead file (--sync-mode group or file).
func (b *Broker) diskStalled() bool { return b.wal != nil && b.wal.Stalled() }

// diskStallLoop watches the disk while the node runs. While it stalls, the node hands
// the leadership of every replicated partition it leads to a caught-up replica on a
// live node (committing the live leases first, as a planned handover does), and
// refuses any leadership handed to it (raftetcd.Options.DiskStalled). A replicated
// partition's leader answers a produce or an ack only once its own log holds it, so on
// a disk whose syncs take seconds every write of its partitions would take seconds,
// while its followers could serve them at once. The node itself is not counted dead:
// it still follows, votes, forwards, and may still win an election (a slow leader is
// better than none). The node says when the stall begins and ends, and
// narad_storage_disk_stalled is 1 meanwhile.
func (b *Broker) diskStallLoop() {
	defer b.wg.Done()
	tick := time.NewTicker(diskStallCheck)
	defer tick.Stop()
	stalled, since := false, time.Time{}
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		now := b.diskStalled()
		switch {
		case now && !stalled:
			since = time.Now()
			b.metrics.DiskStalled.Set(1)
			b.log.Warn("the disk is stalling: a write-ahead sync took a second or more; this node hands over the leadership of its replicated partitions and takes none until its syncs are quick again (check the disk)",
				"replicated", b.repl != nil)
		case !now && stalled:
			b.metrics.DiskStalled.Set(0)
			b.log.Info("the disk is quick again: this node may lead partitions again", "stalled_for", time.Since(since).Round(time.Millisecond))
		}
		stalled = now
		if now && b.repl != nil {
			b.shedLeaderships()
		}
	}
}

// shedLeaderships hands over every replicated partition led here whose group has a
// voter on a node the liveness does not find silent, all at once (each is bounded by
// handOverTo's waits). A partition whose leadership does not move leads on and is
// tried again at the next check. A placement pass running now is let finish first:
// it may be handing the same partition over.
func (b *Broker) shedLeaderships() {
	if !b.placeMu.TryLock() {
		return
	}
	defer b.placeMu.Unlock()
	ts := b.topicList()
	self := raftID(b.meta.ServerID())
	var wg sync.WaitGroup
	for _, t := range ts {
		for i := range t.parts() {
			if !b.replicated(t.cur.Load(), i) || !t.leads(i) {
				continue
			}
			info, ok := b.repl.host.Info(t.gid(i))
			if !ok || !info.Leader {
				continue
			}
			var others []uint64
			for _, id := range info.Voters {
				if id != self && !b.repl.host.PeerSilent(id) {
					others = append(others, id)
				}
			}
			if len(others) == 0 {
				continue // no live replica to take it: a slow leader is better than none
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.handOverTo(t, i, info, others, "this node's disk is stalling")
				if !t.leads(i) {
					b.metrics.StallHandOvers.Inc()
				}
			}()
		}
	}
	wg.Wait()
}
