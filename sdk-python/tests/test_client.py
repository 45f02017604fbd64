"""Every public method of Client and AsyncClient against the real broker."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import pytest

import narad
from conftest import Driver, wait_for


def test_create_get_list_alter_delete_topic(drv: Driver) -> None:
    c = drv.client
    name = f"admin-{drv.mode}-{int(time.time() * 1000)}"
    info = c.create_topic(name, partitions=2, visibility_timeout_ms=5000, retention_ms=3600_000,
                          max_in_flight_per_partition=10, max_acked_ahead_per_partition=20)
    assert isinstance(info, narad.TopicInfo)
    assert (info.name, info.partitions, info.visibility_timeout_ms) == (name, 2, 5000)
    assert (info.max_in_flight_per_partition, info.max_acked_ahead_per_partition) == (10, 20)
    assert info.replication_factor == 1 and info.incarnation

    got = c.get_topic(name)
    assert [s.partition for s in got.partition_stats] == [0, 1]
    assert all(isinstance(s, narad.PartitionStats) and s.backlog == 0
               for s in got.partition_stats)
    assert name in [t.name for t in c.list_topics()]

    altered = c.alter_topic(name, visibility_timeout_ms=7000, retention_ms=7200_000)
    assert (altered.visibility_timeout_ms, altered.retention_ms) == (7000, 7200_000)
    assert altered.partitions == 2

    with pytest.raises(narad.Conflict) as ei:
        c.create_topic(name)
    assert (ei.value.status, ei.value.code, ei.value.retryable) == (409, "topic_exists", False)
    same = c.ensure_topic(name, partitions=5)  # exists: returned as it is, not altered
    assert (same.name, same.partitions, same.incarnation) == (name, 2, info.incarnation)
    fresh = c.ensure_topic(name + "-e", partitions=3)
    assert fresh.partitions == 3
    c.delete_topic(name + "-e")

    c.delete_topic(name)
    with pytest.raises(narad.NotFound) as nf:
        c.get_topic(name)
    assert nf.value.code == "topic_not_found" and nf.value.status == 404
    again = c.create_topic(name, partitions=1)
    assert again.incarnation != info.incarnation


def test_delete_topic_naming_an_incarnation_deletes_that_one_only(drv: Driver) -> None:
    """DELETE /v1/topics/{t}?incarnation=N: a topic deleted and created again under the
    name since is another incarnation, which a delete naming the old one leaves alone
    (409 incarnation_mismatch, a Conflict); naming the current one deletes it."""
    c = drv.client
    name = drv.topic()
    old = c.get_topic(name).incarnation
    assert isinstance(old, str) and old.isdigit()
    c.delete_topic(name, incarnation=old)  # still that incarnation: deleted
    with pytest.raises(narad.NotFound):
        c.get_topic(name)

    c.create_topic(name, partitions=1)
    first = c.get_topic(name).incarnation
    c.delete_topic(name)
    c.create_topic(name, partitions=1)
    now = c.get_topic(name).incarnation
    assert now != first
    c.produce(name, b"kept")
    with pytest.raises(narad.Conflict) as ei:
        c.delete_topic(name, incarnation=first)
    err = ei.value
    assert (err.status, err.code) == (409, "incarnation_mismatch")
    assert not err.retryable and not err.uncertain
    kept = c.get_topic(name)  # nothing was deleted
    assert kept.incarnation == now
    assert [m.body for m in c.replay(name)] == [b"kept"]

    c.delete_topic(name, incarnation=now)
    with pytest.raises(narad.NotFound):
        c.get_topic(name)
    with pytest.raises(narad.NotFound):  # gone: not found, whatever incarnation is named
        c.delete_topic(name, incarnation=now)


def test_bad_requests_map_to_bad_request(drv: Driver) -> None:
    with pytest.raises(narad.BadRequest) as ei:
        drv.client.create_topic("no spaces allowed")
    assert ei.value.code == "invalid_name" and not ei.value.retryable
    t = drv.topic()
    with pytest.raises(narad.BadRequest) as pe:
        drv.client.alter_topic(t, visibility_timeout_ms=1)
    assert pe.value.status == 400


def test_binary_bodies_round_trip_byte_for_byte(drv: Driver) -> None:
    c = drv.client
    t = drv.topic()
    bodies = [bytes(range(256)), b"", b"\x00", os.urandom(4096), b"{not json", "é".encode(),
              b'{"a": 1}', b"\xff\xfe\x00text"]
    for b in bodies:
        c.produce(t, b)
    c.produce_batch(t, bodies)
    got = []
    wait_for(lambda: got.extend(c.receive(t, max_messages=100, wait=1)) or
             len(got) >= 2 * len(bodies), what="all messages")
    assert sorted(m.body for m in got) == sorted(bodies * 2)
    assert [m.body for m in c.replay(t)] == bodies * 2
    c.ack_batch(got)


def test_produce_kinds_and_placement(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(partitions=3)
    p1 = c.produce(t, "héllo", key="user-1")
    p2 = c.produce(t, {"n": 1, "s": "ü"}, key="user-1")
    p3 = c.produce(t, [1, 2], partition=2)
    p4 = c.produce(t, b"<x/>", content_type="application/xml")
    assert isinstance(p1, narad.Produced) and p1.topic == t
    assert p1.partition == p2.partition and p2.offset == p1.offset + 1
    assert p3.partition == 2
    assert p4.offset >= 0
    by_offset = {(m.partition, m.offset): m for m in c.replay(t)}
    m1 = by_offset[(p1.partition, p1.offset)]
    assert m1.text() == "héllo" and m1.key == "user-1"
    assert by_offset[(p2.partition, p2.offset)].json() == {"n": 1, "s": "ü"}
    assert by_offset[(2, p3.offset)].json() == [1, 2]
    assert by_offset[(p4.partition, p4.offset)].body == b"<x/>"
    assert isinstance(m1.time, datetime) and m1.time.tzinfo is timezone.utc
    with pytest.raises(narad.BadRequest):
        c.produce(t, b"x", partition=9)
    with pytest.raises(narad.NotFound):
        c.produce(f"missing-{drv.mode}", b"x")
    with pytest.raises(narad.TooLarge) as tl:
        c.produce(t, b"x" * (1024 * 1024 + 1))
    assert tl.value.status == 413 and not tl.value.retryable


def test_produce_batch_results_in_order(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(partitions=2)
    out = c.produce_batch(t, [b"a", "b", {"c": 3}, narad.Outgoing(b"d", partition=1),
                              narad.Outgoing("e", key="k")])
    assert len(out) == 5 and all(isinstance(p, narad.Produced) for p in out)
    assert out[3].partition == 1
    with pytest.raises(narad.BadRequest):
        c.produce_batch(t, [b"ok", narad.Outgoing(b"bad", partition=7)])
    # Refused whole: nothing of the bad batch was written.
    assert len(list(c.replay(t))) == 5
    with pytest.raises(narad.BadRequest):
        c.produce_batch(t, [])


def test_receive_ack_nack_extend(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(visibility_timeout_ms=30_000)
    assert c.receive(t, wait=0) == []  # an empty poll is an empty result
    c.produce(t, b"one")
    [m] = c.receive(t, wait=5)
    assert m.body == b"one" and m.receipt_handle and m.delivery_attempt == 1
    c.extend(m)
    c.extend(m, 60)
    c.nack(m)  # handed back at once, handle spent
    with pytest.raises(narad.LeaseLost) as ll:
        c.ack(m)
    assert ll.value.status == 410 and ll.value.code == "lease_lost"
    [again] = c.receive(t, wait=5)
    assert again.offset == m.offset and again.delivery_attempt == 2
    c.nack(again, delay=0.6)  # visible again only after the delay
    t0 = time.monotonic()
    [third] = wait_for(lambda: c.receive(t, wait=2), what="redelivery after delay")
    assert time.monotonic() - t0 >= 0.3
    assert third.delivery_attempt == 3
    c.ack(third)
    assert c.receive(t, wait=0) == []
    # A bare handle needs its topic.
    c.produce(t, b"two")
    [m2] = c.receive(t, wait=5)
    c.ack(m2.receipt_handle, topic=t)
    with pytest.raises(narad.BadRequest):
        c.ack(narad.Message(t, 0, 0, b"", 0))  # a replayed message holds no lease
    with pytest.raises(narad.BadRequest) as bad:
        c.ack("garbage", topic=t)
    assert bad.value.code == "invalid_receipt_handle"


def test_receive_many_and_ack_batch_results(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(partitions=2)
    c.produce_batch(t, [str(i) for i in range(6)])
    got: list[narad.Message] = []
    wait_for(lambda: got.extend(c.receive(t, max_messages=10, wait=1)) or len(got) == 6,
             what="six messages")
    res = c.ack_batch(got[:3])
    assert [r.ok for r in res] == [True] * 3 and all(isinstance(r, narad.AckResult)
                                                     for r in res)
    again = c.ack_batch(got[:4])
    assert [r.ok for r in again] == [False, False, False, True]
    assert isinstance(again[0].error, narad.LeaseLost)
    c.ack_batch(got[4:])
    assert c.ack_batch([]) == []


def test_messages_iterator(drv: Driver) -> None:
    c = drv.client
    t = drv.topic()
    c.produce_batch(t, [b"m1", b"m2", b"m3"])
    seen = []
    for m in c.messages(t, wait=2, batch=2):
        seen.append(m.body)
        c.ack(m)
        if len(seen) == 3:
            break
    assert sorted(seen) == [b"m1", b"m2", b"m3"]


def test_replay_bounded_resumable_by_time_and_following(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(partitions=2)
    c.produce_batch(t, [narad.Outgoing(f"a{i}", partition=i % 2) for i in range(10)])
    r = c.replay(t, batch=3)
    first = [next(r) for _ in range(4)]
    pos = r.position
    assert isinstance(pos, narad.Position)
    rest = list(c.replay(t, narad.Position.loads(pos.dumps())))
    everything = list(c.replay(t))
    assert len(everything) == 10
    assert sorted(m.body for m in first + rest) == sorted(m.body for m in everything)
    for p in (0, 1):
        offs = [m.offset for m in everything if m.partition == p]
        assert offs == sorted(offs)  # log order per partition

    only1 = list(c.replay(t, partitions=[1]))
    assert {m.partition for m in only1} == {1} and len(only1) == 5
    start = narad.Position.at_offsets({0: 3})
    assert [m.offset for m in c.replay(t, start, partitions=[0])] == [3, 4]

    mid = max(m.timestamp for m in everything) + 1  # partitions stamp their own appends
    time.sleep(0.01)
    c.produce(t, b"later", partition=0)
    by_time = list(c.replay(t, narad.Position.at_time(mid)))
    assert [m.body for m in by_time] == [b"later"]
    assert list(c.replay(t, narad.Position.at_time(datetime.now(timezone.utc).replace(
        year=2000)))) != []

    follow = c.replay(t, r.position, follow=True, poll_interval=0.05)
    got = [next(follow) for _ in range(len(rest) + 1)]
    c.produce(t, b"new", partition=1)
    nxt = next(follow)
    assert nxt.body == b"new"
    assert len(got) == len(rest) + 1


def test_publisher_batches_with_a_result_per_message(drv: Driver) -> None:
    c = drv.client
    t = drv.topic(partitions=2)
    with c.publisher(t, max_batch=7, linger=0.05) as pub:
        futs = [pub.publish(f"m{i}", key=f"k{i % 3}") for i in range(20)]
        bad = pub.publish(b"x", partition=9)
        pinned = pub.publish(b"p", partition=1)
        pub.flush()
        results = [f.result(30) for f in futs]
    assert all(isinstance(r, narad.Produced) for r in results)
    assert len({(r.partition, r.offset) for r in results}) == 20
    assert isinstance(bad.exception(30), narad.BadRequest)  # its own error, others fine
    assert pinned.result(30).partition == 1
    assert len(list(c.replay(t))) == 21
    with pytest.raises(narad.Closed):
        pub.publish(b"late")
    pub.close()  # twice is harmless


def test_publisher_bounded_buffer(drv: Driver) -> None:
    c = drv.client
    t = drv.topic()
    pub = c.publisher(t, max_buffered=2, linger=5.0, block=False, max_batch=100)
    pub.publish(b"1")
    pub.publish(b"2")
    with pytest.raises(narad.BufferFull) as bf:
        pub.publish(b"3")
    assert bf.value.retryable
    pub.flush()
    pub.publish(b"3")
    pub.close()
    assert [m.body for m in c.replay(t)] == [b"1", b"2", b"3"]
    blocking = c.publisher(t, max_buffered=1, linger=5.0)
    blocking.publish(b"4")
    with pytest.raises(narad.BufferFull):
        blocking.publish(b"5", timeout=0.2)
    blocking.close()


def test_children_helpers(drv: Driver) -> None:
    """Fan-out and delay children, against whichever broker the suite runs.

    A broker without children answers 501 not_implemented to every children route; the
    helpers must surface that as a NaradError that is neither retryable nor uncertain.
    A broker with them (main since the fan-out commits) gets the helpers checked
    against the spec: copies, delay, lag and detach.
    """
    c = drv.client
    parent = drv.topic()
    child = drv.topic()
    try:
        attached = c.attach_child(parent, child, delay=0)
    except narad.NaradError as e:
        assert e.status == 501 and e.code == "not_implemented"
        assert not e.retryable and not e.uncertain
        calls = [
            lambda: c.list_children(parent),
            lambda: c.detach_child(parent, child),
            lambda: c.create_delay_child(parent, parent + "-delayed", 30),
            lambda: c.create_topic(parent + "-kid", parent=parent),
        ]
        for call in calls:
            with pytest.raises(narad.NaradError) as ei:
                call()
            assert ei.value.status == 501 and ei.value.code == "not_implemented"
            assert not ei.value.retryable and not ei.value.uncertain
        return
    assert isinstance(attached, narad.Child) and attached.child == child
    assert attached.state == "running" and attached.paused_reason is None
    delayed = c.create_delay_child(parent, parent + "-delayed", 0.8, partitions=1)
    assert delayed.parent == parent and delayed.fanout_delay_ms == 800
    t0 = time.monotonic()
    c.produce(parent, b"\x00copied")
    wait_for(lambda: [m.body for m in c.replay(child)] == [b"\x00copied"], what="fan-out copy")
    [late] = wait_for(lambda: c.receive(parent + "-delayed", wait=2), what="delayed copy")
    assert late.body == b"\x00copied" and time.monotonic() - t0 >= 0.7
    c.ack(late)
    kids = {k.child: k for k in c.list_children(parent)}
    assert set(kids) == {child, parent + "-delayed"}
    assert all(isinstance(x, narad.ChildLag) for x in kids[child].lag)
    c.detach_child(parent, child)
    assert child not in [k.child for k in c.list_children(parent)]


def test_ready_and_closed(drv: Driver) -> None:
    c = drv.new_client()
    assert c.ready()
    assert c.endpoints == [drv.broker.url]
    c.close()
    c.close()  # twice is harmless
    with pytest.raises(narad.Closed):
        c.produce("x", b"y")
    dead = drv.new_client("127.0.0.1:1", attempts=1)
    assert dead.ready() is False
