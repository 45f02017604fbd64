// Poison messages: a handler that always fails must not hot-loop. The default nack
// delay grows with delivery_attempt (full jitter, 1 s to 5 min), and maxDeliveries
// with a deadLetterTopic moves a message that keeps failing out of the way, its lease
// renewed until the dead-letter produce is done.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, Envelope, poisonBackoffMs, type Message } from "@narad/client";
import { bytesEqual, faultyFetch, startBroker, topicName, waitFor, type TestBroker } from "./helpers.js";

let broker: TestBroker;
let plain: Client;

before(async () => {
  broker = await startBroker();
  plain = new Client({ endpoints: [broker.url] });
});

after(async () => {
  await plain?.close();
  await broker?.stop();
});

describe("poison messages", () => {
  it("the default backoff doubles from 1 s to 5 min with jitter in [d/2, d]", () => {
    assert.equal(poisonBackoffMs(1, () => 0), 500);
    assert.equal(poisonBackoffMs(1, () => 1), 1000);
    assert.equal(poisonBackoffMs(3, () => 1), 4000);
    assert.equal(poisonBackoffMs(3, () => 0), 2000);
    assert.equal(poisonBackoffMs(20, () => 1), 300_000);
    assert.equal(poisonBackoffMs(1000, () => 0), 150_000);
  });

  it("nacks a failed message with a backoff by default, not at once", async () => {
    const topic = topicName("p");
    await plain.createTopic({ name: topic, partitions: 1 });
    await plain.produce(topic, "poison");
    const ff = faultyFetch();
    const client = new Client({ endpoints: [broker.url], fetch: ff.fetch });
    let runs = 0;
    const consumer = client.consume(topic, () => {
      runs++;
      throw new Error("always fails");
    });
    const nack = await waitFor(() => ff.calls.find((u) => u.pathname.endsWith("/ack") && u.searchParams.has("extend")), "the first nack");
    const delay = Number(nack.searchParams.get("extend"));
    assert.ok(delay >= 500 && delay <= 1000, `the first nack waits 0.5–1 s, not ${delay} ms`);
    await consumer.stop();
    await client.close();
    assert.equal(runs, 1);
  });

  it("dead-letters a message past maxDeliveries, then acks it", async () => {
    const topic = topicName("p");
    const dlt = `${topic}.dlq`;
    await plain.createTopic({ name: topic, partitions: 1 });
    await plain.createTopic({ name: dlt, partitions: 1 });
    const body = new Uint8Array([0, 1, 2, 250]);
    await plain.produce(topic, body, { key: "k1" });
    await plain.produce(topic, Envelope.wrap({ id: 7 }, { headers: { a: "b" } }), { key: "k2" });
    const client = new Client({ endpoints: [broker.url] });
    const attempts: number[] = [];
    const consumer = client.consume(
      topic,
      (m) => {
        attempts.push(m.deliveryAttempt ?? 0);
        throw new Error("always fails");
      },
      { concurrency: 2, nackDelayMs: 0, maxDeliveries: 2, deadLetterTopic: dlt },
    );
    const dead = await waitFor(async () => {
      const got: Message[] = [];
      for await (const m of plain.replay(dlt)) got.push(m);
      return got.length === 2 ? got : undefined;
    }, "two dead-lettered messages", 60_000);
    await consumer.stop();
    await client.close();
    const byKey = new Map(dead.map((m) => [m.key, m]));
    assert.ok(bytesEqual(byKey.get("k1")!.body, body), "same bytes");
    const env = byKey.get("k2")!.envelope();
    assert.ok(env, "an envelope stays an envelope");
    assert.deepEqual(env.json(), { id: 7 });
    assert.equal(env.headers["a"], "b");
    assert.equal(env.headers["narad-dead-letter-topic"], topic);
    // The contract: the envelope gets the reason (as the Go and Python SDKs write it) and
    // keeps where it came from, so a re-driver in any language reads both.
    assert.equal(env.lastError, "delivered 3 times, over the limit of 2");
    assert.equal(env.origin, topic);
    assert.ok(attempts.every((a) => a <= 2), `the handler never saw an attempt past maxDeliveries: ${attempts}`);
    assert.deepEqual(await plain.receive(topic, { waitMs: 0 }), [], "the originals were acked");
  });

  it("keeps renewing the lease while a slow dead-letter produce runs, so it is dead-lettered once", async () => {
    const topic = topicName("p");
    const dlt = `${topic}.dlq`;
    await plain.createTopic({ name: topic, partitions: 1, visibilityTimeoutMs: 300 });
    await plain.createTopic({ name: dlt, partitions: 1 });
    await plain.produce(topic, "poison");
    const [first] = await plain.receive(topic, { waitMs: 2000 });
    await first?.nack(); // delivery 1 failed; the consumer gets delivery 2
    const ff = faultyFetch();
    ff.rules.push(async (url, _init, real) => {
      if (url.pathname === `/v1/topics/${encodeURIComponent(dlt)}/produce`) {
        await new Promise((r) => setTimeout(r, 1200)); // four lease windows
        return real();
      }
      return undefined;
    });
    const client = new Client({ endpoints: [broker.url], fetch: ff.fetch });
    const consumer = client.consume(topic, () => undefined, { maxDeliveries: 1, deadLetterTopic: dlt, waitMs: 200 });
    try {
      await waitFor(() => consumer.stats.acked + consumer.stats.ackFailed > 0, "the dead-lettered message's ack", 10_000);
      assert.equal(consumer.stats.ackFailed, 0, "the lease did not lapse during the produce");
      assert.equal(consumer.stats.acked, 1);
      assert.ok(ff.calls.some((u) => u.pathname.endsWith("/ack") && u.searchParams.has("extend") && u.searchParams.get("extend") !== "0"), "renewed meanwhile");
    } finally {
      await consumer.stop();
      await client.close();
    }
    const dead: Message[] = [];
    for await (const m of plain.replay(dlt)) dead.push(m);
    assert.equal(dead.length, 1, "dead-lettered once");
    assert.deepEqual(await plain.receive(topic, { waitMs: 0 }), [], "the original was acked");
  });

  it("refuses maxDeliveries without a deadLetterTopic", () => {
    assert.throws(() => plain.consume("x", () => undefined, { maxDeliveries: 3 }), TypeError);
  });
});
