// Stopping a consumer while a poll's answer is on its way: the messages that poll
// leased are handed back at once, not left leased for a whole visibility timeout.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client } from "@narad/client";
import { faultyFetch, startBroker, topicName, type TestBroker } from "./helpers.js";

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

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

describe("shutdown during a poll", () => {
  it("hands back the messages of a poll cut by stop()", async () => {
    const topic = topicName("sd");
    await plain.createTopic({ name: topic, partitions: 1, visibilityTimeoutMs: 120_000 });
    await plain.produce(topic, "leased while stopping");

    const ff = faultyFetch();
    const bodyRead = deferred(); // the client started reading the poll's answer
    const gate = deferred(); // lets the answer's body through
    ff.rules.push(async (url, init, real) => {
      if (!url.pathname.endsWith("/consume")) return undefined;
      const res = await real();
      const bytes = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) return new Response(res.status === 204 ? null : bytes, { status: res.status, headers: res.headers });
      // As a real fetch does, abort errors the body while it is still arriving.
      const signal = init?.signal ?? undefined;
      // highWaterMark 0: pull runs only once the client reads the body, after the status.
      const source = {
        async pull(ctl: ReadableStreamDefaultController<Uint8Array>) {
          bodyRead.resolve();
          const aborted = new Promise<void>((_, rej) => signal?.addEventListener("abort", () => rej(signal.reason), { once: true }));
          try {
            await Promise.race([gate.promise, aborted]);
            ctl.enqueue(bytes);
            ctl.close();
          } catch (e) {
            ctl.error(e);
          }
        },
      };
      const body = new ReadableStream<Uint8Array>(source, { highWaterMark: 0 });
      return new Response(body, { status: 200, headers: res.headers });
    });

    const client = new Client({ endpoints: [broker.url], fetch: ff.fetch });
    let handled = 0;
    const consumer = client.consume(topic, () => void handled++, { leaseMs: 120_000 });
    await bodyRead.promise; // the broker leased the message and its answer is on the way
    const stopped = consumer.stop();
    gate.resolve();
    await stopped;
    await client.close();

    assert.equal(handled, 0, "a message fetched after the stop began is never handled");
    const again = await plain.receive(topic, { waitMs: 10_000 });
    assert.equal(again.length, 1, "the message was handed back, not left leased for 120 s");
    assert.equal(again[0]!.deliveryAttempt, 2);
    await again[0]!.ack();
  });
});
