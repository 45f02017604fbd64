// The opt-in envelope, retry tiers with a parking topic, and the OpenTelemetry adapter.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, Envelope, RetryTiers, type Message } from "@narad/client";
import { otelTracing, traceContext, contextFromEnvelope, type OtelApi, type OtelSpan } from "@narad/client/otel";
import { bytesEqual, startBroker, topicName, waitFor, type TestBroker } from "./helpers.js";

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

describe("envelope", () => {
  it("wraps bytes, text and JSON with a stable id, and plain messages are not envelopes", async () => {
    const topic = topicName("e");
    await client.createTopic({ name: topic, partitions: 1 });
    const bytes = new Uint8Array([0, 255, 128]);
    const envs = [
      Envelope.wrap(bytes, { headers: { h: "1" } }),
      Envelope.wrap("tëxt", { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }),
      Envelope.wrap({ a: [1, 2] }, { id: "fixed-id", attempt: 3 }),
    ];
    for (const e of envs) await client.produce(topic, e);
    await client.produce(topic, "plain");
    const range = await client.readMessages(topic, 0);
    const [b, t, j, plain] = range.messages.map((m) => m.envelope());
    assert.ok(b && bytesEqual(b.body, bytes) && b.bodyKind === "bytes" && b.headers["h"] === "1" && b.attempt === 1);
    assert.equal(b.id, envs[0]?.id);
    assert.ok(t && t.text() === "tëxt" && t.traceparent?.startsWith("00-0af7"));
    assert.ok(j && j.id === "fixed-id" && j.attempt === 3);
    assert.deepEqual(j.json(), { a: [1, 2] });
    assert.equal(plain, undefined);
    assert.throws(() => Envelope.wrap(envs[0] as Envelope), TypeError);
    const moved = j.with({ attempt: 4, lastError: "x" });
    assert.equal(moved.id, "fixed-id");
    assert.equal(moved.attempt, 4);
    assert.deepEqual(Envelope.decode(moved.toBody().bytes)?.json(), { a: [1, 2] });
  });
});

describe("retry tiers", () => {
  it("routes a failing message through each tier, then parks it; the id stays", async () => {
    const main = topicName("main");
    const tiers = new RetryTiers(client, {
      topic: main,
      tiers: [
        { topic: `${main}.retry1`, delayMs: 300 },
        { topic: `${main}.retry2`, delayMs: 600 },
      ],
      parkingTopic: `${main}.parking`,
    });
    await tiers.ensureTopics({ partitions: 1 });
    const seen: { attempt: number; at: number; id: string }[] = [];
    const { stop } = tiers.consume(
      ({ envelope }) => {
        seen.push({ attempt: envelope.attempt, at: Date.now(), id: envelope.id });
        if (envelope.json<{ ok?: boolean }>().ok) return;
        throw new Error(`fail #${envelope.attempt}`);
      },
      { waitMs: 300, concurrency: 2 },
    );
    await client.produce(main, Envelope.wrap({ ok: false }, { id: "order-1" }));
    const parked = await waitFor(async () => (await client.readMessages(`${main}.parking`, 0)).messages[0], "the parked message");
    const env = parked.envelope();
    assert.ok(env);
    assert.equal(env.id, "order-1");
    assert.equal(env.attempt, 3);
    assert.equal(env.lastError, "fail #3");
    assert.equal(env.origin, main);
    assert.deepEqual(
      seen.map((s) => s.attempt),
      [1, 2, 3],
    );
    assert.ok((seen[1]?.at as number) - (seen[0]?.at as number) >= 250, "tier 1 held it back");
    assert.ok((seen[2]?.at as number) - (seen[1]?.at as number) >= 550, "tier 2 held it back");
    assert.ok(seen.every((s) => s.id === "order-1"));

    // A plain (non-envelope) message that succeeds is never routed.
    await client.produce(main, { ok: true });
    await waitFor(() => seen.length === 4, "the plain message");
    await stop();
    for (const t of tiers.consumedTopics()) {
      const d = await client.getTopic(t);
      assert.equal(d.partitionStats[0]?.backlog, 0, `${t} is settled`);
    }
    assert.equal((await client.readMessages(`${main}.parking`, 0)).messages.length, 1);

    // route() on a plain message: the envelope keeps its kind and value, attempt 1 → tier 1.
    await client.produce(main, { plain: [1, 2] });
    await client.produce(main, new Uint8Array([0xff, 0]));
    const plain = (await client.readMessages(main, 0)).messages.slice(-2);
    const r1 = await tiers.route(plain[0] as Message, new Error("nope"));
    assert.equal(r1.topic, `${main}.retry1`);
    assert.equal(r1.envelope.bodyKind, "json");
    assert.deepEqual(r1.envelope.json(), { plain: [1, 2] });
    assert.equal(r1.envelope.attempt, 2);
    const r2 = await tiers.route(plain[1] as Message, "bad bytes");
    assert.equal(r2.envelope.bodyKind, "bytes");
    assert.ok(bytesEqual(r2.envelope.body, new Uint8Array([0xff, 0])));
    const stored = (await client.readMessages(`${main}.retry1`, 0)).messages.at(-1)?.envelope();
    assert.equal(stored?.lastError, "bad bytes");
    assert.equal(stored?.origin, main);
  });
});

describe("opentelemetry", () => {
  it("records a span per call with attempts, errors and the parent context", async () => {
    const spans: { name: string; attrs: Record<string, unknown>; events: string[]; status?: number; ended: boolean; parent: unknown }[] = [];
    const api: OtelApi = {
      context: { active: () => "ctx-1" },
      trace: {
        getTracer: () => ({
          startSpan: (name, options, parent) => {
            const rec = { name, attrs: { ...(options?.attributes ?? {}) } as Record<string, unknown>, events: [] as string[], ended: false, parent } as (typeof spans)[number];
            spans.push(rec);
            const span: OtelSpan = {
              setAttribute: (k, v) => (rec.attrs[k] = v),
              addEvent: (n) => rec.events.push(n),
              setStatus: (s) => (rec.status = s.code),
              recordException: () => undefined,
              end: () => (rec.ended = true),
              spanContext: () => ({ traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1 }),
            };
            return span;
          },
        }),
        getActiveSpan: () => undefined,
        setSpanContext: (ctx, sc) => ({ ctx, sc }),
      },
    };
    const traced = new Client({ endpoints: [broker.url], onEvent: await otelTracing({ api }) });
    const topic = topicName("o");
    await traced.createTopic({ name: topic, partitions: 1 });
    await traced.produce(topic, "x");
    await traced.getTopic(topicName("missing")).catch(() => undefined);
    await traced.close();
    const produce = spans.find((s) => s.name === "narad produce");
    assert.ok(produce?.ended && produce.parent === "ctx-1");
    assert.equal(produce.attrs["messaging.destination.name"], topic);
    assert.equal(produce.attrs["http.response.status_code"], 202);
    assert.deepEqual(produce.events, ["narad.attempt"]);
    const failed = spans.find((s) => s.name === "narad getTopic");
    assert.equal(failed?.status, 2);
    assert.equal(failed?.attrs["error.type"], "topic_not_found");

    const env = Envelope.wrap("t", { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" });
    const ctx = (await contextFromEnvelope(env, api)) as { sc: { traceId: string; isRemote: boolean } };
    assert.equal(ctx.sc.traceId, "0af7651916cd43dd8448eb211c80319c");
    assert.deepEqual(await traceContext(api), {});
  });

  it("loads @opentelemetry/api lazily when no api is given", async () => {
    const hook = await otelTracing();
    const c = new Client({ endpoints: [broker.url], onEvent: hook });
    assert.equal(await c.ready(), true); // the global no-op tracer: nothing breaks
    await c.close();
  });
});
