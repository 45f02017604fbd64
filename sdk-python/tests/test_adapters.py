"""The optional OpenTelemetry and Prometheus adapters on the event hook."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

import narad
import narad.otel
import narad.prometheus
from conftest import Driver, wait_for


def test_otel_spans_for_requests_and_handlers(drv: Driver) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    c = drv.new_client(on_event=narad.otel.TracingHook(provider))
    t = drv.topic()
    c.produce(t, b"x")

    def fail_once(m: narad.Message) -> None:
        if m.delivery_attempt == 1:
            raise RuntimeError("first try fails")

    with c.consume(t, drv.handler(fail_once), wait=1) as con:
        wait_for(lambda: con.stats.acked == 1, what="ack")
    spans = exporter.get_finished_spans()
    produce = [s for s in spans if s.name == f"narad produce {t}"]
    assert produce and produce[0].kind == SpanKind.PRODUCER
    assert produce[0].attributes["messaging.destination.name"] == t
    assert produce[0].attributes["http.response.status_code"] == 202
    assert produce[0].end_time >= produce[0].start_time
    handled = [s for s in spans if s.name == f"narad process {t}"]
    assert [s.status.status_code for s in handled] == [StatusCode.ERROR, StatusCode.UNSET]
    assert handled[1].attributes["narad.delivery_attempt"] == 2
    assert narad.otel.traceparent() is None  # no span is current here


def test_prometheus_counts_events(drv: Driver) -> None:
    reg = CollectorRegistry()
    c = drv.new_client(on_event=narad.prometheus.PrometheusHook(reg, namespace="n"))
    t = drv.topic()
    c.produce_batch(t, [b"1", b"2"])
    with c.consume(t, drv.handler(lambda m: None), wait=1) as con:
        wait_for(lambda: con.stats.acked == 2, what="acks")
    with_labels = reg.get_sample_value
    assert with_labels("n_requests_total", {"op": "produce_batch", "status": "202"}) == 1
    assert with_labels("n_handled_total", {"topic": t, "outcome": "ok"}) == 2
    assert with_labels("n_settles_total", {"topic": t, "op": "ack", "outcome": "acked"}) == 2
    assert (with_labels("n_request_duration_seconds_count", {"op": "produce_batch"}) or 0) >= 1


def test_a_failing_hook_never_breaks_a_call(drv: Driver) -> None:
    def bad(e: narad.Event) -> None:
        raise ValueError("hook bug")

    c = drv.new_client(on_event=bad)
    assert c.list_topics() is not None
