"""Conformance driver of the Python SDK (the blocking ``narad.Client``).

Reads DRIVER.md commands as JSON Lines on stdin, runs each on its own thread through
the SDK's public API, and writes responses and events as JSON Lines on stdout. Run it
with the interpreter of a virtualenv that has the SDK installed (sdk-python/.venv).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from typing import Any

import narad

CAPABILITIES = [
    "produce", "produce_batch", "publisher", "publisher.nonblocking", "receive", "ack", "nack",
    "extend", "consume", "consume.panic", "consume.dead_letter", "replay", "replay.time", "replay.saved", "topics",
    "children", "close",
]

_out = threading.Lock()
_state = threading.Lock()
clients: dict[str, narad.Client] = {}
allow_dup: dict[str, bool] = {}
messages: dict[str, narad.Message] = {}
consumers: dict[str, dict[str, Any]] = {}
by_topic: dict[tuple[str, str], str] = {}
publishers: dict[str, dict[str, Any]] = {}
counter = [0]


class Panic(BaseException):
    """Panic is the closest thing Python has to a Go panic: not an Exception at all."""


class Unsupported(Exception):
    """Unsupported is a command this driver does not know."""


def write(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def event(name: str, data: dict[str, Any]) -> None:
    write({"event": name, "data": data})


KINDS: list[tuple[type[BaseException], str]] = [
    (narad.BufferFull, "BufferFull"), (narad.BadRequest, "BadRequest"),
    (narad.Unauthenticated, "Unauthenticated"), (narad.Forbidden, "Forbidden"),
    (narad.NotFound, "NotFound"), (narad.Conflict, "Conflict"), (narad.TooLarge, "TooLarge"),
    (narad.LeaseLost, "LeaseLost"), (narad.Throttled, "Throttled"), (narad.Timeout, "Timeout"),
    (narad.Unavailable, "Unavailable"), (narad.Closed, "Closed"),
]


def norm_err(e: BaseException) -> dict[str, Any]:
    if isinstance(e, Unsupported):
        return {"kind": "Unsupported", "message": str(e), "retryable": False, "uncertain": False,
                "code": None, "status": None}
    if not isinstance(e, narad.NaradError):
        return {"kind": "Other", "message": repr(e), "retryable": False, "uncertain": False,
                "code": None, "status": None}
    kind = "Other"
    for cls, name in KINDS:
        if isinstance(e, cls):
            kind = name
            break
    else:
        if e.status == 501:
            kind = "NotImplemented"
        elif e.status is not None and e.status >= 500:
            kind = "Internal"
    out: dict[str, Any] = {"kind": kind, "message": str(e), "retryable": e.retryable,
                           "uncertain": e.uncertain, "code": e.code or None, "status": e.status}
    if e.retry_after is not None:
        out["retry_after_ms"] = int(e.retry_after * 1000)
    return out


def body_of(b: dict[str, Any], for_batch: bool = False) -> tuple[Any, str | None]:
    """body_of returns the SDK-native body and, when needed, the content type to force."""
    if "b64" in b:
        return base64.b64decode(b["b64"]), None
    if "text" in b:
        return str(b["text"]), None
    if "json" in b:
        v = b["json"]
        if isinstance(v, str):
            # A JSON document that is one string: a str would be sent as text.
            return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode(), "application/json"
        return v, None
    raise ValueError("a body is {b64}, {text} or {json}")


def msg_view(m: narad.Message, keep: bool) -> dict[str, Any]:
    v: dict[str, Any] = {"topic": m.topic, "partition": m.partition, "offset": m.offset,
                         "key": m.key, "body_b64": base64.b64encode(m.body).decode(),
                         "delivery_attempt": m.delivery_attempt,
                         "has_lease": m.receipt_handle is not None,
                         "receipt_handle": m.receipt_handle}
    if keep:
        with _state:
            counter[0] += 1
            mid = f"m{counter[0]}"
            messages[mid] = m
        v["id"] = mid
    return v


def client(a: dict[str, Any]) -> narad.Client:
    name = a.get("client") or "default"
    with _state:
        c = clients.get(name)
    if c is None:
        raise ValueError(f"no client {name!r}")
    return c


def dup(a: dict[str, Any]) -> bool:
    if a.get("allow_duplicates") is not None:
        return bool(a["allow_duplicates"])
    return allow_dup.get(a.get("client") or "default", True)


def secs(ms: Any) -> float:
    return float(ms) / 1000.0


def on_event(client_name: str, e: narad.Event) -> None:
    with _state:
        cname = by_topic.get((client_name, e.topic or ""))
    if cname is None:
        return
    m = e.message
    where: dict[str, Any] = {}
    if m is not None:
        where = {"partition": m.partition, "offset": m.offset,
                 "message": {"topic": m.topic, "partition": m.partition, "offset": m.offset,
                             "delivery_attempt": m.delivery_attempt}}
    if e.kind == "ack":
        data = {"consumer": cname, "outcome": e.outcome, **where}
        if e.error is not None:
            data["error"] = norm_err(e.error)
        event("settled", data)
    elif e.kind == "lease_lost":
        event("lease_lost", {"consumer": cname, **where})
        event("settled", {"consumer": cname, "outcome": "lost", **where})
    elif e.kind == "poll_error" and e.error is not None:
        event("error", {"consumer": cname, "error": norm_err(e.error),
                        "terminal": e.outcome == "terminal"})


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
    c = narad.Client(list(a["endpoints"]), on_event=lambda e: on_event(name, e), **kw)
    with _state:
        clients[name] = c
        allow_dup[name] = a.get("allow_duplicates") is not False
    return {}


def pick(script: dict[str, Any], m: narad.Message) -> dict[str, Any]:
    for r in script.get("rules") or []:
        if r.get("body_text") is not None and r["body_text"].encode() != m.body:
            continue
        if r.get("attempt") is not None and r["attempt"] != m.delivery_attempt:
            continue
        return r
    return script.get("default") or {"do": "ok"}


def start_consumer(a: dict[str, Any]) -> dict[str, Any]:
    c = client(a)
    cname = a.get("consumer") or "c"
    topic = a["topic"]
    script = a.get("script") or {}
    st: dict[str, Any] = {"stopping": False, "consumer": None, "error": None}

    def handler(m: narad.Message) -> None:
        d = narad.current_delivery()
        view = msg_view(m, False)
        event("started", {"consumer": cname, "message": view})
        act = pick(script, m)
        t0 = time.monotonic()
        do = act.get("do", "ok")
        outcome, cancelled = do, False

        def report() -> None:
            reason = None
            if cancelled:
                reason = "lease_lost" if (d is not None and d.lost) else "shutdown"
            event("handled", {"consumer": cname, "message": view, "outcome": outcome,
                              "cancelled": cancelled, "cancel_reason": reason,
                              "elapsed_ms": int((time.monotonic() - t0) * 1000)})

        if do == "fail":
            report()
            raise RuntimeError("scripted failure")
        if do == "panic":
            report()
            raise Panic("scripted panic")
        if do == "sleep":
            s = secs(act.get("ms", 0))
            if act.get("ignore_cancel") or d is None:
                time.sleep(s)
                cancelled = d is not None and d.cancelled.is_set()
            else:
                cancelled = d.cancelled.wait(s)
            outcome = act.get("then") or "ok"
            report()
            if outcome == "fail":
                raise RuntimeError("scripted failure")
            return
        outcome = "ok"
        report()

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
    with _state:
        consumers[cname] = st
        by_topic[(a.get("client") or "default", topic)] = cname
    try:
        cons = c.consume(topic, handler, **kw)
    except narad.NaradError as e:
        st["error"] = e
        event("stopped", {"consumer": cname, "error": norm_err(e)})
        return {"started": False}
    st["consumer"] = cons

    def watch() -> None:
        err: BaseException | None = None
        try:
            cons.wait()
        except BaseException as e:  # the terminal error that stopped it
            err = e
        st["error"] = err
        if not st["stopping"]:
            event("stopped", {"consumer": cname, "error": None if err is None else norm_err(err)})

    threading.Thread(target=watch, daemon=True).start()
    return {"started": True}


def stop_consumer(a: dict[str, Any]) -> dict[str, Any]:
    cname = a.get("consumer") or "c"
    with _state:
        st = consumers.get(cname)
    if st is None:
        raise ValueError(f"no consumer {cname!r}")
    st["stopping"] = True
    cons = st["consumer"]
    if cons is not None:
        if a.get("grace_ms") is not None:
            cons.close(grace=secs(a["grace_ms"]))
        else:
            cons.close()
    err = st["error"] or (cons.error if cons is not None else None)
    return {"error": None if err is None else norm_err(err)}


def publisher_cmd(cmd: str, a: dict[str, Any]) -> dict[str, Any]:
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
        p = client(a).publisher(a["topic"], **kw)
        with _state:
            publishers[pname] = {"p": p, "n": 0}
        return {}
    with _state:
        ps = publishers.get(pname)
    if ps is None:
        raise ValueError(f"no publisher {pname!r}")
    p = ps["p"]
    if cmd == "publisher.publish":
        body, ctype = body_of(a["body"])
        if ctype is not None:
            body = body if isinstance(body, bytes) else str(body).encode()
        fut = p.publish(body, key=a.get("key"))
        with _state:
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
        p.flush()
        return {}
    p.close()
    return {}


def replay(a: dict[str, Any]) -> dict[str, Any]:
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
    if a.get("saved") is not None:
        # A position some SDK saved: the library reads it, as a service resuming would.
        start = narad.Position.loads(a["saved"])
    parts = [int(a["partition"])] if a.get("partition") is not None else None
    r = c.replay(a["topic"], start, partitions=parts)
    out = []
    limit = int(a.get("limit") or 0)
    for m in r:
        out.append(msg_view(m, False))
        if limit and len(out) >= limit:
            break
    pos = r.position
    return {"messages": out, "position": position_view(pos), "saved": pos.dumps()}


def position_view(pos: narad.Position) -> dict[str, Any]:
    """position_view is a replay position as the runner reads it."""
    v: dict[str, Any] = {"offsets": {str(p): o for p, o in pos.offsets}}
    if pos.incarnation is not None:
        v["incarnation"] = pos.incarnation
    return v


def topic_view(t: narad.TopicInfo) -> dict[str, Any]:
    v: dict[str, Any] = {"name": t.name, "partitions": t.partitions,
                         "visibility_timeout_ms": t.visibility_timeout_ms, "parent": t.parent,
                         "fanout_delay_ms": t.fanout_delay_ms or 0}
    if t.partition_stats:
        v["partition_stats"] = [{"partition": s.partition, "next_offset": s.next_offset,
                                 "backlog": s.backlog, "in_flight": s.in_flight}
                                for s in t.partition_stats]
    return v


def handle(cmd: str, a: dict[str, Any]) -> Any:
    if cmd == "hello":
        return {"name": "narad-python", "version": narad.__version__, "language": "python",
                "capabilities": CAPABILITIES}
    if cmd == "client.new":
        return new_client(a)
    if cmd == "close":
        client(a).close()
        return {}
    if cmd == "produce":
        body, ctype = body_of(a["body"])
        p = client(a).produce(a["topic"], body, key=a.get("key"), partition=a.get("partition"),
                              content_type=ctype, allow_duplicates=dup(a))
        return {"topic": p.topic, "partition": p.partition, "offset": p.offset}
    if cmd == "produce_batch":
        items = []
        for m in a["messages"]:
            body, ctype = body_of(m["body"])
            items.append(narad.Outgoing(body, key=m.get("key"), partition=m.get("partition")))
        try:
            res = client(a).produce_batch(a["topic"], items, allow_duplicates=dup(a))
        except narad.NaradError as e:
            # One request, all or nothing: every item shares the batch's fate.
            return {"results": [{"ok": False, "error": norm_err(e)} for _ in items]}
        return {"results": [{"ok": True, "partition": r.partition, "offset": r.offset} for r in res]}
    if cmd.startswith("publisher."):
        return publisher_cmd(cmd, a)
    if cmd == "receive":
        kw: dict[str, Any] = {"max_messages": int(a.get("max") or 1)}
        if a.get("wait_ms") is not None:
            kw["wait"] = secs(a["wait_ms"])
        got = client(a).receive(a["topic"], **kw)
        return {"messages": [msg_view(m, True) for m in got]}
    if cmd in ("ack", "nack", "extend"):
        with _state:
            m = messages.get(a["msg"])
        if m is None:
            raise ValueError(f"no message {a['msg']!r}")
        c = client(a)
        if cmd == "ack":
            c.ack(m)
        elif cmd == "nack":
            c.nack(m, secs(a.get("delay_ms") or 0))
        else:
            c.extend(m, None if a.get("lease_ms") is None else secs(a["lease_ms"]))
        return {}
    if cmd == "consume.start":
        return start_consumer(a)
    if cmd == "consume.stop":
        return stop_consumer(a)
    if cmd == "replay":
        return replay(a)
    if cmd == "topic.create":
        t = client(a).create_topic(a["name"], partitions=a.get("partitions"),
                                   visibility_timeout_ms=a.get("visibility_timeout_ms"),
                                   retention_ms=a.get("retention_ms"), parent=a.get("parent"),
                                   fanout_delay_ms=a.get("fanout_delay_ms"))
        return topic_view(t)
    if cmd == "topic.get":
        return topic_view(client(a).get_topic(a["name"]))
    if cmd == "topic.delete":
        client(a).delete_topic(a["name"])
        return {}
    if cmd == "topic.attach_child":
        delay = None if a.get("delay_ms") is None else secs(a["delay_ms"])
        ch = client(a).attach_child(a["parent"], a["child"], delay=delay)
        return {"child": ch.child, "fanout_delay_ms": ch.fanout_delay_ms}
    if cmd == "topic.children":
        return {"children": [{"child": ch.child, "fanout_delay_ms": ch.fanout_delay_ms}
                             for ch in client(a).list_children(a["parent"])]}
    raise Unsupported(f"unsupported command {cmd}")


def run(req: dict[str, Any]) -> None:
    rid = req.get("id")
    try:
        res = handle(req.get("cmd", ""), req.get("args") or {})
        write({"id": rid, "ok": True, "result": res if res is not None else {}})
    except BaseException as e:  # every failure is an answer, never a dead driver
        write({"id": rid, "ok": False, "error": norm_err(e)})


def main() -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if req.get("cmd") == "exit":
            write({"id": req.get("id"), "ok": True, "result": {}})
            break
        threading.Thread(target=run, args=(req,), daemon=True).start()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
