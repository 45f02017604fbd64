// RetryTiers against a real broker: the waiting between tiers is the broker's (delay
// children), so a waiting message holds no lease and takes no in-flight slot.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, Envelope, RetryTiers, isNaradError, type TopicSettings } from "@narad/client";
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

const oneSlot: TopicSettings = { partitions: 1, maxInFlightPerPartition: 1 };

describe("retry tiers on delay children", () => {
  it("ensureTopics makes each tier a retry topic with a delay child named <topic>.due", async () => {
    const main = topicName("tdue");
    const tiers = new RetryTiers(client, {
      topic: main,
      tiers: [
        { topic: `${main}.r1`, delayMs: 1500 },
        { topic: `${main}.r2`, delayMs: 3000, due: `${main}.r2-ready` },
      ],
      parkingTopic: `${main}.parking`,
    });
    assert.deepEqual(tiers.consumedTopics(), [main, `${main}.r1.due`, `${main}.r2-ready`]);
    await tiers.ensureTopics({ partitions: 1 });
    await tiers.ensureTopics({ partitions: 1 }); // twice: the existing children are accepted
    const due1 = await client.getTopic(`${main}.r1.due`);
    assert.equal(due1.parent, `${main}.r1`);
    assert.equal(due1.fanoutDelayMs, 1500);
    const due2 = await client.getTopic(`${main}.r2-ready`);
    assert.equal(due2.parent, `${main}.r2`);
    assert.equal(due2.fanoutDelayMs, 3000);
    // The retry topic keeps messages at least its delay plus two hours.
    assert.ok((await client.getTopic(`${main}.r1`)).retentionMs >= 1500 + 2 * 3600_000);

    // A due topic that exists as a child with another delay is refused.
    const other = new RetryTiers(client, { topic: main, tiers: [{ topic: `${main}.r1`, delayMs: 9000 }], parkingTopic: `${main}.parking` });
    await assert.rejects(other.ensureTopics({ partitions: 1 }), (e: unknown) => isNaradError(e, "Conflict") && /delay/.test((e as Error).message));
  });

  it("a message waiting out its tier's delay holds no lease", async () => {
    const main = topicName("twait");
    const tiers = new RetryTiers(client, { topic: main, tiers: [{ topic: `${main}.retry1`, delayMs: 4000 }], parkingTopic: `${main}.parking` });
    await tiers.ensureTopics(oneSlot);
    await client.produce(main, "w");
    const attempts: number[] = [];
    const { stop } = tiers.consume(
      () => {
        attempts.push(Date.now());
        if (attempts.length === 1) throw new Error("not yet");
      },
      { waitMs: 200 },
    );
    try {
      await waitFor(() => attempts.length === 1, "the first attempt to fail", 30_000);
      // The failure is routed (produced to the retry topic) and only then acked on main.
      await waitFor(
        async () => (await client.getTopic(main)).partitionStats[0]?.inFlight === 0 && (await client.getTopic(`${main}.retry1`)).partitionStats[0]?.nextOffset === 1,
        "the failed message routed to the tier and acked on the main topic",
        30_000,
      );
      // While it waits (4 s), no topic of the tiers holds it leased. Checked for a
      // while, since a hold, when there is one, starts a moment after the failure.
      const until = Date.now() + 2000;
      while (Date.now() < until) {
        assert.equal(attempts.length, 1, "the retry came before the tier's delay");
        for (const t of [main, `${main}.retry1`, `${main}.retry1.due`]) {
          for (const s of (await client.getTopic(t)).partitionStats) {
            assert.equal(s.inFlight, 0, `${t} partition ${s.partition} holds a lease while the message waits in its tier`);
          }
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      await waitFor(() => attempts.length === 2, "the retry", 30_000);
      assert.ok((attempts[1] as number) - (attempts[0] as number) >= 3500, "the retry waited out the tier's 4 s");
    } finally {
      await stop();
    }
  });

  it("an early envelope does not block the ready message behind it", async () => {
    const main = topicName("tearly");
    const tiers = new RetryTiers(client, { topic: main, tiers: [{ topic: `${main}.retry1`, delayMs: 3_600_000 }], parkingTopic: `${main}.parking` });
    await tiers.ensureTopics(oneSlot);
    // An envelope whose notBefore is an hour away (another producer, an older SDK).
    await client.produce(main, Envelope.wrap("early", { notBefore: Date.now() + 3_600_000 }));
    await client.produce(main, Envelope.wrap("ready"));
    const handled: string[] = [];
    const { stop } = tiers.consume(({ envelope }) => void handled.push(envelope.text()), { waitMs: 200 });
    try {
      await waitFor(() => handled.length === 2, "both messages handled (the early one must not hold the only in-flight slot)", 30_000);
      assert.deepEqual(handled, ["early", "ready"]);
    } finally {
      await stop();
    }
  });
});
