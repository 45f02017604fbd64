"""Pure bookkeeping behind the consumer, the publisher and replay.

The sync and async versions of Consumer, Publisher and Replay differ only in how they
wait (threads and conditions, or tasks and events); which lease to renew when, what
goes in the next batch and which page to read next are decided here, once.
"""

from __future__ import annotations

import contextvars
import enum
import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from . import _core as core
from .errors import (
    BadRequest,
    Closed,
    Conflict,
    Forbidden,
    LeaseLost,
    NaradError,
    NotFound,
    TooLarge,
    Unauthenticated,
)
from .models import Event, Message, Position, TopicInfo

T = TypeVar("T")

log = logging.getLogger("narad")

RENEW_FRACTION = 0.5
"""A lease is renewed once half its window has passed: safely before two thirds."""


class Nack(Exception):
    """Nack, raised by a consumer's handler, hands the message back after ``delay`` seconds.

    Any other exception hands it back too (after the consumer's ``nack_delay``, by default
    a backoff that grows with the delivery attempt); raise
    Nack to choose the delay per message without logging an error.
    """

    def __init__(self, delay: core.Duration = 0.0, reason: str = "") -> None:
        super().__init__(reason or f"nack with delay {core.seconds(delay)}s")
        self.delay = core.seconds(delay)


class State(enum.Enum):
    """State is where a held message is in its life inside a consumer."""

    PENDING = "pending"
    RUNNING = "running"
    SETTLING = "settling"
    DONE = "done"


class Delivery:
    """Delivery is one message held by a consumer, under a lease the consumer renews.

    A handler reads its own with :func:`narad.current_delivery`. ``cancelled`` is set
    when the lease is lost or the consumer gave up on the handler at shutdown; a sync
    handler that runs long should check it (an async handler is cancelled outright).
    The consumer never acks a delivery whose ``cancelled`` is set.
    """

    def __init__(self, message: Message, leased_at: float, window: float) -> None:
        self.message = message
        self.leased_at = leased_at
        self.renewed_at = leased_at
        self.lease_until = leased_at + window
        self.retry_at = 0.0
        self.state = State.PENDING
        self.lost = False
        self.cancelled = threading.Event()
        self.task: Any = None

    @property
    def attempt(self) -> int:
        """Attempt is the broker's delivery attempt count (1 on the first delivery)."""
        return self.message.delivery_attempt or 1

    def __repr__(self) -> str:
        m = self.message
        return f"Delivery({m.topic}/{m.partition}@{m.offset}, {self.state.value})"


_current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "narad_delivery", default=None
)


def current_delivery() -> Delivery | None:
    """current_delivery is the Delivery whose handler is running here, or None outside one."""
    return _current.get()


def set_current(d: Delivery | None) -> contextvars.Token[Delivery | None]:
    """set_current marks ``d`` as the running delivery of this thread or task."""
    return _current.set(d)


def reset_current(token: contextvars.Token[Delivery | None]) -> None:
    """reset_current undoes set_current."""
    _current.reset(token)


@dataclass(frozen=True)
class ConsumerOptions:
    """ConsumerOptions are a consumer's settings (the defaults of docs/sdk/contract.md)."""

    concurrency: int = 1
    wait: float = 10.0
    renew: bool = True
    max_lease: float = 3600.0
    grace: float = 30.0
    nack_delay: float | None = None
    """None: :func:`poison_backoff` of the delivery attempt."""
    max_deliveries: int = 0
    """0: off. Else a message delivered more often goes to ``dead_letter_topic``."""
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if self.max_deliveries < 0:
            raise ValueError("max_deliveries must be 0 (off) or more")
        if self.max_deliveries and not self.dead_letter_topic:
            raise ValueError("max_deliveries needs a dead_letter_topic: a message delivered "
                             "too often is moved there, never dropped")

    def dead_letters(self, d: Delivery) -> bool:
        """dead_letters tells whether ``d`` was delivered too often and goes to the DLQ."""
        return self.max_deliveries > 0 and d.attempt > self.max_deliveries


@dataclass(frozen=True)
class ConsumerStats:
    """ConsumerStats counts what a consumer did; every message lands in one outcome."""

    received: int = 0
    succeeded: int = 0
    failed: int = 0
    acked: int = 0
    nacked: int = 0
    ack_failed: int = 0
    lease_lost: int = 0
    handed_back: int = 0
    dead_lettered: int = 0
    renewals: int = 0
    poll_errors: int = 0


class Counters:
    """Counters is the mutable, locked side of ConsumerStats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        """Add bumps a counter."""
        with self._lock:
            self._c[name] = self._c.get(name, 0) + n

    def snapshot(self) -> ConsumerStats:
        """Snapshot freezes the counters."""
        with self._lock:
            return ConsumerStats(**self._c)


def is_terminal(err: NaradError) -> bool:
    """is_terminal tells whether a poll error must stop a consumer (SDK rule 7).

    Only 401, 403, 404 (the topic is gone) and a poll the broker will never accept as
    sent (400, 409, 413: terminal by rule 8) do, as in the Go and TypeScript SDKs.
    Anything else, a 500 included (one request hitting a broker bug, or a proxy), is
    reported and the poll retried with backoff.
    """
    return not err.retryable and isinstance(err, (Unauthenticated, Forbidden, NotFound,
                                                  BadRequest, Conflict, TooLarge))


def renewal_lost(err: NaradError | None) -> bool:
    """renewal_lost tells whether a failed renewal means the lease is gone.

    Only a 410, a closed client or an answer that ends the consumer does (401, 403, the
    topic gone, a request refused as sent: :func:`is_terminal`), as in the TypeScript
    SDK. Anything
    else (a 500, a 501, a timeout) says nothing about the lease: the renewal is tried
    again within it, and the lease counts as lost only once its window passed.
    """
    return err is None or isinstance(err, (LeaseLost, Closed)) or is_terminal(err)


class LeaseBook:
    """LeaseBook tracks every held lease and says which to renew and which are gone.

    Lease times are monotonic seconds. A lease is taken as starting when its poll was
    sent (before the broker reserved it), so the local view is never later than the
    broker's.
    """

    def __init__(self, window: float, max_lease: float, renew: bool) -> None:
        self.window = window
        self.max_lease = max_lease
        self.renew = renew
        self._held: dict[str, Delivery] = {}
        self._lock = threading.Lock()

    def add(self, d: Delivery) -> None:
        """Add starts tracking a delivery."""
        with self._lock:
            self._held[d.message.receipt_handle or ""] = d

    def remove(self, d: Delivery) -> None:
        """Remove stops tracking a delivery."""
        with self._lock:
            self._held.pop(d.message.receipt_handle or "", None)

    def held(self) -> list[Delivery]:
        """Held lists the tracked deliveries."""
        with self._lock:
            return list(self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def due(self, now: float) -> tuple[list[Delivery], list[Delivery]]:
        """Due returns (leases to renew now, leases already gone) at ``now``.

        A lease is gone when its window passed without a renewal, which also happens
        once renewing would carry it past ``max_lease``.
        """
        renew: list[Delivery] = []
        gone: list[Delivery] = []
        with self._lock:
            for d in self._held.values():
                if d.state in (State.SETTLING, State.DONE) or d.lost:
                    continue
                if now >= d.lease_until:
                    gone.append(d)
                    continue
                if not self.renew or now < d.retry_at:
                    continue
                if now - d.leased_at + self.window > self.max_lease:
                    continue
                if now >= d.renewed_at + self.window * RENEW_FRACTION:
                    renew.append(d)
        return renew, gone

    def next_check(self, now: float) -> float:
        """next_check is how long to sleep before something may be due (at most 1 s)."""
        best = 1.0
        with self._lock:
            for d in self._held.values():
                if d.state in (State.SETTLING, State.DONE) or d.lost:
                    continue
                at = min(d.lease_until, max(d.retry_at, d.renewed_at + self.window *
                                            RENEW_FRACTION))
                best = min(best, at - now)
        return max(0.005, best)

    def renewed(self, d: Delivery, sent_at: float) -> None:
        """Renewed records a confirmed renewal sent at ``sent_at``."""
        d.renewed_at = sent_at
        d.lease_until = sent_at + self.window

    def renewal_failed(self, d: Delivery, now: float) -> None:
        """renewal_failed schedules another try soon, well within the lease."""
        d.retry_at = now + min(0.25, max(0.01, (d.lease_until - now) / 4))


def renewal_entries(ds: Sequence[Delivery], window: float) -> list[tuple[str, str | None]]:
    """renewal_entries are the ack-batch entries that renew ``ds`` for ``window``."""
    value = core.ms_param(window)
    return [(d.message.receipt_handle or "", value) for d in ds]


# ---------------------------------------------------------------------------
# Publisher batching


@dataclass
class Pending(Generic[T]):
    """Pending is one published message waiting for its batch, with its result slot."""

    entry: dict[str, Any]
    size: int
    future: T
    queued_at: float


@dataclass
class BatchBuffer(Generic[T]):
    """BatchBuffer decides when the buffered messages form a batch and what goes in it."""

    max_batch: int = 100
    max_batch_bytes: int = 1 << 20
    linger: float = 0.005
    max_buffered: int = 10_000
    items: deque[Pending[T]] = field(default_factory=deque)
    bytes: int = 0

    def full(self) -> bool:
        """Full tells whether the bound is reached (publish must wait or fail)."""
        return len(self.items) >= self.max_buffered

    def add(self, p: Pending[T]) -> None:
        """Add queues a message."""
        self.items.append(p)
        self.bytes += p.size

    def wait_time(self, now: float, flushing: bool) -> float | None:
        """wait_time is how long until a batch is due: 0 now, None when empty."""
        if not self.items:
            return None
        if flushing or len(self.items) >= self.max_batch or self.bytes >= self.max_batch_bytes:
            return 0.0
        return max(0.0, self.items[0].queued_at + self.linger - now)

    def take(self) -> list[Pending[T]]:
        """Take removes the next batch: up to max_batch messages and max_batch_bytes."""
        out: list[Pending[T]] = []
        size = 0
        while self.items and len(out) < self.max_batch:
            p = self.items[0]
            if out and size + p.size > self.max_batch_bytes:
                break
            self.items.popleft()
            self.bytes -= p.size
            size += p.size
            out.append(p)
        return out


def split_on_error(err: NaradError, n: int) -> bool:
    """split_on_error: a refused batch of several is resent one by one to find the culprit."""
    return n > 1 and err.status in (400, 413)


# ---------------------------------------------------------------------------
# Replay


@dataclass
class _Cursor:
    partition: int
    offset: int | None
    end: int | None
    done: bool = False


@dataclass(frozen=True)
class Read:
    """Read asks for one page of ``partition``."""

    partition: int
    call: core.Call[core.Page]


@dataclass(frozen=True)
class Sleep:
    """Sleep asks the replay to wait before polling again (following mode)."""

    seconds: float


def incarnation_conflict(topic: str, had: str, now: str | None) -> Conflict:
    """incarnation_conflict is the error that ends a replay of a topic created anew.

    The position's offsets belong to the topic as it was: read in the new topic they
    would name other messages, so nothing is read.
    """
    seen = f" (incarnation {had}, now {now})" if now else f" (incarnation {had})"
    return Conflict(f"replay of {topic}: the topic was deleted and created again since the "
                    f"position was taken{seen}; its offsets mean other messages now. Start "
                    "again from a new position", status=409, code="incarnation_mismatch",
                    retryable=False)


class ReplayPlan:
    """ReplayPlan walks partitions page by page, round robin, from a Position.

    Bounded, it stops at each partition's high watermark as seen when it started
    (``ends``); following, it keeps polling for new messages, sleeping
    ``poll_interval`` after a round that found nothing. ``position`` always says where
    to resume after the last message taken: it never passes a message that was not
    taken, and moves only by read answers, never by the topic's stats. Every read names
    the position's topic incarnation (``incarnation`` when the start has none).
    """

    def __init__(self, topic: str, start: Position, partitions: Iterable[int],
                 ends: dict[int, int] | None, batch: int, poll_interval: float, *,
                 incarnation: str | None = None) -> None:
        self.topic = topic
        self.position = start
        if start.incarnation is None and incarnation is not None:
            self.position = start.with_incarnation(incarnation)
        self.batch = batch
        self.poll_interval = poll_interval
        self._cursors = [
            _Cursor(p, start.offset(p), None if ends is None else ends.get(p, 0))
            for p in partitions
        ]
        self._queue: deque[Message] = deque()
        self._resume: dict[int, int] = {}
        self._turn = 0
        self._round_found = False
        self._round_left = len(self._cursors)

    @classmethod
    def from_topic(cls, info: TopicInfo, start: Position, partitions: Iterable[int] | None,
                   follow: bool, batch: int, poll_interval: float) -> ReplayPlan:
        """from_topic plans a replay of the topic ``info`` describes (from ``get_topic``).

        A bounded replay ends each partition at its high watermark in ``info``; a
        partition ``info`` says cannot be reached has no known end, and is an error
        (:func:`narad._core.replay_topic` reads the topic until it is reachable first).
        A start taken in another incarnation of the topic is a :class:`Conflict`.
        """
        if start.incarnation is not None and start.incarnation != info.incarnation:
            raise incarnation_conflict(info.name, start.incarnation, info.incarnation)
        parts = list(range(info.partitions)) if partitions is None else list(partitions)
        ends: dict[int, int] | None = None
        if not follow:
            err = core.unreachable(info, parts)
            if err is not None:
                raise err
            ends = {s.partition: s.high_watermark for s in info.partition_stats}
        if start.at_end:
            # The partitions the position does not name start at their end: the position
            # names them there from now on, so that resuming it misses nothing.
            unnamed = [p for p in parts if start.offset(p) is None]
            err = core.unreachable(info, unnamed)
            if err is not None:
                raise err
            hw = {s.partition: s.high_watermark for s in info.partition_stats}
            for p in unnamed:
                start = start.with_offset(p, hw.get(p, 0))
            start = replace(start, at_end=False)
        return cls(info.name, start, parts, ends, batch, poll_interval,
                   incarnation=info.incarnation)

    def take(self) -> Message | None:
        """Take returns the next buffered message and moves the position past it."""
        if not self._queue:
            return None
        m = self._queue.popleft()
        after = m.offset + 1
        resume = self._resume.get(m.partition)
        if resume is not None and not any(x.partition == m.partition for x in self._queue):
            # The last message of a page taken whole: its next_offset is past it and past
            # any damaged message the read went by, and skips nothing that can be served.
            after = resume
            del self._resume[m.partition]
        self.position = self.position.with_offset(m.partition, after)
        return m

    def next(self) -> Read | Sleep | None:
        """Next says what to do to get more messages; None when a bounded replay is done."""
        live = [c for c in self._cursors if not c.done]
        if not live:
            return None
        if self._round_left <= 0:
            found = self._round_found
            self._round_found = False
            self._round_left = len(live)
            if not found:
                return Sleep(self.poll_interval)
        c = live[self._turn % len(live)]
        self._turn += 1
        self._round_left -= 1
        limit = self.batch
        if c.end is not None and c.offset is not None:
            limit = max(1, min(limit, c.end - c.offset))
        inc = self.position.incarnation
        if c.offset is None and self.position.time_ms is not None:
            call = core.read_messages(self.topic, c.partition,
                                      from_time_ms=self.position.time_ms, max_messages=limit,
                                      incarnation=inc)
        else:
            call = core.read_messages(self.topic, c.partition, from_offset=c.offset,
                                      max_messages=limit, incarnation=inc)
        return Read(c.partition, call)

    def on_read(self, partition: int, page: core.Page) -> None:
        """on_read takes in a read answer for ``partition``.

        An answer naming another incarnation than the position's (a broker that ignored
        the ``incarnation`` asked for) is a :class:`Conflict`, as its 409 would be.
        """
        had = self.position.incarnation
        if page.incarnation is not None:
            if had is None:
                self.position = self.position.with_incarnation(page.incarnation)
            elif page.incarnation != had:
                raise incarnation_conflict(self.topic, had, page.incarnation)
        self.on_page(partition, page.messages, page.next_offset, page.damaged)

    def incarnation_lost(self, err: NaradError) -> Conflict | None:
        """incarnation_lost is what ends the replay instead of a read's 409 mismatch.

        A read failing with ``incarnation_mismatch`` ends it with a :class:`Conflict`
        that says why (the topic was created anew) and what to do. None for any other
        error, which ends it as it is.
        """
        if isinstance(err, Conflict) and err.code == "incarnation_mismatch":
            return incarnation_conflict(self.topic, self.position.incarnation or "?", None)
        return None

    def on_page(self, partition: int, messages: list[Message], next_offset: int,
                damaged: Sequence[int] = ()) -> None:
        """on_page takes in a page read for ``partition``.

        The cursor moves to ``next_offset``, even when it is lower than where the read
        started (the log ends before it: reading on from there skips nothing written
        later). A bounded replay keeps only the messages below the partition's end; when
        the page went past the end, the position stays after the last message kept (or
        where it was), never at ``next_offset``, which is past messages not returned.
        """
        c = next(x for x in self._cursors if x.partition == partition)
        cut = c.end is not None and next_offset > c.end
        kept = [m for m in messages if c.end is None or m.offset < c.end]
        if kept or damaged:
            # A page that only went past damaged messages made progress too: no sleep.
            self._round_found = True
        self._queue.extend(kept)
        c.offset = next_offset
        self._resume.pop(partition, None)
        if kept and not cut:
            self._resume[partition] = next_offset
        elif not kept and not cut and not any(m.partition == partition for m in self._queue):
            # Nothing returned and nothing past the end: resuming from next_offset loses
            # nothing (it only passes damaged messages, or goes back to the log's end).
            self.position = self.position.with_offset(partition, next_offset)
        if c.end is not None and (next_offset >= c.end or not (messages or damaged)):
            c.done = True


def report_damaged(topic: str, partition: int, offsets: Sequence[int],
                   emit: Callable[[Event], None]) -> None:
    """report_damaged tells the log and the ``on_event`` hook of damaged messages skipped.

    A replay reads past them: they can never be served, and it goes on after them.
    """
    for off in offsets:
        log.warning("narad: replay of %s: partition %d offset %d is damaged (its stored "
                    "record failed its checksum) and was skipped", topic, partition, off)
        emit(Event(kind="replay_damaged", op="read_messages", topic=topic,
                   attributes={"partition": partition, "offset": off}))


def monotonic() -> float:
    """Monotonic is the clock every lease and linger is measured on."""
    return time.monotonic()


def renewal_groups(due: Sequence[Delivery], n: int) -> list[Sequence[Delivery]]:
    """renewal_groups splits leases to renew per issuing node, then into batches of ``n``.

    A lease can only be renewed on the node that issued it.
    """
    out: list[Sequence[Delivery]] = []
    for _, idx in core.by_endpoint(due, lambda d: d.message.endpoint):
        out.extend(chunks([due[i] for i in idx], n))
    return out


def chunks(xs: Sequence[T], n: int) -> list[Sequence[T]]:
    """Chunks splits ``xs`` into slices of at most ``n``."""
    return [xs[i:i + n] for i in range(0, len(xs), n)]


HandlerOutcome = tuple[str, float]
"""("ok", 0) or ("nack", delay)."""


POISON_BASE = 1.0
"""The first default nack delay, in seconds; it doubles per delivery attempt."""
POISON_MAX = 300.0
"""The default nack delay stops growing at five minutes."""


def poison_backoff(attempt: int, rng: Callable[[], float] = random.random) -> float:
    """poison_backoff is the default delay before a failed message comes back.

    ``1 s x 2^(attempt-1)`` capped at 5 min, drawn uniformly from its upper half, so a
    message that always fails comes back ever more slowly instead of about 3,000 times
    a second, and many failing at once do not come back together.
    """
    d = min(POISON_MAX, POISON_BASE * 2.0 ** min(30, max(0, attempt - 1)))
    return d / 2 + float(rng()) * d / 2


def outcome_of(exc: BaseException | None, nack_delay: float | None, attempt: int = 1
               ) -> HandlerOutcome:
    """outcome_of maps how a handler ended to what the consumer does with its message."""
    if exc is None:
        return ("ok", 0.0)
    if isinstance(exc, Nack):
        return ("nack", exc.delay)
    return ("nack", poison_backoff(attempt) if nack_delay is None else nack_delay)


def dead_letter_body(d: Delivery, max_deliveries: int = 0) -> tuple[bytes, str]:
    """dead_letter_body is what goes to the dead-letter topic: the same payload.

    An envelope gets the reason in ``last_error`` (as the Go and TypeScript SDKs write
    it), its ``origin`` when it had none, and headers saying where it came from and how
    often it was delivered; any other payload goes as it was (JSON stays JSON, the rest
    as bytes).
    """
    from .envelope import Envelope

    m = d.message
    env = Envelope.try_decode(m.body)
    if env is not None:
        headers = dict(env.headers)
        headers["narad-dead-letter-from"] = f"{m.topic}/{m.partition}@{m.offset}"
        headers["narad-delivery-attempts"] = str(d.attempt)
        reason = f"delivered {d.attempt} times, over the limit of {max_deliveries}"
        return core.encode_body(replace(env, headers=headers, last_error=reason,
                                        origin=env.origin or m.topic))
    try:
        json.loads(m.body)
    except ValueError:
        return m.body, "application/octet-stream"
    return m.body, "application/json"


def describe(fn: Callable[..., Any]) -> str:
    """Describe names a handler for log lines."""
    return getattr(fn, "__qualname__", None) or repr(fn)
