"""Prometheus metrics for the Narad SDK (``pip install narad[prometheus]``).

Plug :class:`PrometheusHook` into a client's ``on_event``::

    client = narad.Client(url, on_event=narad.prometheus.PrometheusHook())

Metrics (prefix ``narad_`` by default): ``requests_total{op,status}``,
``request_duration_seconds{op}``, ``retries_total{op}``,
``handled_total{topic,outcome}``, ``handler_duration_seconds{topic}``,
``settles_total{topic,op,outcome}``, ``leases_lost_total{topic}``,
``poll_errors_total{topic,outcome}`` and ``breaker_transitions_total{endpoint,state}``.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from .models import Event

__all__ = ["PrometheusHook"]


class PrometheusHook:
    """PrometheusHook counts SDK events into Prometheus metrics.

    Args:
        registry: Where to register the metrics (default: the global registry; make one
            hook per registry).
        namespace: The metric name prefix.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 namespace: str = "narad") -> None:
        reg = REGISTRY if registry is None else registry
        ns = namespace
        self.requests = Counter(f"{ns}_requests_total", "HTTP attempts by operation and status",
                                ["op", "status"], registry=reg)
        self.request_duration = Histogram(f"{ns}_request_duration_seconds",
                                          "HTTP attempt latency", ["op"], registry=reg)
        self.retries = Counter(f"{ns}_retries_total", "Retried calls", ["op"], registry=reg)
        self.handled = Counter(f"{ns}_handled_total", "Handler runs by outcome",
                               ["topic", "outcome"], registry=reg)
        self.handler_duration = Histogram(f"{ns}_handler_duration_seconds",
                                          "Handler run time", ["topic"], registry=reg)
        self.settles = Counter(f"{ns}_settles_total", "Consumer acks and nacks by outcome",
                               ["topic", "op", "outcome"], registry=reg)
        self.leases_lost = Counter(f"{ns}_leases_lost_total", "Leases lost while held",
                                   ["topic"], registry=reg)
        self.poll_errors = Counter(f"{ns}_poll_errors_total", "Failed consumer polls",
                                   ["topic", "outcome"], registry=reg)
        self.breaker = Counter(f"{ns}_breaker_transitions_total",
                               "Nodes leaving (open) or rejoining (close) the rotation",
                               ["endpoint", "state"], registry=reg)

    def __call__(self, event: Event) -> None:
        """Call records one event."""
        k = event.kind
        if k == "request":
            status = str(event.status) if event.status is not None else (
                event.error.code if isinstance(event.error, Exception)
                and hasattr(event.error, "code") else "error")
            self.requests.labels(event.op, status).inc()
            self.request_duration.labels(event.op).observe(event.duration)
        elif k == "retry":
            self.retries.labels(event.op).inc()
        elif k == "handler":
            self.handled.labels(event.topic or "", event.outcome).inc()
            if event.outcome != "abandoned":
                self.handler_duration.labels(event.topic or "").observe(event.duration)
        elif k == "ack":
            self.settles.labels(event.topic or "", event.op, event.outcome).inc()
        elif k == "lease_lost":
            self.leases_lost.labels(event.topic or "").inc()
        elif k == "poll_error":
            self.poll_errors.labels(event.topic or "", event.outcome).inc()
        elif k in ("breaker_open", "breaker_close"):
            self.breaker.labels(event.endpoint or "", k.removeprefix("breaker_")).inc()
