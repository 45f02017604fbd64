"""Cluster membership: listing, moves, decommission, forced takeover, replication factor.

A single test node answers the listings and refuses every membership change with 409
(it runs alone), which is enough for the real-broker checks. The answers only a cluster
gives (a move, a 404 for an unknown move, a forced takeover that timed out) are scripted
at the transport: the rule answers those routes without forwarding and records what
the client sent. Every test runs through the sync and the async client.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import narad
from conftest import Driver

COPYING = {"id": "m1", "topic": "orders", "partition": 1, "from": "n1", "to": "n2",
           "status": "copying", "cause": "request", "progress": 0.25, "lag": 30,
           "created_at_ms": 1700000000000, "updated_at_ms": 1700000001000}
FAILED = {"id": "m0", "topic": "t", "partition": 0, "from": "", "to": "n3", "status": "failed",
          "reason": "n3 died", "cause": "replication_factor", "progress": 0.5,
          "created_at_ms": 1, "updated_at_ms": 2}
TIMEOUT = (503, {"error": {"code": "timeout",
                           "message": "the controller did not answer in time"}})


def scripted(answers: dict[str, list[tuple[int, Any]]]):  # type: ignore[no-untyped-def]
    """A rule answering "METHOD /path" from a list, one per request (the last repeats).

    Routes that are not listed go to the real broker.
    """
    def rule(req: httpx.Request, n: int):  # type: ignore[no-untyped-def]
        route = f"{req.method} {req.url.raw_path.decode()}"
        queue = answers.get(route)
        if not queue:
            return None
        status, body = queue[0] if len(queue) == 1 else queue.pop(0)
        headers = {"Retry-After": "0"} if status == 503 else {}
        content = b"" if body is None else json.dumps(body).encode()
        return httpx.Response(status, headers=headers, content=content)
    return rule


def sent(client: Any, path_part: str) -> list[tuple[str, str, Any]]:
    """(method, path, JSON body or None) of every request whose path contains path_part."""
    out = []
    for r in client.transport.seen:
        if path_part in r.url.path:
            body = json.loads(r.content) if r.content else None
            out.append((r.method, r.url.path, body))
    return out


def test_cluster_and_members_of_a_real_node(drv: Driver) -> None:
    c = drv.client
    info = c.get_cluster()
    assert isinstance(info, narad.ClusterInfo)
    assert info.node_id and info.controller == info.node_id  # a node alone leads itself
    [me] = info.members
    assert isinstance(me, narad.Member)
    assert me.id == info.node_id and me.status == "alive" and me.voter is True
    assert me.http_address == drv.broker.url
    assert me.partitions_held is not None and me.partitions_led is not None
    assert info.cluster_id  # this broker sends one
    assert c.list_members() == [me]
    assert c.list_moves() == []


def test_membership_calls_send_their_route_and_body_and_read_the_answer(drv: Driver) -> None:
    c = drv.new_client(rule=scripted({
        "POST /v1/cluster/moves": [(202, COPYING)],
        "GET /v1/cluster/moves": [(200, {"moves": [COPYING, FAILED]})],
        "DELETE /v1/cluster/moves/m1": [(204, None)],
        "POST /v1/cluster/rebalance": [(202, {"moves": []})],
        "DELETE /v1/cluster/members/n2": [(202, {"id": "n2", "address": "10.0.0.2:7950",
                                                 "status": "decommissioning", "voter": True,
                                                 "partitions_held": 4})],
        "POST /v1/topics/orders/partitions/1/force-leader": [
            (200, {"possibly_lost_at_least": 12, "replicas": ["n3"]})],
    }))
    want = narad.Move(id="m1", topic="orders", partition=1, from_="n1", to="n2",
                      status="copying", cause="request", progress=0.25,
                      created_at_ms=1700000000000, updated_at_ms=1700000001000, lag=30)
    assert c.move_partition("orders", 1, "n1", "n2") == want
    assert want.created_at.timestamp() == 1700000000.0
    moves = c.list_moves()
    assert moves[0] == want
    old = moves[1]
    assert (old.from_, old.to, old.status, old.reason, old.lag, old.cause) == (
        "", "n3", "failed", "n3 died", None, "replication_factor")
    assert c.cancel_move("m1") is None
    assert c.rebalance() == []
    m = c.decommission("n2")
    assert (m.id, m.status, m.partitions_held, m.partitions_led) == ("n2", "decommissioning",
                                                                      4, None)
    fl = c.force_leader("orders", 1, "n3")
    assert fl == narad.ForceLeaderResult(possibly_lost_at_least=12, replicas=("n3",))

    assert sent(c, "/v1/cluster/") + sent(c, "/force-leader") == [
        ("POST", "/v1/cluster/moves", {"topic": "orders", "partition": 1, "from": "n1",
                                       "to": "n2"}),
        ("GET", "/v1/cluster/moves", None),
        ("DELETE", "/v1/cluster/moves/m1", None),
        ("POST", "/v1/cluster/rebalance", None),
        ("DELETE", "/v1/cluster/members/n2", None),
        ("POST", "/v1/topics/orders/partitions/1/force-leader", {"node": "n3"}),
    ]


def test_replication_factor_is_sent_on_alter_topic(drv: Driver) -> None:
    t = drv.topic()
    c = drv.new_client(rule=lambda r, n: None)  # forwards all, records what was sent
    assert c.alter_topic(t, replication_factor=1).replication_factor == 1
    # More copies than nodes: the node alone refuses, and the answer is final.
    with pytest.raises(narad.Conflict) as ei:
        c.alter_topic(t, replication_factor=3)
    assert ei.value.status == 409 and ei.value.code == "conflict"
    assert not ei.value.retryable and not ei.value.uncertain
    c.alter_topic(t, retention_ms=3_600_000)
    assert [b for m, _, b in sent(c, f"/v1/topics/{t}") if m == "PATCH"] == [
        {"replication_factor": 1}, {"replication_factor": 3}, {"retention_ms": 3_600_000}]


def test_membership_refusals_map_to_the_sdk_errors(drv: Driver) -> None:
    c = drv.new_client(rule=scripted({
        "DELETE /v1/cluster/moves/gone": [
            (404, {"error": {"code": "move_not_found",
                             "message": "no partition move has that id"}})],
    }))
    with pytest.raises(narad.NotFound) as nf:
        c.cancel_move("gone")
    assert nf.value.code == "move_not_found" and nf.value.status == 404
    assert not nf.value.retryable
    t = drv.topic()
    # The real node refuses every membership change with 409 and says why.
    refusals = [
        lambda: c.move_partition(t, 0, "a", "b"),
        lambda: c.cancel_move("m1"),
        lambda: c.rebalance(),
        lambda: c.force_leader(t, 0, "b"),
    ]
    for call in refusals:
        with pytest.raises(narad.Conflict) as ce:
            call()
        assert ce.value.status == 409 and "needs a cluster" in str(ce.value)
        assert not ce.value.retryable and not ce.value.uncertain
    # An unknown node is not found, even on a lone node.
    with pytest.raises(narad.NotFound) as nn:
        c.decommission("n9")
    assert nn.value.code == "node_not_found" and not nn.value.retryable
    # 409s and 404s are terminal: each was sent once.
    assert len(sent(c, "/v1/cluster/")) == 1 + 4 and len(sent(c, "/force-leader")) == 1


def test_force_leader_is_not_retried_after_an_unknown_outcome(drv: Driver) -> None:
    c = drv.new_client(rule=scripted({
        "POST /v1/topics/t/partitions/0/force-leader": [
            TIMEOUT, (200, {"possibly_lost_at_least": 0, "replicas": ["n1"]})],
        "POST /v1/cluster/moves": [TIMEOUT, (202, COPYING)],
    }), backoff_min=0.001, backoff_max=0.01)
    with pytest.raises(narad.Timeout) as ei:
        c.force_leader("t", 0, "n1")
    assert ei.value.uncertain and ei.value.code == "timeout"
    assert len(sent(c, "/force-leader")) == 1
    # A move is answered with the move under way when repeated, so it is retried.
    assert c.move_partition("orders", 1, "n1", "n2").id == "m1"
    assert len(sent(c, "/v1/cluster/moves")) == 2


def test_force_leader_whose_reply_was_lost_is_uncertain(drv: Driver) -> None:
    c = drv.new_client(rule=lambda r, n: (httpx.ReadTimeout("lost")
                                          if r.url.path.endswith("/force-leader") else None))
    with pytest.raises(narad.Timeout) as ei:
        c.force_leader("t", 0, "n1")
    assert ei.value.uncertain
    assert len(sent(c, "/force-leader")) == 1
