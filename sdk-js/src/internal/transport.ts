// The transport: one place where every HTTP call is made, timed, retried, failed over
// and turned into a NaradError. Retry rules (docs/sdk/contract.md):
//   - refused and not stored (connection refused, 503 unavailable): another node at
//     once when one is left untried, else backoff that honours Retry-After;
//   - outcome unknown (reply lost, broker 503 "timeout", a proxy's 504, a 408): retried
//     only when the request allows it (reads, acks, produces that allow duplicates),
//     and the final error then says `uncertain`;
//   - a produce-batch answered with `partly_stored` (part of it was stored): never
//     resent, whatever the request allows; the error carries `partlyStored`;
//   - a node that answered with Retry-After is not tried again by the same call before
//     that time: the call fails over meanwhile, or waits for the node free the soonest;
//   - other 4xx and 500: never retried.

import {
  ClosedError,
  NaradError,
  TimeoutError,
  UnavailableError,
  InternalError,
  errorFromStatus,
  parseRetryAfter,
  type NaradErrorOptions,
  type PartlyStored,
} from "../errors.js";
import type { components } from "../generated/openapi.js";
import type { ClientOptions, Logger, NaradEvent } from "../options.js";
import { Pool, type Node } from "./pool.js";
import { abortReason, linkSignals, sleep, toBase64, unrefTimer, utf8Decode, utf8Encode } from "./util.js";

type S = components["schemas"];

/** The longest a Retry-After holds a call or a consumer back, whatever it says (as in Go and Python). */
const MAX_RETRY_AFTER_MS = 300_000;

/**
 * How long a long poll its caller gave up on (a consumer's stop) may still take to begin
 * its answer, in ms. fetch cannot half-close the poll's connection (as the Python SDK
 * does, so that the broker ends the poll and answers at once), and closing it drops an
 * answer the broker has sent and fetch has not taken in yet: what it leased would stay
 * leased for a whole visibility timeout. So the poll is left open this long: an answer
 * on its way is read (and handed back by the caller), a poll the broker would end
 * within this by itself ends so, and an idle poll is then closed.
 */
export const POLL_ANSWER_WAIT_MS = 1000;

/**
 * How long, from the moment its caller gave up, a long poll's answer may take to be read
 * in full, in ms; then the poll is closed whatever it was doing, so a stop never waits on
 * an answer that stalls.
 */
export const POLL_READ_GRACE_MS = 5000;

export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestSpec {
  operation: string;
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  path: string;
  query?: Query;
  body?: Uint8Array | undefined;
  contentType?: string | undefined;
  topic?: string | undefined;
  /** Success statuses; anything else is an error. */
  expect: readonly number[];
  /** Whether an attempt whose outcome is unknown may be retried. */
  retryUncertain: boolean;
  /**
   * A write that may take effect twice (a produce): a proxy's 502, or a 503 without the
   * broker's error body, leaves its outcome unknown, since the proxy may have sent it
   * on and lost the broker's reply.
   */
  unsafe?: boolean | undefined;
  signal?: AbortSignal | undefined;
  /** The bound of each attempt, in ms (default the client's `timeoutMs`). */
  timeoutMs?: number | undefined;
  /**
   * The bound of the whole call, retries included, in ms (default every attempt's bound
   * plus the backoff between them). For calls that must end by a known time.
   */
  totalMs?: number | undefined;
  /**
   * Whether the caller's signal cuts the request at once (default true). A long poll
   * sets false: the broker may have leased messages to it and be answering, so a poll
   * already sent is left open {@link POLL_ANSWER_WAIT_MS} for its answer to begin and
   * {@link POLL_READ_GRACE_MS} for it to be read, and what it leased is returned for the
   * caller to hand back rather than dropped and left leased for a visibility timeout.
   * The attempt's bound, the call's and the client's close still cut it at once.
   */
  abortBody?: boolean | undefined;
  /**
   * The endpoint to send to first (the node that leased the message a lease operation
   * is about); the others are tried only when it fails.
   */
  endpoint?: string | undefined;
}

export interface RawResponse {
  status: number;
  body: Uint8Array;
  headers: Headers;
  endpoint: string;
  attempts: number;
  /** Whether an earlier attempt may have taken effect before this answer. */
  earlierUncertain: boolean;
}

const notSentCodes = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function errCode(e: unknown): string | undefined {
  const c = (e as { code?: unknown } | null)?.code;
  return typeof c === "string" ? c : undefined;
}

/** neverSent reports whether a fetch failure happened before the request could reach a server. */
function neverSent(e: unknown): boolean {
  const cause = (e as { cause?: unknown } | null)?.cause ?? e;
  const code = errCode(cause);
  if (code !== undefined) return notSentCodes.has(code);
  const errs = (cause as { errors?: unknown } | null)?.errors;
  if (Array.isArray(errs) && errs.length > 0) return errs.every((x) => notSentCodes.has(errCode(x) ?? ""));
  return false;
}

function describe(e: unknown): string {
  const cause = (e as { cause?: unknown } | null)?.cause;
  const base = e instanceof Error ? e.message : String(e);
  if (cause instanceof Error) return `${base}: ${cause.message}`;
  const code = errCode(cause);
  return code ? `${base}: ${code}` : base;
}

export class Transport {
  readonly pool: Pool;
  private readonly fetchFn: typeof fetch;
  private readonly headers: Record<string, string>;
  /** Attempts per call, the first included. */
  readonly attempts: number;
  private readonly minBackoff: number;
  private readonly maxBackoff: number;
  readonly timeoutMs: number;
  readonly longPollMarginMs: number;
  private readonly closeCtl = new AbortController();
  private nextId = 1;
  private readonly warn: (message: string, fields: Record<string, unknown>) => void;
  /**
   * @internal The one-cluster check, started by the first call when there are several
   * endpoints: true when they are one cluster, false when not (warned once), undefined
   * when it could not tell or there is one endpoint.
   */
  clusterCheck: Promise<boolean | undefined> | undefined;

  constructor(
    opts: ClientOptions,
    readonly logger: Logger,
    readonly emit: (e: NaradEvent) => void,
  ) {
    const list = typeof opts.endpoints === "string" ? [opts.endpoints] : [...opts.endpoints];
    if (list.length === 0) throw new TypeError("Client: endpoints must name at least one broker URL");
    const urls = list.map((u) => {
      const url = new URL(u);
      if (url.protocol !== "http:" && url.protocol !== "https:") throw new TypeError(`Client: endpoint ${u} is not http(s)`);
      return url.href.replace(/\/+$/, "");
    });
    this.fetchFn = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.headers = { accept: "application/json", ...opts.headers };
    if (opts.auth) {
      this.headers["authorization"] = `Basic ${toBase64(utf8Encode(`${opts.auth.username}:${opts.auth.password}`))}`;
    }
    this.attempts = Math.max(1, Math.floor(opts.retry?.attempts ?? 4));
    this.minBackoff = Math.max(0, opts.retry?.minBackoffMs ?? 50);
    this.maxBackoff = Math.max(this.minBackoff, opts.retry?.maxBackoffMs ?? 5000);
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.longPollMarginMs = opts.longPollMarginMs ?? this.timeoutMs;
    const userWarn = opts.logger?.warn?.bind(opts.logger);
    this.warn = userWarn ?? ((message, fields) => console.warn(message, fields));
    this.pool = new Pool(
      urls,
      opts.breaker ?? {},
      (url) => this.probe(url),
      (url, state) => {
        if (state === "open") this.logger.warn?.("narad: node out of rotation", { endpoint: url });
        else this.logger.info?.("narad: node back in rotation", { endpoint: url });
        this.emit({ type: "breaker", endpoint: url, state });
      },
    );
  }

  get closed(): boolean {
    return this.closeCtl.signal.aborted;
  }

  close(): void {
    if (this.closed) return;
    this.closeCtl.abort(new ClosedError("the client was closed"));
    this.pool.shutdown();
  }

  /** backoff returns the full-jitter wait before attempt `attempt + 1`, at least the Retry-After (bounded). */
  backoff(attempt: number, retryAfterMs?: number): number {
    const cap = Math.min(this.maxBackoff, this.minBackoff * 2 ** (attempt - 1));
    const jittered = Math.random() * cap;
    return retryAfterMs === undefined ? jittered : Math.max(jittered, Math.min(retryAfterMs, MAX_RETRY_AFTER_MS));
  }

  private async probe(url: string): Promise<boolean> {
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), 2000);
    try {
      const res = await this.fetchFn(`${url}/readyz`, { signal: ctl.signal, headers: this.headers });
      await res.arrayBuffer().catch(() => undefined);
      return res.status === 200;
    } catch {
      return false;
    } finally {
      clearTimeout(t);
    }
  }

  /**
   * checkCluster asks every endpoint for GET /v1/cluster and decides whether they are
   * one cluster: the same `cluster_id` when every answer has one, else every answering
   * node listed among the members of every other answer. When they are not, it warns
   * once: produces then land on one of several independent brokers. It never fails a
   * call; endpoints that do not answer are left out, and fewer than two answers cannot
   * tell.
   */
  private async checkCluster(): Promise<boolean | undefined> {
    type Answer = { url: string; nodeId: string; clusterId: string | undefined; members: Set<string> };
    const ask = async (url: string): Promise<Answer | undefined> => {
      const ctl = new AbortController();
      const t = setTimeout(() => ctl.abort(), 5000);
      unrefTimer(t);
      const { signal, unlink } = linkSignals(ctl.signal, this.closeCtl.signal);
      try {
        const res = await this.fetchFn(`${url}/v1/cluster`, { signal, headers: this.headers });
        const body = new Uint8Array(await res.arrayBuffer());
        if (res.status !== 200) return undefined;
        const c = JSON.parse(utf8Decode(body)) as { node_id?: unknown; cluster_id?: unknown; members?: { id?: unknown }[] };
        if (typeof c.node_id !== "string") return undefined;
        const members = new Set((Array.isArray(c.members) ? c.members : []).map((m) => m?.id).filter((id): id is string => typeof id === "string"));
        return { url, nodeId: c.node_id, clusterId: typeof c.cluster_id === "string" ? c.cluster_id : undefined, members };
      } catch {
        return undefined;
      } finally {
        clearTimeout(t);
        unlink();
      }
    };
    const answers = (await Promise.all(this.pool.nodes.map((n) => ask(n.url)))).filter((x): x is Answer => x !== undefined);
    if (answers.length < 2 || this.closed) return undefined;
    let one: boolean;
    if (answers.every((x) => x.clusterId !== undefined)) {
      one = new Set(answers.map((x) => x.clusterId)).size === 1;
    } else {
      one = answers.every((x) => answers.every((y) => x === y || x.nodeId === y.nodeId || y.members.has(x.nodeId)));
    }
    if (!one) {
      this.warn("narad: the endpoints are not one cluster; calls stick to the first healthy one and fail over to the others, so messages may land on independent brokers", {
        endpoints: answers.map((x) => ({ endpoint: x.url, nodeId: x.nodeId, clusterId: x.clusterId })),
      });
    }
    return one;
  }

  private url(node: Node, path: string, query: Query | undefined): string {
    let s = node.url + path;
    if (query) {
      const qs = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) if (v !== undefined) qs.set(k, String(v));
      const q = qs.toString();
      if (q) s += `?${q}`;
    }
    return s;
  }

  async request(spec: RequestSpec): Promise<RawResponse> {
    if (this.closed) throw new ClosedError("the client is closed");
    if (this.clusterCheck === undefined && this.pool.nodes.length > 1) {
      this.clusterCheck = this.checkCluster().catch(() => undefined);
    }
    const id = this.nextId++;
    const started = Date.now();
    this.emit({ type: "operation.start", id, operation: spec.operation, topic: spec.topic, method: spec.method });
    // One meaning of "timeout" in every SDK: the bound of one attempt. The call's budget
    // is every attempt's bound plus the backoff between them (or `totalMs` when given).
    const perAttemptMs = Math.max(1, spec.timeoutMs ?? this.timeoutMs);
    const totalMs = spec.totalMs ?? this.attempts * perAttemptMs + (this.attempts - 1) * this.maxBackoff;
    const timeoutCtl = new AbortController();
    const timer = setTimeout(
      () => timeoutCtl.abort(new TimeoutError(`${spec.operation} did not finish within ${totalMs} ms`, { code: "timeout" })),
      totalMs,
    );
    const { signal, unlink } = linkSignals(spec.signal, timeoutCtl.signal, this.closeCtl.signal);
    let attempts = 0;
    let lastStatus: number | undefined;
    try {
      const res = await this.attemptLoop(spec, id, signal, timeoutCtl.signal, started + totalMs, perAttemptMs, (n, s) => {
        attempts = n;
        lastStatus = s;
      });
      this.emit({ type: "operation.end", id, operation: spec.operation, topic: spec.topic, durationMs: Date.now() - started, attempts, status: res.status, error: undefined });
      return res;
    } catch (e) {
      const err = e instanceof NaradError ? e : undefined;
      this.emit({ type: "operation.end", id, operation: spec.operation, topic: spec.topic, durationMs: Date.now() - started, attempts, status: err?.status ?? lastStatus, error: err });
      throw e;
    } finally {
      clearTimeout(timer);
      unlink();
    }
  }

  /**
   * pickAfter chooses the node of a call's next attempt: the pool's choice among the
   * nodes whose Retry-After (in `notBefore`) has passed, else, when every node in
   * rotation is held back, the one free the soonest (the caller waits until then).
   */
  private pickAfter(tried: ReadonlySet<Node>, preferred: Node | undefined, notBefore: ReadonlyMap<Node, number>): Node {
    const now = Date.now();
    const held = new Set([...notBefore].filter(([, t]) => t > now).map(([n]) => n));
    const free = this.pool.pick(tried, preferred, held);
    if (!held.has(free)) return free;
    let best = free;
    for (const n of held) if (!n.open && (notBefore.get(n) ?? 0) < (notBefore.get(best) ?? 0)) best = n;
    return best;
  }

  private async attemptLoop(
    spec: RequestSpec,
    id: number,
    signal: AbortSignal,
    timedOut: AbortSignal,
    deadline: number,
    perAttemptMs: number,
    progress: (attempts: number, status: number | undefined) => void,
  ): Promise<RawResponse> {
    const tried = new Set<Node>();
    const preferred = this.pool.find(spec.endpoint);
    const writes = spec.method !== "GET";
    let uncertainSeen = false;
    // Per endpoint, the time before which this call does not go back to it: the
    // Retry-After it answered with (a 503 or 429), honoured across failover.
    const notBefore = new Map<Node, number>();
    let next: Node | undefined;
    for (let attempt = 1; ; attempt++) {
      const node = next ?? this.pool.pick(tried, preferred);
      next = undefined;
      tried.add(node);
      const t0 = Date.now();
      let err: NaradError;
      let sent = false;
      const attemptCtl = new AbortController();
      const attemptTimer = setTimeout(() => attemptCtl.abort(), perAttemptMs);
      const linked = linkSignals(signal, attemptCtl.signal);
      const fetchCtl = new AbortController();
      let answered = false;
      const abortFetch = () => {
        if (!fetchCtl.signal.aborted) fetchCtl.abort(abortReason(linked.signal));
      };
      const graceTimers: ReturnType<typeof setTimeout>[] = [];
      let hardCut: { signal: AbortSignal; unlink: () => void } | undefined;
      const cut = () => {
        if (spec.abortBody === false && !attemptCtl.signal.aborted && !timedOut.aborted && !this.closed) {
          // The caller gave up on a long poll already sent: the broker may have leased
          // messages to it and its answer be on the way. Closing the connection now
          // would drop that answer; read it if it comes soon, within a bound.
          if (!answered) {
            graceTimers.push(
              setTimeout(() => {
                if (!answered) abortFetch();
              }, POLL_ANSWER_WAIT_MS),
            );
          }
          graceTimers.push(setTimeout(abortFetch, POLL_READ_GRACE_MS));
          for (const t of graceTimers) unrefTimer(t);
          // The attempt's bound, the call's and the client's close still cut it at once.
          hardCut = linkSignals(attemptCtl.signal, timedOut, this.closeCtl.signal);
          if (hardCut.signal.aborted) abortFetch();
          else hardCut.signal.addEventListener("abort", abortFetch, { once: true });
          return;
        }
        abortFetch();
      };
      // A caller that gave up before the request went out: never send it.
      if (linked.signal.aborted) abortFetch();
      else linked.signal.addEventListener("abort", cut, { once: true });
      try {
        const headers: Record<string, string> = { ...this.headers };
        if (spec.contentType) headers["content-type"] = spec.contentType;
        sent = true;
        const init: RequestInit = { method: spec.method, headers, signal: fetchCtl.signal };
        if (spec.body !== undefined) init.body = spec.body as Uint8Array<ArrayBuffer>;
        const res = await this.fetchFn(this.url(node, spec.path, spec.query), init);
        answered = true;
        const body = new Uint8Array(await res.arrayBuffer());
        progress(attempt, res.status);
        if (spec.expect.includes(res.status)) {
          this.pool.success(node);
          this.emit({ type: "attempt", id, operation: spec.operation, endpoint: node.url, attempt, status: res.status, durationMs: Date.now() - t0, error: undefined });
          return { status: res.status, body, headers: res.headers, endpoint: node.url, attempts: attempt, earlierUncertain: uncertainSeen };
        }
        err = errorFromBody(res.status, body, res.headers, node.url, writes, spec.unsafe === true);
        // 503 (unavailable, or the broker's own timeout), 502 and 504: the node failed
        // (not when it stored part of a batch: it answered, and worked in part).
        if ((res.status === 503 || res.status === 502 || res.status === 504) && err.partlyStored === undefined) this.pool.failure(node);
        else this.pool.success(node);
      } catch (e) {
        progress(attempt, undefined);
        // A node that accepts the connection and never answers fails by timing out:
        // that counts against it like a refused connection, or it stays in rotation.
        if (timedOut.aborted || (attemptCtl.signal.aborted && !signal.aborted)) this.pool.failure(node);
        if (signal.aborted) {
          const reason = abortReason(signal);
          const mayHaveHappened = writes && (sent || uncertainSeen);
          if (reason instanceof NaradError) throw reason.withUncertain(mayHaveHappened);
          throw reason;
        }
        if (attemptCtl.signal.aborted) {
          err = new TimeoutError(`${node.url} did not answer ${spec.operation} within ${perAttemptMs} ms`, {
            code: "timeout",
            endpoint: node.url,
            uncertain: writes,
            cause: e,
          });
        } else if (neverSent(e)) {
          err = new UnavailableError(`cannot reach ${node.url}: ${describe(e)}`, { code: "connection_failed", endpoint: node.url, cause: e });
          this.pool.failure(node);
        } else {
          err = new UnavailableError(`the request to ${node.url} failed before its reply arrived: ${describe(e)}`, {
            code: "connection_failed",
            endpoint: node.url,
            uncertain: writes,
            cause: e,
          });
          this.pool.failure(node);
        }
      } finally {
        clearTimeout(attemptTimer);
        for (const t of graceTimers) clearTimeout(t);
        if (hardCut) {
          hardCut.signal.removeEventListener("abort", abortFetch);
          hardCut.unlink();
        }
        linked.signal.removeEventListener("abort", cut);
        linked.unlink();
      }
      this.emit({ type: "attempt", id, operation: spec.operation, endpoint: node.url, attempt, status: err.status, durationMs: Date.now() - t0, error: err });
      if (err.uncertain) uncertainSeen = true;
      if (err.retryAfterMs !== undefined && err.retryAfterMs > 0) notBefore.set(node, Date.now() + Math.min(err.retryAfterMs, MAX_RETRY_AFTER_MS));
      const final = () => (uncertainSeen && !err.uncertain ? err.withUncertain(true) : err);
      if (!err.retryable || (err.uncertain && !spec.retryUncertain) || attempt >= this.attempts) throw final();
      // Refused and not stored: another node at once, while one is left untried.
      const base = !err.uncertain && this.pool.hasUntried(tried) ? 0 : this.backoff(attempt, err.retryAfterMs);
      // The next node: one whose Retry-After has passed, else the one free the soonest.
      next = this.pickAfter(tried, preferred, notBefore);
      const delay = Math.max(base, (notBefore.get(next) ?? 0) - Date.now());
      if (Date.now() + delay >= deadline) throw final();
      this.emit({ type: "retry", id, operation: spec.operation, attempt, delayMs: delay, error: err });
      this.logger.debug?.("narad: retrying", { operation: spec.operation, attempt, delayMs: Math.round(delay), error: err.message });
      if (delay > 0) {
        try {
          await sleep(delay, signal);
        } catch {
          const reason = abortReason(signal);
          if (reason instanceof NaradError) throw reason.withUncertain(writes && uncertainSeen);
          throw reason;
        }
      }
    }
  }
}

/**
 * errorFromBody reads the broker's `{"error":{"code","message","partly_stored"}}` into a
 * NaradError. An error with `partly_stored` (a produce-batch of which part was stored)
 * is uncertain and not retryable: the stored part would be stored twice by a resend.
 */
export function errorFromBody(status: number, body: Uint8Array, headers: Headers, endpoint: string, write: boolean, unsafe = false): NaradError {
  let code: string | undefined;
  let message: string | undefined;
  let partlyStored: PartlyStored | undefined;
  try {
    const parsed = JSON.parse(utf8Decode(body)) as { error?: { code?: unknown; message?: unknown; partly_stored?: unknown } };
    if (typeof parsed.error?.code === "string") code = parsed.error.code;
    if (typeof parsed.error?.message === "string") message = parsed.error.message;
    partlyStored = readPartlyStored(parsed.error?.partly_stored);
  } catch {
    // Not the broker's JSON (a proxy's page, say): the status decides.
  }
  const err = errorFromStatus(status, code, message ?? `HTTP ${status} from ${endpoint}`, {
    retryAfterMs: parseRetryAfter(headers.get("retry-after")),
    endpoint,
  });
  if (partlyStored !== undefined) {
    const failed = partlyStored.failedPartitions.join(", ");
    const fate = code === "timeout" ? "may or may not be stored" : "were not stored";
    const ctor = err.constructor as new (message: string, opts: NaradErrorOptions) => NaradError;
    return new ctor(
      `only part of the batch was stored: ${partlyStored.stored} message(s) were stored and will be delivered; those of partition(s) ${failed} ${fate}; not resent, since that would store the stored part twice (${err.message})`,
      { code: err.code, status, retryable: false, uncertain: true, retryAfterMs: err.retryAfterMs, endpoint, partlyStored },
    );
  }
  if (unsafe && (status === 502 || (status === 503 && code === undefined))) {
    // A proxy's answer, not the broker's (the broker never answers 502, and its 503s
    // carry a code): the proxy may have sent the request on and lost the reply.
    return err.withUncertain(true);
  }
  // Only a write can have taken effect; a read that failed changed nothing.
  return write ? err : err.withUncertain(false);
}

function readPartlyStored(v: unknown): PartlyStored | undefined {
  if (typeof v !== "object" || v === null) return undefined;
  const p = v as S["PartlyStored"];
  if (typeof p.stored !== "number" || !Array.isArray(p.failed_partitions)) return undefined;
  return { stored: p.stored, failedPartitions: p.failed_partitions.filter((x): x is number => typeof x === "number") };
}

/** parseJSON reads a response body as JSON, failing with a typed error on garbage. */
export function parseJSON<T>(res: RawResponse): T {
  try {
    return JSON.parse(utf8Decode(res.body)) as T;
  } catch (e) {
    throw new InternalError(`the answer from ${res.endpoint} is not valid JSON`, { code: "invalid_response", status: res.status, endpoint: res.endpoint, cause: e });
  }
}
