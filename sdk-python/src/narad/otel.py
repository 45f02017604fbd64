"""OpenTelemetry tracing for the Narad SDK (``pip install narad[otel]``).

Plug :class:`TracingHook` into a client's ``on_event``::

    client = narad.Client(url, on_event=narad.otel.TracingHook())

It records one CLIENT span per HTTP attempt and one CONSUMER span per handler run,
with the messaging attributes of the OpenTelemetry semantic conventions.
:func:`traceparent` gives the current trace context for an :class:`~narad.Envelope`,
and :func:`traced_handler` wraps a consumer's handler in a "process" span that
continues the trace the envelope carries, so the consumer's work joins the producer's
trace::

    env = narad.Envelope.wrap(order, traceparent=narad.otel.traceparent())
    client.consume("orders", narad.otel.traced_handler(handle))
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from . import __version__
from ._plans import Nack
from .envelope import Envelope
from .errors import NaradError
from .models import Event, Message

__all__ = ["TracingHook", "traceparent", "traced_handler"]

_R = TypeVar("_R")


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


def _process_attributes(message: Message) -> dict[str, str | int]:
    attrs: dict[str, str | int] = {
        "messaging.system": "narad",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": message.topic,
        "messaging.destination.partition.id": str(message.partition),
        "messaging.narad.message.offset": message.offset,
    }
    if message.delivery_attempt is not None:
        attrs["messaging.narad.message.delivery_attempt"] = message.delivery_attempt
    if message.key is not None:
        attrs["messaging.message.key"] = message.key
    return attrs


def _error_type(exc: BaseException) -> str:
    """_error_type names a failure: the broker's (or the SDK's) code, else the class name."""
    if isinstance(exc, NaradError) and exc.code:
        return exc.code
    return type(exc).__name__


class _Process:
    """_Process starts, makes current and ends one message's process span."""

    def __init__(self, tracer: trace.Tracer, propagator: TextMapPropagator | None,
                 message: Message) -> None:
        attrs = _process_attributes(message)
        active = otel_context.get_current()
        parent = active
        links: list[Link] = []
        env = Envelope.try_decode(message.body)
        if env is not None:
            attrs["messaging.message.id"] = env.id
            remote = _extract(propagator, env, active)
            if remote is not None:
                here = trace.get_current_span(active).get_span_context()
                if here.is_valid:
                    links.append(Link(here))
                parent = remote
        self.span: Span = tracer.start_span(f"process {message.topic}", context=parent,
                                            kind=SpanKind.CONSUMER, attributes=attrs,
                                            links=links)
        self._token = otel_context.attach(trace.set_span_in_context(self.span, parent))

    def end(self, exc: BaseException | None) -> None:
        otel_context.detach(self._token)
        if isinstance(exc, Nack):
            # A deliberate hand-back, not a failure.
            self.span.add_event("narad.nack", {"narad.nack.delay_s": exc.delay})
        elif exc is not None:
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
            self.span.set_attribute("error.type", _error_type(exc))
        self.span.end()


def _extract(propagator: TextMapPropagator | None, env: Envelope,
             active: otel_context.Context) -> otel_context.Context | None:
    """_extract is ``active`` with the envelope's trace context as its remote parent.

    None when the envelope carries no valid trace context (then the span is a child of
    the active context, as for a plain message).
    """
    carrier: dict[str, str] = dict(env.headers)
    if env.traceparent:
        carrier["traceparent"] = env.traceparent
    if env.tracestate:
        carrier["tracestate"] = env.tracestate
    if "traceparent" not in carrier:
        return None
    prop = propagator or propagate.get_global_textmap()
    found = prop.extract(carrier, context=otel_context.Context())
    if not trace.get_current_span(found).get_span_context().is_valid:
        return None
    return prop.extract(carrier, context=active)


@overload
def traced_handler(handler: Callable[[Message], Awaitable[_R]], *,
                   tracer_provider: trace.TracerProvider | None = None,
                   propagator: TextMapPropagator | None = None
                   ) -> Callable[[Message], Awaitable[_R]]: ...


@overload
def traced_handler(handler: Callable[[Message], _R], *,
                   tracer_provider: trace.TracerProvider | None = None,
                   propagator: TextMapPropagator | None = None) -> Callable[[Message], _R]: ...


def traced_handler(handler: Callable[[Message], Any], *,
                   tracer_provider: trace.TracerProvider | None = None,
                   propagator: TextMapPropagator | None = None) -> Callable[[Message], Any]:
    """traced_handler wraps a consumer handler in a "process" span per message.

    The span (kind CONSUMER, the messaging semantic conventions' attributes) is current
    while the handler runs, so the spans it starts and the calls it makes join the
    trace. When the message is an :class:`~narad.Envelope` carrying a ``traceparent``,
    the span continues the producer's trace, linked to the span current at delivery if
    any; otherwise it is a child of the current context. A handler that raises marks the
    span as an error (``error.type`` is the broker's code or the exception's class) and
    the exception goes on to the consumer, which nacks as usual; a
    :class:`~narad.Nack` is recorded as an event, not an error. An ``async def``
    handler gives an ``async def`` wrapper, for the :class:`~narad.AsyncClient`.

    Args:
        handler: The handler to wrap (sync or ``async def``).
        tracer_provider: The provider to get the tracer from (default: the global one).
        propagator: How to read the envelope's trace context (default: the global one,
            W3C trace context and baggage unless configured otherwise).
    """
    tracer = trace.get_tracer("narad", __version__, tracer_provider)
    if inspect.iscoroutinefunction(handler):
        async def run_async(message: Message) -> Any:
            p = _Process(tracer, propagator, message)
            try:
                result = await handler(message)
            except BaseException as exc:
                p.end(exc)
                raise
            p.end(None)
            return result

        return run_async

    def run(message: Message) -> Any:
        p = _Process(tracer, propagator, message)
        try:
            result = handler(message)
        except BaseException as exc:
            p.end(exc)
            raise
        p.end(None)
        return result

    return run
