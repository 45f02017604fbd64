"""Conformance driver of the Python SDK's asyncio client (``narad.AsyncClient``).

The same protocol as driver.py, but every command runs as a task on one event loop
through the AsyncClient, its AsyncPublisher, AsyncConsumer and AsyncReplay, so the
suite holds the async client to the same rules as the blocking one (docs/sdk/contract.md: keep sync
and async from drifting). stdin is read on a thread and handed to the loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

import narad

import driver as common
from driver import Panic, Unsupported, body_of, event, msg_view, norm_err, pick, secs, topic_view, write

clients: dict[str, narad.AsyncClient] = {}
allow_dup: dict[str, bool] = {}
consumers: dict[str, dict[str, Any]] = {}
publishers: dict[str, dict[str, Any]] = {}


def client(a: dict[str, Any]) -> narad.AsyncClient:
    name = a.get("client") or "default"
    c = clients.get(name)
    if c is None:
        raise ValueError(f"no client {name!r}")
    return c


def dup(a: dict[str, Any]) -> bool:
    if a.get("allow_duplicates") is not None:
        return bool(a["allow_duplicates"])
    return allow_dup.get(a.get("client") or "default", True)


def new_client(a: dict[str, Any]) -> dict[str, Any]:
    name = a.get("client") or "default"
    kw: dict[str, Any] = {}
    if a.get("auth"):
        kw["auth"] = (a["auth"]["username"], a["auth"]["password"])
    if a.get("attempts"):
        kw["attempts"] = int(a["attempts"])
    if a.get("min_backoff_ms") is not None:
        kw["backoff_min"] = secs(a["min_backoff_ms"])
    if a.get("max_backoff_ms") is not None:
        kw["backoff_max"] = secs(a["max_backoff_ms"])
    if a.get("timeout_ms") is not None:
        kw["timeout"] = secs(a["timeout_ms"])
    clients[name] = narad.AsyncClient(list(a["endpoints"]),
                                      on_event=lambda e: common.on_event(name, e), **kw)
    allow_dup[name] = a.get("allow_duplicates") is not False
    return {}


async def start_consumer(a: dict[str, Any]) -> dict[str, Any]:
    c = client(a)
    cname = a.get("consumer") or "c"
    topic = a["topic"]
    script = a.get("script") or {}
    st: dict[str, Any] = {"stopping": False, "consumer": None, "error": None}

    async def handler(m: narad.Message) -> None:
        d = narad.current_delivery()
        view = msg_view(m, False)
        event("started", {"consumer": cname, "message": view})
        act = pick(script, m)
        t0 = time.monotonic()
        do = act.get("do", "ok")

        def report(outcome: str, cancelled: bool) -> None:
            reason = None
            if cancelled:
                reason = "lease_lost" if (d is not None and d.lost) else "shutdown"
            event("handled", {"consumer": cname, "message": view, "outcome": outcome,
                              "cancelled": cancelled, "cancel_reason": reason,
                              "elapsed_ms": int((time.monotonic() - t0) * 1000)})

        if do == "fail":
            report("fail", False)
            raise RuntimeError("scripted failure")
        if do == "panic":
            report("panic", False)
            raise Panic("scripted panic")
        if do == "sleep":
            cancelled = False
            try:
                await asyncio.sleep(secs(act.get("ms", 0)))
            except asyncio.CancelledError:
                # Cancelled (lease lost, or the grace ended): return success anyway,
                # as DRIVER.md says; the consumer must not ack it.
                cancelled = True
            outcome = act.get("then") or "ok"
            report(outcome, cancelled)
            if outcome == "fail":
                raise RuntimeError("scripted failure")
            return
        report("ok", False)

    kw: dict[str, Any] = {}
    if a.get("concurrency"):
        kw["concurrency"] = int(a["concurrency"])
    if a.get("wait_ms") is not None:
        kw["wait"] = secs(a["wait_ms"])
    if a.get("nack_delay_ms") is not None:
        kw["nack_delay"] = secs(a["nack_delay_ms"])
    if a.get("max_lease_ms") is not None:
        kw["max_lease"] = secs(a["max_lease_ms"])
    if a.get("grace_ms") is not None:
        kw["grace"] = secs(a["grace_ms"])
    if a.get("renew") is False:
        kw["renew"] = False
    if a.get("max_deliveries"):
        kw["max_deliveries"] = int(a["max_deliveries"])
    if a.get("dead_letter_topic") is not None:
        kw["dead_letter_topic"] = str(a["dead_letter_topic"])
    consumers[cname] = st
    with common._state:
        common.by_topic[(a.get("client") or "default", topic)] = cname
    try:
        cons = await c.consume(topic, handler, **kw)
    except narad.NaradError as e:
        st["error"] = e
        event("stopped", {"consumer": cname, "error": norm_err(e)})
        return {"started": False}
    st["consumer"] = cons

    async def watch() -> None:
        err: BaseException | None = None
        try:
            await cons.wait()
        except BaseException as e:  # the terminal error that stopped it
            err = e
        st["error"] = err
        if not st["stopping"]:
            event("stopped", {"consumer": cname, "error": None if err is None else norm_err(err)})

    st["watch"] = asyncio.get_running_loop().create_task(watch())
    return {"started": True}


async def stop_consumer(a: dict[str, Any]) -> dict[str, Any]:
    cname = a.get("consumer") or "c"
    st = consumers.get(cname)
    if st is None:
        raise ValueError(f"no consumer {cname!r}")
    st["stopping"] = True
    cons = st["consumer"]
    if cons is not None:
        if a.get("grace_ms") is not None:
            await cons.close(grace=secs(a["grace_ms"]))
        else:
            await cons.close()
    err = st["error"] or (cons.error if cons is not None else None)
    return {"error": None if err is None else norm_err(err)}


async def publisher_cmd(cmd: str, a: dict[str, Any]) -> dict[str, Any]:
    pname = a.get("publisher") or "p"
    if cmd == "publisher.new":
        kw: dict[str, Any] = {}
        if a.get("linger_ms") is not None:
            kw["linger"] = secs(a["linger_ms"])
        if a.get("max_batch"):
            kw["max_batch"] = int(a["max_batch"])
        if a.get("max_buffered"):
            kw["max_buffered"] = int(a["max_buffered"])
        if a.get("block") is False:
            kw["block"] = False
        publishers[pname] = {"p": client(a).publisher(a["topic"], **kw), "n": 0}
        return {}
    ps = publishers.get(pname)
    if ps is None:
        raise ValueError(f"no publisher {pname!r}")
    p = ps["p"]
    if cmd == "publisher.publish":
        body, _ = body_of(a["body"])
        fut = await p.publish(body, key=a.get("key"))
        ps["n"] += 1
        ticket = f"{pname}-{ps['n']}"

        def done(f: Any) -> None:
            data: dict[str, Any] = {"publisher": pname, "ticket": ticket}
            exc = f.exception()
            if exc is None:
                r = f.result()
                data.update(ok=True, partition=r.partition, offset=r.offset)
            else:
                data.update(ok=False, error=norm_err(exc))
            event("published", data)

        fut.add_done_callback(done)
        return {"ticket": ticket}
    if cmd == "publisher.flush":
        await p.flush()
    else:
        await p.close()
    return {}


async def replay(a: dict[str, Any]) -> dict[str, Any]:
    c = client(a)
    frm = a.get("from") or {}
    start = narad.Position()
    if frm.get("time_ms") is not None:
        start = narad.Position.at_time(int(frm["time_ms"]))
    if frm.get("offsets"):
        start = narad.Position(offsets=tuple(sorted((int(k), int(v)) for k, v in frm["offsets"].items())),
                               time_ms=start.time_ms)
    if frm.get("incarnation") is not None:
        start = start.with_incarnation(str(frm["incarnation"]))
    if a.get("saved") is not None:
        # A position some SDK saved: the library reads it, as a service resuming would.
        start = narad.Position.loads(a["saved"])
    parts = [int(a["partition"])] if a.get("partition") is not None else None
    r = c.replay(a["topic"], start, partitions=parts)
    out = []
    limit = int(a.get("limit") or 0)
    async for m in r:
        out.append(msg_view(m, False))
        if limit and len(out) >= limit:
            break
    v: dict[str, Any] = {"offsets": {str(p): o for p, o in r.position.offsets}}
    if r.position.incarnation is not None:
        v["incarnation"] = r.position.incarnation
    return {"messages": out, "position": v, "saved": r.position.dumps()}


async def handle(cmd: str, a: dict[str, Any]) -> Any:
    if cmd == "hello":
        return {"name": "narad-python-async", "version": narad.__version__, "language": "python",
                "capabilities": common.CAPABILITIES}
    if cmd == "client.new":
        return new_client(a)
    if cmd == "close":
        await client(a).close()
        return {}
    if cmd == "produce":
        body, ctype = body_of(a["body"])
        p = await client(a).produce(a["topic"], body, key=a.get("key"), partition=a.get("partition"),
                                    content_type=ctype, allow_duplicates=dup(a))
        return {"topic": p.topic, "partition": p.partition, "offset": p.offset}
    if cmd == "produce_batch":
        items = [narad.Outgoing(body_of(m["body"])[0], key=m.get("key"), partition=m.get("partition"))
                 for m in a["messages"]]
        try:
            res = await client(a).produce_batch(a["topic"], items, allow_duplicates=dup(a))
        except narad.NaradError as e:
            return {"results": [{"ok": False, "error": norm_err(e)} for _ in items]}
        return {"results": [{"ok": True, "partition": r.partition, "offset": r.offset} for r in res]}
    if cmd.startswith("publisher."):
        return await publisher_cmd(cmd, a)
    if cmd == "receive":
        kw: dict[str, Any] = {"max_messages": int(a.get("max") or 1)}
        if a.get("wait_ms") is not None:
            kw["wait"] = secs(a["wait_ms"])
        got = await client(a).receive(a["topic"], **kw)
        return {"messages": [msg_view(m, True) for m in got]}
    if cmd in ("ack", "nack", "extend"):
        with common._state:
            m = common.messages.get(a["msg"])
        if m is None:
            raise ValueError(f"no message {a['msg']!r}")
        c = client(a)
        if cmd == "ack":
            await c.ack(m)
        elif cmd == "nack":
            await c.nack(m, secs(a.get("delay_ms") or 0))
        else:
            await c.extend(m, None if a.get("lease_ms") is None else secs(a["lease_ms"]))
        return {}
    if cmd == "consume.start":
        return await start_consumer(a)
    if cmd == "consume.stop":
        return await stop_consumer(a)
    if cmd == "replay":
        return await replay(a)
    if cmd == "topic.create":
        t = await client(a).create_topic(a["name"], partitions=a.get("partitions"),
                                         visibility_timeout_ms=a.get("visibility_timeout_ms"),
                                         retention_ms=a.get("retention_ms"), parent=a.get("parent"),
                                         fanout_delay_ms=a.get("fanout_delay_ms"))
        return topic_view(t)
    if cmd == "topic.get":
        return topic_view(await client(a).get_topic(a["name"]))
    if cmd == "topic.delete":
        await client(a).delete_topic(a["name"])
        return {}
    if cmd == "topic.attach_child":
        delay = None if a.get("delay_ms") is None else secs(a["delay_ms"])
        ch = await client(a).attach_child(a["parent"], a["child"], delay=delay)
        return {"child": ch.child, "fanout_delay_ms": ch.fanout_delay_ms}
    if cmd == "topic.children":
        return {"children": [{"child": ch.child, "fanout_delay_ms": ch.fanout_delay_ms}
                             for ch in await client(a).list_children(a["parent"])]}
    raise Unsupported(f"unsupported command {cmd}")


async def run(req: dict[str, Any]) -> None:
    rid = req.get("id")
    try:
        res = await handle(req.get("cmd", ""), req.get("args") or {})
        write({"id": rid, "ok": True, "result": res if res is not None else {}})
    except BaseException as e:  # every failure is an answer, never a dead driver
        write({"id": rid, "ok": False, "error": norm_err(e)})


async def main() -> None:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    tasks: set[asyncio.Task[None]] = set()
    while True:
        line = await lines.get()
        if line is None:
            break
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if req.get("cmd") == "exit":
            write({"id": req.get("id"), "ok": True, "result": {}})
            break
        t = loop.create_task(run(req))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())
