// The Client's request/response methods against a real broker: produce in every body
// form, batches with per-message results, receive, ack/nack/extend, ack-batch, replay
// reads, admin, cluster and health, the 501 surfaces, errors and cancellation; ack-batch
// confirmed through injected 503 entries and lost replies.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { randomBytes } from "node:crypto";

import {
  Client,
  ConflictError,
  LeaseLostError,
  NaradError,
  NotFoundError,
  ProduceBatchError,
  TooLargeError,
  BadRequestError,
  ClosedError,
  isRetryable,
  isUncertain,
  isNaradError,
  MAX_MESSAGE_BYTES,
  type Message,
} from "@narad/client";
import { bytesEqual, faultyFetch, hungServer, lostReply, startBroker, topicName, waitFor, type TestBroker } from "./helpers.js";

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

async function newTopic(settings: { partitions?: number; visibilityTimeoutMs?: number } = {}): Promise<string> {
  const name = topicName("c");
  await client.createTopic({ name, partitions: settings.partitions ?? 1, ...(settings.visibilityTimeoutMs ? { visibilityTimeoutMs: settings.visibilityTimeoutMs } : {}) });
  return name;
}

async function receiveOne(topic: string): Promise<Message> {
  const [m] = await client.receive(topic, { waitMs: 5000 });
  assert.ok(m, "expected a message");
  return m;
}

describe("produce and receive", () => {
  it("round-trips binary bodies byte for byte", async () => {
    const topic = await newTopic();
    const all = new Uint8Array(256).map((_, i) => i);
    const bodies = [all, new Uint8Array(0), new Uint8Array([0xff, 0xfe, 0x00, 0xc3, 0x28]), new Uint8Array(randomBytes(64 * 1024)), new Uint8Array(randomBytes(MAX_MESSAGE_BYTES))];
    for (const b of bodies) await client.produce(topic, b);
    for (const b of bodies) {
      const m = await receiveOne(topic);
      assert.ok(bytesEqual(m.body, b), `body of ${b.length} bytes came back different`);
      await m.ack();
    }
    // The same bytes through a batch, and a replay read.
    const batch = bodies.slice(0, 4).map((body) => ({ body }));
    const produced = await client.produceBatch(topic, batch);
    const range = await client.readMessages(topic, 0, { from: produced[0]?.offset ?? 0 });
    for (let i = 0; i < batch.length; i++) assert.ok(bytesEqual(range.messages[i]?.body ?? new Uint8Array([1]), bodies[i] as Uint8Array), `batch body ${i}`);
  });

  it("sends strings as text, other values as JSON, and honours key and partition", async () => {
    const topic = await newTopic({ partitions: 3 });
    const p1 = await client.produce(topic, "héllo wörld", { partition: 2 });
    assert.deepEqual(p1, { topic, partition: 2, offset: 0 });
    const obj = { a: 1, b: [true, null, "x"] };
    const p2 = await client.produce(topic, obj, { key: "user-7" });
    const p3 = await client.produce(topic, { other: true }, { key: "user-7" });
    assert.equal(p2.partition, p3.partition, "one key, one partition");
    await client.produce(topic, 42, { partition: 0 });
    await client.produce(topic, new Uint16Array([1, 2]).buffer, { partition: 0 });
    const got = await client.receive(topic, { max: 10, waitMs: 2000 });
    const more = got.length < 5 ? await client.receive(topic, { max: 10, waitMs: 2000 }) : [];
    const msgs = [...got, ...more];
    assert.equal(msgs.length, 5);
    const text = msgs.find((m) => m.partition === 2 && m.offset === 0);
    assert.equal(text?.text(), "héllo wörld");
    const keyed = msgs.filter((m) => m.key === "user-7").map((m) => m.json());
    assert.deepEqual(keyed, [obj, { other: true }]);
    assert.ok(msgs.some((m) => m.text() === "42"));
    assert.ok(msgs.some((m) => bytesEqual(m.body, new Uint8Array(new Uint16Array([1, 2]).buffer))));
    for (const m of msgs) {
      assert.equal(m.deliveryAttempt, 1);
      assert.ok(m.receiptHandle);
      assert.equal(m.topic, topic);
      assert.ok(m.timestamp > 0);
      await m.ack();
      assert.equal(m.state, "acked");
    }
  });

  it("an empty poll is an empty array", async () => {
    const topic = await newTopic();
    assert.deepEqual(await client.receive(topic, { waitMs: 0 }), []);
    assert.deepEqual(await client.receive(topic, { max: 5, waitMs: 100 }), []);
  });

  it("refuses a message over 1 MiB before sending it", async () => {
    const topic = await newTopic();
    await assert.rejects(client.produce(topic, new Uint8Array(MAX_MESSAGE_BYTES + 1)), (e: unknown) => e instanceof TooLargeError && e.code === "payload_too_large");
  });

  it("produceBatch reports one result per message and never hides a partial failure", async () => {
    const topic = await newTopic({ partitions: 2 });
    const ok = await client.produceBatch(topic, [{ body: "a", partition: 1 }, { body: { n: 2 }, key: "k" }, { body: new Uint8Array([9]) }]);
    assert.equal(ok.length, 3);
    assert.equal(ok[0]?.partition, 1);
    const err = await client.produceBatch(topic, [{ body: "fine" }, { body: new Uint8Array(MAX_MESSAGE_BYTES + 1) }, { body: "also fine" }]).then(
      () => assert.fail("expected a ProduceBatchError"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ProduceBatchError);
    assert.equal(err.results.length, 3);
    assert.equal(err.results[0]?.ok, true);
    assert.equal(err.results[1]?.ok, false);
    assert.equal(err.results[2]?.ok, true);
    assert.equal(err.kind, "TooLarge");
    const results = await client.produceBatchResults(topicName("missing"), [{ body: "x" }]);
    assert.equal(results[0]?.ok, false);
    assert.ok(!results[0]?.ok && results[0].error instanceof NotFoundError);
    assert.deepEqual(await client.produceBatch(topic, []), []);
  });

  it("splits batches over 1000 messages", async () => {
    const topic = await newTopic();
    const msgs = Array.from({ length: 1500 }, (_, i) => ({ body: { i } }));
    const res = await client.produceBatch(topic, msgs);
    assert.equal(res.length, 1500);
    assert.deepEqual(
      res.map((r) => r.offset),
      msgs.map((_, i) => i),
    );
  });
});

describe("settling", () => {
  it("ack settles, a second ack is LeaseLost, nack redelivers, extend keeps the lease", async () => {
    const topic = await newTopic({ visibilityTimeoutMs: 60_000 });
    await client.produce(topic, "one");
    const m = await receiveOne(topic);
    await m.extend({ leaseMs: 30_000 });
    await m.extend();
    await m.ack();
    await assert.rejects(client.ack(topic, m.receiptHandle as string), (e: unknown) => e instanceof LeaseLostError && e.status === 410 && !e.retryable);

    await client.produce(topic, "two");
    const a = await receiveOne(topic);
    await a.nack();
    assert.equal(a.state, "nacked");
    const b = await receiveOne(topic);
    assert.equal(b.text(), "two");
    assert.equal(b.deliveryAttempt, 2);
    await assert.rejects(a.ack(), LeaseLostError);
    await b.ack();
  });

  it("nack with a delay holds the message back", async () => {
    const topic = await newTopic();
    await client.produce(topic, "later");
    const m = await receiveOne(topic);
    const t0 = Date.now();
    await m.nack({ delayMs: 1200 });
    assert.deepEqual(await client.receive(topic, { waitMs: 300 }), []);
    const again = await waitFor(async () => (await client.receive(topic, { waitMs: 2000 }))[0], "the delayed redelivery");
    assert.ok(Date.now() - t0 >= 1100, `redelivered after ${Date.now() - t0} ms`);
    await again.ack();
  });

  it("ackBatch gives one result per entry", async () => {
    const topic = await newTopic();
    await client.produceBatch(topic, [{ body: "1" }, { body: "2" }, { body: "3" }]);
    const got = await client.receive(topic, { max: 3, waitMs: 2000 });
    assert.equal(got.length, 3);
    const [x, y, z] = got as [Message, Message, Message];
    await x.ack();
    const res = await client.ackBatch(topic, [
      { receiptHandle: x.receiptHandle as string },
      { receiptHandle: y.receiptHandle as string, extend: 20_000 },
      { receiptHandle: z.receiptHandle as string },
      { receiptHandle: y.receiptHandle as string, extend: true },
      { receiptHandle: "bogus" },
    ]);
    assert.deepEqual(
      res.map((r) => r.status),
      [410, 204, 204, 204, 400],
    );
    assert.ok(res[0]?.error instanceof LeaseLostError);
    assert.ok(res[4]?.error instanceof BadRequestError);
    assert.equal(res[1]?.ok, true);
    const hb = await client.ackBatch(topic, [{ receiptHandle: y.receiptHandle as string, extend: 0 }]);
    assert.equal(hb[0]?.status, 204);
    const back = await receiveOne(topic);
    assert.equal(back.text(), "2");
    await back.ack();
  });

  it("ackBatch counts a 410 on a retry whose first reply was lost as acked", async () => {
    const topic = await newTopic();
    await client.produceBatch(topic, [{ body: "1" }, { body: "2" }]);
    const got = await client.receive(topic, { max: 2, waitMs: 2000 });
    assert.equal(got.length, 2);
    const f = faultyFetch();
    let dropped = 0;
    f.rules.push(async (url, _init, real) => {
      if (url.pathname.endsWith("/ack-batch") && dropped === 0) {
        dropped++;
        await (await real()).arrayBuffer(); // the broker settles both...
        throw lostReply(); // ...but the reply never arrives
      }
      return undefined;
    });
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
    const res = await c2.ackBatch(topic, got.map((m) => ({ receiptHandle: m.receiptHandle as string })));
    await c2.close();
    assert.equal(f.calls.filter((u) => u.pathname.endsWith("/ack-batch")).length, 2, "resent once");
    assert.deepEqual(
      res.map((r) => [r.ok, r.status]),
      [
        [true, 204],
        [true, 204],
      ],
      "the retry's 410s mean the first attempt settled them",
    );
    assert.deepEqual(await client.receive(topic, { waitMs: 0 }), [], "settled");
  });

  it("ackBatch resends the entries answered 503 until they are confirmed", async () => {
    const topic = await newTopic();
    await client.produceBatch(topic, [{ body: "1" }, { body: "2" }]);
    const got = await client.receive(topic, { max: 2, waitMs: 2000 });
    assert.equal(got.length, 2);
    const [x, y] = got as [Message, Message];
    const f = faultyFetch();
    const sent: string[][] = [];
    f.rules.push(async (url, init) => {
      if (!url.pathname.endsWith("/ack-batch")) return undefined;
      const acks = (JSON.parse(new TextDecoder().decode(init?.body as Uint8Array)) as { acks: { receipt_handle: string }[] }).acks;
      sent.push(acks.map((a) => a.receipt_handle));
      if (sent.length > 1) return undefined;
      // The first round: y's partition is electing a leader (nothing done); x goes through.
      const results = [
        { receipt_handle: x.receiptHandle, status: 204 },
        { receipt_handle: y.receiptHandle, status: 503, error: { code: "unavailable", message: "electing" } },
      ];
      await client.ack(topic, x.receiptHandle as string);
      return new Response(JSON.stringify({ results }), { status: 200, headers: { "content-type": "application/json" } });
    });
    const c2 = new Client({ endpoints: [broker.url], fetch: f.fetch });
    const res = await c2.ackBatch(topic, [{ receiptHandle: x.receiptHandle as string }, { receiptHandle: y.receiptHandle as string }]);
    await c2.close();
    assert.deepEqual(sent, [[x.receiptHandle, y.receiptHandle], [y.receiptHandle]], "only the 503 entry was resent");
    assert.deepEqual(
      res.map((r) => [r.ok, r.status]),
      [
        [true, 204],
        [true, 204],
      ],
    );
    assert.deepEqual(await client.receive(topic, { waitMs: 0 }), [], "both settled");
  });

  it("messages() yields leased messages and hands back unreached ones on break", async () => {
    const topic = await newTopic();
    await client.produceBatch(topic, [{ body: "m1" }, { body: "m2" }, { body: "m3" }]);
    const seen: string[] = [];
    for await (const m of client.messages(topic, { waitMs: 2000, batchSize: 3 })) {
      seen.push(m.text());
      await m.ack();
      break; // m2 and m3 were fetched with m1: they must be handed back at once
    }
    assert.deepEqual(seen, ["m1"]);
    const rest = await client.receive(topic, { max: 5, waitMs: 2000 });
    assert.deepEqual(rest.map((m) => m.text()).sort(), ["m2", "m3"]);
    for (const m of rest) await m.ack();

    const ctl = new AbortController();
    const it2 = client.messages(topic, { waitMs: 20_000, signal: ctl.signal });
    const next = it2.next();
    setTimeout(() => ctl.abort(), 100);
    await assert.rejects(next, { name: "AbortError" });
  });
});

describe("replay reads", () => {
  it("readMessages reads ranges by offset and time; readMessage reads one", async () => {
    const topic = await newTopic();
    const produced = await client.produceBatch(topic, [{ body: "r0" }, { body: "r1" }, { body: "r2" }]);
    const all = await client.readMessages(topic, 0);
    assert.deepEqual(
      all.messages.map((m) => m.text()),
      ["r0", "r1", "r2"],
    );
    assert.equal(all.nextOffset, 3);
    assert.equal(all.messages[0]?.receiptHandle, undefined);
    assert.equal(all.messages[0]?.state, "replayed");
    await assert.rejects((all.messages[0] as Message).ack(), TypeError);
    const page = await client.readMessages(topic, 0, { from: 1, max: 1 });
    assert.deepEqual(
      page.messages.map((m) => m.text()),
      ["r1"],
    );
    assert.equal(page.nextOffset, 2);
    // The answer names the topic's incarnation; a read naming another one is refused.
    const { incarnation } = await client.getTopic(topic);
    assert.equal(all.incarnation, incarnation);
    assert.deepEqual(all.damaged, []);
    assert.equal((await client.readMessages(topic, 0, { from: 1, incarnation })).messages.length, 2);
    await assert.rejects(
      client.readMessages(topic, 0, { incarnation: `${incarnation}1` }),
      (e: unknown) => e instanceof ConflictError && e.code === "incarnation_mismatch" && !e.retryable,
    );
    const ts = all.messages[2]?.timestamp as number;
    const byTime = await client.readMessages(topic, 0, { fromTime: new Date(ts) });
    assert.ok(byTime.messages.length >= 1 && byTime.messages.every((m) => m.timestamp >= ts));
    const one = await client.readMessage(topic, 0, produced[1]?.offset as number);
    assert.equal(one?.text(), "r1");
    assert.equal(await client.readMessage(topic, 0, 99), undefined);
    // Replay reads reserve nothing.
    assert.equal((await client.receive(topic, { max: 3, waitMs: 1000 })).length, 3);
  });
});

describe("topics, cluster and health", () => {
  it("creates, inspects, lists, alters and deletes topics", async () => {
    const name = topicName("admin");
    const t = await client.createTopic({ name, partitions: 2, retentionMs: 3_600_000, visibilityTimeoutMs: 5000, maxInFlightPerPartition: 10, maxAckedAheadPerPartition: 20 });
    assert.equal(t.name, name);
    assert.equal(t.partitions, 2);
    assert.equal(t.visibilityTimeoutMs, 5000);
    assert.ok(t.createdAt instanceof Date && !Number.isNaN(t.createdAt.getTime()));
    await assert.rejects(client.createTopic({ name }), (e: unknown) => e instanceof ConflictError && e.code === "topic_exists" && e.status === 409);
    const same = await client.ensureTopic({ name, partitions: 5 });
    assert.equal(same.partitions, 2);
    await client.produce(name, "x", { partition: 1 });
    const d = await client.getTopic(name);
    assert.equal(d.partitionStats.length, 2);
    assert.equal(d.partitionStats[1]?.nextOffset, 1);
    assert.equal(d.partitionStats[1]?.backlog, 1);
    assert.equal(d.partitionStats[1]?.available, true);
    assert.ok((await client.listTopics()).some((x) => x.name === name));
    const altered = await client.alterTopic(name, { visibilityTimeoutMs: 7000, retentionMs: 7_200_000 });
    assert.equal(altered.visibilityTimeoutMs, 7000);
    assert.equal(altered.retentionMs, 7_200_000);
    await client.deleteTopic(name);
    await assert.rejects(client.getTopic(name), (e: unknown) => e instanceof NotFoundError && e.code === "topic_not_found");
    await assert.rejects(client.createTopic({ name: "bad name!" }), (e: unknown) => e instanceof BadRequestError && !e.retryable);
  });

  it("deleteTopic naming an old incarnation is a Conflict and deletes nothing; naming the current one deletes", async () => {
    const name = topicName("inc");
    const first = (await client.createTopic({ name })).incarnation;
    assert.equal(typeof first, "string");
    assert.equal((await client.getTopic(name)).incarnation, first);
    await client.deleteTopic(name, { incarnation: first });
    const second = (await client.createTopic({ name })).incarnation;
    assert.notEqual(second, first, "a topic created again has a new incarnation");
    const err = await client.deleteTopic(name, { incarnation: first }).catch((e: unknown) => e);
    assert.ok(err instanceof ConflictError, String(err));
    assert.equal(err.kind, "Conflict");
    assert.equal(err.code, "incarnation_mismatch");
    assert.equal(err.status, 409);
    assert.equal(err.retryable, false);
    assert.equal(err.uncertain, false);
    assert.equal((await client.getTopic(name)).incarnation, second, "the topic created again is still there");
    await client.deleteTopic(name, { incarnation: second });
    await assert.rejects(client.getTopic(name), (e: unknown) => e instanceof NotFoundError && e.code === "topic_not_found");
    await assert.rejects(client.deleteTopic(name, { incarnation: second }), (e: unknown) => e instanceof NotFoundError && !e.uncertain);
  });

  it("deleteTopic sends the incarnation as a query parameter, encoded, and none without it", async () => {
    const urls: URL[] = [];
    const stub = (async (input: string | URL | Request) => {
      urls.push(new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url));
      return new Response(null, { status: 204 });
    }) as typeof fetch;
    const c = new Client({ endpoints: "http://127.0.0.1:9", fetch: stub });
    await c.deleteTopic("a.b_c-1", { incarnation: "42" });
    await c.deleteTopic("a.b_c-1");
    await c.deleteTopic("t", { incarnation: "1 2&x=3" });
    await c.close();
    assert.equal(urls.length, 3);
    assert.equal(urls[0]?.pathname, "/v1/topics/a.b_c-1");
    assert.equal(urls[0]?.search, "?incarnation=42");
    assert.equal(urls[1]?.search, "", "no incarnation, no query");
    assert.equal(urls[2]?.searchParams.get("incarnation"), "1 2&x=3", "encoded as one parameter");
    assert.deepEqual([...(urls[2]?.searchParams.keys() ?? [])], ["incarnation"]);
  });

  it("deleteTopic with an incarnation is resent after a lost reply and cannot delete the topic created meanwhile", async () => {
    const name = topicName("inc-lost");
    const first = (await client.createTopic({ name })).incarnation;
    let second: string | undefined;
    const f = faultyFetch();
    f.rules.push(async (_url, init, real) => {
      if (init?.method === "DELETE" && second === undefined) {
        await (await real()).arrayBuffer(); // the broker deletes the topic...
        second = (await client.createTopic({ name })).incarnation; // ...someone creates it again...
        throw lostReply(); // ...and the delete's reply never arrives
      }
      return undefined;
    });
    const c = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
    const err = await c.deleteTopic(name, { incarnation: first }).catch((e: unknown) => e);
    await c.close();
    const deletes = f.calls.filter((u) => u.pathname === `/v1/topics/${name}`);
    assert.equal(deletes.length, 2, "resent once");
    for (const u of deletes) assert.equal(u.searchParams.get("incarnation"), first);
    assert.ok(err instanceof ConflictError, String(err));
    assert.equal(err.code, "incarnation_mismatch");
    assert.equal(err.uncertain, true, "the lost attempt may have deleted it");
    assert.ok(second !== undefined && second !== first);
    assert.equal((await client.getTopic(name)).incarnation, second, "the topic created meanwhile stays");
    await client.deleteTopic(name);
  });

  it("deleteTopic without an incarnation is not resent after a lost reply", async () => {
    const name = topicName("lost");
    await client.createTopic({ name });
    const f = faultyFetch();
    let dropped = 0;
    f.rules.push(async (_url, init, real) => {
      if (init?.method === "DELETE" && dropped++ === 0) {
        await (await real()).arrayBuffer();
        throw lostReply();
      }
      return undefined;
    });
    const c = new Client({ endpoints: [broker.url], fetch: f.fetch, retry: { minBackoffMs: 1, maxBackoffMs: 5 } });
    const err = await c.deleteTopic(name).catch((e: unknown) => e);
    await c.close();
    assert.equal(dropped, 1, "sent once");
    assert.ok(err instanceof NaradError && err.uncertain, String(err));
    await assert.rejects(client.getTopic(name), NotFoundError);
  });

  it("reads the cluster, members, readiness and metrics", async () => {
    const c = await client.getCluster();
    assert.ok(c.nodeId);
    assert.equal(c.members.length, 1);
    assert.equal((await client.listMembers())[0]?.status, "alive");
    assert.equal(await client.ready(), true);
    assert.match(await client.metrics(), /narad_/);
  });

});

describe("fan-out and delay children", () => {
  it("attaches, copies, lists with lag and detaches a fan-out child", async () => {
    const parent = await newTopic();
    const child = await newTopic();
    const info = await client.attachChild(parent, child);
    assert.equal(info.child, child);
    assert.equal(info.fanoutDelayMs, 0);
    assert.equal(info.state, "running");
    assert.equal(info.pausedReason, undefined);
    await client.produce(parent, "fan me out", { key: "k1" });
    const copy = await waitFor(async () => (await client.receive(child, { waitMs: 1000 }))[0], "the copy in the child");
    assert.equal(copy.text(), "fan me out");
    assert.equal(copy.key, "k1");
    await copy.ack();
    const parentMsg = await receiveOne(parent);
    assert.equal(parentMsg.text(), "fan me out", "the parent keeps its own copy");
    await parentMsg.ack();
    const listed = await waitFor(async () => {
      const cs = await client.listChildren(parent);
      return cs.find((c) => c.child === child && c.lag.every((l) => l.lag === 0)) ;
    }, "the child's lag to reach 0");
    assert.equal(listed.lag.length, 1);
    assert.equal(listed.lag[0]?.parentNextOffset, 1);
    assert.equal(listed.lag[0]?.childCursor, 1);
    await assert.rejects(client.attachChild(parent, child), (e: unknown) => e instanceof ConflictError);
    await client.detachChild(parent, child);
    assert.deepEqual(await client.listChildren(parent), []);
    await assert.rejects(client.detachChild(parent, child), (e: unknown) => e instanceof NotFoundError && e.code === "child_not_found");
  });

  it("creates children with their parent, and a delay child holds copies back", async () => {
    const parent = await newTopic();
    const fan = topicName("fan");
    const created = await client.createChild(parent, fan, { partitions: 1 });
    assert.equal(created.parent, parent);
    const delayed = topicName("delay");
    const d = await client.createDelayChild(parent, delayed, 1500, { partitions: 1 });
    assert.equal(d.parent, parent);
    assert.equal(d.fanoutDelayMs, 1500);
    const t0 = Date.now();
    await client.produce(parent, { order: 1 });
    const fast = await waitFor(async () => (await client.receive(fan, { waitMs: 1000 }))[0], "the fan-out copy");
    assert.deepEqual(fast.json(), { order: 1 });
    await fast.ack();
    const late = await waitFor(async () => (await client.receive(delayed, { waitMs: 1000 }))[0], "the delayed copy");
    assert.ok(Date.now() - t0 >= 1400, `the delayed copy came after ${Date.now() - t0} ms`);
    assert.deepEqual(late.json(), { order: 1 });
    await late.ack();
    await assert.rejects(client.produce(delayed, "direct"), (e: unknown) => e instanceof ConflictError, "no producing into a delay child");
    const names = (await client.listChildren(parent)).map((c) => c.child).sort();
    assert.deepEqual(names, [delayed, fan].sort());
  });
});

describe("schemas", () => {
  it("refuses payloads that break the topic's schema, and alters or removes it", async () => {
    const name = topicName("schema");
    const schema = { type: "object", required: ["id"], properties: { id: { type: "integer" } } };
    const t = await client.createTopic({ name, partitions: 1, schema });
    assert.deepEqual(t.schema, schema);
    await client.produce(name, { id: 1 });
    const err = await client.produce(name, { id: "x" }).catch((e: unknown) => e);
    assert.ok(err instanceof BadRequestError && err.code === "schema_violation", String(err));
    const batch = await client.produceBatchResults(name, [{ body: { id: 2 } }, { body: { nope: true } }]);
    assert.ok(batch.every((r) => !r.ok), "an invalid batch is refused whole");
    const removed = await client.alterTopic(name, { schema: null });
    assert.equal(removed.schema, null);
    await client.produce(name, "anything now");
  });
});

describe("errors, cancellation and lifecycle", () => {
  it("maps errors to the taxonomy with code, status, retryable and uncertain", async () => {
    const err = await client.getTopic(topicName("nope")).catch((e: unknown) => e);
    assert.ok(err instanceof NaradError && err instanceof NotFoundError);
    assert.equal(err.kind, "NotFound");
    assert.equal(err.name, "NotFoundError");
    assert.equal(err.status, 404);
    assert.equal(err.code, "topic_not_found");
    assert.equal(err.retryable, false);
    assert.equal(err.uncertain, false);
    assert.ok(isNaradError(err, "NotFound") && !isRetryable(err) && !isUncertain(err));
    assert.match(err.message, /no such topic/);
  });

  it("an AbortSignal cancels a long poll at once", async () => {
    const topic = await newTopic();
    const ctl = new AbortController();
    const t0 = Date.now();
    const p = client.receive(topic, { waitMs: 20_000, signal: ctl.signal });
    setTimeout(() => ctl.abort(), 100);
    await assert.rejects(p, { name: "AbortError" });
    assert.ok(Date.now() - t0 < 5000);
  });

  it("a call whose every attempt times out ends with a retryable Timeout error", async () => {
    const hung = await hungServer();
    const c = new Client({ endpoints: hung.url, timeoutMs: 200, retry: { attempts: 2, minBackoffMs: 1, maxBackoffMs: 5 } });
    const t0 = Date.now();
    const err = await c.listTopics().catch((e: unknown) => e);
    assert.ok(err instanceof NaradError && err.kind === "Timeout", String(err));
    assert.equal(err.retryable, true);
    assert.equal(err.uncertain, false, "a read changes nothing");
    assert.ok(Date.now() - t0 >= 400, "each of the two attempts had its own 200 ms");
    await c.close();
    await hung.close();
  });

  it("a long poll's attempt may take its wait plus the request timeout", async () => {
    const topic = await newTopic();
    const c = new Client({ endpoints: broker.url, timeoutMs: 300 });
    const t0 = Date.now();
    assert.deepEqual(await c.receive(topic, { waitMs: 1000 }), []);
    assert.ok(Date.now() - t0 >= 900);
    await c.close();
  });

  it("await using closes the client; later calls fail with Closed; closing twice is harmless", async () => {
    let outer: Client | undefined;
    {
      await using c = new Client({ endpoints: [broker.url] });
      outer = c;
      assert.equal(await c.ready(), true);
    }
    await assert.rejects(outer.listTopics(), (e: unknown) => e instanceof ClosedError && e.kind === "Closed");
    assert.throws(() => outer.publisher("x"), ClosedError);
    await outer.close();
    await outer.close();
  });

  it("validates its options", () => {
    assert.throws(() => new Client({ endpoints: [] }), TypeError);
    assert.throws(() => new Client({ endpoints: "ftp://x" }), TypeError);
  });
});
