package broker

import (
	"sync"
	"time"
)

// diskStallCheck is how often the node looks at its disk's health (wal.Stalled,
// meta.Store.Stalled).
const diskStallCheck = 250 * time.Millisecond

// diskStalled reports whether this node's disk stalls now: a write-ahead round, or a
// write of the control plane's Raft store, has been taking a second or more, or the
// last one did (wal.Stalled, meta.Store.Stalled). Without the write-ahead file
// (--sync-mode group or file) only the control plane's writes are timed.
func (b *Broker) diskStalled() bool { return b.walStalled() || b.meta.Stalled() }

// walStalled is the write-ahead file's part of diskStalled (the control plane's
// Cluster.DiskStalled: it times its own writes itself).
func (b *Broker) walStalled() bool { return b.wal != nil && b.wal.Stalled() }

// diskStallLoop watches the disk while the node runs. While it stalls, the node hands
// the leadership of every replicated partition it leads to a caught-up replica on a
// node fit to lead (committing the live leases first, as a planned handover does), and
// tells its peers in its liveness answers (raftetcd.Options.DiskStalled), whose leaders
// then hand it no leadership while another replica can take it. A replicated
// partition's leader answers a produce or an ack only once its own log holds it, so on
// a disk whose syncs take seconds every write of its partitions would take seconds,
// while its followers could serve them at once. The node itself is not counted dead:
// it still follows, votes and forwards, and it may still win an election or be handed
// a leadership no other replica can take (a slow leader is better than none); it hands
// such a one on as soon as a replica that can take it appears. A controller on such a
// disk hands the controller over too (meta, Cluster.DiskStalled). The node says when
// the stall begins and ends, and narad_storage_disk_stalled is 1 meanwhile.
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
			if b.repl != nil {
				b.log.Warn("the disk is stalling: a write-ahead sync or a control-plane write took a second or more; this node hands over the leadership of its replicated partitions, and the controller, to healthy nodes until its writes are quick again (check the disk)")
			} else {
				b.log.Warn("the disk is stalling: a write-ahead sync or a control-plane write took a second or more; every write waits for it (check the disk)")
			}
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
// caught-up voter (it holds everything committed) on a node fit to lead (not silent,
// its disk not stalling: unfitLeader), all at once, each bounded by handOverTo's
// waits. A partition whose leadership does not move leads on and is tried again at
// the next check; one another handover is moving already is left to it
// (claimHandOver). Not while the node stops: its own handover moves everything.
func (b *Broker) shedLeaderships() {
	if b.closing.Load() || !b.placeMu.TryLock() {
		return // a placement pass running now may be handing the same partitions over
	}
	defer b.placeMu.Unlock()
	self := raftID(b.meta.ServerID())
	var wg sync.WaitGroup
	for _, t := range b.topicList() {
		select {
		case <-t.done:
			continue // being deleted
		default:
		}
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
				if id != self && !b.unfitLeader(id) && info.Match[id] >= info.Commit {
					others = append(others, id)
				}
			}
			if len(others) == 0 {
				continue // no replica fit to take it now: a slow leader is better than none
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.handOverTo(t, i, info, others, "this node's disk is stalling")
				if !t.leads(i) {
					b.metrics.StallHandOvers.Inc() // or lost meanwhile: it leads no more either way
				}
			}()
		}
	}
	wg.Wait()
}
