"""Several endpoints: calls stick to one node, a lease is settled on the node that issued
it, endpoints that are not one cluster draw one warning, and each attempt has its own
bound so a node that never answers is left for the next one."""

from __future__ import annotations

import socket
import time
import warnings
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

import narad
from conftest import Broker, Driver, wait_for


def test_leases_are_settled_on_the_node_that_issued_them(drv: Driver,
                                                         other_broker: Broker) -> None:
    name = f"aff-{drv.mode}-{time.monotonic_ns()}"
    for url in (drv.broker.url, other_broker.url):
        drv.new_client(url).create_topic(name, partitions=1, visibility_timeout_ms=60_000)
    c = drv.new_client([drv.broker.url, other_broker.url])
    for i in range(24):
        c.produce(name, f"m{i}")
    acked: list[bytes] = []
    failed: list[narad.NaradError] = []

    def drain() -> bool:
        for m in c.receive(name, max_messages=5, wait=0.5):
            try:
                c.ack(m)
                acked.append(m.body)
            except narad.NaradError as e:
                failed.append(e)
        return len(acked) + len(failed) >= 24

    wait_for(drain, timeout=120, what="24 messages received and settled")
    assert failed == []
    assert sorted(acked) == sorted(f"m{i}".encode() for i in range(24))


def test_ack_batch_is_split_per_issuing_node(drv: Driver, other_broker: Broker) -> None:
    name = f"split-{drv.mode}-{time.monotonic_ns()}"
    singles = [drv.new_client(url) for url in (drv.broker.url, other_broker.url)]
    got: list[narad.Message] = []
    for i, one in enumerate(singles):
        one.create_topic(name, partitions=1, visibility_timeout_ms=60_000)
        one.produce_batch(name, [f"n{i}-a", f"n{i}-b"])
        want = 2 * (i + 1)
        wait_for(lambda one=one, want=want: got.extend(one.receive(name, max_messages=5,
                                                                    wait=1)) or
                 len(got) >= want, what="leased messages")
    both = drv.new_client([drv.broker.url, other_broker.url])
    results = both.ack_batch(got)
    assert [r.receipt_handle for r in results] == [m.receipt_handle for m in got]
    assert [r.ok for r in results] == [True] * 4, [r.error for r in results]
    for one in singles:
        assert sum(s.backlog for s in one.get_topic(name).partition_stats) == 0


def test_endpoints_of_two_clusters_warn_once(drv: Driver, other_broker: Broker) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        c = drv.new_client([drv.broker.url, other_broker.url])
        c.list_topics()
        wait_for(lambda: c._cluster_verdict is not None, what="the one-cluster check")
        c.list_topics()
    ours = [w for w in seen if issubclass(w.category, narad.ClusterWarning)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    assert "not one cluster" in str(ours[0].message)


def test_one_node_under_two_names_is_one_cluster(drv: Driver) -> None:
    port = urlsplit(drv.broker.url).port
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        c = drv.new_client([drv.broker.url, f"http://localhost:{port}"])
        c.list_topics()
        wait_for(lambda: c._cluster_verdict is not None, what="the one-cluster check")
    assert c._cluster_verdict == ""
    assert not [w for w in seen if issubclass(w.category, narad.ClusterWarning)]


def test_calls_stick_to_the_first_healthy_node(drv: Driver, other_broker: Broker) -> None:
    events: list[narad.Event] = []
    c = drv.new_client([drv.broker.url, other_broker.url], on_event=events.append)
    for _ in range(6):
        c.list_topics()
    used = {e.endpoint for e in events if e.kind == "request"}
    assert used == {drv.broker.url}


@pytest.fixture
def hung_url() -> Iterator[str]:
    """A node that accepts connections (the kernel completes them) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_hung_node_costs_one_attempt_then_the_call_fails_over(drv: Driver,
                                                                hung_url: str) -> None:
    events: list[narad.Event] = []
    c = drv.new_client([hung_url, drv.broker.url], timeout=1.5, on_event=events.append,
                       breaker_cooldown=60)
    t0 = time.monotonic()
    assert isinstance(c.list_topics(), list)  # the attempt on the hung node timed out
    assert time.monotonic() - t0 < 15
    c.list_topics()  # a second timeout opens its breaker
    assert any(e.kind == "breaker_open" and e.endpoint == hung_url for e in events)
    before = len([e for e in events if e.endpoint == hung_url and e.kind == "request"])
    t1 = time.monotonic()
    c.list_topics()
    assert time.monotonic() - t1 < 1.5  # straight to the live node
    assert len([e for e in events if e.endpoint == hung_url and e.kind == "request"]) == before
