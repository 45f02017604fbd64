// Several endpoints: failover past a dead node, the per-node circuit breaker taking a
// node out of rotation and probing it back in, Retry-After honoured per node across
// failover, and how produce treats refused, unknown and partly stored outcomes
// (docs/sdk/contract.md).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, NaradError, ProduceBatchError, UnavailableError, type NaradEvent } from "@narad/client";
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

  it("does not go back to a node before the Retry-After it named, failing over meanwhile", async () => {
    const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
      new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
    const aTimes: number[] = [];
    const f = (async (input: string | URL | Request) => {
      const url = new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url);
      if (url.pathname === "/v1/cluster") return json(404, { error: { code: "not_found", message: "x" } });
      if (url.port === "1") {
        aTimes.push(Date.now());
        if (aTimes.length === 1) return json(503, { error: { code: "unavailable", message: "starting" } }, { "retry-after": "1" });
        return json(202, { topic: "t", partition: 0, offset: 1 });
      }
      return json(503, { error: { code: "in_flight_full", message: "full" } });
    }) as typeof fetch;
    const client = new Client({ endpoints: ["http://127.0.0.1:1", "http://127.0.0.1:2"], fetch: f, retry: { attempts: 6, minBackoffMs: 1, maxBackoffMs: 10 } });
    const p = await client.produce("t", "x");
    await client.close();
    assert.equal(p.offset, 1, "stored by node A once its Retry-After had passed");
    assert.equal(aTimes.length, 2);
    const gap = (aTimes[1] as number) - (aTimes[0] as number);
    assert.ok(gap >= 990, `node A asked for Retry-After: 1 and got the retry ${gap} ms later`);
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

  it("reports a 504 from a proxy as an uncertain Timeout, not resent when duplicates are not allowed", async () => {
    const f = faultyFetch();
    f.rules.push(async (url, _init, real) => {
      if (url.pathname.endsWith("/produce")) {
        await (await real()).arrayBuffer(); // the broker stored it; the proxy gave up waiting
        return new Response("<html>504 Gateway Time-out</html>", { status: 504 });
      }
      return undefined;
    });
    const client = new Client({ endpoints: [broker.url], fetch: f.fetch, allowDuplicates: false });
    const topic = topicName("gw");
    await client.createTopic({ name: topic, partitions: 1 });
    const err = await client.produce(topic, "once").catch((e: unknown) => e);
    assert.ok(err instanceof NaradError && err.kind === "Timeout", String(err));
    assert.equal(err.uncertain, true, "the proxy timed out waiting: the produce may be stored");
    assert.equal(err.retryable, true);
    assert.equal(f.calls.filter((u) => u.pathname.endsWith("/produce")).length, 1, "not resent");
    assert.equal((await client.getTopic(topic)).partitionStats[0]?.nextOffset, 1, "stored once");
    await client.close();
  });

  it("reports a proxy's 502 (or a 503 without the broker's error) on produce as uncertain, not resent when duplicates are not allowed", async () => {
    // A 502, or a 503 without the broker's error body, is a proxy's answer: the proxy may
    // have sent the produce on and lost the broker's reply (nginx's "upstream prematurely
    // closed connection"), so the message may be stored. The old code took it for a
    // refusal that stored nothing and failed over at once, storing the message twice.
    const cases: [number, string][] = [
      [502, "<html><body>502 Bad Gateway</body></html>"],
      [502, JSON.stringify({ error: { code: "unavailable", message: "upstream reset" } })],
      [503, "upstream connect error or disconnect/reset before headers"],
    ];
    for (const [status, text] of cases) {
      const f = faultyFetch();
      let proxied = 0;
      f.rules.push(async (url, _init, real) => {
        if (url.pathname.endsWith("/produce") && proxied++ === 0) {
          await (await real()).arrayBuffer(); // the broker stored it; the proxy lost the reply
          return new Response(text, { status });
        }
        return undefined;
      });
      const client = new Client({ endpoints: [broker.url], fetch: f.fetch, allowDuplicates: false, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
      const topic = topicName("bg");
      await client.createTopic({ name: topic, partitions: 1 });
      const err = await client.produce(topic, "once").catch((e: unknown) => e);
      assert.ok(err instanceof NaradError, `${status} ${text}: ${String(err)}`);
      assert.equal(err.uncertain, true, `${status} ${text}: the proxy may have lost the broker's reply`);
      assert.equal(err.retryable, true);
      assert.equal(f.calls.filter((u) => u.pathname.endsWith("/produce")).length, 1, `${status} ${text}: not resent`);
      assert.equal((await client.getTopic(topic)).partitionStats[0]?.nextOffset, 1, "stored once");
      await client.close();
    }
  });

  it("never resends a partly stored produce-batch, and reports what was stored", async () => {
    const cases: [boolean, string][] = [
      [true, "storage_failed"],
      [false, "storage_failed"],
      [true, "timeout"], // the failed partitions' messages may or may not be stored
    ];
    for (const [allowDuplicates, code] of cases) {
      const f = faultyFetch();
      f.rules.push((url) => {
        if (!url.pathname.endsWith("/produce-batch")) return undefined;
        const error = {
          code,
          message: "a disk write failed and only part of the batch was stored",
          partly_stored: { stored: 1, failed_partitions: [1] },
        };
        return Promise.resolve(new Response(JSON.stringify({ error }), { status: 503, headers: { "content-type": "application/json", "retry-after": "0" } }));
      });
      const client = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
      const res = await client.produceBatchResults("t", [{ body: "a", partition: 0 }, { body: "b", partition: 1 }], { allowDuplicates });
      assert.equal(f.calls.filter((u) => u.pathname.endsWith("/produce-batch")).length, 1, `${code}, allowDuplicates ${allowDuplicates}: sent once, not resent`);
      for (const r of res) {
        assert.ok(!r.ok);
        assert.deepEqual(r.error.partlyStored, { stored: 1, failedPartitions: [1] });
        assert.equal(r.error.retryable, false, "a resend would store the stored part twice");
        assert.equal(r.error.uncertain, true, "part of it took effect");
        assert.equal(r.error.code, code);
        assert.match(r.error.message, /only part of the batch was stored: 1 message\(s\) were stored/);
        assert.match(r.error.message, code === "timeout" ? /partition\(s\) 1 may or may not be stored/ : /partition\(s\) 1 were not stored/);
      }
      const err = await client.produceBatch("t", [{ body: "a" }], { allowDuplicates }).catch((e: unknown) => e);
      assert.ok(err instanceof ProduceBatchError && err.partlyStored?.stored === 1, String(err));
      await client.close();
    }
  });

  it("flags a produceBatch error for the whole call: part of it stored is uncertain and not retryable", async () => {
    // 1500 messages go in two requests; the second fails with a 503 that stored nothing.
    // The first 1000 are stored, so the call took effect: its error must not say
    // "retryable, certain", which invites sending the whole batch again and storing
    // those 1000 twice (also without duplicates). The old error took the first
    // failure's flags: retryable, not uncertain.
    const f = faultyFetch();
    let n = 0;
    f.rules.push((url) => {
      if (url.pathname.endsWith("/produce-batch") && ++n === 2) {
        return Promise.resolve(new Response(JSON.stringify({ error: { code: "unavailable", message: "injected" } }), { status: 503 }));
      }
      return undefined;
    });
    const client = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { attempts: 1 } });
    const topic = topicName("chunks");
    await client.createTopic({ name: topic, partitions: 1 });
    const msgs = Array.from({ length: 1500 }, () => ({ body: "m" }));
    const err = await client.produceBatch(topic, msgs, { allowDuplicates: false }).catch((e: unknown) => e);
    assert.ok(err instanceof ProduceBatchError, String(err));
    assert.equal(err.results[0]?.ok, true);
    const last = err.results[1499];
    assert.ok(last && !last.ok && last.error.retryable && !last.error.uncertain, "the failed request's own error stays as it was");
    assert.equal(err.retryable, false, "1000 of the batch are stored: sending it again whole stores them twice");
    assert.equal(err.uncertain, true, "the call took effect in part");
    await client.close();
  });

  it("reports a 202 whose body cannot be read as uncertain, never as not stored", async () => {
    // A 202 says the message is stored; an unreadable body (a broken proxy, a bug) does
    // not say where, but the error must not say it was not stored. A short result list
    // already was uncertain; a body that is not JSON was a certain InternalError.
    const f = faultyFetch();
    f.rules.push(async (url, _init, real) => {
      if (!url.pathname.endsWith("/produce")) return undefined;
      await (await real()).arrayBuffer();
      return new Response("<html>stored, but not JSON</html>", { status: 202 });
    });
    const client = new Client({ endpoints: [broker.url], fetch: f.fetch, allowDuplicates: false });
    const topic = topicName("unread");
    await client.createTopic({ name: topic, partitions: 1 });
    const err = await client.produce(topic, "x").catch((e: unknown) => e);
    assert.ok(err instanceof NaradError, String(err));
    assert.equal(err.uncertain, true, "answered 202: it may well be stored");
    assert.equal(err.retryable, false);
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
