// The README's quick start, extracted as written and run as plain JavaScript with
// node, twice in a row against a real broker: it must neither fail on the first run
// (syntax, a missing topic) nor on the second (a topic that now exists).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, describe, it } from "node:test";

import { quickStart, startBroker, type TestBroker } from "./helpers.js";

const run = promisify(execFile);
const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

let broker: TestBroker;

before(async () => {
  broker = await startBroker();
});

after(async () => {
  await broker?.stop();
});

describe("README quick start", () => {
  it("runs as plain JavaScript, twice in a row, as written", async () => {
    const code = quickStart(readFileSync(join(pkgDir, "README.md"), "utf8"));
    // Inside the package directory, so `@narad/client` resolves to this package's dist.
    const dir = join(pkgDir, ".tmp");
    mkdirSync(dir, { recursive: true });
    const file = join(dir, `quickstart-${process.pid}.mjs`);
    writeFileSync(file, code);
    for (const round of [1, 2]) {
      const { stdout } = await run(process.execPath, [file], { env: { ...process.env, NARAD_URL: broker.url }, timeout: 60_000 });
      assert.match(stdout, /stored at/, `run ${round} produced`);
      assert.match(stdout, /got order 42/, `run ${round} consumed`);
    }
  });
});
