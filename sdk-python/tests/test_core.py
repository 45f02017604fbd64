"""The sans-I/O core: decisions that both clients share, checked without a broker."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import inspect
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import narad
from narad import _core as core
from narad import _plans as plans
from narad.errors import error_from_response


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state(call: core.Call[Any], *, endpoints: tuple[str, ...] = ("http://a", "http://b"),
          attempts: int = 4, allow_duplicates: bool = True,
          clock: Clock | None = None) -> tuple[core.CallState[Any], list[narad.Event]]:
    events: list[narad.Event] = []
    clk = clock or Clock()
    pool = core.EndpointPool(endpoints, clock=clk)
    policy = core.RetryPolicy(attempts=attempts, allow_duplicates=allow_duplicates)
    return core.CallState(call, policy, pool, events.append, clock=clk, rng=lambda: 0.5), events


def resp(status: int, body: Any = None, headers: dict[str, str] | None = None) -> core.Response:
    content = b"" if body is None else json.dumps(body).encode()
    return core.Response(status, headers or {}, content)


def error_body(code: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": "m"}}


def partly_stored_body(code: str, stored: int, failed: list[int]) -> dict[str, Any]:
    """What the broker answers a produce-batch of which part was stored (openapi.yaml)."""
    return {"error": {"code": code, "message": "only part of the batch was stored",
                      "partly_stored": {"stored": stored, "failed_partitions": failed}}}


def over_mock(mode: str, handler: Callable[[httpx.Request], httpx.Response],
              method: str, *args: Any, client: dict[str, Any] | None = None,
              **kwargs: Any) -> Any:
    """over_mock makes one call of the sync or the async client against ``handler``."""
    kw = client or {}
    if mode == "sync":
        with narad.Client("http://a", transport=httpx.MockTransport(handler), **kw) as c:
            return getattr(c, method)(*args, **kwargs)

    async def run() -> Any:
        async with narad.AsyncClient("http://a", transport=httpx.MockTransport(handler),
                                     **kw) as ac:
            return await getattr(ac, method)(*args, **kwargs)
    return asyncio.run(run())


MODES = pytest.mark.parametrize("mode", ["sync", "async"])


# -- errors


@pytest.mark.parametrize("status,cls,retryable", [
    (400, narad.BadRequest, False), (401, narad.Unauthenticated, False),
    (403, narad.Forbidden, False), (404, narad.NotFound, False), (409, narad.Conflict, False),
    (410, narad.LeaseLost, False), (413, narad.TooLarge, False), (429, narad.Throttled, True),
    (503, narad.Unavailable, True), (502, narad.Unavailable, True),
    (504, narad.Timeout, True), (500, narad.Internal, False), (501, narad.NotImplemented, False),
    (408, narad.Timeout, True), (418, narad.NaradError, False),
])
def test_error_mapping(status: int, cls: type[narad.NaradError], retryable: bool) -> None:
    e = error_from_response(status, {"retry-after": "2"}, json.dumps(error_body("x")).encode())
    assert type(e) is cls and e.status == status and e.retryable is retryable
    assert e.code == "x" and e.message == "m" and e.retry_after == 2.0
    assert isinstance(e, narad.NaradError) and "status=" in str(e) and cls.__name__ in repr(e)


def test_error_mapping_of_odd_bodies() -> None:
    e = error_from_response(503, {}, b"<html>bad gateway</html>")
    assert isinstance(e, narad.Unavailable) and "bad gateway" in e.message and e.code == ""
    t = error_from_response(503, {}, json.dumps(error_body("timeout")).encode())
    assert isinstance(t, narad.Timeout) and t.uncertain
    # A failed disk write the broker could not take back: the outcome is unknown.
    m = error_from_response(503, {}, json.dumps(error_body("maybe_stored")).encode())
    assert type(m) is narad.Unavailable and m.uncertain and m.retryable and m.code == "maybe_stored"
    s = error_from_response(503, {}, json.dumps(error_body("storage_failed")).encode())
    assert type(s) is narad.Unavailable and not s.uncertain
    assert error_from_response(404, {"retry-after": "Wed, 21 Oct"}, b"").retry_after is None
    assert narad.Closed("x").retryable is False and narad.BufferFull("x").retryable is True


# -- the retry state machine


def test_success_and_terminal_answers() -> None:
    st, events = state(core.list_topics())
    step = st.on_response(st.endpoint(), resp(200, {"topics": []}))
    assert step == core.Done([])
    st2, events2 = state(core.get_topic("t"))
    step = st2.on_response(st2.endpoint(), resp(404, error_body("topic_not_found")))
    assert isinstance(step, core.Fail) and isinstance(step.error, narad.NotFound)
    assert [e.kind for e in events + events2] == ["request", "request"]


def test_a_topic_delete_is_resent_after_a_lost_reply_only_naming_an_incarnation() -> None:
    """DELETE /v1/topics/t?incarnation=N. Its 409 incarnation_mismatch is a Conflict,
    certain (nothing was deleted). After a lost reply, a delete naming no incarnation
    is not sent again (a resend would delete a topic created under the name meanwhile):
    it fails, uncertain. One naming an incarnation is sent again, and its 404 or 409
    then fails the call, uncertain: the incarnation named is gone, perhaps by this call."""
    assert core.delete_topic("t").request.params == ()
    assert core.delete_topic("t", "42").request.params == (("incarnation", "42"),)
    mismatch = resp(409, error_body("incarnation_mismatch"))

    st, _ = state(core.delete_topic("t", "42"))
    step = st.on_response(st.endpoint(), mismatch)
    assert isinstance(step, core.Fail) and type(step.error) is narad.Conflict
    assert step.error.code == "incarnation_mismatch" and step.error.status == 409
    assert not step.error.uncertain and not step.error.retryable

    for answer in (mismatch, resp(404, error_body("topic_not_found"))):
        st, _ = state(core.delete_topic("t", "42"))
        assert isinstance(st.on_transport_error(st.endpoint(), core.Transport.LOST, "cut"),
                          core.Retry)
        step = st.on_response(st.endpoint(), answer)
        assert isinstance(step, core.Fail) and step.error.uncertain

    st, _ = state(core.delete_topic("t"))
    step = st.on_transport_error(st.endpoint(), core.Transport.LOST, "cut")
    assert isinstance(step, core.Fail) and step.error.uncertain


def test_parse_errors_become_errors() -> None:
    st, _ = state(core.get_topic("t"))
    step = st.on_response(st.endpoint(), resp(200, {"nope": 1}))
    assert isinstance(step, core.Fail) and step.error.code == "bad_response"


def test_connection_refused_fails_over_at_once_and_two_open_the_breaker() -> None:
    st, events = state(core.list_topics())
    first = st.endpoint()
    step = st.on_transport_error(first, core.Transport.NOT_SENT, "refused")
    assert isinstance(step, core.Retry) and step.delay == 0.0
    assert not st.pool.is_open(first)  # one failure is not enough
    second = st.endpoint()
    assert second != first
    assert [e.kind for e in events] == ["request", "retry"]
    again, events2 = state(core.list_topics())
    again.pool = st.pool
    again.on_transport_error(again.endpoint(), core.Transport.NOT_SENT, "refused")
    assert st.pool.is_open(first)
    assert events2[0].kind == "breaker_open"


def test_a_timed_out_attempt_fails_over_at_once() -> None:
    st, _ = state(core.list_topics())
    first = st.endpoint()
    step = st.on_transport_error(first, core.Transport.TIMEOUT, "no answer")
    assert isinstance(step, core.Retry) and step.delay == 0.0
    assert st.endpoint() != first


def test_503_retries_with_backoff_and_retry_after() -> None:
    st, _ = state(core.list_topics(), endpoints=("http://a",))
    step = st.on_response(st.endpoint(), resp(503, error_body("unavailable"),
                                              {"retry-after": "1"}))
    assert isinstance(step, core.Retry) and step.delay == 1.0
    step = st.on_response(st.endpoint(), resp(503, error_body("in_flight_full")))
    assert isinstance(step, core.Retry) and 0 < step.delay <= 5.0


def test_attempts_run_out() -> None:
    st, _ = state(core.list_topics(), attempts=2)
    st.on_response(st.endpoint(), resp(503, error_body("unavailable")))
    step = st.on_response(st.endpoint(), resp(503, error_body("unavailable")))
    assert isinstance(step, core.Fail) and isinstance(step.error, narad.Unavailable)


def test_deadline_stops_retries() -> None:
    clk = Clock()
    st, _ = state(core.list_topics(), clock=clk, endpoints=("http://a",))
    assert st.deadline == pytest.approx(100.0 + 4 * 30.0 + 3 * 5.0)  # attempts x bound + backoff
    clk.now = st.deadline - 0.5
    step = st.on_response(st.endpoint(), resp(503, error_body("unavailable"),
                                              {"retry-after": "1"}))
    assert isinstance(step, core.Fail)


@pytest.mark.parametrize("how", [core.Transport.TIMEOUT, core.Transport.LOST])
def test_lost_produce_reply(how: core.Transport) -> None:
    st, _ = state(core.produce("t", b"x"))
    step = st.on_transport_error(st.endpoint(), how, "x")
    assert isinstance(step, core.Retry) and st.maybe_applied
    strict, _ = state(core.produce("t", b"x"), allow_duplicates=False)
    step = strict.on_transport_error(strict.endpoint(), how, "x")
    assert isinstance(step, core.Fail) and step.error.uncertain and step.error.retryable


def test_ack_410_after_lost_reply_is_success_but_plain_410_is_not() -> None:
    st, _ = state(core.ack("t", "h"))
    st.on_transport_error(st.endpoint(), core.Transport.LOST, "x")
    step = st.on_response(st.endpoint(), resp(410, error_body("lease_lost")))
    assert isinstance(step, core.Done)
    plain, _ = state(core.ack("t", "h"))
    step = plain.on_response(plain.endpoint(), resp(410, error_body("lease_lost")))
    assert isinstance(step, core.Fail) and isinstance(step.error, narad.LeaseLost)
    assert not step.error.uncertain


def test_ack_batch_counts_410_after_lost_reply_only_for_settling_entries() -> None:
    call = core.ack_batch("t", [("h1", None), ("h2", "1000")])
    st, _ = state(call)
    st.on_transport_error(st.endpoint(), core.Transport.TIMEOUT, "x")
    body = {"results": [{"receipt_handle": "h1", "status": 410, "error": error_body(
        "lease_lost")["error"]}, {"receipt_handle": "h2", "status": 410,
                                  "error": error_body("lease_lost")["error"]}]}
    step = st.on_response(st.endpoint(), resp(200, body))
    assert isinstance(step, core.Done)
    assert [r.ok for r in step.value] == [True, False]
    assert isinstance(step.value[1].error, narad.LeaseLost)


def test_408_is_a_retryable_timeout_of_unknown_outcome() -> None:
    """A 408 (a proxy's request timeout) is a Timeout, as in the Go SDK: retryable, and
    uncertain, since the request may have reached the broker. A produce without
    duplicates is then raised ``uncertain``, and an ack's retry answered 410 counts as
    done. The old code mapped 408 to a plain NaradError: not retried at all."""
    st, _ = state(core.list_topics())
    step = st.on_response(st.endpoint(), resp(408, None))
    assert isinstance(step, core.Retry)
    strict, _ = state(core.produce("t", b"x"), allow_duplicates=False)
    step = strict.on_response(strict.endpoint(), resp(408, None))
    assert isinstance(step, core.Fail) and isinstance(step.error, narad.Timeout)
    assert step.error.uncertain and step.error.retryable
    ack, _ = state(core.ack("t", "h"))
    assert isinstance(ack.on_response(ack.endpoint(), resp(408, None)), core.Retry)
    assert isinstance(ack.on_response(ack.endpoint(), resp(410, error_body("lease_lost"))),
                      core.Done)


@pytest.mark.parametrize("status,body", [
    (502, b"<html><body>502 Bad Gateway</body></html>"),
    (502, json.dumps(error_body("unavailable")).encode()),
    (503, b"upstream connect error or disconnect/reset before headers"),
])
def test_a_proxys_502_or_codeless_503_on_produce_is_of_unknown_outcome(status: int,
                                                                       body: bytes) -> None:
    """A 502, or a 503 without the broker's error body, is a proxy's answer, not the
    broker's: the proxy may have sent the produce on and lost the broker's reply (nginx's
    "upstream prematurely closed connection"), so the message may be stored. Without
    duplicates it is raised ``uncertain`` and not resent; with them it is retried, as
    the Go and TypeScript SDKs do. The old code took it for a refusal that stored
    nothing and failed over at once, storing the message twice."""
    strict, _ = state(core.produce("t", b"x"), allow_duplicates=False)
    step = strict.on_response(strict.endpoint(), core.Response(status, {}, body))
    assert isinstance(step, core.Fail), f"got {step!r}"
    assert step.error.uncertain and step.error.retryable
    loose, _ = state(core.produce("t", b"x"))
    assert isinstance(loose.on_response(loose.endpoint(), core.Response(status, {}, body)),
                      core.Retry)
    # A read, and a broker's own 503 unavailable on a produce, stay certain.
    read, _ = state(core.list_topics())
    assert isinstance(read.on_response(read.endpoint(), core.Response(status, {}, body)),
                      core.Retry)
    refused, _ = state(core.produce("t", b"x"), allow_duplicates=False)
    step = refused.on_response(refused.endpoint(), resp(503, error_body("unavailable")))
    assert isinstance(step, core.Retry)


@pytest.mark.parametrize("allow_duplicates", [True, False])
@pytest.mark.parametrize("status,code", [(503, "storage_failed"), (503, "unavailable"),
                                         (503, "timeout"), (404, "topic_not_found")])
def test_partly_stored_batch_is_reported_and_never_resent(allow_duplicates: bool, status: int,
                                                          code: str) -> None:
    """A produce-batch answered with ``partly_stored`` stored part of its messages:
    resending it, here or on another node, stores that part twice. It must end the call
    at once, whatever allow_duplicates says, with the error saying so: partly_stored,
    stored, failed_partitions, uncertain, not retryable. The old code failed over and
    resent the batch on ``storage_failed``/``unavailable`` (codes that say nothing was
    stored) and retried on ``timeout`` when duplicates were allowed."""
    st, _ = state(core.produce_batch("t", [b"a", b"b", b"c"]),
                  allow_duplicates=allow_duplicates)
    step = st.on_response(st.endpoint(), resp(status, partly_stored_body(code, 2, [1]),
                                              {"retry-after": "1"}))
    assert isinstance(step, core.Fail), f"got {step!r}"
    err = step.error
    assert err.partly_stored and err.stored == 2 and err.failed_partitions == (1,)
    assert err.uncertain and not err.retryable and err.code == code
    assert "partly stored" in str(err)
    plain = error_from_response(503, {}, json.dumps(error_body("storage_failed")).encode())
    assert not plain.partly_stored and plain.stored is None and plain.failed_partitions is None


@MODES
def test_produce_batch_partly_stored_is_sent_once(mode: str) -> None:
    """The whole call: a produce-batch answered ``partly_stored`` goes out once and
    raises the broker's account, with one result per message. The old code resent it to
    the same node (one endpoint) after its Retry-After, storing the stored part twice."""
    sent: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(len(json.loads(req.content)["messages"]))
        return httpx.Response(503, json=partly_stored_body("storage_failed", 1, [1]),
                              headers={"retry-after": "0"})

    with pytest.raises(narad.Unavailable) as exc:
        over_mock(mode, handler, "produce_batch", "t", [b"a", b"b"], allow_duplicates=True,
                  client={"backoff_min": 0.001, "backoff_max": 0.01})
    assert sent == [2]
    err = exc.value
    assert err.partly_stored and err.stored == 1 and err.failed_partitions == (1,)
    assert err.results == [err, err]


@MODES
def test_produce_batch_over_1000_is_split_and_reported_per_message(mode: str) -> None:
    """The broker refuses a produce-batch of more than 1000 messages whole (400). Like
    the Go and TypeScript SDKs, produce_batch splits it into requests of at most 1000
    messages and returns where each went, in order; when one request fails, the error
    raised says per message what was stored. The old code sent the 2001 messages in one
    request, refused with 400."""
    sizes: list[int] = []
    base = [0]

    def handler(req: httpx.Request) -> httpx.Response:
        msgs = json.loads(req.content)["messages"]
        sizes.append(len(msgs))
        if len(msgs) > 1000:
            return httpx.Response(400, json=error_body("invalid_body"))
        first, base[0] = base[0], base[0] + len(msgs)
        return httpx.Response(202, json={"results": [
            {"topic": "t", "partition": 0, "offset": first + i} for i in range(len(msgs))]})

    out = over_mock(mode, handler, "produce_batch", "t", [b"x"] * 2001)
    assert sizes == [1000, 1000, 1] and [p.offset for p in out] == list(range(2001))

    def second_fails(req: httpx.Request) -> httpx.Response:
        if len(sizes) == 1:
            sizes.append(len(json.loads(req.content)["messages"]))
            return httpx.Response(403, json=error_body("forbidden"))
        return handler(req)

    sizes.clear()
    with pytest.raises(narad.Forbidden) as exc:
        over_mock(mode, second_fails, "produce_batch", "t", [b"x"] * 1500)
    res = exc.value.results
    assert sizes == [1000, 500] and res is not None and len(res) == 1500
    assert all(isinstance(r, narad.Produced) for r in res[:1000])
    # The call's error is the failure's, flagged for the whole call: 1000 were stored.
    assert all(isinstance(r, narad.Forbidden) and not r.uncertain for r in res[1000:])
    assert exc.value.uncertain and not exc.value.retryable


def test_batch_chunks_stay_within_the_broker_limits() -> None:
    """A produce-batch request carries at most 1000 messages and 7 MiB of entries (the
    broker's body limit is 8 MiB); an entry over that goes alone. The old code had no
    split: every batch was one request."""
    small = [core.batch_entry(b"x")] * 2500
    assert [len(c) for c in core.batch_chunks(small)] == [1000, 1000, 500]
    big = [core.batch_entry(b"x" * (1 << 20))] * 12  # about 1.33 MiB each in base64
    chunks = core.batch_chunks(big)
    assert sum(len(c) for c in chunks) == 12 and len(chunks) == 3
    assert all(sum(core.batch_entry_size(big[i]) for i in c) <= core.MAX_BATCH_BYTES
               for c in chunks)
    assert [c for c in core.batch_chunks([{"payload": "y" * 100}], max_bytes=10)] == [[0]]


@MODES
def test_ack_batch_over_1000_is_split(mode: str) -> None:
    """The broker refuses an ack-batch of more than 1000 entries whole (400), settling
    none. Like Go and TypeScript, ack_batch sends requests of at most 1000 entries and
    reports each message. The old code sent the 1001 entries in one request."""
    sizes: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        acks = json.loads(req.content)["acks"]
        sizes.append(len(acks))
        if len(acks) > 1000:
            return httpx.Response(400, json=error_body("invalid_body"))
        return httpx.Response(200, json={"results": [
            {"receipt_handle": a["receipt_handle"], "status": 204} for a in acks]})

    results = over_mock(mode, handler, "ack_batch", [f"h{i}" for i in range(1001)], topic="t")
    assert sizes == [1000, 1]
    assert [r.receipt_handle for r in results] == [f"h{i}" for i in range(1001)]
    assert all(r.ok for r in results)


@MODES
def test_ack_batch_retries_entries_answered_503(mode: str) -> None:
    """SDK rule 2: a settle is retried on 503. The entries of an ack-batch answered 503
    (a partition electing its leader) are sent again, alone, with backoff, as Go does;
    one answered ``503 timeout`` may have been settled, so a 410 on its retry counts as
    settled. The old code reported them failed after one request."""
    calls: list[list[str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        acks = [a["receipt_handle"] for a in json.loads(req.content)["acks"]]
        calls.append(acks)
        if len(calls) == 1:
            return httpx.Response(200, json={"results": [
                {"receipt_handle": "h1", "status": 204},
                {"receipt_handle": "h2", "status": 503, **error_body("unavailable")},
                {"receipt_handle": "h3", "status": 503, **error_body("timeout")},
                {"receipt_handle": "h4", "status": 410, **error_body("lease_lost")},
            ]})
        return httpx.Response(200, json={"results": [
            {"receipt_handle": h, "status": 410 if h == "h3" else 204} for h in acks]})

    results = over_mock(mode, handler, "ack_batch", ["h1", "h2", "h3", "h4"], topic="t",
                        client={"backoff_min": 0.001, "backoff_max": 0.01})
    assert calls == [["h1", "h2", "h3", "h4"], ["h2", "h3"]]
    assert [r.ok for r in results] == [True, True, True, False]
    assert isinstance(results[3].error, narad.LeaseLost)


def test_ack_batch_plan_gives_up_after_its_rounds_and_reports_whole_failures() -> None:
    """An entry answered 503 again and again is reported failed after
    max(attempts, 6) requests, at least 1 s apart; a request that fails whole gives its
    error to its entries, and is raised only when no request was answered."""
    policy = core.RetryPolicy()
    plan = core.AckBatchPlan("t", ["h"], policy, rng=lambda: 0.5)
    waits: list[float] = []
    while (step := plan.next()) is not None:
        waits.append(step[0])
        err = narad.Unavailable("electing", status=503, code="unavailable")
        plan.on_results([narad.AckResult("h", False, err)])
    assert len(waits) == 6 and waits[0] == 0.0 and all(w >= 1.0 for w in waits[1:])
    assert not plan.results()[0].ok
    gone = core.AckBatchPlan("t", ["h"], policy)
    assert gone.next() is not None
    gone.on_error(narad.NotFound("no topic", status=404))
    assert gone.next() is None
    with pytest.raises(narad.NotFound):
        gone.results()


def test_retry_after_of_a_node_is_honoured_after_failover() -> None:
    """A node that answered with Retry-After is not sent the same call again before the
    time it named. A answers 503 ``unavailable`` with Retry-After: 3 (nothing stored, so
    the call fails over to B at once); B answers 503 ``in_flight_full``: the third
    attempt stays on B after a plain backoff, and with B asking for 1 s too, the call
    waits for the one free soonest. The old code went back to A after a plain backoff,
    long before the 3 s it asked for."""
    clk = Clock()
    st, _ = state(core.produce("t", b"x"), clock=clk)
    a = st.endpoint()
    step = st.on_response(a, resp(503, error_body("unavailable"), {"retry-after": "3"}))
    assert isinstance(step, core.Retry) and step.delay == 0.0
    clk.now += step.delay
    b = st.endpoint()
    assert b != a
    step = st.on_response(b, resp(503, error_body("in_flight_full")))
    assert isinstance(step, core.Retry) and step.delay < 1.0
    clk.now += step.delay
    assert st.endpoint() == b
    step = st.on_response(b, resp(503, error_body("in_flight_full"), {"retry-after": "1"}))
    assert isinstance(step, core.Retry)
    assert clk.now + step.delay == pytest.approx(clk.now + 1.0)  # B is free before A
    clk.now += step.delay
    assert st.endpoint() == b
    one, _ = state(core.list_topics(), endpoints=("http://a",), clock=clk)
    step = one.on_response(one.endpoint(), resp(429, None, {"retry-after": "2"}))
    assert isinstance(step, core.Retry) and step.delay == 2.0  # one node: wait for it


def test_nack_with_delay_410_after_lost_reply_counts_as_done() -> None:
    """A nack with a delay whose reply was lost and whose retry answers 410 counts as
    done, as in Go (any settle but extend) and TypeScript: the earlier attempt's outcome
    is unknown and the message comes back either way. The old code raised LeaseLost."""
    st, _ = state(core.nack("t", "h", 30.0))
    st.on_transport_error(st.endpoint(), core.Transport.LOST, "reset")
    step = st.on_response(st.endpoint(), resp(410, error_body("lease_lost")))
    assert isinstance(step, core.Done), f"got {step!r}"
    plain, _ = state(core.nack("t", "h", 30.0))
    step = plain.on_response(plain.endpoint(), resp(410, error_body("lease_lost")))
    assert isinstance(step, core.Fail) and isinstance(step.error, narad.LeaseLost)


def test_long_poll_attempt_gets_its_wait_plus_the_request_timeout() -> None:
    st, _ = state(core.receive("t", wait=15))
    st.endpoint()
    assert st.attempt_timeout() == 15 + 30.0  # its wait plus the request timeout
    capped = core.receive("t", wait=60)
    assert capped.wait == core.MAX_WAIT
    assert ("wait", "20000ms") in capped.request.params


# -- endpoints


def test_pool_sticks_prefers_the_lease_node_probes_and_falls_back() -> None:
    clk = Clock()
    pool = core.EndpointPool(["a:1", "http://b:2/"], clock=clk, cooldown=1.0)
    assert pool.endpoints == ["http://a:1", "http://b:2"]
    assert [pool.pick() for _ in range(4)] == ["http://a:1"] * 4  # sticky, no rotation
    assert pool.pick(prefer="http://b:2") == "http://b:2"  # the node that leased it
    assert pool.pick(["http://b:2"], prefer="http://b:2") == "http://a:1"  # b failed: fall back
    assert pool.pick(["http://a:1"]) == "http://b:2"
    assert pool.failure("http://a:1") is False
    assert pool.failure("http://a:1") is True  # two in a row open the breaker
    assert pool.pick(prefer="http://a:1") == "http://b:2"  # open: not even for its leases
    assert all(pool.pick() == "http://b:2" for _ in range(4))
    assert pool.probes_due() == []
    clk.now += 1.0
    assert pool.probes_due() == ["http://a:1"]
    assert pool.probes_due() == []  # already probing
    assert pool.probe_result("http://a:1", False) is False
    clk.now += 1.5
    assert pool.probes_due() == []  # cooldown doubled to 2 s
    clk.now += 0.5
    assert pool.probes_due() == ["http://a:1"]
    assert pool.probe_result("http://a:1", True) is True
    assert not pool.is_open("http://a:1")
    for _ in range(2):
        pool.failure("http://a:1")
    clk.now += 0.5
    for _ in range(2):
        pool.failure("http://b:2")
    assert pool.pick() == "http://a:1"  # all open: the one due back soonest
    with pytest.raises(ValueError):
        core.EndpointPool([])


def test_cluster_verdict() -> None:
    def doc(node: str, *members: str, cid: str | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"node_id": node, "controller": node,
                             "members": [{"id": m} for m in members or (node,)]}
        if cid is not None:
            d["cluster_id"] = cid
        return d
    assert core.cluster_verdict({"a": doc("n1", "n1", "n2"), "b": doc("n2", "n1", "n2")}) is None
    assert core.cluster_verdict({"a": doc("n1"), "b": doc("n1")}) is None  # one node, twice
    assert "not one cluster" in (core.cluster_verdict({"a": doc("n1"), "b": doc("n2")}) or "")
    assert core.cluster_verdict({"a": doc("n1", cid="x"), "b": doc("n2", cid="x")}) is None
    assert core.cluster_verdict({"a": doc("n1", "n1", "n2", cid="x"),
                                 "b": doc("n2", "n1", "n2", cid="y")}) is not None
    assert core.cluster_verdict({"a": doc("n1")}) is None  # one answer proves nothing


def test_lease_calls_go_to_the_node_that_leased_and_batches_split_per_node() -> None:
    m = narad.Message("t", 0, 1, b"", 0, receipt_handle="h", endpoint="http://b")
    assert core.ack("t", "h", core.endpoint_of(m)).endpoint == "http://b"
    assert core.nack("t", "h", 2, "http://b").endpoint == "http://b"
    assert core.extend("t", "h", None, "http://b").endpoint == "http://b"
    st, _ = state(core.ack("t", "h", "http://b"))
    assert st.endpoint() == "http://b"
    groups = core.by_endpoint(["a", "b", "a", None], lambda x: x)
    assert groups == [("a", [0, 2]), ("b", [1]), (None, [3])]


def test_backoff_is_full_jitter_within_bounds() -> None:
    p = core.RetryPolicy()
    assert p.backoff(1, lambda: 1.0) == pytest.approx(0.05)
    assert p.backoff(3, lambda: 1.0) == pytest.approx(0.2)
    assert p.backoff(30, lambda: 1.0) == 5.0
    assert p.backoff(5, lambda: 0.0) == 0.0


# -- bodies and parsing


def test_encode_body_kinds() -> None:
    assert core.encode_body(b"\x00") == (b"\x00", "application/octet-stream")
    assert core.encode_body(bytearray(b"a"))[0] == b"a"
    assert core.encode_body("é") == ("é".encode(), "text/plain; charset=utf-8")
    assert core.encode_body({"a": [1, "ü"]}) == ('{"a":[1,"ü"]}'.encode(), "application/json")
    assert core.encode_body(b"<x/>", "application/xml")[1] == "application/xml"
    env = narad.Envelope.wrap("hi")
    assert core.encode_body(env) == (env.encode(), "application/json")


def test_batch_entries_store_what_produce_stores() -> None:
    assert core.batch_entry(b"\x01") == {"payload": "AQ==", "payload_encoding": "base64"}
    assert core.batch_entry("hi") == {"payload": "aGk=", "payload_encoding": "base64"}
    assert core.batch_entry({"a": 1}) == {"payload": {"a": 1}}
    assert core.batch_entry(narad.Outgoing(b"", key="k", partition=2)) == {
        "payload": "", "payload_encoding": "base64", "key": "k", "partition": 2}
    env = narad.Envelope.wrap(b"\x00")
    assert core.batch_entry(env)["payload"] == json.loads(env.encode())


def test_parse_message_payload_forms() -> None:
    base = {"topic": "t", "partition": 0, "offset": 1, "timestamp": 5}
    m = core.parse_message({**base, "payload": "AP8=", "payload_encoding": "base64",
                            "receipt_handle": "h", "delivery_attempt": 2, "key": "k"})
    assert (m.body, m.receipt_handle, m.delivery_attempt, m.key) == (b"\x00\xff", "h", 2, "k")
    assert core.parse_message({**base, "payload": "text"}).body == b"text"
    assert core.parse_message({**base, "payload": {"a": 1}}).json() == {"a": 1}


def test_durations() -> None:
    from datetime import timedelta
    assert core.ms_param(0.0015) == "2" and core.ms_param(timedelta(seconds=2)) == "2000"
    assert core.nack("t", "h", 0).request.params[-1] == ("extend", "0")
    assert core.nack("t", "h", 1.5).request.params[-1] == ("extend", "1500")
    assert core.extend("t", "h").request.params[-1] == ("extend", "true")
    # The broker refuses leases past 12 h; longer delays are capped (and come round again).
    assert core.nack("t", "h", 86400).request.params[-1] == ("extend", "43200000")
    assert core.extend("t", "h", 86400).request.params[-1] == ("extend", "43200000")
    with pytest.raises(narad.BadRequest):
        core.extend("t", "h", 0)
    with pytest.raises(narad.BadRequest):
        core.receive("t", max_messages=0)
    assert core.produce("a/b", b"").request.path == "/v1/topics/a%2Fb/produce"


# -- positions and envelopes


def test_position_round_trip() -> None:
    p = narad.Position.at_offsets({1: 5, 0: 3}).with_offset(2, 9).with_offset(0, 4)
    assert p.offset(0) == 4 and p.offset(2) == 9 and p.offset(7) is None
    assert narad.Position.loads(p.dumps()) == p
    t = narad.Position.at_time(1_700_000_000_000)
    assert narad.Position.loads(t.dumps()) == t and t.time_ms == 1_700_000_000_000
    from datetime import datetime
    assert narad.Position.at_time(datetime(2020, 1, 1)).time_ms == 1577836800000
    assert narad.Position.beginning() == narad.Position()


def test_envelope_wire_form_matches_the_other_sdks() -> None:
    env = narad.Envelope.wrap({"a": 1}, headers={"h": "v"}, traceparent="00-abc-def-01")
    doc = json.loads(env.encode())
    assert doc["format"] == "narad.envelope/1" and doc["attempt"] == 1
    assert doc["body"] == {"a": 1} and doc["headers"] == {"h": "v"}
    assert narad.Envelope.decode(env.encode()) == env
    text = narad.Envelope.wrap("héllo")
    assert json.loads(text.encode())["body_text"] == "héllo"
    assert narad.Envelope.decode(text.encode()).text() == "héllo"
    raw = narad.Envelope.wrap(b"\x00\xff", id="fixed")
    assert json.loads(raw.encode())["body_base64"] == base64.b64encode(b"\x00\xff").decode()
    assert narad.Envelope.decode(raw.encode()).body == b"\x00\xff"
    # What sdk-js writes, field for field.
    js = (b'{"format":"narad.envelope/1","id":"x","attempt":3,"not_before":12,'
          b'"last_error":"boom","origin":"o","body_text":"t"}')
    got = narad.Envelope.decode(js)
    assert (got.id, got.attempt, got.not_before, got.last_error, got.origin, got.body) == (
        "x", 3, 12, "boom", "o", b"t")
    for not_env in (b"", b"plain", b"[1]", b'{"format":"other","id":"x"}', b"{bad"):
        assert narad.Envelope.try_decode(not_env) is None
    # A payload nested deeper than json.loads recurses (older brokers stored them) is not
    # an envelope: retry tiers must still route, delay and unwrap it, or its consumer
    # could never settle it (audit issue 16, finding 6).
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    assert narad.Envelope.try_decode(deep) is None
    tiers = narad.RetryTiers("o", [("o.r1", 5)], "o.parked")
    msg = narad.Message(topic="o", partition=0, offset=0, body=deep, key=None,
                        timestamp=0, receipt_handle="h", delivery_attempt=1)
    assert tiers.due_in(msg) == 0.0
    assert tiers.unwrap(msg).body == deep
    assert tiers.plan_failure(msg, RuntimeError("x"))[0] == "o.r1"
    with pytest.raises(ValueError):
        msg.json()
    with pytest.raises(ValueError):
        narad.Envelope.decode(b"plain")


def test_retry_tiers_plan() -> None:
    tiers = narad.RetryTiers("o", [("o.r1", 5), ("o.r2", 60)], "o.parked")
    # Each tier is a retry topic and its delay child; the consumers read the children.
    assert tiers.topics() == ["o", "o.r1", "o.r1.due", "o.r2", "o.r2.due", "o.parked"]
    assert tiers.source_topics() == ["o", "o.r1.due", "o.r2.due"]
    named = narad.RetryTiers("o", [narad.RetryTier("o.r1", 0.25, due="o.r1-ready")], "p")
    assert named.source_topics() == ["o", "o.r1-ready"] and named.steps[0].delay_ms == 250
    msg = narad.Message("o", 0, 0, b"payload", 0)
    dest, env = tiers.plan_failure(msg, ValueError("bad"), now_ms=1000)
    assert dest == "o.r1" and env.attempt == 2 and env.not_before == 6000
    assert env.origin == "o" and env.last_error == "bad" and env.body == b"payload"
    m2 = narad.Message("o.r1", 0, 0, env.encode(), 0)
    assert tiers.due_in(m2, now_ms=1000) == 5.0 and tiers.due_in(m2, now_ms=7000) == 0.0
    assert tiers.unwrap(m2).body == b"payload"
    dest2, env2 = tiers.plan_failure(m2, ValueError("again"), now_ms=7000)
    assert dest2 == "o.r2" and env2.attempt == 3 and env2.id == env.id
    dest3, env3 = tiers.plan_failure(narad.Message("o.r2", 0, 0, env2.encode(), 0),
                                     ValueError("last"))
    assert dest3 == "o.parked" and env3.last_error == "last"
    with pytest.raises(ValueError):
        narad.RetryTiers("o", [], "p")


# -- consumer, publisher and replay bookkeeping


def msg(handle: str, offset: int = 0, partition: int = 0) -> narad.Message:
    return narad.Message("t", partition, offset, b"", 0, receipt_handle=handle)


def test_lease_book_renews_before_two_thirds_and_spots_lapses() -> None:
    book = plans.LeaseBook(window=3.0, max_lease=10.0, renew=True)
    d = plans.Delivery(msg("h"), leased_at=0.0, window=3.0)
    book.add(d)
    assert book.due(1.0) == ([], [])
    assert book.due(1.5) == ([d], [])  # half the window: before two thirds
    assert 0 < book.next_check(1.0) <= 0.5
    book.renewed(d, 1.5)
    assert d.lease_until == 4.5
    book.renewal_failed(d, 3.0)
    assert book.due(3.05) == ([], [])  # retried a little later
    assert book.due(4.5) == ([], [d])  # lapsed
    book.remove(d)
    d2 = plans.Delivery(msg("h2"), leased_at=0.0, window=3.0)
    book.add(d2)
    d2.renewed_at, d2.lease_until = 8.0, 11.0
    assert book.due(9.6) == ([], [])  # renewing would pass max_lease
    assert book.due(11.0) == ([], [d2])  # so it lapses
    d2.state = plans.State.SETTLING
    assert book.due(20.0) == ([], [])  # a settling lease is the ack's business
    assert book.held() == [d2] and len(book) == 1
    assert plans.renewal_entries([d2], 3.0) == [("h2", "3000")]


def test_handler_outcomes() -> None:
    assert plans.outcome_of(None, 1.0) == ("ok", 0.0)
    assert plans.outcome_of(RuntimeError(), 1.0) == ("nack", 1.0)
    assert plans.outcome_of(narad.Nack(2.5), 1.0) == ("nack", 2.5)
    assert plans.is_terminal(narad.NotFound("x")) and not plans.is_terminal(
        narad.Unavailable("x"))
    assert narad.current_delivery() is None


def test_only_401_403_and_a_gone_topic_stop_a_consumer() -> None:
    """SDK rules 7 and 8: the loop stops only on 401, 403, the topic gone, or a poll the
    broker will never accept as sent (400, 409, 413). A 500 (one request hitting a
    broker bug, or a proxy) or a 501 is reported and retried. The old code stopped on
    every error that was not retryable, a 500 included."""
    for err in (narad.Unauthenticated("x", status=401), narad.Forbidden("x", status=403),
                narad.NotFound("x", status=404), narad.BadRequest("x", status=400),
                narad.Conflict("x", status=409), narad.TooLarge("x", status=413)):
        assert plans.is_terminal(err), err
    for err in (narad.Internal("bug", status=500, code="internal"),
                narad.NotImplemented("x", status=501), narad.NaradError("x", status=418),
                narad.Timeout("x"), narad.Throttled("x", status=429)):
        assert not plans.is_terminal(err), err


def topic_doc(visibility_ms: int) -> dict[str, Any]:
    """topic_doc is GET /v1/topics/t's answer for a topic "t" of one partition."""
    return {"name": "t", "incarnation": "i", "partitions": 1, "retention_ms": 1000,
            "visibility_timeout_ms": visibility_ms, "max_in_flight_per_partition": 10,
            "max_acked_ahead_per_partition": 10, "replication_factor": 1,
            "created_at": "2026-01-01T00:00:00Z"}


def leased_msg() -> dict[str, Any]:
    """leased_msg is a message of topic "t" as a consume answers it, under lease "h"."""
    return {"topic": "t", "partition": 0, "offset": 0, "timestamp": 1, "payload": "",
            "payload_encoding": "base64", "receipt_handle": "h", "delivery_attempt": 1}


def test_a_500_on_a_poll_is_retried_by_the_consumer() -> None:
    """The whole loop: a consumer whose first poll is answered 500 reports it (a
    ``poll_error`` event with outcome ``retry``), polls again after a backoff, and
    handles the message that comes. The old consumer stopped with the 500 in
    ``consumer.error``."""
    polls = [0]
    acked = threading.Event()
    topic = topic_doc(30_000)
    msg = leased_msg()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t":
            return httpx.Response(200, json=topic)
        if req.url.path == "/v1/topics/t/ack":
            acked.set()
            return httpx.Response(204)
        polls[0] += 1
        if polls[0] == 1:
            return httpx.Response(500, json=error_body("internal"))
        if polls[0] == 2:
            return httpx.Response(200, json=msg)
        time.sleep(0.01)
        return httpx.Response(204)

    events: list[narad.Event] = []
    with narad.Client("http://a", transport=httpx.MockTransport(handler),
                      on_event=events.append) as c:
        consumer = c.consume("t", lambda m: None, wait=0.01)
        assert acked.wait(5), f"nothing acked; consumer error: {consumer.error!r}"
        assert consumer.running and consumer.error is None
        consumer.close()
    assert consumer.stats.poll_errors == 1 and consumer.stats.acked == 1
    assert [e.outcome for e in events if e.kind == "poll_error"] == ["retry"]


def test_batch_buffer() -> None:
    buf: plans.BatchBuffer[int] = plans.BatchBuffer(max_batch=3, max_batch_bytes=10,
                                                    linger=0.1, max_buffered=5)
    assert buf.wait_time(0.0, False) is None
    for i in range(2):
        buf.add(plans.Pending({"i": i}, 4, i, queued_at=1.0))
    assert buf.wait_time(1.05, False) == pytest.approx(0.05)
    assert buf.wait_time(1.05, True) == 0.0
    buf.add(plans.Pending({"i": 2}, 4, 2, queued_at=1.0))
    assert buf.wait_time(1.0, False) == 0.0  # bytes reached
    assert [p.future for p in buf.take()] == [0, 1]  # 12 bytes would pass 10
    assert [p.future for p in buf.take()] == [2] and buf.bytes == 0
    for i in range(5):
        buf.add(plans.Pending({}, 1, i, 0.0))
    assert buf.full()
    assert plans.split_on_error(narad.BadRequest("x", status=400), 2)
    assert not plans.split_on_error(narad.BadRequest("x", status=400), 1)
    assert not plans.split_on_error(narad.Unavailable("x", status=503), 5)


def test_replay_plan_bounded_round_robin() -> None:
    plan = plans.ReplayPlan("t", narad.Position.at_offsets({1: 2}), [0, 1], {0: 2, 1: 3}, 10,
                            0.5)
    step = plan.next()
    assert isinstance(step, plans.Read) and step.partition == 0
    assert ("max", "10") in step.call.request.params
    plan.on_page(0, [narad.Message("t", 0, 0, b"a", 0), narad.Message("t", 0, 1, b"b", 0)], 2)
    step = plan.next()
    assert isinstance(step, plans.Read) and step.partition == 1
    assert ("from", "2") in step.call.request.params and ("max", "1") in step.call.request.params
    plan.on_page(1, [narad.Message("t", 1, 2, b"c", 0)], 3)
    assert plan.next() is None
    got = [plan.take(), plan.take(), plan.take(), plan.take()]
    assert [m.body if m else None for m in got] == [b"a", b"b", b"c", None]
    assert plan.position.offset(0) == 2 and plan.position.offset(1) == 3


def test_replay_plan_following_sleeps_after_an_empty_round() -> None:
    plan = plans.ReplayPlan("t", narad.Position.at_time(123), [0], None, 5, 0.25)
    step = plan.next()
    assert isinstance(step, plans.Read)
    assert ("from_time", "123") in step.call.request.params
    plan.on_page(0, [], 7)
    assert plan.position.offset(0) == 7
    assert plan.next() == plans.Sleep(0.25)
    step = plan.next()
    assert isinstance(step, plans.Read) and ("from", "7") in step.call.request.params


# -- sync and async cannot drift


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(f) for n, f in vars(cls).items()
            if callable(f) and not n.startswith("_")}


@pytest.mark.parametrize("sync_cls,async_cls", [
    (narad.Client, narad.AsyncClient), (narad.Publisher, narad.AsyncPublisher),
    (narad.Consumer, narad.AsyncConsumer)])
def test_sync_and_async_have_the_same_surface(sync_cls: type, async_cls: type) -> None:
    s, a = public_methods(sync_cls), public_methods(async_cls)
    assert set(s) == set(a)
    for name in s:
        sp = [(p.name, p.kind, p.default) for p in s[name].parameters.values()]
        ap = [(p.name, p.kind, p.default) for p in a[name].parameters.values()]
        assert sp == ap, name


def test_every_public_name_has_a_docstring() -> None:
    missing: list[str] = []
    import narad.otel
    import narad.prometheus

    def check(name: str, obj: Callable[..., Any] | type) -> None:
        if not (getattr(obj, "__doc__", None) or "").strip():
            missing.append(name)

    for mod in (narad, narad.otel, narad.prometheus):
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            check(name, obj)
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not (callable(member) or isinstance(
                            member, property)):
                        continue
                    check(f"{name}.{attr}", member)
    assert missing == []


def test_parse_child_shows_a_pause() -> None:
    why = "the owner alice may no longer consume orders; grant it again"
    kid = core.parse_child({"child": "orders.copy", "fanout_delay_ms": 0, "state": "paused",
                            "paused_reason": why})
    assert kid.state == "paused" and kid.paused_reason == why
    old = core.parse_child({"child": "orders.copy", "fanout_delay_ms": 0})
    assert old.state is None and old.paused_reason is None


def test_poison_backoff_grows_with_the_attempt_jittered_and_capped() -> None:
    assert plans.poison_backoff(1, lambda: 0.0) == 0.5
    assert plans.poison_backoff(1, lambda: 1.0) == 1.0
    assert plans.poison_backoff(4, lambda: 1.0) == 8.0
    assert plans.poison_backoff(4, lambda: 0.0) == 4.0
    assert plans.poison_backoff(40, lambda: 1.0) == 300.0
    assert plans.outcome_of(RuntimeError(), None, 3)[1] <= 4.0
    assert plans.outcome_of(RuntimeError(), 0.0, 3) == ("nack", 0.0)
    with pytest.raises(ValueError):
        plans.ConsumerOptions(max_deliveries=3)


@MODES
def test_a_consumers_wait_after_a_poll_error_is_bounded_by_the_retry_after_cap(mode: str
                                                                                ) -> None:
    """A poll answered with a huge Retry-After (a proxy's, or an HTTP date far ahead)
    holds the consumer back at most MAX_RETRY_AFTER (300 s), as every call and the Go
    and TypeScript consumers do. The old consumer waited what the header said: a day
    here, with nothing polled meanwhile."""
    topic = topic_doc(30_000)
    polled = threading.Event()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t":
            return httpx.Response(200, json=topic)
        polled.set()
        return httpx.Response(503, json=error_body("unavailable"),
                              headers={"retry-after": "86400"})

    events: list[narad.Event] = []

    def retry_delays() -> list[float]:
        return [e.delay or 0.0 for e in events if e.kind == "poll_error"]

    if mode == "sync":
        with narad.Client("http://a", transport=httpx.MockTransport(handler),
                          on_event=events.append) as c:
            consumer = c.consume("t", lambda m: None, wait=0.01)
            assert polled.wait(5)
            deadline = time.monotonic() + 5
            while not retry_delays() and time.monotonic() < deadline:
                time.sleep(0.01)
            consumer.close()
    else:
        async def run() -> None:
            async with narad.AsyncClient("http://a", transport=httpx.MockTransport(handler),
                                         on_event=events.append) as c:
                async def noop(m: narad.Message) -> None:
                    return None
                consumer = await c.consume("t", noop, wait=0.01)
                deadline = time.monotonic() + 5
                while not retry_delays() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await consumer.close()
        asyncio.run(run())
    assert retry_delays(), "no poll error reported"
    assert all(0 < d <= core.MAX_RETRY_AFTER for d in retry_delays()), retry_delays()


def test_a_dead_lettered_envelope_gets_the_reason_and_its_origin() -> None:
    """The SDK contract: past max_deliveries an envelope goes to the dead-letter topic
    "with the reason" (its ``last_error``), as the Go SDK writes it, so a re-driver in
    any language reads why and where from (``origin``). The old code only added
    headers: ``last_error`` stayed the handler's last one, or None."""
    env = narad.Envelope.wrap({"id": 7}, headers={"a": "b"})
    body, _ = core.encode_body(env)
    m = narad.Message(topic="orders", partition=1, offset=5, body=body, timestamp=1,
                      key="k", receipt_handle="h", delivery_attempt=3)
    d = plans.Delivery(m, 0.0, 30.0)
    data, ctype = plans.dead_letter_body(d, 2)
    moved = narad.Envelope.try_decode(data)
    assert moved is not None and ctype.startswith("application/json")
    assert moved.last_error == "delivered 3 times, over the limit of 2"
    assert moved.origin == "orders" and moved.id == env.id and moved.json() == {"id": 7}
    assert moved.headers["a"] == "b"


def test_a_500_on_a_renewal_does_not_count_the_lease_lost() -> None:
    """A renewal answered 500 (a broker bug on one request, or a proxy) says nothing about
    the lease: it is tried again within the lease, as the Go and TypeScript consumers
    do, and the handler's result is acked. The old consumer took any failure that was
    not retryable for a lost lease: it cancelled the handler and never acked its
    message, which came again once the lease lapsed."""
    topic = topic_doc(1000)
    msg = leased_msg()
    polls = [0]
    renewals = [0]
    acked = threading.Event()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t":
            return httpx.Response(200, json=topic)
        if req.url.path == "/v1/topics/t/ack-batch":
            renewals[0] += 1
            if renewals[0] == 1:
                return httpx.Response(500, json=error_body("internal"))
            return httpx.Response(200, json={"results": [{"receipt_handle": "h",
                                                          "status": 204}]})
        if req.url.path == "/v1/topics/t/ack":
            if "extend" not in req.url.params:
                acked.set()
            return httpx.Response(204)
        polls[0] += 1
        if polls[0] == 1:
            return httpx.Response(200, json=msg)
        time.sleep(0.01)
        return httpx.Response(204)

    with narad.Client("http://a", transport=httpx.MockTransport(handler)) as c:
        consumer = c.consume("t", lambda m: time.sleep(1.5), wait=0.01)
        assert acked.wait(10), f"not acked; stats {consumer.stats}"
        consumer.close()
    assert renewals[0] >= 2, renewals
    assert consumer.stats.lease_lost == 0 and consumer.stats.acked == 1, consumer.stats


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_a_success(status: int) -> None:
    """The broker never redirects; a 3xx comes from something in front of it (an http
    to https redirect of a load balancer) and the request never reached the broker. The
    old code took every answer under 400 for a success: an ack answered 301 counted as
    settled (the message came again while the consumer counted it acked), and a poll
    answered with an empty 302 was an empty poll, so a consumer pointed at such an
    endpoint polled for ever without reporting anything. Like the Go and TypeScript
    SDKs, only a 2xx is a success."""
    headers = {"location": "https://a/v1/topics/t/ack"}
    ack, _ = state(core.ack("t", "h"))
    step = ack.on_response(ack.endpoint(), core.Response(status, headers, b""))
    assert isinstance(step, core.Fail), f"an ack answered {status}: {step!r}"
    assert step.error.status == status and not step.error.retryable
    poll, _ = state(core.receive("t", max_messages=5, wait=1))
    step = poll.on_response(poll.endpoint(), core.Response(status, headers, b""))
    assert isinstance(step, core.Fail), f"a poll answered {status}: {step!r}"
    prod, _ = state(core.produce("t", b"x"))
    step = prod.on_response(prod.endpoint(), core.Response(status, headers, b"moved"))
    assert isinstance(step, core.Fail) and not step.error.uncertain


@MODES
def test_a_batch_error_says_part_of_the_call_was_stored(mode: str) -> None:
    """A produce_batch sent in two requests (1500 messages) whose second request failed
    with a 503 that stored nothing: the first 1000 are stored, so the call took effect.
    The raised error must not say "retryable, certain", which invites sending the whole
    batch again and storing those 1000 twice (also without duplicates). The old code
    raised the first failure as it was: retryable, not uncertain. Each result keeps its
    own error, as in the Go and TypeScript SDKs."""
    requests = [0]

    def handler(req: httpx.Request) -> httpx.Response:
        requests[0] += 1
        n = len(json.loads(req.content)["messages"])
        if requests[0] == 2:
            return httpx.Response(503, json=error_body("unavailable"))
        return httpx.Response(202, json={"results": [
            {"topic": "t", "partition": 0, "offset": i} for i in range(n)]})

    with pytest.raises(narad.Unavailable) as exc:
        over_mock(mode, handler, "produce_batch", "t", [b"m"] * 1500,
                  allow_duplicates=False, client={"attempts": 1})
    err = exc.value
    assert not err.retryable and err.uncertain, repr(err)
    assert err.results is not None and isinstance(err.results[0], narad.Produced)
    last = err.results[1499]
    assert isinstance(last, narad.Unavailable) and last.retryable and not last.uncertain


def test_a_renewal_that_hangs_does_not_outlive_the_lease() -> None:
    """A renewal sent to a node that takes the request and never answers is bounded by
    the lease it renews (as Go bounds it by the lease's end and TypeScript each attempt
    by the time left): once the lease is over, the handler is cancelled (rule 1). The
    old consumer waited for the renewal's whole call budget (the 30 s request timeout
    here) while the lease had long lapsed and the message was delivered elsewhere, and
    every other lease waited behind it, unrenewed."""
    topic = topic_doc(1000)
    msg = leased_msg()
    polls = [0]
    release = threading.Event()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t":
            return httpx.Response(200, json=topic)
        if req.url.path == "/v1/topics/t/ack-batch":
            # Taken, never answered: the attempt ends at its read timeout (a mock
            # transport does not enforce it; a real one does).
            bound = (req.extensions.get("timeout") or {}).get("read") or 30.0
            release.wait(min(4.0, bound))
            raise httpx.ReadTimeout("no answer", request=req)
        if req.url.path == "/v1/topics/t/ack":
            return httpx.Response(204)
        polls[0] += 1
        if polls[0] == 1:
            return httpx.Response(200, json=msg)
        time.sleep(0.01)
        return httpx.Response(204)

    cancelled_after: list[float] = []

    def work(m: narad.Message) -> None:
        d = narad.current_delivery()
        assert d is not None
        t0 = time.monotonic()
        if d.cancelled.wait(3.5):
            cancelled_after.append(time.monotonic() - t0)

    with narad.Client("http://a", transport=httpx.MockTransport(handler)) as c:
        consumer = c.consume("t", work, wait=0.01)
        deadline = time.monotonic() + 5
        while consumer.stats.lease_lost == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        release.set()
        consumer.close()
    assert cancelled_after and cancelled_after[0] < 2.0, cancelled_after


@MODES
def test_leaving_messages_hands_back_what_was_fetched_and_not_reached(mode: str) -> None:
    """``messages(batch=n)`` fetches n messages under leases and yields them one by one.
    A caller that leaves the loop early (break, an exception, closing the iterator)
    never sees the rest, so they are handed back (nack) at once, as the TypeScript
    iterator does and as a consumer's shutdown hands back what never started. The old
    iterator left them leased for their whole visibility timeout."""
    msgs = [{"topic": "t", "partition": 0, "offset": i, "timestamp": 1, "payload": "",
             "payload_encoding": "base64", "receipt_handle": f"h{i}", "delivery_attempt": 1}
            for i in range(3)]
    nacked: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t/consume-batch":
            return httpx.Response(200, json={"messages": msgs})
        if req.url.path == "/v1/topics/t/ack":
            if req.url.params.get("extend") == "0":
                nacked.append(req.url.params["receipt_handle"])
            return httpx.Response(204)
        return httpx.Response(404, json=error_body("not_found"))

    if mode == "sync":
        with narad.Client("http://a", transport=httpx.MockTransport(handler)) as c:
            it = c.messages("t", batch=3, wait=0)
            first = next(it)
            it.close()
    else:
        async def run() -> narad.Message:
            async with narad.AsyncClient("http://a",
                                         transport=httpx.MockTransport(handler)) as ac:
                agen = ac.messages("t", batch=3, wait=0)
                m = await agen.__anext__()
                await agen.aclose()
                return m
        first = asyncio.run(run())
    assert first.receipt_handle == "h0"
    assert sorted(nacked) == ["h1", "h2"], nacked


@MODES
def test_a_202_that_cannot_be_read_is_of_unknown_outcome(mode: str) -> None:
    """A 202 says the messages are stored. When its body cannot be read (not JSON, or
    fewer results than messages: a broken proxy, a bug), the SDK cannot say where they
    went, but must not say they were not stored: the error is uncertain, as the
    TypeScript SDK reports a short result list. The old code raised a certain error,
    inviting a resend that stores them twice."""
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.endswith("/produce-batch"):
            return httpx.Response(202, json={"results": []})
        return httpx.Response(202, content=b"<html>stored, but not JSON</html>")

    with pytest.raises(narad.NaradError) as one:
        over_mock(mode, handler, "produce", "t", b"x", allow_duplicates=False)
    assert one.value.uncertain and not one.value.retryable, repr(one.value)
    with pytest.raises(narad.NaradError) as many:
        over_mock(mode, handler, "produce_batch", "t", [b"a", b"b"], allow_duplicates=False)
    assert many.value.uncertain and not many.value.retryable, repr(many.value)


class _ScriptedPolls(http.server.BaseHTTPRequestHandler):
    """A node whose first consume leases a message "h" as the consumer closes: it answers
    once the client's side of the connection ends (``at_close``: what the broker does
    when a message comes as the client goes), or in two parts, the second once the test
    releases it (``in_two_parts``: an answer under way). Later polls find nothing. It
    records every settle (ack, nack) it is sent."""

    protocol_version = "HTTP/1.1"
    server: _ScriptedNode

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        node = self.server
        if self.path == "/v1/topics/t":
            self._reply(200, json.dumps(topic_doc(30_000)).encode())
            return
        with node.lock:
            node.polls += 1
            first = node.polls == 1
        if not first:
            self._reply(204)
            return
        body = json.dumps(leased_msg()).encode()
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        with contextlib.suppress(OSError):  # the old consumers dropped the connection
            if node.how == "silent":
                node.polling.set()
                node.release.wait(30)  # deaf to the half-close, as some proxies are
                return
            if node.how == "at_close":
                node.polling.set()
                self.connection.recv(1)  # b"": the client ended its side
                self.wfile.write(head + body)
            else:
                self.wfile.write(head + body[:10])
                self.wfile.flush()
                node.polling.set()
                node.release.wait(10)
                self.wfile.write(body[10:])
            self.wfile.flush()
        self.close_connection = True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.server.lock:
            self.server.settles.append(self.path)
        self._reply(204)


class _ScriptedNode(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, how: str) -> None:
        super().__init__(("127.0.0.1", 0), _ScriptedPolls)
        self.how = how
        self.lock = threading.Lock()
        self.polls = 0
        self.polling = threading.Event()
        self.release = threading.Event()
        self.settles: list[str] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@MODES
@pytest.mark.parametrize("how", ["at_close", "in_two_parts"])
def test_a_poll_answered_as_the_consumer_closes_hands_its_messages_back(mode: str, how: str
                                                                         ) -> None:
    """SDK contract rule 6: the messages of a poll cut by a shutdown are handed back,
    not left leased. Here the broker leases a message for the poll as close comes
    (``at_close``), or has its answer under way, headers and part of the body in
    (``in_two_parts``): the answer is read and the message handed back at once
    (extend=0), never given to the handler, even with a grace of 0. The old asyncio
    consumer cancelled the poll's task and the old sync one shut its socket both ways,
    which dropped that answer: the message stayed leased to nobody until its visibility
    timeout. Now close half-closes the poll's connection (the broker answers at once)
    and reads what comes."""
    node = _ScriptedNode(how)
    ran: list[narad.Message] = []
    settled: list[str] = []
    stats: list[plans.ConsumerStats] = []
    took: list[float] = []
    try:
        if mode == "sync":
            with narad.Client(node.url) as c:
                con = c.consume("t", ran.append, wait=15)
                assert node.polling.wait(5), "no poll came"
                closing = threading.Thread(target=con.close, kwargs={"grace": 0})
                t0 = time.monotonic()
                closing.start()
                time.sleep(0.3)  # what the old consumer needed to drop the answer
                node.release.set()
                closing.join(10)
                took.append(time.monotonic() - t0)
                assert not closing.is_alive()
                settled = list(node.settles)
                stats.append(con.stats)
        else:
            async def run() -> list[str]:
                async with narad.AsyncClient(node.url) as c:
                    async def handle(m: narad.Message) -> None:
                        ran.append(m)
                    con = await c.consume("t", handle, wait=15)
                    while not node.polling.is_set():
                        await asyncio.sleep(0.01)
                    t0 = time.monotonic()
                    closing = asyncio.ensure_future(con.close(grace=0))
                    await asyncio.sleep(0.3)
                    node.release.set()
                    await asyncio.wait_for(closing, 10)
                    took.append(time.monotonic() - t0)
                    stats.append(con.stats)
                    return list(node.settles)
            settled = asyncio.run(run())
    finally:
        node.release.set()
        node.shutdown()
        node.server_close()
    assert not ran
    assert settled == ["/v1/topics/t/ack?receipt_handle=h&extend=0"], settled
    assert (stats[0].received, stats[0].handed_back) == (1, 1), stats
    assert took[0] < core.ANSWER_GRACE, took  # not the poll's wait (15 s)


def test_through_the_callers_transport_an_answer_begun_is_read_at_close() -> None:
    """With a transport of the caller's there is no socket to half-close: the asyncio
    consumer's close cancels a poll not answered yet (at once, not after its wait), but
    one whose answer has begun is read and its message handed back. The old consumer
    cancelled the poll's task in the middle of that read."""
    release = asyncio.Event()
    begun = asyncio.Event()
    settles: list[str] = []

    class TwoParts(httpx.AsyncByteStream):
        def __init__(self, body: bytes) -> None:
            self.body = body

        async def __aiter__(self) -> Any:
            yield self.body[:10]
            begun.set()
            await release.wait()
            yield self.body[10:]

    polls = [0]

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/topics/t":
            return httpx.Response(200, json=topic_doc(30_000))
        if req.method == "POST":
            settles.append(f"{req.url.path}?{req.url.query.decode()}")
            return httpx.Response(204)
        polls[0] += 1
        if polls[0] == 1:
            return httpx.Response(200, stream=TwoParts(json.dumps(leased_msg()).encode()))
        await asyncio.sleep(15)  # a long poll with nothing to answer
        return httpx.Response(204)

    async def run() -> tuple[list[float], plans.ConsumerStats, plans.ConsumerStats]:
        async with narad.AsyncClient("http://a", transport=httpx.MockTransport(handler)) as c:
            async def handle(m: narad.Message) -> None:
                raise AssertionError("a message taken while closing reached the handler")
            con = await c.consume("t", handle, wait=15)
            await asyncio.wait_for(begun.wait(), 5)
            closing = asyncio.ensure_future(con.close(grace=0))
            await asyncio.sleep(0.3)
            release.set()
            t0 = time.monotonic()
            await asyncio.wait_for(closing, 10)
            took = [time.monotonic() - t0]
            idle = await c.consume("t", handle, wait=15)  # its poll waits unanswered
            while polls[0] < 2:
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            await idle.close()
            took.append(time.monotonic() - t0)
            return took, con.stats, idle.stats

    took, stats, idle = asyncio.run(run())
    assert settles == ["/v1/topics/t/ack?receipt_handle=h&extend=0"], settles
    assert (stats.received, stats.handed_back) == (1, 1), stats
    assert idle.received == 0 and took[1] < 2, took


@MODES
def test_a_cut_poll_nobody_answers_is_given_up_after_the_answer_grace(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Something between the consumer and the broker (a proxy) may not pass the
    half-close of a cut poll on, and nothing answers it: close gives that poll
    ``ANSWER_GRACE``, then ends it, and does not wait for the poll's own wait (30 s
    here) nor the grace."""
    monkeypatch.setattr(core, "ANSWER_GRACE", 0.5)
    node = _ScriptedNode("silent")
    took: list[float] = []
    try:
        if mode == "sync":
            with narad.Client(node.url) as c:
                con = c.consume("t", lambda m: None, wait=20)
                assert node.polling.wait(5), "no poll came"
                t0 = time.monotonic()
                con.close(grace=30)
                took.append(time.monotonic() - t0)
        else:
            async def run() -> None:
                async with narad.AsyncClient(node.url) as c:
                    async def handle(m: narad.Message) -> None:
                        return None
                    con = await c.consume("t", handle, wait=20)
                    while not node.polling.is_set():
                        await asyncio.sleep(0.01)
                    t0 = time.monotonic()
                    await con.close(grace=30)
                    took.append(time.monotonic() - t0)
            asyncio.run(run())
    finally:
        node.release.set()
        node.shutdown()
        node.server_close()
    assert 0.4 < took[0] < 3, took
