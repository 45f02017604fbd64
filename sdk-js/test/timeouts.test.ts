// A node that accepts connections and never answers: its timed-out attempts count
// against it (the breaker opens), and each attempt has its own bound so a call fails
// over to a live node instead of spending its whole budget on the hung one.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, TimeoutError, type NaradEvent } from "@narad/client";
import { hungServer, startBroker, topicName, type TestBroker } from "./helpers.js";

let broker: TestBroker;
let hung: Awaited<ReturnType<typeof hungServer>>;

before(async () => {
  [broker, hung] = await Promise.all([startBroker(), hungServer()]);
});

after(async () => {
  await hung?.close();
  await broker?.stop();
});

function attemptsTo(events: NaradEvent[], url: string): number {
  return events.filter((e) => e.type === "attempt" && e.endpoint === url).length;
}

describe("timeouts", () => {
  it("counts a timed-out call against its node", async () => {
    const events: NaradEvent[] = [];
    const client = new Client({
      endpoints: [hung.url],
      timeoutMs: 300,
      retry: { attempts: 1 },
      breaker: { failureThreshold: 1, probeIntervalMs: 60_000 },
      onEvent: (e) => events.push(e),
    });
    const err = await client.listTopics().catch((e: unknown) => e);
    assert.ok(err instanceof TimeoutError, String(err));
    assert.ok(
      events.some((e) => e.type === "breaker" && e.endpoint === hung.url && e.state === "open"),
      "the hung node left the rotation",
    );
    await client.close();
  });

  it("bounds each attempt, so a call fails over from a hung node to a live one", async () => {
    const events: NaradEvent[] = [];
    const client = new Client({
      endpoints: [hung.url, broker.url],
      timeoutMs: 2000,
      breaker: { probeIntervalMs: 60_000 },
      onEvent: (e) => events.push(e),
    });
    // Reads may retry after a timeout; each fails over to the live node.
    await client.listTopics();
    await client.listTopics();
    const topic = topicName("t");
    await client.createTopic({ name: topic, partitions: 1 });
    for (let i = 0; i < 5; i++) await client.produce(topic, `m${i}`);
    const got = await client.receive(topic, { max: 5, waitMs: 1000 });
    assert.equal(got.length, 5);
    for (const m of got) await m.ack();
    // Breaker defaults: two consecutive failures take the node out; then it is skipped.
    assert.equal(attemptsTo(events, hung.url), 2, "the hung node was tried twice, then left the rotation");
    assert.ok(events.some((e) => e.type === "breaker" && e.endpoint === hung.url && e.state === "open"));
    await client.close();
  });
});
