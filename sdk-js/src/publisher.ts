import "./internal/dispose.js";
import type { Body } from "./body.js";
import { outgoingToWire, type ClientCore } from "./internal/core.js";
import { BufferFullError, ClosedError, NaradError } from "./errors.js";
import type { components } from "./generated/openapi.js";
import { abortReason, deferred, type Deferred } from "./internal/util.js";
import type { Produced } from "./types.js";

type WireOutgoing = components["schemas"]["OutgoingMessage"];

/** PublisherOptions shape a {@link Publisher}'s batching and its bound. */
export interface PublisherOptions {
  /** Send a batch once it holds this many messages (default 100, at most 1000). */
  maxBatchMessages?: number;
  /** Send a batch once it holds about this many bytes (default 1 MiB, at most 7 MiB). */
  maxBatchBytes?: number;
  /** How long the first message of a batch waits for company, in ms (default 5). */
  lingerMs?: number;
  /** Most messages buffered or in flight (default 10000). */
  maxBufferedMessages?: number;
  /** Most bytes buffered or in flight (default 64 MiB). */
  maxBufferedBytes?: number;
  /** What `publish` does when the buffer is full: wait for room (default) or fail with BufferFullError. */
  whenFull?: "block" | "error";
  /** Batches sent at once (default 1, which keeps batches in order). */
  maxInFlightBatches?: number;
  /** Whether a batch whose outcome is unknown is retried (default the client's `allowDuplicates`). */
  allowDuplicates?: boolean;
  /** The deadline of one batch request, retries included, in ms (default the client's). */
  timeoutMs?: number;
}

/** PublishOptions place one published message. */
export interface PublishOptions {
  /** The key: the same key always lands in the same partition. */
  key?: string;
  /** A partition to pin, from 0. */
  partition?: number;
  /** Gives up waiting for buffer room (block mode) when aborted; a message already buffered is still sent. */
  signal?: AbortSignal;
}

interface Item {
  wire: WireOutgoing;
  size: number;
  result: Deferred<Produced>;
}

interface Waiter {
  size: number;
  ready: Deferred<void>;
}

/**
 * Publisher batches messages for one topic by count, bytes and linger time and sends
 * each batch in one request, with a result per message: `publish` resolves with where
 * the message was stored once it is durable, or rejects with why it was not.
 * The buffer is bounded: `publish` waits for room (or fails with BufferFullError when
 * `whenFull` is "error"). Close it to flush; closing twice is harmless.
 */
export class Publisher implements AsyncDisposable {
  /** The topic published to. */
  readonly topic: string;
  private readonly queue: Item[] = [];
  private readonly waiters: Waiter[] = [];
  private bufferedMessages = 0;
  private bufferedBytes = 0;
  private inFlight = 0;
  private readonly inFlightDone = new Set<Promise<void>>();
  private timer: ReturnType<typeof setTimeout> | undefined;
  private closing: Promise<void> | undefined;
  private isClosing = false;
  private readonly maxMsgs: number;
  private readonly maxBytes: number;
  private readonly linger: number;
  private readonly maxBufMsgs: number;
  private readonly maxBufBytes: number;
  private readonly maxInFlight: number;

  /** @internal Made by {@link Client.publisher}. */
  constructor(
    private readonly client: ClientCore,
    topic: string,
    private readonly opts: PublisherOptions,
    private readonly onClose: () => void,
  ) {
    this.topic = topic;
    this.maxMsgs = Math.max(1, Math.min(1000, opts.maxBatchMessages ?? 100));
    this.maxBytes = Math.max(1, Math.min(7 * 1024 * 1024, opts.maxBatchBytes ?? 1024 * 1024));
    this.linger = Math.max(0, opts.lingerMs ?? 5);
    this.maxBufMsgs = Math.max(1, opts.maxBufferedMessages ?? 10_000);
    this.maxBufBytes = Math.max(1, opts.maxBufferedBytes ?? 64 * 1024 * 1024);
    this.maxInFlight = Math.max(1, opts.maxInFlightBatches ?? 1);
  }

  /** Messages buffered or in flight now. */
  get buffered(): number {
    return this.bufferedMessages;
  }

  private hasRoom(size: number): boolean {
    // A message bigger than the whole byte bound still goes, alone.
    return this.bufferedMessages < this.maxBufMsgs && (this.bufferedBytes + size <= this.maxBufBytes || this.bufferedBytes === 0);
  }

  /**
   * publish buffers one message and resolves with where it was stored once it is
   * durable. It rejects with the batch's error when the batch failed (every message of
   * a failed batch gets the error, with `uncertain` when it may have been stored). A
   * batch the broker refuses whole for one of its messages (400, such as a schema
   * violation, or 413) is sent again one message at a time, so only that one fails.
   */
  async publish(body: Body, opts: PublishOptions = {}): Promise<Produced> {
    if (this.isClosing) throw new ClosedError("the publisher is closed");
    const out: { key?: string; partition?: number } = {};
    if (opts.key !== undefined) out.key = opts.key;
    if (opts.partition !== undefined) out.partition = opts.partition;
    const { wire, size } = outgoingToWire({ body, ...out });
    if (this.hasRoom(size) && this.waiters.length === 0) this.reserve(size);
    else {
      if (this.opts.whenFull === "error") throw new BufferFullError(`the publisher's buffer is full (${this.bufferedMessages} messages, ${this.bufferedBytes} bytes)`);
      await this.waitForRoom(size, opts.signal); // reserves the room for us
      if (this.isClosing) {
        this.release(1, size);
        throw new ClosedError("the publisher was closed while waiting for room");
      }
    }
    const item: Item = { wire, size, result: deferred<Produced>() };
    this.queue.push(item);
    this.schedule();
    return item.result.promise;
  }

  private reserve(size: number): void {
    this.bufferedMessages++;
    this.bufferedBytes += size;
  }

  private release(count: number, bytes: number): void {
    this.bufferedMessages -= count;
    this.bufferedBytes -= bytes;
    this.wakeWaiters();
  }

  /**
   * ready resolves when a message of `size` bytes would be buffered without waiting:
   * fire-and-forget producers `await publisher.ready()` before each `publish` to stay
   * within the bound.
   */
  async ready(size = 0, signal?: AbortSignal): Promise<void> {
    if (this.hasRoom(size) && this.waiters.length === 0) return;
    await this.waitForRoom(size, signal);
    this.release(1, size); // we buffer nothing: hand the reserved room on
  }

  private waitForRoom(size: number, signal: AbortSignal | undefined): Promise<void> {
    const w: Waiter = { size, ready: deferred<void>() };
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    this.waiters.push(w);
    if (signal) {
      const onAbort = () => {
        const i = this.waiters.indexOf(w);
        if (i < 0) return; // already woken: the room is ours and publish goes on
        this.waiters.splice(i, 1);
        w.ready.reject(abortReason(signal));
        this.wakeWaiters();
      };
      signal.addEventListener("abort", onAbort, { once: true });
      const off = () => signal.removeEventListener("abort", onAbort);
      w.ready.promise.then(off, off);
    }
    // Make sure something is being sent, or no room will ever appear.
    this.schedule(true);
    return w.ready.promise;
  }

  /** wakeWaiters hands room, in order, to as many waiting publishers as fit, reserving it for each. */
  private wakeWaiters(): void {
    while (this.waiters.length > 0) {
      const w = this.waiters[0] as Waiter;
      if (!this.isClosing && !this.hasRoom(w.size)) return;
      this.waiters.shift();
      this.reserve(w.size);
      w.ready.resolve();
    }
  }

  private pendingBytes(): number {
    let n = 0;
    for (const it of this.queue) n += it.size;
    return n;
  }

  private schedule(now = false): void {
    if (this.queue.length === 0) return;
    const full = this.queue.length >= this.maxMsgs || this.pendingBytes() >= this.maxBytes;
    if (now || full || this.linger === 0 || this.isClosing) {
      if (this.timer !== undefined) clearTimeout(this.timer);
      this.timer = undefined;
      this.sendReady();
      return;
    }
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      this.sendReady();
    }, this.linger);
  }

  private sendReady(): void {
    while (this.queue.length > 0 && this.inFlight < this.maxInFlight) {
      const batch: Item[] = [];
      let bytes = 0;
      while (this.queue.length > 0 && batch.length < this.maxMsgs) {
        const next = this.queue[0] as Item;
        if (batch.length > 0 && bytes + next.size > this.maxBytes) break;
        batch.push(next);
        bytes += next.size;
        this.queue.shift();
      }
      this.inFlight++;
      const p = this.send(batch).finally(() => {
        this.inFlight--;
        this.inFlightDone.delete(p);
        this.release(batch.length, bytes);
        if (this.queue.length > 0) this.schedule(this.isClosing || this.waiters.length > 0);
      });
      this.inFlightDone.add(p);
    }
  }

  private async send(batch: Item[]): Promise<void> {
    try {
      const bopts: { allowDuplicates?: boolean; timeoutMs?: number } = {};
      if (this.opts.allowDuplicates !== undefined) bopts.allowDuplicates = this.opts.allowDuplicates;
      if (this.opts.timeoutMs !== undefined) bopts.timeoutMs = this.opts.timeoutMs;
      const res = await this.client.sendBatch(this.topic, batch.map((b) => b.wire), bopts);
      batch.forEach((b, i) => {
        const p = res[i];
        if (p) b.result.resolve(p);
        else b.result.reject(new NaradError("Internal", "the broker returned fewer results than messages", { code: "invalid_response", uncertain: true }));
      });
    } catch (e) {
      if (batch.length > 1 && e instanceof NaradError && e.partlyStored === undefined && (e.status === 400 || e.status === 413)) {
        // The broker refused the whole request for one message (a schema violation, a
        // bad payload; nothing stored). The batch mixes the messages of many callers:
        // send each alone, so that only the refused one fails (as the Go and Python SDKs do).
        for (const b of batch) await this.send([b]);
        return;
      }
      for (const b of batch) b.result.reject(e);
    }
  }

  /** flush sends everything buffered now and resolves when every batch has its answer. */
  async flush(): Promise<void> {
    this.schedule(true);
    while (this.queue.length > 0 || this.inFlightDone.size > 0) {
      await Promise.allSettled([...this.inFlightDone]);
      this.schedule(true);
    }
  }

  /** close flushes and stops the publisher; later `publish` calls fail with ClosedError. Closing twice is harmless. */
  close(): Promise<void> {
    this.isClosing = true;
    this.closing ??= (async () => {
      this.wakeWaiters(); // while closing, every waiter wakes and fails with ClosedError
      await this.flush();
      this.onClose();
    })();
    return this.closing;
  }

  /** Closes the publisher, so `await using pub = client.publisher(…)` flushes it. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
