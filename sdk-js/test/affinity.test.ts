// Several endpoints that are NOT one cluster (two independent brokers): calls stick to
// the first healthy endpoint instead of rotating, a leased message is settled on the
// node that leased it, and the client says once that its endpoints are not one cluster.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, type Logger } from "@narad/client";
import { faultyFetch, freePort, startBroker, TcpProxy, topicName, waitFor, type TestBroker } from "./helpers.js";

let a: TestBroker;
let b: TestBroker;
let onA: Client;
let onB: Client;

before(async () => {
  [a, b] = await Promise.all([startBroker(), startBroker()]);
  onA = new Client({ endpoints: [a.url] });
  onB = new Client({ endpoints: [b.url] });
});

after(async () => {
  await onA?.close();
  await onB?.close();
  await Promise.all([a?.stop(), b?.stop()]);
});

/** newTopic creates the same topic on both independent brokers. */
async function newTopic(): Promise<string> {
  const topic = topicName("aff");
  await onA.createTopic({ name: topic, partitions: 2, visibilityTimeoutMs: 60_000 });
  await onB.createTopic({ name: topic, partitions: 2, visibilityTimeoutMs: 60_000 });
  return topic;
}

async function stored(c: Client, topic: string): Promise<number> {
  const d = await c.getTopic(topic);
  return d.partitionStats.reduce((n, p) => n + p.nextOffset, 0);
}

function refused(): Error {
  return new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
}

describe("endpoint affinity", () => {
  it("sends every ordinary call to the first healthy endpoint instead of rotating", async () => {
    const topic = await newTopic();
    const client = new Client({ endpoints: [a.url, b.url] });
    for (let i = 0; i < 10; i++) await client.produce(topic, `m${i}`);
    assert.equal(await stored(onA, topic), 10, "every produce went to the preferred node");
    assert.equal(await stored(onB, topic), 0, "nothing was split onto the other node");
    await client.close();
  });

  it("acks, extends and nacks a message on the node that leased it", async () => {
    const topic = await newTopic();
    for (let i = 0; i < 6; i++) await onB.produce(topic, `b${i}`);
    const ff = faultyFetch();
    // The preferred node refuses polls, so they fail over to b; everything else reaches a.
    ff.rules.push(async (url) => {
      if (url.origin === a.url && url.pathname.endsWith("/consume-batch")) throw refused();
      return undefined;
    });
    const client = new Client({ endpoints: [a.url, b.url], fetch: ff.fetch, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
    const got = await client.receive(topic, { max: 6, waitMs: 2000 });
    assert.equal(got.length, 6, "the poll failed over to b and took its messages");
    assert.ok(got.every((m) => m.endpoint === b.url), "each message remembers the node that leased it");
    const [first, second, ...rest] = got;
    await first!.extend({ leaseMs: 30_000 });
    await first!.ack();
    await second!.nack({ delayMs: 60_000 });
    for (const m of rest) await m.ack();
    const results = await client.ackBatch(topic, []);
    assert.deepEqual(results, []);
    // Nothing is left leased or ready on b (the nacked one waits out its delay).
    assert.deepEqual(await onB.receive(topic, { max: 10, waitMs: 0 }), []);
    const settles = ff.calls.filter((u) => u.pathname.endsWith("/ack"));
    assert.equal(settles.length, 7, "extend, ack, nack and four acks");
    assert.ok(settles.every((u) => u.origin === b.url), `every settle went to b: ${settles.map((u) => u.origin).join(" ")}`);
    await client.close();
  });

  it("splits an ack-batch by the node that leased each message", async () => {
    const topic = await newTopic();
    for (let i = 0; i < 3; i++) await onA.produce(topic, `a${i}`);
    for (let i = 0; i < 3; i++) await onB.produce(topic, `b${i}`);
    const fromA = await onA.receive(topic, { max: 3, waitMs: 2000 });
    const fromB = await onB.receive(topic, { max: 3, waitMs: 2000 });
    assert.equal(fromA.length + fromB.length, 6);
    const client = new Client({ endpoints: [a.url, b.url] });
    const mixed = [fromB[0]!, fromA[0]!, fromB[1]!, fromA[1]!, fromB[2]!, fromA[2]!];
    const results = await client.ackBatch(
      topic,
      mixed.map((m) => ({ receiptHandle: m.receiptHandle!, endpoint: m.endpoint! })),
    );
    assert.deepEqual(
      results.map((r) => [r.receiptHandle, r.status]),
      mixed.map((m) => [m.receiptHandle, 204]),
      "one result per entry, in order, each settled on its own node",
    );
    await client.close();
  });

  it("falls back to the other endpoints when the leasing node fails", async () => {
    const proxy = new TcpProxy(await freePort(), a.port);
    await proxy.start();
    const topic = await newTopic();
    await onA.produce(topic, "x");
    const client = new Client({ endpoints: [proxy.url, a.url], retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
    const [m] = await client.receive(topic, { waitMs: 2000 });
    assert.ok(m);
    assert.equal(m.endpoint, proxy.url);
    await proxy.stop(); // the leasing endpoint dies; the same node is still reachable directly
    await m.ack();
    assert.equal(m.state, "acked");
    await client.close();
  });
});

describe("one-cluster check", () => {
  function recorder(): { logger: Logger; warnings: string[] } {
    const warnings: string[] = [];
    return { logger: { warn: (msg) => warnings.push(msg) }, warnings };
  }

  it("warns once when the endpoints are independent nodes, and keeps working", async () => {
    const topic = await newTopic();
    const { logger, warnings } = recorder();
    const client = new Client({ endpoints: [a.url, b.url], logger });
    await client.produce(topic, "x");
    await waitFor(() => warnings.some((w) => w.includes("not one cluster")), "the not-one-cluster warning");
    for (let i = 0; i < 5; i++) await client.produce(topic, "y");
    await client.listTopics();
    assert.equal(warnings.filter((w) => w.includes("not one cluster")).length, 1, "warned exactly once");
    assert.equal(await client.transport.clusterCheck, false);
    await client.close();
  });

  it("does not warn when every endpoint is the same cluster", async () => {
    const proxy = new TcpProxy(await freePort(), a.port);
    await proxy.start();
    const { logger, warnings } = recorder();
    const client = new Client({ endpoints: [a.url, proxy.url], logger });
    await client.listTopics();
    assert.equal(await client.transport.clusterCheck, true, "the check found one cluster");
    assert.deepEqual(warnings.filter((w) => w.includes("cluster")), []);
    await client.close();
    await proxy.stop();
  });

  it("never fails a call when the check cannot run", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const { logger, warnings } = recorder();
    const client = new Client({ endpoints: [a.url, dead], logger });
    await client.listTopics();
    assert.equal(await client.transport.clusterCheck, undefined, "one answer cannot tell");
    assert.deepEqual(warnings.filter((w) => w.includes("cluster")), []);
    await client.close();
  });
});
