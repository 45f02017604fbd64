// A real narad broker for tests, like Pub/Sub's pstest but the real thing: import it
// from "@narad/client/testing". startNarad starts `narad serve` on a free loopback port
// with a temporary data directory, waits until it is ready, and stop() ends it and
// removes the directory. This module needs Node (child processes, files); it is built
// with its own tsconfig (tsconfig.testing.json) so the core stays free of Node types,
// and its declarations name no Node type.

import { spawn, type ChildProcess } from "node:child_process";
import { accessSync, constants, mkdtempSync, rmSync, statSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join, resolve } from "node:path";

/** StartNaradOptions configure {@link startNarad}. Every field is optional. */
export interface StartNaradOptions {
  /** The narad executable; default `$NARAD_BIN`, then `narad` on the PATH. */
  binary?: string;
  /** Extra arguments to `narad serve`. */
  args?: readonly string[];
  /** Extra environment variables for the broker. */
  env?: Readonly<Record<string, string>>;
  /** How long to wait for `/readyz` before giving up, in ms (default 60 000). */
  readyTimeoutMs?: number;
}

/** NaradServer is a running broker started by {@link startNarad}. */
export interface NaradServer {
  /** The base URL, such as `http://127.0.0.1:41234`: give it to `new Client({ endpoints: [url] })`. */
  readonly url: string;
  /** The port it listens on (127.0.0.1). */
  readonly port: number;
  /** Its temporary data directory, removed by {@link NaradServer.stop}. */
  readonly dataDir: string;
  /** The broker's process id. */
  readonly pid: number;
  /** What the broker wrote to stdout and stderr so far (the first MiB). */
  logs(): string;
  /** Ends the broker (SIGTERM, then SIGKILL after 10 s) and removes its data directory; calling it twice is harmless. */
  stop(): Promise<void>;
}

const LOG_LIMIT = 1 << 20;

/**
 * findNaradBinary returns the narad executable {@link startNarad} would run: `explicit`,
 * else `$NARAD_BIN`, else the first executable `narad` on the PATH. It throws when there
 * is none, so a missing broker fails a test instead of passing or skipping it.
 */
export function findNaradBinary(explicit?: string): string {
  if (explicit) return resolve(explicit);
  const env = process.env["NARAD_BIN"];
  if (env) return resolve(env);
  for (const dir of (process.env["PATH"] ?? "").split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, process.platform === "win32" ? "narad.exe" : "narad");
    try {
      if (!statSync(candidate).isFile()) continue;
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  throw new Error("@narad/client/testing: no narad binary: set NARAD_BIN to its path, put narad on the PATH, or pass { binary }");
}

function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => res(port));
    });
  });
}

/**
 * startNarad starts a broker for a test and resolves once it answers `/readyz`:
 *
 * ```ts
 * import { startNarad } from "@narad/client/testing";
 * const narad = await startNarad();
 * const client = new Client({ endpoints: [narad.url] });
 * // ... test ...
 * await client.close();
 * await narad.stop();
 * ```
 *
 * A free port can be taken between choosing it and the broker binding it, so a broker
 * that exits before it is ready is started again (three tries); otherwise the error
 * carries the broker's output. A server that is never stopped does not keep the test
 * process alive, and is killed when that process exits.
 */
export async function startNarad(opts: StartNaradOptions = {}): Promise<NaradServer> {
  const bin = findNaradBinary(opts.binary);
  const readyTimeoutMs = opts.readyTimeoutMs ?? 60_000;
  let lastError: Error | undefined;
  for (let attempt = 1; attempt <= 3; attempt++) {
    const port = await freePort();
    const dataDir = mkdtempSync(join(tmpdir(), "narad-test-"));
    const server = launch(bin, port, dataDir, opts);
    const err = await server.ready(readyTimeoutMs);
    if (!err) return server.handle;
    await server.handle.stop();
    lastError = err;
    if (!server.exitedEarly()) break; // not a lost port race: trying again would not help
  }
  throw lastError ?? new Error("@narad/client/testing: narad did not start");
}

interface Launched {
  handle: NaradServer;
  ready(timeoutMs: number): Promise<Error | undefined>;
  exitedEarly(): boolean;
}

function launch(bin: string, port: number, dataDir: string, opts: StartNaradOptions): Launched {
  const args = ["serve", "--http-addr", `127.0.0.1:${port}`, "--data-dir", dataDir, "--log-level", "warn", "--shutdown-grace", "2s", ...(opts.args ?? [])];
  let log = "";
  const append = (d: Buffer) => {
    if (log.length < LOG_LIMIT) log += d.toString();
  };
  let exited = false;
  let spawnError: Error | undefined;
  const proc: ChildProcess = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...opts.env } });
  const exit = new Promise<void>((r) => {
    proc.once("exit", () => {
      exited = true;
      r();
    });
    proc.once("error", (e) => {
      // spawn failed (no such file, not executable): no exit event follows
      spawnError = e;
      exited = true;
      r();
    });
  });
  proc.stdout?.on("data", append);
  proc.stderr?.on("data", append);
  // A forgotten server must not keep the test process alive; it dies with it.
  proc.unref();
  (proc.stdout as unknown as { unref?: () => void } | null)?.unref?.();
  (proc.stderr as unknown as { unref?: () => void } | null)?.unref?.();
  const guard = () => {
    if (!exited) proc.kill("SIGKILL");
  };
  process.once("exit", guard);
  void exit.then(() => process.removeListener("exit", guard));

  const url = `http://127.0.0.1:${port}`;
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      if (!exited) {
        proc.ref(); // stay alive until it has gone
        proc.kill("SIGTERM");
        const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
        await exit;
        clearTimeout(t);
      }
      rmSync(dataDir, { recursive: true, force: true });
    })());
  const handle: NaradServer = { url, port, dataDir, pid: proc.pid ?? -1, logs: () => log, stop };

  const ready = async (timeoutMs: number): Promise<Error | undefined> => {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (exited) {
        const why = spawnError ? `could not run ${bin}: ${spawnError.message}` : `narad exited before it was ready (exit code ${proc.exitCode ?? proc.signalCode})`;
        return new Error(`@narad/client/testing: ${why}\n${log}`, spawnError ? { cause: spawnError } : undefined);
      }
      try {
        const r = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) });
        await r.arrayBuffer();
        if (r.status === 200) return undefined;
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 25)); // polling a condition, with a deadline
    }
    return new Error(`@narad/client/testing: narad on ${url} was not ready within ${timeoutMs} ms\n${log}`);
  };
  return { handle, ready, exitedEarly: () => exited && !spawnError };
}
