package broker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narad-mq/narad/broker/internal/partition"
)

// stateCollector computes the node's state gauges when /metrics is scraped, not on the
// request paths: per topic the backlog, leases in flight, acked-ahead messages, the age
// of the oldest unsettled message, and the message logs' segment files and bytes; per
// fan-out child its lag; and the data volume's free space. Labels are topic and child
// names only, so the series grow with the topics, never with messages or clients.
type stateCollector struct{ m *Metrics }

var (
	descBacklog = prometheus.NewDesc("narad_topic_backlog",
		"Messages stored and not yet settled, summed over the topic's partitions.", []string{"topic"}, nil)
	descInFlight = prometheus.NewDesc("narad_topic_in_flight",
		"Messages leased now (delivered, not yet acked, lease not lapsed).", []string{"topic"}, nil)
	descAckedAhead = prometheus.NewDesc("narad_topic_acked_ahead",
		"Messages acked above the ack frontier (an older message is still unacked).", []string{"topic"}, nil)
	descOldestAge = prometheus.NewDesc("narad_topic_oldest_unacked_age_seconds",
		"Age of the oldest unsettled message of the topic (0 when every message is settled).", []string{"topic"}, nil)
	descSegments = prometheus.NewDesc("narad_topic_segments",
		"Segment files of the topic's message logs.", []string{"topic"}, nil)
	descSegmentBytes = prometheus.NewDesc("narad_topic_segment_bytes",
		"Bytes of the topic's message-log segment files.", []string{"topic"}, nil)
	descFanoutLag = prometheus.NewDesc("narad_fanout_lag",
		"Parent messages not yet copied into the child, summed over the parent's partitions.", []string{"child"}, nil)
	descLed = prometheus.NewDesc("narad_partitions_led",
		"Partitions of the topic this node serves: all it holds for a single-replica topic, the ones it leads for a replicated one.", []string{"topic"}, nil)
	descReplicas = prometheus.NewDesc("narad_partition_replicas",
		"Replicas of the topic's partitions this node holds (led or following).", []string{"topic"}, nil)
	descReplLag = prometheus.NewDesc("narad_replication_lag_messages",
		"Largest number of messages a follower of a partition led here is behind its high watermark, over the topic's partitions.", []string{"topic"}, nil)
	descFollowers = prometheus.NewDesc("narad_replication_followers_in_sync",
		"Followers of partitions led here whose log holds every message up to the high watermark, summed over the topic's partitions.", []string{"topic"}, nil)
	descClockOffset = prometheus.NewDesc("narad_peer_clock_offset_seconds",
		"Another node's wall clock minus this node's, measured by the replication liveness calls (accurate to half a round trip).", []string{"peer"}, nil)
	descPeerAlive = prometheus.NewDesc("narad_peer_alive",
		"1 while this node's replication liveness calls to another node are answered within the liveness timeout (1 s), else 0.", []string{"peer"}, nil)
	descPeerLapses = prometheus.NewDesc("narad_peer_liveness_lapses_total",
		"Times another node was found dead (its answers stopped for the liveness timeout) or restarted, after counting alive: each makes the partitions it led elect a new leader.", []string{"peer"}, nil)
	descForcedCampaigns = prometheus.NewDesc("narad_replication_forced_campaigns_total",
		"Elections this node started at once for partitions whose leader was found dead or restarted (it was the live replica with the smallest id).", nil, nil)
	descStreamsOpened = prometheus.NewDesc("narad_replication_streams_opened_total",
		"Message streams this node opened to its peers for replication frames: one per peer, and one more each time one broke (a peer restarted or its connection died).", nil, nil)
	descLeadershipsWon = prometheus.NewDesc("narad_replication_leaderships_won_total",
		"Times a replicated partition's group on this node became leader and began serving, by an election or a handed leadership.", nil, nil)
	descLeaseConsumes = prometheus.NewDesc("narad_replication_lease_consumes_total",
		"Consumes of replicated partitions led here served under the leader's lease, without committing their deliveries through a quorum first (--leader-leases).", nil, nil)
	descLeaseRenewals = prometheus.NewDesc("narad_replication_lease_renewals_total",
		"Read-index rounds this node asked to renew the leader leases of the partitions it leads.", nil, nil)
	descVotesHeld = prometheus.NewDesc("narad_replication_votes_held_total",
		"Vote requests this node refused because it heard its partition's leader within the last second (the leader's lease counts on that): a candidate that cannot hear a live leader.", nil, nil)
	descLogCache = prometheus.NewDesc("narad_replication_log_cache_bytes",
		"Bytes of replicated partitions' Raft log entries this node holds in memory: entries not yet applied here, or, for partitions led here, not yet in every active follower's log. Near 0 on an idle node.", nil, nil)
	descGroups = prometheus.NewDesc("narad_replication_groups",
		"Replicated partitions' Raft groups on this node, by state: quiesced (idle: no ticks or heartbeats until a write or a peer wakes it) or active.", []string{"state"}, nil)
	descDiskFree = prometheus.NewDesc("narad_disk_free_bytes",
		"Bytes free for the node on the data directory's file system.", nil, nil)
	descDiskSize = prometheus.NewDesc("narad_disk_size_bytes",
		"Size of the data directory's file system.", nil, nil)
	descClusterVersion = prometheus.NewDesc("narad_cluster_version",
		"The cluster version the controller committed, as this node knows it: features of later versions are used once it includes them.", nil, nil)
	descMemberMaxVersion = prometheus.NewDesc("narad_cluster_member_max_version",
		"The highest cluster version each member last reported it offers (1: a binary from before cluster versions); the cluster version follows the lowest.", []string{"member"}, nil)
)

// Describe sends the collector's descriptions.
func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBacklog, descInFlight, descAckedAhead, descOldestAge, descSegments, descSegmentBytes, descFanoutLag, descDiskFree, descDiskSize, descLed, descReplicas, descReplLag, descFollowers, descClockOffset, descPeerAlive, descPeerLapses, descForcedCampaigns, descLeadershipsWon, descStreamsOpened, descLeaseConsumes, descLeaseRenewals, descVotesHeld, descLogCache, descGroups, descClusterVersion, descMemberMaxVersion} {
		ch <- d
	}
}

// Collect reads every open topic's partitions. It takes each partition's lock briefly
// and reads one record per partition with unsettled messages (for its age).
func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.m.broker.Load()
	if b == nil || b.meta == nil {
		return
	}
	ts := b.topicList()
	now := partition.WallMillis()
	for _, t := range ts {
		var backlog, inFlight, ackedAhead, segments, bytes float64
		oldest := int64(-1)
		for _, p := range t.parts() {
			if p == nil || !p.Leading() {
				continue // reported by the node that serves it
			}
			st := p.Stats()
			backlog += float64(st.Backlog)
			inFlight += float64(st.InFlight)
			ackedAhead += float64(st.AckedAhead)
			ls := p.LogStats()
			segments += float64(ls.Segments)
			bytes += float64(ls.SizeBytes)
			if ms, ok := p.FrontierTime(); ok && (oldest < 0 || ms < oldest) {
				oldest = ms
			}
		}
		age := 0.0
		if oldest >= 0 && now > oldest {
			age = time.Duration((now - oldest) * int64(time.Millisecond)).Seconds()
		}
		var led, replicas, lag, inSync float64
		for i, p := range t.parts() {
			if p == nil {
				continue
			}
			replicas++
			if !p.Leading() {
				continue
			}
			led++
			if ri := b.localReplicaInfo(t, i); ri != nil {
				for _, f := range ri.Followers {
					lag = max(lag, float64(f.Lag))
					if f.Lag == 0 {
						inSync++
					}
				}
			}
		}
		for _, v := range []struct {
			d *prometheus.Desc
			v float64
		}{{descBacklog, backlog}, {descInFlight, inFlight}, {descAckedAhead, ackedAhead}, {descOldestAge, age}, {descSegments, segments}, {descSegmentBytes, bytes},
			{descLed, led}, {descReplicas, replicas}, {descReplLag, lag}, {descFollowers, inSync}} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.GaugeValue, v.v, t.name)
		}
	}
	collectFanout(b, ch, ts)
	if b.repl != nil {
		offs, peers := b.repl.host.ClockOffsets(), b.repl.host.Peers()
		for _, m := range b.meta.Members() {
			if m.ID == b.opts.NodeID {
				continue
			}
			// The member's current server id only: a wiped node's old one is gone.
			id := raftID(m.ServerID)
			if off, ok := offs[id]; ok {
				ch <- prometheus.MustNewConstMetric(descClockOffset, prometheus.GaugeValue, off.Seconds(), m.ID)
			}
			if pl, ok := peers[id]; ok {
				alive := 0.0
				if pl.Live {
					alive = 1
				}
				ch <- prometheus.MustNewConstMetric(descPeerAlive, prometheus.GaugeValue, alive, m.ID)
				ch <- prometheus.MustNewConstMetric(descPeerLapses, prometheus.CounterValue, float64(pl.Lapses), m.ID)
			}
		}
		st := b.repl.host.Stats()
		ch <- prometheus.MustNewConstMetric(descForcedCampaigns, prometheus.CounterValue, float64(st.ForcedCampaigns))
		ch <- prometheus.MustNewConstMetric(descLeadershipsWon, prometheus.CounterValue, float64(st.LeadershipsWon))
		ch <- prometheus.MustNewConstMetric(descStreamsOpened, prometheus.CounterValue, float64(st.StreamsOpened))
		ch <- prometheus.MustNewConstMetric(descLeaseConsumes, prometheus.CounterValue, float64(st.LeaseServed))
		ch <- prometheus.MustNewConstMetric(descLeaseRenewals, prometheus.CounterValue, float64(st.LeaseRenewals))
		ch <- prometheus.MustNewConstMetric(descVotesHeld, prometheus.CounterValue, float64(st.VotesHeld))
		ch <- prometheus.MustNewConstMetric(descLogCache, prometheus.GaugeValue, float64(b.repl.host.CachedBytes()))
		all, quiesced := b.repl.host.GroupCounts()
		ch <- prometheus.MustNewConstMetric(descGroups, prometheus.GaugeValue, float64(quiesced), "quiesced")
		ch <- prometheus.MustNewConstMetric(descGroups, prometheus.GaugeValue, float64(all-quiesced), "active")
	}
	ch <- prometheus.MustNewConstMetric(descClusterVersion, prometheus.GaugeValue, float64(b.meta.ClusterVersion()))
	for _, m := range b.meta.Members() {
		_, hi := m.Versions()
		ch <- prometheus.MustNewConstMetric(descMemberMaxVersion, prometheus.GaugeValue, float64(hi), m.ID)
	}
	if free, size, err := diskUsage(b.opts.DataDir); err == nil {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(free))
		ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, float64(size))
	}
}

// collectFanout reports each attached child's lag behind its parent, as
// GET /v1/topics/{parent}/children computes it, in one pass over the topics.
func collectFanout(b *Broker, ch chan<- prometheus.Metric, ts []*topic) {
	open := make(map[string]*topic, len(ts))
	for _, t := range ts {
		open[t.name] = t
	}
	for _, m := range b.meta.Topics() {
		pt := open[m.Parent]
		if m.Parent == "" || pt == nil || pt.incarnation != m.ParentIncarnation {
			continue
		}
		b.copiersMu.Lock()
		cp := b.copiers[copierKey{child: m.Name, childInc: m.Incarnation, attachID: m.AttachID}]
		b.copiersMu.Unlock()
		lag := 0.0
		for i, p := range pt.parts() {
			if p == nil || !p.Leading() {
				continue // reported by the node that serves it
			}
			end, cursor := p.Stats().End, uint64(0)
			if cp != nil {
				cursor = cp.cursors[i].Load()
			} else if i < len(m.FanoutStart) {
				cursor = m.FanoutStart[i]
			}
			if end > cursor {
				lag += float64(end - cursor)
			}
		}
		ch <- prometheus.MustNewConstMetric(descFanoutLag, prometheus.GaugeValue, lag, m.Name)
	}
}
