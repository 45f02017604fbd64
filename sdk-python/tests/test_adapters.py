"""The optional OpenTelemetry and Prometheus adapters on the event hook."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

import narad
import narad.otel
import narad.prometheus
from conftest import Driver, wait_for


def _spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _only(spans: Any, name: str) -> ReadableSpan:
    got = [s for s in spans if s.name == name]
    assert len(got) == 1, [s.name for s in spans]
    span: ReadableSpan = got[0]
    return span


def _produced_in_a_span(provider: TracerProvider) -> tuple[narad.Envelope, Any]:
    """An envelope wrapped inside a producer's span, as a producing service would."""
    with provider.get_tracer("producer").start_as_current_span("send order") as sp:
        env = narad.Envelope.wrap({"order": 7}, traceparent=narad.otel.traceparent())
    return env, sp.get_span_context()


def test_process_span_continues_the_producers_trace() -> None:
    provider, exporter = _spans()
    env, producer = _produced_in_a_span(provider)
    msg = narad.Message("orders", 2, 41, env.encode(), 0, key="k", delivery_attempt=3)
    inside: list[Any] = []

    def handle(m: narad.Message) -> None:
        inside.append(trace.get_current_span().get_span_context())

    narad.otel.traced_handler(handle, tracer_provider=provider)(msg)
    span = _only(exporter.get_finished_spans(), "process orders")
    assert span.kind == trace.SpanKind.CONSUMER
    ctx = span.get_span_context()
    assert ctx is not None and ctx.trace_id == producer.trace_id  # the producer's trace
    assert span.parent is not None and span.parent.span_id == producer.span_id
    assert inside == [ctx]  # the span is current while the handler runs
    attrs = dict(span.attributes or {})
    assert attrs["messaging.system"] == "narad"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == "orders"
    assert attrs["messaging.destination.partition.id"] == "2"
    assert attrs["messaging.narad.message.offset"] == 41
    assert attrs["messaging.narad.message.delivery_attempt"] == 3
    assert attrs["messaging.message.id"] == env.id
    assert span.status.status_code == StatusCode.UNSET


def test_process_span_links_the_context_active_at_delivery() -> None:
    provider, exporter = _spans()
    env, producer = _produced_in_a_span(provider)
    msg = narad.Message("orders", 0, 0, env.encode(), 0)
    with provider.get_tracer("consumer").start_as_current_span("poll") as poll:
        narad.otel.traced_handler(lambda m: None, tracer_provider=provider)(msg)
    span = _only(exporter.get_finished_spans(), "process orders")
    ctx = span.get_span_context()
    assert ctx is not None and ctx.trace_id == producer.trace_id
    assert [lk.context.span_id for lk in span.links] == [poll.get_span_context().span_id]


def test_process_span_without_an_envelope_is_a_child_of_the_active_span() -> None:
    provider, exporter = _spans()
    msg = narad.Message("plain", 0, 5, b"not an envelope", 0)
    with provider.get_tracer("consumer").start_as_current_span("poll") as poll:
        narad.otel.traced_handler(lambda m: None, tracer_provider=provider)(msg)
    span = _only(exporter.get_finished_spans(), "process plain")
    assert span.parent is not None and span.parent.span_id == poll.get_span_context().span_id
    assert "messaging.message.id" not in dict(span.attributes or {})


def test_process_span_marks_a_failure_and_lets_it_through() -> None:
    provider, exporter = _spans()
    msg = narad.Message("orders", 0, 0, b"x", 0)

    def fail(m: narad.Message) -> None:
        raise narad.Conflict("already there", status=409, code="topic_exists")

    with pytest.raises(narad.Conflict):
        narad.otel.traced_handler(fail, tracer_provider=provider)(msg)
    span = _only(exporter.get_finished_spans(), "process orders")
    assert span.status.status_code == StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "topic_exists"
    assert [e.name for e in span.events] == ["exception"]

    def hand_back(m: narad.Message) -> None:
        raise narad.Nack(5, "later")

    with pytest.raises(narad.Nack):
        narad.otel.traced_handler(hand_back, tracer_provider=provider)(msg)
    nacked = exporter.get_finished_spans()[-1]
    assert nacked.status.status_code == StatusCode.UNSET  # a deliberate hand-back
    assert [e.name for e in nacked.events] == ["narad.nack"]


def test_process_span_wraps_an_async_handler() -> None:
    provider, exporter = _spans()
    env, producer = _produced_in_a_span(provider)
    msg = narad.Message("orders", 0, 0, env.encode(), 0)
    inside: list[Any] = []

    async def handle(m: narad.Message) -> None:
        await asyncio.sleep(0)
        inside.append(trace.get_current_span().get_span_context())
        raise ValueError("bad order")

    wrapped = narad.otel.traced_handler(handle, tracer_provider=provider)
    assert asyncio.iscoroutinefunction(wrapped)  # the async consumer takes it as it is
    with pytest.raises(ValueError):
        asyncio.run(wrapped(msg))
    span = _only(exporter.get_finished_spans(), "process orders")
    ctx = span.get_span_context()
    assert ctx is not None and ctx.trace_id == producer.trace_id and inside == [ctx]
    assert span.status.status_code == StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "ValueError"


def test_process_span_through_a_consumer(drv: Driver) -> None:
    provider, exporter = _spans()
    env, producer = _produced_in_a_span(provider)
    t = drv.topic()
    drv.client.produce(t, env)
    if drv.is_async:
        async def handle(m: narad.Message) -> None:
            return None
        h: Any = narad.otel.traced_handler(handle, tracer_provider=provider)
    else:
        h = narad.otel.traced_handler(lambda m: None, tracer_provider=provider)
    with drv.client.consume(t, h, wait=1) as con:
        wait_for(lambda: con.stats.acked == 1, what="ack")
    span = _only(exporter.get_finished_spans(), f"process {t}")
    ctx = span.get_span_context()
    assert ctx is not None and ctx.trace_id == producer.trace_id
    assert dict(span.attributes or {})["messaging.narad.message.delivery_attempt"] == 1


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
