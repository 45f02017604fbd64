// Regenerates the wire types from ../openapi.yaml into a temporary file and fails when
// the committed src/generated/openapi.ts differs, so the SDK never drifts from the spec.
// Run `npm run gen` and commit the result to fix a failure.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const committed = "src/generated/openapi.ts";
const dir = mkdtempSync(join(tmpdir(), "narad-check-types-"));
try {
  const fresh = join(dir, "openapi.ts");
  execFileSync(process.execPath, ["node_modules/openapi-typescript/bin/cli.js", "../openapi.yaml", "--output", fresh], {
    stdio: ["ignore", "ignore", "inherit"],
  });
  const a = readFileSync(committed, "utf8");
  const b = readFileSync(fresh, "utf8");
  if (a !== b) {
    const al = a.split("\n");
    const bl = b.split("\n");
    let i = 0;
    while (i < al.length && al[i] === bl[i]) i++;
    console.error(`check-types: ${committed} is stale; run 'npm run gen' and commit the result.`);
    console.error(`first difference at line ${i + 1}:\n- ${al[i] ?? "(end of file)"}\n+ ${bl[i] ?? "(end of file)"}`);
    process.exit(1);
  }
  console.log(`check-types: ${committed} matches ../openapi.yaml`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
