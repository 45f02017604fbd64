import "./internal/dispose.js";
import { encodeBody, MAX_MESSAGE_BYTES, type Body } from "./body.js";
import { Consumer, type ConsumeOptions, type Handler } from "./consumer.js";
import { ClosedError, errorFromStatus, LeaseLostError, NaradError, TooLargeError } from "./errors.js";
import type { components } from "./generated/openapi.js";
import { BATCH_BODY_BUDGET, outgoingToWire, type ClientCore } from "./internal/core.js";
import { Transport, parseJSON, type Query, type RawResponse, type RequestSpec } from "./internal/transport.js";
import { abortReason, msParam, sleep, utf8Decode, waitParam } from "./internal/util.js";
import { Message, type ExtendOptions, type NackOptions, type SettleOptions, type Settler } from "./message.js";
import type { CallOptions, ClientOptions, Logger, NaradEvent } from "./options.js";
import { Publisher, type PublisherOptions } from "./publisher.js";
import { Replay, type ReplayOptions } from "./replay.js";
import {
  childFromWire,
  memberFromWire,
  moveFromWire,
  settingsToWire,
  topicDetailFromWire,
  topicFromWire,
  type AckEntry,
  type AckResult,
  type ChildInfo,
  type ClusterInfo,
  type ForceLeaderResult,
  type Grant,
  type Member,
  type Move,
  type Outgoing,
  type Produced,
  type TopicChanges,
  type TopicDetail,
  type TopicInfo,
  type TopicSettings,
  type TopicSpec,
  type UserInfo,
} from "./types.js";

type S = components["schemas"];

/** ProduceOptions place one message and decide how an unknown outcome is handled. */
export interface ProduceOptions extends CallOptions {
  /** The key: the same key always lands in the same partition. */
  key?: string;
  /** A partition to pin, from 0; overrides `key`. */
  partition?: number;
  /** Overrides the Content-Type chosen from the body's type (the bytes stay the same). */
  contentType?: string;
  /** Whether to retry when the outcome is unknown (default the client's `allowDuplicates`). */
  allowDuplicates?: boolean;
}

/** ProduceBatchOptions decide how an unknown outcome of a batch is handled. */
export interface ProduceBatchOptions extends CallOptions {
  /** Whether to retry when the outcome is unknown (default the client's `allowDuplicates`). */
  allowDuplicates?: boolean;
}

/** ProduceResult is the outcome of one message of a batch. */
export type ProduceResult = { ok: true; produced: Produced } | { ok: false; error: NaradError };

/**
 * ProduceBatchError is thrown by {@link Client.produceBatch} when any message failed.
 * `results` has one entry per message, in order: a partial failure is never hidden.
 * Its own kind, code and `partlyStored` are those of the first failure; its flags are
 * the call's: when some messages were stored, or some request's outcome is unknown, it
 * is `uncertain` and not `retryable` (sending the batch again whole stores them twice).
 */
export class ProduceBatchError extends NaradError {
  /** One result per message, in the order given. */
  readonly results: readonly ProduceResult[];

  /** Builds the error from the per-message results (at least one failed). */
  constructor(results: readonly ProduceResult[]) {
    const failed = results.filter((r): r is { ok: false; error: NaradError } => !r.ok);
    const first = (failed[0] as { error: NaradError }).error;
    // The flags describe the whole call: when some messages were stored (or some
    // request's outcome is unknown), sending the batch again whole would store them
    // twice, so it is uncertain and not retryable. Each result keeps its own error.
    const stored = results.length - failed.length;
    super(first.kind, `${failed.length} of ${results.length} messages failed; first: ${first.message}`, {
      code: first.code,
      status: first.status,
      retryable: stored === 0 && failed.every((f) => f.error.retryable),
      uncertain: stored > 0 || failed.some((f) => f.error.uncertain),
      retryAfterMs: first.retryAfterMs,
      endpoint: first.endpoint,
      cause: first,
      partlyStored: first.partlyStored,
    });
    this.name = "ProduceBatchError";
    this.results = results;
  }
}

/** ReceiveOptions shape one long poll. */
export interface ReceiveOptions extends CallOptions {
  /** Most messages to take (1 to 1000, default 1); each gets its own lease. */
  max?: number;
  /** How long to wait for a message, in ms (default 10000, at most 20000). */
  waitMs?: number;
}

/** MessagesOptions shape the {@link Client.messages} iterator. */
export interface MessagesOptions {
  /** Ends the iteration: it rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Long-poll wait per request, in ms (default 10000). */
  waitMs?: number;
  /**
   * Messages fetched per request (default 1). Fetched messages wait, leased, until the
   * loop reaches them, so keep this small; those never reached are handed back.
   */
  batchSize?: number;
}

/** ReadRangeOptions choose where a replay read starts. */
export interface ReadRangeOptions extends CallOptions {
  /** First offset to read (default the oldest retained). */
  from?: number;
  /** Start at the first message written at or after this time (a Date or Unix ms). */
  fromTime?: Date | number;
  /** Most messages to return (1 to 1000, default 100). */
  max?: number;
  /**
   * The topic incarnation the read is meant for (from {@link Client.getTopic} or an
   * earlier {@link MessageRange.incarnation}): when the topic was deleted and created
   * again since, the read fails with a Conflict error, code `incarnation_mismatch`,
   * rather than answering with the new topic's messages.
   */
  incarnation?: string;
}

/** MessageRange is one replay read: messages in log order and where to continue. */
export interface MessageRange {
  /** The messages, possibly none. */
  messages: Message[];
  /** The offset to pass as `from` to continue. */
  nextOffset: number;
  /** The incarnation of the topic read (pass it as `incarnation` to continue), when the broker names it. */
  incarnation: string | undefined;
  /**
   * Offsets of damaged messages (their stored record fails its checksum) the read went
   * past; they are never served, and `nextOffset` is already past them.
   */
  damaged: number[];
}

/** DeleteTopicOptions say which topic a delete means. */
export interface DeleteTopicOptions extends CallOptions {
  /**
   * The topic incarnation to delete (`incarnation` of {@link Client.getTopic} or any
   * {@link TopicInfo}): when the name is another topic now (deleted and created again
   * since that was read), the delete fails with a Conflict error, code
   * `incarnation_mismatch`, and deletes nothing. It also lets the SDK resend a delete
   * whose reply was lost: the resend cannot delete a topic created under the name since.
   */
  incarnation?: string;
}

/** CreateUserOptions are the fields of a new user. */
export interface CreateUserOptions extends CallOptions {
  /** What the user may do (default nothing). */
  grants?: Grant[];
}

/** The wait before resending ack-batch entries answered 503: the broker's Retry-After for them. */
const ENTRY_RETRY_AFTER_MS = 1000;
/** The fewest ack-batch requests sent for entries answered 503 (as in Go and Python). */
const ACK_BATCH_ROUNDS = 6;

function topicPath(topic: string, rest = ""): string {
  return `/v1/topics/${encodeURIComponent(topic)}${rest}`;
}

const quietLogger: Logger = {};

/**
 * Client talks to a Narad cluster over HTTP. It is cheap to keep for the life of a
 * process and safe to share. Every method takes an optional {@link CallOptions} (an
 * AbortSignal and a deadline); failures are {@link NaradError}s.
 *
 * ```ts
 * await using client = new Client({ endpoints: ["http://127.0.0.1:7942"] });
 * await client.produce("orders", { id: 1 });
 * ```
 */
export class Client implements AsyncDisposable, ClientCore {
  /** @internal */
  readonly transport: Transport;
  /** @internal */
  readonly logger: Logger;
  /** @internal */
  readonly allowDuplicates: boolean;
  private readonly hook: ((e: NaradEvent) => void) | undefined;
  private readonly consumers = new Set<Consumer>();
  private readonly publishers = new Set<Publisher>();
  private closing: Promise<void> | undefined;
  private readonly settler: Settler;

  /** Creates a client; nothing is sent until the first call. */
  constructor(opts: ClientOptions) {
    this.logger = opts.logger ?? quietLogger;
    this.hook = opts.onEvent;
    this.allowDuplicates = opts.allowDuplicates ?? true;
    this.transport = new Transport(opts, this.logger, (e) => this.emit(e));
    this.settler = {
      ack: (t, h, o) => this.ack(t, h, o),
      nack: (t, h, o) => this.nack(t, h, o),
      extend: (t, h, o) => this.extend(t, h, o),
    };
  }

  /** @internal Sends an event to the hook; a hook that throws is logged, never fatal. */
  emit(e: NaradEvent): void {
    if (!this.hook) return;
    try {
      this.hook(e);
    } catch (err) {
      this.logger.warn?.("narad: the onEvent hook threw", { error: String(err) });
    }
  }

  private call(spec: RequestSpec): Promise<RawResponse> {
    return this.transport.request(spec);
  }

  private async json<T>(spec: Omit<RequestSpec, "retryUncertain"> & { retryUncertain?: boolean }, body?: unknown): Promise<T> {
    const full: RequestSpec = { retryUncertain: spec.method === "GET", ...spec };
    if (body !== undefined) {
      full.body = new TextEncoder().encode(JSON.stringify(body));
      full.contentType = "application/json";
    }
    return parseJSON<T>(await this.call(full));
  }

  private callOpts(o: CallOptions | undefined): Pick<RequestSpec, "signal" | "timeoutMs"> {
    return { signal: o?.signal, timeoutMs: o?.timeoutMs };
  }

  // ---- produce ----

  /**
   * produce stores one message and resolves once it is durable. A `Uint8Array` is
   * sent as bytes, a string as UTF-8 text, anything else as JSON (see {@link Body}).
   *
   * A refused answer fails over to another node at once. A lost reply leaves the
   * outcome unknown: it is retried when duplicates are allowed (the default), otherwise
   * the call fails with an error whose `uncertain` is true.
   */
  async produce(topic: string, body: Body, opts: ProduceOptions = {}): Promise<Produced> {
    const enc = encodeBody(body, opts.contentType);
    if (enc.bytes.byteLength > MAX_MESSAGE_BYTES) {
      throw new TooLargeError(`a message is at most 1 MiB (1048576 bytes); this one is ${enc.bytes.byteLength}`, { code: "payload_too_large" });
    }
    const q: Query = { key: opts.key, partition: opts.partition };
    const res = await this.call({
      operation: "produce",
      method: "POST",
      path: topicPath(topic, "/produce"),
      query: q,
      body: enc.bytes,
      contentType: enc.contentType,
      topic,
      expect: [202],
      retryUncertain: opts.allowDuplicates ?? this.allowDuplicates,
      unsafe: true,
      ...this.callOpts(opts),
    });
    const p = parseStored<S["Produced"]>(res);
    return { topic: p.topic, partition: p.partition, offset: p.offset };
  }

  /**
   * produceBatch stores many messages, in as few requests as the broker's limits allow
   * (1000 messages and 8 MiB a request), and resolves with one {@link Produced} per
   * message in order. When any message fails it rejects with a
   * {@link ProduceBatchError} whose `results` say, per message, what happened.
   *
   * A request the broker answers with only part of it stored (its error's
   * `partlyStored`: how many were stored, which partitions failed) is never resent,
   * whatever `allowDuplicates` says, since a resend stores the stored part twice: each
   * of its messages fails with that error (uncertain, not retryable).
   */
  async produceBatch(topic: string, messages: readonly Outgoing[], opts: ProduceBatchOptions = {}): Promise<Produced[]> {
    if (messages.length === 0) return [];
    const results = await this.produceBatchResults(topic, messages, opts);
    if (results.some((r) => !r.ok)) throw new ProduceBatchError(results);
    return results.map((r) => (r as { produced: Produced }).produced);
  }

  /**
   * produceBatchResults is {@link Client.produceBatch} without the throw: one
   * {@link ProduceResult} per message, in order.
   */
  async produceBatchResults(topic: string, messages: readonly Outgoing[], opts: ProduceBatchOptions = {}): Promise<ProduceResult[]> {
    const results: ProduceResult[] = new Array<ProduceResult>(messages.length);
    const chunk: { idx: number; wire: S["OutgoingMessage"] }[] = [];
    let chunkBytes = 0;
    const flush = async () => {
      if (chunk.length === 0) return;
      const items = chunk.splice(0, chunk.length);
      chunkBytes = 0;
      try {
        const out = await this.sendBatch(topic, items.map((c) => c.wire), opts);
        items.forEach((c, i) => {
          const p = out[i];
          results[c.idx] = p
            ? { ok: true, produced: p }
            : { ok: false, error: errorFromStatus(500, "internal", "the broker returned fewer results than messages", { uncertain: true }) };
        });
      } catch (e) {
        if (!(e instanceof NaradError)) throw e;
        for (const c of items) results[c.idx] = { ok: false, error: e };
      }
    };
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i] as Outgoing;
      let wire: S["OutgoingMessage"];
      let size: number;
      try {
        ({ wire, size } = outgoingToWire(m));
      } catch (e) {
        if (e instanceof NaradError) {
          results[i] = { ok: false, error: e };
          continue;
        }
        throw e;
      }
      if (chunk.length >= 1000 || (chunk.length > 0 && chunkBytes + size > BATCH_BODY_BUDGET)) await flush();
      chunk.push({ idx: i, wire });
      chunkBytes += size;
    }
    await flush();
    return results;
  }

  /** @internal One produce-batch request. */
  async sendBatch(topic: string, wire: S["OutgoingMessage"][], opts: ProduceBatchOptions): Promise<Produced[]> {
    const res = await this.call({
      operation: "produceBatch",
      method: "POST",
      path: topicPath(topic, "/produce-batch"),
      body: new TextEncoder().encode(JSON.stringify({ messages: wire })),
      contentType: "application/json",
      topic,
      expect: [202],
      retryUncertain: opts.allowDuplicates ?? this.allowDuplicates,
      unsafe: true,
      ...this.callOpts(opts),
    });
    return parseStored<S["ProducedList"]>(res).results.map((p) => ({ topic: p.topic, partition: p.partition, offset: p.offset }));
  }

  /**
   * publisher returns a {@link Publisher} that batches messages for `topic` by count,
   * bytes and linger time, with a result per message. Close it (or the client) to
   * flush what is buffered.
   */
  publisher(topic: string, opts: PublisherOptions = {}): Publisher {
    this.assertOpen();
    const p = new Publisher(this, topic, opts, () => this.publishers.delete(p));
    this.publishers.add(p);
    return p;
  }

  // ---- consume ----

  /**
   * receive takes up to `max` messages under leases, waiting up to `waitMs` for the
   * first. An empty poll is an empty array, not an error. An abort through `signal`
   * leaves a poll already sent open up to 1 s for its answer to begin (5 s for it to be
   * read): an answer that comes then is returned (the caller hands back what it
   * leased), else it rejects with the signal's reason. Settle each message with
   * `ack`/`nack`, or it is delivered again when its lease lapses.
   */
  async receive(topic: string, opts: ReceiveOptions = {}): Promise<Message[]> {
    const max = Math.max(1, Math.min(1000, Math.floor(opts.max ?? 1)));
    const waitMs = Math.max(0, Math.min(20_000, opts.waitMs ?? 10_000));
    const single = max === 1;
    const res = await this.call({
      operation: single ? "consume" : "consumeBatch",
      method: "GET",
      path: topicPath(topic, single ? "/consume" : "/consume-batch"),
      query: { wait: waitParam(waitMs), payload_encoding: "base64", max: single ? undefined : max },
      topic,
      expect: [200, 204],
      retryUncertain: true,
      signal: opts.signal,
      abortBody: false,
      // A long poll's attempt may take its wait plus the ordinary bound.
      timeoutMs: waitMs + (opts.timeoutMs ?? this.transport.longPollMarginMs),
    });
    if (res.status === 204) return [];
    const now = Date.now();
    if (single) return [new Message(parseJSON<S["Message"]>(res), this.settler, now, res.endpoint)];
    return parseJSON<S["MessageList"]>(res).messages.map((m) => new Message(m, this.settler, now, res.endpoint));
  }

  /**
   * ack settles a leased message by its receipt handle. Confirmed: retried on 503 and
   * connection errors; a 410 on a retry whose earlier reply was lost counts as success.
   * Rejects with LeaseLostError when the lease had lapsed. Pass the message's
   * `endpoint` (as `Message.ack` does) so it goes to the node that leased it.
   */
  async ack(topic: string, receiptHandle: string, opts?: SettleOptions): Promise<void> {
    await this.settle(topic, receiptHandle, undefined, "ack", opts);
  }

  /** nack hands a leased message back, deliverable again after `delayMs` (default at once). */
  async nack(topic: string, receiptHandle: string, opts?: NackOptions): Promise<void> {
    await this.settle(topic, receiptHandle, msParam(opts?.delayMs ?? 0), "nack", opts);
  }

  /**
   * extend renews a lease so that it ends `leaseMs` from now (default the topic's
   * visibility timeout). The handle stays valid.
   */
  async extend(topic: string, receiptHandle: string, opts?: ExtendOptions): Promise<void> {
    const leaseMs = opts?.leaseMs;
    if (leaseMs !== undefined && leaseMs <= 0) throw new RangeError("extend: leaseMs must be positive (use nack to hand back)");
    await this.settle(topic, receiptHandle, leaseMs === undefined ? "true" : msParam(leaseMs), "extend", opts);
  }

  private async settle(topic: string, handle: string, extend: string | undefined, what: string, opts: SettleOptions | undefined): Promise<void> {
    const res = await this.call({
      operation: "ack",
      method: "POST",
      path: topicPath(topic, "/ack"),
      query: { receipt_handle: handle, extend },
      topic,
      expect: [204, 410],
      retryUncertain: true,
      endpoint: opts?.endpoint,
      ...this.callOpts(opts),
    });
    if (res.status === 204) return;
    // 410 after an attempt whose reply was lost: that attempt settled it.
    if (res.earlierUncertain && what !== "extend") return;
    const err = errorFromStatus(410, undefined, undefined, { endpoint: res.endpoint });
    let code = "lease_lost";
    let message = `${what}: the lease lapsed, was handed back, or the message was settled`;
    try {
      const body = JSON.parse(utf8Decode(res.body)) as S["Error"];
      code = body.error.code;
      message = `${what}: ${body.error.message}`;
    } catch {
      // keep the defaults
    }
    throw new LeaseLostError(message, { code: code as S["ErrorCode"], status: 410, endpoint: err.endpoint });
  }

  /**
   * ackBatch settles, renews or hands back many leased messages of one topic, with one
   * {@link AckResult} per entry, in order. Entries that name an `endpoint` go to the
   * node that leased them (one request per endpoint); the rest to the preferred one.
   * Confirmed like {@link Client.ack}: entries answered 503 are sent again with backoff
   * (at least 1 s; up to 6 requests, or the client's attempts if more), and an ack or hand-back (`extend` absent or 0)
   * answered 410 after an attempt whose reply was lost (or a 503 `timeout`) counts as
   * done, since that attempt settled it.
   */
  async ackBatch(topic: string, entries: readonly AckEntry[], opts?: CallOptions): Promise<AckResult[]> {
    if (entries.length === 0) return [];
    const out: AckResult[] = new Array<AckResult>(entries.length);
    const groups = new Map<string | undefined, number[]>();
    entries.forEach((e, i) => {
      const g = groups.get(e.endpoint);
      if (g) g.push(i);
      else groups.set(e.endpoint, [i]);
    });
    for (const [endpoint, idxs] of groups) {
      for (let i = 0; i < idxs.length; i += 1000) await this.ackChunk(topic, entries, idxs.slice(i, i + 1000), endpoint, out, opts);
    }
    entries.forEach((e, j) => {
      out[j] ??= {
        receiptHandle: e.receiptHandle,
        ok: false,
        status: 500,
        error: errorFromStatus(500, "internal", "the broker returned fewer results than entries", { uncertain: true }),
      };
    });
    return out;
  }

  /** One ack-batch request per round, resending the entries answered 503 until the rounds run out. */
  private async ackChunk(
    topic: string,
    entries: readonly AckEntry[],
    part: number[],
    endpoint: string | undefined,
    out: AckResult[],
    opts: CallOptions | undefined,
  ): Promise<void> {
    // Entries an earlier round may have settled (its reply was lost, or it was a 503
    // `timeout`): a 410 for them is that round's doing.
    const maybeDone = new Set<number>();
    for (let round = 1; part.length > 0; round++) {
      const wire: S["AckBatchRequest"] = {
        acks: part.map((j) => {
          const e = entries[j] as AckEntry;
          const a: S["AckEntry"] = { receipt_handle: e.receiptHandle };
          if (e.extend !== undefined) a.extend = e.extend === true ? "true" : msParam(e.extend);
          return a;
        }),
      };
      const raw = await this.call({
        operation: "ackBatch",
        method: "POST",
        path: topicPath(topic, "/ack-batch"),
        body: new TextEncoder().encode(JSON.stringify(wire)),
        contentType: "application/json",
        topic,
        expect: [200],
        retryUncertain: true,
        endpoint,
        ...this.callOpts(opts),
      });
      if (raw.earlierUncertain) for (const j of part) maybeDone.add(j);
      const again: number[] = [];
      parseJSON<S["AckResultList"]>(raw).results.forEach((r, k) => {
        const j = part[k];
        if (j === undefined) return;
        const e = entries[j] as AckEntry;
        const settles = e.extend === undefined || e.extend === 0;
        if (r.status === 204 || (r.status === 410 && settles && maybeDone.has(j))) {
          out[j] = { receiptHandle: r.receipt_handle, ok: true, status: 204, error: undefined };
          return;
        }
        const error = errorFromStatus(r.status, r.error?.code, r.error?.message, { endpoint: raw.endpoint });
        out[j] = { receiptHandle: r.receipt_handle, ok: false, status: r.status, error };
        if (r.status === 503) {
          if (error.uncertain) maybeDone.add(j);
          again.push(j);
        }
      });
      if (again.length === 0 || round >= Math.max(this.transport.attempts, ACK_BATCH_ROUNDS)) return;
      // A 503 entry carries no Retry-After of its own; the broker's is 1 s for these.
      const delay = this.transport.backoff(round, ENTRY_RETRY_AFTER_MS);
      this.logger.debug?.("narad: retrying ack-batch entries answered 503", { topic, entries: again.length, round, delayMs: Math.round(delay) });
      await sleep(delay, opts?.signal);
      part = again;
    }
  }

  /**
   * messages iterates over messages taken under leases, long-polling as needed. Settle
   * each one (`ack`/`nack`). Transient errors are retried with backoff (and logged);
   * terminal ones end the iteration by throwing. Leaving the loop hands back any
   * message fetched but not yet reached. There is no lease renewal here: use
   * {@link Client.consume} for handlers that run long.
   */
  async *messages(topic: string, opts: MessagesOptions = {}): AsyncGenerator<Message, void, undefined> {
    const buffered: Message[] = [];
    const batch = Math.max(1, Math.min(1000, opts.batchSize ?? 1));
    let failures = 0;
    try {
      for (;;) {
        if (opts.signal?.aborted) throw abortReason(opts.signal);
        if (buffered.length === 0) {
          let got: Message[];
          try {
            got = await this.receive(topic, { max: batch, waitMs: opts.waitMs ?? 10_000, ...(opts.signal ? { signal: opts.signal } : {}) });
            failures = 0;
          } catch (e) {
            if (!(e instanceof NaradError) || !e.retryable) throw e;
            failures++;
            this.logger.warn?.("narad: polling failed; retrying", { topic, error: e.message });
            await sleep(this.transport.backoff(Math.min(failures, 10), e.retryAfterMs), opts.signal);
            continue;
          }
          buffered.push(...got);
          // Stopped while the answer arrived: what it leased goes back in finally.
          if (opts.signal?.aborted) throw abortReason(opts.signal);
          continue;
        }
        yield buffered.shift() as Message;
      }
    } finally {
      await this.handBack(buffered);
    }
  }

  /** @internal Nacks messages that were fetched but never handled; failures only mean the lease lapses. */
  async handBack(msgs: Message[]): Promise<void> {
    const pending = msgs.splice(0, msgs.length).filter((m) => !m.settled);
    if (pending.length === 0 || this.transport.closed) return;
    const byTopic = new Map<string, Message[]>();
    for (const m of pending) byTopic.set(m.topic, [...(byTopic.get(m.topic) ?? []), m]);
    for (const [topic, ms] of byTopic) {
      try {
        await this.ackBatch(
          topic,
          ms.map((m) => ({ receiptHandle: m.receiptHandle as string, extend: 0, ...(m.endpoint === undefined ? {} : { endpoint: m.endpoint }) })),
          { timeoutMs: 5000 },
        );
        for (const m of ms) m.markLost();
      } catch (e) {
        this.logger.debug?.("narad: handing back unstarted messages failed; their leases will lapse", { topic, error: String(e) });
      }
    }
  }

  /**
   * consume runs a worker loop over `topic`: it fetches only as many messages as there
   * are free workers, renews each lease while its handler runs, acks on success and
   * hands back (nack, with an optional delay) on failure. When a lease is lost the
   * handler's `signal` aborts and the message is never acked. Stop it with
   * {@link Consumer.stop} (or the `signal` option, or `await using`): it drains in order.
   */
  consume(topic: string, handler: Handler, opts: ConsumeOptions = {}): Consumer {
    this.assertOpen();
    const c = new Consumer(this, topic, handler, opts, () => this.consumers.delete(c));
    this.consumers.add(c);
    c.start();
    return c;
  }

  // ---- replay ----

  /**
   * readMessages reads one range of a partition without leases (replay): up to `max`
   * messages from `from` (or `fromTime`), and where to continue.
   */
  async readMessages(topic: string, partition: number, opts: ReadRangeOptions = {}): Promise<MessageRange> {
    const q: Query = { payload_encoding: "base64", from: opts.from, max: opts.max, incarnation: opts.incarnation };
    if (opts.fromTime !== undefined) q["from_time"] = String(opts.fromTime instanceof Date ? opts.fromTime.getTime() : opts.fromTime);
    const r = await this.json<S["MessageRange"]>({
      operation: "readMessages",
      method: "GET",
      path: topicPath(topic, `/partitions/${encodeURIComponent(String(partition))}/messages`),
      query: q,
      topic,
      expect: [200],
      ...this.callOpts(opts),
    });
    const now = Date.now();
    return {
      messages: r.messages.map((m) => new Message(m, undefined, now)),
      nextOffset: r.next_offset,
      incarnation: r.incarnation,
      damaged: r.damaged ?? [],
    };
  }

  /**
   * readMessage reads the one message at `offset` of `partition` without a lease;
   * undefined when that offset is not written yet.
   */
  async readMessage(topic: string, partition: number, offset: number, opts?: CallOptions): Promise<Message | undefined> {
    const res = await this.call({
      operation: "consume",
      method: "GET",
      path: topicPath(topic, "/consume"),
      query: { partition, offset, payload_encoding: "base64" },
      topic,
      expect: [200, 204],
      retryUncertain: true,
      ...this.callOpts(opts),
    });
    if (res.status === 204) return undefined;
    return new Message(parseJSON<S["Message"]>(res), undefined);
  }

  /**
   * replay iterates over a topic (or one partition) from a {@link Position} without
   * leases: bounded (to the end as of the start, the default) or following new
   * messages. Its `position` property resumes where the iteration stopped.
   */
  replay(topic: string, opts: ReplayOptions = {}): Replay {
    return new Replay(this, topic, opts);
  }

  // ---- topics ----

  /** createTopic creates a topic; it is usable once this resolves. 409 Conflict when the name exists. */
  async createTopic(spec: TopicSpec, opts?: CallOptions): Promise<TopicInfo> {
    const body: S["CreateTopicRequest"] = { name: spec.name, ...settingsToWire(spec) };
    return topicFromWire(
      await this.json<S["Topic"]>({ operation: "createTopic", method: "POST", path: "/v1/topics", topic: spec.name, expect: [201], ...this.callOpts(opts) }, body),
    );
  }

  /**
   * ensureTopic creates a topic unless one of that name exists, and returns it. The
   * settings of an existing topic are left as they are.
   */
  async ensureTopic(spec: TopicSpec, opts?: CallOptions): Promise<TopicInfo> {
    try {
      return await this.createTopic(spec, opts);
    } catch (e) {
      if (e instanceof NaradError && e.code === "topic_exists") return this.getTopic(spec.name, opts);
      throw e;
    }
  }

  /** getTopic returns a topic's settings and per-partition stats. */
  async getTopic(name: string, opts?: CallOptions): Promise<TopicDetail> {
    return topicDetailFromWire(
      await this.json<S["TopicDetail"]>({ operation: "getTopic", method: "GET", path: topicPath(name), topic: name, expect: [200], ...this.callOpts(opts) }),
    );
  }

  /** listTopics returns every topic, sorted by name. */
  async listTopics(opts?: CallOptions): Promise<TopicInfo[]> {
    const r = await this.json<S["TopicList"]>({ operation: "listTopics", method: "GET", path: "/v1/topics", expect: [200], ...this.callOpts(opts) });
    return r.topics.map(topicFromWire);
  }

  /**
   * alterTopic changes a topic's live-tunable settings and returns the topic. A new
   * `replicationFactor` is reached in the background through moves
   * ({@link Client.listMoves}).
   */
  async alterTopic(name: string, changes: TopicChanges, opts?: CallOptions): Promise<TopicInfo> {
    const body: S["AlterTopicRequest"] = settingsToWire(changes);
    return topicFromWire(
      await this.json<S["Topic"]>({ operation: "alterTopic", method: "PATCH", path: topicPath(name), topic: name, expect: [200], retryUncertain: true, ...this.callOpts(opts) }, body),
    );
  }

  /**
   * deleteTopic deletes a topic's data and metadata. Its receipt handles stop working; a
   * topic created later under the name is a new, empty topic with a new incarnation.
   *
   * With `incarnation` (from {@link Client.getTopic} or any {@link TopicInfo}) it
   * deletes that incarnation only: when the name is another topic now (deleted and
   * created again since it was read) it rejects with a `ConflictError`, code
   * `incarnation_mismatch`, and nothing is deleted.
   *
   * Retries: an attempt whose outcome is unknown (its reply lost, a 503 `timeout`, a 504)
   * may have deleted the topic. Without `incarnation` such an attempt is not resent, as
   * a resend deletes whatever topic has the name by then, one created since included:
   * the call rejects with `uncertain` set. With `incarnation` it is resent, as a resend
   * cannot delete a topic created under the name since; when the lost attempt did
   * delete the topic, the resend rejects with a `NotFoundError` (`topic_not_found`), or
   * a `ConflictError` (`incarnation_mismatch`) when the name was created again
   * meanwhile, either with `uncertain` set: the incarnation named is gone, perhaps
   * deleted by this call.
   */
  async deleteTopic(name: string, opts: DeleteTopicOptions = {}): Promise<void> {
    await this.call({
      operation: "deleteTopic",
      method: "DELETE",
      path: topicPath(name),
      query: { incarnation: opts.incarnation },
      topic: name,
      expect: [204],
      // A resend naming the incarnation cannot delete a topic created since; without it, it could.
      retryUncertain: opts.incarnation !== undefined,
      ...this.callOpts(opts),
    });
  }

  // ---- fan-out and delay children ----

  /**
   * attachChild copies every message committed to `parent` from now on (no backfill)
   * durably into `child`, with its key; with `fanoutDelayMs` the copies become
   * consumable that much after the parent committed them (a delay child). 409 Conflict
   * when the child already has a parent, would form a chain, or the schemas differ.
   */
  async attachChild(parent: string, child: string, opts: CallOptions & { fanoutDelayMs?: number } = {}): Promise<ChildInfo> {
    const body: S["AttachChildRequest"] = { child };
    if (opts.fanoutDelayMs !== undefined) body.fanout_delay_ms = opts.fanoutDelayMs;
    return childFromWire(
      await this.json<S["Child"]>({ operation: "attachChild", method: "POST", path: topicPath(parent, "/children"), topic: parent, expect: [201], ...this.callOpts(opts) }, body),
    );
  }

  /** listChildren returns a parent's children with their lag. */
  async listChildren(parent: string, opts?: CallOptions): Promise<ChildInfo[]> {
    const r = await this.json<S["ChildList"]>({ operation: "listChildren", method: "GET", path: topicPath(parent, "/children"), topic: parent, expect: [200], ...this.callOpts(opts) });
    return r.children.map(childFromWire);
  }

  /** detachChild stops copying from `parent` to `child`; both topics stay. */
  async detachChild(parent: string, child: string, opts?: CallOptions): Promise<void> {
    await this.call({
      operation: "detachChild",
      method: "DELETE",
      path: topicPath(parent, `/children/${encodeURIComponent(child)}`),
      topic: parent,
      expect: [204],
      retryUncertain: true,
      ...this.callOpts(opts),
    });
  }

  /**
   * createChild creates `child` already attached to `parent` (create-with-parent),
   * with optional settings; a fan-out child when `fanoutDelayMs` is 0 or absent.
   */
  async createChild(parent: string, child: string, settings: TopicSettings & { fanoutDelayMs?: number } = {}, opts?: CallOptions): Promise<TopicInfo> {
    return this.createTopic({ ...settings, name: child, parent }, opts);
  }

  /**
   * createDelayChild creates `child` attached to `parent` with every copy delayed by
   * `delayMs`: messages produced to the parent become consumable on the child that
   * much later.
   */
  async createDelayChild(parent: string, child: string, delayMs: number, settings: TopicSettings = {}, opts?: CallOptions): Promise<TopicInfo> {
    return this.createTopic({ ...settings, name: child, parent, fanoutDelayMs: delayMs }, opts);
  }

  // ---- users ----

  /** createUser creates a user (admin only). */
  async createUser(username: string, password: string, opts: CreateUserOptions = {}): Promise<UserInfo> {
    const body: S["CreateUserRequest"] = { username, password };
    if (opts.grants) body.grants = opts.grants;
    return userFromWire(await this.json<S["User"]>({ operation: "createUser", method: "POST", path: "/v1/users", expect: [201], ...this.callOpts(opts) }, body));
  }

  /** listUsers returns every user (never their passwords). */
  async listUsers(opts?: CallOptions): Promise<UserInfo[]> {
    const r = await this.json<S["UserList"]>({ operation: "listUsers", method: "GET", path: "/v1/users", expect: [200], ...this.callOpts(opts) });
    return r.users.map(userFromWire);
  }

  /** getUser returns one user. */
  async getUser(username: string, opts?: CallOptions): Promise<UserInfo> {
    return userFromWire(
      await this.json<S["User"]>({ operation: "getUser", method: "GET", path: `/v1/users/${encodeURIComponent(username)}`, expect: [200], ...this.callOpts(opts) }),
    );
  }

  /** deleteUser deletes a user. */
  async deleteUser(username: string, opts?: CallOptions): Promise<void> {
    await this.call({ operation: "deleteUser", method: "DELETE", path: `/v1/users/${encodeURIComponent(username)}`, expect: [204], retryUncertain: false, ...this.callOpts(opts) });
  }

  /** replaceGrants replaces all of a user's grants and returns the user. */
  async replaceGrants(username: string, grants: Grant[], opts?: CallOptions): Promise<UserInfo> {
    const body: S["ReplaceGrantsRequest"] = { grants };
    return userFromWire(
      await this.json<S["User"]>(
        { operation: "replaceGrants", method: "PUT", path: `/v1/users/${encodeURIComponent(username)}/grants`, expect: [200], retryUncertain: true, ...this.callOpts(opts) },
        body,
      ),
    );
  }

  /**
   * changePassword sets a new password: users change their own with
   * `currentPassword`; an admin resets anyone's without it.
   */
  async changePassword(username: string, newPassword: string, opts: CallOptions & { currentPassword?: string } = {}): Promise<void> {
    const body: S["ChangePasswordRequest"] = { new_password: newPassword };
    if (opts.currentPassword !== undefined) body.current_password = opts.currentPassword;
    await this.call({
      operation: "changePassword",
      method: "PUT",
      path: `/v1/users/${encodeURIComponent(username)}/password`,
      body: new TextEncoder().encode(JSON.stringify(body)),
      contentType: "application/json",
      expect: [204],
      retryUncertain: true,
      ...this.callOpts(opts),
    });
  }

  // ---- cluster and health ----

  /** getCluster describes the cluster as the answering node sees it. */
  async getCluster(opts?: CallOptions): Promise<ClusterInfo> {
    const r = await this.json<S["Cluster"]>({ operation: "getCluster", method: "GET", path: "/v1/cluster", expect: [200], ...this.callOpts(opts) });
    return { clusterId: r.cluster_id, nodeId: r.node_id, controller: r.controller, version: r.version, members: r.members.map(memberFromWire) };
  }

  /** listMembers returns the cluster's members. */
  async listMembers(opts?: CallOptions): Promise<Member[]> {
    const r = await this.json<S["MemberList"]>({ operation: "listMembers", method: "GET", path: "/v1/cluster/members", expect: [200], ...this.callOpts(opts) });
    return r.members.map(memberFromWire);
  }

  /**
   * decommission starts moving every replica off `node` and removes it once it holds
   * nothing (admin only); a dead member's replicas are copied again from the survivors.
   * It resolves with the member, `decommissioning`, once the broker has started; the
   * member leaves {@link Client.listMembers} when it is done. A repeat answers the
   * member as it is, so it is retried like a read. NotFound for an unknown node;
   * Conflict for the last node, or one whose replicas no live node can take.
   */
  async decommission(node: string, opts?: CallOptions): Promise<Member> {
    const r = await this.json<S["Member"]>({
      operation: "decommissionMember",
      method: "DELETE",
      path: `/v1/cluster/members/${encodeURIComponent(node)}`,
      expect: [202],
      retryUncertain: true,
      ...this.callOpts(opts),
    });
    return memberFromWire(r);
  }

  /** listMoves returns every partition move the cluster holds, newest first, with its status and progress (admin only). */
  async listMoves(opts?: CallOptions): Promise<Move[]> {
    const r = await this.json<S["MoveList"]>({ operation: "listMoves", method: "GET", path: "/v1/cluster/moves", expect: [200], ...this.callOpts(opts) });
    return r.moves.map(moveFromWire);
  }

  /**
   * movePartition starts moving the replica of a partition on node `from` to node `to`
   * (admin only) and resolves with the move once the broker has started it; follow it
   * with {@link Client.listMoves}. An identical move under way is answered as it is
   * (the same id), so it is retried like a read. NotFound for an unknown topic,
   * partition or node; Conflict, with the broker's reason, when the move is impossible
   * (`to` is dead or holds a replica already, `from` holds none, another move of the
   * partition is under way).
   */
  async movePartition(topic: string, partition: number, from: string, to: string, opts?: CallOptions): Promise<Move> {
    const body: S["MoveRequest"] = { topic, partition, from, to };
    const r = await this.json<S["Move"]>(
      { operation: "movePartition", method: "POST", path: "/v1/cluster/moves", topic, expect: [202], retryUncertain: true, ...this.callOpts(opts) },
      body,
    );
    return moveFromWire(r);
  }

  /**
   * cancelMove cancels a move that is still copying (admin only). NotFound when no move
   * has that id; Conflict once it is switching (it finishes) or has ended.
   */
  async cancelMove(id: string, opts?: CallOptions): Promise<void> {
    await this.call({
      operation: "cancelMove",
      method: "DELETE",
      path: `/v1/cluster/moves/${encodeURIComponent(id)}`,
      expect: [204],
      retryUncertain: true,
      ...this.callOpts(opts),
    });
  }

  /**
   * rebalance starts the moves that even out replicas and leaders over the members
   * (admin only) and resolves with those it started now (possibly none); the broker
   * starts the rest as they finish. A repeat starts only what is still needed.
   */
  async rebalance(opts?: CallOptions): Promise<Move[]> {
    const r = await this.json<S["MoveList"]>({ operation: "rebalance", method: "POST", path: "/v1/cluster/rebalance", expect: [202], retryUncertain: true, ...this.callOpts(opts) });
    return r.moves.map(moveFromWire);
  }

  /**
   * forceLeader makes the replica on `node` the only member of a partition that lost a
   * majority of its replicas for good, and leader of what it holds (admin only); the
   * broker then grows the replica set back to the topic's replication factor. Messages
   * only the lost replicas held are lost: see
   * {@link ForceLeaderResult.possiblyLostAtLeast}. An attempt whose outcome is unknown is
   * never repeated (the error is `uncertain`): check the partition's replicas with
   * {@link Client.getTopic} before asking again. Conflict when `node` holds no replica
   * of the partition or is not live.
   */
  async forceLeader(topic: string, partition: number, node: string, opts?: CallOptions): Promise<ForceLeaderResult> {
    const body: S["ForceLeaderRequest"] = { node };
    const r = await this.json<S["ForceLeaderResult"]>(
      {
        operation: "forceLeader",
        method: "POST",
        path: topicPath(topic, `/partitions/${encodeURIComponent(String(partition))}/force-leader`),
        topic,
        expect: [200],
        retryUncertain: false,
        unsafe: true,
        ...this.callOpts(opts),
      },
      body,
    );
    return { possiblyLostAtLeast: r.possibly_lost_at_least, replicas: [...r.replicas] };
  }

  /** ready reports whether a node answers GET /readyz with 200 (it has recovered and serves). */
  async ready(opts?: CallOptions): Promise<boolean> {
    try {
      await this.call({ operation: "readyz", method: "GET", path: "/readyz", expect: [200], retryUncertain: true, ...this.callOpts(opts) });
      return true;
    } catch (e) {
      if (e instanceof NaradError && e.kind !== "Closed") return false;
      throw e;
    }
  }

  /** metrics returns a node's Prometheus metrics as text. */
  async metrics(opts?: CallOptions): Promise<string> {
    const res = await this.call({ operation: "metrics", method: "GET", path: "/metrics", expect: [200], retryUncertain: true, ...this.callOpts(opts) });
    return utf8Decode(res.body);
  }

  // ---- lifecycle ----

  private assertOpen(): void {
    if (this.closing || this.transport.closed) throw errorClosed();
  }

  /**
   * close stops every consumer and publisher made by this client (draining them),
   * then aborts calls still running with ClosedError. Closing twice is harmless.
   */
  close(): Promise<void> {
    this.closing ??= (async () => {
      await Promise.allSettled([...this.consumers].map((c) => c.stop()));
      await Promise.allSettled([...this.publishers].map((p) => p.close()));
      this.transport.close();
    })();
    return this.closing;
  }

  /** Closes the client, so `await using client = new Client(…)` cleans up. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * parseStored reads the answer of a produce: a 202 says the messages are stored, so an
 * answer that cannot be read leaves the outcome uncertain, never "not stored".
 */
function parseStored<T>(res: RawResponse): T {
  try {
    return parseJSON<T>(res);
  } catch (e) {
    throw e instanceof NaradError ? e.withUncertain(true) : e;
  }
}

function errorClosed(): NaradError {
  return new ClosedError("the client is closed");
}

function userFromWire(u: S["User"]): UserInfo {
  return { username: u.username, grants: u.grants.map((g) => ({ action: g.action, topics: [...g.topics] })) };
}
