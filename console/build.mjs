// Bundles src/ into one JS and one CSS file plus index.html, into the directory the
// broker embeds (broker/internal/console/static), or into --outdir DIR (the check that the
// committed build matches its sources builds into a temporary directory and compares).
// The output depends only on the sources and the locked esbuild: no timestamps, no
// absolute paths.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const i = process.argv.indexOf("--outdir");
const outdir = i > 0 ? resolve(process.argv[i + 1]) : join(here, "..", "broker", "internal", "console", "static");
mkdirSync(outdir, { recursive: true });

await build({
  absWorkingDir: here,
  entryPoints: { app: "src/main.tsx" },
  bundle: true,
  minify: true,
  format: "iife",
  target: ["chrome120", "firefox120", "safari17"],
  jsx: "automatic",
  jsxImportSource: "preact",
  outdir,
  legalComments: "none",
  charset: "utf8",
  logLevel: "warning",
});
await build({
  absWorkingDir: here,
  entryPoints: { app: "src/style.css" },
  bundle: true,
  minify: true,
  outdir,
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(outdir, "index.html"));
