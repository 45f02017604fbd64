// Installable from a clean checkout: a copy of the package's sources (no dist/) is
// packed with `npm pack` (whose prepack builds dist/), the tarball is installed into
// an empty project, and the README quick start runs from there against a real narad.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, describe, it } from "node:test";

import { quickStart, startBroker, type TestBroker } from "./helpers.js";

const run = promisify(execFile);
const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

let broker: TestBroker;
let work: string;

before(async () => {
  broker = await startBroker();
  work = mkdtempSync(join(tmpdir(), "narad-sdkjs-pack-"));
});

after(async () => {
  await broker?.stop();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe("npm pack", () => {
  it("packs a built package from sources alone, and the quick start runs from the installed tarball", async () => {
    const checkout = join(work, "checkout");
    for (const f of ["package.json", "package-lock.json", "README.md", "tsconfig.json", "tsconfig.build.json", "tsconfig.testing.json", "src", "scripts"]) {
      cpSync(join(pkgDir, f), join(checkout, f), { recursive: true });
    }
    symlinkSync(join(pkgDir, "node_modules"), join(checkout, "node_modules"), "dir"); // the pinned TypeScript
    const env = { ...process.env, npm_config_update_notifier: "false", npm_config_fund: "false", npm_config_audit: "false" };
    await run(npm, ["pack", "--pack-destination", work], { cwd: checkout, env, timeout: 180_000 });
    const tarball = readdirSync(work).find((f) => f.endsWith(".tgz"));
    assert.ok(tarball, "npm pack made a tarball");

    const app = join(work, "app");
    cpSync(join(pkgDir, "README.md"), join(app, "README.md"));
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true, type: "module" }));
    await run(npm, ["install", "--offline", "--no-audit", "--no-fund", join(work, tarball)], { cwd: app, env, timeout: 180_000 });
    const installed = JSON.parse(readFileSync(join(app, "node_modules", "@narad", "client", "package.json"), "utf8")) as { name: string };
    assert.equal(installed.name, "@narad/client");

    const file = join(app, "quickstart.mjs");
    writeFileSync(file, quickStart(readFileSync(join(pkgDir, "README.md"), "utf8")));
    const { stdout } = await run(process.execPath, [file], { cwd: app, env: { ...process.env, NARAD_URL: broker.url }, timeout: 60_000 });
    assert.match(stdout, /got order 42/);

    // The test-server helper ships too, and starts a broker from NARAD_BIN.
    const t = join(app, "testing.mjs");
    writeFileSync(
      t,
      'import { startNarad } from "@narad/client/testing";\n' +
        "const n = await startNarad();\n" +
        'const r = await fetch(n.url + "/readyz");\n' +
        'console.log("ready", r.status);\n' +
        "await n.stop();\n",
    );
    const ts = await run(process.execPath, [t], { cwd: app, env: process.env, timeout: 90_000 });
    assert.match(ts.stdout, /ready 200/);
  });
});
