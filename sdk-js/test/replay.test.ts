// Replay as an AsyncIterable: from a Position (earliest, offsets, time, latest),
// bounded or following, one partition or all, and resumable.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, Position, type Message } from "@narad/client";
import { startBroker, topicName, waitFor, type TestBroker } from "./helpers.js";

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
