"""Frozen value types shared by the sync and async clients.

Field names follow openapi.yaml, so a message or topic reads the same here, in curl and
in the other SDKs. Topic settings keep the wire's millisecond integers
(``retention_ms``); durations the SDK itself waits for are seconds (``wait=10.0``).
"""

from __future__ import annotations

import base64
import calendar
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from .errors import NaradError

__all__ = [
    "AckResult",
    "Child",
    "ChildLag",
    "ClusterInfo",
    "Event",
    "ForceLeaderResult",
    "Grant",
    "Member",
    "Message",
    "Move",
    "Outgoing",
    "PartitionStats",
    "Position",
    "Produced",
    "TopicInfo",
    "User",
]


@dataclass(frozen=True)
class Message:
    """Message is one message as consumed or replayed.

    ``body`` holds the exact bytes that were produced (the SDK always asks the broker
    for base64 payloads). ``receipt_handle`` and ``delivery_attempt`` are set on a
    leased message and ``None`` on a replayed one. Settle a leased message with
    ``client.ack(msg)``, ``client.nack(msg, delay=...)`` or ``client.extend(msg)``.
    """

    topic: str
    partition: int
    offset: int
    body: bytes
    timestamp: int
    """When the broker wrote it, in Unix milliseconds."""
    key: str | None = None
    receipt_handle: str | None = None
    delivery_attempt: int | None = None
    endpoint: str | None = field(default=None, compare=False, repr=False)
    """The node that leased the message: its acks, nacks and renewals go there first."""

    def text(self, encoding: str = "utf-8") -> str:
        """text decodes the body as text (UTF-8 unless told otherwise)."""
        return self.body.decode(encoding)

    def json(self) -> Any:
        """json decodes the body as JSON; raises ValueError when it is not JSON.

        Also when it nests deeper than Python's decoder recurses: the caller can then
        settle the message (ack, nack) like any other that does not decode.
        """
        try:
            return json.loads(self.body)
        except RecursionError as e:
            raise ValueError("the payload nests too deeply to decode: " + str(e)) from None

    @property
    def time(self) -> datetime:
        """time is ``timestamp`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.timestamp / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class Produced:
    """Produced says where a durable message was written: its partition and offset."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Outgoing:
    """Outgoing is one message to produce with its own key or partition.

    ``body`` is bytes (stored as is), str (stored as UTF-8 text) or any JSON-able value
    (stored as compact JSON). ``partition`` pins a partition; ``key`` hashes to one.
    """

    body: Any
    key: str | None = None
    partition: int | None = None


@dataclass(frozen=True)
class PartitionStats:
    """PartitionStats is the state of one partition, as ``get_topic`` reports it."""

    partition: int
    oldest_offset: int
    next_offset: int
    high_watermark: int
    ack_frontier: int
    acked_ahead: int
    in_flight: int
    backlog: int
    leader: str
    replicas: tuple[str, ...]
    available: bool = True
    """False when the node holding the partition could not be reached: its counters
    above are then unknown and given as 0."""


@dataclass(frozen=True)
class TopicInfo:
    """TopicInfo is a topic's settings; ``partition_stats`` is filled by ``get_topic`` only."""

    name: str
    incarnation: str
    partitions: int
    retention_ms: int
    visibility_timeout_ms: int
    max_in_flight_per_partition: int
    max_acked_ahead_per_partition: int
    replication_factor: int
    created_at: str
    schema: Mapping[str, Any] | None = None
    parent: str | None = None
    fanout_delay_ms: int | None = None
    partition_stats: tuple[PartitionStats, ...] = ()


@dataclass(frozen=True)
class ChildLag:
    """ChildLag is how far a child topic's copy trails its parent in one partition."""

    partition: int
    parent_next_offset: int
    child_cursor: int
    lag: int


@dataclass(frozen=True)
class Child:
    """Child is a fan-out (or, with a delay, a delay) child of a topic, with its lag.

    ``state`` is ``"running"``, or ``"paused"`` while the child's owner may no longer
    consume the parent: nothing is copied until the grant returns, then the copy resumes
    where it stopped, and ``paused_reason`` says why and what to do. A remote child (a
    topic of another cluster) may also be ``"failing"``: its copy fails in some partition
    and is retried. Both are ``None`` from a broker that does not say.
    """

    child: str
    fanout_delay_ms: int
    lag: tuple[ChildLag, ...] = ()
    state: str | None = None
    paused_reason: str | None = None


@dataclass(frozen=True)
class Grant:
    """Grant allows ``action`` (produce, consume, create or admin) on ``topics``.

    Topics are exact names or prefix wildcards such as ``invoices.*``.
    """

    action: str
    topics: tuple[str, ...]


@dataclass(frozen=True)
class User:
    """User is a broker user and its grants (never its password)."""

    username: str
    grants: tuple[Grant, ...] = ()


@dataclass(frozen=True)
class Member:
    """Member is one node of the cluster as the controller sees it.

    ``address`` is the node-to-node address, ``http_address`` the API address.
    ``status`` is ``"alive"``, ``"suspect"``, ``"dead"``, ``"joining"`` or
    ``"decommissioning"``. The optional fields are ``None`` from a broker that does not
    send them.
    """

    id: str
    address: str
    status: str
    http_address: str | None = None
    voter: bool | None = None
    partitions_held: int | None = None
    """How many partition replicas the member holds."""
    partitions_led: int | None = None
    """How many partitions the member leads."""
    min_version: int | None = None
    """The lowest cluster version the member's binary can run in, as it last reported."""
    max_version: int | None = None
    """The highest cluster version the member offers, as it last reported."""


@dataclass(frozen=True)
class ClusterInfo:
    """ClusterInfo is one node's view of its cluster: itself, the controller, the members.

    ``cluster_id`` and ``version`` (the cluster version the controller committed) are
    ``None`` from a broker that does not send them.
    """

    node_id: str
    controller: str
    members: tuple[Member, ...] = ()
    cluster_id: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class Move:
    """Move is a move of one partition replica from one node to another.

    ``from_`` (``from`` on the wire, a Python keyword) is the node whose replica goes,
    ``""`` when a replica is only added (a raised replication factor); ``to`` the node
    that gets one, ``""`` when one is only removed. ``status`` goes ``"copying"`` (the
    only one :meth:`Client.cancel_move` can stop), ``"switching"``, ``"removing"``, then
    ends ``"done"``, ``"cancelled"`` or ``"failed"`` (``reason`` says why). ``cause`` is
    what started it: ``"request"``, ``"decommission"``, ``"replace"``, ``"rebalance"``
    or ``"replication_factor"``.
    """

    id: str
    topic: str
    partition: int
    from_: str
    to: str
    status: str
    cause: str
    progress: float
    """The share (0 to 1) of the partition's log the new replica holds."""
    created_at_ms: int
    """When the move started, in Unix milliseconds."""
    updated_at_ms: int
    """When its status last changed, in Unix milliseconds."""
    reason: str | None = None
    lag: int | None = None
    """While copying, how many messages the new replica is behind; ``None`` otherwise."""

    @property
    def created_at(self) -> datetime:
        """created_at is ``created_at_ms`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.created_at_ms / 1000, tz=timezone.utc)

    @property
    def updated_at(self) -> datetime:
        """updated_at is ``updated_at_ms`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.updated_at_ms / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class ForceLeaderResult:
    """ForceLeaderResult is the outcome of :meth:`Client.force_leader`.

    ``possibly_lost_at_least`` is a lower bound of the messages lost: the highest high
    watermark any replica reported to the control plane minus the log end of the
    replica that took over. More may be lost; 0 proves nothing. ``replicas`` is the
    partition's replica set right after the takeover; the broker grows it back to the
    topic's replication factor through moves.
    """

    possibly_lost_at_least: int
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class AckResult:
    """AckResult is the outcome of settling one receipt handle.

    ``ok`` is True when the broker confirmed it (204), or when a retry of an ack whose
    first reply was lost answered 410 (the first attempt took effect). Otherwise
    ``error`` says why.
    """

    receipt_handle: str
    ok: bool
    error: NaradError | None = None


@dataclass(frozen=True)
class Position:
    """Position is where a replay starts or resumes: per-partition offsets, or a time.

    ``offsets`` maps a partition to the next offset to read. A partition that is not in
    ``offsets`` starts at ``time_ms`` (the first message written at or after it) when
    that is set; at its end as the replay starts when ``at_end`` is set (only messages
    written later are read); else at the oldest retained message. A Replay's
    ``position`` after a message is exactly where to resume; :meth:`dumps` and
    :meth:`loads` persist it, in the JSON form every Narad SDK writes and reads.

    ``incarnation`` is the topic incarnation the offsets belong to. A replay fills it in
    when it starts (from the topic) and sends it with every read, so a topic deleted and
    created again since (its offsets now mean other messages) ends the replay with
    :class:`~narad.Conflict` (code ``incarnation_mismatch``) instead of reading the new
    topic's messages as if they came after the old ones. None (a new position, or one
    saved before positions kept it) takes the topic's incarnation when the replay starts.
    """

    offsets: tuple[tuple[int, int], ...] = ()
    time_ms: int | None = None
    incarnation: str | None = None
    at_end: bool = False

    def __post_init__(self) -> None:
        if self.at_end and self.time_ms is not None:
            raise ValueError("a Position cannot have both time_ms and at_end: partitions "
                             "not named start at one of them")

    @classmethod
    def beginning(cls) -> Position:
        """beginning is the oldest retained message of every partition."""
        return cls()

    @classmethod
    def end(cls) -> Position:
        """end is every partition's end as a replay from it starts: only new messages.

        The replay resolves it when it starts: its ``position`` then names every
        partition it reads at the offset it starts at, so resuming from it misses
        nothing written since.
        """
        return cls(at_end=True)

    @classmethod
    def at_offsets(cls, offsets: Mapping[int, int] | Iterable[tuple[int, int]]) -> Position:
        """at_offsets starts each listed partition at its offset."""
        items = offsets.items() if isinstance(offsets, Mapping) else offsets
        return cls(offsets=tuple(sorted((int(p), int(o)) for p, o in items)))

    @classmethod
    def at_time(cls, when: datetime | float | int) -> Position:
        """at_time starts every partition at the first message written at or after ``when``.

        ``when`` is a datetime (naive means UTC) or Unix milliseconds.
        """
        if isinstance(when, datetime):
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            ms = int(when.timestamp() * 1000)
        else:
            ms = int(when)
        return cls(time_ms=ms)

    def offset(self, partition: int) -> int | None:
        """offset is the next offset to read in ``partition``, or None when not yet known."""
        for p, o in self.offsets:
            if p == partition:
                return o
        return None

    def with_offset(self, partition: int, next_offset: int) -> Position:
        """with_offset returns a copy that resumes ``partition`` at ``next_offset``."""
        rest = [(p, o) for p, o in self.offsets if p != partition]
        rest.append((partition, next_offset))
        return replace(self, offsets=tuple(sorted(rest)))

    def with_incarnation(self, incarnation: str | None) -> Position:
        """with_incarnation returns a copy whose offsets belong to topic ``incarnation``."""
        return replace(self, incarnation=incarnation)

    def dumps(self) -> str:
        """dumps renders the position as the JSON every Narad SDK writes, for a checkpoint.

        ``{"offsets":{"0":12},"time_ms":1733500000000,"incarnation":"42"}``: ``offsets``
        always, in partition order; ``time_ms`` only when set; ``"start":"latest"`` only
        for :meth:`end`; ``incarnation`` only when known (docs/sdk/contract.md, Replay).
        """
        doc: dict[str, Any] = {"offsets": {str(p): o for p, o in sorted(self.offsets)}}
        if self.time_ms is not None:
            doc["time_ms"] = self.time_ms
        if self.at_end:
            doc["start"] = "latest"
        if self.incarnation is not None:
            doc["incarnation"] = self.incarnation
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def loads(cls, text: str | bytes) -> Position:
        """loads reads a position any Narad SDK saved, in the one form or an older one.

        Besides the one form (:meth:`dumps`) it reads the forms the SDKs wrote before
        it: Go's ``"time"`` (RFC 3339) and TypeScript's ``"otherwise"`` (``"earliest"``,
        ``"latest"`` or ``{"time": ms}``). A key given as null counts as absent, other
        keys are ignored. A position without ``incarnation`` loads with None: the replay
        that resumes from it takes the topic's current incarnation. Malformed input (a
        partition or offset that is not an integer from 0, a ``time_ms`` that is not an
        integer, a ``start`` other than ``"latest"``, two keys saying where unnamed
        partitions start) raises ValueError saying what is wrong.
        """
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"a saved position is not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError('a saved position must be a JSON object, like {"offsets":{"0":12}}')
        doc = {k: v for k, v in doc.items() if v is not None}
        raw = doc.get("offsets", {})
        if not isinstance(raw, dict):
            raise ValueError("a saved position's offsets must be an object of partition to "
                             f"offset, not {json.dumps(raw)}")
        offsets: list[tuple[int, int]] = []
        for k, v in raw.items():
            if not _PARTITION.fullmatch(k) or int(k) >= 2**31:
                raise ValueError(f"a saved position names partition {json.dumps(k)}: a "
                                 "partition is a decimal number from 0")
            if not _is_int(v) or v < 0:
                raise ValueError(f"a saved position gives partition {k} the offset "
                                 f"{json.dumps(v)}: an offset is an integer from 0")
            offsets.append((int(k), v))
        starts = [k for k in ("time_ms", "start", "time", "otherwise") if k in doc]
        if len(starts) > 1:
            raise ValueError(f"a saved position has both {' and '.join(map(json.dumps, starts))}"
                             ": partitions not named start at one place")
        time_ms: int | None = None
        at_end = False
        if "time_ms" in doc:
            time_ms = doc["time_ms"]
            if not _is_int(time_ms):
                raise ValueError(f"a saved position's time_ms is {json.dumps(time_ms)}: it is "
                                 "an integer, Unix milliseconds")
        if "start" in doc:
            if doc["start"] != "latest":
                raise ValueError(f"a saved position's start is {json.dumps(doc['start'])}: the "
                                 'only start is "latest" (absent: at time_ms, else the '
                                 "oldest message)")
            at_end = True
        if "time" in doc:
            time_ms = _rfc3339_ms(doc["time"])
        if "otherwise" in doc:
            o = doc["otherwise"]
            if o == "latest":
                at_end = True
            elif isinstance(o, dict) and "time" in o:
                if not _is_int(o["time"]):
                    raise ValueError(f"a saved position's otherwise.time is "
                                     f"{json.dumps(o['time'])}: it is an integer, Unix "
                                     "milliseconds")
                time_ms = o["time"]
            elif o != "earliest":
                raise ValueError(f"a saved position's otherwise is {json.dumps(o)}: it is "
                                 '"earliest", "latest" or {"time": Unix ms}')
        incarnation = doc.get("incarnation")
        if incarnation is not None and not isinstance(incarnation, str):
            raise ValueError(f"a saved position's incarnation is {json.dumps(incarnation)}: "
                             "it is a string")
        return cls(offsets=tuple(sorted(offsets)), time_ms=time_ms,
                   incarnation=incarnation, at_end=at_end)


_PARTITION = re.compile(r"0|[1-9][0-9]*")
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
                      r"(?:[Zz]|([+-])(\d{2}):(\d{2}))")


def _is_int(v: object) -> bool:
    """_is_int says whether a JSON value is an integer that fits 64 bits (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _rfc3339_ms(v: object) -> int:
    """_rfc3339_ms reads an RFC 3339 time (Go's old ``"time"``) as Unix milliseconds."""
    m = _RFC3339.fullmatch(v) if isinstance(v, str) else None
    try:
        if m is None:
            raise ValueError
        y, mo, d, h, mi, s = (int(x) for x in m.group(1, 2, 3, 4, 5, 6))
        secs = calendar.timegm(datetime(y, mo, d, h, mi, s).timetuple())
    except ValueError:
        raise ValueError(f"a saved position's time is {json.dumps(v)}: it is an RFC 3339 "
                         "time") from None
    if m.group(8):
        shift = (int(m.group(9)) * 60 + int(m.group(10))) * 60
        secs -= shift if m.group(8) == "+" else -shift
    return secs * 1000 + int((m.group(7) or "").ljust(3, "0")[:3])


@dataclass(frozen=True)
class Event:
    """Event is what the SDK reports to the ``on_event`` hook of a client.

    Metrics and tracing adapters (``narad.prometheus``, ``narad.otel``) are such hooks.
    Kinds:

    * ``request`` — one HTTP attempt finished (``op``, ``endpoint``, ``status`` or
      ``error``, ``start`` and ``duration``);
    * ``retry`` — a call will be retried after ``delay`` seconds because of ``error``;
    * ``breaker_open`` / ``breaker_close`` — a node left or rejoined the rotation;
    * ``handler`` — a consumer's handler finished; ``outcome`` is ``ok``, ``error``,
      ``cancelled`` or ``abandoned``;
    * ``ack`` — a consumer settled a message; ``outcome`` is ``acked``, ``nacked`` or
      ``failed``;
    * ``lease_lost`` — a held message's lease was lost (its handler is cancelled);
    * ``poll_error`` — a consumer's poll failed and will be retried (or stopped the
      consumer when ``outcome`` is ``terminal``);
    * ``replay_damaged`` — a replay read past a message whose stored record failed its
      checksum: it can never be served and the replay goes on after it;
      ``attributes`` has its ``partition`` and ``offset``.
    """

    kind: str
    op: str = ""
    topic: str | None = None
    endpoint: str | None = None
    status: int | None = None
    error: BaseException | None = None
    outcome: str = ""
    attempt: int = 0
    start: float = 0.0
    """Wall-clock start, Unix seconds (request and handler events)."""
    duration: float = 0.0
    delay: float = 0.0
    message: Message | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)


def b64(data: bytes) -> str:
    """b64 encodes bytes as standard base64 text."""
    return base64.b64encode(data).decode("ascii")
