"""OpenTelemetry tracing for the Narad SDK (``pip install narad[otel]``).

Plug :class:`TracingHook` into a client's ``on_event``::

    client = narad.Client(url, on_event=narad.otel.TracingHook())

It records one CLIENT span per HTTP attempt and one CONSUMER span per handler run,
with the messaging attributes of the OpenTelemetry semantic conventions.
:func:`traceparent` gives the current trace context for an :class:`~narad.Envelope`,
so consumers can join the producer's trace.
"""

from __future__ import annotations

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import __version__
from .models import Event

__all__ = ["TracingHook", "traceparent"]


class TracingHook:
    """TracingHook turns SDK events into OpenTelemetry spans.

    Args:
        tracer_provider: The provider to get the tracer from (default: the global one).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("narad", __version__, tracer_provider)

    def __call__(self, event: Event) -> None:
        """Call records the event as a span when it is a request or a handler run."""
        if event.kind == "request":
            name = f"narad {event.op}" + (f" {event.topic}" if event.topic else "")
            kind = SpanKind.PRODUCER if event.op.startswith("produce") else SpanKind.CLIENT
        elif event.kind == "handler":
            name = f"narad process {event.topic}"
            kind = SpanKind.CONSUMER
        else:
            return
        start = int(event.start * 1e9)
        span = self._tracer.start_span(name, kind=kind, start_time=start)
        span.set_attribute("messaging.system", "narad")
        span.set_attribute("messaging.operation.name", event.op)
        if event.topic:
            span.set_attribute("messaging.destination.name", event.topic)
        if event.endpoint:
            span.set_attribute("server.address", event.endpoint)
        if event.status is not None:
            span.set_attribute("http.response.status_code", event.status)
        if event.attempt:
            span.set_attribute("narad.attempt", event.attempt)
        if event.message is not None:
            m = event.message
            span.set_attribute("messaging.destination.partition.id", str(m.partition))
            span.set_attribute("narad.offset", m.offset)
            if m.delivery_attempt is not None:
                span.set_attribute("narad.delivery_attempt", m.delivery_attempt)
        failed = event.error is not None or (event.status is not None and event.status >= 400)
        if event.kind == "handler" and event.outcome in ("cancelled", "abandoned"):
            failed = True
        if failed:
            span.set_status(Status(StatusCode.ERROR, str(event.error or event.outcome or
                                                         event.status)))
            if isinstance(event.error, Exception):
                span.record_exception(event.error)
        span.end(end_time=start + int(event.duration * 1e9))


def traceparent() -> str | None:
    """Traceparent is the current span's W3C trace context, or None outside a span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")
