// Small helpers shared by the SDK's modules: signals, sleeping, bytes and base64.
// Nothing here is exported from the package.

/** Deferred is a promise with its settle functions (Promise.withResolvers is Node 22+). */
export interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (err: unknown) => void;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** abortReason returns what a call aborted by signal rejects with: the signal's reason. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/**
 * linkSignals returns a signal that aborts when any of the given ones does, and a
 * function that detaches the listeners (always call it, or long-lived signals leak).
 */
export function linkSignals(...signals: (AbortSignal | undefined)[]): { signal: AbortSignal; unlink: () => void } {
  const ctl = new AbortController();
  const live = signals.filter((s): s is AbortSignal => s !== undefined);
  const already = live.find((s) => s.aborted);
  if (already) {
    ctl.abort(already.reason);
    return { signal: ctl.signal, unlink: () => {} };
  }
  const handlers: [AbortSignal, () => void][] = [];
  const unlink = () => {
    for (const [s, h] of handlers) s.removeEventListener("abort", h);
    handlers.length = 0;
  };
  for (const s of live) {
    const h = () => {
      unlink();
      ctl.abort(s.reason);
    };
    s.addEventListener("abort", h, { once: true });
    handlers.push([s, h]);
  }
  return { signal: ctl.signal, unlink };
}

/** sleep waits ms, rejecting with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortReason(signal));
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortReason(signal as AbortSignal));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** unrefTimer lets the process exit while a background timer is pending (Node, Bun, Deno). */
export function unrefTimer(t: unknown): void {
  const u = (t as { unref?: () => void } | null)?.unref;
  if (typeof u === "function") u.call(t);
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

export function utf8Encode(s: string): Uint8Array {
  return encoder.encode(s);
}

/** utf8Decode decodes strict UTF-8, throwing a TypeError on invalid bytes. */
export function utf8Decode(b: Uint8Array): string {
  return decoder.decode(b);
}

interface BufferLike {
  from(data: string | Uint8Array, enc?: string): Uint8Array & { toString(enc: string): string };
}

function nodeBuffer(): BufferLike | undefined {
  return (globalThis as { Buffer?: BufferLike }).Buffer;
}

/** toBase64 encodes bytes as standard base64. */
export function toBase64(b: Uint8Array): string {
  const B = nodeBuffer();
  if (B) return B.from(b.buffer instanceof ArrayBuffer ? new Uint8Array(b.buffer, b.byteOffset, b.byteLength) : b).toString("base64");
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

/** fromBase64 decodes standard base64 into a plain Uint8Array. */
export function fromBase64(s: string): Uint8Array {
  const B = nodeBuffer();
  if (B) {
    const buf = B.from(s, "base64");
    return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  }
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** randomId returns a random identifier fit for a message id (a UUID v4 where crypto has one). */
export function randomId(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (c?.randomUUID) return c.randomUUID();
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}${Math.random().toString(36).slice(2)}`;
}

/** durationParam renders ms as the broker's duration syntax (plain milliseconds). */
export function msParam(ms: number): string {
  return String(Math.max(0, Math.round(ms)));
}

/** waitParam renders a long-poll wait (capped by the broker at 20 s) as a duration. */
export function waitParam(ms: number): string {
  return `${Math.max(0, Math.min(20_000, Math.round(ms)))}ms`;
}
