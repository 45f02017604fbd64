"""The opt-in envelope and the retry tiers built on it, all in user space.

The broker stores bytes and decides nothing about retries, dead letters or ids. When an
application wants them it wraps its bodies in an :class:`Envelope`: a small JSON object
carrying a message id (stable across produce retries), an attempt count, string headers
and a W3C trace context. :class:`RetryTiers` uses it to send a failed message to the
right delay tier and finally to a parking (dead-letter) topic, on plain topics.

Wire form (one JSON object, UTF-8)::

    {"narad_envelope": 1, "id": "…", "attempt": 0, "headers": {"k": "v"},
     "traceparent": "00-…" | null, "body": "<base64 of the payload bytes>"}
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
from ._plans import Nack
from .models import Message

if TYPE_CHECKING:
    from ._async import AsyncClient
    from ._sync import Client

__all__ = ["Envelope", "RetryTiers"]

log = logging.getLogger("narad")

VERSION = 1
NOT_BEFORE = "narad-not-before"
"""Header: Unix ms before which a tier's consumer hands the message back."""
LAST_ERROR = "narad-last-error"
"""Header: the error that sent the message to its current tier."""
ORIGIN = "narad-origin"
"""Header: the topic the message was first produced to."""


@dataclass(frozen=True)
class Envelope:
    """Envelope wraps a body with an id, an attempt count, headers and a trace context.

    Produce ``env.encode()``; on the consuming side ``Envelope.decode(msg.body)``.
    ``id`` is made once, before the first produce, so every retry of that produce
    carries the same id and consumers can drop duplicates by it.
    """

    body: bytes
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempt: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    traceparent: str | None = None

    @classmethod
    def wrap(cls, body: Any, *, headers: Mapping[str, str] | None = None,
             traceparent: str | None = None, id: str | None = None) -> Envelope:
        """Wrap makes an envelope for ``body`` (bytes, str or JSON-able, as produce takes)."""
        data, _ = core.encode_body(body)
        kw: dict[str, Any] = {}
        if id is not None:
            kw["id"] = id
        return cls(body=data, headers=dict(headers or {}), traceparent=traceparent, **kw)

    def encode(self) -> bytes:
        """Encode renders the envelope as its JSON wire form."""
        return core.dump_json({
            "narad_envelope": VERSION,
            "id": self.id,
            "attempt": self.attempt,
            "headers": dict(self.headers),
            "traceparent": self.traceparent,
            "body": base64.b64encode(self.body).decode("ascii"),
        })

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        """Decode reads an envelope; raises ValueError when ``data`` is not one."""
        env = cls.try_decode(data)
        if env is None:
            raise ValueError("not a narad envelope")
        return env

    @classmethod
    def try_decode(cls, data: bytes) -> Envelope | None:
        """try_decode reads an envelope, or returns None when ``data`` is not one."""
        if not data.startswith(b"{"):
            return None
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("narad_envelope") != VERSION:
            return None
        try:
            return cls(
                body=base64.b64decode(doc.get("body") or "", validate=True),
                id=str(doc["id"]),
                attempt=int(doc.get("attempt") or 0),
                headers={str(k): str(v) for k, v in (doc.get("headers") or {}).items()},
                traceparent=doc.get("traceparent"),
            )
        except (KeyError, ValueError, TypeError, AttributeError):
            return None

    def json(self) -> Any:
        """Json decodes the wrapped body as JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        """Text decodes the wrapped body as UTF-8."""
        return self.body.decode("utf-8")


@dataclass(frozen=True)
class RetryTiers:
    """RetryTiers routes failed messages through delay tiers to a parking topic.

    With ``RetryTiers("orders", delays=[5, 60])`` a message whose handler fails is
    produced (in an envelope, attempt + 1) to ``orders.retry-1`` to be handled again 5 s
    later, then to ``orders.retry-2`` (60 s), then to ``orders.parked`` for people to
    look at. The tier topics are plain topics: their consumer hands a message back
    (a nack with delay) until its time has come. Create them with :meth:`topics`, and
    consume every topic of :meth:`source_topics` with a handler wrapped by
    :meth:`wrap` (sync) or :meth:`wrap_async`.
    """

    topic: str
    delays: Sequence[float]
    parking: str = ""

    @property
    def parking_topic(self) -> str:
        """parking_topic is where messages go once every tier failed."""
        return self.parking or f"{self.topic}.parked"

    def tier_topic(self, index: int) -> str:
        """tier_topic names tier ``index`` (from 0)."""
        return f"{self.topic}.retry-{index + 1}"

    def topics(self) -> list[str]:
        """Topics lists the topics this helper produces to: every tier, then parking."""
        return [self.tier_topic(i) for i in range(len(self.delays))] + [self.parking_topic]

    def source_topics(self) -> list[str]:
        """source_topics lists the topics to consume: the main topic and every tier."""
        return [self.topic] + [self.tier_topic(i) for i in range(len(self.delays))]

    def plan_failure(self, message: Message, error: BaseException,
                     now_ms: int | None = None) -> tuple[str, bytes]:
        """plan_failure says where a failed message goes next, and its new envelope bytes."""
        env = Envelope.try_decode(message.body)
        if env is None:
            env = Envelope(body=message.body, headers={ORIGIN: message.topic})
        attempt = env.attempt + 1
        headers = dict(env.headers)
        headers[LAST_ERROR] = f"{type(error).__name__}: {error}"[:500]
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if attempt <= len(self.delays):
            dest = self.tier_topic(attempt - 1)
            headers[NOT_BEFORE] = str(now + int(float(self.delays[attempt - 1]) * 1000))
        else:
            dest = self.parking_topic
            headers.pop(NOT_BEFORE, None)
        return dest, replace(env, attempt=attempt, headers=headers).encode()

    @staticmethod
    def due_in(message: Message, now_ms: int | None = None) -> float:
        """due_in is how many seconds remain before ``message`` may be handled (0 when due)."""
        env = Envelope.try_decode(message.body)
        if env is None or NOT_BEFORE not in env.headers:
            return 0.0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        try:
            return max(0.0, (int(env.headers[NOT_BEFORE]) - now) / 1000.0)
        except ValueError:
            return 0.0

    @staticmethod
    def unwrap(message: Message) -> Message:
        """Unwrap returns the message with its envelope's body (unchanged if not wrapped)."""
        env = Envelope.try_decode(message.body)
        return message if env is None else replace(message, body=env.body)

    def wrap(self, client: Client, handler: Callable[[Message], object]
             ) -> Callable[[Message], None]:
        """Wrap makes a sync consumer handler that routes failures through the tiers."""

        def handle(message: Message) -> None:
            wait = self.due_in(message)
            if wait > 0:
                raise Nack(wait, "not due yet")
            try:
                handler(self.unwrap(message))
            except Nack:
                raise
            except Exception as exc:
                dest, body = self.plan_failure(message, exc)
                client.produce(dest, body, content_type="application/json")
                log.info("narad: %s/%d@%d failed (%r); sent to %s", message.topic,
                         message.partition, message.offset, exc, dest)

        return handle

    def wrap_async(self, client: AsyncClient, handler: Callable[[Message], Awaitable[object]]
                   ) -> Callable[[Message], Awaitable[None]]:
        """wrap_async makes an async consumer handler that routes failures through the tiers."""

        async def handle(message: Message) -> None:
            wait = self.due_in(message)
            if wait > 0:
                raise Nack(wait, "not due yet")
            try:
                await handler(self.unwrap(message))
            except Nack:
                raise
            except Exception as exc:
                dest, body = self.plan_failure(message, exc)
                await client.produce(dest, body, content_type="application/json")
                log.info("narad: %s/%d@%d failed (%r); sent to %s", message.topic,
                         message.partition, message.offset, exc, dest)

        return handle
