package broker

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// Metrics holds the broker's Prometheus metrics.
type Metrics struct {
	Registry *prometheus.Registry

	Produced       *prometheus.CounterVec   // messages stored, by topic
	Delivered      *prometheus.CounterVec   // messages leased, by topic
	Redelivered    *prometheus.CounterVec   // leased again after a lapse or nack, by topic
	Settled        *prometheus.CounterVec   // acks that settled, by topic
	AckOutcomes    *prometheus.CounterVec   // ack and extend results, by outcome
	StorageErrors  *prometheus.CounterVec   // failed disk writes, by what was written
	HTTPRequests   *prometheus.CounterVec   // by operation and status
	HTTPDuration   *prometheus.HistogramVec // by operation
	ConsumeWaiting prometheus.Gauge         // long polls parked now
	AuthFailures   prometheus.Counter       // failed logins
	AuthThrottled  prometheus.Counter       // password checks refused unhashed (too many in flight)
	FanoutCopied   *prometheus.CounterVec   // messages copied into a child, by child
	FanoutPaused   *prometheus.GaugeVec     // 1 while a child's copy is paused, by child
	// BodyBytesInFlight and BodiesRefused are the HTTP layer's bound on request bodies
	// held in memory (--max-inflight-bytes).
	BodyBytesInFlight prometheus.Gauge
	BodiesRefused     prometheus.Counter
	Damaged           *prometheus.CounterVec // damaged records skipped, by topic and log
	ReplicaRebuilds   *prometheus.CounterVec // replicas set aside as damaged and rebuilt, by topic
	ReplicasClosed    *prometheus.GaugeVec   // replicas left closed: their group's own log is damaged, by topic
	ProducedBytes     *prometheus.CounterVec // payload and key bytes stored, by topic
	DeliveredBytes    *prometheus.CounterVec // payload and key bytes handed out under a lease, by topic
	Nacks             *prometheus.CounterVec // leases handed back by a nack, by topic
	LeaseExpiries     *prometheus.CounterVec // leases whose visibility timeout ended unacked, by topic
	LeasesLate        *prometheus.CounterVec // leases that ended before their replicas confirmed them, by topic
	LeasesTooLate     *prometheus.CounterVec // leases a consume took too late to hand out, handed back, by topic
	// LeadershipsTaken counts the replicated partitions this node started leading, by
	// how: "handover" (a planned change; the leases live then are honoured) or
	// "election" (a new group, or after a failure or a handover that did not finish:
	// the leases are lost and their messages come back at once).
	LeadershipsTaken *prometheus.CounterVec
	// DiskStalled is 1 while the node's disk stalls (a write-ahead sync took a second
	// or more); StallHandOvers counts the leaderships it handed over meanwhile.
	DiskStalled      prometheus.Gauge
	StallHandOvers   prometheus.Counter
	RetentionDeleted *prometheus.CounterVec // messages deleted by retention, by topic
	SyncDuration     prometheus.Histogram   // one shared sync round's duration
	SyncGroupFiles   prometheus.Histogram   // files made durable by one shared sync round
	// Forwarded times partition operations sent to the node holding the partition, by
	// operation and outcome (ok, unreachable, saturated, unknown, error).
	Forwarded *prometheus.HistogramVec
	// DeletesUnconfirmed counts topic deletes answered before a majority of some
	// partition's replicas confirmed they closed it (deletefence.go).
	DeletesUnconfirmed prometheus.Counter
	// DetachesUnconfirmed counts fan-out detaches answered before every replica of the
	// parent confirmed it stopped copying (deletefence.go).
	DetachesUnconfirmed prometheus.Counter
	// RemoteChild are the remote children's metrics (remotechild.go).
	RemoteChild *RemoteChildMetrics

	// syncStats reads the node's shared sync group (set by Open in group sync mode).
	syncStats atomic.Pointer[func() vfs.SyncStats]
	// walStats reads the node's write-ahead file (set by Open in wal sync mode).
	walStats atomic.Pointer[func() wal.Stats]
	// broker is what the state gauges read at scrape time (stateCollector), set by
	// Open: a test may reopen a broker over the same Metrics.
	broker atomic.Pointer[Broker]
}

// readStat reads, at scrape time, the figure pick takes from the stats src gives (0
// until src is set).
func readStat[S any](src *atomic.Pointer[func() S], pick func(S) float64) func() float64 {
	return func() float64 {
		if f := src.Load(); f != nil {
			return pick((*f)())
		}
		return 0
	}
}

// topicMetrics are one topic's children of the per-topic counters, looked up once when
// the topic opens so that the request paths do no label lookup.
type topicMetrics struct {
	produced, producedBytes, delivered, deliveredBytes, redelivered prometheus.Counter
	settled, nacks, expiries, retained, late, tooLate               prometheus.Counter
}

func (m *Metrics) forTopic(name string) *topicMetrics {
	return &topicMetrics{
		produced: m.Produced.WithLabelValues(name), producedBytes: m.ProducedBytes.WithLabelValues(name),
		delivered: m.Delivered.WithLabelValues(name), deliveredBytes: m.DeliveredBytes.WithLabelValues(name),
		redelivered: m.Redelivered.WithLabelValues(name), settled: m.Settled.WithLabelValues(name),
		nacks: m.Nacks.WithLabelValues(name), expiries: m.LeaseExpiries.WithLabelValues(name),
		retained: m.RetentionDeleted.WithLabelValues(name), late: m.LeasesLate.WithLabelValues(name),
		tooLate: m.LeasesTooLate.WithLabelValues(name),
	}
}

// NewMetrics registers the broker's metrics, plus Go runtime and process metrics, in a
// new registry.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Produced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_messages_produced_total", Help: "Messages stored durably (answered 202).",
		}, []string{"topic"}),
		Delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_messages_delivered_total", Help: "Messages handed out under a lease.",
		}, []string{"topic"}),
		Redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_messages_redelivered_total", Help: "Deliveries after the first (lease lapsed, nack or restart).",
		}, []string{"topic"}),
		Settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_messages_settled_total", Help: "Messages settled durably by an ack.",
		}, []string{"topic"}),
		AckOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_ack_outcomes_total", Help: "Ack, extend and nack results.",
		}, []string{"outcome"}),
		StorageErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_storage_errors_total", Help: "Disk writes or reads that failed.",
		}, []string{"op"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_http_requests_total", Help: "HTTP requests by operation and status.",
		}, []string{"op", "status"}),
		HTTPDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "narad_http_request_duration_seconds",
			Help:    "HTTP request latency by operation (long polls include their wait).",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20},
		}, []string{"op"}),
		ConsumeWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "narad_consume_waiting", Help: "Consume requests parked in a long poll.",
		}),
		FanoutCopied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_fanout_copied_total", Help: "Messages copied from a parent into a child topic.",
		}, []string{"child"}),
		FanoutPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "narad_fanout_paused", Help: "1 while a child's copy is paused because its owner may no longer consume the parent.",
		}, []string{"child"}),
		AuthThrottled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narad_auth_throttled_total", Help: "Password checks refused with 503 before hashing: too many in flight from one address or in total.",
		}),
		DiskStalled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "narad_storage_disk_stalled",
			Help: "1 while this node's disk stalls: a write-ahead sync has taken a second or more, or the last one did. The node hands over the leadership of its replicated partitions and takes none meanwhile.",
		}),
		StallHandOvers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narad_partition_stall_handovers_total",
			Help: "Leaderships of replicated partitions this node handed over because its disk stalled.",
		}),
		ReplicaRebuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_replica_rebuilds_total",
			Help: "Replicas whose data was found damaged at start and rebuilt from their partition's group instead of skipping the damaged records.",
		}, []string{"topic"}),
		ReplicasClosed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "narad_replicas_closed_damaged",
			Help: "Replicas placed on this node and left closed because their group's own Raft log is damaged: the partition is served by its other replicas until the replica is repaired (docs/operating/recovery.md).",
		}, []string{"topic"}),
		Damaged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_damaged_records_total",
			Help: "Records that failed their checksum and were skipped: messages settled without being delivered (log=messages), settle records lost on open (log=journal), parent messages never copied into the child topic (log=fanout).",
		}, []string{"topic", "log"}),
		AuthFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narad_auth_failures_total", Help: "Requests refused for missing or wrong credentials.",
		}),
		BodyBytesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "narad_http_body_bytes_in_flight", Help: "Request body bytes held by requests now (bounded by --max-inflight-bytes).",
		}),
		BodiesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narad_http_overloaded_total", Help: "Requests refused with 503 overloaded because --max-inflight-bytes of bodies were held.",
		}),
		ProducedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_produced_bytes_total", Help: "Key and payload bytes of the messages stored durably.",
		}, []string{"topic"}),
		DeliveredBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_delivered_bytes_total", Help: "Key and payload bytes of the messages handed out under a lease.",
		}, []string{"topic"}),
		Forwarded: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "narad_forwarded_duration_seconds",
			Help:    "Partition operations forwarded to the node holding the partition, by operation and outcome (ok, unreachable, saturated, unknown: the holder went silent, error); a watch is a long poll's wait.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20},
		}, []string{"op", "outcome"}),
		DeletesUnconfirmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narad_topic_deletes_unconfirmed_total", Help: "Topic deletes answered before a majority of some partition's replicas confirmed they applied the delete (unreachable for the metadata lease plus 1 s); such nodes serve nothing until they have caught up with the controller.",
		}),
		DetachesUnconfirmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "narad_fanout_detaches_unconfirmed_total", Help: "Fan-out detaches answered before every replica of the parent confirmed it stopped copying (unreachable for the metadata lease plus 1 s); such nodes copy nothing until they have caught up with the controller.",
		}),
		Nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_nacks_total", Help: "Leases handed back by a nack (extend 0), for redelivery at once.",
		}, []string{"topic"}),
		LeaseExpiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_lease_expiries_total", Help: "Leases whose visibility timeout ended before an ack; the message is delivered again.",
		}, []string{"topic"}),
		LeasesLate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_leases_confirmed_late_total", Help: "Leases of a replicated partition that ended before its replicas confirmed them (the group stalled longer than the visibility timeout); their messages were not handed out and come back.",
		}, []string{"topic"}),
		LeasesTooLate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_leases_handed_back_late_total", Help: "Leases a consume got too late to hand out, handed back instead (uncounted): answered after 7/8 of the visibility timeout by a slow node, or taken by a partition of this node after the consume stopped waiting for it (the budget of the leases it held).",
		}, []string{"topic"}),
		LeadershipsTaken: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_partition_leaderships_taken_total", Help: "Replicated partitions this node started leading, by how: handover (a planned change that keeps the live leases) or election (a new group, or after a failure: the leases are lost).",
		}, []string{"how"}),
		RetentionDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_retention_deleted_messages_total", Help: "Messages deleted by retention, acked or not.",
		}, []string{"topic"}),
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narad_storage_sync_duration_seconds", Help: "Duration of one shared sync round: a round of the write-ahead file (wal sync mode) or a file-system sync shared by files with writes waiting (the other files in wal mode, all in group mode): the disk's fsync latency as writers see it.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1, 2},
		}),
		SyncGroupFiles: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narad_storage_sync_group_files", Help: "Partition files made durable by one shared sync round (a write-ahead round counts one per log whose appends it recorded): the group-commit size.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
	}
	r.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_sync_rounds_total", Help: "Shared sync rounds: rounds of the write-ahead file (wal sync mode) plus file-system syncs shared by files with writes waiting (the other files in wal mode, all in group mode).",
		}, readStat(&m.syncStats, func(s vfs.SyncStats) float64 { return float64(s.Rounds) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_sync_files_total", Help: "Partition files made durable by those rounds; divided by the rounds, how many shared each.",
		}, readStat(&m.syncStats, func(s vfs.SyncStats) float64 { return float64(s.Files) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_sync_seconds_total", Help: "Time spent in those rounds.",
		}, readStat(&m.syncStats, func(s vfs.SyncStats) float64 { return s.Time.Seconds() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_wal_held_syncs_total", Help: "Write-ahead rounds whose fdatasync kept the writer's Go processor (--wal-hold-processor).",
		}, readStat(&m.walStats, func(s wal.Stats) float64 { return float64(s.Held) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_wal_hold_offs_total", Help: "Held write-ahead syncs that took 20 ms or more, each of which paused the holding (a second at first; longer while the disk stalls for 100 ms or more): a slow or stalling disk.",
		}, readStat(&m.walStats, func(s wal.Stats) float64 { return float64(s.HoldOffs) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_wal_bytes_total", Help: "Bytes written into the write-ahead file (--sync-mode wal): every append and settle of every partition on this node and the Raft log entries of its replicated partitions, with the records' headers.",
		}, readStat(&m.walStats, func(s wal.Stats) float64 { return float64(s.Bytes) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_wal_checkpoints_total", Help: "Write-ahead files checkpointed: the data files a full file's records went to were synced, and the file freed for reuse.",
		}, readStat(&m.walStats, func(s wal.Stats) float64 { return float64(s.Checkpoints) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_wal_stalled_syncs_total", Help: "Write-ahead syncs, held or not, that took 100 ms or more (--wal-hold-processor): a stalling disk; the rounds sync the plain way until one takes less.",
		}, readStat(&m.walStats, func(s wal.Stats) float64 { return float64(s.Stalls) })),
	)
	r.MustRegister(m.Produced, m.Delivered, m.Redelivered, m.Settled, m.AckOutcomes, m.StorageErrors,
		m.HTTPRequests, m.HTTPDuration, m.ConsumeWaiting, m.AuthFailures, m.AuthThrottled, m.FanoutCopied, m.FanoutPaused,
		m.BodyBytesInFlight, m.BodiesRefused, m.Damaged, m.ReplicaRebuilds, m.ReplicasClosed, m.DiskStalled, m.StallHandOvers,
		m.ProducedBytes, m.DeliveredBytes, m.Nacks, m.LeaseExpiries, m.LeasesLate, m.LeasesTooLate, m.LeadershipsTaken, m.RetentionDeleted, m.SyncDuration, m.SyncGroupFiles, m.Forwarded, m.DeletesUnconfirmed, m.DetachesUnconfirmed,
		stateCollector{m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.RemoteChild = newRemoteChildMetrics(r)
	return m
}
