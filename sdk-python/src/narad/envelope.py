"""The opt-in envelope and the retry tiers built on it, all in user space.

The broker stores bytes and decides nothing about retries, dead letters or ids. When an
application wants them it wraps its bodies in an :class:`Envelope`: a small JSON object
carrying a message id (stable across produce retries), an attempt count, string headers
and a W3C trace context. :class:`RetryTiers` uses it to send a failed message to the
right delay tier and finally to a parking (dead-letter) topic, on plain topics and the
broker's delay children.

The wire form is the one every Narad SDK reads and writes (one JSON object)::

    {"format": "narad.envelope/1", "id": "…", "attempt": 1,
     "headers": {"k": "v"}, "traceparent": "00-…", "tracestate": "…",
     "not_before": 1796072068780, "last_error": "…", "origin": "orders",
     "body": <JSON value> | "body_text": "…" | "body_base64": "…"}

Optional fields are left out when unset; the body goes in ``body`` when it was a JSON
value, ``body_text`` when text, ``body_base64`` when bytes.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from . import _core as core
from ._plans import Nack, current_delivery
from .errors import Conflict
from .models import Message

if TYPE_CHECKING:
    from ._async import AsyncClient, AsyncConsumer
    from ._sync import Client, Consumer

__all__ = ["Envelope", "RetryTier", "RetryTiers"]

log = logging.getLogger("narad")

FORMAT = "narad.envelope/1"
"""The ``format`` marker of an envelope, version 1."""


@dataclass(frozen=True)
class Envelope:
    """Envelope wraps a body with an id, an attempt count, headers and a trace context.

    Produce ``env.encode()`` (or pass the envelope to produce as its body); read one
    back with ``Envelope.decode(msg.body)``. ``id`` is made once, before the first
    produce, so every retry of that produce carries the same id and consumers can drop
    duplicates by it. ``attempt`` counts deliveries from 1; retry tiers count it up.
    ``kind`` is how the body was given (``bytes``, ``text`` or ``json``) and decides
    which body field the wire form uses.
    """

    body: bytes
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    attempt: int = 1
    headers: Mapping[str, str] = field(default_factory=dict)
    traceparent: str | None = None
    tracestate: str | None = None
    not_before: int | None = None
    """Unix ms before which the message should not be handled (retry tiers)."""
    last_error: str | None = None
    origin: str | None = None
    """The topic the message was first produced to."""
    kind: str = "bytes"

    @classmethod
    def wrap(cls, body: Any, *, headers: Mapping[str, str] | None = None,
             traceparent: str | None = None, tracestate: str | None = None,
             id: str | None = None, origin: str | None = None) -> Envelope:
        """Wrap makes an envelope for ``body`` (bytes, str or JSON-able, as produce takes)."""
        data, ctype = core.encode_body(body)
        kind = "json" if ctype.startswith("application/json") else (
            "text" if ctype.startswith("text/") else "bytes")
        kw: dict[str, Any] = {}
        if id is not None:
            kw["id"] = id
        return cls(body=data, headers=dict(headers or {}), traceparent=traceparent,
                   tracestate=tracestate, origin=origin, kind=kind, **kw)

    def encode(self) -> bytes:
        """Encode renders the envelope as its JSON wire form."""
        doc: dict[str, Any] = {"format": FORMAT, "id": self.id, "attempt": self.attempt}
        if self.headers:
            doc["headers"] = dict(self.headers)
        for name in ("traceparent", "tracestate", "not_before", "last_error", "origin"):
            value = getattr(self, name)
            if value is not None:
                doc[name] = value
        if self.kind == "json":
            doc["body"] = json.loads(self.body)
        elif self.kind == "text":
            doc["body_text"] = self.body.decode("utf-8")
        else:
            doc["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return core.dump_json(doc)

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        """Decode reads an envelope; raises ValueError when ``data`` is not one."""
        env = cls.try_decode(data)
        if env is None:
            raise ValueError("not a narad envelope")
        return env

    @classmethod
    def try_decode(cls, data: bytes) -> Envelope | None:
        """try_decode reads an envelope, or returns None when ``data`` is not one.

        Plain messages and envelopes can share a topic: anything that is not a JSON
        object with the envelope's ``format`` is not one.
        """
        if not data.lstrip().startswith(b"{"):
            return None
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            # Nesting deeper than json.loads recurses is not an envelope either; letting
            # RecursionError out would stop a retry-tier consumer on that message for ever.
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return None
        if not isinstance(doc.get("id"), str):
            return None
        try:
            if isinstance(doc.get("body_base64"), str):
                body, kind = base64.b64decode(doc["body_base64"], validate=True), "bytes"
            elif isinstance(doc.get("body_text"), str):
                body, kind = doc["body_text"].encode("utf-8"), "text"
            else:
                body, kind = core.dump_json(doc.get("body")), "json"
            headers = doc.get("headers") or {}
            nb = doc.get("not_before")
            return cls(
                body=body, id=doc["id"],
                attempt=int(doc["attempt"]) if isinstance(doc.get("attempt"), int) else 1,
                headers={str(k): str(v) for k, v in headers.items()},
                traceparent=_str_or_none(doc.get("traceparent")),
                tracestate=_str_or_none(doc.get("tracestate")),
                not_before=int(nb) if isinstance(nb, (int, float)) else None,
                last_error=_str_or_none(doc.get("last_error")),
                origin=_str_or_none(doc.get("origin")),
                kind=kind,
            )
        except (ValueError, TypeError, AttributeError):
            return None

    def __narad_body__(self) -> tuple[bytes, str]:
        """__narad_body__ lets an envelope be passed to produce as the body itself."""
        return self.encode(), "application/json"

    def json(self) -> Any:
        """Json decodes the wrapped body as JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        """Text decodes the wrapped body as UTF-8."""
        return self.body.decode("utf-8")


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@dataclass(frozen=True)
class RetryTier:
    """RetryTier is one delay step of :class:`RetryTiers`.

    ``topic`` is the tier's retry topic: failed messages are produced there and nobody
    consumes it. Its delay child (:attr:`due_topic`) receives each of them ``delay``
    seconds after the broker stored it, and the tier's consumer reads the child. The
    broker does the waiting, in the retry topic's log: a waiting message holds no lease,
    so it takes none of the in-flight slots (``max_in_flight_per_partition``) and
    nothing blocks behind it.
    """

    topic: str
    """The retry topic failed messages are produced to."""
    delay: float
    """Seconds a message waits in this tier (the delay child's fan-out delay)."""
    due: str | None = None
    """The delay child of ``topic`` the tier's consumer reads; ``None``: ``topic + ".due"``."""

    @property
    def due_topic(self) -> str:
        """due_topic is the delay child the tier's consumer reads."""
        return self.due or self.topic + ".due"

    @property
    def delay_ms(self) -> int:
        """delay_ms is the delay in whole milliseconds, as the broker keeps it."""
        return int(core.ms_param(self.delay))


RETRY_RETENTION_MARGIN_MS = 2 * 3600 * 1000
"""A retry topic keeps its messages this long past its delay (the broker wants an hour)."""


@dataclass(frozen=True)
class RetryTiers:
    """RetryTiers routes failed messages through delay tiers to a parking topic.

    ``RetryTiers("orders", [("orders.retry-5s", 5), ("orders.retry-1m", 60)],
    "orders.parked")`` (a tier is a :class:`RetryTier` or a ``(topic, delay seconds)``
    pair): a message whose handler fails on ``orders`` (attempt 1) is produced in an
    envelope to the retry topic ``orders.retry-5s`` with attempt 2 (and ``not_before``
    5 s ahead, for information), and the original is acked. The broker copies it to the
    tier's delay child ``orders.retry-5s.due`` 5 s later; the tier's consumer reads that
    child and runs the same handler, and a failure there moves it to the next tier; a
    failure in the last tier parks it in ``orders.parked`` with its last error. The
    envelope's id stays the same all the way, so handlers can deduplicate.

    Create the topics with :meth:`ensure_topics` and run the consumers with
    :meth:`consume` (or consume every topic of :meth:`source_topics` with a handler made
    by :meth:`wrap`). No message is held leased while it waits: a delayed nack would take
    an in-flight slot for the whole delay and stall the ready messages behind it. The
    topics and envelope are those of the Go and TypeScript SDKs, so they can share them.
    """

    topic: str
    tiers: Sequence[RetryTier | tuple[str, float]]
    """The delay steps in order; a pair is ``RetryTier(topic, delay)``."""
    parking_topic: str

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("RetryTiers needs at least one tier")
        steps = tuple(t if isinstance(t, RetryTier) else RetryTier(t[0], t[1])
                      for t in self.tiers)
        object.__setattr__(self, "tiers", steps)

    @property
    def steps(self) -> tuple[RetryTier, ...]:
        """Steps are the tiers as :class:`RetryTier` values."""
        return tuple(t for t in self.tiers if isinstance(t, RetryTier))

    def topics(self) -> list[str]:
        """Topics lists every topic involved: main, each retry topic and its due topic, parking."""
        out = [self.topic]
        for t in self.steps:
            out += [t.topic, t.due_topic]
        return [*out, self.parking_topic]

    def source_topics(self) -> list[str]:
        """source_topics lists the topics to consume: the main topic and each tier's due topic."""
        return [self.topic] + [t.due_topic for t in self.steps]

    def _plan_topics(self, settings: dict[str, Any]
                     ) -> tuple[list[str], list[tuple[RetryTier, dict[str, Any]]]]:
        """_plan_topics gives the plain topics and each tier with its retry topic's settings."""
        plain = [self.topic, self.parking_topic]
        tiers = []
        for t in self.steps:
            keep = t.delay_ms + RETRY_RETENTION_MARGIN_MS
            given = settings.get("retention_ms")
            tiers.append((t, {**settings, "retention_ms": given if given and given >= keep
                              else keep}))
        return plain, tiers

    def _child_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if k not in ("parent", "fanout_delay_ms")}

    def _check_child(self, tier: RetryTier, info: Any, err: Conflict) -> None:
        """_check_child accepts an existing due topic only when it is the tier's delay child."""
        if info.parent == tier.topic and (info.fanout_delay_ms or 0) == tier.delay_ms:
            return
        raise Conflict(
            f"retry tier {tier.topic}: {tier.due_topic} exists as a child of {info.parent!r} "
            f"with delay {info.fanout_delay_ms or 0} ms, not of {tier.topic!r} with "
            f"{tier.delay_ms} ms; delete it or name another due topic",
            status=err.status, code=err.code) from err

    def ensure_topics(self, client: Client, **settings: Any) -> None:
        """ensure_topics creates the main, parking, retry and due topics that do not exist yet.

        ``settings`` are those of :meth:`Client.create_topic`. A retry topic keeps its
        messages for its delay plus two hours unless ``settings`` keep them longer. A due
        topic that exists but is not its tier's delay child (another parent or delay) is
        refused with :class:`~narad.Conflict`: a delay child keeps the delay it was made with.
        """
        plain, tiers = self._plan_topics(settings)
        for name in plain:
            client.ensure_topic(name, **settings)
        for tier, retry_settings in tiers:
            client.ensure_topic(tier.topic, **retry_settings)
            try:
                client.create_topic(tier.due_topic, parent=tier.topic,
                                    fanout_delay_ms=tier.delay_ms,
                                    **self._child_settings(settings))
            except Conflict as e:
                self._check_child(tier, client.get_topic(tier.due_topic), e)

    async def ensure_topics_async(self, client: AsyncClient, **settings: Any) -> None:
        """ensure_topics_async is :meth:`ensure_topics` for the async client."""
        plain, tiers = self._plan_topics(settings)
        for name in plain:
            await client.ensure_topic(name, **settings)
        for tier, retry_settings in tiers:
            await client.ensure_topic(tier.topic, **retry_settings)
            try:
                await client.create_topic(tier.due_topic, parent=tier.topic,
                                          fanout_delay_ms=tier.delay_ms,
                                          **self._child_settings(settings))
            except Conflict as e:
                self._check_child(tier, await client.get_topic(tier.due_topic), e)

    def envelope_of(self, message: Message) -> Envelope:
        """envelope_of returns a message's envelope, wrapping a plain one as attempt 1."""
        env = Envelope.try_decode(message.body)
        if env is None:
            env = Envelope(body=message.body, origin=message.topic)
        return env

    def plan_failure(self, message: Message, error: BaseException,
                     now_ms: int | None = None) -> tuple[str, Envelope]:
        """plan_failure says where a failed message goes next, and its new envelope."""
        env = self.envelope_of(message)
        last_error = str(error) or type(error).__name__
        origin = env.origin or self.topic
        now = int(time.time() * 1000) if now_ms is None else now_ms
        steps = self.steps
        if 1 <= env.attempt <= len(steps):
            tier = steps[env.attempt - 1]
            nxt = replace(env, attempt=env.attempt + 1, not_before=now + tier.delay_ms,
                          last_error=last_error, origin=origin)
            return tier.topic, nxt
        return self.parking_topic, replace(env, last_error=last_error, origin=origin)

    def due_in(self, message: Message, now_ms: int | None = None) -> float:
        """due_in is how many seconds remain before the envelope's ``not_before`` (0 when due).

        For information only: the handlers of :meth:`wrap` do not hold early messages.
        """
        env = Envelope.try_decode(message.body)
        if env is None or env.not_before is None:
            return 0.0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(0.0, (env.not_before - now) / 1000.0)

    @staticmethod
    def unwrap(message: Message) -> Message:
        """Unwrap returns the message with its envelope's body (unchanged if not wrapped)."""
        env = Envelope.try_decode(message.body)
        return message if env is None else replace(message, body=env.body)

    def route(self, client: Client, message: Message, error: BaseException) -> str:
        """Route sends a failed message on (the caller acks the original); returns where."""
        topic, env = self.plan_failure(message, error)
        client.produce(topic, env, key=message.key)
        return topic

    async def route_async(self, client: AsyncClient, message: Message,
                          error: BaseException) -> str:
        """route_async is :meth:`route` for the async client."""
        topic, env = self.plan_failure(message, error)
        await client.produce(topic, env, key=message.key)
        return topic

    def wrap(self, client: Client, handler: Callable[[Message], object]
             ) -> Callable[[Message], None]:
        """Wrap makes a consumer handler for the main topic and every due topic.

        ``handler`` gets the message with its envelope's body; a failure sends it on to
        the next tier (or parking) and the original is acked. Raising
        :class:`~narad.Nack` still hands it back instead, and so does a failure after the
        lease was lost or the consumer began to stop (it is redelivered as it is). Early
        messages are not held: the waiting is the delay children's.
        """

        def handle(message: Message) -> None:
            try:
                handler(self.unwrap(message))
            except Nack:
                raise
            except Exception as exc:
                d = current_delivery()
                if d is not None and d.cancelled.is_set():
                    raise
                dest = self.route(client, message, exc)
                log.info("narad: %s/%d@%d failed (%r); sent to %s", message.topic,
                         message.partition, message.offset, exc, dest)

        return handle

    def wrap_async(self, client: AsyncClient, handler: Callable[[Message], Awaitable[object]]
                   ) -> Callable[[Message], Awaitable[None]]:
        """wrap_async is :meth:`wrap` for the async client."""

        async def handle(message: Message) -> None:
            try:
                await handler(self.unwrap(message))
            except Nack:
                raise
            except Exception as exc:
                dest = await self.route_async(client, message, exc)
                log.info("narad: %s/%d@%d failed (%r); sent to %s", message.topic,
                         message.partition, message.offset, exc, dest)

        return handle

    def consume(self, client: Client, handler: Callable[[Message], object],
                **options: Any) -> list[Consumer]:
        """Consume starts one consumer on the main topic and one on each due topic.

        Every consumer runs ``handler`` through :meth:`wrap`; ``options`` are those of
        :meth:`Client.consume`. Close the returned consumers to stop (each one drains).
        """
        h = self.wrap(client, handler)
        started: list[Consumer] = []
        try:
            for topic in self.source_topics():
                started.append(client.consume(topic, h, **options))
        except BaseException:
            for con in started:
                con.close()
            raise
        return started

    async def consume_async(self, client: AsyncClient,
                            handler: Callable[[Message], Awaitable[object]],
                            **options: Any) -> list[AsyncConsumer]:
        """consume_async is :meth:`consume` for the async client."""
        h = self.wrap_async(client, handler)
        started: list[AsyncConsumer] = []
        try:
            for topic in self.source_topics():
                started.append(await client.consume(topic, h, **options))
        except BaseException:
            for con in started:
                await con.close()
            raise
        return started
