// The consumer loop against a real broker: acks, concurrency bound, lease renewal past
// the visibility timeout, cancellation on lease loss, nack with delay, confirmed acks
// through injected 503s, 504s and lost replies, draining on stop (and giving up on a
// handler that ignores it), and terminal errors.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, ConflictError, LeaseLostError, NotFoundError, ClosedError, TooLargeError, type Message, type NaradEvent } from "@narad/client";
import { faultyFetch, lostReply, startBroker, topicName, waitFor, type TestBroker } from "./helpers.js";

let broker: TestBroker;
let client: Client;

before(async () => {
  broker = await startBroker();
  client = new Client({ endpoints: [broker.url] });
});

after(async () => {
  await client?.close();
  await broker?.stop();
});

async function newTopic(visibilityTimeoutMs = 30_000, partitions = 1): Promise<string> {
  const name = topicName("k");
  await client.createTopic({ name, partitions, visibilityTimeoutMs });
  return name;
}

async function backlog(topic: string): Promise<number> {
  const d = await client.getTopic(topic);
  return d.partitionStats.reduce((n, p) => n + p.backlog, 0);
}

async function inFlight(topic: string): Promise<number> {
  const d = await client.getTopic(topic);
  return d.partitionStats.reduce((n, p) => n + p.inFlight, 0);
}

describe("consume", () => {
  it("handles and acks every message, never running more handlers than workers", async () => {
    const topic = await newTopic(30_000, 3);
    await client.produceBatch(
      topic,
      Array.from({ length: 30 }, (_, i) => ({ body: { i } })),
    );
    const seen = new Set<number>();
    let running = 0;
    let peak = 0;
    let peakLeased = 0;
    const consumer = client.consume(
      topic,
      async (m) => {
        running++;
        peak = Math.max(peak, running);
        peakLeased = Math.max(peakLeased, consumer.stats.inFlight);
        await new Promise((r) => setTimeout(r, 10));
        seen.add(m.json<{ i: number }>().i);
        running--;
      },
      { concurrency: 4, waitMs: 1000 },
    );
    await waitFor(() => consumer.stats.acked === 30, "30 acks");
    assert.equal(seen.size, 30);
    assert.ok(peak <= 4 && peakLeased <= 4, `peak ${peak} handlers, ${peakLeased} leased`);
    assert.equal(await backlog(topic), 0);
    await consumer.stop();
    await consumer.done;
    await consumer.stop(); // twice is harmless
  });

  it("renews the lease past the visibility timeout: not redelivered, acked", async () => {
    const topic = await newTopic(1000);
    await client.produce(topic, "slow");
    const deliveries: number[] = [];
    const events: NaradEvent[] = [];
    const c2 = new Client({ endpoints: [broker.url], onEvent: (e) => events.push(e) });
    const consumer = c2.consume(
      topic,
      async (m, { signal }) => {
        deliveries.push(m.deliveryAttempt ?? 0);
        await new Promise((r) => setTimeout(r, 2500));
        assert.equal(signal.aborted, false);
      },
      { concurrency: 2, waitMs: 500 },
    );
    await waitFor(() => consumer.stats.acked === 1, "the ack after 2.5 s");
    // A second worker was polling all along: a lapsed lease would have shown a redelivery.
    assert.deepEqual(deliveries, [1]);
    assert.ok(consumer.stats.renewed >= 3, `renewed ${consumer.stats.renewed} times`);
    assert.ok(events.some((e) => e.type === "consumer" && e.event === "renewed"));
    assert.equal(await backlog(topic), 0);
    await c2.close();
  });

  it("aborts the handler when its lease is lost, and never acks it", async () => {
    const topic = await newTopic(1000);
    await client.produce(topic, "doomed");
    let reason: unknown;
    let first: Message | undefined;
    const acked: number[] = [];
    const consumer = client.consume(
      topic,
      async (m, { signal }) => {
        if (m.deliveryAttempt !== 1) {
          acked.push(m.deliveryAttempt ?? 0); // the redelivery is handled normally
          return;
        }
        first = m;
        // Someone else hands the message back (its handle is spent): the next renewal answers 410.
        await client.nack(topic, m.receiptHandle as string);
        await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
        reason = signal.reason;
      },
      { concurrency: 1, waitMs: 500 },
    );
    await waitFor(() => reason !== undefined, "the handler's signal to abort");
    assert.ok(reason instanceof LeaseLostError, String(reason));
    assert.equal(first?.state, "lost");
    await waitFor(() => consumer.stats.acked === 1, "the redelivery's ack");
    assert.deepEqual(acked, [2], "only the redelivery was acked");
    assert.equal(consumer.stats.leaseLost, 1);
    await consumer.stop();
    assert.equal(await inFlight(topic), 0);
    assert.equal(await backlog(topic), 0);
  });

  it("aborts the handler by the end of its lease when a renewal hangs", async () => {
    // The renewal goes to a node that takes it and never answers. Each attempt was
    // bounded by the time left, but the call made four of them: the handler ran on,
    // uncancelled, about three leases past the end of its own (rule 1), while the
    // message was free to be delivered elsewhere. Go bounds a renewal by the lease's end.
    const topic = await newTopic(1000);
    await client.produce(topic, "renewal hangs");
    const f = faultyFetch();
    f.rules.push((url, init) => {
      if (!url.pathname.endsWith("/ack") || url.searchParams.get("extend") === null || url.searchParams.get("extend") === "0") return undefined;
      return new Promise<Response>((_resolve, reject) => {
        const sig = init?.signal;
        if (sig?.aborted) reject(sig.reason);
        sig?.addEventListener("abort", () => reject(sig.reason), { once: true });
      });
    });
    const c = new Client({ endpoints: [broker.url], fetch: f.fetch });
    let abortedAfter: number | undefined;
    const consumer = c.consume(
      topic,
      async (m, { signal }) => {
        if (m.deliveryAttempt !== 1) return;
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, 4000);
          signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
        });
        if (signal.aborted) abortedAfter = Date.now() - m.receivedAt;
      },
      { concurrency: 1, waitMs: 200 },
    );
    await waitFor(() => abortedAfter !== undefined || consumer.stats.acked > 0, "the handler's end", 10_000);
    await consumer.stop();
    await c.close();
    assert.ok(abortedAfter !== undefined && abortedAfter < 1600, `aborted ${abortedAfter} ms after receipt, for a 1000 ms lease`);
  });

  it("without renewal the handler is aborted when the lease runs out", async () => {
    const topic = await newTopic(600);
    await client.produce(topic, "x");
    let aborted = false;
    const consumer = client.consume(
      topic,
      async (_m, { signal }) => {
        await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
        aborted = true;
      },
      { leaseRenewal: false, waitMs: 200 },
    );
    await waitFor(() => aborted, "the abort at the lease's end");
    await consumer.stop();
    assert.equal(consumer.stats.acked, 0);
  });

  it("stops renewing at maxLeaseMs and then aborts the handler", async () => {
    const topic = await newTopic(1000);
    await client.produce(topic, "endless");
    let reason: unknown;
    let started = 0;
    const consumer = client.consume(
      topic,
      async (m, { signal }) => {
        if (m.deliveryAttempt !== 1) return;
        started = Date.now();
        await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
        reason = signal.reason;
      },
      { waitMs: 300, maxLeaseMs: 1500 },
    );
    await waitFor(() => reason !== undefined, "the abort at the max lease");
    const held = Date.now() - started;
    assert.ok(reason instanceof LeaseLostError, String(reason));
    assert.ok(held >= 1300, `aborted after ${held} ms`);
    assert.equal(consumer.stats.renewed, 1, "one renewal fits in 1.5 s of a 1 s window");
    await waitFor(() => consumer.stats.acked === 1, "the redelivery's ack");
    await consumer.stop();
  });

  it("hands a failed message back with the configured delay; handler errors never kill the loop", async () => {
    const topic = await newTopic();
    await client.produce(topic, "flaky");
    const times: number[] = [];
    const errors: unknown[] = [];
    const consumer = client.consume(
      topic,
      (m) => {
        times.push(Date.now());
        if (m.deliveryAttempt === 1) throw new Error("boom");
      },
      { waitMs: 500, nackDelayMs: () => 1000, onError: (e) => errors.push(e) },
    );
    await waitFor(() => consumer.stats.acked === 1, "the second delivery's ack", 20_000);
    assert.equal(times.length, 2);
    assert.ok((times[1] as number) - (times[0] as number) >= 900, `redelivered after ${(times[1] as number) - (times[0] as number)} ms`);
    assert.equal(consumer.stats.handlerErrors, 1);
    assert.equal(consumer.stats.nacked, 1);
    assert.match(String(errors[0]), /boom/);
    await consumer.stop();
  });

  it("leaves a message the handler settled itself alone", async () => {
    const topic = await newTopic();
    await client.produce(topic, "self");
    let done = false;
    const consumer = client.consume(topic, async (m) => {
      await m.ack();
      done = true;
    }, { waitMs: 500 });
    await waitFor(() => done, "the handler");
    await consumer.stop();
    assert.equal(consumer.stats.acked, 1, "counted, but acked only once");
    assert.equal(consumer.stats.ackFailed, 0);
    assert.equal(await backlog(topic), 0);
  });

  it("retries acks through 503s until confirmed", async () => {
    const topic = await newTopic();
    await client.produce(topic, "ack me");
    const f = faultyFetch();
    let refused = 0;
    f.rules.push((url) => {
      if (url.pathname.endsWith("/ack") && !url.searchParams.has("extend") && refused < 2) {
        refused++;
        return Promise.resolve(
          new Response(JSON.stringify({ error: { code: "unavailable", message: "injected" } }), { status: 503, headers: { "retry-after": "0", "content-type": "application/json" } }),
        );
      }
      return undefined;
    });
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch });
    const consumer = c2.consume(topic, () => {}, { waitMs: 500 });
    await waitFor(() => consumer.stats.acked === 1, "the confirmed ack");
    assert.equal(refused, 2);
    assert.equal(consumer.stats.ackFailed, 0);
    assert.equal(await backlog(topic), 0);
    await c2.close();
  });

  it("counts a 410 on a retry whose first reply was lost as a successful ack", async () => {
    const topic = await newTopic();
    await client.produceBatch(topic, [{ body: "lost reply" }, { body: "direct" }]);
    const f = faultyFetch();
    let dropped = 0;
    f.rules.push(async (url, _init, real) => {
      if (url.pathname.endsWith("/ack") && !url.searchParams.has("extend") && dropped < 2) {
        dropped++;
        const r = await real(); // the broker settles it...
        await r.arrayBuffer();
        throw lostReply(); // ...but the reply never arrives
      }
      return undefined;
    });
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch });
    const [m] = await c2.receive(topic, { waitMs: 2000 });
    await m?.ack(); // resolves: the retry's 410 means the first attempt settled it
    assert.equal(m?.state, "acked");
    const consumer = c2.consume(topic, () => {}, { waitMs: 500 });
    await waitFor(() => consumer.stats.acked === 1, "the consumer's confirmed ack");
    assert.equal(dropped, 2);
    assert.equal(await backlog(topic), 0);
    await c2.close();
  });

  it("counts an ack answered 504 and then 410 as a successful ack", async () => {
    const topic = await newTopic();
    await client.produce(topic, "behind a proxy");
    const f = faultyFetch();
    let timedOut = 0;
    f.rules.push(async (url, _init, real) => {
      if (url.pathname.endsWith("/ack") && !url.searchParams.has("extend") && timedOut === 0) {
        timedOut++;
        await (await real()).arrayBuffer(); // the broker settles it...
        return new Response("<html>504 Gateway Time-out</html>", { status: 504 }); // ...and the proxy gives up
      }
      return undefined;
    });
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
    const [m] = await c2.receive(topic, { waitMs: 2000 });
    await m?.ack(); // resolves: the 504 may have settled it, and the retry's 410 says it did
    assert.equal(m?.state, "acked");
    assert.equal(timedOut, 1);
    assert.equal(await backlog(topic), 0);
    await c2.close();
  });

  it("drains on stop: polling stops, running handlers finish, acks are flushed", async () => {
    const topic = await newTopic();
    await client.produceBatch(topic, [{ body: "a" }, { body: "b" }]);
    let started = 0;
    let finished = 0;
    const consumer = client.consume(
      topic,
      async () => {
        started++;
        await new Promise((r) => setTimeout(r, 800));
        finished++;
      },
      { concurrency: 2, waitMs: 1000 },
    );
    await waitFor(() => started === 2, "both handlers to start");
    await consumer.stop();
    assert.equal(finished, 2, "stop waited for running handlers");
    assert.equal(consumer.stats.acked, 2, "and for their acks");
    assert.equal(await backlog(topic), 0);
    await client.produce(topic, "after stop");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(started, 2, "a stopped consumer polls no more");
    const [left] = await client.receive(topic, { waitMs: 2000 });
    assert.equal(left?.text(), "after stop");
    await left?.ack();
  });

  it("cuts handlers at the end of the grace period and hands their messages back", async () => {
    const topic = await newTopic();
    await client.produce(topic, "stubborn");
    let reason: unknown;
    let started = false;
    const consumer = client.consume(
      topic,
      async (_m, { signal }) => {
        started = true;
        await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
        reason = signal.reason;
      },
      { waitMs: 500, shutdownGraceMs: 300 },
    );
    await waitFor(() => started, "the handler");
    await consumer.stop();
    assert.ok(reason instanceof ClosedError, String(reason));
    assert.equal(consumer.stats.acked, 0);
    const [again] = await client.receive(topic, { waitMs: 3000 });
    assert.equal(again?.text(), "stubborn", "handed back at once, not after its lease");
    await again?.ack();
  });

  it("gives up on a handler that ignores the end of the grace: stops renewing and hands its message back", async () => {
    const topic = await newTopic(300);
    await client.produce(topic, "stuck");
    const f = faultyFetch();
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch });
    let release!: () => void;
    const stuck = new Promise<void>((r) => (release = r));
    let started = false;
    const consumer = c2.consume(
      topic,
      async () => {
        started = true;
        await stuck; // ignores its signal
      },
      { waitMs: 200, shutdownGraceMs: 100 },
    );
    try {
      await waitFor(() => started, "the handler");
      await consumer.stop();
      const renewals = () => f.calls.filter((u) => u.pathname.endsWith("/ack") && u.searchParams.has("extend") && u.searchParams.get("extend") !== "0").length;
      const before = renewals();
      const [again] = await client.receive(topic, { waitMs: 200 });
      assert.equal(again?.text(), "stuck", "handed back at once, not held");
      await again?.ack();
      await new Promise((r) => setTimeout(r, 1000)); // three lease windows
      assert.equal(renewals(), before, "no renewal after stop() resolved");
      assert.equal(consumer.stats.acked, 0);
      assert.equal(consumer.stats.nacked, 1);
      release();
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(consumer.stats.acked, 0, "a handler that returns after it was given up on is not acked");
    } finally {
      release();
      await c2.close();
    }
  });

  it("stops on a signal, and with await using", async () => {
    const topic = await newTopic();
    const ctl = new AbortController();
    const consumer = client.consume(topic, () => {}, { signal: ctl.signal, waitMs: 20_000 });
    await new Promise((r) => setTimeout(r, 100));
    const t0 = Date.now();
    ctl.abort();
    await consumer.done;
    assert.ok(Date.now() - t0 < 5000, "a stop does not wait out a long poll");
    {
      await using c = client.consume(topic, () => {}, { waitMs: 20_000 });
      assert.equal(c.topic, topic);
    }
  });

  it("stops and says so on a terminal error", async () => {
    const errors: unknown[] = [];
    const consumer = client.consume(topicName("missing"), () => {}, { waitMs: 200, leaseMs: 1000, onError: (e) => errors.push(e) });
    await assert.rejects(consumer.done, (e: unknown) => e instanceof NotFoundError);
    await consumer.stop(); // harmless afterwards
  });

  it("stops and says so when a poll is answered 409 or 413 (terminal, rule 8)", async () => {
    for (const [status, code, kind] of [
      [409, "conflict", ConflictError],
      [413, "payload_too_large", TooLargeError],
    ] as const) {
      const topic = await newTopic();
      const f = faultyFetch();
      f.rules.push((url) =>
        url.pathname.endsWith("/consume")
          ? Promise.resolve(new Response(JSON.stringify({ error: { code, message: "injected" } }), { status, headers: { "content-type": "application/json" } }))
          : undefined,
      );
      const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch });
      try {
        const consumer = c2.consume(topic, () => {}, { waitMs: 200 });
        const stillPolling = new Promise<never>((_, rej) => setTimeout(() => rej(new Error(`still polling 5 s after a ${status}`)), 5000).unref());
        await assert.rejects(Promise.race([consumer.done, stillPolling]), (e: unknown) => e instanceof kind);
        assert.equal(f.calls.filter((u) => u.pathname.endsWith("/consume")).length, 1, `a ${status} is not retried`);
      } finally {
        await c2.close();
      }
    }
  });

  it("retries transient poll errors and keeps going", async () => {
    const topic = await newTopic();
    const f = faultyFetch();
    let refused = 0;
    f.rules.push((url) => {
      if (url.pathname.endsWith("/consume") && refused < 3) {
        refused++;
        return Promise.resolve(new Response("", { status: 503 }));
      }
      return undefined;
    });
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { attempts: 1 } });
    const errors: unknown[] = [];
    const consumer = c2.consume(topic, () => {}, { waitMs: 200, onError: (e) => errors.push(e) });
    await client.produce(topic, "through");
    await waitFor(() => consumer.stats.acked === 1, "the message after the 503s");
    assert.equal(errors.length, 3);
    await c2.close();
  });
});
