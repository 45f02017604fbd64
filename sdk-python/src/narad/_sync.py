"""The blocking client: :class:`Client`, with its Publisher, Consumer and Replay.

Threads stand where the async client has tasks; every decision is made by ``_core`` and
``_plans``, shared with ``_async.py``. Keep the two files in the same order and shape.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _core as core
from . import _plans as plans
from ._core import Duration
from .errors import BufferFull, Closed, ClusterWarning, Conflict, LeaseLost, NaradError
from .models import (
    AckResult,
    Child,
    ClusterInfo,
    Event,
    ForceLeaderResult,
    Grant,
    Member,
    Message,
    Move,
    Position,
    Produced,
    TopicInfo,
    User,
)

__all__ = ["Client", "Consumer", "Publisher", "Replay"]

T = TypeVar("T")
log = logging.getLogger("narad")

Handler = Callable[[Message], object]
"""A sync consumer handler: return to ack, raise to hand the message back."""


def warn_not_one_cluster(verdict: str) -> None:
    """warn_not_one_cluster says, once per client, that its endpoints are not one cluster."""
    text = (f"narad: {verdict}; calls stick to one node and leases are settled where "
            "they were taken, but the nodes do not share messages")
    log.warning("%s", text)
    warnings.warn(text, ClusterWarning, stacklevel=2)


class _PollCut:
    """_PollCut lets a consumer's close end its long poll without losing its answer.

    The poll goes through its own connection pool that keeps no idle connections, so
    each poll opens a connection and the ``trace`` extension hands over its socket.
    ``cut`` half-closes that socket (``SHUT_WR``): the broker takes the end of the
    request's stream for the client gone and answers at once, with the messages it had
    leased already (which the consumer hands back) or with a 499 when it leased
    nothing. That answer is read. Shutting the socket both ways instead, as close did,
    dropped an answer the broker had sent and the client not read yet (or not to its
    end), and its messages stayed leased to nobody until their visibility timeout.
    ``hard_cut`` shuts it both ways, for a poll still running past the bound close
    gives it (a proxy in between may not pass the half-close on).
    """

    def __init__(self, http: httpx.Client | None) -> None:
        self.http = http
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cut = False
        self._hard = False

    def trace(self, name: str, info: dict[str, Any]) -> None:
        """Trace is the httpcore trace hook: it keeps each new connection's socket.

        Over TLS that is the socket wrapping the first one, which is detached then.
        """
        if name == "http11.response_closed.complete":
            with self._lock:
                self._sock = None
            return
        if name not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = None if stream is None else stream.get_extra_info("socket")
        with self._lock:
            self._sock = sock
            how = self._how()
        if how is not None:
            self._shutdown(sock, how)

    def _how(self) -> int | None:
        if self._hard:
            return socket.SHUT_RDWR
        return socket.SHUT_WR if self._cut else None

    def cut(self) -> bool:
        """Cut ends the poll in progress, and any that starts after it.

        True when that poll ends by an answer still to be read, so close waits for it.
        """
        with self._lock:
            self._cut = True
            sock = self._sock
        return self._shutdown(sock, socket.SHUT_WR)

    def hard_cut(self) -> None:
        """hard_cut shuts the poll's socket both ways: a blocked read ends at once."""
        with self._lock:
            self._cut = self._hard = True
            sock = self._sock
        self._shutdown(sock, socket.SHUT_RDWR)

    def is_cut(self) -> bool:
        """is_cut tells whether cut was called."""
        with self._lock:
            return self._cut

    @staticmethod
    def _shutdown(sock: socket.socket | None, how: int) -> bool:
        if sock is None:
            return False
        try:
            # The plain socket's shutdown, also for a TLS one: ssl.SSLSocket's own drops
            # its TLS state, and the answer could not be read any more.
            socket.socket.shutdown(sock, how)
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Close closes the poll's own connection pool."""
        if self.http is not None:
            self.http.close()


class Client:
    """Client is the blocking Narad client; share one per process, it is thread-safe.

    Args:
        endpoints: One base URL or several (``"http://10.0.0.1:7942"``) of one
            cluster. Calls go to the first healthy one and fail over to the next when
            it fails; a lease is settled on the node that issued it. Several
            endpoints that are not one cluster draw a :class:`~narad.ClusterWarning`.
        auth: ``(username, password)`` for HTTP Basic, or any ``httpx.Auth``.
        timeout: Bound of each attempt of a call, in seconds (a long poll's attempt
            gets its wait on top). An attempt that runs out counts against its node
            and the call moves to the next one.
        attempts: Most attempts of one call (first try included).
        backoff_min, backoff_max: Bounds of the full-jitter backoff between attempts.
        allow_duplicates: Whether a produce whose reply was lost is retried (possibly
            storing a second copy) rather than raised as ``uncertain``.
        on_event: A hook that receives every :class:`~narad.Event` (metrics, tracing).
        transport: An ``httpx.BaseTransport`` to send through (tests, proxies).
        headers: Extra headers sent with every request.

    Use it as a context manager: leaving it closes the consumers and publishers it
    made (draining them), then the connections. Closing twice is harmless.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] = "http://127.0.0.1:7942",
        *,
        auth: tuple[str, str] | httpx.Auth | None = None,
        timeout: float = 30.0,
        attempts: int = 4,
        backoff_min: float = 0.05,
        backoff_max: float = 5.0,
        allow_duplicates: bool = True,
        on_event: Callable[[Event], None] | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        breaker_cooldown: float = core.BREAKER_COOLDOWN,
        breaker_failures: int = core.BREAKER_FAILURES,
    ) -> None:
        eps = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self._pool = core.EndpointPool(eps, cooldown=breaker_cooldown,
                                       threshold=breaker_failures)
        self._cluster_started = len(self._pool.endpoints) < 2
        self._cluster_verdict: str | None = None
        self._policy = core.RetryPolicy(attempts=attempts, backoff_min=backoff_min,
                                        backoff_max=backoff_max, timeout=timeout,
                                        allow_duplicates=allow_duplicates)
        self._on_event = on_event
        self._http = httpx.Client(auth=auth, transport=transport, headers=headers,
                                  timeout=timeout, limits=httpx.Limits(max_connections=200))
        self._auth = auth
        self._headers = headers
        self._own_transport = transport is None
        self._closed = False
        self._lock = threading.Lock()
        self._owned: list[Consumer | Publisher] = []

    # -- plumbing

    @property
    def endpoints(self) -> list[str]:
        """Endpoints lists the configured base URLs."""
        return self._pool.endpoints

    def _emit(self, event: Event) -> None:
        core.emit_safely(self._on_event, event, log.warning)

    def _run(self, call: core.Call[T], timeout: float | None = None,
             policy: core.RetryPolicy | None = None, *, cut: _PollCut | None = None) -> T:
        if self._closed:
            raise Closed("the client is closed", code="closed")
        self._check_cluster()
        state = core.CallState(call, policy or self._policy, self._pool, self._emit, timeout)
        req = call.request
        http = self._http if cut is None or cut.http is None else cut.http
        ext: dict[str, Any] = {} if cut is None or cut.http is None else {"trace": cut.trace}
        while True:
            if cut is not None and cut.is_cut():
                raise Closed("the poll was cut by close", code="closed")
            self._start_probes()
            url = state.endpoint()
            step: core.Step[T]
            try:
                r = http.request(req.method, url + req.path, params=list(req.params),
                                 headers=dict(req.headers), content=req.content,
                                 timeout=state.attempt_timeout(), extensions=ext)
            except httpx.TransportError as exc:
                if cut is not None and cut.is_cut():
                    raise Closed("the poll was cut by close", code="closed") from exc
                if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout,
                                    httpx.PoolTimeout)):
                    step = state.on_transport_error(url, core.Transport.NOT_SENT, str(exc))
                elif isinstance(exc, httpx.TimeoutException):
                    step = state.on_transport_error(url, core.Transport.TIMEOUT, str(exc))
                else:
                    step = state.on_transport_error(url, core.Transport.LOST, str(exc))
            except RuntimeError as exc:  # httpx: the client was closed under us
                raise Closed(f"the client is closed: {exc}", code="closed") from exc
            else:
                if cut is not None and cut.is_cut() and not 200 <= r.status_code < 300:
                    # A cut poll's answer: a 499 when the broker leased nothing for it.
                    raise Closed("the poll was cut by close", code="closed")
                step = state.on_response(url, core.Response(r.status_code, r.headers, r.content,
                                                            url))
            if isinstance(step, core.Done):
                return step.value
            if isinstance(step, core.Fail):
                raise step.error
            if step.delay > 0:
                time.sleep(step.delay)

    def _check_cluster(self) -> None:
        """_check_cluster starts the one-cluster check once, on first use, in the background."""
        with self._lock:
            if self._cluster_started:
                return
            self._cluster_started = True
        threading.Thread(target=self._cluster_check, daemon=True, name="narad-cluster").start()

    def _cluster_check(self) -> None:
        answers: dict[str, Any] = {}
        req = core.cluster_request()
        for url in self._pool.endpoints:
            try:
                r = self._http.get(url + req.path, timeout=core.CLUSTER_CHECK_TIMEOUT)
                if r.status_code == 200:
                    answers[url] = r.json()
            except (httpx.HTTPError, RuntimeError, ValueError):
                continue  # the check never fails anything: no answer, no evidence
        verdict = core.cluster_verdict(answers)
        if verdict is not None:
            warn_not_one_cluster(verdict)
        self._cluster_verdict = verdict or ""

    def _start_probes(self) -> None:
        for url in self._pool.probes_due():
            threading.Thread(target=self._probe, args=(url,), daemon=True,
                             name="narad-probe").start()

    def _probe(self, url: str) -> None:
        ok = False
        try:
            ok = self._http.get(url + "/readyz",
                                timeout=self._policy.timeout).status_code == 200
        except (httpx.HTTPError, RuntimeError):
            ok = False
        if self._pool.probe_result(url, ok):
            self._emit(Event(kind="breaker_close", endpoint=url))

    def _policy_for(self, allow_duplicates: bool | None) -> core.RetryPolicy | None:
        if allow_duplicates is None:
            return None
        return replace(self._policy, allow_duplicates=allow_duplicates)

    def _poll_cut(self) -> _PollCut:
        """_poll_cut makes the cuttable poll path of a consumer (see _PollCut)."""
        if not self._own_transport:
            return _PollCut(None)  # a transport of the caller's: polls are waited out
        return _PollCut(httpx.Client(
            auth=self._auth, headers=self._headers, timeout=self._policy.timeout,
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=0)))

    def _own(self, x: Consumer | Publisher) -> None:
        with self._lock:
            if self._closed:
                raise Closed("the client is closed", code="closed")
            self._owned.append(x)

    def _disown(self, x: Consumer | Publisher) -> None:
        with self._lock:
            if x in self._owned:
                self._owned.remove(x)

    def close(self) -> None:
        """Close drains the client's consumers and publishers, then closes connections."""
        with self._lock:
            owned = list(self._owned)
        for x in owned:
            x.close()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- producing

    def produce(self, topic: str, body: Any, *, key: str | None = None,
                partition: int | None = None, content_type: str | None = None,
                allow_duplicates: bool | None = None, timeout: float | None = None
                ) -> Produced:
        """Produce writes one message and returns where, once it is durable (202).

        ``body`` is bytes (stored exactly), str (UTF-8 text) or a JSON-able value
        (compact JSON). ``key`` hashes to a partition; ``partition`` pins one. A refusal
        that stored nothing fails over to another node at once; a lost reply is retried
        when duplicates are allowed, else raised with ``uncertain`` set.
        """
        call = core.produce(topic, body, key=key, partition=partition,
                            content_type=content_type)
        return self._run(call, timeout, self._policy_for(allow_duplicates))

    def produce_batch(self, topic: str, items: Iterable[Any], *,
                      allow_duplicates: bool | None = None, timeout: float | None = None
                      ) -> list[Produced]:
        """produce_batch writes many messages, in as few requests as the broker allows.

        Items are bodies as for :meth:`produce` or :class:`~narad.Outgoing` values; the
        result lists where each went, in order. A request holds at most 1000 messages
        and about 7 MiB, each stored all or none; a longer batch goes in several
        requests. When any fails, the first error is raised with ``results``: per
        message, its :class:`~narad.Produced` or the error of its request. An error with
        ``partly_stored`` says part of a request was stored (``stored``,
        ``failed_partitions``): it is never resent, whatever ``allow_duplicates`` says.
        """
        entries = core.batch_entries(items)
        policy = self._policy_for(allow_duplicates)
        results: list[Produced | NaradError | None] = [None] * len(entries)
        for idx in core.batch_chunks(entries):
            try:
                got = self._run(core.produce_entries(topic, [entries[i] for i in idx]),
                                timeout, policy)
            except NaradError as err:
                for i in idx:
                    results[i] = err
                continue
            for i, r in zip(idx, got, strict=False):
                results[i] = r
        return core.batch_produced(results)

    def publisher(self, topic: str, *, max_batch: int = 100, max_batch_bytes: int = 1 << 20,
                  linger: Duration = 0.005, max_buffered: int = 10_000, block: bool = True,
                  allow_duplicates: bool | None = None) -> Publisher:
        """Publisher returns a batching producer for ``topic`` (see :class:`Publisher`)."""
        pub = Publisher(self, topic, max_batch=max_batch, max_batch_bytes=max_batch_bytes,
                        linger=core.seconds(linger), max_buffered=max_buffered, block=block,
                        allow_duplicates=allow_duplicates)
        self._own(pub)
        return pub

    # -- consuming

    def receive(self, topic: str, *, max_messages: int = 1, wait: Duration = 10.0,
                timeout: float | None = None) -> list[Message]:
        """Receive takes up to ``max_messages`` messages under leases.

        It waits up to ``wait`` seconds (at most 20) for the first; an empty list means
        none arrived. Settle each with :meth:`ack`, :meth:`nack` or :meth:`extend`.
        """
        return self._run(core.receive(topic, max_messages=max_messages, wait=wait), timeout)

    def ack(self, message: Message | str, *, topic: str | None = None,
            timeout: float | None = None) -> None:
        """Ack settles a leased message for good (retried until confirmed).

        Raises LeaseLost when the lease was gone: the message is delivered again. A 410
        on a retry whose first attempt's reply was lost counts as success.
        """
        self._run(core.ack(core.topic_of(message, topic), core.handle_of(message),
                           core.endpoint_of(message)), timeout)

    def nack(self, message: Message | str, delay: Duration = 0.0, *, topic: str | None = None,
             timeout: float | None = None) -> None:
        """Nack hands a leased message back: at once, or visible again after ``delay``."""
        self._run(core.nack(core.topic_of(message, topic), core.handle_of(message), delay,
                            core.endpoint_of(message)), timeout)

    def extend(self, message: Message | str, duration: Duration | None = None, *,
               topic: str | None = None, timeout: float | None = None) -> None:
        """Extend renews a lease: for the topic's visibility timeout, or ``duration`` from now."""
        self._run(core.extend(core.topic_of(message, topic), core.handle_of(message),
                              duration, core.endpoint_of(message)), timeout)

    def ack_batch(self, messages: Iterable[Message | str], *, topic: str | None = None,
                  timeout: float | None = None) -> list[AckResult]:
        """ack_batch settles many leased messages of one topic; one result per message.

        Messages leased by different nodes are settled with one request per node, each
        of at most 1000 entries. Entries answered 503 are sent again with backoff (a
        410 on the retry of one answered ``503 timeout`` counts as settled). A request
        that fails whole gives its error to its entries' results; it is raised only when
        no request was answered.
        """
        items = list(messages)
        if not items:
            return []
        plan = core.AckBatchPlan(core.topic_of(items[0], topic), items, self._policy)
        while (step := plan.next()) is not None:
            delay, call = step
            if delay > 0:
                time.sleep(delay)
            try:
                got = self._run(call, timeout)
            except NaradError as err:
                plan.on_error(err)
                continue
            plan.on_results(got)
        return plan.results()

    def consume(self, topic: str, handler: Handler, *, concurrency: int = 1,
                wait: Duration = 10.0, renew: bool = True, max_lease: Duration = 3600.0,
                grace: Duration = 30.0, nack_delay: Duration | None = None,
                max_deliveries: int = 0, dead_letter_topic: str | None = None) -> Consumer:
        """Consume starts a worker pool that runs ``handler`` on each message; see Consumer.

        The handler's return acks the message; an exception hands it back after
        ``nack_delay`` (raise :class:`~narad.Nack` to choose the delay). By default that
        delay grows with the delivery attempt: 1 s, 2 s, 4 s ... up to 5 min, jittered.
        With ``max_deliveries`` a message delivered more often is produced to
        ``dead_letter_topic`` (required then) and acked. Leases are
        renewed while handlers run (up to ``max_lease``). Raises NotFound at once when
        the topic does not exist.
        """
        opts = plans.ConsumerOptions(concurrency=max(1, concurrency),
                                     wait=min(core.MAX_WAIT, core.seconds(wait)), renew=renew,
                                     max_lease=core.seconds(max_lease),
                                     grace=core.seconds(grace),
                                     nack_delay=None if nack_delay is None
                                     else core.seconds(nack_delay),
                                     max_deliveries=max_deliveries,
                                     dead_letter_topic=dead_letter_topic)
        consumer = Consumer(self, topic, handler, opts)
        self._own(consumer)
        try:
            consumer._start()
        except BaseException:
            self._disown(consumer)
            consumer._cut.close()
            raise
        return consumer

    def messages(self, topic: str, *, wait: Duration = 10.0, batch: int = 1
                 ) -> Iterator[Message]:
        """Messages yields leased messages as they arrive, until the client closes.

        Each message must be settled by the caller (:meth:`ack`); leases are not renewed.
        Leaving the loop early (break, an exception, ``close()``) hands back at once the
        messages fetched with ``batch`` but never reached.
        """
        pending: list[Message] = []
        try:
            while not self._closed:
                try:
                    got = self.receive(topic, max_messages=batch, wait=wait)
                except Closed:
                    return
                pending = list(reversed(got))
                while pending:
                    yield pending.pop()
        finally:
            for m in pending:
                with contextlib.suppress(NaradError):
                    self.nack(m, timeout=5.0)

    def replay(self, topic: str, start: Position | None = None, *,
               partitions: Iterable[int] | None = None, follow: bool = False,
               batch: int = 100, poll_interval: Duration = 0.5) -> Replay:
        """Replay reads the log without leases from ``start`` (default: the beginning).

        Bounded (the default), it stops at the end each partition had when it started;
        with ``follow`` it waits for new messages forever. Its ``position`` after each
        message is where to resume.
        """
        return Replay(self, topic, start or Position(), partitions, follow, batch,
                      core.seconds(poll_interval))

    # -- topics

    def create_topic(self, name: str, *, partitions: int | None = None,
                     retention_ms: int | None = None, visibility_timeout_ms: int | None = None,
                     max_in_flight_per_partition: int | None = None,
                     max_acked_ahead_per_partition: int | None = None,
                     replication_factor: int | None = None,
                     schema: Mapping[str, Any] | None = None, parent: str | None = None,
                     fanout_delay_ms: int | None = None, timeout: float | None = None
                     ) -> TopicInfo:
        """create_topic creates a topic (409 Conflict when the name exists).

        Settings left out take the broker's defaults. With ``parent`` the topic is
        created as a child of it (a delay child with ``fanout_delay_ms``).
        """
        settings = core.topic_settings(
            partitions=partitions, retention_ms=retention_ms,
            visibility_timeout_ms=visibility_timeout_ms,
            max_in_flight_per_partition=max_in_flight_per_partition,
            max_acked_ahead_per_partition=max_acked_ahead_per_partition,
            replication_factor=replication_factor, schema=schema, parent=parent,
            fanout_delay_ms=fanout_delay_ms)
        return self._run(core.create_topic(name, settings), timeout)

    def ensure_topic(self, name: str, *, timeout: float | None = None,
                     **settings: Any) -> TopicInfo:
        """ensure_topic creates the topic, or returns it when it exists already.

        ``settings`` are those of create_topic; an existing topic keeps its own (nothing
        is altered).
        """
        try:
            return self.create_topic(name, timeout=timeout, **settings)
        except Conflict as e:
            if e.code != "topic_exists":
                raise
            return self.get_topic(name, timeout=timeout)

    def list_topics(self, *, timeout: float | None = None) -> list[TopicInfo]:
        """list_topics lists every topic, sorted by name."""
        return self._run(core.list_topics(), timeout)

    def get_topic(self, name: str, *, timeout: float | None = None) -> TopicInfo:
        """get_topic returns a topic's settings with one PartitionStats per partition."""
        return self._run(core.get_topic(name), timeout)

    def alter_topic(self, name: str, *, retention_ms: int | None = None,
                    visibility_timeout_ms: int | None = None,
                    max_in_flight_per_partition: int | None = None,
                    max_acked_ahead_per_partition: int | None = None,
                    replication_factor: int | None = None,
                    schema: Mapping[str, Any] | None = None, timeout: float | None = None
                    ) -> TopicInfo:
        """alter_topic changes the live-tunable settings given; others keep their value.

        A new ``replication_factor`` (1 to 7) is reached in the background: the broker
        adds or removes replicas through moves (:meth:`list_moves`). More than the
        cluster's nodes is a Conflict.
        """
        settings = core.topic_settings(
            retention_ms=retention_ms, visibility_timeout_ms=visibility_timeout_ms,
            max_in_flight_per_partition=max_in_flight_per_partition,
            max_acked_ahead_per_partition=max_acked_ahead_per_partition,
            replication_factor=replication_factor, schema=schema)
        return self._run(core.alter_topic(name, settings), timeout)

    def delete_topic(self, name: str, *, incarnation: str | None = None,
                     timeout: float | None = None) -> None:
        """delete_topic deletes a topic's data and metadata.

        With ``incarnation`` (a :class:`~narad.TopicInfo`'s, from :meth:`get_topic`) it
        deletes that incarnation only: when the name is another topic now (deleted and
        created again since it was read), it raises :class:`~narad.Conflict` with code
        ``incarnation_mismatch`` and deletes nothing.

        A delete whose reply is lost may have deleted the topic. Without
        ``incarnation`` it is not sent again, as a resend would delete whatever topic
        has the name by then (one created again meanwhile included): it raises the
        error with ``uncertain`` set. With ``incarnation`` it is sent again, as the
        resend cannot reach another topic; a 404 or 409 ``incarnation_mismatch``
        answering the resend is raised with ``uncertain`` set: the incarnation named is
        gone, deleted by this call or another.
        """
        self._run(core.delete_topic(name, incarnation), timeout)

    # -- fan-out and delay children

    def attach_child(self, parent: str, child: str, *, delay: Duration | None = None,
                     timeout: float | None = None) -> Child:
        """attach_child copies every later message of ``parent`` to ``child`` (after ``delay``)."""
        return self._run(core.attach_child(parent, child, delay), timeout)

    def detach_child(self, parent: str, child: str, *, timeout: float | None = None) -> None:
        """detach_child stops copying to ``child``; both topics stay."""
        self._run(core.detach_child(parent, child), timeout)

    def list_children(self, parent: str, *, timeout: float | None = None) -> list[Child]:
        """list_children lists ``parent``'s children with their lag per partition."""
        return self._run(core.list_children(parent), timeout)

    def create_delay_child(self, parent: str, child: str, delay: Duration, *,
                           partitions: int | None = None,
                           visibility_timeout_ms: int | None = None,
                           timeout: float | None = None) -> TopicInfo:
        """create_delay_child creates ``child``, getting ``parent``'s messages ``delay`` later."""
        return self.create_topic(child, partitions=partitions,
                                 visibility_timeout_ms=visibility_timeout_ms, parent=parent,
                                 fanout_delay_ms=int(core.ms_param(delay)), timeout=timeout)

    # -- users

    def create_user(self, username: str, password: str, grants: Iterable[Grant] = (), *,
                    timeout: float | None = None) -> User:
        """create_user creates a user with grants (admin only)."""
        return self._run(core.create_user(username, password, grants), timeout)

    def list_users(self, *, timeout: float | None = None) -> list[User]:
        """list_users lists users and their grants."""
        return self._run(core.list_users(), timeout)

    def get_user(self, username: str, *, timeout: float | None = None) -> User:
        """get_user returns one user."""
        return self._run(core.get_user(username), timeout)

    def delete_user(self, username: str, *, timeout: float | None = None) -> None:
        """delete_user deletes a user."""
        self._run(core.delete_user(username), timeout)

    def replace_grants(self, username: str, grants: Iterable[Grant], *,
                       timeout: float | None = None) -> User:
        """replace_grants sets a user's grants to exactly ``grants``."""
        return self._run(core.replace_grants(username, grants), timeout)

    def change_password(self, username: str, new_password: str, *,
                        current_password: str | None = None, timeout: float | None = None
                        ) -> None:
        """change_password changes a password (a user passes ``current_password``)."""
        self._run(core.change_password(username, new_password, current_password), timeout)

    # -- cluster membership (admin)

    def get_cluster(self, *, timeout: float | None = None) -> ClusterInfo:
        """get_cluster returns the answering node's view: itself, the controller, the members.

        A single node is a cluster of one.
        """
        return self._run(core.get_cluster(), timeout)

    def list_members(self, *, timeout: float | None = None) -> list[Member]:
        """list_members lists the cluster's members."""
        return self._run(core.list_members(), timeout)

    def decommission(self, node: str, *, timeout: float | None = None) -> Member:
        """Decommission moves every replica off ``node``, then removes it (admin only).

        Returns the member, ``"decommissioning"``, once the broker has started; it leaves
        :meth:`list_members` when it holds nothing. A dead member's replicas are copied
        again from the survivors. A repeat returns the member as it is, so it is retried
        like a read. NotFound for an unknown node; Conflict for the last node, or one
        whose replicas no live node can take.
        """
        return self._run(core.decommission(node), timeout)

    def list_moves(self, *, timeout: float | None = None) -> list[Move]:
        """list_moves lists every partition move the cluster holds, newest first (admin only)."""
        return self._run(core.list_moves(), timeout)

    def move_partition(self, topic: str, partition: int, from_: str, to: str, *,
                       timeout: float | None = None) -> Move:
        """move_partition moves the replica of a partition on ``from_`` to ``to`` (admin only).

        Returns the move once the broker has started it; follow it with
        :meth:`list_moves`. An identical move under way is returned as it is (the same
        id), so it is retried like a read. NotFound for an unknown topic, partition or
        node; Conflict, with the broker's reason, when the move is impossible (``to`` is
        dead or holds a replica already, ``from_`` holds none, another move of the
        partition is under way).
        """
        return self._run(core.move_partition(topic, partition, from_, to), timeout)

    def cancel_move(self, move_id: str, *, timeout: float | None = None) -> None:
        """cancel_move cancels a move that is still copying (admin only).

        NotFound when no move has that id; Conflict once it is switching (it finishes)
        or has ended.
        """
        self._run(core.cancel_move(move_id), timeout)

    def rebalance(self, *, timeout: float | None = None) -> list[Move]:
        """Rebalance starts the moves that even out replicas and leaders (admin only).

        Returns the moves started now (possibly none); the broker starts the rest as
        those finish. A repeat starts only what is still needed.
        """
        return self._run(core.rebalance(), timeout)

    def force_leader(self, topic: str, partition: int, node: str, *,
                     timeout: float | None = None) -> ForceLeaderResult:
        """force_leader makes the replica on ``node`` the only member and leader of a partition.

        A last resort (admin only) for a partition that lost a majority of its replicas
        for good; the broker then grows the replica set back to the topic's replication
        factor. Messages only the lost replicas held are lost: see
        :attr:`ForceLeaderResult.possibly_lost_at_least`. An attempt whose outcome is
        unknown is never repeated (the error is ``uncertain``): check the partition's
        replicas with :meth:`get_topic` before asking again. Conflict when ``node``
        holds no replica of the partition or is not live.
        """
        return self._run(core.force_leader(topic, partition, node), timeout)

    # -- health

    def ready(self, *, timeout: float | None = None) -> bool:
        """Ready tells whether a node answers /readyz with 200."""
        try:
            return self._run(core.ready(), timeout)
        except NaradError:
            return False


# ---------------------------------------------------------------------------


class Publisher:
    """Publisher batches messages for one topic by count, bytes and linger.

    :meth:`publish` returns a ``concurrent.futures.Future`` that resolves to the
    message's :class:`~narad.Produced` or raises its own error: a refused batch is
    resent one message at a time so each gets its own answer. The buffer is bounded:
    publish blocks when full, or raises BufferFull when made with ``block=False``.
    Closing flushes what is buffered.
    """

    def __init__(self, client: Client, topic: str, *, max_batch: int, max_batch_bytes: int,
                 linger: float, max_buffered: int, block: bool,
                 allow_duplicates: bool | None) -> None:
        self._client = client
        self.topic = topic
        self._buf: plans.BatchBuffer[concurrent.futures.Future[Produced]] = plans.BatchBuffer(
            max_batch=min(core.MAX_BATCH, max(1, max_batch)),
            max_batch_bytes=min(core.MAX_BATCH_BYTES, max(1, max_batch_bytes)),
            linger=linger, max_buffered=max(1, max_buffered))
        self._block = block
        self._policy = client._policy_for(allow_duplicates)
        self._cond = threading.Condition()
        self._inflight = 0
        self._flushing = 0
        self._closing = False
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"narad-publisher-{topic}")
        self._thread.start()

    def publish(self, body: Any, *, key: str | None = None, partition: int | None = None,
                timeout: float | None = None) -> concurrent.futures.Future[Produced]:
        """Publish buffers one message and returns the future of its result."""
        entry = core.batch_entry(core_outgoing(body, key, partition))
        fut: concurrent.futures.Future[Produced] = concurrent.futures.Future()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closing:
                    raise Closed("the publisher is closed", code="closed")
                if not self._buf.full():
                    break
                if not self._block:
                    raise BufferFull("the publisher's buffer is full", code="buffer_full")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise BufferFull("the publisher's buffer stayed full", code="buffer_full")
                self._cond.wait(left)
            self._buf.add(plans.Pending(entry, core.batch_entry_size(entry), fut,
                                        time.monotonic()))
            self._cond.notify_all()
        return fut

    def flush(self, timeout: float | None = None) -> None:
        """Flush sends everything buffered now and waits until every result is in."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._buf.items or self._inflight:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise NaradError("flush did not finish in time", code="timeout")
                    self._cond.wait(left)
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Close flushes, then stops the publisher; closing twice is harmless."""
        with self._cond:
            if self._closing:
                return
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join(timeout)
            self._client._disown(self)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    wait = self._buf.wait_time(time.monotonic(),
                                               self._flushing > 0 or self._closing)
                    if wait == 0.0:
                        break
                    if wait is None and self._closing:
                        return
                    self._cond.wait(wait)
                batch = self._buf.take()
                self._inflight += len(batch)
                self._cond.notify_all()
            try:
                self._send(batch)
            finally:
                with self._cond:
                    self._inflight -= len(batch)
                    self._cond.notify_all()

    def _send(self, batch: list[plans.Pending[concurrent.futures.Future[Produced]]]) -> None:
        try:
            results = self._client._run(
                core.produce_entries(self.topic, [p.entry for p in batch]), None, self._policy)
        except NaradError as err:
            if plans.split_on_error(err, len(batch)):
                for p in batch:
                    self._send([p])
                return
            for p in batch:
                p.future.set_exception(err)
            return
        except Exception as exc:  # never leave a future unresolved
            for p in batch:
                p.future.set_exception(exc)
            return
        for p, r in zip(batch, results, strict=False):
            p.future.set_result(r)


def core_outgoing(body: Any, key: str | None, partition: int | None) -> Any:
    """core_outgoing wraps a body with its key or partition when either is given."""
    from .models import Outgoing

    if key is None and partition is None:
        return body
    return Outgoing(body, key=key, partition=partition)


# ---------------------------------------------------------------------------


class Consumer:
    """Consumer runs a handler over a topic's messages on a pool of worker threads.

    It polls only for as many messages as there are free workers, renews each lease
    before two thirds of its window while the message waits or runs (up to
    ``max_lease``), acks on success with confirmed retries, and hands the message back
    on an exception. When a lease is lost the delivery's ``cancelled`` event is set
    (see :func:`narad.current_delivery`) and its result is never acked. Transient
    errors are retried and reported; a terminal one (401, 403, topic gone) stops it,
    and :meth:`wait` raises it.

    :meth:`close` drains: stop polling, hand back messages never started, let running
    handlers finish within the grace period (acks included), hand back the rest.
    """

    def __init__(self, client: Client, topic: str, handler: Handler,
                 opts: plans.ConsumerOptions) -> None:
        self._client = client
        self.topic = topic
        self._handler = handler
        self.options = opts
        self._counters = plans.Counters()
        self._cond = threading.Condition()
        self._stopping = False
        self._stopped = threading.Event()
        self._closed = False
        self.error: NaradError | None = None
        self._book = plans.LeaseBook(1.0, opts.max_lease, opts.renew)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=opts.concurrency, thread_name_prefix=f"narad-{topic}")
        self._threads: list[threading.Thread] = []
        self._cut = client._poll_cut()

    @property
    def stats(self) -> plans.ConsumerStats:
        """Stats is a snapshot of what the consumer did so far."""
        return self._counters.snapshot()

    @property
    def running(self) -> bool:
        """Running is True until the consumer stopped (closed or on a terminal error)."""
        return not self._stopped.is_set()

    def _start(self) -> None:
        info = self._client.get_topic(self.topic)
        self._book.window = info.visibility_timeout_ms / 1000.0
        for target, name in ((self._poll_loop, "poll"), (self._renew_loop, "renew")):
            t = threading.Thread(target=target, daemon=True, name=f"narad-{name}-{self.topic}")
            self._threads.append(t)
            t.start()

    def _emit(self, **kw: Any) -> None:
        self._client._emit(Event(topic=self.topic, **kw))

    def _free(self) -> int:
        return self.options.concurrency - len(self._book)

    # -- polling

    def _poll_loop(self) -> None:
        retry = 0
        while True:
            with self._cond:
                while not self._stopping and self._free() <= 0:
                    self._cond.wait()
                if self._stopping:
                    return
                n = self._free()
            leased_at = plans.monotonic()
            try:
                got = self._client._run(core.receive(self.topic, max_messages=n,
                                                     wait=self.options.wait), cut=self._cut)
            except Closed:
                with self._cond:
                    stopping = self._stopping
                if not stopping:  # the client was closed under the consumer
                    self._fail(None)
                return
            except NaradError as err:
                self._counters.add("poll_errors")
                if plans.is_terminal(err):
                    self._emit(kind="poll_error", error=err, outcome="terminal")
                    log.error("narad: consumer of %s stops: %s", self.topic, err)
                    self._fail(err)
                    return
                retry += 1
                # A Retry-After holds the loop back, bounded as for every call.
                delay = max(min(err.retry_after or 0.0, core.MAX_RETRY_AFTER),
                            self._client._policy.backoff(min(retry, 8)) + 0.05)
                self._emit(kind="poll_error", error=err, outcome="retry", delay=delay)
                log.warning("narad: poll of %s failed, retrying in %.2fs: %s",
                            self.topic, delay, err)
                with self._cond:
                    if not self._stopping:
                        self._cond.wait(delay)
                continue
            retry = 0
            for m in got:
                self._counters.add("received")
                d = plans.Delivery(m, leased_at, self._book.window)
                with self._cond:
                    stopping = self._stopping
                    if not stopping:
                        self._book.add(d)
                        self._cond.notify_all()  # the renewer plans its next wake-up anew
                if stopping:
                    self._hand_back(d)
                    continue
                self._pool.submit(self._process, d)

    # -- handling

    def _process(self, d: plans.Delivery) -> None:
        with self._cond:
            if d.state is not plans.State.PENDING or d.lost:
                return
            d.state = plans.State.RUNNING
        if self.options.dead_letters(d):
            try:
                self._dead_letter(d)
            finally:
                self._finish(d)
            return
        token = plans.set_current(d)
        wall, t0 = time.time(), plans.monotonic()
        exc: BaseException | None = None
        try:
            self._handler(d.message)
        except BaseException as e:  # SystemExit in a worker must not leak its slot
            exc = e
        finally:
            plans.reset_current(token)
        outcome, delay = plans.outcome_of(exc, self.options.nack_delay, d.attempt)
        gave_up = self._settling(d)
        self._emit(kind="handler", op="handle", outcome="cancelled" if gave_up else
                   ("ok" if exc is None else "error"), error=exc, start=wall,
                   duration=plans.monotonic() - t0, message=d.message)
        if exc is not None and not isinstance(exc, plans.Nack):
            log.warning("narad: handler for %s/%d@%d failed: %r", self.topic,
                        d.message.partition, d.message.offset, exc)
        try:
            if gave_up:
                return
            self._counters.add("succeeded" if exc is None else "failed")
            if outcome == "ok":
                self._settle(d, ack=True, delay=0.0)
            else:
                self._settle(d, ack=False, delay=delay)
        finally:
            self._finish(d)

    def _settling(self, d: plans.Delivery) -> bool:
        """_settling moves ``d`` on to settling; True when it was given up meanwhile."""
        with self._cond:
            gave_up = d.cancelled.is_set()
            if not gave_up:
                d.state = plans.State.SETTLING
            return gave_up

    def _dead_letter(self, d: plans.Delivery) -> None:
        """_dead_letter moves a message delivered too often to the dead-letter topic.

        It acks the message only once the copy is stored; when the copy fails, the
        message is handed back with the backoff and tried again on its next delivery.
        """
        m = d.message
        dlq = self.options.dead_letter_topic or ""
        body, ctype = plans.dead_letter_body(d, self.options.max_deliveries)
        try:
            self._client._run(core.produce(dlq, body, key=m.key, content_type=ctype))
        except NaradError as err:
            delay = plans.poison_backoff(d.attempt)
            log.warning("narad: moving %s/%d@%d to %s failed; handing it back for %.1fs: %s",
                        self.topic, m.partition, m.offset, dlq, delay, err)
            if not self._settling(d):
                self._settle(d, ack=False, delay=delay)
            return
        self._counters.add("dead_lettered")
        log.warning("narad: %s/%d@%d was delivered %d times; moved to %s", self.topic,
                    m.partition, m.offset, d.attempt, dlq)
        if not self._settling(d):
            self._settle(d, ack=True, delay=0.0)

    def _settle(self, d: plans.Delivery, *, ack: bool, delay: float) -> None:
        handle = d.message.receipt_handle or ""
        try:
            if ack:
                self._client._run(core.ack(self.topic, handle, d.message.endpoint))
                self._counters.add("acked")
                self._emit(kind="ack", op="ack", outcome="acked", message=d.message)
            else:
                self._client._run(core.nack(self.topic, handle, delay,
                                                   d.message.endpoint))
                self._counters.add("nacked")
                self._emit(kind="ack", op="nack", outcome="nacked", message=d.message,
                           delay=delay)
        except LeaseLost as err:
            self._lost(d, err)
        except NaradError as err:
            self._counters.add("ack_failed")
            self._emit(kind="ack", op="ack" if ack else "nack", outcome="failed", error=err,
                       message=d.message)
            log.warning("narad: settling %s/%d@%d failed: %s", self.topic,
                        d.message.partition, d.message.offset, err)

    def _hand_back(self, d: plans.Delivery) -> None:
        try:
            self._client._run(core.nack(self.topic, d.message.receipt_handle or "", 0.0,
                                           d.message.endpoint))
            self._counters.add("handed_back")
        except NaradError as err:
            log.warning("narad: handing back %s/%d@%d failed (its lease will lapse): %s",
                        self.topic, d.message.partition, d.message.offset, err)

    def _finish(self, d: plans.Delivery) -> None:
        with self._cond:
            d.state = plans.State.DONE
            self._book.remove(d)
            self._cond.notify_all()

    def _lost(self, d: plans.Delivery, err: NaradError | None) -> None:
        with self._cond:
            if d.lost:
                return
            d.lost = True
            d.cancelled.set()
            self._cond.notify_all()
        self._counters.add("lease_lost")
        self._emit(kind="lease_lost", error=err, message=d.message)
        log.warning("narad: lease of %s/%d@%d lost; its handler is cancelled", self.topic,
                    d.message.partition, d.message.offset)

    # -- renewing

    def _renew_loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped.is_set():
                    return
            now = plans.monotonic()
            due, gone = self._book.due(now)
            for d in gone:
                self._lost(d, None)
                self._drop_pending(d)
            if due:
                self._renew(due)
            with self._cond:
                if self._stopped.is_set():
                    return
                self._cond.wait(self._book.next_check(plans.monotonic()))

    def _drop_pending(self, d: plans.Delivery) -> None:
        with self._cond:
            pending = d.state is plans.State.PENDING
        if pending:
            self._finish(d)

    def _renew(self, due: list[plans.Delivery]) -> None:
        for group in plans.renewal_groups(due, 1000):
            sent = plans.monotonic()
            # Bounded by the leases it renews: past their end a renewal is too late, and
            # the loop must see them gone (and cancel their handlers) rather than wait.
            left = min(d.lease_until for d in group) - sent
            try:
                results = self._client._run(core.ack_batch(
                    self.topic, plans.renewal_entries(group, self._book.window),
                    group[0].message.endpoint), max(0.05, left),
                    replace(self._client._policy, attempts=1))
            except NaradError as err:
                log.warning("narad: renewing %d leases of %s failed: %s", len(group),
                            self.topic, err)
                for d in group:
                    if plans.renewal_lost(err):
                        self._lost(d, err)
                    else:
                        self._book.renewal_failed(d, plans.monotonic())
                continue
            by_handle = {d.message.receipt_handle: d for d in group}
            for r in results:
                d = by_handle[r.receipt_handle]
                if r.ok:
                    self._book.renewed(d, sent)
                    self._counters.add("renewals")
                elif not plans.renewal_lost(r.error):
                    self._book.renewal_failed(d, plans.monotonic())
                else:
                    with self._cond:
                        settling = d.state in (plans.State.SETTLING, plans.State.DONE)
                    if not settling:
                        self._lost(d, r.error)
                        self._drop_pending(d)

    # -- stopping

    def _fail(self, err: NaradError | None) -> None:
        self.error = err
        threading.Thread(target=self.close, daemon=True, name="narad-close").start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait blocks until the consumer stopped; False on timeout.

        Raises the terminal error that stopped it, if one did.
        """
        done = self._stopped.wait(timeout)
        if done and self.error is not None:
            raise self.error
        return done

    def close(self, grace: Duration | None = None) -> None:
        """Close drains the consumer within ``grace`` seconds (default: its option).

        Closing twice is harmless; a second call waits for the first to finish.
        """
        with self._cond:
            if self._closed:
                first = False
            else:
                self._closed = first = True
                self._stopping = True
                self._cond.notify_all()
        if not first:
            self._stopped.wait()
            return
        # An idle consumer sits in a long poll: cut it rather than wait it out. The
        # broker answers a cut poll at once; what that answer (or one that had begun)
        # leased, the poll loop hands back.
        answering = self._cut.cut()
        g = self.options.grace if grace is None else core.seconds(grace)
        deadline = plans.monotonic() + g
        # Messages not started yet go back at once; running handlers get the grace.
        for d in self._book.held():
            with self._cond:
                pending = d.state is plans.State.PENDING and not d.lost
                if pending:
                    d.state = plans.State.DONE
            if pending:
                self._hand_back(d)
                self._finish(d)
        poller = self._threads[0] if self._threads else None
        if poller is not None and poller is not threading.current_thread():
            if answering:
                poller.join(core.ANSWER_GRACE)
                if poller.is_alive():
                    # No answer in time (a proxy in between may not pass the half-close
                    # on): end the poll as a read error, then let it hand back what it got.
                    self._cut.hard_cut()
                    poller.join(max(0.0, deadline - plans.monotonic()))
            else:  # cut before it began, or through a transport of the caller's
                poller.join(max(0.0, min(deadline - plans.monotonic(),
                                         self.options.wait + self._client._policy.timeout)))
        with self._cond:
            while len(self._book) and plans.monotonic() < deadline:
                self._cond.wait(deadline - plans.monotonic())
        for d in self._book.held():
            with self._cond:
                running = d.state is plans.State.RUNNING and not d.cancelled.is_set()
                if running:
                    d.cancelled.set()
            if running:
                self._emit(kind="handler", op="handle", outcome="abandoned", message=d.message)
                log.warning("narad: handler for %s/%d@%d outlived the grace period; "
                            "handing the message back", self.topic, d.message.partition,
                            d.message.offset)
                self._hand_back(d)
                self._finish(d)
        with self._cond:
            self._stopped.set()
            self._cond.notify_all()
        self._pool.shutdown(wait=False)
        self._cut.close()
        self._client._disown(self)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ---------------------------------------------------------------------------


class Replay(Iterator[Message]):
    """Replay iterates over a topic's log from a Position, without leases.

    ``position`` is where to resume after the last message returned; pass it to
    ``client.replay`` later (or persist it with ``Position.dumps``) to continue.
    """

    def __init__(self, client: Client, topic: str, start: Position,
                 partitions: Iterable[int] | None, follow: bool, batch: int,
                 poll_interval: float) -> None:
        self._client = client
        self.topic = topic
        self._start = start
        self._parts = None if partitions is None else list(partitions)
        self._follow = follow
        self._batch = max(1, min(1000, batch))
        self._poll = poll_interval
        self._plan: plans.ReplayPlan | None = None

    @property
    def position(self) -> Position:
        """Position is where to resume after the last message returned."""
        return self._start if self._plan is None else self._plan.position

    def _make_plan(self) -> plans.ReplayPlan:
        # A bounded replay needs every partition's end, and so does one from
        # Position.end(): the topic is read again (with the call's backoff and budget)
        # while one of them cannot be reached.
        call = (core.get_topic(self.topic) if self._follow and not self._start.at_end
                else core.replay_topic(self.topic, self._parts))
        info = self._client._run(call)
        return plans.ReplayPlan.from_topic(info, self._start, self._parts, self._follow,
                                           self._batch, self._poll)

    def __iter__(self) -> Replay:
        return self

    def __next__(self) -> Message:
        if self._plan is None:
            self._plan = self._make_plan()
        plan = self._plan
        while True:
            m = plan.take()
            if m is not None:
                return m
            step = plan.next()
            if step is None:
                raise StopIteration
            if isinstance(step, plans.Sleep):
                if self._client._closed:
                    raise StopIteration
                time.sleep(step.seconds)
                continue
            try:
                page = self._client._run(step.call)
            except NaradError as err:
                conflict = plan.incarnation_lost(err)
                if conflict is None:
                    raise
                raise conflict from err
            plan.on_read(step.partition, page)
            plans.report_damaged(self.topic, step.partition, page.damaged, self._client._emit)
