package cluster

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// planeMetrics are measured by the Plane itself; the transport's counters are read at
// scrape time (Register).
type planeMetrics struct {
	forward *prometheus.HistogramVec
}

func newPlaneMetrics() *planeMetrics {
	return &planeMetrics{forward: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "narad_cluster_forward_duration_seconds",
		Help:    "Control-plane requests sent to another node over the node plane (forwarded metadata writes, read indexes, joins, heartbeats), by result.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"result"})}
}

// observe records one Forward by its result: ok, not_sent, timeout, unavailable,
// unauthenticated or error.
func (m *planeMetrics) observe(d time.Duration, err error) {
	m.forward.WithLabelValues(forwardResult(err)).Observe(d.Seconds())
}

func forwardResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, transport.ErrNotSent):
		return "not_sent"
	case errors.Is(err, transport.ErrTimeout):
		return "timeout"
	case errors.Is(err, transport.ErrUnauthenticated):
		return "unauthenticated"
	case errors.Is(err, transport.ErrPeerUnavailable):
		return "unavailable"
	}
	return "error"
}

// Register adds the node plane's metrics to reg.
func (p *Plane) Register(reg prometheus.Registerer) error {
	stat := func(pick func(transport.Stats) float64) func() float64 {
		return func() float64 { return pick(p.node.Stats()) }
	}
	cs := []prometheus.Collector{
		p.metrics.forward,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_cluster_connections", Help: "Authenticated node-plane connections open now (one per peer, two briefly after simultaneous dials).",
		}, stat(func(s transport.Stats) float64 { return float64(s.Conns) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_cluster_raft_streams", Help: "Raft streams open now on the node plane, both directions.",
		}, stat(func(s transport.Stats) float64 { return float64(s.RaftStreams) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_cluster_message_streams", Help: "Message streams open now on the node plane (kept open for replication frames), both directions.",
		}, stat(func(s transport.Stats) float64 { return float64(s.MessageStreams) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_stream_messages_total", Help: "Messages that came on message streams (replication frames) and were handed to a handler.",
		}, stat(func(s transport.Stats) float64 { return float64(s.MessagesServed) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_dials_total", Help: "Node-plane connection attempts to peers.",
		}, stat(func(s transport.Stats) float64 { return float64(s.Dials) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_dial_failures_total", Help: "Node-plane connection attempts that failed (peer down, unreachable, or failing the handshake).",
		}, stat(func(s transport.Stats) float64 { return float64(s.DialFailures) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_auth_failures_total", Help: "Node-plane handshakes whose cluster-secret proof did not verify, either side: a peer with a wrong secret, or not a node.",
		}, stat(func(s transport.Stats) float64 { return float64(s.AuthFailures) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_handshake_errors_total", Help: "Node-plane handshakes that failed otherwise: timeout, malformed hello, unsupported version, a peer with this node's id.",
		}, stat(func(s transport.Stats) float64 { return float64(s.HandshakeErrors) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_handshakes_refused_total", Help: "Node-plane connections closed at once because too many handshakes were in progress.",
		}, stat(func(s transport.Stats) float64 { return float64(s.HandshakesRefused) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_requests_served_total", Help: "Node-plane requests handed to a handler.",
		}, stat(func(s transport.Stats) float64 { return float64(s.RequestsServed) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_cluster_requests_refused_total", Help: "Node-plane requests refused without a handler run (unknown operation, busy, too large, malformed).",
		}, stat(func(s transport.Stats) float64 { return float64(s.RequestsRefused) })),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// raftStates are the values of narad_control_plane_state's state label.
var raftStates = []string{"Leader", "Follower", "Candidate", "Shutdown"}

// RegisterControlPlane adds the control plane's Raft metrics to reg; state reads them
// at scrape time. A node without a cluster has them too (it leads its cluster of one).
func RegisterControlPlane(reg prometheus.Registerer, state func() meta.RaftState) error {
	cs := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_control_plane_leader_changes_total", Help: "Changes of control-plane leader (controller) this node observed, losing one included.",
		}, func() float64 { return float64(state().LeaderChanges) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "narad_control_plane_lease_lapses_total", Help: "Times this node went a metadata lease (SuspectAfter, 5 s) without a catch-up with the controller and stopped serving until one succeeded.",
		}, func() float64 { return float64(state().LeaseLapses) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_control_plane_term", Help: "This node's current Raft term of the control plane.",
		}, func() float64 { return float64(state().Term) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_control_plane_applied_index", Help: "Index of the last control-plane entry this node applied.",
		}, func() float64 { return float64(state().AppliedIndex) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_control_plane_commit_lag", Help: "Control-plane entries committed but not yet applied on this node.",
		}, func() float64 {
			st := state()
			if st.CommitIndex <= st.AppliedIndex {
				return 0
			}
			return float64(st.CommitIndex - st.AppliedIndex)
		}),
	}
	for _, s := range raftStates {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "narad_control_plane_state", Help: "1 for this node's current control-plane role (Leader: it is the controller), 0 for the others.",
			ConstLabels: prometheus.Labels{"state": s},
		}, func() float64 {
			if state().State == s {
				return 1
			}
			return 0
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
