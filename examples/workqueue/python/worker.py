"""A work queue in Python: a pool of worker threads takes jobs from a topic under leases.

The SDK's consumer keeps each lease alive while its job runs longer than the topic's
visibility timeout, acks a job when the handler returns, hands it back when the handler
raises, and drains on close: running jobs finish and are acked, jobs never started go
back to the queue. Ctrl-C or SIGTERM closes it, so a deploy loses nothing.

    python worker.py --jobs 20                    # enqueue 20 jobs, work until Ctrl-C
    python worker.py --jobs 20 --exit-when-empty
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

import narad


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic", default="jobs", help="the queue's topic (created when missing)")
    p.add_argument("--jobs", type=int, default=0,
                   help="jobs to enqueue before working (0: only work)")
    p.add_argument("--workers", type=int, default=4, help="jobs handled at once")
    p.add_argument("--work", type=float, default=4.0, help="seconds each enqueued job takes")
    p.add_argument("--lease", type=float, default=3.0,
                   help="visibility timeout (s) of the topic when this creates it; shorter than "
                        "--work, so leases must be renewed")
    p.add_argument("--poll-wait", type=float, default=2.0,
                   help="long-poll wait (s); closing lets a waiting poll finish (and hands its "
                        "messages back), so a shorter wait stops sooner")
    p.add_argument("--exit-when-empty", action="store_true",
                   help="stop (draining) once the queue has no unsettled job left")
    return p.parse_args()


def backlog(client: narad.Client, topic: str) -> int:
    """Backlog counts the topic's unsettled messages: waiting, leased or handed back."""
    return sum(p.backlog for p in client.get_topic(topic).partition_stats)


def main() -> int:
    args = parse_args()
    url = os.environ.get("NARAD_URL", "http://127.0.0.1:7942")
    auth = (os.environ["NARAD_USER"], os.environ.get("NARAD_PASSWORD", "")) \
        if os.environ.get("NARAD_USER") else None

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with narad.Client(url.split(","), auth=auth) as client:
        with contextlib.suppress(narad.Conflict):  # it exists: keep its settings
            client.create_topic(args.topic, visibility_timeout_ms=int(args.lease * 1000))
        info = client.get_topic(args.topic)
        print(f"queue {args.topic}: {info.partitions} partitions, "
              f"lease {info.visibility_timeout_ms / 1000:g}s, {args.workers} workers", flush=True)

        if args.jobs:
            client.produce_batch(args.topic, [
                {"id": i, "task": f"resize image {i}", "work_ms": int(args.work * 1000)}
                for i in range(1, args.jobs + 1)])
            print(f"enqueued {args.jobs} jobs", flush=True)

        handled = 0
        lock = threading.Lock()

        def handle(msg: narad.Message) -> None:
            nonlocal handled
            job = msg.json()
            delivery = narad.current_delivery()
            # A long job waits on `cancelled`: it is set when the lease is lost (another
            # worker may take the job) or the shutdown grace ran out. Raising then hands
            # the job back; the consumer never acks a job whose lease is lost.
            assert delivery is not None
            if delivery.cancelled.wait(job["work_ms"] / 1000):
                raise RuntimeError("lease lost or shutdown: job abandoned")
            with lock:
                handled += 1
                n = handled
            print(f"job {job['id']} done (partition {msg.partition} offset {msg.offset}, "
                  f"delivery {msg.delivery_attempt}) [{n} handled]", flush=True)
            # Returning acks the job (the consumer confirms the ack).

        consumer = client.consume(args.topic, handle, concurrency=args.workers,
                                  wait=args.poll_wait, grace=30)
        try:
            while not stop.is_set() and consumer.running:
                if stop.wait(0.5):
                    break
                if args.exit_when_empty and backlog(client, args.topic) == 0:
                    print("queue empty: stopping", flush=True)
                    break
        finally:
            consumer.close()  # drain: stop polling, finish running jobs, hand back the rest
        if stop.is_set():
            print("signal received: drained", flush=True)
        st = consumer.stats
        print(f"handled {handled} jobs (lease renewals {st.renewals}, leases lost "
              f"{st.lease_lost}, handed back {st.handed_back})", flush=True)
        if consumer.error is not None:
            print(f"error: {consumer.error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
