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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import narad
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
