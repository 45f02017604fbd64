"""Narad: the Python SDK of a durable message broker spoken over plain HTTP.

Two clients with the same methods: :class:`Client` (blocking, thread-safe, worker
threads) and :class:`AsyncClient` (asyncio, worker tasks)::

    import narad

    with narad.Client("http://127.0.0.1:7942") as client:
        client.ensure_topic("jobs")
        client.produce("jobs", {"id": 1})
        with client.consume("jobs", lambda msg: print(msg.json())):
            ...

The SDK logs to ``logging.getLogger("narad")`` and is quiet by default; metrics and
tracing plug into the ``on_event`` hook (``narad.prometheus``, ``narad.otel``).
"""

from __future__ import annotations

import logging

from ._async import AsyncClient, AsyncConsumer, AsyncPublisher, AsyncReplay
from ._plans import ConsumerStats, Delivery, Nack, current_delivery
from ._sync import Client, Consumer, Publisher, Replay
from .envelope import Envelope, RetryTier, RetryTiers
from .errors import (
    BadRequest,
    BufferFull,
    Closed,
    ClusterWarning,
    Conflict,
    Forbidden,
    Internal,
    LeaseLost,
    NaradError,
    NotFound,
    Throttled,
    Timeout,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from .errors import NotImplemented as NotImplemented  # kept out of __all__: see its doc
from .models import (
    AckResult,
    Child,
    ChildLag,
    ClusterInfo,
    Event,
    ForceLeaderResult,
    Grant,
    Member,
    Message,
    Move,
    Outgoing,
    PartitionStats,
    Position,
    Produced,
    TopicInfo,
    User,
)

__version__ = "0.1.0"

__all__ = [
    "AckResult",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncPublisher",
    "AsyncReplay",
    "BadRequest",
    "BufferFull",
    "Child",
    "ChildLag",
    "Client",
    "Closed",
    "ClusterInfo",
    "ClusterWarning",
    "Conflict",
    "Consumer",
    "ConsumerStats",
    "Delivery",
    "Envelope",
    "Event",
    "Forbidden",
    "ForceLeaderResult",
    "Grant",
    "Internal",
    "LeaseLost",
    "Member",
    "Message",
    "Move",
    "Nack",
    "NaradError",
    "NotFound",
    "Outgoing",
    "PartitionStats",
    "Position",
    "Produced",
    "Publisher",
    "Replay",
    "RetryTier",
    "RetryTiers",
    "Throttled",
    "Timeout",
    "TooLarge",
    "TopicInfo",
    "Unauthenticated",
    "Unavailable",
    "User",
    "current_delivery",
]

logging.getLogger("narad").addHandler(logging.NullHandler())
