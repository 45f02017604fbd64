"""The sans-I/O core that the sync and async clients share.

Everything that decides anything lives here and does no I/O: building each request
from its arguments, parsing each answer, mapping errors, choosing an endpoint (with a
per-node circuit breaker), and deciding after each attempt whether to retry, where and
after how long. ``_sync.py`` and ``_async.py`` only move bytes and sleep, in the same
loop shape, so the two clients cannot drift apart in behaviour.
"""

from __future__ import annotations

import base64
import copy
import enum
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from .errors import (
    NOT_STORED_CODES,
    BadRequest,
    NaradError,
    Timeout,
    Unavailable,
    error_from_response,
)
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
    Produced,
    TopicInfo,
    User,
)

T = TypeVar("T")

Duration = float | int | timedelta
"""A duration in seconds, or a timedelta."""

EventHook = Callable[[Event], None]

MAX_WAIT = 20.0
"""The broker caps a long poll at 20 s."""
MAX_EXTEND = 12 * 3600.0
"""The longest lease an ack's ``extend`` may set; the broker refuses longer with 400."""
BREAKER_FAILURES = 2
"""Consecutive failures (refused connection, timeout, lost reply, 503) that open a breaker."""
BREAKER_COOLDOWN = 2.0
"""Seconds an open breaker waits before its first /readyz probe; doubles per failed probe."""
ANSWER_GRACE = 5.0
"""Seconds a consumer's close gives the poll it cut to be answered, whatever its grace:
the broker answers a half-closed poll at once, and what it leased is read and handed
back. A poll unanswered by then (a proxy that does not pass the half-close on) is ended."""


def seconds(d: Duration) -> float:
    """Seconds converts a Duration to float seconds."""
    if isinstance(d, timedelta):
        return d.total_seconds()
    return float(d)


def ms_param(d: Duration) -> str:
    """ms_param renders a duration as whole milliseconds (rounded up) for the API."""
    ms = seconds(d) * 1000.0
    whole = int(ms)
    if whole < ms:
        whole += 1
    return str(max(0, whole))


# ---------------------------------------------------------------------------
# Options


# MAX_RETRY_AFTER bounds how long a Retry-After header can make a retry wait, in seconds.
MAX_RETRY_AFTER = 300.0


@dataclass(frozen=True)
class RetryPolicy:
    """RetryPolicy bounds how a call is retried (the defaults of every Narad SDK).

    ``timeout`` bounds each attempt (a long poll's attempt gets its wait on top), so an
    attempt on a node that accepts connections and never answers ends in time and the
    call fails over. A call's whole budget is ``attempts`` times that, plus backoff.
    """

    attempts: int = 4
    backoff_min: float = 0.05
    backoff_max: float = 5.0
    timeout: float = 30.0
    allow_duplicates: bool = True

    def backoff(self, retry: int, rng: Callable[[], float] = random.random) -> float:
        """Backoff is the full-jitter delay before retry number ``retry`` (from 1)."""
        ceiling = min(self.backoff_max, self.backoff_min * float(2 ** max(0, retry - 1)))
        return max(0.0, float(rng()) * ceiling)


# ---------------------------------------------------------------------------
# Requests and answers


@dataclass(frozen=True)
class Request:
    """Request is one HTTP request, independent of any endpoint."""

    method: str
    path: str
    params: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    content: bytes | None = None


@dataclass(frozen=True)
class Response:
    """Response is the part of an HTTP answer the parsers need (headers lower-cased)."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    endpoint: str = ""
    """The node that answered (leased messages remember it)."""

    def json(self) -> Any:
        """Json decodes the body."""
        return json.loads(self.content)


class Kind(enum.Enum):
    """Kind says what a retry after a lost reply would do."""

    READ = "read"
    """Reads and idempotent writes: always safe to retry."""
    PRODUCE = "produce"
    """May store a second copy: retried after a lost reply only if duplicates are allowed."""
    WRITE = "write"
    """Non-idempotent admin writes: never retried after a lost reply."""


@dataclass(frozen=True)
class Call(Generic[T]):
    """Call is a request plus how to read its answer and how to retry it.

    ``parse`` gets the answer and whether an earlier attempt may have taken effect.
    ``ok_after_lost_reply`` lists statuses that, on a retry whose earlier attempt's
    reply was lost, mean the earlier attempt succeeded (410 for an ack, 404 for a
    delete of a child); ``parse`` then gets a synthetic 204. ``uncertain_after_lost_reply``
    marks a call retried after a lost reply whose error then is uncertain (a topic
    delete naming an incarnation: its 404 or 409 may answer its own earlier attempt).
    ``endpoint`` is where the call must go first: the node that issued a lease, for the
    calls that settle or renew it.
    """

    op: str
    request: Request
    parse: Callable[[Response, bool], T]
    kind: Kind = Kind.READ
    topic: str | None = None
    wait: float = 0.0
    ok_after_lost_reply: frozenset[int] = frozenset()
    endpoint: str | None = None
    uncertain_after_lost_reply: bool = False


# ---------------------------------------------------------------------------
# Endpoints and the per-node circuit breaker


@dataclass
class _Node:
    url: str
    failures: int = 0
    open_until: float | None = None
    cooldown: float = 0.0
    probing: bool = False


class EndpointPool:
    """EndpointPool chooses the node for each attempt and keeps failing ones out a while.

    Calls stick to one node, the first healthy one in the configured order, and move to
    the next only when it fails: spreading calls over nodes that are not one cluster
    would produce to one and settle on another. A call that settles a lease prefers the
    node that issued it (``prefer``). A node opens (leaves the choice) after
    ``threshold`` consecutive failures. Once its cooldown passes it is probed
    (``probes_due``) outside the choice and rejoins when a probe succeeds; each failed
    probe doubles the cooldown up to ``max_cooldown``. When every node is open, the one
    due back soonest is used anyway: a call is never refused locally. A call also passes
    the nodes that asked it to wait (Retry-After, see :meth:`pick`).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        cooldown: float = BREAKER_COOLDOWN,
        max_cooldown: float = 30.0,
        threshold: int = BREAKER_FAILURES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        urls = [normalize_endpoint(e) for e in endpoints]
        if not urls:
            raise ValueError("at least one endpoint is needed")
        self._nodes = [_Node(u) for u in urls]
        self._cooldown = cooldown
        self._max_cooldown = max_cooldown
        self._threshold = max(1, threshold)
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def endpoints(self) -> list[str]:
        """Endpoints lists every endpoint URL, in the order given."""
        return [n.url for n in self._nodes]

    def is_open(self, url: str) -> bool:
        """is_open tells whether ``url`` is out of the choice."""
        with self._lock:
            return self._node(url).open_until is not None

    def pick(self, exclude: Iterable[str] = (), prefer: str | None = None,
             waiting: Mapping[str, float] | None = None) -> str:
        """Pick returns where the next attempt goes.

        ``waiting`` maps the endpoints that asked the call not to come back yet
        (Retry-After) to when they may be called again; they are left out of the choice
        below while another healthy endpoint remains. Among the others: ``prefer`` when it
        is healthy and not in ``exclude``; else the first healthy endpoint in order
        outside ``exclude``; else the first healthy one; else, when every healthy one is
        waiting, the one free soonest; else (all open) the one due back soonest.
        """
        skip = set(exclude)
        wait = dict(waiting or {})
        with self._lock:
            closed = [x for x in self._nodes if x.open_until is None]
            ready = [x for x in closed if x.url not in wait]
            if prefer is not None:
                for x in ready:
                    if x.url == prefer and x.url not in skip:
                        return x.url
            fresh = [x for x in ready if x.url not in skip]
            if fresh or ready:
                return (fresh or ready)[0].url
            if closed:
                return min(closed, key=lambda x: wait[x.url]).url
            return min(self._nodes, key=lambda x: x.open_until or 0.0).url

    def untried(self, exclude: Iterable[str]) -> bool:
        """Untried tells whether a closed endpoint outside ``exclude`` exists."""
        skip = set(exclude)
        with self._lock:
            return any(x.open_until is None and x.url not in skip for x in self._nodes)

    def success(self, url: str) -> bool:
        """Success records an answer from ``url``; True when that closed its breaker."""
        with self._lock:
            node = self._node(url)
            was_open = node.open_until is not None
            node.failures = 0
            node.open_until = None
            node.cooldown = 0.0
            node.probing = False
            return was_open

    def failure(self, url: str) -> bool:
        """Failure records a failed attempt; True when that opened the breaker."""
        with self._lock:
            node = self._node(url)
            node.failures += 1
            if node.open_until is not None:
                return False
            if node.failures >= self._threshold:
                node.cooldown = self._cooldown
                node.open_until = self._clock() + node.cooldown
                return True
            return False

    def probes_due(self) -> list[str]:
        """probes_due returns open endpoints whose cooldown passed, marking them probing."""
        now = self._clock()
        due: list[str] = []
        with self._lock:
            for node in self._nodes:
                if node.open_until is not None and not node.probing and node.open_until <= now:
                    node.probing = True
                    due.append(node.url)
        return due

    def probe_result(self, url: str, ok: bool) -> bool:
        """probe_result records a probe; True when it closed the breaker."""
        if ok:
            return self.success(url)
        with self._lock:
            node = self._node(url)
            node.probing = False
            node.cooldown = min(self._max_cooldown, max(self._cooldown, node.cooldown * 2))
            node.open_until = self._clock() + node.cooldown
            return False

    def _node(self, url: str) -> _Node:
        for node in self._nodes:
            if node.url == url:
                return node
        raise KeyError(url)


def normalize_endpoint(url: str) -> str:
    """normalize_endpoint adds ``http://`` when missing and drops a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


# ---------------------------------------------------------------------------
# The retry state machine


@dataclass(frozen=True)
class Done(Generic[T]):
    """Done ends a call with its value."""

    value: T


@dataclass(frozen=True)
class Retry:
    """Retry asks for another attempt after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True)
class Fail:
    """Fail ends a call with an error."""

    error: NaradError


Step = Done[T] | Retry | Fail


class Transport(enum.Enum):
    """Transport classifies a failure to get an answer."""

    NOT_SENT = "not_sent"
    """Connecting failed: the request certainly did not reach the broker."""
    TIMEOUT = "timeout"
    """The request may have reached the broker; no answer within the bound."""
    LOST = "lost"
    """The connection broke after sending: the request may have taken effect."""


@dataclass
class CallState(Generic[T]):
    """CallState drives one call through its attempts; the I/O layer feeds it outcomes.

    The loop in both clients is: ``url = state.endpoint()``, send with
    ``state.attempt_timeout()``, feed the answer to ``on_response`` or the failure to
    ``on_transport_error``, then return on Done, raise on Fail, sleep on Retry.
    """

    call: Call[T]
    policy: RetryPolicy
    pool: EndpointPool
    emit: Callable[[Event], None]
    timeout: float | None = None
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random
    attempt: int = 0
    maybe_applied: bool = False
    tried: list[str] = field(default_factory=list)
    not_before: dict[str, float] = field(default_factory=dict)
    """Per endpoint, when this call may send to it again (its Retry-After)."""
    deadline: float = 0.0
    _sent_at: float = 0.0
    _wall: float = 0.0

    def __post_init__(self) -> None:
        per_attempt = self.attempt_timeout()
        attempts = max(1, self.policy.attempts)
        self.deadline = (self.clock() + attempts * per_attempt
                         + (attempts - 1) * self.policy.backoff_max)

    def endpoint(self) -> str:
        """Endpoint chooses where the next attempt goes and starts its clock."""
        url = self._choose(self.clock())
        self.tried.append(url)
        self.attempt += 1
        self._sent_at = self.clock()
        self._wall = time.time()
        return url

    def attempt_timeout(self) -> float:
        """attempt_timeout bounds one attempt: the request timeout, plus a long poll's wait.

        Bounding each attempt (not the whole call) is what lets a call leave a node that
        accepts connections and never answers, and fail over to the next one.
        """
        per_attempt = self.policy.timeout if self.timeout is None else self.timeout
        return max(0.05, per_attempt) + self.call.wait

    def expired(self) -> Fail:
        """Expired is the failure for a deadline reached before any attempt finished."""
        return Fail(Timeout(f"{self.call.op}: deadline passed", code="timeout",
                            uncertain=self._uncertain()))

    def on_response(self, url: str, resp: Response) -> Step[T]:
        """on_response decides after an answer."""
        self._report(url, resp.status, None)
        if 200 <= resp.status < 300:
            # Only a 2xx is a success: a 3xx comes from something in front of the broker
            # (which never redirects), and the request never reached it.
            self._closed(url)
            try:
                return Done(self.call.parse(resp, self.maybe_applied))
            except NaradError as refused:
                # The answer is well formed but not usable yet (a replay's topic with a
                # partition that cannot be reached): a retryable refusal is retried like
                # a 503, within the call's attempts and budget. Reads only: a write's
                # 2xx took effect, and repeating it would do it twice.
                if refused.retryable and self.call.kind is Kind.READ:
                    return self._retry(refused, failover=False)
                return Fail(refused)
            except (ValueError, KeyError, TypeError) as exc:
                # A 2xx says the call took effect: for a write (a produce) the unreadable
                # answer leaves it uncertain, never "not done".
                return Fail(NaradError(f"{self.call.op}: unexpected answer: {exc}",
                                       status=resp.status, code="bad_response",
                                       uncertain=self.call.kind is not Kind.READ))
        if self.maybe_applied and resp.status in self.call.ok_after_lost_reply:
            self._closed(url)
            return Done(self.call.parse(Response(204, {}, b""), True))
        err = error_from_response(resp.status, resp.headers, resp.content)
        if err.retry_after is not None:
            # The node said when to come back: this call sends it nothing before then
            # (it goes to another endpoint meanwhile, or waits).
            self.not_before[url] = self.clock() + min(err.retry_after, MAX_RETRY_AFTER)
        node_down = resp.status in (502, 503) and err.code not in ("in_flight_full",
                                                                   "acked_ahead_full")
        if err.partly_stored:
            # Part of a produce-batch is stored: resending it, here or on another node,
            # stores that part twice, whatever allow_duplicates says. It is reported
            # (stored, failed_partitions), never resent.
            if node_down:
                self._opened(url, self.pool.failure(url))
            else:
                self._closed(url)
            return Fail(err)
        if not err.retryable:
            self._closed(url)
            err.uncertain = err.uncertain or self._uncertain()
            return Fail(err)
        if node_down:
            self._opened(url, self.pool.failure(url))
        if self.call.kind is not Kind.READ and (resp.status == 502
                                                or (resp.status == 503 and not err.code)):
            # A 502, or a 503 without the broker's error body, is a proxy's answer: the
            # proxy may have sent the request on and lost the broker's reply, so a
            # produce may be stored (the broker never answers 502; its 503s carry a code).
            err.uncertain = True
        if err.uncertain:
            # The broker could not tell whether it took effect (503 timeout, 504).
            self.maybe_applied = True
            if not self._may_repeat():
                err.uncertain = True
                return Fail(err)
        failover = (err.code in NOT_STORED_CODES or resp.status == 502) and not err.uncertain
        return self._retry(err, failover=failover)

    def on_transport_error(self, url: str, how: Transport, detail: str) -> Step[T]:
        """on_transport_error decides after a failure to get an answer."""
        err: NaradError
        if how is Transport.NOT_SENT:
            err = Unavailable(f"cannot reach {url}: {detail}", code="connection_failed")
            self._opened(url, self.pool.failure(url))
        else:
            self.maybe_applied = True
            if how is Transport.TIMEOUT:
                err = Timeout(f"{self.call.op}: no answer from {url} in time: {detail}",
                              code="timeout")
            else:
                err = Unavailable(f"{self.call.op}: connection to {url} lost: {detail}",
                                  code="connection_lost")
            self._opened(url, self.pool.failure(url))
            err.uncertain = self._uncertain()
        self._report(url, None, err)
        if how is not Transport.NOT_SENT and not self._may_repeat():
            return Fail(err)
        # A timeout moves on to the next node at once too: waiting longer on a node that
        # did not answer within a whole attempt helps nobody.
        return self._retry(err, failover=how is not Transport.LOST)

    # -- helpers

    def _may_repeat(self) -> bool:
        if self.call.kind is Kind.READ:
            return True
        if self.call.kind is Kind.PRODUCE:
            return self.policy.allow_duplicates
        return False

    def _uncertain(self) -> bool:
        return self.maybe_applied and (self.call.kind is not Kind.READ
                                       or bool(self.call.ok_after_lost_reply)
                                       or self.call.uncertain_after_lost_reply)

    def _waiting(self, at: float) -> dict[str, float]:
        return {u: t for u, t in self.not_before.items() if t > at}

    def _choose(self, at: float) -> str:
        return self.pool.pick(self.tried, self.call.endpoint, self._waiting(at))

    def _retry(self, err: NaradError, *, failover: bool) -> Step[T]:
        if self.attempt >= self.policy.attempts:
            err.uncertain = err.uncertain or self._uncertain()
            return Fail(err)
        if failover and self.pool.untried(self.tried):
            delay = 0.0
        else:
            delay = self.policy.backoff(self.attempt, self.rng)
        # A node that answered with Retry-After is not sent this call again before the
        # time it named (bounded, in case of a bogus header), even past the backoff
        # maximum, as the Go and JS SDKs do: the call goes to another endpoint
        # meanwhile, or, when the next one it would use is such a node, waits for it.
        now = self.clock()
        free_at = self.not_before.get(self._choose(now + delay), 0.0)
        delay = max(delay, free_at - now)
        if now + delay >= self.deadline:
            err.uncertain = err.uncertain or self._uncertain()
            return Fail(err)
        self.emit(Event(kind="retry", op=self.call.op, topic=self.call.topic, error=err,
                        attempt=self.attempt, delay=delay))
        return Retry(delay)

    def _report(self, url: str, status: int | None, err: NaradError | None) -> None:
        self.emit(Event(kind="request", op=self.call.op, topic=self.call.topic, endpoint=url,
                        status=status, error=err, attempt=self.attempt, start=self._wall,
                        duration=self.clock() - self._sent_at))

    def _closed(self, url: str) -> None:
        if self.pool.success(url):
            self.emit(Event(kind="breaker_close", endpoint=url))

    def _opened(self, url: str, opened: bool) -> None:
        if opened:
            self.emit(Event(kind="breaker_open", endpoint=url))


# ---------------------------------------------------------------------------
# Bodies


def encode_body(body: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """encode_body turns a produce argument into bytes and a content type.

    bytes (and bytearray, memoryview) are sent as ``application/octet-stream`` and
    come back byte for byte; str as UTF-8 ``text/plain``; anything else as compact
    JSON. An object with a ``__narad_body__()`` method (an Envelope) renders itself. An
    explicit ``content_type`` overrides the choice (bytes are then sent as is).
    """
    render = getattr(body, "__narad_body__", None)
    if callable(render):
        data, ctype = render()
        return bytes(data), content_type or str(ctype)
    if isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes(body)
        ctype = "application/octet-stream"
    elif isinstance(body, str):
        data = body.encode("utf-8")
        ctype = "text/plain; charset=utf-8"
    else:
        data = dump_json(body)
        ctype = "application/json"
    return data, content_type or ctype


def dump_json(value: Any) -> bytes:
    """dump_json is the one JSON encoding the SDK stores: compact, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def batch_entry(item: Any) -> dict[str, Any]:
    """batch_entry renders one produce-batch entry storing the same bytes as produce would."""
    key: str | None = None
    partition: int | None = None
    if isinstance(item, Outgoing):
        key, partition, item = item.key, item.partition, item.body
    entry: dict[str, Any]
    if callable(getattr(item, "__narad_body__", None)):
        data, ctype = encode_body(item)
        if ctype.startswith("application/json"):
            entry = {"payload": json.loads(data)}
        else:
            entry = {"payload": base64.b64encode(data).decode("ascii"),
                     "payload_encoding": "base64"}
    elif isinstance(item, (bytes, bytearray, memoryview, str)):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        entry = {"payload": base64.b64encode(data).decode("ascii"), "payload_encoding": "base64"}
    else:
        entry = {"payload": item}
    if key is not None:
        entry["key"] = key
    if partition is not None:
        entry["partition"] = partition
    return entry


def batch_entry_size(entry: Mapping[str, Any]) -> int:
    """batch_entry_size is the encoded size of one entry, for batching by bytes."""
    return len(dump_json(entry)) + 1


# ---------------------------------------------------------------------------
# Parsers


def parse_message(doc: Mapping[str, Any]) -> Message:
    """parse_message reads a wire Message whatever its payload encoding."""
    payload = doc.get("payload")
    if doc.get("payload_encoding") == "base64":
        body = base64.b64decode(payload or "")
    elif isinstance(payload, str):
        body = payload.encode("utf-8")
    else:
        body = dump_json(payload)
    attempt = doc.get("delivery_attempt")
    return Message(
        topic=str(doc["topic"]),
        partition=int(doc["partition"]),
        offset=int(doc["offset"]),
        body=body,
        timestamp=int(doc["timestamp"]),
        key=doc.get("key"),
        receipt_handle=doc.get("receipt_handle"),
        delivery_attempt=None if attempt is None else int(attempt),
    )


def parse_produced(doc: Mapping[str, Any]) -> Produced:
    """parse_produced reads a wire Produced."""
    return Produced(topic=str(doc["topic"]), partition=int(doc["partition"]),
                    offset=int(doc["offset"]))


def parse_topic(doc: Mapping[str, Any]) -> TopicInfo:
    """parse_topic reads a wire Topic or TopicDetail."""
    stats = tuple(
        PartitionStats(
            partition=int(s["partition"]),
            oldest_offset=int(s["oldest_offset"]),
            next_offset=int(s["next_offset"]),
            high_watermark=int(s["high_watermark"]),
            ack_frontier=int(s["ack_frontier"]),
            acked_ahead=int(s["acked_ahead"]),
            in_flight=int(s["in_flight"]),
            backlog=int(s["backlog"]),
            leader=str(s["leader"]),
            replicas=tuple(str(r) for r in s.get("replicas", [])),
            available=bool(s.get("available", True)),
        )
        for s in doc.get("partition_stats") or []
    )
    delay = doc.get("fanout_delay_ms")
    return TopicInfo(
        name=str(doc["name"]),
        incarnation=str(doc["incarnation"]),
        partitions=int(doc["partitions"]),
        retention_ms=int(doc["retention_ms"]),
        visibility_timeout_ms=int(doc["visibility_timeout_ms"]),
        max_in_flight_per_partition=int(doc["max_in_flight_per_partition"]),
        max_acked_ahead_per_partition=int(doc["max_acked_ahead_per_partition"]),
        replication_factor=int(doc["replication_factor"]),
        created_at=str(doc["created_at"]),
        schema=doc.get("schema"),
        parent=doc.get("parent"),
        fanout_delay_ms=None if delay is None else int(delay),
        partition_stats=stats,
    )


def parse_child(doc: Mapping[str, Any]) -> Child:
    """parse_child reads a wire Child."""
    return Child(
        child=str(doc["child"]),
        fanout_delay_ms=int(doc.get("fanout_delay_ms") or 0),
        lag=tuple(
            ChildLag(partition=int(x["partition"]),
                     parent_next_offset=int(x["parent_next_offset"]),
                     child_cursor=int(x["child_cursor"]), lag=int(x["lag"]))
            for x in doc.get("lag") or []
        ),
        state=None if doc.get("state") is None else str(doc["state"]),
        paused_reason=None if doc.get("paused_reason") is None else str(doc["paused_reason"]),
    )


def parse_user(doc: Mapping[str, Any]) -> User:
    """parse_user reads a wire User."""
    return User(
        username=str(doc["username"]),
        grants=tuple(Grant(action=str(g["action"]), topics=tuple(g.get("topics", [])))
                     for g in doc.get("grants") or []),
    )


def _opt_int(doc: Mapping[str, Any], name: str) -> int | None:
    v = doc.get(name)
    return None if v is None else int(v)


def _opt_str(doc: Mapping[str, Any], name: str) -> str | None:
    v = doc.get(name)
    return None if v is None else str(v)


def parse_member(doc: Mapping[str, Any]) -> Member:
    """parse_member reads a wire Member; fields an older broker leaves out are None."""
    voter = doc.get("voter")
    return Member(
        id=str(doc["id"]),
        address=str(doc["address"]),
        status=str(doc["status"]),
        http_address=_opt_str(doc, "http_address"),
        voter=None if voter is None else bool(voter),
        partitions_held=_opt_int(doc, "partitions_held"),
        partitions_led=_opt_int(doc, "partitions_led"),
        min_version=_opt_int(doc, "min_version"),
        max_version=_opt_int(doc, "max_version"),
    )


def parse_cluster(doc: Mapping[str, Any]) -> ClusterInfo:
    """parse_cluster reads a wire Cluster."""
    return ClusterInfo(
        node_id=str(doc["node_id"]),
        controller=str(doc["controller"]),
        members=tuple(parse_member(m) for m in doc["members"]),
        cluster_id=_opt_str(doc, "cluster_id"),
        version=_opt_int(doc, "version"),
    )


def parse_move(doc: Mapping[str, Any]) -> Move:
    """parse_move reads a wire Move (``from`` becomes ``from_``)."""
    return Move(
        id=str(doc["id"]),
        topic=str(doc["topic"]),
        partition=int(doc["partition"]),
        from_=str(doc["from"]),
        to=str(doc["to"]),
        status=str(doc["status"]),
        cause=str(doc["cause"]),
        progress=float(doc["progress"]),
        created_at_ms=int(doc["created_at_ms"]),
        updated_at_ms=int(doc["updated_at_ms"]),
        reason=_opt_str(doc, "reason"),
        lag=_opt_int(doc, "lag"),
    )


def parse_force_leader(doc: Mapping[str, Any]) -> ForceLeaderResult:
    """parse_force_leader reads a wire ForceLeaderResult."""
    return ForceLeaderResult(
        possibly_lost_at_least=int(doc["possibly_lost_at_least"]),
        replicas=tuple(str(r) for r in doc["replicas"]),
    )


def grants_wire(grants: Iterable[Grant]) -> list[dict[str, Any]]:
    """grants_wire renders grants for a request body."""
    return [{"action": g.action, "topics": list(g.topics)} for g in grants]


# ---------------------------------------------------------------------------
# Calls: one builder per operation of openapi.yaml


def _t(topic: str) -> str:
    if not topic:
        raise BadRequest("a topic name is needed", code="invalid_name")
    return quote(topic, safe="")


def _json_req(method: str, path: str, body: Any, params: tuple[tuple[str, str], ...] = ()
              ) -> Request:
    return Request(method, path, params, (("content-type", "application/json"),),
                   dump_json(body))


def _none(resp: Response, maybe: bool) -> None:
    return None


def produce(topic: str, body: Any, *, key: str | None = None, partition: int | None = None,
            content_type: str | None = None) -> Call[Produced]:
    """Produce builds POST /v1/topics/{t}/produce."""
    data, ctype = encode_body(body, content_type)
    params: list[tuple[str, str]] = []
    if key is not None:
        params.append(("key", key))
    if partition is not None:
        params.append(("partition", str(partition)))
    req = Request("POST", f"/v1/topics/{_t(topic)}/produce", tuple(params),
                  (("content-type", ctype),), data)
    return Call("produce", req, lambda r, m: parse_produced(r.json()), Kind.PRODUCE, topic)


MAX_BATCH = 1000
"""The most messages of a produce-batch, or entries of an ack-batch, in one request; the
broker refuses a larger batch whole (400)."""
MAX_BATCH_BYTES = 7 << 20
"""The most bytes of entries a produce-batch request carries (the broker's limit on the
body is 8 MiB; the Go SDK keeps the same margin)."""


def produce_batch(topic: str, items: Iterable[Any]) -> Call[list[Produced]]:
    """produce_batch builds POST /v1/topics/{t}/produce-batch, for one request's items."""
    entries = batch_entries(items)
    return produce_entries(topic, entries)


def batch_entries(items: Iterable[Any]) -> list[dict[str, Any]]:
    """batch_entries renders a produce_batch's items; at least one is needed."""
    entries = [batch_entry(i) for i in items]
    if not entries:
        raise BadRequest("produce_batch needs at least one message", code="bad_request")
    return entries


def batch_chunks(entries: Sequence[Mapping[str, Any]], max_items: int = MAX_BATCH,
                 max_bytes: int = MAX_BATCH_BYTES) -> list[list[int]]:
    """batch_chunks splits a produce_batch into requests the broker accepts, in order.

    Each holds at most ``max_items`` entries and ``max_bytes`` of them (an entry larger
    than that alone goes in its own request, which the broker answers with 413).
    """
    out: list[list[int]] = []
    chunk: list[int] = []
    size = 0
    for i, entry in enumerate(entries):
        n = batch_entry_size(entry)
        if chunk and (len(chunk) >= max_items or size + n > max_bytes):
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(i)
        size += n
    if chunk:
        out.append(chunk)
    return out


def batch_produced(results: Sequence[Produced | NaradError | None]) -> list[Produced]:
    """batch_produced ends a produce_batch sent as one or more requests.

    All stored: where each message went, in order. Otherwise it raises the first
    failure with ``results`` set: per message, its Produced or the error of its request,
    so a batch that failed in part never hides which part was stored.
    """
    out: list[Produced | NaradError] = [
        NaradError("produce_batch: the broker answered fewer results than messages",
                   code="bad_response", uncertain=True) if r is None else r
        for r in results]
    failed = [r for r in out if isinstance(r, NaradError)]
    if not failed:
        return [r for r in out if isinstance(r, Produced)]
    # The raised error's flags describe the whole call: when some messages were stored
    # (or some request's outcome is unknown), sending the batch again whole would store
    # them twice, so it is uncertain and not retryable. Each result keeps its own error.
    stored = len(out) - len(failed)
    first = failed[0]
    retryable = stored == 0 and all(e.retryable for e in failed)
    uncertain = stored > 0 or any(e.uncertain for e in failed)
    if (retryable, uncertain) != (first.retryable, first.uncertain):
        first = copy.copy(first)
        first.retryable, first.uncertain = retryable, uncertain
    first.results = out
    raise first


def produce_entries(topic: str, entries: list[dict[str, Any]]) -> Call[list[Produced]]:
    """produce_entries builds a produce-batch call from rendered entries."""
    req = _json_req("POST", f"/v1/topics/{_t(topic)}/produce-batch", {"messages": entries})
    return Call("produce_batch", req,
                lambda r, m: [parse_produced(x) for x in r.json()["results"]],
                Kind.PRODUCE, topic)


def _messages_or_empty(resp: Response, many: bool) -> list[Message]:
    if resp.status == 204 or not resp.content:
        return []
    doc = resp.json()
    docs = doc["messages"] if many else [doc]
    # Each leased message remembers the node that leased it: only that node holds the
    # lease, so its acks, nacks and renewals go there.
    return [replace(parse_message(x), endpoint=resp.endpoint or None) for x in docs]


def receive(topic: str, *, max_messages: int = 1, wait: Duration = 10.0) -> Call[list[Message]]:
    """Receive builds consume (one) or consume-batch (many): messages under leases."""
    w = min(MAX_WAIT, max(0.0, seconds(wait)))
    params: list[tuple[str, str]] = [("wait", ms_param(w) + "ms"), ("payload_encoding", "base64")]
    if max_messages < 1:
        raise BadRequest("max_messages must be at least 1", code="invalid_parameter")
    if max_messages == 1:
        req = Request("GET", f"/v1/topics/{_t(topic)}/consume", tuple(params))
        return Call("consume", req, lambda r, m: _messages_or_empty(r, False), Kind.READ,
                    topic, wait=w)
    params.insert(0, ("max", str(max_messages)))
    req = Request("GET", f"/v1/topics/{_t(topic)}/consume-batch", tuple(params))
    return Call("consume_batch", req, lambda r, m: _messages_or_empty(r, True), Kind.READ,
                topic, wait=w)


def handle_of(msg: Message | str) -> str:
    """handle_of returns the receipt handle of a leased message (or a handle as given)."""
    if isinstance(msg, str):
        return msg
    if not msg.receipt_handle:
        raise BadRequest("this message holds no lease (a replayed message cannot be acked)",
                         code="invalid_receipt_handle")
    return msg.receipt_handle


def endpoint_of(msg: Message | str) -> str | None:
    """endpoint_of is the node that leased ``msg`` (None for a bare receipt handle)."""
    return msg.endpoint if isinstance(msg, Message) else None


def topic_of(msg: Message | str, topic: str | None) -> str:
    """topic_of returns the topic a settle call goes to."""
    if topic:
        return topic
    if isinstance(msg, Message):
        return msg.topic
    raise BadRequest("a topic is needed to settle a bare receipt handle", code="bad_request")


def ack(topic: str, handle: str, endpoint: str | None = None) -> Call[None]:
    """Ack builds an ack: a 410 after a lost reply means the first attempt settled it.

    ``endpoint`` (the node that leased the message) gets it first, as for every call
    that settles or renews a lease.
    """
    req = Request("POST", f"/v1/topics/{_t(topic)}/ack", (("receipt_handle", handle),))
    return Call("ack", req, _none, Kind.READ, topic, ok_after_lost_reply=frozenset({410}),
                endpoint=endpoint)


def nack(topic: str, handle: str, delay: Duration = 0.0, endpoint: str | None = None
         ) -> Call[None]:
    """Nack hands a message back, at once (extend=0) or after ``delay`` (extend=<ms>).

    Either way, a 410 on a retry whose earlier attempt's reply was lost counts as done,
    as the Go and TypeScript SDKs count it: that earlier attempt's outcome is unknown,
    and the message comes back in any case.
    """
    d = seconds(delay)
    value = "0" if d <= 0 else ms_param(min(d, MAX_EXTEND))
    req = Request("POST", f"/v1/topics/{_t(topic)}/ack",
                  (("receipt_handle", handle), ("extend", value)))
    return Call("nack", req, _none, Kind.READ, topic, ok_after_lost_reply=frozenset({410}),
                endpoint=endpoint)


def extend(topic: str, handle: str, duration: Duration | None = None,
           endpoint: str | None = None) -> Call[None]:
    """Extend renews a lease: for the topic's visibility timeout, or ``duration`` from now."""
    value = "true" if duration is None else ms_param(min(seconds(duration), MAX_EXTEND))
    if value == "0":
        raise BadRequest("extend needs a positive duration (use nack to hand back)",
                         code="invalid_parameter")
    req = Request("POST", f"/v1/topics/{_t(topic)}/ack",
                  (("receipt_handle", handle), ("extend", value)))
    return Call("extend", req, _none, Kind.READ, topic, endpoint=endpoint)


def by_endpoint(items: Sequence[T], endpoint: Callable[[T], str | None]
                ) -> list[tuple[str | None, list[int]]]:
    """by_endpoint groups item indexes by the node that leased them, in first-seen order.

    An ack-batch must go to the node that issued its leases, so a batch whose messages
    came from several nodes is split into one request per node.
    """
    groups: dict[str | None, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(endpoint(item), []).append(i)
    return list(groups.items())


def ack_batch(topic: str, entries: Sequence[tuple[str, str | None]],
              endpoint: str | None = None, maybe_settled: Iterable[str] = ()
              ) -> Call[list[AckResult]]:
    """ack_batch settles or renews many handles; entries are (handle, extend or None).

    Every handle must come from ``endpoint`` (see :func:`by_endpoint`). A 410 answering
    a settling entry counts as settled when an earlier attempt of this request lost its
    reply, or when the handle is in ``maybe_settled`` (an earlier request answered it
    ``503 timeout``). An entry that failed retryably after a lost reply is marked
    ``uncertain``: that lost attempt may have settled it.
    """
    settled_before = frozenset(maybe_settled)
    if not entries:
        raise BadRequest("ack_batch needs at least one entry", code="bad_request")
    body = {"acks": [{"receipt_handle": h, **({"extend": e} if e is not None else {})}
                     for h, e in entries]}
    settling = {h for h, e in entries if e is None or e == "0"}

    def parse(resp: Response, maybe: bool) -> list[AckResult]:
        out: list[AckResult] = []
        for x in resp.json()["results"]:
            h = str(x["receipt_handle"])
            status = int(x["status"])
            if status == 204 or (status == 410 and h in settling
                                 and (maybe or h in settled_before)):
                out.append(AckResult(h, True))
                continue
            e = x.get("error") or {}
            body = json.dumps({"error": e}).encode()
            err = error_from_response(status, {}, body)
            if maybe and err.retryable:
                err.uncertain = True
            out.append(AckResult(h, False, err))
        return out

    return Call("ack_batch", _json_req("POST", f"/v1/topics/{_t(topic)}/ack-batch", body),
                parse, Kind.READ, topic, endpoint=endpoint)


ACK_ENTRY_RETRY_AFTER = 1.0
"""The least wait before resending ack-batch entries answered 503: an entry's result has
no Retry-After of its own, and the broker's 503s ask for 1 s (as the Go SDK waits)."""
ACK_ENTRY_ROUNDS = 6
"""The least number of requests an ack-batch entry answered 503 gets (Go's too)."""


@dataclass
class _AckRound:
    endpoint: str | None
    idx: list[int]
    round: int = 1
    delay: float = 0.0
    maybe_settled: frozenset[str] = frozenset()


class AckBatchPlan:
    """AckBatchPlan drives a public ack_batch: its requests, retries and per-item results.

    The messages are grouped by the node that leased them, and each group is sent in
    requests of at most :data:`MAX_BATCH` entries. Entries answered 503 (or another
    retryable answer) are sent again, alone, after a backoff of at least
    :data:`ACK_ENTRY_RETRY_AFTER`, up to ``max(attempts, ACK_ENTRY_ROUNDS)`` requests
    (SDK rule 2: a settle is retried on 503); one answered ``503 timeout`` may have been
    settled, so a 410 on its retry counts as done. A request that fails whole gives its
    error to each of its entries; :meth:`results` raises it only when no request was
    answered at all.

    The loop is: ``while (step := plan.next())``: sleep ``step[0]``, run ``step[1]``,
    then feed :meth:`on_results` or :meth:`on_error`.
    """

    def __init__(self, topic: str, items: Sequence[Message | str], policy: RetryPolicy,
                 rng: Callable[[], float] = random.random) -> None:
        self.topic = topic
        self._handles = [handle_of(m) for m in items]
        self._policy = policy
        self._rng = rng
        self._rounds = max(policy.attempts, ACK_ENTRY_ROUNDS)
        self._out: list[AckResult | None] = [None] * len(items)
        self._todo = [_AckRound(ep, idx[i:i + MAX_BATCH])
                      for ep, idx in by_endpoint(items, endpoint_of)
                      for i in range(0, len(idx), MAX_BATCH)]
        self._current: _AckRound | None = None
        self._answered = False
        self._error: NaradError | None = None

    def next(self) -> tuple[float, Call[list[AckResult]]] | None:
        """Next is (seconds to wait first, the request) of the next request; None when done."""
        if not self._todo:
            return None
        r = self._current = self._todo.pop(0)
        call = ack_batch(self.topic, [(self._handles[i], None) for i in r.idx], r.endpoint,
                         r.maybe_settled)
        return r.delay, call

    def on_results(self, results: Sequence[AckResult]) -> None:
        """on_results takes in the answer of the last request."""
        r = self._current
        if r is None:
            return
        self._answered = True
        again: list[int] = []
        maybe = set(r.maybe_settled)
        for i, res in zip(r.idx, results, strict=False):
            self._out[i] = res
            if not res.ok and res.error is not None and res.error.retryable:
                again.append(i)
                if res.error.uncertain:
                    maybe.add(res.receipt_handle)
        if again and r.round < self._rounds:
            delay = max(ACK_ENTRY_RETRY_AFTER, self._policy.backoff(r.round, self._rng))
            self._todo.insert(0, _AckRound(r.endpoint, again, r.round + 1, delay,
                                           frozenset(maybe)))

    def on_error(self, err: NaradError) -> None:
        """on_error takes in a request that failed whole (after its own retries)."""
        r = self._current
        if r is None:
            return
        for i in r.idx:
            self._out[i] = AckResult(self._handles[i], False, err)
        if self._error is None:
            self._error = err

    def results(self) -> list[AckResult]:
        """Results is one AckResult per message, in order.

        Raises the first request's error when no request was answered: then nothing of
        the batch is known to be settled, as when a single request fails.
        """
        if not self._answered and self._error is not None:
            raise self._error
        return [AckResult(h, False, NaradError(
                    "ack_batch: the broker answered no result for this entry",
                    code="bad_response")) if r is None else r
                for h, r in zip(self._handles, self._out, strict=True)]


@dataclass(frozen=True)
class Page:
    """Page is one answer of a replay read.

    ``next_offset`` is where to continue (lower than the offset asked for when the log
    ends before it); ``incarnation`` the topic incarnation read (None from a broker that
    does not send it); ``damaged`` the offsets of messages whose stored record failed its
    checksum, which the read went past (they can never be served).
    """

    messages: list[Message]
    next_offset: int
    incarnation: str | None = None
    damaged: tuple[int, ...] = ()


def read_messages(topic: str, partition: int, *, from_offset: int | None = None,
                  from_time_ms: int | None = None, max_messages: int = 100,
                  incarnation: str | None = None) -> Call[Page]:
    """read_messages builds a replay read of one partition.

    With ``incarnation``, a topic deleted and created again since answers 409
    ``incarnation_mismatch`` instead of the new topic's messages.
    """
    params: list[tuple[str, str]] = [("max", str(max_messages)), ("payload_encoding", "base64")]
    if from_offset is not None:
        params.append(("from", str(from_offset)))
    elif from_time_ms is not None:
        params.append(("from_time", str(from_time_ms)))
    if incarnation is not None:
        params.append(("incarnation", incarnation))

    def parse(resp: Response, maybe: bool) -> Page:
        doc = resp.json()
        inc = doc.get("incarnation")
        return Page([parse_message(x) for x in doc["messages"]], int(doc["next_offset"]),
                    None if inc is None else str(inc),
                    tuple(int(o) for o in doc.get("damaged") or ()))

    req = Request("GET", f"/v1/topics/{_t(topic)}/partitions/{int(partition)}/messages",
                  tuple(params))
    return Call("read_messages", req, parse, Kind.READ, topic)


def _settings(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def create_topic(name: str, settings: Mapping[str, Any]) -> Call[TopicInfo]:
    """create_topic builds POST /v1/topics (201)."""
    body = {"name": name, **{k: v for k, v in settings.items() if v is not None}}
    return Call("create_topic", _json_req("POST", "/v1/topics", body),
                lambda r, m: parse_topic(r.json()), Kind.WRITE, name)


def list_topics() -> Call[list[TopicInfo]]:
    """list_topics builds GET /v1/topics."""
    return Call("list_topics", Request("GET", "/v1/topics"),
                lambda r, m: [parse_topic(x) for x in r.json()["topics"]])


def get_topic(name: str) -> Call[TopicInfo]:
    """get_topic builds GET /v1/topics/{t}."""
    return Call("get_topic", Request("GET", f"/v1/topics/{_t(name)}"),
                lambda r, m: parse_topic(r.json()), Kind.READ, name)


def unreachable(info: TopicInfo, partitions: Iterable[int] | None) -> Unavailable | None:
    """unreachable names the partitions that ``info`` says cannot be reached, or is None.

    Only ``partitions`` count (all when None). The stats of such a partition are given
    as 0 and say nothing about where it ends.
    """
    wanted = set(range(info.partitions) if partitions is None else partitions)
    down = sorted(s.partition for s in info.partition_stats
                  if not s.available and s.partition in wanted)
    if not down:
        return None
    which = ", ".join(str(p) for p in down)
    return Unavailable(f"replay of {info.name}: partition{'s' if len(down) > 1 else ''} "
                       f"{which} cannot be reached, so where it ends is unknown",
                       code="unavailable")


def replay_topic(name: str, partitions: Sequence[int] | None) -> Call[TopicInfo]:
    """replay_topic builds the GET /v1/topics/{t} a bounded replay starts from.

    The replay takes each partition's end from the answer, and a partition whose node
    could not be reached (``available`` false) has no known end. Such an answer counts
    as the retryable :class:`Unavailable` of :func:`unreachable`, so the topic is read
    again with the call's backoff and within its budget, and the call fails with that
    error if the budget runs out first.
    """
    def parse(resp: Response, maybe: bool) -> TopicInfo:
        info = parse_topic(resp.json())
        err = unreachable(info, partitions)
        if err is not None:
            raise err
        return info

    return Call("get_topic", Request("GET", f"/v1/topics/{_t(name)}"), parse, Kind.READ, name)


def alter_topic(name: str, settings: Mapping[str, Any]) -> Call[TopicInfo]:
    """alter_topic builds PATCH /v1/topics/{t}; it sets absolute values, so retries are safe."""
    body = {k: v for k, v in settings.items() if v is not None}
    return Call("alter_topic", _json_req("PATCH", f"/v1/topics/{_t(name)}", body),
                lambda r, m: parse_topic(r.json()), Kind.READ, name)


def delete_topic(name: str, incarnation: str | None = None) -> Call[None]:
    """delete_topic builds DELETE /v1/topics/{t}, with ``?incarnation=`` when given.

    With ``incarnation`` the broker deletes that incarnation only: when the name is
    another topic now (deleted and created again since), it answers 409
    ``incarnation_mismatch`` and deletes nothing, a :class:`Conflict`.

    After a lost reply (the SDK contract's rule for topic deletes): without
    ``incarnation`` the call is not sent again, as a resend would delete whatever topic
    has the name by then, one created again meanwhile included; it fails, uncertain.
    With it the call is sent again, as the resend cannot reach another topic; its 404
    or 409 ``incarnation_mismatch`` then fails the call, uncertain: the incarnation
    named is gone, deleted by this call or another.
    """
    path = f"/v1/topics/{_t(name)}"
    if incarnation is None:
        return Call("delete_topic", Request("DELETE", path), _none, Kind.WRITE, name)
    return Call("delete_topic", Request("DELETE", path, (("incarnation", incarnation),)),
                _none, Kind.READ, name, uncertain_after_lost_reply=True)


def attach_child(parent: str, child: str, delay: Duration | None) -> Call[Child]:
    """attach_child builds POST /v1/topics/{p}/children."""
    body: dict[str, Any] = {"child": child}
    if delay is not None:
        body["fanout_delay_ms"] = int(ms_param(delay))
    return Call("attach_child", _json_req("POST", f"/v1/topics/{_t(parent)}/children", body),
                lambda r, m: parse_child(r.json()), Kind.WRITE, parent)


def list_children(parent: str) -> Call[list[Child]]:
    """list_children builds GET /v1/topics/{p}/children."""
    return Call("list_children", Request("GET", f"/v1/topics/{_t(parent)}/children"),
                lambda r, m: [parse_child(x) for x in r.json()["children"]], Kind.READ, parent)


def detach_child(parent: str, child: str) -> Call[None]:
    """detach_child builds DELETE /v1/topics/{p}/children/{c}."""
    return Call("detach_child",
                Request("DELETE", f"/v1/topics/{_t(parent)}/children/{_t(child)}"), _none,
                Kind.READ, parent, ok_after_lost_reply=frozenset({404}))


def _u(username: str) -> str:
    return quote(username, safe="")


def create_user(username: str, password: str, grants: Iterable[Grant]) -> Call[User]:
    """create_user builds POST /v1/users."""
    body = {"username": username, "password": password, "grants": grants_wire(grants)}
    return Call("create_user", _json_req("POST", "/v1/users", body),
                lambda r, m: parse_user(r.json()), Kind.WRITE)


def list_users() -> Call[list[User]]:
    """list_users builds GET /v1/users."""
    return Call("list_users", Request("GET", "/v1/users"),
                lambda r, m: [parse_user(x) for x in r.json()["users"]])


def get_user(username: str) -> Call[User]:
    """get_user builds GET /v1/users/{u}."""
    return Call("get_user", Request("GET", f"/v1/users/{_u(username)}"),
                lambda r, m: parse_user(r.json()))


def delete_user(username: str) -> Call[None]:
    """delete_user builds DELETE /v1/users/{u}."""
    return Call("delete_user", Request("DELETE", f"/v1/users/{_u(username)}"), _none,
                Kind.READ, ok_after_lost_reply=frozenset({404}))


def replace_grants(username: str, grants: Iterable[Grant]) -> Call[User]:
    """replace_grants builds PUT /v1/users/{u}/grants (idempotent)."""
    body = {"grants": grants_wire(grants)}
    return Call("replace_grants", _json_req("PUT", f"/v1/users/{_u(username)}/grants", body),
                lambda r, m: parse_user(r.json()))


def change_password(username: str, new_password: str, current_password: str | None
                    ) -> Call[None]:
    """change_password builds PUT /v1/users/{u}/password."""
    body = _settings(new_password=new_password, current_password=current_password)
    return Call("change_password",
                _json_req("PUT", f"/v1/users/{_u(username)}/password", body), _none,
                Kind.WRITE)


def _n(node: str) -> str:
    if not node:
        raise BadRequest("a node id is needed", code="invalid_parameter")
    return quote(node, safe="")


def get_cluster() -> Call[ClusterInfo]:
    """get_cluster builds GET /v1/cluster: the answering node's view of its cluster."""
    return Call("get_cluster", cluster_request(), lambda r, m: parse_cluster(r.json()))


def list_members() -> Call[list[Member]]:
    """list_members builds GET /v1/cluster/members."""
    return Call("list_members", Request("GET", "/v1/cluster/members"),
                lambda r, m: [parse_member(x) for x in r.json()["members"]])


def decommission(node: str) -> Call[Member]:
    """Decommission builds DELETE /v1/cluster/members/{node} (202 with the member).

    A repeat answers the member as it is, so a retry after a lost reply is safe.
    """
    return Call("decommission", Request("DELETE", f"/v1/cluster/members/{_n(node)}"),
                lambda r, m: parse_member(r.json()))


def list_moves() -> Call[list[Move]]:
    """list_moves builds GET /v1/cluster/moves: every move, newest first."""
    return Call("list_moves", Request("GET", "/v1/cluster/moves"),
                lambda r, m: [parse_move(x) for x in r.json()["moves"]])


def move_partition(topic: str, partition: int, from_: str, to: str) -> Call[Move]:
    """move_partition builds POST /v1/cluster/moves (202 with the move).

    The broker answers a repeat of an identical move under way with that move (the same
    id), so a retry after a lost reply starts nothing twice.
    """
    body = {"topic": topic, "partition": int(partition), "from": from_, "to": to}
    return Call("move_partition", _json_req("POST", "/v1/cluster/moves", body),
                lambda r, m: parse_move(r.json()), Kind.READ, topic)


def cancel_move(move_id: str) -> Call[None]:
    """cancel_move builds DELETE /v1/cluster/moves/{id} (204)."""
    if not move_id:
        raise BadRequest("a move id is needed", code="invalid_parameter")
    return Call("cancel_move", Request("DELETE", f"/v1/cluster/moves/{quote(move_id, safe='')}"),
                _none)


def rebalance() -> Call[list[Move]]:
    """Rebalance builds POST /v1/cluster/rebalance (202 with the moves it started).

    A repeat starts only what is still needed, so a retry is safe.
    """
    return Call("rebalance", Request("POST", "/v1/cluster/rebalance"),
                lambda r, m: [parse_move(x) for x in r.json()["moves"]])


def force_leader(topic: str, partition: int, node: str) -> Call[ForceLeaderResult]:
    """force_leader builds POST /v1/topics/{t}/partitions/{p}/force-leader.

    A non-idempotent write: once it took effect the partition has a new replica set, so
    an attempt whose outcome is unknown is never repeated (the error is ``uncertain``).
    """
    req = _json_req("POST", f"/v1/topics/{_t(topic)}/partitions/{int(partition)}/force-leader",
                    {"node": node})
    return Call("force_leader", req, lambda r, m: parse_force_leader(r.json()), Kind.WRITE,
                topic)


CLUSTER_CHECK_TIMEOUT = 5.0
"""How long the one-cluster check waits for each endpoint's /v1/cluster."""


def cluster_request() -> Request:
    """cluster_request is GET /v1/cluster, sent to every endpoint by the one-cluster check."""
    return Request("GET", "/v1/cluster")


def cluster_verdict(answers: Mapping[str, Any]) -> str | None:
    """cluster_verdict says why the endpoints are not one cluster, or None when they are.

    ``answers`` maps each endpoint that answered to its /v1/cluster document. They are
    one cluster when every answer names the same ``cluster_id``; answers without one are
    one cluster when each answering node's ``node_id`` is in the member list of every
    other answer. Fewer than two answers prove nothing: no verdict against them.
    """
    docs = {u: d for u, d in answers.items() if isinstance(d, Mapping)}
    if len(docs) < 2:
        return None
    ids = {u: d.get("cluster_id") for u, d in docs.items()}
    if all(isinstance(v, str) and v for v in ids.values()):
        if len(set(ids.values())) == 1:
            return None
        listing = ", ".join(f"{u} is in cluster {v}" for u, v in ids.items())
        return f"the endpoints are not one cluster: {listing}"
    members: dict[str, set[str]] = {}
    for u, d in docs.items():
        members[u] = {str(m.get("id")) for m in d.get("members") or [] if isinstance(m, Mapping)}
        members[u].add(str(d.get("node_id")))
    for u, d in docs.items():
        node = str(d.get("node_id"))
        for other, ids_there in members.items():
            if other != u and node not in ids_there:
                return (f"the endpoints are not one cluster: node {node} ({u}) is not a "
                        f"member of the cluster {other} belongs to")
    return None


def ready() -> Call[bool]:
    """Ready builds GET /readyz; True when the node serves requests."""
    return Call("ready", Request("GET", "/readyz"), lambda r, m: r.status == 200)


def topic_settings(
    *,
    partitions: int | None = None,
    retention_ms: int | None = None,
    visibility_timeout_ms: int | None = None,
    max_in_flight_per_partition: int | None = None,
    max_acked_ahead_per_partition: int | None = None,
    replication_factor: int | None = None,
    schema: Mapping[str, Any] | None = None,
    parent: str | None = None,
    fanout_delay_ms: int | None = None,
) -> dict[str, Any]:
    """topic_settings collects the settings that were given, under their wire names."""
    return _settings(
        partitions=partitions, retention_ms=retention_ms,
        visibility_timeout_ms=visibility_timeout_ms,
        max_in_flight_per_partition=max_in_flight_per_partition,
        max_acked_ahead_per_partition=max_acked_ahead_per_partition,
        replication_factor=replication_factor,
        schema=None if schema is None else dict(schema), parent=parent,
        fanout_delay_ms=fanout_delay_ms,
    )


def emit_safely(hook: EventHook | None, event: Event, log: Callable[..., None]) -> None:
    """emit_safely calls the user's hook; a failing hook is logged, never raised."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        log("narad: on_event hook failed for %s", event.kind, exc_info=True)
