// Package prometheus exports the Narad Go SDK's client metrics to Prometheus. It plugs
// into the SDK's one event hook, so the core SDK stays free of the dependency:
//
//	m, err := prometheus.New(prom.DefaultRegisterer)
//	c, err := narad.New(endpoints, narad.WithObserver(m.Observe))
//
// Every series is named narad_client_*; labels are the operation, the endpoint, the
// topic and the outcome, never message contents.
package prometheus

import (
	"strconv"

	narad "github.com/narad-mq/narad/sdk-go"
	prom "github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the collectors fed by Observe. Make it with New.
type Metrics struct {
	requests        *prom.CounterVec
	requestDuration *prom.HistogramVec
	retries         *prom.CounterVec
	breakerOpen     *prom.GaugeVec
	produced        *prom.CounterVec
	received        *prom.CounterVec
	processed       *prom.CounterVec
	handlerDuration *prom.HistogramVec
	settled         *prom.CounterVec
	consumerErrors  *prom.CounterVec
	publishBatches  *prom.CounterVec
}

// New makes the collectors and registers them with reg (nil: prometheus.DefaultRegisterer).
func New(reg prom.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prom.DefaultRegisterer
	}
	const ns, sub = "narad", "client"
	m := &Metrics{
		requests: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "HTTP attempts by operation, endpoint and status (\"error\" when no answer arrived)."}, []string{"op", "node", "status"}),
		requestDuration: prom.NewHistogramVec(prom.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
			Help: "Duration of HTTP attempts by operation (long polls included).", Buckets: prom.ExponentialBuckets(0.001, 2, 16)}, []string{"op"}),
		retries: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Retries decided after a failed attempt, by operation."}, []string{"op"}),
		breakerOpen: prom.NewGaugeVec(prom.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "breaker_open",
			Help: "1 while an endpoint's circuit breaker keeps it out of the rotation."}, []string{"node"}),
		produced: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "messages_produced_total",
			Help: "Messages the broker confirmed as durable, by topic."}, []string{"topic"}),
		received: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "messages_received_total",
			Help: "Messages taken under a lease, by topic."}, []string{"topic"}),
		processed: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "messages_processed_total",
			Help: "Handler runs of consumers, by topic and result (ok, error)."}, []string{"topic", "result"}),
		handlerDuration: prom.NewHistogramVec(prom.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "handler_duration_seconds",
			Help: "Duration of handler runs, by topic.", Buckets: prom.ExponentialBuckets(0.001, 2, 18)}, []string{"topic"}),
		settled: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "settlements_total",
			Help: "Settlements made by consumers, by topic and outcome (ack, nack, lost, failed)."}, []string{"topic", "outcome"}),
		consumerErrors: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "consumer_errors_total",
			Help: "Failures consumers survived (terminal=false) or stopped on (terminal=true), by topic."}, []string{"topic", "terminal"}),
		publishBatches: prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Subsystem: sub, Name: "publish_batches_total",
			Help: "Batches sent by publishers, by topic and result (ok, error)."}, []string{"topic", "result"}),
	}
	for _, c := range []prom.Collector{m.requests, m.requestDuration, m.retries, m.breakerOpen, m.produced, m.received,
		m.processed, m.handlerDuration, m.settled, m.consumerErrors, m.publishBatches} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observe records one event; pass it to narad.WithObserver (alone or in narad.Observers).
func (m *Metrics) Observe(e narad.Event) {
	switch e.Kind {
	case narad.EventRequest:
		status := "error"
		if e.Status != 0 {
			status = strconv.Itoa(e.Status)
		}
		m.requests.WithLabelValues(e.Op, e.Node, status).Inc()
		m.requestDuration.WithLabelValues(e.Op).Observe(e.Duration.Seconds())
		if e.Status >= 200 && e.Status < 300 && (e.Op == "produce" || e.Op == "produce-batch") {
			m.produced.WithLabelValues(e.Topic).Add(float64(e.Messages))
		}
	case narad.EventRetry:
		m.retries.WithLabelValues(e.Op).Inc()
	case narad.EventBreakerOpen:
		m.breakerOpen.WithLabelValues(e.Node).Set(1)
	case narad.EventBreakerClose:
		m.breakerOpen.WithLabelValues(e.Node).Set(0)
	case narad.EventReceive:
		m.received.WithLabelValues(e.Topic).Add(float64(e.Messages))
	case narad.EventProcess:
		m.processed.WithLabelValues(e.Topic, result(e.Err)).Inc()
		m.handlerDuration.WithLabelValues(e.Topic).Observe(e.Duration.Seconds())
	case narad.EventSettle:
		m.settled.WithLabelValues(e.Topic, e.Outcome).Inc()
	case narad.EventConsumerError:
		m.consumerErrors.WithLabelValues(e.Topic, strconv.FormatBool(e.Terminal)).Inc()
	case narad.EventPublish:
		m.publishBatches.WithLabelValues(e.Topic, result(e.Err)).Inc()
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
