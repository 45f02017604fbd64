// Stopping a consumer while a poll's answer is on its way: the messages that poll
// leased are handed back at once, not left leased for a whole visibility timeout,
// whether the answer's status had come in before the stop or comes just after it
// (fetch cannot half-close a poll's connection, so a cut poll's answer is waited for,
// briefly). And the stop stays bounded when the broker never answers or stalls.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client } from "@narad/client";
import { faultyFetch, hungServer, startBroker, topicName, type TestBroker } from "./helpers.js";

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

  it("hands back what a poll leased when its answer comes in just after stop()", async () => {
    // The broker has leased the message and answered; the answer is on the wire, not
    // yet taken in by fetch (its headers unread), when the stop comes. A real fetch
    // aborted then rejects and drops the connection with the answer in it.
    const topic = topicName("sd");
    await plain.createTopic({ name: topic, partitions: 1, visibilityTimeoutMs: 60_000 });
    await plain.produce(topic, "answered before the stop, read after it");

    const ff = faultyFetch();
    const answered = deferred(); // the broker's answer is here, fetch has not handed it over
    const gate = deferred(); // hands it over
    ff.rules.push(async (url, init, real) => {
      if (!url.pathname.endsWith("/consume")) return undefined;
      const res = await real();
      const bytes = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) return new Response(res.status === 204 ? null : bytes, { status: res.status, headers: res.headers });
      answered.resolve();
      const signal = init?.signal ?? undefined;
      // As a real fetch does, an abort before the response is handed over rejects it.
      await new Promise<void>((resolve, reject) => {
        if (signal?.aborted) reject(signal.reason);
        signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
        void gate.promise.then(resolve);
      });
      return new Response(bytes, { status: 200, headers: res.headers });
    });

    const client = new Client({ endpoints: [broker.url], fetch: ff.fetch });
    let handled = 0;
    const consumer = client.consume(topic, () => void handled++, { leaseMs: 60_000 });
    await answered.promise;
    const stopped = consumer.stop();
    gate.resolve(); // the answer arrives just after the stop began
    await stopped;
    await client.close();

    assert.equal(handled, 0, "a message fetched after the stop began is never handled");
    const t0 = Date.now();
    const again = await plain.receive(topic, { waitMs: 10_000 });
    assert.equal(again.length, 1, "the message was handed back, not left leased for 60 s");
    assert.ok(Date.now() - t0 < 10_000);
    assert.equal(again[0]!.deliveryAttempt, 2);
    await again[0]!.ack();
  });

  it("hands back what a poll of messages() leased when its signal aborts before the answer is read", async () => {
    const topic = topicName("sd");
    await plain.createTopic({ name: topic, partitions: 1, visibilityTimeoutMs: 60_000 });
    await plain.produce(topic, "iterated");

    const ff = faultyFetch();
    const answered = deferred();
    const gate = deferred();
    ff.rules.push(async (url, init, real) => {
      if (!url.pathname.endsWith("/consume")) return undefined;
      const res = await real();
      const bytes = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) return new Response(res.status === 204 ? null : bytes, { status: res.status, headers: res.headers });
      answered.resolve();
      const signal = init?.signal ?? undefined;
      await new Promise<void>((resolve, reject) => {
        if (signal?.aborted) reject(signal.reason);
        signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
        void gate.promise.then(resolve);
      });
      return new Response(bytes, { status: 200, headers: res.headers });
    });

    const client = new Client({ endpoints: [broker.url], fetch: ff.fetch });
    const ctl = new AbortController();
    let got = 0;
    const iterating = (async () => {
      for await (const _ of client.messages(topic, { signal: ctl.signal })) got++;
    })();
    await answered.promise;
    ctl.abort(new Error("leaving"));
    gate.resolve();
    await assert.rejects(iterating, /leaving/);
    await client.close();

    assert.equal(got, 0);
    const again = await plain.receive(topic, { waitMs: 10_000 });
    assert.equal(again.length, 1, "the message was handed back, not left leased for 60 s");
    await again[0]!.ack();
  });

  it("loses no message when stop() races a message's arrival (real fetch, no faults)", async () => {
    // Without injected faults: a poll is waiting, a message is produced, and the
    // consumer is stopped as soon as the produce is answered. The broker wakes the poll
    // and answers it while the stop cuts it. Each message must be handled or handed
    // back, never left leased for the 60 s visibility timeout.
    const rounds = 12;
    for (let i = 0; i < rounds; i++) {
      const topic = topicName("race");
      await plain.createTopic({ name: topic, partitions: 1, visibilityTimeoutMs: 60_000 });
      const polls: number[] = [];
      const ff = faultyFetch();
      ff.rules.push((url) => {
        if (url.pathname.endsWith("/consume")) polls.push(Date.now());
        return undefined;
      });
      const client = new Client({ endpoints: [broker.url], fetch: ff.fetch });
      let handled = 0;
      const consumer = client.consume(topic, () => void handled++, { leaseMs: 60_000, waitMs: 20_000 });
      // The poll is sent and the broker is waiting on it (give it a moment to arrive).
      while (polls.length === 0) await new Promise((r) => setTimeout(r, 10));
      await new Promise((r) => setTimeout(r, 100));
      await plain.produce(topic, `round ${i}`);
      await consumer.stop();
      await client.close();
      if (handled > 0) continue; // handled and acked before the stop reached it
      const again = await plain.receive(topic, { waitMs: 10_000 });
      assert.equal(again.length, 1, `round ${i}: the message was handed back, not left leased for 60 s`);
      await again[0]!.ack();
    }
  });

  it("ends a stop within a bound when the broker never answers the poll", async () => {
    const hung = await hungServer();
    const client = new Client({ endpoints: [hung.url], retry: { attempts: 1 } });
    try {
      const consumer = client.consume("never-answered", () => undefined, { leaseMs: 60_000, waitMs: 20_000 });
      const deadline = Date.now() + 10_000;
      while (hung.accepted() === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      assert.ok(hung.accepted() > 0, "the poll reached the hung node");
      const t0 = Date.now();
      await consumer.stop();
      assert.ok(Date.now() - t0 < 5000, `the stop took ${Date.now() - t0} ms`);
    } finally {
      await client.close();
      await hung.close();
    }
  });

  it("ends a stop within a bound when a poll's answer stalls after its status", async () => {
    const topic = topicName("sd");
    await plain.createTopic({ name: topic, partitions: 1, visibilityTimeoutMs: 60_000 });
    await plain.produce(topic, "stalled");

    const ff = faultyFetch();
    const bodyRead = deferred();
    ff.rules.push(async (url, init, real) => {
      if (!url.pathname.endsWith("/consume")) return undefined;
      const res = await real();
      await res.arrayBuffer();
      if (res.status !== 200) return new Response(null, { status: 204 });
      const signal = init?.signal ?? undefined;
      // A body that never comes; an abort errors it, as a real fetch's does.
      const body = new ReadableStream<Uint8Array>(
        {
          pull(ctl) {
            bodyRead.resolve();
            return new Promise<void>((resolve) => {
              signal?.addEventListener(
                "abort",
                () => {
                  ctl.error(signal.reason);
                  resolve();
                },
                { once: true },
              );
            });
          },
        },
        { highWaterMark: 0 },
      );
      return new Response(body, { status: 200, headers: res.headers });
    });
    // The attempt's own bound (its wait plus this margin) would end the read only 25 s
    // after the poll was sent; the stop must not wait for that.
    const client = new Client({ endpoints: [broker.url], fetch: ff.fetch, retry: { attempts: 1 }, longPollMarginMs: 5000 });
    try {
      const consumer = client.consume(topic, () => undefined, { leaseMs: 60_000, waitMs: 20_000 });
      await bodyRead.promise;
      const t0 = Date.now();
      const bound = new Promise<"late">((r) => setTimeout(() => r("late"), 15_000).unref());
      // (the stop itself is bounded by the body grace, 5 s after it began)
      const outcome = await Promise.race([consumer.stop().then(() => "stopped" as const), bound]);
      assert.equal(outcome, "stopped", "the stop waited on a stalled answer past its bound");
      assert.ok(Date.now() - t0 < 15_000);
    } finally {
      // Bounded: on a failure above the close would wait on the same stalled read.
      await Promise.race([client.close(), new Promise((r) => setTimeout(r, 1000).unref())]);
    }
  });
});
