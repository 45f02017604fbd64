"""The asyncio client: :class:`AsyncClient`, with its Publisher, Consumer and Replay.

Tasks stand where the sync client has threads; every decision is made by ``_core`` and
``_plans``, shared with ``_sync.py``. Keep the two files in the same order and shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _core as core
from . import _plans as plans
from ._core import Duration
from ._sync import core_outgoing, warn_not_one_cluster
from .errors import BufferFull, Closed, Conflict, LeaseLost, NaradError
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

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncPublisher", "AsyncReplay"]

T = TypeVar("T")
log = logging.getLogger("narad")

AsyncHandler = Callable[[Message], Awaitable[object]] | Callable[[Message], object]
"""A consumer handler of the async client: return to ack, raise to hand the message back.

An ``async def`` handler runs on the event loop. A plain ``def`` handler runs in a worker
thread (``asyncio.to_thread``), so it may block without stalling the loop; like the sync
client's handlers it cannot be cancelled, and checks ``current_delivery().cancelled``.
"""


def is_async_handler(handler: Callable[..., object]) -> bool:
    """is_async_handler tells whether calling ``handler`` gives an awaitable to run on the loop."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class _Signal:
    """_Signal wakes every task waiting on it; check the condition, then wait."""

    def __init__(self) -> None:
        self._ev = asyncio.Event()

    def notify(self) -> None:
        self._ev.set()
        self._ev = asyncio.Event()

    async def wait(self, timeout: float | None = None) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._ev.wait(), timeout)


class _PollCut:
    """_PollCut lets a consumer's close end its long poll without losing its answer.

    Polls go through their own connection pool that keeps no idle connections, so each
    poll opens a connection and the ``trace`` extension hands over its socket. ``cut``
    half-closes that socket (``SHUT_WR``): the broker takes the end of the request's
    stream for the client gone and answers at once, with the messages it had leased
    already (which the consumer hands back) or with a 499 when it leased nothing. That
    answer is read. Closing the connection instead (cancelling the poll's task, as
    close did) drops an answer the broker has sent and the client not read yet, and its
    messages stay leased to nobody until their visibility timeout; a task's cancel can
    also land in the middle of reading it. As the sync client's ``_PollCut``.

    Through the caller's own transport (no socket to half-close) a cut cancels the
    request unless its answer has begun (its headers are in), which is then read. A
    half-closed poll not answered within ``ANSWER_GRACE`` (a proxy in between may not
    pass the half-close on) is cancelled.
    """

    def __init__(self, http: httpx.AsyncClient | None) -> None:
        self.http = http
        self._cut = asyncio.Event()
        self._sock: Any = None
        self._half_closed = False
        self.reading = False
        """True from the moment a poll's answer has begun until it is read."""

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        """Trace is the httpcore trace hook: it keeps each new connection's socket."""
        if name == "http11.response_closed.complete":
            self._sock = None
        elif name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            self._sock = None if stream is None else stream.get_extra_info("socket")
            if self._cut.is_set():
                self._half_close()

    def _half_close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)
                self._half_closed = True

    def cut(self) -> bool:
        """Cut ends the poll in progress, and any that starts after it.

        True when that poll ends by an answer still to be read, so close waits for it.
        """
        self._cut.set()
        self._half_close()
        return self.reading or self._half_closed

    def is_cut(self) -> bool:
        """is_cut tells whether cut was called."""
        return self._cut.is_set()

    async def send(self, http: httpx.AsyncClient, method: str, url: str, *,
                   params: tuple[tuple[str, str], ...], headers: dict[str, str],
                   content: bytes | None, timeout: float) -> httpx.Response:
        """Send sends a poll and reads its answer; Closed when cut with no answer to read."""
        if self._cut.is_set():
            raise Closed("the poll was cut by close", code="closed")
        client = http if self.http is None else self.http
        ext: dict[str, Any] = {} if self.http is None else {"trace": self.trace}
        request = client.build_request(method, url, params=params, headers=headers,
                                       content=content, timeout=timeout, extensions=ext)

        async def answer() -> httpx.Response:
            resp = await client.send(request, stream=True)
            self.reading = True  # in this task: a cut from now on leaves the answer be
            return resp

        sending = asyncio.ensure_future(answer())
        sending.add_done_callback(_retrieve)
        cutting = asyncio.ensure_future(self._cut.wait())
        try:
            await asyncio.wait({sending, cutting}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done() and self._half_closed:
                # The broker answers a half-closed poll at once: wait for that answer.
                await asyncio.wait({sending}, timeout=core.ANSWER_GRACE)
            if not sending.done():
                sending.cancel()
                await asyncio.wait({sending})
        except asyncio.CancelledError:
            sending.cancel()
            raise
        finally:
            cutting.cancel()
        if sending.cancelled():
            raise Closed("the poll was cut by close", code="closed")
        resp = sending.result()  # the transport's error, if it failed
        try:
            await resp.aread()
        finally:
            self.reading = False
            await resp.aclose()
        return resp

    async def pause(self, delay: float) -> None:
        """Pause sleeps between a poll's attempts; Closed at once when cut."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._cut.wait(), delay)
        if self._cut.is_set():
            raise Closed("the poll was cut by close", code="closed")

    async def aclose(self) -> None:
        """Aclose closes the polls' own connection pool."""
        if self.http is not None:
            await self.http.aclose()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """_retrieve takes a finished task's exception, so none is logged as never retrieved."""
    if not task.cancelled():
        task.exception()


class AsyncClient:
    """AsyncClient is the asyncio Narad client, with the same methods as :class:`Client`.

    Args are those of :class:`~narad.Client` (``transport`` is an
    ``httpx.AsyncBaseTransport``). Every call can be cancelled by cancelling its task
    and has its own deadline. Use ``async with``: leaving it drains the consumers and
    publishers it made, then closes connections. Closing twice is harmless.
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
        transport: httpx.AsyncBaseTransport | None = None,
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
        self._http = httpx.AsyncClient(auth=auth, transport=transport, headers=headers,
                                       timeout=timeout,
                                       limits=httpx.Limits(max_connections=200))
        self._auth = auth
        self._headers = headers
        self._own_transport = transport is None
        self._closed = False
        self._owned: list[AsyncConsumer | AsyncPublisher] = []
        self._probes: set[asyncio.Task[None]] = set()

    # -- plumbing

    @property
    def endpoints(self) -> list[str]:
        """Endpoints lists the configured base URLs."""
        return self._pool.endpoints

    def _emit(self, event: Event) -> None:
        core.emit_safely(self._on_event, event, log.warning)

    async def _run(self, call: core.Call[T], timeout: float | None = None,
                   policy: core.RetryPolicy | None = None, *, cut: _PollCut | None = None
                   ) -> T:
        if self._closed:
            raise Closed("the client is closed", code="closed")
        self._check_cluster()
        state = core.CallState(call, policy or self._policy, self._pool, self._emit, timeout)
        req = call.request
        while True:
            self._start_probes()
            url = state.endpoint()
            step: core.Step[T]
            try:
                if cut is None:
                    r = await self._http.request(req.method, url + req.path,
                                                 params=list(req.params),
                                                 headers=dict(req.headers),
                                                 content=req.content,
                                                 timeout=state.attempt_timeout())
                else:
                    r = await cut.send(self._http, req.method, url + req.path,
                                       params=req.params, headers=dict(req.headers),
                                       content=req.content, timeout=state.attempt_timeout())
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                step = state.on_transport_error(url, core.Transport.NOT_SENT, str(exc))
            except httpx.TimeoutException as exc:
                step = state.on_transport_error(url, core.Transport.TIMEOUT, str(exc))
            except httpx.TransportError as exc:
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
            if step.delay > 0 and cut is not None:
                await cut.pause(step.delay)
            elif step.delay > 0:
                await asyncio.sleep(step.delay)

    def _check_cluster(self) -> None:
        """_check_cluster starts the one-cluster check once, on first use, as a task."""
        if self._cluster_started:
            return
        self._cluster_started = True
        task = asyncio.get_running_loop().create_task(self._cluster_check())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _cluster_check(self) -> None:
        req = core.cluster_request()

        async def ask(url: str) -> tuple[str, Any]:
            try:
                r = await self._http.get(url + req.path, timeout=core.CLUSTER_CHECK_TIMEOUT)
                return url, (r.json() if r.status_code == 200 else None)
            except (httpx.HTTPError, RuntimeError, ValueError):
                return url, None  # the check never fails anything: no answer, no evidence

        got = await asyncio.gather(*(ask(u) for u in self._pool.endpoints))
        verdict = core.cluster_verdict({u: d for u, d in got if d is not None})
        if verdict is not None:
            warn_not_one_cluster(verdict)
        self._cluster_verdict = verdict or ""

    def _start_probes(self) -> None:
        for url in self._pool.probes_due():
            task = asyncio.get_running_loop().create_task(self._probe(url))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe(self, url: str) -> None:
        ok = False
        try:
            ok = (await self._http.get(url + "/readyz",
                                       timeout=self._policy.timeout)).status_code == 200
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
            return _PollCut(None)  # a transport of the caller's: no socket to half-close
        return _PollCut(httpx.AsyncClient(
            auth=self._auth, headers=self._headers, timeout=self._policy.timeout,
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=0)))

    def _own(self, x: AsyncConsumer | AsyncPublisher) -> None:
        if self._closed:
            raise Closed("the client is closed", code="closed")
        self._owned.append(x)

    def _disown(self, x: AsyncConsumer | AsyncPublisher) -> None:
        if x in self._owned:
            self._owned.remove(x)

    async def close(self) -> None:
        """Close drains the client's consumers and publishers, then closes connections."""
        for x in list(self._owned):
            await x.close()
        if self._closed:
            return
        self._closed = True
        for task in list(self._probes):
            task.cancel()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- producing

    async def produce(self, topic: str, body: Any, *, key: str | None = None,
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
        return await self._run(call, timeout, self._policy_for(allow_duplicates))

    async def produce_batch(self, topic: str, items: Iterable[Any], *,
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
                got = await self._run(
                    core.produce_entries(topic, [entries[i] for i in idx]), timeout, policy)
            except NaradError as err:
                for i in idx:
                    results[i] = err
                continue
            for i, r in zip(idx, got, strict=False):
                results[i] = r
        return core.batch_produced(results)

    def publisher(self, topic: str, *, max_batch: int = 100, max_batch_bytes: int = 1 << 20,
                  linger: Duration = 0.005, max_buffered: int = 10_000, block: bool = True,
                  allow_duplicates: bool | None = None) -> AsyncPublisher:
        """Publisher returns a batching producer for ``topic`` (see :class:`AsyncPublisher`).

        Call it from a running event loop: the publisher's sender is a task on it.
        """
        pub = AsyncPublisher(self, topic, max_batch=max_batch, max_batch_bytes=max_batch_bytes,
                        linger=core.seconds(linger), max_buffered=max_buffered, block=block,
                        allow_duplicates=allow_duplicates)
        self._own(pub)
        return pub

    # -- consuming

    async def receive(self, topic: str, *, max_messages: int = 1, wait: Duration = 10.0,
                timeout: float | None = None) -> list[Message]:
        """Receive takes up to ``max_messages`` messages under leases.

        It waits up to ``wait`` seconds (at most 20) for the first; an empty list means
        none arrived. Settle each with :meth:`ack`, :meth:`nack` or :meth:`extend`.
        """
        return await self._run(core.receive(topic, max_messages=max_messages, wait=wait), timeout)

    async def ack(self, message: Message | str, *, topic: str | None = None,
            timeout: float | None = None) -> None:
        """Ack settles a leased message for good (retried until confirmed).

        Raises LeaseLost when the lease was gone: the message is delivered again. A 410
        on a retry whose first attempt's reply was lost counts as success.
        """
        await self._run(core.ack(core.topic_of(message, topic), core.handle_of(message),
                                 core.endpoint_of(message)), timeout)

    async def nack(self, message: Message | str, delay: Duration = 0.0, *, topic: str | None = None,
             timeout: float | None = None) -> None:
        """Nack hands a leased message back: at once, or visible again after ``delay``."""
        await self._run(core.nack(core.topic_of(message, topic), core.handle_of(message), delay,
                                  core.endpoint_of(message)), timeout)

    async def extend(self, message: Message | str, duration: Duration | None = None, *,
               topic: str | None = None, timeout: float | None = None) -> None:
        """Extend renews a lease: for the topic's visibility timeout, or ``duration`` from now."""
        await self._run(core.extend(core.topic_of(message, topic), core.handle_of(message),
                                    duration, core.endpoint_of(message)), timeout)

    async def ack_batch(self, messages: Iterable[Message | str], *, topic: str | None = None,
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
                await asyncio.sleep(delay)
            try:
                got = await self._run(call, timeout)
            except NaradError as err:
                plan.on_error(err)
                continue
            plan.on_results(got)
        return plan.results()

    async def consume(self, topic: str, handler: AsyncHandler, *, concurrency: int = 1,
                wait: Duration = 10.0, renew: bool = True, max_lease: Duration = 3600.0,
                grace: Duration = 30.0, nack_delay: Duration | None = None,
                max_deliveries: int = 0, dead_letter_topic: str | None = None) -> AsyncConsumer:
        """Consume starts tasks that run ``handler`` on each message; see AsyncConsumer.

        ``handler`` is an ``async def`` (run on the loop, cancelled when its lease is
        lost) or a plain ``def`` (run in a worker thread, see :data:`AsyncHandler`).

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
        consumer = AsyncConsumer(self, topic, handler, opts)
        self._own(consumer)
        try:
            await consumer._start()
        except BaseException:
            self._disown(consumer)
            await consumer._cut.aclose()
            raise
        return consumer

    async def messages(self, topic: str, *, wait: Duration = 10.0, batch: int = 1
                       ) -> AsyncIterator[Message]:
        """Messages yields leased messages as they arrive, until the client closes.

        Each message must be settled by the caller (:meth:`ack`); leases are not renewed.
        Leaving the loop early (break, an exception, ``aclose()``) hands back at once the
        messages fetched with ``batch`` but never reached.
        """
        pending: list[Message] = []
        try:
            while not self._closed:
                try:
                    got = await self.receive(topic, max_messages=batch, wait=wait)
                except Closed:
                    return
                pending = list(reversed(got))
                while pending:
                    yield pending.pop()
        finally:
            for m in pending:
                with contextlib.suppress(NaradError):
                    await self.nack(m, timeout=5.0)

    def replay(self, topic: str, start: Position | None = None, *,
               partitions: Iterable[int] | None = None, follow: bool = False,
               batch: int = 100, poll_interval: Duration = 0.5) -> AsyncReplay:
        """Replay reads the log without leases from ``start`` (default: the beginning).

        Bounded (the default), it stops at the end each partition had when it started;
        with ``follow`` it waits for new messages forever. Its ``position`` after each
        message is where to resume.
        """
        return AsyncReplay(self, topic, start or Position(), partitions, follow, batch,
                      core.seconds(poll_interval))

    # -- topics

    async def create_topic(self, name: str, *, partitions: int | None = None,
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
        return await self._run(core.create_topic(name, settings), timeout)

    async def ensure_topic(self, name: str, *, timeout: float | None = None,
                     **settings: Any) -> TopicInfo:
        """ensure_topic creates the topic, or returns it when it exists already.

        ``settings`` are those of create_topic; an existing topic keeps its own (nothing
        is altered).
        """
        try:
            return await self.create_topic(name, timeout=timeout, **settings)
        except Conflict as e:
            if e.code != "topic_exists":
                raise
            return await self.get_topic(name, timeout=timeout)

    async def list_topics(self, *, timeout: float | None = None) -> list[TopicInfo]:
        """list_topics lists every topic, sorted by name."""
        return await self._run(core.list_topics(), timeout)

    async def get_topic(self, name: str, *, timeout: float | None = None) -> TopicInfo:
        """get_topic returns a topic's settings with one PartitionStats per partition."""
        return await self._run(core.get_topic(name), timeout)

    async def alter_topic(self, name: str, *, retention_ms: int | None = None,
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
        return await self._run(core.alter_topic(name, settings), timeout)

    async def delete_topic(self, name: str, *, incarnation: str | None = None,
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
        await self._run(core.delete_topic(name, incarnation), timeout)

    # -- fan-out and delay children

    async def attach_child(self, parent: str, child: str, *, delay: Duration | None = None,
                     timeout: float | None = None) -> Child:
        """attach_child copies every later message of ``parent`` to ``child`` (after ``delay``)."""
        return await self._run(core.attach_child(parent, child, delay), timeout)

    async def detach_child(self, parent: str, child: str, *, timeout: float | None = None) -> None:
        """detach_child stops copying to ``child``; both topics stay."""
        await self._run(core.detach_child(parent, child), timeout)

    async def list_children(self, parent: str, *, timeout: float | None = None) -> list[Child]:
        """list_children lists ``parent``'s children with their lag per partition."""
        return await self._run(core.list_children(parent), timeout)

    async def create_delay_child(self, parent: str, child: str, delay: Duration, *,
                           partitions: int | None = None,
                           visibility_timeout_ms: int | None = None,
                           timeout: float | None = None) -> TopicInfo:
        """create_delay_child creates ``child``, getting ``parent``'s messages ``delay`` later."""
        return await self.create_topic(child, partitions=partitions,
                                 visibility_timeout_ms=visibility_timeout_ms, parent=parent,
                                 fanout_delay_ms=int(core.ms_param(delay)), timeout=timeout)

    # -- users

    async def create_user(self, username: str, password: str, grants: Iterable[Grant] = (), *,
                    timeout: float | None = None) -> User:
        """create_user creates a user with grants (admin only)."""
        return await self._run(core.create_user(username, password, grants), timeout)

    async def list_users(self, *, timeout: float | None = None) -> list[User]:
        """list_users lists users and their grants."""
        return await self._run(core.list_users(), timeout)

    async def get_user(self, username: str, *, timeout: float | None = None) -> User:
        """get_user returns one user."""
        return await self._run(core.get_user(username), timeout)

    async def delete_user(self, username: str, *, timeout: float | None = None) -> None:
        """delete_user deletes a user."""
        await self._run(core.delete_user(username), timeout)

    async def replace_grants(self, username: str, grants: Iterable[Grant], *,
                       timeout: float | None = None) -> User:
        """replace_grants sets a user's grants to exactly ``grants``."""
        return await self._run(core.replace_grants(username, grants), timeout)

    async def change_password(self, username: str, new_password: str, *,
                        current_password: str | None = None, timeout: float | None = None
                        ) -> None:
        """change_password changes a password (a user passes ``current_password``)."""
        await self._run(core.change_password(username, new_password, current_password), timeout)

    # -- cluster membership (admin)

    async def get_cluster(self, *, timeout: float | None = None) -> ClusterInfo:
        """get_cluster returns the answering node's view: itself, the controller, the members.

        A single node is a cluster of one.
        """
        return await self._run(core.get_cluster(), timeout)

    async def list_members(self, *, timeout: float | None = None) -> list[Member]:
        """list_members lists the cluster's members."""
        return await self._run(core.list_members(), timeout)

    async def decommission(self, node: str, *, timeout: float | None = None) -> Member:
        """Decommission moves every replica off ``node``, then removes it (admin only).

        Returns the member, ``"decommissioning"``, once the broker has started; it leaves
        :meth:`list_members` when it holds nothing. A dead member's replicas are copied
        again from the survivors. A repeat returns the member as it is, so it is retried
        like a read. NotFound for an unknown node; Conflict for the last node, or one
        whose replicas no live node can take.
        """
        return await self._run(core.decommission(node), timeout)

    async def list_moves(self, *, timeout: float | None = None) -> list[Move]:
        """list_moves lists every partition move the cluster holds, newest first (admin only)."""
        return await self._run(core.list_moves(), timeout)

    async def move_partition(self, topic: str, partition: int, from_: str, to: str, *,
                             timeout: float | None = None) -> Move:
        """move_partition moves the replica of a partition on ``from_`` to ``to`` (admin only).

        Returns the move once the broker has started it; follow it with
        :meth:`list_moves`. An identical move under way is returned as it is (the same
        id), so it is retried like a read. NotFound for an unknown topic, partition or
        node; Conflict, with the broker's reason, when the move is impossible (``to`` is
        dead or holds a replica already, ``from_`` holds none, another move of the
        partition is under way).
        """
        return await self._run(core.move_partition(topic, partition, from_, to), timeout)

    async def cancel_move(self, move_id: str, *, timeout: float | None = None) -> None:
        """cancel_move cancels a move that is still copying (admin only).

        NotFound when no move has that id; Conflict once it is switching (it finishes)
        or has ended.
        """
        await self._run(core.cancel_move(move_id), timeout)

    async def rebalance(self, *, timeout: float | None = None) -> list[Move]:
        """Rebalance starts the moves that even out replicas and leaders (admin only).

        Returns the moves started now (possibly none); the broker starts the rest as
        those finish. A repeat starts only what is still needed.
        """
        return await self._run(core.rebalance(), timeout)

    async def force_leader(self, topic: str, partition: int, node: str, *,
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
        return await self._run(core.force_leader(topic, partition, node), timeout)

    # -- health

    async def ready(self, *, timeout: float | None = None) -> bool:
        """Ready tells whether a node answers /readyz with 200."""
        try:
            return await self._run(core.ready(), timeout)
        except NaradError:
            return False



# ---------------------------------------------------------------------------


class AsyncPublisher:
    """AsyncPublisher batches messages for one topic by count, bytes and linger.

    ``await publish(...)`` returns once the message is buffered, with an
    ``asyncio.Future`` that resolves to its :class:`~narad.Produced` or raises its own
    error: a refused batch is resent one message at a time so each gets its own answer.
    The buffer is bounded: publish waits when full, or raises BufferFull when made with
    ``block=False``. Closing flushes what is buffered.
    """

    def __init__(self, client: AsyncClient, topic: str, *, max_batch: int,
                 max_batch_bytes: int, linger: float, max_buffered: int, block: bool,
                 allow_duplicates: bool | None) -> None:
        self._client = client
        self.topic = topic
        self._buf: plans.BatchBuffer[asyncio.Future[Produced]] = plans.BatchBuffer(
            max_batch=min(core.MAX_BATCH, max(1, max_batch)),
            max_batch_bytes=min(core.MAX_BATCH_BYTES, max(1, max_batch_bytes)),
            linger=linger, max_buffered=max(1, max_buffered))
        self._block = block
        self._policy = client._policy_for(allow_duplicates)
        self._signal = _Signal()
        self._inflight = 0
        self._flushing = 0
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def publish(self, body: Any, *, key: str | None = None, partition: int | None = None,
                      timeout: float | None = None) -> asyncio.Future[Produced]:
        """Publish buffers one message and returns the future of its result."""
        entry = core.batch_entry(core_outgoing(body, key, partition))
        fut: asyncio.Future[Produced] = asyncio.get_running_loop().create_future()
        deadline = None if timeout is None else time.monotonic() + timeout
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
            await self._signal.wait(left)
        self._buf.add(plans.Pending(entry, core.batch_entry_size(entry), fut, time.monotonic()))
        self._signal.notify()
        return fut

    async def flush(self, timeout: float | None = None) -> None:
        """Flush sends everything buffered now and waits until every result is in."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._flushing += 1
        self._signal.notify()
        try:
            while self._buf.items or self._inflight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise NaradError("flush did not finish in time", code="timeout")
                await self._signal.wait(left)
        finally:
            self._flushing -= 1

    async def close(self, timeout: float | None = None) -> None:
        """Close flushes, then stops the publisher; closing twice is harmless."""
        if self._closing:
            return
        try:
            await self.flush(timeout)
        finally:
            self._closing = True
            self._signal.notify()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except asyncio.TimeoutError:
                self._task.cancel()
            self._client._disown(self)

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _loop(self) -> None:
        while True:
            while True:
                wait = self._buf.wait_time(time.monotonic(), self._flushing > 0 or self._closing)
                if wait == 0.0:
                    break
                if wait is None and self._closing:
                    return
                await self._signal.wait(wait)
            batch = self._buf.take()
            self._inflight += len(batch)
            self._signal.notify()
            try:
                await self._send(batch)
            finally:
                self._inflight -= len(batch)
                self._signal.notify()

    async def _send(self, batch: list[plans.Pending[asyncio.Future[Produced]]]) -> None:
        try:
            results = await self._client._run(
                core.produce_entries(self.topic, [p.entry for p in batch]), None, self._policy)
        except NaradError as err:
            if plans.split_on_error(err, len(batch)):
                for p in batch:
                    await self._send([p])
                return
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            return
        except Exception as exc:  # never leave a future unresolved
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, r in zip(batch, results, strict=False):
            if not p.future.done():
                p.future.set_result(r)


# ---------------------------------------------------------------------------


class AsyncConsumer:
    """AsyncConsumer runs an async handler over a topic's messages, one task each.

    It polls only for as many messages as there are free slots (``concurrency``),
    renews each lease before two thirds of its window while the message waits or runs
    (up to ``max_lease``), acks on success with confirmed retries, and hands the message
    back on an exception. When a lease is lost the handler's task is cancelled and its
    result never acked. Transient errors are retried and reported; a terminal one (401,
    403, topic gone) stops it, and :meth:`wait` raises it.

    :meth:`close` drains: stop polling, hand back messages never started, let running
    handlers finish within the grace period (acks included), cancel and hand back the
    rest.
    """

    def __init__(self, client: AsyncClient, topic: str, handler: AsyncHandler,
                 opts: plans.ConsumerOptions) -> None:
        self._client = client
        self.topic = topic
        self._handler = handler
        self._in_thread = not is_async_handler(handler)
        self.options = opts
        self._counters = plans.Counters()
        self._signal = _Signal()
        self._stopping = False
        self._stopped = asyncio.Event()
        self._closed = False
        self.error: NaradError | None = None
        self._book = plans.LeaseBook(1.0, opts.max_lease, opts.renew)
        self._tasks: set[asyncio.Task[None]] = set()
        self._poll_task: asyncio.Task[None] | None = None
        self._polling = False
        self._cut = client._poll_cut()
        self._renew_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None

    @property
    def stats(self) -> plans.ConsumerStats:
        """Stats is a snapshot of what the consumer did so far."""
        return self._counters.snapshot()

    @property
    def running(self) -> bool:
        """Running is True until the consumer stopped (closed or on a terminal error)."""
        return not self._stopped.is_set()

    async def _start(self) -> None:
        info = await self._client.get_topic(self.topic)
        self._book.window = info.visibility_timeout_ms / 1000.0
        loop = asyncio.get_running_loop()
        self._poll_task = loop.create_task(self._poll_loop())
        self._renew_task = loop.create_task(self._renew_loop())

    def _emit(self, **kw: Any) -> None:
        self._client._emit(Event(topic=self.topic, **kw))

    def _free(self) -> int:
        return self.options.concurrency - len(self._book)

    # -- polling

    async def _poll_loop(self) -> None:
        retry = 0
        while True:
            while not self._stopping and self._free() <= 0:
                await self._signal.wait()
            if self._stopping:
                return
            n = self._free()
            leased_at = plans.monotonic()
            self._polling = True
            try:
                got = await self._client._run(core.receive(self.topic, max_messages=n,
                                                           wait=self.options.wait),
                                              cut=self._cut)
            except Closed:
                if not self._stopping:  # the client was closed under the consumer
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
                if not self._stopping:
                    await self._signal.wait(delay)
                continue
            finally:
                self._polling = False
            retry = 0
            back: list[plans.Delivery] = []
            for m in got:
                self._counters.add("received")
                d = plans.Delivery(m, leased_at, self._book.window)
                if self._stopping:
                    back.append(d)
                    continue
                self._book.add(d)
                task = asyncio.get_running_loop().create_task(self._process(d))
                d.task = task
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if back:
                # Answered to a poll that close let finish: all go back at once, together.
                await asyncio.gather(*(self._hand_back(d) for d in back))
            self._signal.notify()  # the renewer plans its next wake-up anew

    # -- handling

    async def _process(self, d: plans.Delivery) -> None:
        if d.state is not plans.State.PENDING or d.lost:
            return
        d.state = plans.State.RUNNING
        if self.options.dead_letters(d):
            try:
                await self._dead_letter(d)
            finally:
                self._finish(d)
            return
        token = plans.set_current(d)
        wall, t0 = time.time(), plans.monotonic()
        exc: BaseException | None = None
        try:
            if self._in_thread:
                # A plain def: run it off the loop (the delivery context goes along).
                result = await asyncio.to_thread(self._handler, d.message)
            else:
                result = self._handler(d.message)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            if not d.cancelled.is_set():
                self._finish(d)  # cancelled from outside: free the slot, let it lapse
                raise
        except BaseException as e:  # as the blocking Consumer: SystemExit from a handler too
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
                await self._settle(d, ack=True, delay=0.0)
            else:
                await self._settle(d, ack=False, delay=delay)
        finally:
            self._finish(d)

    def _settling(self, d: plans.Delivery) -> bool:
        """_settling moves ``d`` on to settling; True when it was given up meanwhile."""
        gave_up = d.cancelled.is_set()
        if not gave_up:
            d.state = plans.State.SETTLING
        return gave_up

    async def _dead_letter(self, d: plans.Delivery) -> None:
        """_dead_letter moves a message delivered too often to the dead-letter topic.

        It acks the message only once the copy is stored; when the copy fails, the
        message is handed back with the backoff and tried again on its next delivery.
        """
        m = d.message
        dlq = self.options.dead_letter_topic or ""
        body, ctype = plans.dead_letter_body(d, self.options.max_deliveries)
        try:
            await self._client._run(core.produce(dlq, body, key=m.key, content_type=ctype))
        except NaradError as err:
            delay = plans.poison_backoff(d.attempt)
            log.warning("narad: moving %s/%d@%d to %s failed; handing it back for %.1fs: %s",
                        self.topic, m.partition, m.offset, dlq, delay, err)
            if not self._settling(d):
                await self._settle(d, ack=False, delay=delay)
            return
        self._counters.add("dead_lettered")
        log.warning("narad: %s/%d@%d was delivered %d times; moved to %s", self.topic,
                    m.partition, m.offset, d.attempt, dlq)
        if not self._settling(d):
            await self._settle(d, ack=True, delay=0.0)

    async def _settle(self, d: plans.Delivery, *, ack: bool, delay: float) -> None:
        handle = d.message.receipt_handle or ""
        try:
            if ack:
                await self._client._run(core.ack(self.topic, handle, d.message.endpoint))
                self._counters.add("acked")
                self._emit(kind="ack", op="ack", outcome="acked", message=d.message)
            else:
                await self._client._run(core.nack(self.topic, handle, delay,
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

    async def _hand_back(self, d: plans.Delivery) -> None:
        try:
            await self._client._run(core.nack(self.topic, d.message.receipt_handle or "", 0.0,
                                           d.message.endpoint))
            self._counters.add("handed_back")
        except NaradError as err:
            log.warning("narad: handing back %s/%d@%d failed (its lease will lapse): %s",
                        self.topic, d.message.partition, d.message.offset, err)

    def _finish(self, d: plans.Delivery) -> None:
        d.state = plans.State.DONE
        self._book.remove(d)
        self._signal.notify()

    def _lost(self, d: plans.Delivery, err: NaradError | None) -> None:
        if d.lost:
            return
        d.lost = True
        d.cancelled.set()
        running = d.state is plans.State.RUNNING
        if running and d.task is not None:
            d.task.cancel()
        self._signal.notify()
        self._counters.add("lease_lost")
        self._emit(kind="lease_lost", error=err, message=d.message)
        log.warning("narad: lease of %s/%d@%d lost; its handler is cancelled", self.topic,
                    d.message.partition, d.message.offset)

    # -- renewing

    async def _renew_loop(self) -> None:
        while not self._stopped.is_set():
            now = plans.monotonic()
            due, gone = self._book.due(now)
            for d in gone:
                self._lost(d, None)
                self._drop_pending(d)
            if due:
                await self._renew(due)
            if self._stopped.is_set():
                return
            await self._signal.wait(self._book.next_check(plans.monotonic()))

    def _drop_pending(self, d: plans.Delivery) -> None:
        if d.state is plans.State.PENDING:
            self._finish(d)

    async def _renew(self, due: list[plans.Delivery]) -> None:
        for group in plans.renewal_groups(due, 1000):
            sent = plans.monotonic()
            # Bounded by the leases it renews: past their end a renewal is too late, and
            # the loop must see them gone (and cancel their handlers) rather than wait.
            left = min(d.lease_until for d in group) - sent
            try:
                results = await self._client._run(core.ack_batch(
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
                elif d.state not in (plans.State.SETTLING, plans.State.DONE):
                    self._lost(d, r.error)
                    self._drop_pending(d)

    # -- stopping

    def _fail(self, err: NaradError | None) -> None:
        self.error = err
        self._close_task = asyncio.get_running_loop().create_task(self.close())

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait waits until the consumer stopped; False on timeout.

        Raises the terminal error that stopped it, if one did.
        """
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        if self.error is not None:
            raise self.error
        return True

    async def close(self, grace: Duration | None = None) -> None:
        """Close drains the consumer within ``grace`` seconds (default: its option).

        Closing twice is harmless; a second call waits for the first to finish.
        """
        if self._closed:
            await self._stopped.wait()
            return
        self._closed = True
        self._stopping = True
        self._signal.notify()
        poller = self._poll_task
        # An idle consumer sits in a long poll: cut it rather than wait it out. The
        # broker answers a cut poll at once; what that answer (or one that had begun)
        # leased, the poll loop hands back.
        answering = self._cut.cut()
        g = self.options.grace if grace is None else core.seconds(grace)
        deadline = plans.monotonic() + g
        # Messages not started yet go back at once; running handlers get the grace.
        for d in self._book.held():
            if d.state is plans.State.PENDING and not d.lost:
                d.state = plans.State.DONE
                await self._hand_back(d)
                self._finish(d)
        if poller is not None and poller is not asyncio.current_task() and not poller.done():
            left = deadline - plans.monotonic()
            bound = (max(left, core.ANSWER_GRACE) if answering
                     else min(left, self.options.wait + self._client._policy.timeout))
            done, _ = await asyncio.wait({poller}, timeout=max(0.0, bound))
            if not done:
                poller.cancel()
        while len(self._book) and plans.monotonic() < deadline:
            await self._signal.wait(deadline - plans.monotonic())
        for d in self._book.held():
            if d.state is plans.State.RUNNING and not d.cancelled.is_set():
                d.cancelled.set()
                if d.task is not None:
                    d.task.cancel()
                self._emit(kind="handler", op="handle", outcome="abandoned", message=d.message)
                log.warning("narad: handler for %s/%d@%d outlived the grace period; "
                            "handing the message back", self.topic, d.message.partition,
                            d.message.offset)
                await self._hand_back(d)
                self._finish(d)
        self._stopped.set()
        self._signal.notify()
        if self._renew_task is not None:
            self._renew_task.cancel()
        await self._cut.aclose()
        self._client._disown(self)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


# ---------------------------------------------------------------------------


class AsyncReplay(AsyncIterator[Message]):
    """AsyncReplay iterates over a topic's log from a Position, without leases.

    ``position`` is where to resume after the last message returned; pass it to
    ``client.replay`` later (or persist it with ``Position.dumps``) to continue.
    """

    def __init__(self, client: AsyncClient, topic: str, start: Position,
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

    async def _make_plan(self) -> plans.ReplayPlan:
        # A bounded replay needs every partition's end, and so does one from
        # Position.end(): the topic is read again (with the call's backoff and budget)
        # while one of them cannot be reached.
        call = (core.get_topic(self.topic) if self._follow and not self._start.at_end
                else core.replay_topic(self.topic, self._parts))
        info = await self._client._run(call)
        return plans.ReplayPlan.from_topic(info, self._start, self._parts, self._follow,
                                           self._batch, self._poll)

    def __aiter__(self) -> AsyncReplay:
        return self

    async def __anext__(self) -> Message:
        if self._plan is None:
            self._plan = await self._make_plan()
        plan = self._plan
        while True:
            m = plan.take()
            if m is not None:
                return m
            step = plan.next()
            if step is None:
                raise StopAsyncIteration
            if isinstance(step, plans.Sleep):
                if self._client._closed:
                    raise StopAsyncIteration
                await asyncio.sleep(step.seconds)
                continue
            try:
                page = await self._client._run(step.call)
            except NaradError as err:
                conflict = plan.incarnation_lost(err)
                if conflict is None:
                    raise
                raise conflict from err
            plan.on_read(step.partition, page)
            plans.report_damaged(self.topic, step.partition, page.damaged, self._client._emit)
