// Security on: HTTP Basic credentials, user admin (create, list, get, grants, password,
// delete), and how 401/403 surface — terminal for a consumer (docs/sdk/contract.md).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client, ForbiddenError, NotFoundError, UnauthenticatedError, ConflictError } from "@narad/client";
import { startBroker, topicName, type TestBroker } from "./helpers.js";

let broker: TestBroker;
let admin: Client;
const adminPassword = "admin-secret-1";

before(async () => {
  broker = await startBroker([], { NARAD_ADMIN_PASSWORD: adminPassword });
  admin = new Client({ endpoints: [broker.url], auth: { username: "admin", password: adminPassword } });
});

after(async () => {
  await admin?.close();
  await broker?.stop();
});

describe("users and credentials", () => {
  it("manages users and enforces their grants", async () => {
    const prefix = topicName("sec");
    const topic = `${prefix}.orders`;
    await admin.createTopic({ name: topic, partitions: 1 });
    const alice = await admin.createUser("alice", "alice-password-1", {
      grants: [
        { action: "produce", topics: [`${prefix}.*`] },
        { action: "consume", topics: [`${prefix}.*`] },
      ],
    });
    assert.equal(alice.username, "alice");
    assert.equal(alice.grants.length, 2);
    await assert.rejects(admin.createUser("alice", "alice-password-1"), ConflictError);
    assert.ok((await admin.listUsers()).some((u) => u.username === "alice"));
    assert.equal((await admin.getUser("alice")).grants[0]?.action, "produce");

    const asAlice = new Client({ endpoints: [broker.url], auth: { username: "alice", password: "alice-password-1" } });
    await asAlice.produce(topic, "from alice");
    const [m] = await asAlice.receive(topic, { waitMs: 2000 });
    assert.equal(m?.text(), "from alice");
    await m?.ack();
    await assert.rejects(asAlice.createTopic({ name: topicName("nope") }), (e: unknown) => e instanceof ForbiddenError && e.status === 403 && !e.retryable);

    const updated = await admin.replaceGrants("alice", [{ action: "consume", topics: [`${prefix}.*`] }]);
    assert.deepEqual(
      updated.grants.map((g) => g.action),
      ["consume"],
    );
    await assert.rejects(asAlice.produce(topic, "no longer"), ForbiddenError);

    await asAlice.changePassword("alice", "alice-password-2", { currentPassword: "alice-password-1" });
    await assert.rejects(asAlice.listTopics(), (e: unknown) => e instanceof UnauthenticatedError && e.status === 401);
    await asAlice.close();
    const again = new Client({ endpoints: [broker.url], auth: { username: "alice", password: "alice-password-2" } });
    assert.equal((await again.getUser("alice")).username, "alice");

    await admin.deleteUser("alice");
    await assert.rejects(admin.getUser("alice"), NotFoundError);
    await again.close();
  });

  it("a consumer with bad credentials stops and says so", async () => {
    const topic = topicName("sec");
    await admin.createTopic({ name: topic, partitions: 1 });
    const bad = new Client({ endpoints: [broker.url], auth: { username: "admin", password: "wrong-password" } });
    const consumer = bad.consume(topic, () => {}, { waitMs: 200 });
    await assert.rejects(consumer.done, UnauthenticatedError);
    await bad.close();
    const anonymous = new Client({ endpoints: [broker.url] });
    await assert.rejects(anonymous.produce(topic, "x"), UnauthenticatedError);
    await anonymous.close();
  });
});
