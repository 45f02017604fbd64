// Cluster membership: listing, moves, decommission, forced takeover, replication factor.
// A single test node answers the listings and refuses every membership change with 409
// (it runs alone), which is enough for the real-broker checks. The answers only a
// cluster gives (a move, a 404 for an unknown move, a forced takeover that timed out)
// are scripted in an injected fetch, which answers those routes without forwarding and
// records what the client sent.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, ConflictError, NaradError, NotFoundError, TimeoutError, type Move } from "@narad/client";
import { startBroker, topicName, type TestBroker } from "./helpers.js";

let broker: TestBroker;

before(async () => {
  broker = await startBroker();
});

after(async () => {
  await broker?.stop();
});

type Answer = [number, unknown];

interface Sent {
  method: string;
  path: string;
  body: unknown;
}

/**
 * scripted returns a client whose fetch answers "METHOD /path" routes from `answers`,
 * one per request (the last repeats), and sends the rest to the test node; `sent`
 * records every request.
 */
function scripted(answers: Record<string, Answer[]>): { client: Client; sent: Sent[] } {
  const sent: Sent[] = [];
  const f = (async (input: string | URL | Request, init?: RequestInit) => {
    const url = new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url);
    const method = init?.method ?? "GET";
    const raw = init?.body ? new TextDecoder().decode(init.body as Uint8Array) : "";
    sent.push({ method, path: url.pathname, body: raw ? JSON.parse(raw) : undefined });
    const queue = answers[`${method} ${url.pathname}`];
    if (!queue || queue.length === 0) return fetch(input, init);
    const [status, body] = (queue.length === 1 ? queue[0] : queue.shift()) as Answer;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (status === 503) headers["retry-after"] = "0";
    return new Response(body === undefined ? null : JSON.stringify(body), { status, headers });
  }) as typeof fetch;
  const client = new Client({ endpoints: broker.url, fetch: f, retry: { attempts: 3, minBackoffMs: 1, maxBackoffMs: 5 } });
  return { client, sent };
}

const copying = {
  id: "m1",
  topic: "orders",
  partition: 1,
  from: "n1",
  to: "n2",
  status: "copying",
  cause: "request",
  progress: 0.25,
  lag: 30,
  created_at_ms: 1700000000000,
  updated_at_ms: 1700000001000,
};
const failed = {
  id: "m0",
  topic: "t",
  partition: 0,
  from: "",
  to: "n3",
  status: "failed",
  reason: "n3 died",
  cause: "replication_factor",
  progress: 0.5,
  created_at_ms: 1,
  updated_at_ms: 2,
};
const timeout: Answer = [503, { error: { code: "timeout", message: "the controller did not answer in time" } }];

describe("cluster membership", () => {
  it("reads the cluster and its members from a real node", async () => {
    const client = new Client({ endpoints: broker.url });
    const c = await client.getCluster();
    assert.ok(c.clusterId, "this broker sends a cluster id");
    assert.ok(c.version !== undefined && c.version >= 1);
    assert.equal(c.controller, c.nodeId, "a node alone leads itself");
    const [me] = c.members;
    assert.ok(me);
    assert.equal(me.id, c.nodeId);
    assert.equal(me.httpAddress, broker.url);
    assert.equal(me.voter, true);
    assert.equal(typeof me.partitionsHeld, "number");
    assert.equal(typeof me.partitionsLed, "number");
    assert.deepEqual(await client.listMembers(), c.members);
    assert.deepEqual(await client.listMoves(), []);
    await client.close();
  });

  it("sends every membership call's route and body and reads the answer whole", async () => {
    const { client, sent } = scripted({
      "POST /v1/cluster/moves": [[202, copying]],
      "GET /v1/cluster/moves": [[200, { moves: [copying, failed] }]],
      "DELETE /v1/cluster/moves/m1": [[204, undefined]],
      "POST /v1/cluster/rebalance": [[202, { moves: [] }]],
      "DELETE /v1/cluster/members/n2": [[202, { id: "n2", address: "10.0.0.2:7950", status: "decommissioning", voter: true, partitions_held: 4 }]],
      "POST /v1/topics/orders/partitions/1/force-leader": [[200, { possibly_lost_at_least: 12, replicas: ["n3"] }]],
    });
    const want: Move = {
      id: "m1",
      topic: "orders",
      partition: 1,
      from: "n1",
      to: "n2",
      status: "copying",
      reason: undefined,
      cause: "request",
      progress: 0.25,
      lag: 30,
      createdAtMs: 1700000000000,
      updatedAtMs: 1700000001000,
    };
    assert.deepEqual(await client.movePartition("orders", 1, "n1", "n2"), want);
    const moves = await client.listMoves();
    assert.deepEqual(moves[0], want);
    assert.deepEqual(
      [moves[1]?.from, moves[1]?.to, moves[1]?.status, moves[1]?.reason, moves[1]?.lag, moves[1]?.cause],
      ["", "n3", "failed", "n3 died", undefined, "replication_factor"],
    );
    assert.equal(await client.cancelMove("m1"), undefined);
    assert.deepEqual(await client.rebalance(), []);
    const m = await client.decommission("n2");
    assert.deepEqual([m.id, m.status, m.partitionsHeld, m.partitionsLed], ["n2", "decommissioning", 4, undefined]);
    assert.deepEqual(await client.forceLeader("orders", 1, "n3"), { possiblyLostAtLeast: 12, replicas: ["n3"] });
    assert.deepEqual(sent, [
      { method: "POST", path: "/v1/cluster/moves", body: { topic: "orders", partition: 1, from: "n1", to: "n2" } },
      { method: "GET", path: "/v1/cluster/moves", body: undefined },
      { method: "DELETE", path: "/v1/cluster/moves/m1", body: undefined },
      { method: "POST", path: "/v1/cluster/rebalance", body: undefined },
      { method: "DELETE", path: "/v1/cluster/members/n2", body: undefined },
      { method: "POST", path: "/v1/topics/orders/partitions/1/force-leader", body: { node: "n3" } },
    ]);
    await client.close();
  });

  it("sends replication_factor on alterTopic, and a 409 for too many copies is final", async () => {
    const { client, sent } = scripted({});
    const topic = topicName("rf");
    await client.createTopic({ name: topic, partitions: 1 });
    assert.equal((await client.alterTopic(topic, { replicationFactor: 1 })).replicationFactor, 1);
    const err = await client.alterTopic(topic, { replicationFactor: 3 }).catch((e: unknown) => e);
    assert.ok(err instanceof ConflictError, String(err));
    assert.equal(err.status, 409);
    assert.equal(err.code, "conflict");
    assert.equal(err.retryable, false);
    assert.equal(err.uncertain, false);
    await client.alterTopic(topic, { retentionMs: 3_600_000 });
    assert.deepEqual(
      sent.filter((s) => s.method === "PATCH").map((s) => s.body),
      [{ replication_factor: 1 }, { replication_factor: 3 }, { retention_ms: 3_600_000 }],
    );
    await client.close();
  });

  it("maps the broker's refusals: 404 for an unknown move, 409 for an impossible change", async () => {
    const { client, sent } = scripted({
      "DELETE /v1/cluster/moves/gone": [[404, { error: { code: "move_not_found", message: "no partition move has that id" } }]],
    });
    const nf = await client.cancelMove("gone").catch((e: unknown) => e);
    assert.ok(nf instanceof NotFoundError, String(nf));
    assert.equal(nf.code, "move_not_found");
    assert.equal(nf.retryable, false);
    const topic = topicName("refused");
    await client.createTopic({ name: topic, partitions: 1 });
    // The real node refuses every membership change with 409 and says why.
    const refusals: (() => Promise<unknown>)[] = [
      () => client.movePartition(topic, 0, "a", "b"),
      () => client.cancelMove("m1"),
      () => client.rebalance(),
      () => client.forceLeader(topic, 0, "b"),
    ];
    for (const call of refusals) {
      const e = await call().catch((x: unknown) => x);
      assert.ok(e instanceof ConflictError, String(e));
      assert.equal(e.status, 409);
      assert.match(e.message, /needs a cluster/);
      assert.equal(e.retryable, false);
      assert.equal(e.uncertain, false);
    }
    // An unknown node is not found, even on a lone node.
    const nn = await client.decommission("n9").catch((e: unknown) => e);
    assert.ok(nn instanceof NotFoundError, String(nn));
    assert.equal(nn.code, "node_not_found");
    const membership = sent.filter((s) => s.path.startsWith("/v1/cluster/") || s.path.endsWith("/force-leader"));
    assert.equal(membership.length, 2 + refusals.length, "409s and 404s are terminal: each call was sent once");
    await client.close();
  });

  it("never repeats a forced takeover whose outcome is unknown, but retries a move", async () => {
    const { client, sent } = scripted({
      "POST /v1/topics/t/partitions/0/force-leader": [timeout, [200, { possibly_lost_at_least: 0, replicas: ["n1"] }]],
      "POST /v1/cluster/moves": [timeout, [202, copying]],
    });
    const err = await client.forceLeader("t", 0, "n1").catch((e: unknown) => e);
    assert.ok(err instanceof TimeoutError, String(err));
    assert.equal(err.uncertain, true);
    assert.equal(sent.filter((s) => s.path.endsWith("/force-leader")).length, 1);
    // The broker answers a repeated move with the move under way, so it is retried.
    assert.equal((await client.movePartition("orders", 1, "n1", "n2")).id, "m1");
    assert.equal(sent.filter((s) => s.path === "/v1/cluster/moves").length, 2);
    await client.close();
  });

  it("reports a forced takeover whose reply was lost as uncertain, sent once", async () => {
    let calls = 0;
    const f = (async () => {
      calls++;
      const cause = Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
      throw new TypeError("fetch failed", { cause });
    }) as typeof fetch;
    const client = new Client({ endpoints: broker.url, fetch: f, retry: { attempts: 3, minBackoffMs: 1, maxBackoffMs: 5 } });
    const err = await client.forceLeader("t", 0, "n1").catch((e: unknown) => e);
    assert.ok(err instanceof NaradError, String(err));
    assert.equal(err.uncertain, true);
    assert.equal(calls, 1);
    await client.close();
  });
});
