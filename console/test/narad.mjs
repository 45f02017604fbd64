// What the browser tests share: a real narad on 127.0.0.1 (a free port, a temp data
// directory, stopped by its PID when the test ends) and waiting for a condition with a
// generous bound, never for a fixed time.
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const narad = resolve(process.env.NARAD_BIN ?? join(here, "..", "..", "bin", "narad"));
export const bound = 30_000; // generous: CI machines are small and busy

export function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

export async function until(what, cond, ms = bound) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      if (await cond()) return;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? `: ${last}` : ""}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const running = new Map(); // base URL -> its stop function

/** Stops the narad startNarad started at base (before its test ends), by its PID. */
export async function stopNarad(base) {
  await running.get(base)?.();
  running.delete(base);
}

/** Starts narad on a free port with env, stopped by its PID when t ends. */
export async function startNarad(t, work, env) {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const log = [];
  const node = spawn(narad, ["serve", "--http-addr", `127.0.0.1:${port}`, "--data-dir", join(work, "data"), "--stats-interval", "1s"], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  node.stdout.on("data", (d) => log.push(String(d)));
  node.stderr.on("data", (d) => log.push(String(d)));
  const stop = async () => {
    if (node.exitCode === null && node.signalCode === null) {
      const exited = new Promise((r) => node.once("exit", r));
      process.kill(node.pid, "SIGTERM");
      await exited;
    }
  };
  running.set(base, stop);
  t.after(stop);
  await until("narad to be ready", async () => (await fetch(`${base}/readyz`)).ok).catch((e) => {
    throw new Error(`${e.message}\nnarad's output:\n${log.join("")}`);
  });
  return base;
}
