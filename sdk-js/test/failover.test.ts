// Several endpoints: failover past a dead node, the per-node circuit breaker taking a
// node out of rotation and probing it back in, and how produce treats refused versus
// unknown outcomes (docs/sdk/contract.md).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, NaradError, UnavailableError, type NaradEvent } from "@narad/client";
import { faultyFetch, freePort, lostReply, startBroker, TcpProxy, topicName, waitFor, type TestBroker } from "./helpers.js";

let broker: TestBroker;

before(async () => {
  broker = await startBroker();
});

after(async () => {
  await broker?.stop();
});

function attemptsTo(events: NaradEvent[], url: string): number {
  return events.filter((e) => e.type === "attempt" && e.endpoint === url).length;
}

describe("failover", () => {
  it("serves every call through the live node when the other is dead, and takes the dead one out of rotation", async () => {
    const deadPort = await freePort(); // nothing listens here
    const dead = `http://127.0.0.1:${deadPort}`;
    const events: NaradEvent[] = [];
    const client = new Client({ endpoints: [dead, broker.url], onEvent: (e) => events.push(e), breaker: { probeIntervalMs: 60_000 } });
    const topic = topicName("f");
    await client.createTopic({ name: topic, partitions: 2 });
    for (let i = 0; i < 20; i++) await client.produce(topic, `m${i}`);
    const got = await client.receive(topic, { max: 20, waitMs: 2000 });
    assert.ok(got.length > 0);
    for (const m of got) await m.ack();
    assert.ok(events.some((e) => e.type === "breaker" && e.endpoint === dead && e.state === "open"));
    assert.equal(attemptsTo(events, dead), 2, "the dead node was tried twice (the breaker's default threshold), then skipped");
    const retried = events.filter((e) => e.type === "retry");
    assert.ok(retried.every((e) => e.type === "retry" && e.delayMs === 0), "a refused connection fails over at once");
    await client.close();
  });

  it("probes a node out of rotation and brings it back when it answers", async () => {
    const proxy = new TcpProxy(await freePort(), broker.port);
    await proxy.start();
    const events: NaradEvent[] = [];
    const client = new Client({ endpoints: [proxy.url, broker.url], onEvent: (e) => events.push(e), breaker: { probeIntervalMs: 100, maxProbeIntervalMs: 200 } });
    const topic = topicName("f");
    await client.createTopic({ name: topic, partitions: 1 });
    for (let i = 0; i < 4; i++) await client.produce(topic, "both");
    assert.ok(attemptsTo(events, proxy.url) >= 1, "both nodes serve while both are up");

    await proxy.stop();
    for (let i = 0; i < 6; i++) await client.produce(topic, "one down");
    await waitFor(() => events.some((e) => e.type === "breaker" && e.endpoint === proxy.url && e.state === "open"), "the breaker to open");
    const before = attemptsTo(events, proxy.url);
    for (let i = 0; i < 6; i++) await client.produce(topic, "skipping");
    assert.equal(attemptsTo(events, proxy.url), before, "no calls to a node out of rotation");

    await proxy.start();
    await waitFor(() => events.some((e) => e.type === "breaker" && e.endpoint === proxy.url && e.state === "closed"), "the probe to close the breaker");
    for (let i = 0; i < 4; i++) await client.produce(topic, "back");
    assert.ok(attemptsTo(events, proxy.url) > before, "the node is back in rotation");
    const d = await client.getTopic(topic);
    assert.equal(d.partitionStats[0]?.nextOffset, 20, "every produce stored exactly once");
    await client.close();
    await proxy.stop();
  });

  it("fails with a retryable Unavailable error when no node answers", async () => {
    const client = new Client({ endpoints: [`http://127.0.0.1:${await freePort()}`], retry: { attempts: 2, minBackoffMs: 1, maxBackoffMs: 5 } });
    const err = await client.listTopics().catch((e: unknown) => e);
    assert.ok(err instanceof UnavailableError, String(err));
    assert.equal(err.code, "connection_failed");
    assert.equal(err.retryable, true);
    assert.equal(err.uncertain, false, "a refused connection never reached the broker");
    await client.close();
  });
});

describe("produce outcomes", () => {
  it("retries a produce whose reply was lost when duplicates are allowed (the default)", async () => {
    const f = faultyFetch();
    let dropped = 0;
    f.rules.push(async (url, _init, real) => {
      if (url.pathname.endsWith("/produce") && dropped === 0) {
        dropped++;
        await (await real()).arrayBuffer();
        throw lostReply();
      }
      return undefined;
    });
    const client = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { minBackoffMs: 1 } });
    const topic = topicName("dup");
    await client.createTopic({ name: topic, partitions: 1 });
    const p = await client.produce(topic, "maybe twice");
    assert.equal(p.offset, 1, "the first copy was stored, the retry stored a second");
    await client.close();
  });

  it("reports an unknown outcome as uncertain instead of retrying when duplicates are not allowed", async () => {
    const f = faultyFetch();
    f.rules.push(async (url, _init, real) => {
      if (url.pathname.endsWith("/produce")) {
        await (await real()).arrayBuffer();
        throw lostReply();
      }
      return undefined;
    });
    const client = new Client({ endpoints: [broker.url], fetch: f.fetch, allowDuplicates: false });
    const topic = topicName("nodup");
    await client.createTopic({ name: topic, partitions: 1 });
    const err = await client.produce(topic, "once").catch((e: unknown) => e);
    assert.ok(err instanceof NaradError && err.uncertain && err.retryable, String(err));
    assert.equal(f.calls.filter((u) => u.pathname.endsWith("/produce")).length, 1, "not retried");
    const ok = await client.produce(topic, "allowed", { allowDuplicates: true }).catch((e: unknown) => e);
    assert.ok(ok instanceof NaradError && ok.uncertain, "every attempt lost its reply: still uncertain");
    await client.close();
  });

  it("fails over at once on a 503 and honours Retry-After when no node is left", async () => {
    const f = faultyFetch();
    let n = 0;
    f.rules.push((url) => {
      if (url.pathname.endsWith("/produce") && n++ < 2) {
        return Promise.resolve(new Response(JSON.stringify({ error: { code: "unavailable", message: "injected" } }), { status: 503, headers: { "retry-after": "1" } }));
      }
      return undefined;
    });
    const events: NaradEvent[] = [];
    const client = new Client({ endpoints: [broker.url], fetch: f.fetch, onEvent: (e) => events.push(e) });
    const topic = topicName("ra");
    await client.createTopic({ name: topic });
    const t0 = Date.now();
    await client.produce(topic, "after retry-after");
    const waited = Date.now() - t0;
    assert.ok(waited >= 1900, `waited ${waited} ms for two Retry-After: 1`);
    const delays = events.filter((e): e is Extract<NaradEvent, { type: "retry" }> => e.type === "retry").map((e) => e.delayMs);
    assert.equal(delays.length, 2);
    assert.ok(delays.every((d) => d >= 1000));
    await client.close();
  });
});
