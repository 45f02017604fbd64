// The sources form no import circle (type-only imports included): client.ts imports
// the consumer, publisher and replay, which reach the client only through the small
// internal/core.ts module.

import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";

const src = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "src");

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    if (statSync(p).isDirectory()) return n === "generated" ? [] : sources(p);
    return p.endsWith(".ts") ? [p] : [];
  });
}

describe("imports", () => {
  it("have no circle", () => {
    const graph = new Map<string, string[]>();
    for (const file of sources(src)) {
      const text = readFileSync(file, "utf8");
      const deps = [...text.matchAll(/^(?:import|export)\s[^;]*?from\s+"(\.[^"]+)\.js";/gms)].map((m) => resolve(dirname(file), `${m[1]}.ts`));
      graph.set(file, deps.filter((d) => d !== file));
    }
    assert.ok(graph.size > 10, "found the sources");
    const state = new Map<string, "open" | "done">();
    const path: string[] = [];
    const visit = (f: string): void => {
      if (state.get(f) === "done") return;
      if (state.get(f) === "open") {
        const cycle = path.slice(path.indexOf(f)).concat(f).map((p) => relative(src, p));
        assert.fail(`import circle: ${cycle.join(" -> ")}`);
      }
      state.set(f, "open");
      path.push(f);
      for (const d of graph.get(f) ?? []) visit(d);
      path.pop();
      state.set(f, "done");
    };
    for (const f of graph.keys()) visit(f);
  });
});
