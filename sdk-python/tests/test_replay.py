"""Replay against the rules of docs/sdk/contract.md (CB-REPLAY-*): where a bounded replay
ends, how its position moves, the topic incarnation, damaged messages and retries.

Most cases run a real Client or AsyncClient against a fake broker (an httpx
MockTransport) that can answer what a real one only does under failure: a partition
whose node cannot be reached, stats that lag the log, a damaged record. The last one
deletes and creates a topic again on the real broker.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import narad
from conftest import Driver
from narad import _plans as plans

MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def msg(p: int, o: int) -> narad.Message:
    return narad.Message("t", p, o, f"{p}/{o}".encode(), 0)


@dataclass
class FakeBroker:
    """FakeBroker answers a topic ``t`` and replay reads of its partitions.

    ``logs`` holds each partition's offsets (a message's body is ``"p/o"``); ``stats``
    gives the topic's answers in turn (the last one repeats), each a map from partition
    to its high watermark, or None for a partition that cannot be reached.
    """

    logs: dict[int, list[int]]
    stats: list[dict[int, int | None]]
    incarnation: str = "42"
    damaged: dict[int, list[int]] = field(default_factory=dict)
    read_errors: list[httpx.Response] = field(default_factory=list)
    topic_reads: int = 0
    reads: list[dict[str, str]] = field(default_factory=list)

    def topic_doc(self) -> dict[str, Any]:
        stats = self.stats[min(self.topic_reads, len(self.stats) - 1)]
        self.topic_reads += 1
        parts = []
        for p in sorted(self.logs):
            hw = stats.get(p)
            parts.append({"partition": p, "oldest_offset": 0, "next_offset": hw or 0,
                          "high_watermark": hw or 0, "ack_frontier": 0, "acked_ahead": 0,
                          "in_flight": 0, "backlog": 0, "leader": "n1", "replicas": ["n1"],
                          "available": hw is not None})
        return {"name": "t", "incarnation": self.incarnation, "partitions": len(self.logs),
                "retention_ms": 1000, "visibility_timeout_ms": 30_000,
                "max_in_flight_per_partition": 10, "max_acked_ahead_per_partition": 10,
                "replication_factor": 1, "created_at": "2026-01-01T00:00:00Z",
                "partition_stats": parts}

    def __call__(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t":
            return httpx.Response(200, json=self.topic_doc())
        part = int(req.url.path.split("/")[5])
        q = dict(req.url.params)
        self.reads.append({"partition": str(part), **q})
        if self.read_errors:
            return self.read_errors.pop(0)
        if q.get("incarnation", self.incarnation) != self.incarnation:
            return httpx.Response(409, json={"error": {"code": "incarnation_mismatch",
                                                       "message": "another incarnation"}})
        log = self.logs[part]
        end = (log[-1] + 1) if log else 0
        frm = int(q.get("from", "0"))
        if frm > end:
            return httpx.Response(200, json={"messages": [], "next_offset": end,
                                             "incarnation": self.incarnation})
        out, skipped, nxt = [], [], frm
        for o in range(frm, end):
            if len(out) >= int(q["max"]):
                break
            nxt = o + 1
            if o in self.damaged.get(part, []):
                skipped.append(o)
            elif o in log:
                out.append({"topic": "t", "partition": part, "offset": o, "timestamp": 0,
                            "payload": base64.b64encode(f"{part}/{o}".encode()).decode(),
                            "payload_encoding": "base64"})
        doc: dict[str, Any] = {"messages": out, "next_offset": nxt,
                               "incarnation": self.incarnation}
        if skipped:
            doc["damaged"] = skipped
        return httpx.Response(200, json=doc)


@dataclass
class Outcome:
    bodies: list[str]
    position: narad.Position
    error: narad.NaradError | None
    events: list[narad.Event]


def replay(mode: str, fake: Callable[[httpx.Request], httpx.Response],
           start: narad.Position | None = None, **kw: Any) -> Outcome:
    """Replay runs a whole replay of ``t`` with the client of ``mode`` against ``fake``."""
    events: list[narad.Event] = []
    bodies: list[str] = []
    client = {"on_event": events.append, "backoff_min": 0.01, "backoff_max": 0.05}
    if mode == "sync":
        with narad.Client("http://a", transport=httpx.MockTransport(fake), **client) as c:
            r = c.replay("t", start, **kw)
            try:
                for m in r:
                    bodies.append(m.body.decode())
            except narad.NaradError as err:
                return Outcome(bodies, r.position, err, events)
            return Outcome(bodies, r.position, None, events)

    async def run() -> Outcome:
        async with narad.AsyncClient("http://a", transport=httpx.MockTransport(fake),
                                     **client) as c:
            r = c.replay("t", start, **kw)
            try:
                async for m in r:
                    bodies.append(m.body.decode())
            except narad.NaradError as err:
                return Outcome(bodies, r.position, err, events)
            return Outcome(bodies, r.position, None, events)
    return asyncio.run(run())


# -- R1: a partition that cannot be reached has no known end


@MODES
def test_a_bounded_replay_waits_for_an_unreachable_partition_to_learn_its_end(mode: str
                                                                              ) -> None:
    """The topic says partition 1 cannot be reached (its stats are given as 0) twice: the
    replay reads the topic again until it can, then reads every message up to the end
    it learnt. The old replay took 0 as partition 1's end: it read one message there,
    returned nothing of it, moved the position from 5 to 6 and ended normally."""
    fake = FakeBroker(logs={0: [0, 1], 1: list(range(8))},
                      stats=[{0: 2, 1: None}, {0: 2, 1: None}, {0: 2, 1: 8}])
    out = replay(mode, fake, narad.Position.at_offsets({1: 5}))
    assert out.error is None
    assert out.bodies == ["0/0", "0/1", "1/5", "1/6", "1/7"]
    assert fake.topic_reads == 3
    assert out.position.offsets == ((0, 2), (1, 8))


@MODES
def test_a_bounded_replay_fails_naming_a_partition_that_stays_unreachable(mode: str) -> None:
    """Still unreachable when the call's attempts run out, the replay fails with
    Unavailable naming the partition, having read nothing and moved no position. The
    old replay ended normally and moved partition 1 from 5 to 6, past a message it
    never returned."""
    fake = FakeBroker(logs={0: [0, 1], 1: list(range(8))}, stats=[{0: 2, 1: None}])
    out = replay(mode, fake, narad.Position.at_offsets({1: 5}))
    assert isinstance(out.error, narad.Unavailable), out.error
    assert "partition 1" in str(out.error) and out.error.retryable
    assert fake.topic_reads == 4  # the client's attempts
    assert [e.kind for e in out.events].count("retry") == 3
    assert fake.reads == [] and out.bodies == []
    assert out.position.offset(1) == 5


def test_only_the_partitions_replayed_must_be_reachable() -> None:
    fake = FakeBroker(logs={0: [0, 1], 1: list(range(8))}, stats=[{0: 2, 1: None}])
    out = replay("sync", fake, partitions=[0])
    assert out.error is None and out.bodies == ["0/0", "0/1"]


# -- R2: the position never passes a message the replay did not return


def test_a_page_cut_at_the_end_leaves_the_position_after_the_last_message_returned() -> None:
    """Partition 0 was at its end (0) when the replay started and was written to before
    its turn: nothing of the page is returned, so the position does not move. The old
    plan set it to the page's next_offset (3), and resuming skipped those messages."""
    plan = plans.ReplayPlan("t", narad.Position(), [0], {0: 0}, 100, .5)
    step = plan.next()
    assert isinstance(step, plans.Read)
    plan.on_page(0, [msg(0, 0), msg(0, 1), msg(0, 2)], 3)
    assert plan.take() is None and plan.next() is None
    assert plan.position.offsets == ()
    assert narad.Position.loads(plan.position.dumps()).offset(0) is None

    plan = plans.ReplayPlan("t", narad.Position.at_offsets({0: 1}), [0], {0: 3}, 100, .5)
    assert isinstance(plan.next(), plans.Read)
    plan.on_page(0, [msg(0, 1), msg(0, 2), msg(0, 3), msg(0, 4)], 5)
    got = [plan.take(), plan.take(), plan.take()]
    assert [m.offset if m else None for m in got] == [1, 2, None]
    assert plan.next() is None and plan.position.offset(0) == 3


@MODES
def test_a_stale_end_below_the_position_moves_nothing(mode: str) -> None:
    """The topic's stats (2) lag the position (5) and the log (8 messages): the read
    answers message 5, past the recorded end, so nothing is returned and the position
    stays at 5. The old replay moved it to 6 by the read's next_offset, and the next
    replay from it never saw message 5."""
    fake = FakeBroker(logs={0: list(range(8))}, stats=[{0: 2}])
    out = replay(mode, fake, narad.Position.at_offsets({0: 5}))
    assert out.error is None and out.bodies == []
    assert out.position.offset(0) == 5
    again = FakeBroker(logs={0: list(range(8))}, stats=[{0: 8}])
    assert replay(mode, again, out.position).bodies == ["0/5", "0/6", "0/7"]


# -- R3: cursors move by read answers, and follow a next_offset lower than they are


def test_a_next_offset_below_the_cursor_is_followed() -> None:
    """A position past the log's end (a log cut back by a forced takeover) goes back to
    the end the read answers, so what is written next is not skipped."""
    plan = plans.ReplayPlan("t", narad.Position.at_offsets({0: 10}), [0], {0: 8}, 100, .5)
    step = plan.next()
    assert isinstance(step, plans.Read) and ("from", "10") in step.call.request.params
    plan.on_page(0, [], 6)
    assert plan.position.offset(0) == 6 and plan.next() is None

    follow = plans.ReplayPlan("t", narad.Position.at_offsets({0: 10}), [0], None, 100, .5)
    assert isinstance(follow.next(), plans.Read)
    follow.on_page(0, [], 6)
    assert follow.position.offset(0) == 6
    assert follow.next() == plans.Sleep(.5)
    step = follow.next()
    assert isinstance(step, plans.Read) and ("from", "6") in step.call.request.params


# -- R4: the topic incarnation


def test_a_position_keeps_the_incarnation_and_older_ones_still_load() -> None:
    p = narad.Position.at_offsets({0: 3}).with_incarnation("42").with_offset(1, 4)
    assert p.incarnation == "42"
    assert p.dumps() == '{"offsets":{"0":3,"1":4},"incarnation":"42"}'
    assert narad.Position.loads(p.dumps()) == p
    old = narad.Position.loads('{"offsets":{"0":3}}')
    assert old.incarnation is None and old.offset(0) == 3


@MODES
def test_a_replay_takes_the_incarnation_and_names_it_on_every_read(mode: str) -> None:
    """A position saved without an incarnation (by an older version) takes the topic's,
    keeps it, and every read names it."""
    fake = FakeBroker(logs={0: [0, 1, 2], 1: [0]}, stats=[{0: 3, 1: 1}])
    out = replay(mode, fake, narad.Position.loads('{"offsets":{"0":1}}'), batch=1)
    assert out.error is None and out.bodies == ["0/1", "1/0", "0/2"]
    assert fake.reads and all(r.get("incarnation") == "42" for r in fake.reads)
    assert out.position.incarnation == "42"
    assert narad.Position.loads(out.position.dumps()).incarnation == "42"


@MODES
def test_a_position_of_another_incarnation_is_a_conflict(mode: str) -> None:
    """The topic was deleted and created again since the position was taken: the
    replay reads nothing and says so. The old replay read the new topic's messages as
    if they followed the old ones."""
    fake = FakeBroker(logs={0: [0, 1, 2]}, stats=[{0: 3}])
    out = replay(mode, fake, narad.Position.at_offsets({0: 1}).with_incarnation("41"))
    assert isinstance(out.error, narad.Conflict), out.error
    assert out.error.code == "incarnation_mismatch" and not out.error.retryable
    assert "deleted and created again" in str(out.error)
    assert "new position" in str(out.error)
    assert fake.reads == [] and out.bodies == []


@MODES
def test_a_read_answering_incarnation_mismatch_ends_the_replay(mode: str) -> None:
    """The topic is created anew between the topic read and a message read: the 409 is
    not retried and ends the replay with the Conflict that says what to do."""
    fake = FakeBroker(logs={0: [0, 1, 2]}, stats=[{0: 3}])
    fake.read_errors.append(httpx.Response(409, json={"error": {
        "code": "incarnation_mismatch", "message": "another incarnation"}}))
    out = replay(mode, fake)
    assert isinstance(out.error, narad.Conflict), out.error
    assert out.error.code == "incarnation_mismatch" and not out.error.retryable
    assert "deleted and created again" in str(out.error)
    assert len(fake.reads) == 1 and fake.reads[0]["incarnation"] == "42"


def test_replay_through_a_topic_created_again_on_the_broker(drv: Driver) -> None:
    c = drv.client
    t = drv.topic()
    c.produce_batch(t, [narad.Outgoing("a"), narad.Outgoing("b")])
    r = c.replay(t, batch=1)
    assert next(r).body == b"a"
    saved = r.position.dumps()
    assert narad.Position.loads(saved).incarnation == c.get_topic(t).incarnation
    c.delete_topic(t)
    c.create_topic(t, partitions=1)
    c.produce_batch(t, [narad.Outgoing("x"), narad.Outgoing("y")])
    with pytest.raises(narad.Conflict) as caught:
        list(c.replay(t, narad.Position.loads(saved)))
    assert caught.value.code == "incarnation_mismatch"
    with pytest.raises(narad.Conflict):
        next(r)  # the replay that was running reads the new topic no more
    assert [m.body for m in c.replay(t)] == [b"x", b"y"]


# -- a position at the end


@MODES
def test_a_bounded_replay_from_the_end_reads_nothing_and_names_the_ends(mode: str) -> None:
    fake = FakeBroker(logs={0: [0, 1, 2], 1: [0]}, stats=[{0: 3, 1: 1}])
    out = replay(mode, fake, narad.Position(offsets=((0, 1),), at_end=True))
    assert out.error is None and out.bodies == ["0/1", "0/2"]
    assert out.position.dumps() == '{"offsets":{"0":3,"1":1},"incarnation":"42"}'


def first_of(mode: str, fake: FakeBroker, start: narad.Position) -> tuple[str, narad.Position]:
    """first_of follows a replay of ``t`` from ``start`` until its first message."""
    client = {"backoff_min": 0.01, "backoff_max": 0.05}
    if mode == "sync":
        with narad.Client("http://a", transport=httpx.MockTransport(fake), **client) as c:
            r = c.replay("t", start, follow=True, poll_interval=0.01)
            return next(r).body.decode(), r.position

    async def run() -> tuple[str, narad.Position]:
        async with narad.AsyncClient("http://a", transport=httpx.MockTransport(fake),
                                     **client) as c:
            r = c.replay("t", start, follow=True, poll_interval=0.01)
            m = await r.__anext__()
            return m.body.decode(), r.position
    return asyncio.run(run())


@MODES
def test_a_following_replay_from_the_end_starts_where_each_partition_ends(mode: str) -> None:
    """The stats say partition 0 ends at 2 as the replay starts (2 is written later):
    the replay reads from there, and its position names every partition it reads at
    the end it started from, so resuming it misses nothing written to partition 1. A
    partition that cannot be reached has no known end: the replay asks again."""
    fake = FakeBroker(logs={0: [0, 1, 2], 1: [0]}, stats=[{0: None, 1: 1}, {0: 2, 1: 1}])
    body, pos = first_of(mode, fake, narad.Position.end())
    assert body == "0/2" and fake.topic_reads == 2
    assert fake.reads[0]["from"] == "2"
    assert pos.dumps() == '{"offsets":{"0":3,"1":1},"incarnation":"42"}'


# -- R5: damaged messages are reported and read past


@MODES
def test_damaged_messages_are_reported_and_the_replay_goes_on(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeBroker(logs={0: [0, 1, 2, 3, 4]}, stats=[{0: 5}], damaged={0: [1, 4]})
    with caplog.at_level(logging.WARNING, logger="narad"):
        out = replay(mode, fake)
    assert out.error is None and out.bodies == ["0/0", "0/2", "0/3"]
    damaged = [e for e in out.events if e.kind == "replay_damaged"]
    assert [(e.topic, e.attributes["partition"], e.attributes["offset"]) for e in damaged
            ] == [("t", 0, 1), ("t", 0, 4)]
    assert sum("offset 1 is damaged" in r.getMessage() for r in caplog.records) == 1
    assert out.position.offset(0) == 5


def test_a_page_of_damaged_messages_only_does_not_end_the_partition() -> None:
    """A page that read past damaged messages only is empty but not the end."""
    plan = plans.ReplayPlan("t", narad.Position(), [0], {0: 4}, 2, .5)
    assert isinstance(plan.next(), plans.Read)
    plan.on_page(0, [], 2, damaged=[0, 1])
    assert plan.position.offset(0) == 2
    step = plan.next()
    assert isinstance(step, plans.Read) and ("from", "2") in step.call.request.params


# -- R6: a 503 is retried as before


@MODES
def test_a_read_answering_503_is_retried(mode: str) -> None:
    fake = FakeBroker(logs={0: [0, 1]}, stats=[{0: 2}])
    fake.read_errors.append(httpx.Response(503, json={"error": {
        "code": "unavailable", "message": "not now"}}))
    out = replay(mode, fake)
    assert out.error is None and out.bodies == ["0/0", "0/1"]
    assert [e.kind for e in out.events].count("retry") == 1
