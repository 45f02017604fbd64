"""What only the asyncio client has: task cancellation of any call, written as async tests."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

import narad
from conftest import Broker


async def test_cancelling_a_long_poll_returns_at_once(broker: Broker) -> None:
    async with narad.AsyncClient(broker.url) as c:
        t = f"a-{uuid.uuid4().hex[:8]}"
        await c.create_topic(t, partitions=1)
        task = asyncio.create_task(c.receive(t, wait=15))
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 2
        # The client still works after a cancelled call.
        await c.produce(t, b"x")
        assert [m.body for m in await c.receive(t, wait=5)] == [b"x"]


async def test_wait_for_bounds_any_call(broker: Broker) -> None:
    async with narad.AsyncClient(broker.url) as c:
        t = f"a-{uuid.uuid4().hex[:8]}"
        await c.create_topic(t, partitions=1)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.receive(t, wait=10), 0.3)


async def test_messages_and_replay_are_async_iterators(broker: Broker) -> None:
    async with narad.AsyncClient(broker.url) as c:
        t = f"a-{uuid.uuid4().hex[:8]}"
        await c.create_topic(t, partitions=1)
        await c.produce_batch(t, [b"1", b"2"])
        got = []
        async for m in c.messages(t, wait=2, batch=5):
            got.append(m.body)
            await c.ack(m)
            if len(got) == 2:
                break
        assert sorted(got) == [b"1", b"2"]
        assert [m.body async for m in c.replay(t)] == [b"1", b"2"]
        pub = c.publisher(t)
        fut = await pub.publish({"k": 1})
        assert (await fut).offset == 2
        await c.close()  # closes the publisher it owns
        with pytest.raises(narad.Closed):
            await pub.publish(b"late")


async def test_a_plain_def_handler_runs_in_a_thread_and_acks(broker: Broker) -> None:
    async with narad.AsyncClient(broker.url) as c:
        t = f"a-{uuid.uuid4().hex[:8]}"
        await c.create_topic(t, partitions=1)
        await c.produce_batch(t, [b"1", b"2", b"3"])
        loop_thread = threading.get_ident()
        seen: list[tuple[bytes, bool, bool]] = []

        def handle(msg: narad.Message) -> None:  # not async: blocking is allowed here
            d = narad.current_delivery()
            seen.append((msg.body, threading.get_ident() != loop_thread,
                         d is not None and d.message == msg))

        async with await c.consume(t, handle, concurrency=2, wait=1) as con:
            deadline = time.monotonic() + 30
            while con.stats.acked < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert con.stats.acked == 3
        assert sorted(seen) == [(b"1", True, True), (b"2", True, True), (b"3", True, True)]
        assert (con.stats.failed, con.stats.nacked) == (0, 0)  # each ran once, no redelivery
