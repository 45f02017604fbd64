package broker

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
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

	// syncStats reads the node's shared sync group (set by Open in group sync mode).
	syncStats atomic.Pointer[func() vfs.SyncStats]
}

func (m *Metrics) syncStat(pick func(vfs.SyncStats) float64) func() float64 {
	return func() float64 {
		if f := m.syncStats.Load(); f != nil {
			return pick((*f)())
		}
		return 0
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
	}
	r.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_sync_rounds_total", Help: "File-system syncs shared by the partitions with writes waiting (group sync mode).",
		}, m.syncStat(func(s vfs.SyncStats) float64 { return float64(s.Rounds) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_sync_files_total", Help: "Partition files made durable by those rounds; divided by the rounds, how many shared each.",
		}, m.syncStat(func(s vfs.SyncStats) float64 { return float64(s.Files) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_storage_sync_seconds_total", Help: "Time spent in those rounds.",
		}, m.syncStat(func(s vfs.SyncStats) float64 { return s.Time.Seconds() })),
	)
	r.MustRegister(m.Produced, m.Delivered, m.Redelivered, m.Settled, m.AckOutcomes, m.StorageErrors,
		m.HTTPRequests, m.HTTPDuration, m.ConsumeWaiting, m.AuthFailures, m.AuthThrottled, m.FanoutCopied, m.FanoutPaused,
		m.BodyBytesInFlight, m.BodiesRefused, m.Damaged,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
