// A node that accepts connections and never answers: its timed-out attempts count
// against it (the breaker opens), and each attempt has its own bound so a call fails
// over to a live node instead of spending its whole budget on the hung one.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, TimeoutError, type NaradEvent } from "@narad/client";
import { hungServer, startBroker, type TestBroker } from "./helpers.js";

let broker: TestBroker;
let hung: Awaited<ReturnType<typeof hungServer>>;

before(async () => {
  [broker, hung] = await Promise.all([startBroker(), hungServer()]);
});

after(async () => {
  await hung?.close();
  await broker?.stop();
});

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
});
