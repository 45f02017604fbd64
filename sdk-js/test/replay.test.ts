// Replay as an AsyncIterable: from a Position (earliest, offsets, time, latest),
// bounded or following, one partition or all, and resumable; and how it meets an
// unavailable partition, a page past its end, a shorter log, another incarnation of
// the topic, damaged messages and 503s (the CB-REPLAY rules of docs/sdk/contract.md).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, ConflictError, Position, UnavailableError, type Message, type NaradEvent } from "@narad/client";
import { faultyFetch, startBroker, topicName, waitFor, type FaultRule, type TestBroker } from "./helpers.js";

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

async function filled(n: number, partitions = 3): Promise<string> {
  const topic = topicName("r");
  await client.createTopic({ name: topic, partitions });
  await client.produceBatch(
    topic,
    Array.from({ length: n }, (_, i) => ({ body: { i }, partition: i % partitions })),
  );
  return topic;
}

function ids(ms: Message[]): number[] {
  return ms.map((m) => m.json<{ i: number }>().i);
}

describe("replay", () => {
  it("reads every partition from the earliest, in log order per partition, and stops at the end", async () => {
    const topic = await filled(30);
    const got: Message[] = [];
    for await (const m of client.replay(topic, { pageSize: 4 })) got.push(m);
    assert.equal(got.length, 30);
    assert.deepEqual(ids(got).sort((a, b) => a - b), Array.from({ length: 30 }, (_, i) => i));
    for (const p of [0, 1, 2]) {
      const offs = got.filter((m) => m.partition === p).map((m) => m.offset);
      assert.deepEqual(offs, [...offs].sort((a, b) => a - b));
    }
    // Nothing was leased.
    assert.equal((await client.getTopic(topic)).partitionStats.reduce((n, s) => n + s.inFlight, 0), 0);
  });

  it("is resumable from its position, also through JSON", async () => {
    const topic = await filled(24);
    const r1 = client.replay(topic, { pageSize: 5 });
    const first: Message[] = [];
    for await (const m of r1) {
      first.push(m);
      if (first.length === 10) break;
    }
    const saved = JSON.parse(JSON.stringify(r1.position)) as ReturnType<Position["toJSON"]>;
    const rest: Message[] = [];
    for await (const m of client.replay(topic, { from: Position.fromJSON(saved) })) rest.push(m);
    assert.equal(first.length + rest.length, 24);
    assert.deepEqual([...ids(first), ...ids(rest)].sort((a, b) => a - b), Array.from({ length: 24 }, (_, i) => i));
  });

  it("starts at offsets, at a time, or at the latest; one partition alone", async () => {
    const topic = await filled(9);
    const fromOffsets: Message[] = [];
    for await (const m of client.replay(topic, { from: Position.offsets({ 0: 2, 1: 3, 2: 1 }) })) fromOffsets.push(m);
    assert.deepEqual(ids(fromOffsets).sort((a, b) => a - b), [5, 6, 8]);

    // A position past the end is clamped to the end, so later messages are not skipped.
    const ahead = client.replay(topic, { from: Position.offsets({ 0: 50, 1: 50, 2: 50 }) });
    for await (const m of ahead) assert.fail(`unexpected ${m.offset}`);
    assert.deepEqual(ahead.position.toJSON().offsets, { "0": 3, "1": 3, "2": 3 });

    const onlyOne: Message[] = [];
    for await (const m of client.replay(topic, { partition: 1 })) onlyOne.push(m);
    assert.deepEqual(ids(onlyOne), [1, 4, 7]);

    await new Promise((r) => setTimeout(r, 20));
    const cut = Date.now();
    await new Promise((r) => setTimeout(r, 20));
    await client.produce(topic, { i: 100 }, { partition: 0 });
    const byTime: Message[] = [];
    for await (const m of client.replay(topic, { from: Position.at(new Date(cut)) })) byTime.push(m);
    assert.deepEqual(ids(byTime), [100]);

    const latest: Message[] = [];
    for await (const m of client.replay(topic, { from: Position.latest() })) latest.push(m);
    assert.deepEqual(latest, []);
  });

  it("follows new messages until aborted", async () => {
    const topic = await filled(3);
    const ctl = new AbortController();
    const got: Message[] = [];
    const r = client.replay(topic, { from: Position.latest(), follow: true, pollIntervalMs: 50, signal: ctl.signal });
    const run = (async () => {
      for await (const m of r) got.push(m);
    })();
    await new Promise((res) => setTimeout(res, 100));
    await client.produceBatch(topic, [{ body: { i: 50 }, partition: 2 }, { body: { i: 51 }, partition: 0 }]);
    await waitFor(() => got.length === 2, "the two new messages");
    ctl.abort();
    await assert.rejects(run, { name: "AbortError" });
    assert.deepEqual(ids(got).sort(), [50, 51]);
    assert.deepEqual(r.position.toJSON().offsets, { "0": 2, "1": 1, "2": 2 });
  });
});

/** json answers with a broker-like JSON body. */
function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

/** isTopicInfo tells a GET /v1/topics/{topic} (not its messages). */
function isTopicInfo(url: URL, init: RequestInit | undefined, topic: string): boolean {
  return (init?.method ?? "GET") === "GET" && url.pathname === `/v1/topics/${topic}`;
}

/** isRead tells a replay read of `partition` of `topic`. */
function isRead(url: URL, topic: string, partition: number): boolean {
  return url.pathname === `/v1/topics/${topic}/partitions/${partition}/messages`;
}

/**
 * unavailableFor makes the first `times` topic infos of `topic` say that `partition`'s
 * node cannot be reached, as the broker does: available false and every counter 0.
 */
function unavailableFor(topic: string, partition: number, times: number): { rule: FaultRule; answered: () => number } {
  let n = 0;
  return {
    answered: () => n,
    rule: async (url, init, real) => {
      if (!isTopicInfo(url, init, topic) || n >= times) return undefined;
      n++;
      const body = (await (await real()).json()) as { partition_stats: Record<string, unknown>[] };
      body.partition_stats = body.partition_stats.map((s) =>
        s["partition"] === partition
          ? { ...s, oldest_offset: 0, next_offset: 0, high_watermark: 0, ack_frontier: 0, acked_ahead: 0, in_flight: 0, backlog: 0, available: false }
          : s,
      );
      return json(200, body);
    },
  };
}

describe("replay rules", () => {
  const clients: Client[] = [];
  after(async () => {
    for (const c of clients) await c.close();
  });
  function faulty(events?: NaradEvent[], attempts = 4): { c: Client; f: ReturnType<typeof faultyFetch> } {
    const f = faultyFetch();
    const c = new Client({
      endpoints: [broker.url],
      fetch: f.fetch,
      retry: { attempts, minBackoffMs: 1, maxBackoffMs: 5 },
      ...(events ? { onEvent: (e: NaradEvent) => events.push(e) } : {}),
    });
    clients.push(c);
    return { c, f };
  }

  it("R1: a bounded replay asks again while a partition is unavailable and never moves its cursor for it", async () => {
    const topic = await filled(9);
    const { c, f } = faulty();
    const down = unavailableFor(topic, 2, 2);
    f.rules.push(down.rule);
    const r = c.replay(topic, { from: Position.offsets({ 0: 3, 1: 3, 2: 1 }) });
    const got: Message[] = [];
    for await (const m of r) got.push(m);
    assert.equal(down.answered(), 2, "the topic was read again until partition 2 was available");
    assert.deepEqual(got.map((m) => [m.partition, m.offset]), [[2, 1], [2, 2]]);
    assert.deepEqual(r.position.toJSON().offsets, { "0": 3, "1": 3, "2": 3 });
  });

  it("R1: a bounded replay fails with Unavailable naming the partition when it stays unavailable", async () => {
    const topic = await filled(6);
    const { c, f } = faulty(undefined, 3);
    f.rules.push(unavailableFor(topic, 1, Number.POSITIVE_INFINITY).rule);
    const r = c.replay(topic, { from: Position.offsets({ 1: 1 }) });
    const got: Message[] = [];
    await assert.rejects(
      (async () => {
        for await (const m of r) got.push(m);
      })(),
      (e: unknown) => e instanceof UnavailableError && /partition 1\b/.test(e.message) && e.retryable,
    );
    assert.deepEqual(got, []);
    assert.equal(r.position.offset(1), 1, "the cursor of the unavailable partition stays where it was");
  });

  it("R1: a following replay never moves a saved cursor back because the partition is unavailable", async () => {
    const topic = await filled(9);
    const { c, f } = faulty();
    f.rules.push(unavailableFor(topic, 2, Number.POSITIVE_INFINITY).rule);
    const ctl = new AbortController();
    const r = c.replay(topic, { from: Position.offsets({ 0: 3, 1: 3, 2: 1 }), follow: true, pollIntervalMs: 20, signal: ctl.signal });
    const got: Message[] = [];
    const run = (async () => {
      for await (const m of r) got.push(m);
    })();
    await waitFor(() => got.length >= 2, "two messages of partition 2");
    ctl.abort();
    await assert.rejects(run, { name: "AbortError" });
    assert.deepEqual(got.map((m) => [m.partition, m.offset]), [[2, 1], [2, 2]]);
  });

  it("R1: Position.latest() waits for an unavailable partition's end", async () => {
    const topic = await filled(9);
    const { c, f } = faulty();
    const down = unavailableFor(topic, 0, 2);
    f.rules.push(down.rule);
    const r = c.replay(topic, { from: Position.latest() });
    for await (const m of r) assert.fail(`unexpected ${m.partition}/${m.offset}`);
    assert.equal(down.answered(), 2);
    assert.deepEqual(r.position.toJSON().offsets, { "0": 3, "1": 3, "2": 3 });
  });

  it("R2: a page cut at the recorded end leaves the position after the last message yielded", async () => {
    const topic = await filled(3, 1);
    const { c, f } = faulty();
    let produced = false;
    f.rules.push(async (url) => {
      // Messages written after the replay took its end arrive in its first page.
      if (isRead(url, topic, 0) && !produced) {
        produced = true;
        await client.produceBatch(topic, [{ body: { i: 3 } }, { body: { i: 4 } }]);
      }
      return undefined;
    });
    const r = c.replay(topic, { pageSize: 10 });
    const got: Message[] = [];
    for await (const m of r) got.push(m);
    assert.ok(produced);
    assert.deepEqual(ids(got), [0, 1, 2]);
    assert.deepEqual(r.position.toJSON().offsets, { "0": 3 });
    const rest: Message[] = [];
    for await (const m of client.replay(topic, { from: r.position })) rest.push(m);
    assert.deepEqual(ids(rest), [3, 4]);
  });

  it("R3: a next_offset below the cursor is followed, so what is written there is not skipped", async () => {
    const topic = await filled(3, 1);
    const { c, f } = faulty();
    let shortened = false;
    f.rules.push((url) => {
      // The log ends at 1 now (a forced leader lost the tail): the broker answers a
      // read from 3 with where it ends.
      if (isRead(url, topic, 0) && url.searchParams.get("from") === "3" && !shortened) {
        shortened = true;
        return Promise.resolve(json(200, { messages: [], next_offset: 1, incarnation: url.searchParams.get("incarnation") }));
      }
      return undefined;
    });
    const ctl = new AbortController();
    const r = c.replay(topic, { from: Position.offsets({ 0: 3 }), follow: true, pollIntervalMs: 20, signal: ctl.signal });
    const got: Message[] = [];
    const run = (async () => {
      for await (const m of r) got.push(m);
    })();
    await waitFor(() => shortened, "the shortened answer");
    await client.produce(topic, { i: 3 }, { partition: 0 });
    await waitFor(() => got.some((m) => m.offset === 3), "the message written after");
    ctl.abort();
    await assert.rejects(run, { name: "AbortError" });
    assert.deepEqual(got.map((m) => m.offset), [1, 2, 3]);
  });

  it("R4: the position carries the incarnation, through JSON too, and every read names it", async () => {
    const topic = await filled(6);
    const { incarnation } = await client.getTopic(topic);
    const { c, f } = faulty();
    // A position saved before positions named the incarnation adopts the current one.
    const old = Position.fromJSON({ offsets: { "0": 1 } });
    assert.equal(old.incarnation, undefined);
    const r = c.replay(topic, { from: old, pageSize: 1 });
    let n = 0;
    for await (const _ of r) n++;
    assert.equal(n, 5);
    const saved = JSON.parse(JSON.stringify(r.position)) as Record<string, unknown>;
    assert.deepEqual(saved, { offsets: { "0": 2, "1": 2, "2": 2 }, incarnation });
    assert.equal(typeof saved["incarnation"], "string");
    assert.equal(Position.fromJSON(saved).incarnation, incarnation);
    const reads = f.calls.filter((u) => u.pathname.endsWith("/messages"));
    assert.ok(reads.length >= 5);
    for (const u of reads) assert.equal(u.searchParams.get("incarnation"), incarnation, u.href);
  });

  it("R4: a topic deleted and created again fails the replay with Conflict incarnation_mismatch", async () => {
    const topic = await filled(6);
    const r1 = client.replay(topic);
    for await (const _ of r1) break;
    const saved = r1.position.toJSON();
    await client.deleteTopic(topic);
    await client.createTopic({ name: topic, partitions: 3 });
    await client.produceBatch(topic, [{ body: { i: 90 }, partition: 0 }]);
    const isMismatch = (e: unknown) =>
      e instanceof ConflictError &&
      e.code === "incarnation_mismatch" &&
      !e.retryable &&
      /deleted and created again/.test(e.message) &&
      /new position/.test(e.message);
    const got: Message[] = [];
    await assert.rejects(
      (async () => {
        for await (const m of client.replay(topic, { from: Position.fromJSON(saved) })) got.push(m);
      })(),
      isMismatch,
    );
    assert.deepEqual(got, []);

    // Recreated under a replay already reading: its next read answers 409.
    const r2 = client.replay(topic, { pageSize: 1, partition: 0 });
    await client.produceBatch(topic, [{ body: { i: 91 }, partition: 0 }]);
    await assert.rejects(
      (async () => {
        for await (const _ of r2) {
          await client.deleteTopic(topic);
          await client.createTopic({ name: topic, partitions: 3 });
          await client.produceBatch(topic, [{ body: { i: 92 }, partition: 0 }, { body: { i: 93 }, partition: 0 }]);
        }
      })(),
      isMismatch,
    );
  });

  it("R5: damaged messages are reported through onEvent and the replay goes on", async () => {
    const topic = await filled(5, 1);
    const events: NaradEvent[] = [];
    const { c, f } = faulty(events);
    f.rules.push(async (url, _init, real) => {
      if (!isRead(url, topic, 0)) return undefined;
      // The record at offset 2 fails its checksum: the broker reads past it and names it.
      const body = (await (await real()).json()) as { messages: { offset: number }[]; damaged?: number[] };
      if (body.messages.some((m) => m.offset === 2)) {
        body.messages = body.messages.filter((m) => m.offset !== 2);
        body.damaged = [2];
      }
      return json(200, body);
    });
    const r = c.replay(topic);
    const got: Message[] = [];
    for await (const m of r) got.push(m);
    assert.deepEqual(got.map((m) => m.offset), [0, 1, 3, 4]);
    assert.deepEqual(
      events.filter((e) => e.type === "replay"),
      [{ type: "replay", topic, event: "damaged", partition: 0, offset: 2 }],
    );
    assert.deepEqual(r.position.toJSON().offsets, { "0": 5 });
  });

  it("R6: a read answered 503 is retried with the client's backoff", async () => {
    const topic = await filled(4, 1);
    const events: NaradEvent[] = [];
    const { c, f } = faulty(events);
    let refused = 0;
    f.rules.push((url) => {
      if (!isRead(url, topic, 0) || refused >= 2) return undefined;
      refused++;
      return Promise.resolve(json(503, { error: { code: "unavailable", message: "the partition is failing over" } }));
    });
    const got: Message[] = [];
    for await (const m of c.replay(topic)) got.push(m);
    assert.equal(refused, 2);
    assert.deepEqual(ids(got), [0, 1, 2, 3]);
    assert.equal(events.filter((e) => e.type === "retry" && e.operation === "readMessages").length, 2);
  });
});
