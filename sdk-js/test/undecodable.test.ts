// A message whose body no JSON decoder takes (nested deeper than a decoder goes, as a
// broker before the depth limit stored, or bytes that are not JSON) still reaches the
// handler and is acked: one poison body must not wedge a consumer.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client } from "@narad/client";
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

describe("undecodable bodies", () => {
  it("reach the handler and are acked, whether json() takes them or not", async () => {
    const topic = topicName("undecodable");
    await client.createTopic({ name: topic, partitions: 1 });
    const deep = "[".repeat(200_000) + "]".repeat(200_000);
    const bodies = [new TextEncoder().encode(deep), new TextEncoder().encode("{not json"), new Uint8Array([0xff, 0xfe])];
    for (const b of bodies) await client.produce(topic, b); // as bytes: the depth limit is for JSON payloads
    let decodeErrors = 0;
    let handled = 0;
    const consumer = client.consume(
      topic,
      async (m) => {
        handled++;
        try {
          m.json(); // V8's parser takes the deep array; the other two are not JSON
        } catch {
          decodeErrors++;
        }
      },
      { waitMs: 500 },
    );
    await waitFor(() => consumer.stats.acked === bodies.length, "every undecodable message acked");
    await consumer.stop();
    await consumer.done;
    assert.equal(handled, bodies.length);
    assert.equal(decodeErrors, 2);
    const d = await client.getTopic(topic);
    assert.equal(d.partitionStats[0]!.ackFrontier, bodies.length);
  });
});
