// The Publisher: batching by count, bytes and linger, the bound (block or buffer-full),
// a result per message, flush and close.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { BufferFullError, Client, ClosedError, MAX_MESSAGE_BYTES, TooLargeError, type NaradEvent } from "@narad/client";
import { startBroker, topicName, type TestBroker } from "./helpers.js";

let broker: TestBroker;
let client: Client;
const events: NaradEvent[] = [];

before(async () => {
  broker = await startBroker();
  client = new Client({ endpoints: [broker.url], onEvent: (e) => events.push(e) });
});

after(async () => {
  await client?.close();
  await broker?.stop();
});

function batchesTo(topic: string): number {
  return events.filter((e) => e.type === "operation.end" && e.operation === "produceBatch" && e.topic === topic).length;
}

async function newTopic(): Promise<string> {
  const name = topicName("p");
  await client.createTopic({ name, partitions: 1 });
  return name;
}

describe("publisher", () => {
  it("batches by count and resolves every message with where it was stored", async () => {
    const topic = await newTopic();
    const pub = client.publisher(topic, { maxBatchMessages: 10, lingerMs: 1000 });
    const results = await Promise.all(Array.from({ length: 35 }, (_, i) => pub.publish({ i }, { key: "k" })));
    assert.deepEqual(
      results.map((r) => r.offset),
      Array.from({ length: 35 }, (_, i) => i),
      "in order, one result each",
    );
    assert.equal(batchesTo(topic), 4, "3 full batches by count, then the rest by linger");
    await pub.close();
    const range = await client.readMessages(topic, 0, { max: 1000 });
    assert.deepEqual(
      range.messages.map((m) => m.json<{ i: number }>().i),
      Array.from({ length: 35 }, (_, i) => i),
    );
  });

  it("batches by bytes and by linger", async () => {
    const topic = await newTopic();
    const pub = client.publisher(topic, { maxBatchBytes: 3000, lingerMs: 50 });
    const big = new Uint8Array(1000).fill(7);
    await Promise.all([pub.publish(big), pub.publish(big), pub.publish(big), pub.publish(big)]);
    assert.ok(batchesTo(topic) >= 2, `bytes split the batch (${batchesTo(topic)} requests)`);
    const before = batchesTo(topic);
    const t0 = Date.now();
    await pub.publish("alone");
    assert.ok(Date.now() - t0 >= 40, "a lone message waits for its linger");
    assert.equal(batchesTo(topic), before + 1);
    await pub.close();
  });

  it("fails only the message that cannot go, not its batch", async () => {
    const topic = await newTopic();
    await using pub = client.publisher(topic, { lingerMs: 20 });
    const ok1 = pub.publish("ok");
    await assert.rejects(pub.publish(new Uint8Array(MAX_MESSAGE_BYTES + 1)), TooLargeError);
    const ok2 = pub.publish("ok too");
    assert.equal((await ok1).offset, 0);
    assert.equal((await ok2).offset, 1);
  });

  it("isolates a message the broker refuses (a schema violation): the rest of its batch is stored", async () => {
    // The broker refuses a whole produce-batch (400, nothing stored) for one message it
    // will not take. A publisher's batch mixes the messages of many callers: only the
    // refused one may fail; a valid one failing with its BadRequest would be dropped as
    // "fix the request, never retry".
    const name = topicName("schema");
    await client.createTopic({ name, partitions: 1, schema: { type: "object", required: ["id"], properties: { id: { type: "integer" } } } });
    const pub = client.publisher(name, { lingerMs: 200 });
    const rs = await Promise.allSettled([pub.publish({ id: 1 }), pub.publish({ id: "one" }), pub.publish({ id: 3 })]);
    await pub.close();
    const [a, bad, b] = rs;
    assert.ok(bad?.status === "rejected" && (bad.reason as { kind?: string }).kind === "BadRequest", String(bad?.status === "rejected" ? bad.reason : "stored"));
    for (const r of [a, b]) assert.equal(r?.status, "fulfilled", String(r?.status === "rejected" ? r.reason : ""));
    const info = await client.getTopic(name);
    assert.equal(info.partitionStats[0]?.nextOffset, 2, "the two valid messages are stored");
  });

  it("rejects every message of a batch the broker refused, with the broker's error", async () => {
    const pub = client.publisher(topicName("missing"), { lingerMs: 1 });
    const rs = await Promise.allSettled([pub.publish("a"), pub.publish("b")]);
    assert.ok(rs.every((r) => r.status === "rejected" && (r.reason as { kind?: string }).kind === "NotFound"));
    await pub.close();
  });

  it("is bounded: buffer-full errors, or waiting for room", async () => {
    const topic = await newTopic();
    const strict = client.publisher(topic, { maxBufferedMessages: 3, whenFull: "error", lingerMs: 200 });
    const first = [strict.publish(1), strict.publish(2), strict.publish(3)];
    assert.equal(strict.buffered, 3);
    await assert.rejects(strict.publish(4), (e: unknown) => e instanceof BufferFullError && e.retryable);
    await Promise.all(first);
    assert.equal(strict.buffered, 0);
    await strict.close();

    const blocking = client.publisher(topic, { maxBufferedMessages: 2, lingerMs: 10 });
    let peak = 0;
    const all: Promise<unknown>[] = [];
    for (let i = 0; i < 10; i++) {
      await blocking.ready();
      all.push(blocking.publish(i));
      peak = Math.max(peak, blocking.buffered);
    }
    await Promise.all(all);
    assert.ok(peak <= 2, `peak ${peak} buffered`);
    // Without ready(), publish itself waits for room and still succeeds.
    const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => blocking.publish(i)));
    assert.equal(rs.length, 6);
    await blocking.close();
  });

  it("flushes on close, then refuses; closing twice is harmless", async () => {
    const topic = await newTopic();
    const pub = client.publisher(topic, { lingerMs: 60_000 });
    const p = pub.publish("held by linger");
    await pub.flush();
    assert.equal((await p).offset, 0);
    const q = pub.publish("flushed by close");
    await pub.close();
    assert.equal((await q).offset, 1);
    await assert.rejects(pub.publish("late"), ClosedError);
    await pub.close();
  });

  it("is flushed by the client's close", async () => {
    const topic = await newTopic();
    const c = new Client({ endpoints: broker.url });
    const pub = c.publisher(topic, { lingerMs: 60_000 });
    const p = pub.publish("x");
    await c.close();
    assert.equal((await p).offset, 0);
  });
});
