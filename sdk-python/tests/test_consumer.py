"""The consume loop (SDK contract rules 1, 6 and 7), sync and async, on the broker."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import pytest

import narad
from conftest import Bridge, Driver, wait_for


class Record:
    """Thread-safe record of what handlers saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[narad.Message] = []

    def __call__(self, msg: narad.Message) -> None:
        with self.lock:
            self.items.append(msg)

    def __len__(self) -> int:
        with self.lock:
            return len(self.items)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.items]


def test_consume_acks_each_message_once(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(partitions=2)
    c.produce_batch(t, [f"m{i}" for i in range(20)])
    rec = Record()
    with c.consume(t, drv.handler(rec), concurrency=4, wait=1) as con:
        wait_for(lambda: con.stats.acked == 20, what="20 acks")
        assert con.running
    assert not con.running
    assert sorted(rec.bodies()) == sorted(f"m{i}".encode() for i in range(20))
    st = con.stats
    assert isinstance(st, narad.ConsumerStats)
    assert (st.received, st.succeeded, st.acked, st.failed, st.lease_lost) == (20, 20, 20, 0, 0)
    info = c.get_topic(t)
    assert sum(s.backlog for s in info.partition_stats) == 0
    assert c.receive(t, wait=0) == []


def test_lease_is_renewed_beyond_the_visibility_timeout(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(visibility_timeout_ms=1000)
    c.produce(t, b"slow")
    rec = Record()
    with c.consume(t, drv.slow(2.5, rec), concurrency=2, wait=1) as con:
        wait_for(lambda: con.stats.acked == 1, timeout=30, what="the slow message's ack")
        # Had the lease lapsed, the second worker would have received it again.
        assert len(rec) == 1
    st = con.stats
    assert st.received == 1 and st.lease_lost == 0 and st.renewals >= 2
    assert rec.items[0].delivery_attempt == 1
    assert c.receive(t, wait=0) == []


def test_lease_loss_cancels_the_handler_and_never_acks(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(visibility_timeout_ms=1500)
    c.produce(t, b"doomed")
    started, cancelled = Record(), Record()
    events: list[narad.Event] = []
    watcher = drv.new_client(on_event=events.append)
    con = watcher.consume(t, drv.until_cancelled(started, cancelled), wait=1)
    try:
        wait_for(lambda: len(started) == 1, what="handler start")
        # Someone else settles the message under the consumer's feet: the lease is gone,
        # so the next renewal answers 410.
        c.nack(started.items[0])
        [again] = wait_for(lambda: c.receive(t, wait=1), what="the handed back message")
        c.extend(again, 60)
        con_lease = started.items[0]
        wait_for(lambda: len(cancelled) == 1, timeout=30, what="handler cancelled")
        assert cancelled.items[0].offset == con_lease.offset
        wait_for(lambda: con.stats.lease_lost == 1, what="lease_lost counted")
        assert con.stats.acked == 0
        assert any(e.kind == "lease_lost" for e in events)
        # The other holder's lease is intact: the consumer never acked it.
        c.ack(again)
    finally:
        con.close(grace=5)


def test_max_lease_stops_renewal_and_cancels(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(visibility_timeout_ms=500)
    c.produce(t, b"forever")
    started, cancelled = Record(), Record()
    with c.consume(t, drv.until_cancelled(started, cancelled), wait=1, max_lease=1.2) as con:
        wait_for(lambda: len(cancelled) == 1, timeout=30, what="cancel at max lease")
        assert con.stats.acked == 0 and con.stats.lease_lost >= 1


def test_handler_errors_nack_with_delay_and_never_kill_the_loop(drv: Driver) -> None:
    c = drv.client
    t = drv.topic()
    c.produce_batch(t, [b"boom", b"fine", b"later"])
    seen = Record()

    def fn(msg: narad.Message) -> None:
        first = msg.delivery_attempt == 1
        seen(msg)
        if msg.body == b"boom" and first:
            raise RuntimeError("handler bug")
        if msg.body == b"later" and first:
            raise narad.Nack(delay=0.5)

    with c.consume(t, drv.handler(fn), concurrency=2, wait=1, nack_delay=0.2) as con:
        wait_for(lambda: con.stats.acked == 3, timeout=30, what="three acks")
    st = con.stats
    assert (st.failed, st.nacked, st.succeeded) == (2, 2, 3)
    attempts = sorted((m.body, m.delivery_attempt) for m in seen.items)
    assert attempts == [(b"boom", 1), (b"boom", 2), (b"fine", 1), (b"later", 1),
                        (b"later", 2)]


def test_fetches_only_for_free_workers(drv: Driver) -> None:
    c = drv.client
    t = drv.topic()
    c.produce_batch(t, [f"x{i}" for i in range(5)])
    gate = threading.Event()
    rec = Record()

    def fn(msg: narad.Message) -> None:
        rec(msg)
        gate.wait(30)

    if drv.is_async:
        import asyncio

        async def afn(msg: narad.Message) -> None:
            rec(msg)
            while not gate.is_set():
                await asyncio.sleep(0.01)
        handler = afn
    else:
        handler = fn
    with c.consume(t, handler, concurrency=2, wait=1) as con:
        wait_for(lambda: len(rec) == 2, what="two running")
        time.sleep(0.3)  # negative check: nothing more is taken while both workers are busy
        info = c.get_topic(t)
        assert info.partition_stats[0].in_flight == 2
        assert con.stats.received == 2
        gate.set()
        wait_for(lambda: con.stats.acked == 5, what="all acked")


def test_close_drains_running_handlers_and_hands_back(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(visibility_timeout_ms=30_000)
    c.produce_batch(t, [b"a", b"b"])
    started, done = Record(), Record()

    def fn(msg: narad.Message) -> None:
        done(msg)

    if drv.is_async:
        import asyncio

        async def h(msg: narad.Message) -> None:
            started(msg)
            await asyncio.sleep(1.0)
            fn(msg)
    else:
        def h(msg: narad.Message) -> None:  # type: ignore[misc]
            started(msg)
            time.sleep(1.0)
            fn(msg)
    con = c.consume(t, h, concurrency=2, wait=1)
    wait_for(lambda: len(started) == 2, what="both started")
    con.close(grace=20)  # running handlers finish, and their acks are flushed
    assert len(done) == 2 and con.stats.acked == 2
    assert not con.running
    con.close()  # twice is harmless
    assert con.wait(1) is True

    # A handler that outlives the grace period is cancelled and its message handed back.
    c.produce(t, b"stuck")
    started2, cancelled2 = Record(), Record()
    con2 = c.consume(t, drv.until_cancelled(started2, cancelled2), wait=1)
    wait_for(lambda: len(started2) == 1, what="stuck handler start")
    t0 = time.monotonic()
    con2.close(grace=0.5)
    assert time.monotonic() - t0 < 10
    wait_for(lambda: len(cancelled2) == 1, what="stuck handler cancelled")
    assert con2.stats.acked == 0
    [back] = wait_for(lambda: c.receive(t, wait=1), what="handed back message")
    assert back.body == b"stuck" and back.delivery_attempt == 2
    c.ack(back)


def test_client_close_drains_its_consumers(drv: Driver) -> None:
    own = drv.new_client()
    t = drv.topic()
    own.produce(t, b"z")
    started, rec = Record(), Record()
    # Wait for the handler to start, not just for the message to arrive: a message
    # received but not started yet is handed back by the drain, not handled.
    con = own.consume(t, _start_then_slow(drv, started, rec), wait=1)
    wait_for(lambda: len(started) == 1, what="handler started")
    own.close()
    assert not con.running and len(rec) == 1 and con.stats.acked == 1


def _start_then_slow(drv: Driver, started: Record, done: Record) -> Any:
    """A handler that reports its start, works 0.5 s, then reports it finished."""
    if not drv.is_async:
        def h(msg: narad.Message) -> None:
            started(msg)
            time.sleep(0.5)
            done(msg)
        return h

    async def ah(msg: narad.Message) -> None:
        started(msg)
        await asyncio.sleep(0.5)
        done(msg)
    return ah


def test_terminal_error_stops_the_loop_and_says_so(drv: Driver) -> None:
    c = drv.client
    with pytest.raises(narad.NotFound):
        c.consume(f"nope-{drv.mode}", drv.handler(lambda m: None))
    t = drv.topic()
    events: list[narad.Event] = []
    watcher = drv.new_client(on_event=events.append)
    con = watcher.consume(t, drv.handler(lambda m: None), wait=1)
    c.delete_topic(t)
    with pytest.raises(narad.NotFound):
        con.wait(30)
    assert not con.running
    assert isinstance(con.error, narad.NotFound)
    assert any(e.kind == "poll_error" and e.outcome == "terminal" for e in events)


def test_retry_tiers_route_to_tier_then_parking(drv: Driver) -> None:
    c = drv.client
    base = drv.topic()
    tiers = narad.RetryTiers(base, [(base + ".retry-1", 0.3)], base + ".parked")
    if drv.is_async:
        assert drv.lt is not None
        drv.lt.run(tiers.ensure_topics_async(c._t, partitions=1))
    else:
        tiers.ensure_topics(c, partitions=1)
    attempts = Record()

    def fn(msg: narad.Message) -> None:
        attempts(msg)
        raise ValueError("always fails")

    wrapped = (tiers.wrap_async(c._t, drv.handler(fn)) if drv.is_async
               else tiers.wrap(c, fn))
    env = narad.Envelope.wrap({"order": 7}, headers={"h": "v"})
    c.produce(base, env)
    consumers = [c.consume(src, wrapped, wait=1) for src in tiers.source_topics()]
    try:
        parked = wait_for(lambda: list(c.replay(tiers.parking_topic)), timeout=30,
                          what="the parked message")
    finally:
        for con in consumers:
            con.close()
    assert len(attempts) == 2  # main topic, then the tier
    assert all(m.json() == {"order": 7} for m in attempts.items)
    out = narad.Envelope.decode(parked[0].body)
    assert out.id == env.id and out.attempt == 2 and out.headers == {"h": "v"}
    assert out.last_error == "always fails" and out.origin == base
    assert out.json() == {"order": 7}


def test_retry_tiers_early_message_does_not_block_a_ready_one(drv: Driver) -> None:
    # With max_in_flight_per_partition 1, an envelope whose not_before is an hour away
    # (another producer's, or an older SDK's) must not stop the ready message behind it.
    # Holding it with a delayed nack kept the partition's only in-flight slot for the hour.
    c = drv.client
    base = drv.topic(max_in_flight_per_partition=1)
    tiers = narad.RetryTiers(base, [(base + ".retry-1", 3600)], base + ".parked")
    early = dataclasses.replace(narad.Envelope.wrap("early"),
                                not_before=int(time.time() * 1000) + 3_600_000)
    c.produce(base, early)
    c.produce(base, narad.Envelope.wrap("ready"))
    seen = Record()
    wrapped = (tiers.wrap_async(c._t, drv.handler(seen)) if drv.is_async
               else tiers.wrap(c, seen))
    with c.consume(base, wrapped, wait=0.2):
        wait_for(lambda: len(seen) == 2, timeout=30,
                 what="both messages handled (the early one holds the only in-flight slot)")
    assert sorted(seen.bodies()) == [b"early", b"ready"]


def _start_tiers(drv: Driver, tiers: narad.RetryTiers, fn: Any, **kw: Any) -> list[Any]:
    """_start_tiers runs RetryTiers.consume in the flavour under test."""
    if not drv.is_async:
        return tiers.consume(drv.client, fn, **kw)
    assert drv.lt is not None
    got = drv.lt.run(tiers.consume_async(drv.client._t, drv.handler(fn), **kw))
    return [Bridge(con, drv.lt) for con in got]


def test_retry_tiers_waiting_message_holds_no_lease(drv: Driver) -> None:
    # A failed message waits in its tier's retry topic until the broker copies it to the
    # delay child: no topic of the tiers holds it leased meanwhile.
    c = drv.client
    base = drv.topic(max_in_flight_per_partition=1)
    tiers = narad.RetryTiers(base, [narad.RetryTier(base + ".retry-1", 4)], base + ".parked")
    if drv.is_async:
        assert drv.lt is not None
        drv.lt.run(tiers.ensure_topics_async(c._t, partitions=1, max_in_flight_per_partition=1))
    else:
        tiers.ensure_topics(c, partitions=1, max_in_flight_per_partition=1)
    assert c.get_topic(base + ".retry-1.due").parent == base + ".retry-1"
    assert c.get_topic(base + ".retry-1.due").fanout_delay_ms == 4000
    c.produce(base, b"w")
    lock = threading.Lock()
    attempts: list[float] = []

    def fn(msg: narad.Message) -> None:
        with lock:
            attempts.append(time.monotonic())
            if len(attempts) == 1:
                raise ValueError("not yet")

    consumers = _start_tiers(drv, tiers, fn, wait=0.2)
    try:
        wait_for(lambda: len(attempts) >= 1, timeout=30, what="the first attempt")
        # The failure is routed, then the original acked: wait for that ack.
        wait_for(lambda: c.get_topic(base).partition_stats[0].ack_frontier == 1, timeout=30,
                 what="the failed original acked on the main topic")
        # While it waits (4 s), no topic holds it leased. Polled for a while: a hold,
        # when there is one, starts a moment after the failure.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            with lock:
                assert len(attempts) == 1, "the retry came before the tier's delay"
            for topic in (base, base + ".retry-1", base + ".retry-1.due"):
                for st in c.get_topic(topic).partition_stats:
                    assert st.in_flight == 0, f"{topic} holds a lease while the message waits"
            time.sleep(0.05)
        wait_for(lambda: len(attempts) == 2, timeout=30, what="the retry from the tier")
    finally:
        for con in consumers:
            con.close()
    assert attempts[1] - attempts[0] >= 3.5, "the retry came before the tier's 4 s delay"
    assert list(c.replay(tiers.parking_topic)) == []


def test_retry_tiers_refuse_a_due_topic_with_another_delay(drv: Driver) -> None:
    # A delay child keeps the delay it was made with: a tier whose due topic exists with
    # another delay would wait the wrong time, so ensure_topics refuses it.
    c = drv.client
    base = drv.topic()
    c.create_topic(base + ".retry-1", partitions=1)
    c.create_delay_child(base + ".retry-1", base + ".retry-1.due", 60)
    tiers = narad.RetryTiers(base, [(base + ".retry-1", 5)], base + ".parked")
    with pytest.raises(narad.Conflict, match="delete it or name another due topic"):
        if drv.is_async:
            assert drv.lt is not None
            drv.lt.run(tiers.ensure_topics_async(c._t, partitions=1))
        else:
            tiers.ensure_topics(c, partitions=1)
    same = narad.RetryTiers(base, [(base + ".retry-1", 60)], base + ".parked")
    if drv.is_async:
        assert drv.lt is not None
        drv.lt.run(same.ensure_topics_async(c._t, partitions=1))
    else:
        same.ensure_topics(c, partitions=1)  # the same delay: accepted as it is
    assert c.get_topic(base + ".parked").name == base + ".parked"


def test_closing_an_idle_consumer_cuts_its_long_poll(drv: Driver) -> None:
    t = drv.topic()
    con = drv.client.consume(t, drv.handler(lambda m: None), wait=15)
    if drv.is_async:
        wait_for(lambda: con._polling, what="the long poll under way")
    else:
        wait_for(lambda: con._cut._sock is not None, what="the long poll under way")
    t0 = time.monotonic()
    con.close()
    assert time.monotonic() - t0 < 5  # not the 15 s the poll would wait
    assert not con.running and con.error is None
    drv.client.produce(t, b"after")  # the cut poll leased nothing: the message is there
    assert [m.body for m in drv.client.receive(t, wait=5)] == [b"after"]


def test_a_failing_message_comes_back_after_a_growing_delay(drv: Driver) -> None:
    t = drv.topic()
    drv.client.produce(t, b"poison")
    runs: list[float] = []

    def fail(m: narad.Message) -> None:
        runs.append(time.monotonic())
        raise RuntimeError("always fails")

    with drv.client.consume(t, drv.handler(fail), wait=1) as con:
        wait_for(lambda: len(runs) >= 2, timeout=30, what="a redelivery")
        assert con.stats.nacked >= 1
    assert runs[1] - runs[0] >= 0.45  # the first backoff: 0.5-1 s, not at once


def test_max_deliveries_moves_a_message_to_the_dead_letter_topic(drv: Driver) -> None:
    t = drv.topic()
    dlq = drv.topic()
    drv.client.produce(t, {"id": 7}, key="k7")
    runs: list[int] = []

    def fail(m: narad.Message) -> None:
        runs.append(m.delivery_attempt or 0)
        raise RuntimeError("always fails")

    with pytest.raises(ValueError, match="dead_letter_topic"):
        drv.client.consume(t, drv.handler(fail), max_deliveries=2)
    with drv.client.consume(t, drv.handler(fail), wait=1, max_deliveries=2,
                            dead_letter_topic=dlq) as con:
        wait_for(lambda: con.stats.dead_lettered == 1, timeout=60, what="the dead letter")
        wait_for(lambda: con.stats.acked == 1, timeout=30, what="the original acked")
    assert runs == [1, 2]  # the third delivery went to the DLQ without running the handler
    moved = list(drv.client.replay(dlq))
    assert [(m.body, m.key) for m in moved] == [(b'{"id":7}', "k7")]
    info = drv.client.get_topic(t)
    assert sum(s.backlog for s in info.partition_stats) == 0
