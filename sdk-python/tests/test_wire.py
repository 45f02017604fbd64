"""Retries, lost replies, failover and deadlines, with faults injected at the transport.

The transport forwards to the real broker except where a rule answers for it (a 503),
loses the reply after forwarding (the request took effect, the client cannot know), or
fails to connect.
"""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

import narad
from conftest import Driver, free_port, wait_for


def err(status: int, code: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = json.dumps({"error": {"code": code, "message": f"injected {code}"}})
    return httpx.Response(status, headers=headers, content=body.encode())


def is_ack(req: httpx.Request, extend: str | None = None) -> bool:
    if not req.url.path.endswith("/ack"):
        return False
    return extend is None or req.url.params.get("extend") == extend


def once(pred, action):  # type: ignore[no-untyped-def]
    """A rule that applies ``action`` to the first request matching ``pred``."""
    fired = threading.Event()

    def rule(req: httpx.Request, n: int):  # type: ignore[no-untyped-def]
        if pred(req) and not fired.is_set():
            fired.set()
            return action
        return None
    return rule


def count(drv_client, pred) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for r in drv_client.transport.seen if pred(r))


def test_ack_is_retried_on_503(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(rule=once(is_ack, err(503, "unavailable", "0")))
    c.produce(t, b"x")
    [m] = c.receive(t, wait=5)
    c.ack(m)
    assert count(c, is_ack) == 2
    assert c.receive(t, wait=0) == []


def test_ack_whose_reply_was_lost_counts_410_as_success(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(rule=once(is_ack, ("lost", httpx.ReadError("reply lost"))))
    c.produce(t, b"x")
    [m] = c.receive(t, wait=5)
    c.ack(m)  # second attempt answers 410: the first one settled it
    assert count(c, is_ack) == 2
    assert c.receive(t, wait=0) == []
    # A plain 410 (no lost reply before it) is still LeaseLost.
    with pytest.raises(narad.LeaseLost):
        c.ack(m)


def test_nack_whose_reply_was_lost_counts_410_as_success(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(rule=once(lambda r: is_ack(r, "0"),
                                 ("lost", httpx.RemoteProtocolError("cut"))))
    c.produce(t, b"x")
    [m] = c.receive(t, wait=5)
    c.nack(m)
    [again] = c.receive(t, wait=5)
    assert again.delivery_attempt == 2
    c.ack(again)


def test_a_delete_retried_after_a_lost_reply_spares_a_topic_created_since(drv: Driver
                                                                          ) -> None:
    """A delete whose reply is lost: one naming the incarnation is sent again, and when
    the topic was created again under the name meanwhile, its 409 incarnation_mismatch
    fails the call, uncertain, and the new topic stays. A plain delete is not sent
    again (a resend would delete whatever topic has the name by then): it fails,
    uncertain, after its one attempt (which deleted the topic)."""
    is_delete = lambda r: r.method == "DELETE"  # noqa: E731

    def recreated_before_the_retry(name: str):  # type: ignore[no-untyped-def]
        deletes = [0]

        def rule(req: httpx.Request, n: int):  # type: ignore[no-untyped-def]
            if not is_delete(req):
                return None
            deletes[0] += 1
            if deletes[0] == 1:
                return ("lost", httpx.ReadError("reply lost"))  # deleted, reply lost
            httpx.post(drv.broker.url + "/v1/topics",
                       json={"name": name, "partitions": 1}).raise_for_status()
            return None
        return rule

    t = drv.topic()
    inc = drv.client.get_topic(t).incarnation
    c = drv.new_client(rule=recreated_before_the_retry(t))
    with pytest.raises(narad.Conflict) as conflict:
        c.delete_topic(t, incarnation=inc)
    assert conflict.value.uncertain and conflict.value.code == "incarnation_mismatch"
    assert count(c, is_delete) == 2
    now = drv.client.get_topic(t)  # created between the attempts, and still there
    assert now.incarnation != inc

    t2 = drv.topic()
    c = drv.new_client(rule=recreated_before_the_retry(t2))
    with pytest.raises(narad.NaradError) as lost:
        c.delete_topic(t2)
    assert lost.value.uncertain
    assert count(c, is_delete) == 1
    with pytest.raises(narad.NotFound):  # deleted by the one attempt, whose reply was lost
        drv.client.get_topic(t2)


def test_consumer_acks_are_confirmed_through_503s(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(rule=once(is_ack, err(503, "unavailable", "0")))
    c.produce_batch(t, [b"1", b"2"])
    with c.consume(t, drv.handler(lambda m: None), wait=1) as con:
        wait_for(lambda: con.stats.acked == 2, what="two confirmed acks")
    assert con.stats.ack_failed == 0
    assert count(c, is_ack) == 3


def test_produce_lost_reply_retries_only_when_duplicates_are_allowed(drv: Driver) -> None:
    is_produce = lambda r: r.url.path.endswith("/produce")  # noqa: E731
    t = drv.topic()
    dup = drv.new_client(rule=once(is_produce, ("lost", httpx.ReadTimeout("slow"))))
    p = dup.produce(t, b"maybe twice")
    assert p.offset == 1  # the first attempt stored offset 0, the retry offset 1
    assert [m.body for m in dup.replay(t)] == [b"maybe twice"] * 2

    t2 = drv.topic()
    strict = drv.new_client(rule=once(is_produce, ("lost", httpx.ReadTimeout("slow"))),
                            allow_duplicates=False)
    with pytest.raises(narad.Timeout) as ei:
        strict.produce(t2, b"once")
    assert ei.value.uncertain and ei.value.retryable
    assert count(strict, is_produce) == 1
    assert [m.body for m in strict.replay(t2)] == [b"once"]
    # The per-call switch overrides the client's default.
    t3 = drv.topic()
    per_call = drv.new_client(rule=once(is_produce, ("lost", httpx.ReadError("cut"))))
    with pytest.raises(narad.Unavailable) as ue:
        per_call.produce(t3, b"x", allow_duplicates=False)
    assert ue.value.uncertain


def test_refused_produce_fails_over_at_once_without_duplicates(drv: Driver) -> None:
    is_produce = lambda r: r.url.path.endswith("/produce-batch")  # noqa: E731
    t = drv.topic()
    c = drv.new_client(rule=once(is_produce, err(503, "storage_failed", "1")),
                       allow_duplicates=False, backoff_max=0.5)
    t0 = time.monotonic()
    out = c.produce_batch(t, [b"a", b"b"])
    assert len(out) == 2 and count(c, is_produce) == 2
    # The node's Retry-After is honoured even past backoff_max (conformance CB-RETRY-2),
    # and nothing more: the refused batch was not stored, so no duplicate.
    assert 0.9 <= time.monotonic() - t0 < 5.0
    assert len(list(c.replay(t))) == 2


def test_terminal_errors_are_not_retried_and_throttling_is(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(rule=once(lambda r: r.method == "GET", err(429, "throttled", "0.2")))
    t0 = time.monotonic()
    assert c.get_topic(t).name == t
    assert time.monotonic() - t0 >= 0.2  # Retry-After honoured
    with pytest.raises(narad.NotFound):
        c.get_topic("does-not-exist")
    assert count(c, lambda r: r.url.path.endswith("/does-not-exist")) == 1


def test_attempts_are_bounded(drv: Driver) -> None:
    c = drv.new_client(rule=lambda r, n: err(503, "unavailable", "0"), attempts=3,
                       backoff_min=0.01)
    with pytest.raises(narad.Unavailable) as ei:
        c.list_topics()
    assert ei.value.retryable and ei.value.status == 503 and not ei.value.uncertain
    assert len(c.transport.seen) == 3


def test_lost_reply_of_a_non_idempotent_write_is_uncertain(drv: Driver) -> None:
    c = drv.new_client(rule=once(lambda r: r.method == "POST",
                                 ("lost", httpx.ReadTimeout("lost"))))
    name = f"w-{drv.mode}-{time.monotonic_ns()}"
    with pytest.raises(narad.Timeout) as ei:
        c.create_topic(name)
    assert ei.value.uncertain
    assert c.get_topic(name).name == name  # it did take effect


def test_failover_between_two_endpoints_with_one_dead(drv: Driver) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    events: list[narad.Event] = []
    c = drv.new_client([dead, drv.broker.url], on_event=events.append, breaker_cooldown=30)
    t = c.create_topic(f"fo-{drv.mode}-{time.monotonic_ns()}", partitions=1).name
    for i in range(10):
        c.produce(t, f"m{i}")
    assert len(list(c.replay(t))) == 10
    dead_hits = [e for e in events if e.kind == "request" and e.endpoint == dead]
    assert len(dead_hits) == 2  # two refused connections in a row open its breaker
    assert any(e.kind == "breaker_open" and e.endpoint == dead for e in events)
    with c.consume(t, drv.handler(lambda m: None), wait=1) as con:
        wait_for(lambda: con.stats.acked == 10, what="consumed through the live node")


def test_breaker_probes_a_failed_node_back_into_rotation(drv: Driver) -> None:
    port = urlsplit(drv.broker.url).port
    flaky = f"http://localhost:{port}"
    down = threading.Event()
    down.set()

    def rule(req: httpx.Request, n: int):  # type: ignore[no-untyped-def]
        if req.url.host == "localhost" and down.is_set():
            return httpx.ConnectError("injected: node down")
        return None

    events: list[narad.Event] = []
    c = drv.new_client([flaky, drv.broker.url], rule=rule, on_event=events.append,
                       breaker_cooldown=0.2)
    c.list_topics()
    c.list_topics()  # the second failure in a row opens the breaker
    assert any(e.kind == "breaker_open" and e.endpoint == flaky for e in events)
    down.clear()

    def probed_back() -> bool:
        c.list_topics()  # calls trigger due probes
        return any(e.kind == "breaker_close" and e.endpoint == flaky for e in events)
    wait_for(probed_back, what="the node probed back")
    probes = [r for r in c.transport.seen if r.url.host == "localhost"
              and r.url.path == "/readyz"]
    assert probes, "the node came back through a /readyz probe, outside the rotation"
    wait_for(lambda: c.list_topics() is not None and any(
        r.url.host == "localhost" and r.url.path == "/v1/topics" for r in c.transport.seen[-4:]),
        what="the node serving calls again")


def test_long_poll_deadline_is_its_wait_plus_a_margin(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(timeout=0.5)
    t0 = time.monotonic()
    assert c.receive(t, wait=1.5) == []  # not cut by the 0.5 s client timeout
    assert time.monotonic() - t0 >= 1.4


def test_a_call_is_bounded_by_its_attempts(drv: Driver) -> None:
    c = drv.new_client(rule=lambda r, n: err(503, "unavailable", "1"), attempts=3)
    t0 = time.monotonic()
    with pytest.raises(narad.Unavailable):
        c.list_topics(timeout=0.5)
    assert time.monotonic() - t0 < 10  # two Retry-After waits of 1 s, not forever
    assert len(c.transport.seen) == 3
