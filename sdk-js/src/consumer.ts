import "./internal/dispose.js";
import type { ClientCore } from "./internal/core.js";
import { ClosedError, LeaseLostError, NaradError, TimeoutError } from "./errors.js";
import { deferred, sleep, unrefTimer, type Deferred } from "./internal/util.js";
import type { Message } from "./message.js";

/** HandlerContext is what a handler gets beside its message. */
export interface HandlerContext {
  /**
   * Aborts when the message's lease is lost (its reason is a LeaseLostError) or when
   * the consumer's shutdown grace ends: stop work then, the message will not be acked.
   */
  signal: AbortSignal;
}

/**
 * Handler handles one message. Resolve to have it acked; throw (or reject) to have it
 * handed back for redelivery (after `nackDelayMs`). A handler may settle the message
 * itself (`message.ack()`, `message.nack({ delayMs })`); the consumer then leaves it be.
 */
export type Handler = (message: Message, ctx: HandlerContext) => Promise<void> | void;

/** ConsumeOptions shape a {@link Consumer}. */
export interface ConsumeOptions {
  /** Handlers running at once (default 1). Only as many messages as free workers are fetched. */
  concurrency?: number;
  /** Long-poll wait per request, in ms (default 10000, at most 20000). */
  waitMs?: number;
  /** Whether leases are renewed while handlers run (default true). */
  leaseRenewal?: boolean;
  /**
   * The lease window to keep, in ms: each renewal sets the lease to end this long from
   * now. Default the topic's visibility timeout, read when the consumer starts.
   */
  leaseMs?: number;
  /** Stop renewing a message's lease after this long, in ms (default 1 h); its handler is then aborted. */
  maxLeaseMs?: number;
  /**
   * How long {@link Consumer.stop} lets running handlers finish, in ms (default 30000);
   * then their `signal` aborts, and a handler still running after a little longer (this
   * again, at most 5 s) is given up on: its message is handed back, its lease no longer
   * renewed.
   */
  shutdownGraceMs?: number;
  /**
   * Delay before a failed message is redelivered, in ms, or a function of the message
   * and error. Default {@link poisonBackoffMs} of its `deliveryAttempt`: 0.5–1 s after
   * the first failure, doubling up to 5 min, so a message that always fails does not
   * hot-loop.
   */
  nackDelayMs?: number | ((message: Message, error: unknown) => number);
  /**
   * Deliveries after which a message that keeps coming back is dead-lettered instead of
   * handled (default 0: never). A message with `deliveryAttempt > maxDeliveries` is
   * produced to {@link ConsumeOptions.deadLetterTopic} (same key and bytes; an envelope
   * gets the reason in `lastError`, its `origin` when it had none, and
   * `narad-dead-letter-*` headers) and then acked; if that produce fails it is
   * nacked with the backoff, never acked. Requires `deadLetterTopic`.
   */
  maxDeliveries?: number;
  /** Where messages past {@link ConsumeOptions.maxDeliveries} go; an existing topic of yours. */
  deadLetterTopic?: string;
  /** Stops the consumer (draining, as {@link Consumer.stop}) when aborted. */
  signal?: AbortSignal;
  /** Called for every handler failure and every error the loop retried; never fatal. */
  onError?: (error: unknown, message: Message | undefined) => void;
}

/** ConsumerStats count what a consumer did so far. */
export interface ConsumerStats {
  /** Messages acked (confirmed), by the consumer or by the handler itself. */
  acked: number;
  /** Messages handed back after a handler failure or at shutdown, or by the handler itself. */
  nacked: number;
  /** Messages whose lease was lost while their handler ran. */
  leaseLost: number;
  /** Handler failures. */
  handlerErrors: number;
  /** Acks that did not succeed (their messages will be delivered again). */
  ackFailed: number;
  /** Lease renewals that succeeded. */
  renewed: number;
  /** Handlers running now. */
  inFlight: number;
}

interface Running {
  msg: Message;
  ctl: AbortController;
  timer: ReturnType<typeof setTimeout> | undefined;
  leaseEnd: number;
  lost: boolean;
  /** The handler returned: renewals stop and a late 410 is no longer a lost lease. */
  finished: boolean;
  /**
   * The shutdown gave up on the handler (it ignored its signal past the grace): its
   * lease is no longer renewed, the message was handed back, and whatever the handler
   * does later is not settled by the consumer.
   */
  abandoned: boolean;
  /** The message is being dead-lettered rather than handled. */
  deadLettering: boolean;
  done: Promise<void>;
}

/**
 * poisonBackoffMs is the default delay before a failed message comes back: full-jitter
 * exponential on its delivery attempt, 1 s × 2^(attempt-1) capped at 5 min, drawn
 * uniformly from [d/2, d]. The same in every Narad SDK.
 */
export function poisonBackoffMs(deliveryAttempt: number, random: () => number = Math.random): number {
  const n = Math.max(1, Math.floor(deliveryAttempt || 1));
  const d = Math.min(300_000, 1000 * 2 ** Math.min(n - 1, 30));
  return Math.round(d / 2 + random() * (d / 2));
}

// Rule 8 of the SDK contract: 400, 401, 403, 404, 409 and 413 are terminal, and so is a
// closed client: a poll answered so ends the loop, a renewal answered so has lost its
// lease. Every other failure (a 500 or 501 included) is reported and retried (rule 7).
const terminalKinds = new Set(["Unauthenticated", "Forbidden", "NotFound", "BadRequest", "Conflict", "TooLarge", "Closed"]);

/**
 * Consumer is a running worker loop made by {@link Client.consume}. `done` settles when
 * it stops: it resolves after a stop and rejects when a terminal error (401, 403, the
 * topic deleted) ended it. It never dies silently: transient errors are retried and
 * reported through `onError`, the logger and the event hook.
 */
export class Consumer implements AsyncDisposable {
  /** The topic consumed. */
  readonly topic: string;
  /** Settles when the consumer has stopped: resolves after a stop, rejects on a terminal error. */
  readonly done: Promise<void>;
  private readonly stats_: Omit<ConsumerStats, "inFlight"> = { acked: 0, nacked: 0, leaseLost: 0, handlerErrors: 0, ackFailed: 0, renewed: 0 };
  private readonly running = new Set<Running>();
  private readonly settles = new Set<Promise<void>>();
  private readonly pollCtl = new AbortController();
  private readonly graceCtl = new AbortController();
  private readonly finished: Deferred<void> = deferred<void>();
  private slotFree: Deferred<void> | undefined;
  private stopping: Promise<void> | undefined;
  private stopRequested = false;
  private leaseMs = 0;
  private readonly concurrency: number;
  private readonly waitMs: number;
  private readonly renew: boolean;
  private readonly maxLeaseMs: number;
  private readonly graceMs: number;
  private readonly maxDeliveries: number;
  private fatal: unknown;

  /** @internal Made by {@link Client.consume}. */
  constructor(
    private readonly client: ClientCore,
    topic: string,
    private readonly handler: Handler,
    private readonly opts: ConsumeOptions,
    private readonly onClose: () => void,
  ) {
    this.topic = topic;
    this.concurrency = Math.max(1, Math.floor(opts.concurrency ?? 1));
    this.waitMs = Math.max(0, Math.min(20_000, opts.waitMs ?? 10_000));
    this.renew = opts.leaseRenewal ?? true;
    this.maxLeaseMs = opts.maxLeaseMs ?? 3_600_000;
    this.graceMs = opts.shutdownGraceMs ?? 30_000;
    this.maxDeliveries = Math.max(0, Math.floor(opts.maxDeliveries ?? 0));
    if (this.maxDeliveries > 0 && !opts.deadLetterTopic) {
      throw new TypeError("consume: maxDeliveries needs a deadLetterTopic (the broker has no dead-letter queue; name a topic of yours to move such messages to)");
    }
    this.done = this.finished.promise;
    // done may be ignored by callers that use stop(); never let it be an unhandled rejection.
    this.done.catch(() => undefined);
    if (opts.signal) {
      if (opts.signal.aborted) this.stopRequested = true;
      else opts.signal.addEventListener("abort", () => void this.stop(), { once: true });
    }
  }

  /** What the consumer did so far. */
  get stats(): ConsumerStats {
    return { ...this.stats_, inFlight: this.running.size };
  }

  /** @internal */
  start(): void {
    void this.loop().then(
      () => this.finish(undefined),
      (e: unknown) => this.finish(e),
    );
  }

  private finish(err: unknown): void {
    this.onClose();
    this.client.emit({ type: "consumer", topic: this.topic, event: "stopped", ...(err === undefined ? {} : { error: err }) });
    if (err === undefined) {
      this.client.logger.info?.("narad: consumer stopped", { topic: this.topic });
      this.finished.resolve();
    } else {
      this.client.logger.error?.("narad: consumer stopped by a terminal error", { topic: this.topic, error: String(err) });
      this.finished.reject(err);
    }
  }

  private report(error: unknown, msg: Message | undefined): void {
    try {
      this.opts.onError?.(error, msg);
    } catch (e) {
      this.client.logger.warn?.("narad: onError threw", { error: String(e) });
    }
  }

  private async loop(): Promise<void> {
    let failures = 0;
    // Learn the lease window once; retried like a poll.
    while (!this.stopRequested && this.leaseMs === 0) {
      if (this.opts.leaseMs !== undefined) {
        this.leaseMs = Math.max(100, this.opts.leaseMs);
        break;
      }
      try {
        this.leaseMs = (await this.client.getTopic(this.topic, { signal: this.pollCtl.signal })).visibilityTimeoutMs;
      } catch (e) {
        if (this.stopRequested) break;
        if (!(await this.onPollError(e, ++failures))) throw e;
      }
    }
    failures = 0;
    while (!this.stopRequested) {
      while (this.running.size >= this.concurrency && !this.stopRequested) {
        this.slotFree = deferred<void>();
        await this.slotFree.promise;
      }
      if (this.stopRequested) break;
      const free = this.concurrency - this.running.size;
      let msgs: Message[];
      try {
        msgs = await this.client.receive(this.topic, { max: free, waitMs: this.waitMs, signal: this.pollCtl.signal });
        failures = 0;
      } catch (e) {
        if (this.stopRequested) break;
        if (this.fatal !== undefined) throw this.fatal;
        if (!(await this.onPollError(e, ++failures))) {
          await this.drain();
          throw e;
        }
        continue;
      }
      if (this.stopRequested) {
        // Fetched after the stop began: never started, so handed back at once.
        await this.client.handBack(msgs);
        this.stats_.nacked += msgs.length;
        break;
      }
      for (const m of msgs) this.run(m);
    }
    await this.drain();
    if (this.fatal !== undefined) throw this.fatal;
  }

  /** onPollError reports a failed poll and waits before the next; false when the error is terminal. */
  private async onPollError(e: unknown, failures: number): Promise<boolean> {
    const terminal = !(e instanceof NaradError) || (terminalKinds.has(e.kind) && !e.retryable);
    if (terminal) return false;
    this.client.emit({ type: "consumer", topic: this.topic, event: "poll_error", error: e });
    this.client.logger.warn?.("narad: consumer poll failed; retrying", { topic: this.topic, error: (e as Error).message, failures });
    this.report(e, undefined);
    try {
      await sleep(this.client.transport.backoff(Math.min(failures, 10), e.retryAfterMs), this.pollCtl.signal);
    } catch {
      // stopped while waiting
    }
    return true;
  }

  private run(msg: Message): void {
    const r: Running = {
      msg,
      ctl: new AbortController(),
      timer: undefined,
      leaseEnd: msg.receivedAt + this.leaseMs,
      lost: false,
      finished: false,
      abandoned: false,
      deadLettering: false,
      done: Promise.resolve(),
    };
    this.running.add(r);
    this.scheduleLease(r);
    r.done = this.execute(r).finally(() => {
      if (r.timer !== undefined) clearTimeout(r.timer);
      this.running.delete(r);
      this.slotFree?.resolve();
    });
  }

  private scheduleLease(r: Running): void {
    if (r.lost) return;
    const now = Date.now();
    // Renew half-way through the window, well before two thirds of it, while the lease
    // that renewal makes still ends within maxLeaseMs of receipt; then let it run out.
    const at = r.leaseEnd - this.leaseMs / 2;
    if (this.renew && at - r.msg.receivedAt + this.leaseMs <= this.maxLeaseMs) {
      r.timer = setTimeout(() => void this.renewLease(r), Math.max(0, at - now));
    } else {
      r.timer = setTimeout(() => this.loseLease(r, new LeaseLostError("the lease ran out (renewal off or past maxLeaseMs)", { code: "lease_lost" })), Math.max(0, r.leaseEnd - now));
    }
    unrefTimer(r.timer);
  }

  private async renewLease(r: Running): Promise<void> {
    r.timer = undefined;
    for (let attempt = 1; ; attempt++) {
      if (r.lost || r.finished || r.msg.settled) return;
      const sent = Date.now();
      const left = r.leaseEnd - sent;
      if (left <= 0) {
        this.loseLease(r, new LeaseLostError("the lease lapsed before it could be renewed", { code: "lease_lost" }));
        return;
      }
      // The whole renewal, retries included, ends with the lease: past it a renewal is
      // too late, and the handler must be cancelled then, not after every attempt.
      const bound = new AbortController();
      const boundTimer = setTimeout(() => bound.abort(new TimeoutError("the lease ended before its renewal was answered", { code: "timeout" })), left);
      unrefTimer(boundTimer);
      try {
        await this.client.extend(this.topic, r.msg.receiptHandle as string, {
          leaseMs: this.leaseMs,
          timeoutMs: Math.max(50, Math.min(left, this.client.transport.timeoutMs)),
          signal: bound.signal,
          ...(r.msg.endpoint === undefined ? {} : { endpoint: r.msg.endpoint }),
        });
        clearTimeout(boundTimer);
        if (r.lost || r.finished || r.msg.settled) return;
        r.leaseEnd = sent + this.leaseMs;
        this.stats_.renewed++;
        this.client.emit({ type: "consumer", topic: this.topic, event: "renewed", partition: r.msg.partition, offset: r.msg.offset });
        this.scheduleLease(r);
        return;
      } catch (e) {
        clearTimeout(boundTimer);
        if (r.msg.settled) return;
        if (bound.signal.aborted) {
          this.loseLease(r, new LeaseLostError("the lease ended before its renewal was answered", { code: "lease_lost" }));
          return;
        }
        if (e instanceof NaradError && e.kind === "LeaseLost") {
          this.loseLease(r, e);
          return;
        }
        this.report(e, r.msg);
        this.client.logger.warn?.("narad: lease renewal failed; retrying", { topic: this.topic, offset: r.msg.offset, error: String(e) });
        if (e instanceof NaradError && terminalKinds.has(e.kind) && !e.retryable) {
          this.loseLease(r, e);
          return;
        }
        try {
          await sleep(Math.min(this.client.transport.backoff(attempt), Math.max(0, r.leaseEnd - Date.now() - 10)), r.ctl.signal);
        } catch {
          return;
        }
      }
    }
  }

  private loseLease(r: Running, err: NaradError): void {
    if (r.lost || r.finished || r.msg.settled) return;
    r.lost = true;
    r.msg.markLost();
    this.stats_.leaseLost++;
    this.client.emit({ type: "consumer", topic: this.topic, event: "lease_lost", partition: r.msg.partition, offset: r.msg.offset, error: err });
    this.client.logger.warn?.("narad: lease lost; the handler is cancelled and the message will be delivered again", { topic: this.topic, partition: r.msg.partition, offset: r.msg.offset });
    r.ctl.abort(err);
  }

  private async execute(r: Running): Promise<void> {
    const msg = r.msg;
    let failure: unknown;
    let failed = false;
    if (this.maxDeliveries > 0 && (msg.deliveryAttempt ?? 1) > this.maxDeliveries) {
      // The lease stays renewed while the dead-letter produce runs, however slow: a
      // lapsed lease would let the message be delivered, and dead-lettered, again.
      r.deadLettering = true;
      await this.track(this.deadLetter(r));
      return;
    }
    const onGrace = () => r.ctl.abort(new ClosedError("the consumer's shutdown grace period ended"));
    this.graceCtl.signal.addEventListener("abort", onGrace, { once: true });
    try {
      await this.handler(msg, { signal: r.ctl.signal });
    } catch (e) {
      failed = true;
      failure = e;
    } finally {
      this.graceCtl.signal.removeEventListener("abort", onGrace);
      this.stopRenewing(r);
    }
    if (r.abandoned) return; // handed back at shutdown: whatever it did comes too late
    if (r.lost || msg.state === "lost") return; // never ack a message whose lease is gone
    if (msg.settled) {
      // The handler settled it itself: count it, settle nothing more.
      if (msg.state === "acked") this.stats_.acked++;
      else if (msg.state === "nacked") this.stats_.nacked++;
      return;
    }
    if (!failed && r.ctl.signal.aborted) {
      // Cut by the shutdown grace: hand it back rather than ack unfinished work.
      failed = true;
      failure = r.ctl.signal.reason;
    }
    if (!failed) {
      await this.track(this.ackConfirmed(msg));
      return;
    }
    this.stats_.handlerErrors++;
    this.client.emit({ type: "consumer", topic: this.topic, event: "handler_error", partition: msg.partition, offset: msg.offset, error: failure });
    this.client.logger.warn?.("narad: handler failed; handing the message back", { topic: this.topic, partition: msg.partition, offset: msg.offset, error: String(failure) });
    this.report(failure, msg);
    await this.track(this.nackQuietly(msg, this.nackDelay(msg, failure)));
  }

  private nackDelay(msg: Message, failure: unknown): number {
    try {
      const d = this.opts.nackDelayMs;
      if (typeof d === "function") return d(msg, failure);
      if (d !== undefined) return d;
    } catch (e) {
      this.report(e, msg);
    }
    return poisonBackoffMs(msg.deliveryAttempt ?? 1);
  }

  /** stopRenewing ends a message's lease renewals: its handler returned, or it is settled now. */
  private stopRenewing(r: Running): void {
    r.finished = true;
    if (r.timer !== undefined) clearTimeout(r.timer);
    r.timer = undefined;
  }

  /**
   * deadLetter moves a message past maxDeliveries to the dead-letter topic and acks it;
   * when the produce fails it nacks with the backoff, so nothing is acked that was not
   * dead-lettered. The lease is renewed until the produce has finished and the ack (or
   * nack) is sent.
   */
  private async deadLetter(r: Running): Promise<void> {
    const msg = r.msg;
    const dlt = this.opts.deadLetterTopic as string;
    const fields = { topic: this.topic, partition: msg.partition, offset: msg.offset, deliveryAttempt: msg.deliveryAttempt, deadLetterTopic: dlt };
    try {
      const env = msg.envelope();
      const note = {
        "narad-dead-letter-topic": this.topic,
        "narad-dead-letter-partition": String(msg.partition),
        "narad-dead-letter-offset": String(msg.offset),
        "narad-dead-letter-deliveries": String(msg.deliveryAttempt ?? 0),
      };
      // The reason goes in last_error, as the Go and Python SDKs write it, and the
      // envelope keeps where it came from.
      const lastError = `delivered ${msg.deliveryAttempt ?? 0} times, over the limit of ${this.maxDeliveries}`;
      const body = env ? env.with({ headers: { ...env.headers, ...note }, lastError, origin: env.origin ?? this.topic }) : msg.body;
      await this.client.produce(dlt, body, { ...(msg.key === undefined ? {} : { key: msg.key }), ...(env ? {} : { contentType: guessType(msg.body) }) });
    } catch (e) {
      this.stopRenewing(r);
      this.client.logger.warn?.("narad: dead-lettering failed; handing the message back", { ...fields, error: String(e) });
      this.report(e, msg);
      if (!r.lost) await this.nackQuietly(msg, poisonBackoffMs(msg.deliveryAttempt ?? 1));
      return;
    }
    this.stopRenewing(r);
    if (r.lost) {
      // The lease was lost during the produce: the message comes again (and is
      // dead-lettered again); an ack now would only be refused.
      this.client.logger.warn?.("narad: message dead-lettered, but its lease was lost meanwhile; it will be delivered again", fields);
      return;
    }
    this.client.logger.warn?.("narad: message dead-lettered after too many deliveries", fields);
    await this.ackConfirmed(msg);
  }

  private async track(p: Promise<void>): Promise<void> {
    this.settles.add(p);
    try {
      await p;
    } finally {
      this.settles.delete(p);
    }
  }

  private async ackConfirmed(msg: Message): Promise<void> {
    try {
      await msg.ack();
      this.stats_.acked++;
      this.client.emit({ type: "consumer", topic: this.topic, event: "acked", partition: msg.partition, offset: msg.offset });
    } catch (e) {
      this.stats_.ackFailed++;
      this.client.emit({ type: "consumer", topic: this.topic, event: "ack_failed", partition: msg.partition, offset: msg.offset, error: e });
      this.client.logger.warn?.("narad: ack failed; the message will be delivered again", { topic: this.topic, partition: msg.partition, offset: msg.offset, error: String(e) });
      this.report(e, msg);
      if (e instanceof NaradError && (e.kind === "Unauthenticated" || e.kind === "Forbidden")) this.failWith(e);
    }
  }

  private async nackQuietly(msg: Message, delayMs: number): Promise<void> {
    try {
      await msg.nack({ delayMs });
      this.stats_.nacked++;
      this.client.emit({ type: "consumer", topic: this.topic, event: "nacked", partition: msg.partition, offset: msg.offset });
    } catch (e) {
      // The lease lapses anyway and the message comes back; say so and go on.
      this.client.logger.debug?.("narad: nack failed; the lease will lapse instead", { topic: this.topic, offset: msg.offset, error: String(e) });
      this.report(e, msg);
    }
  }

  private failWith(e: unknown): void {
    if (this.fatal !== undefined) return;
    this.fatal = e;
    this.stopRequested = true;
    this.pollCtl.abort(new ClosedError("the consumer hit a terminal error"));
    this.slotFree?.resolve();
  }

  /** drain lets running handlers finish within the grace period, then waits for their settlements. */
  private async drain(): Promise<void> {
    if (this.running.size > 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const grace = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, this.graceMs);
      });
      const all = Promise.allSettled([...this.running].map((r) => r.done)).then(() => undefined);
      await Promise.race([all, grace]);
      clearTimeout(timer);
      if (this.running.size > 0) {
        this.client.logger.warn?.("narad: shutdown grace ended; cancelling running handlers", { topic: this.topic, running: this.running.size });
        this.graceCtl.abort();
        // Handlers that ignore their signal still get a short while before we move on.
        await Promise.race([Promise.allSettled([...this.running].map((r) => r.done)), sleep(Math.min(5000, this.graceMs))]);
        // Given up on: stop renewing their leases and hand their messages back, so none
        // stays held (renewed up to maxLeaseMs) after stop() returned.
        for (const r of this.running) if (!r.deadLettering && !r.finished) this.abandon(r);
      }
    }
    while (this.settles.size > 0) await Promise.allSettled([...this.settles]);
  }

  /** abandon gives up on a handler that outlived the shutdown grace: no more renewals, and its message is handed back. */
  private abandon(r: Running): void {
    r.abandoned = true;
    this.stopRenewing(r);
    const msg = r.msg;
    this.client.logger.warn?.("narad: a handler ignored the end of the shutdown grace; its message is handed back", { topic: this.topic, partition: msg.partition, offset: msg.offset });
    if (r.lost || msg.settled) return;
    void this.track(this.nackQuietly(msg, 0));
  }

  /**
   * stop drains the consumer in order: stop polling (a poll in flight is left open up to
   * 1 s for an answer the broker may be sending, whose messages are handed back, then
   * closed), let running handlers finish within
   * the grace period (then abort them and hand their messages back; a handler that
   * ignores the abort is given up on a little later: its lease is no longer renewed and
   * its message is handed back), flush pending acks, hand back messages that were
   * fetched but never started, and resolve.
   * Stopping twice is harmless; a consumer ended by a terminal error resolves too
   * (read `done` for that error).
   */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.stopRequested = true;
      this.pollCtl.abort(new ClosedError("the consumer is stopping"));
      this.slotFree?.resolve();
      await this.done.catch(() => undefined);
    })();
    return this.stopping;
  }

  /** Stops the consumer, so `await using consumer = client.consume(…)` drains it. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** guessType keeps a JSON body JSON (a schema topic accepts only that); anything else goes as bytes. */
function guessType(body: Uint8Array): string {
  try {
    JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
    return "application/json";
  } catch {
    return "application/octet-stream";
  }
}
