// Test helpers: a real narad broker per test file (127.0.0.1, a free port, a temp data
// dir, stopped at the end; only the process started here is ever signalled), a
// condition waiter, unique topic names, and a fault-injecting fetch.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

let builtBin: string | undefined;

/** naradBin returns $NARAD_BIN, or builds the broker from ../broker (found by walking up to go.work). */
export function naradBin(): string {
  const env = process.env["NARAD_BIN"];
  if (env) return resolve(env);
  if (builtBin) return builtBin;
  let dir = here;
  while (!existsSync(join(dir, "go.work"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error("NARAD_BIN is unset and no go.work was found above the tests to build the broker from");
    dir = up;
  }
  const out = join(mkdtempSync(join(tmpdir(), "narad-bin-")), "narad");
  execFileSync("go", ["build", "-o", out, "./cmd/narad"], { cwd: join(dir, "broker"), stdio: "inherit" });
  builtBin = out;
  return out;
}

/** freePort asks the kernel for a free loopback port. */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as AddressInfo).port;
      s.close(() => res(port));
    });
  });
}

/** A running broker started by a test. */
export interface TestBroker {
  url: string;
  port: number;
  dataDir: string;
  proc: ChildProcess;
  logs: () => string;
  stop: () => Promise<void>;
}

/** startBroker starts `narad serve` on a free port with a temp data dir and waits for /readyz. */
export async function startBroker(extraArgs: string[] = [], env: Record<string, string> = {}): Promise<TestBroker> {
  const bin = naradBin();
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const dataDir = mkdtempSync(join(tmpdir(), "narad-sdkjs-"));
    const proc = spawn(bin, ["serve", "--http-addr", `127.0.0.1:${port}`, "--data-dir", dataDir, "--log-level", "warn", ...extraArgs], {
      stdio: ["ignore", "ignore", "pipe"],
      env: { ...process.env, ...env },
    });
    let log = "";
    proc.stderr?.on("data", (d: Buffer) => {
      log += d.toString();
      if (log.length > 200_000) log = log.slice(-100_000);
    });
    const exited = new Promise<void>((r) => proc.once("exit", () => r()));
    // If the test process dies without its after() hooks, take our broker with it.
    const orphanGuard = () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
    };
    process.once("exit", orphanGuard);
    void exited.then(() => process.removeListener("exit", orphanGuard));
    const url = `http://127.0.0.1:${port}`;
    const stop = async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGTERM");
        const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
        await exited;
        clearTimeout(t);
      }
      rmSync(dataDir, { recursive: true, force: true });
    };
    const deadline = Date.now() + 30_000;
    let ready = false;
    while (Date.now() < deadline && proc.exitCode === null) {
      try {
        const r = await fetch(`${url}/readyz`);
        await r.arrayBuffer();
        if (r.status === 200) {
          ready = true;
          break;
        }
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    if (ready) return { url, port, dataDir, proc, logs: () => log, stop };
    await stop();
    if (attempt >= 3) throw new Error(`narad did not become ready on port ${port}:\n${log}`);
  }
}

/** waitFor polls `cond` until it returns a truthy value, failing after `timeoutMs` (generous by default). */
export async function waitFor<T>(cond: () => T | Promise<T>, what: string, timeoutMs = 20_000, intervalMs = 25): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

let seq = 0;
/** topicName returns a topic name unique to this run. */
export function topicName(prefix: string): string {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${seq++}`;
}

/** FaultRule may replace one request's outcome: return a Response, throw, or undefined to pass. */
export type FaultRule = (url: URL, init: RequestInit | undefined, real: () => Promise<Response>) => Promise<Response | undefined> | undefined;

/** faultyFetch wraps the global fetch; `rules` (mutable) decide faults per request; `calls` records every URL. */
export function faultyFetch(): { fetch: typeof fetch; rules: FaultRule[]; calls: URL[] } {
  const rules: FaultRule[] = [];
  const calls: URL[] = [];
  const f = (async (input: string | URL | Request, init?: RequestInit) => {
    const url = new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url);
    calls.push(url);
    const real = () => fetch(input, init);
    for (const rule of rules) {
      const r = await rule(url, init, real);
      if (r) return r;
    }
    return real();
  }) as typeof fetch;
  return { fetch: f, rules, calls };
}

/** lostReply makes an error like the one fetch gives when a connection drops after the request went out. */
export function lostReply(): Error {
  const cause = Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
  return new TypeError("fetch failed", { cause });
}

/**
 * TcpProxy forwards a loopback port to the broker and can be cut and restored, to play
 * a node that dies and comes back.
 */
export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  constructor(
    readonly port: number,
    private readonly target: number,
  ) {}

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    const { connect } = await import("node:net");
    const server = createServer((client) => {
      const upstream = connect(this.target, "127.0.0.1");
      this.sockets.add(client);
      this.sockets.add(upstream);
      const drop = () => {
        client.destroy();
        upstream.destroy();
        this.sockets.delete(client);
        this.sockets.delete(upstream);
      };
      client.on("error", drop).on("close", drop);
      upstream.on("error", drop).on("close", drop);
      client.pipe(upstream);
      upstream.pipe(client);
    });
    await new Promise<void>((res, rej) => {
      server.once("error", rej);
      server.listen(this.port, "127.0.0.1", () => res());
    });
    this.server = server;
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    for (const sock of this.sockets) sock.destroy();
    this.sockets.clear();
    if (s) await new Promise<void>((r) => s.close(() => r()));
  }
}

/** bytesEqual compares two byte arrays. */
export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * hungServer listens on a free loopback port, accepts connections and never answers:
 * a node that is up at the TCP level but hung.
 */
export async function hungServer(): Promise<{ url: string; accepted: () => number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  let accepted = 0;
  const server = createServer((s) => {
    accepted++;
    sockets.add(s);
    s.on("error", () => undefined);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((res, rej) => {
    server.once("error", rej);
    server.listen(0, "127.0.0.1", () => res());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    accepted: () => accepted,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** quickStart returns the first ```js block under the README's "## Quick start". */
export function quickStart(readme: string): string {
  const section = readme.slice(readme.indexOf("## Quick start"));
  const m = /```js\n([\s\S]*?)```/.exec(section);
  if (!m?.[1]) throw new Error("the README has no ```js block under ## Quick start");
  return m[1];
}
