// Error mapping from every status and body the SDK can meet, through an injected fetch
// (no broker): kinds, codes, retryable, uncertain and Retry-After.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Client, NaradError, type ErrorKind } from "@narad/client";

function answering(status: number, body: string, headers: Record<string, string> = {}): Client {
  const f = (async () => new Response(status === 204 ? null : body, { status, headers })) as typeof fetch;
  return new Client({ endpoints: "http://127.0.0.1:1", fetch: f, retry: { attempts: 1 } });
}

const cases: [number, string | undefined, ErrorKind, string, boolean][] = [
  [400, "invalid_parameter", "BadRequest", "invalid_parameter", false],
  [401, "unauthenticated", "Unauthenticated", "unauthenticated", false],
  [403, "forbidden", "Forbidden", "forbidden", false],
  [404, "topic_not_found", "NotFound", "topic_not_found", false],
  [409, "topic_exists", "Conflict", "topic_exists", false],
  [410, "lease_lost", "LeaseLost", "lease_lost", false],
  [413, "payload_too_large", "TooLarge", "payload_too_large", false],
  [429, undefined, "Throttled", "throttled", true],
  [501, "not_implemented", "NotImplemented", "not_implemented", false],
  [503, "unavailable", "Unavailable", "unavailable", true],
  [503, "acked_ahead_full", "Unavailable", "acked_ahead_full", true],
  [503, "timeout", "Timeout", "timeout", true],
  [503, "maybe_stored", "Unavailable", "maybe_stored", true],
  [500, "internal", "Internal", "internal", false],
  [502, undefined, "Unavailable", "unavailable", true],
  [504, undefined, "Timeout", "timeout", true],
  [408, undefined, "Timeout", "timeout", true],
];

describe("error mapping", () => {
  for (const [status, code, kind, wantCode, retryable] of cases) {
    it(`${status} ${code ?? "(no body)"} → ${kind}`, async () => {
      const body = code ? JSON.stringify({ error: { code, message: `msg ${code}` } }) : "<html>proxy</html>";
      const c = answering(status, body, status === 503 || status === 429 ? { "retry-after": "2" } : {});
      const err = await c.createTopic({ name: "t" }).catch((e: unknown) => e);
      assert.ok(err instanceof NaradError, String(err));
      assert.equal(err.kind, kind);
      assert.equal(err.code, wantCode);
      assert.equal(err.status, status);
      assert.equal(err.retryable, retryable);
      if (code) assert.equal(err.message, `msg ${code}`);
      if (status === 503 || status === 429) assert.equal(err.retryAfterMs, 2000);
      // Only a write whose outcome is unknown is uncertain: the broker's 503 timeout or
      // maybe_stored (a failed disk write it could not take back), a proxy's 504 or a
      // 408. A 500 is a broker bug, reported certain as in Go and Python.
      assert.equal(err.uncertain, code === "timeout" || code === "maybe_stored" || status === 504 || status === 408);
      const read = await c.listTopics().catch((e: unknown) => e);
      assert.ok(read instanceof NaradError && read.uncertain === false, "a failed read changed nothing");
      await c.close();
    });
  }

  it("reports garbage in a success answer as an invalid_response", async () => {
    const c = answering(200, "not json");
    const err = await c.listTopics().catch((e: unknown) => e);
    assert.ok(err instanceof NaradError && err.code === "invalid_response" && err.kind === "Internal");
    await c.close();
  });

  it("keeps the cause of a connection failure", async () => {
    const f = (async () => {
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("refused"), { code: "ECONNREFUSED" }) });
    }) as typeof fetch;
    const c = new Client({ endpoints: "http://127.0.0.1:1", fetch: f, retry: { attempts: 1 } });
    const err = await c.produce("t", "x").catch((e: unknown) => e);
    assert.ok(err instanceof NaradError && err.kind === "Unavailable" && err.code === "connection_failed");
    assert.equal(err.uncertain, false, "refused: never reached the broker");
    assert.ok(err.cause instanceof TypeError);
    await c.close();
  });
});
