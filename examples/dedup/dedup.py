"""Deduplication in the consumer: an idempotency key makes duplicates harmless.

Narad delivers at least once. A message can arrive twice when a producer retried after
losing a reply (the broker had stored it; the retry stores it again), or when a consumer
did the work but crashed before its ack reached the broker. Both happen here on purpose:
every --duplicate-every'th deposit is produced twice, and every --crash-every'th one
"crashes" after its work is committed but before the ack, so it comes back.

Each deposit travels in the SDK's envelope (narad.envelope/1), whose id is made once by
the producer and survives every retry: that id is the idempotency key. The consumer
records it in a SQLite table **in the same transaction** as the work itself (adding the
deposit to the balance). A second delivery finds the key, skips the work and acks. So
the balance is right however many times a message arrives, while a naive consumer
without the check counts some deposits twice.

    python dedup.py                    # 50 deposits into dedup.db
    python dedup.py --messages 500 --db /tmp/deposits.db
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import threading
import time
import uuid

import narad

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (          -- the seen set: one row per envelope id
    id          TEXT PRIMARY KEY,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    "offset"    INTEGER NOT NULL,
    at          REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS balances (           -- the work: what the deposits add up to
    account     TEXT PRIMARY KEY,
    cents       INTEGER NOT NULL
);
"""


class SimulatedCrash(Exception):
    """SimulatedCrash stands for a process dying after its commit, before its ack."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic", default="deposits", help="the topic (created when missing)")
    p.add_argument("--messages", type=int, default=50, help="distinct deposits to produce")
    p.add_argument("--duplicate-every", type=int, default=5,
                   help="produce every Nth deposit twice, as a retried produce would (0: none)")
    p.add_argument("--crash-every", type=int, default=7,
                   help="every Nth deposit 'crashes' after its commit, before its ack (0: none)")
    p.add_argument("--db", default="dedup.db", help="the SQLite file holding the seen set")
    p.add_argument("--workers", type=int, default=4, help="messages handled at once")
    p.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    url = os.environ.get("NARAD_URL", "http://127.0.0.1:7942")
    auth = (os.environ["NARAD_USER"], os.environ.get("NARAD_PASSWORD", "")) \
        if os.environ.get("NARAD_USER") else None

    setup = sqlite3.connect(args.db)
    setup.executescript(SCHEMA)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.close()

    # One connection per worker thread; isolation_level=None lets us write BEGIN ourselves.
    local = threading.local()

    def db() -> sqlite3.Connection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(args.db, timeout=30, isolation_level=None)
            local.conn = conn
        return conn

    run = uuid.uuid4().hex[:12]
    account = f"account-{run}"  # a fresh account per run, so runs never mix
    amounts = [100 * i for i in range(1, args.messages + 1)]
    duplicates = args.messages // args.duplicate_every if args.duplicate_every else 0
    crashes = args.messages // args.crash_every if args.crash_every else 0
    expected_deliveries = args.messages + duplicates + crashes

    lock = threading.Lock()
    counts = {"deliveries": 0, "applied": 0, "skipped": 0, "crashed": 0, "naive": 0}
    all_delivered = threading.Event()

    def check_done() -> None:
        # Every deposit applied and every expected redelivery seen (more can come, e.g.
        # after a lease ran out on a very slow machine: the balance stays right then too).
        if counts["applied"] == args.messages and \
                counts["applied"] + counts["skipped"] >= expected_deliveries:
            all_delivered.set()

    def say(line: str) -> None:
        with lock:  # whole lines from concurrent workers
            print(line, flush=True)

    def handle(msg: narad.Message) -> None:
        env = narad.Envelope.try_decode(msg.body)
        if env is None:
            return  # not ours: ack and move on
        deposit = env.json()
        if deposit.get("run") != run:
            return  # left over from an earlier run
        with lock:
            counts["deliveries"] += 1
            counts["naive"] += deposit["amount_cents"]  # what a consumer without the check adds

        conn = db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute('INSERT INTO processed (id, topic, partition, "offset", at) '
                         "VALUES (?, ?, ?, ?, ?)",
                         (env.id, msg.topic, msg.partition, msg.offset, time.time()))
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK")
            with lock:
                counts["skipped"] += 1
                check_done()
            say(f"deposit {deposit['n']}: id {env.id[:8]} seen before "
                f"(delivery {msg.delivery_attempt} of {msg.partition}@{msg.offset}): skipped")
            return  # the work is done already: just ack
        conn.execute("INSERT INTO balances (account, cents) VALUES (?, ?) "
                     "ON CONFLICT (account) DO UPDATE SET cents = cents + excluded.cents",
                     (account, deposit["amount_cents"]))
        conn.execute("COMMIT")  # the key and the work land together, or neither does
        with lock:
            counts["applied"] += 1
            check_done()

        if args.crash_every and deposit["n"] % args.crash_every == 0:
            with lock:
                counts["crashed"] += 1
            # The work is committed but the ack never happens: the message comes back.
            raise SimulatedCrash("crashed after the commit, before the ack")

    with narad.Client(url.split(","), auth=auth) as client:
        with contextlib.suppress(narad.Conflict):  # it exists: keep its settings
            client.create_topic(args.topic)

        items = []
        for n, cents in enumerate(amounts, start=1):
            env = narad.Envelope.wrap({"run": run, "n": n, "amount_cents": cents})
            items.append(narad.Outgoing(env, key=account))
            if args.duplicate_every and n % args.duplicate_every == 0:
                items.append(narad.Outgoing(env, key=account))  # the same id again
        for i in range(0, len(items), 1000):
            client.produce_batch(args.topic, items[i:i + 1000])
        print(f"produced {args.messages} deposits, {duplicates} of them twice", flush=True)

        consumer = client.consume(args.topic, handle, concurrency=args.workers, wait=2)
        try:
            if not all_delivered.wait(args.timeout):
                print(f"error: only {counts['deliveries']} of {expected_deliveries} deliveries "
                      f"within {args.timeout:g}s", file=sys.stderr)
                return 1
        finally:
            consumer.close()

    conn = sqlite3.connect(args.db)
    (balance,) = conn.execute("SELECT cents FROM balances WHERE account = ?", (account,)).fetchone()
    conn.close()
    want = sum(amounts)
    print(f"deliveries {counts['deliveries']}: {counts['applied']} applied, "
          f"{counts['skipped']} duplicates skipped ({duplicates} produced twice, "
          f"{counts['crashed']} redelivered after a crash before the ack)")
    print(f"balance {balance} cents, expected {want}: "
          f"{'correct' if balance == want else 'WRONG'}")
    print(f"a consumer without the idempotency key would have counted {counts['naive']} cents "
          f"({counts['naive'] - want} too many)")
    ok = balance == want and counts["applied"] == args.messages
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
