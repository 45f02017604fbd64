// The test-server helper, @narad/client/testing: a real narad on a free port and a temp
// dir, found through NARAD_BIN or the PATH, stopped (and its directory removed) by stop().

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import { Client } from "@narad/client";
import { findNaradBinary, startNarad, type NaradServer } from "@narad/client/testing";
import { naradBin, topicName, waitFor } from "./helpers.js";

const started: NaradServer[] = [];
after(async () => {
  for (const s of started) await s.stop();
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** withEnv runs fn with some environment variables replaced (undefined: removed), then puts them back. */
async function withEnv<T>(vars: Record<string, string | undefined>, fn: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const set = (vs: Record<string, string | undefined>) => {
    for (const [k, v] of Object.entries(vs)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
  set(vars);
  try {
    return await fn();
  } finally {
    set(saved);
  }
}

describe("@narad/client/testing", () => {
  it("starts a real broker on a free loopback port and a temp dir; stop ends it and removes the dir", async () => {
    const bin = naradBin();
    const narad = await withEnv({ NARAD_BIN: bin }, () => startNarad());
    started.push(narad);
    assert.match(narad.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.notEqual(narad.port, 7942);
    assert.ok(existsSync(narad.dataDir));
    const client = new Client({ endpoints: [narad.url] });
    try {
      const topic = topicName("testing");
      await client.createTopic({ name: topic, partitions: 1 });
      await client.produce(topic, "hello");
      const [m] = await client.receive(topic, { waitMs: 1000 });
      assert.equal(m?.text(), "hello");
      await m?.ack();
    } finally {
      await client.close();
    }
    assert.ok(alive(narad.pid));
    await narad.stop();
    assert.equal(alive(narad.pid), false, "the broker's process is gone");
    assert.equal(existsSync(narad.dataDir), false, "its data dir is removed");
    await narad.stop(); // twice is harmless
  });

  it("two servers get separate ports and dirs", async () => {
    const bin = naradBin();
    const [a, b] = await Promise.all([startNarad({ binary: bin }), startNarad({ binary: bin })]);
    started.push(a, b);
    assert.notEqual(a.port, b.port);
    assert.notEqual(a.dataDir, b.dataDir);
    await Promise.all([a.stop(), b.stop()]);
    await waitFor(() => !alive(a.pid) && !alive(b.pid), "both brokers gone");
  });

  it("finds narad on the PATH when NARAD_BIN is unset, and fails clearly when there is none", async () => {
    const dir = mkdtempSync(join(tmpdir(), "narad-path-"));
    try {
      symlinkSync(naradBin(), join(dir, "narad"));
      await withEnv({ NARAD_BIN: undefined, PATH: dir }, async () => {
        assert.equal(findNaradBinary(), join(dir, "narad"));
        const narad = await startNarad();
        started.push(narad);
        const r = await fetch(`${narad.url}/readyz`);
        await r.arrayBuffer();
        assert.equal(r.status, 200);
        await narad.stop();
      });
      const empty = mkdtempSync(join(tmpdir(), "narad-nopath-"));
      try {
        await withEnv({ NARAD_BIN: undefined, PATH: empty }, async () => {
          assert.throws(() => findNaradBinary(), /set NARAD_BIN/);
          await assert.rejects(startNarad(), /no narad binary: set NARAD_BIN/);
        });
      } finally {
        rmSync(empty, { recursive: true, force: true });
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a broker that cannot start rejects with its output instead of hanging", async () => {
    await assert.rejects(startNarad({ binary: naradBin(), args: ["--no-such-flag"], readyTimeoutMs: 60_000 }), (e: unknown) => {
      assert.match((e as Error).message, /exited before it was ready/);
      assert.match((e as Error).message, /no-such-flag/);
      return true;
    });
    await assert.rejects(startNarad({ binary: join(tmpdir(), "no-such-narad-binary") }), /could not run/);
  });
});
