import type { Client } from "./client.js";
import type { ConsumeOptions, Consumer, Handler, HandlerContext } from "./consumer.js";
import { Envelope } from "./envelope.js";
import { ConflictError, NaradError } from "./errors.js";
import type { Message } from "./message.js";
import type { CallOptions } from "./options.js";
import type { TopicSettings } from "./types.js";
import { utf8Decode } from "./internal/util.js";

/**
 * RetryTier is one delay step. `topic` is the tier's retry topic: failed messages are
 * produced there and nobody consumes it. Its delay child (`due`) receives each of them
 * `delayMs` after the broker stored it, and the tier's consumer reads the child. The
 * broker does the waiting, in the retry topic's log: a waiting message holds no lease,
 * so it takes none of the in-flight slots (`maxInFlightPerPartition`) and nothing
 * blocks behind it.
 */
export interface RetryTier {
  /** The retry topic failed messages are produced to. */
  topic: string;
  /** How long a message waits in this tier (the delay child's fan-out delay), in ms. */
  delayMs: number;
  /** The delay child of `topic` the tier's consumer reads; default `${topic}.due`. */
  due?: string;
}

/** dueTopic returns the delay child a tier's consumer reads: `tier.due`, or `${tier.topic}.due`. */
export function dueTopic(tier: RetryTier): string {
  return tier.due || `${tier.topic}.due`;
}

/** A retry topic keeps its messages this long past its delay (the broker wants an hour at least). */
const RETRY_RETENTION_MARGIN_MS = 2 * 3600_000;

/** RetryTiersOptions configure {@link RetryTiers}. */
export interface RetryTiersOptions {
  /** The main topic. */
  topic: string;
  /** The delay steps, in order: the first failure goes to the first tier, and so on. */
  tiers: readonly RetryTier[];
  /** Where a message goes when it failed in the last tier too (a dead-letter topic). */
  parkingTopic: string;
}

/** TieredMessage is what a {@link RetryTiers} handler gets: the message and its envelope. */
export interface TieredMessage {
  /** The message as consumed (from the main topic or a tier). */
  message: Message;
  /** Its envelope: a plain message is wrapped on the fly (attempt 1, a fresh id). */
  envelope: Envelope;
}

/** TieredHandler handles one message of a {@link RetryTiers} set; throw to send it on to the next tier. */
export type TieredHandler = (m: TieredMessage, ctx: HandlerContext) => Promise<void> | void;

/**
 * RetryTiers routes failed messages through delay tiers and finally to a parking topic,
 * all in user space on plain topics and delay children, with the opt-in
 * {@link Envelope}; the same topics and envelope as the Go and Python SDKs, so they can
 * share them:
 *
 * - a handler failure on the main topic (attempt 1) re-produces the message to tier 1's
 *   retry topic with `attempt` 2 (and `notBefore` = now + tier 1's delay, for
 *   information), then acks the original;
 * - the broker copies it to the tier's delay child ({@link dueTopic}) the tier's delay
 *   after it stored it; the tier's consumer runs the same handler there, and a failure
 *   moves the message to the next tier;
 * - after the last tier it goes to the parking topic with its last error, for people
 *   (or a repair job) to look at.
 *
 * The envelope's id stays the same all the way, so handlers can deduplicate. No message
 * is held leased while it waits (a delayed nack would fill the in-flight cap and stall
 * the ready messages behind it).
 */
export class RetryTiers {
  /** The configuration. */
  readonly options: RetryTiersOptions;

  /** Creates the router; nothing is sent until {@link RetryTiers.consume} or {@link RetryTiers.route}. */
  constructor(
    private readonly client: Client,
    options: RetryTiersOptions,
  ) {
    if (options.tiers.length === 0) throw new TypeError("RetryTiers: give at least one tier");
    this.options = options;
  }

  /**
   * ensureTopics creates, with `settings`, the main and parking topics and each tier's
   * retry topic and delay child, those that do not exist yet. A retry topic keeps its
   * messages for its delay plus two hours unless `settings` keeps them longer. A due
   * topic that exists but is not the delay child its tier needs (another parent or
   * delay) is refused with a {@link ConflictError}: a delay child keeps the delay it was
   * made with.
   */
  async ensureTopics(settings: TopicSettings = {}, opts?: CallOptions): Promise<void> {
    for (const name of [this.options.topic, this.options.parkingTopic]) await this.client.ensureTopic({ ...settings, name }, opts);
    for (const tier of this.options.tiers) {
      const keep = tier.delayMs + RETRY_RETENTION_MARGIN_MS;
      const retentionMs = settings.retentionMs !== undefined && settings.retentionMs >= keep ? settings.retentionMs : keep;
      await this.client.ensureTopic({ ...settings, retentionMs, name: tier.topic }, opts);
      await this.ensureDelayChild(tier, settings, opts);
    }
  }

  /** ensureDelayChild creates the tier's due topic as its retry topic's delay child, or checks that it already is one. */
  private async ensureDelayChild(tier: RetryTier, settings: TopicSettings, opts?: CallOptions): Promise<void> {
    const due = dueTopic(tier);
    try {
      await this.client.createDelayChild(tier.topic, due, tier.delayMs, settings, opts);
      return;
    } catch (e) {
      if (!(e instanceof NaradError && e.kind === "Conflict")) throw e;
      const info = await this.client.getTopic(due, opts);
      if (info.parent === tier.topic && (info.fanoutDelayMs ?? 0) === tier.delayMs) return;
      throw new ConflictError(
        `retry tier ${tier.topic}: ${due} exists as a child of ${JSON.stringify(info.parent)} with delay ${info.fanoutDelayMs ?? 0} ms, ` +
          `not of ${JSON.stringify(tier.topic)} with ${tier.delayMs} ms; delete it or name another due topic`,
        { code: e.code, status: e.status, cause: e },
      );
    }
  }

  /** consumedTopics lists the topics {@link RetryTiers.consume} reads: the main topic, then each tier's due topic. */
  consumedTopics(): string[] {
    return [this.options.topic, ...this.options.tiers.map(dueTopic)];
  }

  /** envelopeOf returns a message's envelope, wrapping a plain message as attempt 1. */
  envelopeOf(msg: Message): Envelope {
    const env = msg.envelope();
    if (env) return env;
    // A plain message keeps its exact bytes; its kind is what they are (JSON, text or
    // bytes), so the parked envelope stays readable, as in the other SDKs.
    let kind: "json" | "text" | "bytes" = "bytes";
    try {
      const text = utf8Decode(msg.body);
      kind = "text";
      if (msg.body.length > 0) {
        JSON.parse(text);
        kind = "json";
      }
    } catch {
      // not UTF-8, or not JSON
    }
    return Envelope.fromEncoded({ bytes: msg.body, contentType: "", kind }, { origin: msg.topic });
  }

  /**
   * route sends a failed message on: to the tier for its attempt, or to the parking
   * topic after the last tier. Resolves with where it went. The caller acks the
   * original afterwards (the consumer of {@link RetryTiers.consume} does).
   */
  async route(msg: Message, error: unknown, opts?: CallOptions): Promise<{ topic: string; envelope: Envelope }> {
    const env = this.envelopeOf(msg);
    const lastError = error instanceof Error ? error.message : String(error);
    const tier = this.options.tiers[env.attempt - 1];
    const next = tier
      ? env.with({ attempt: env.attempt + 1, notBefore: Date.now() + tier.delayMs, lastError, origin: env.origin ?? this.options.topic })
      : env.with({ lastError, origin: env.origin ?? this.options.topic });
    const topic = tier ? tier.topic : this.options.parkingTopic;
    const po: { key?: string; signal?: AbortSignal; timeoutMs?: number } = {};
    if (msg.key !== undefined) po.key = msg.key;
    if (opts?.signal) po.signal = opts.signal;
    if (opts?.timeoutMs !== undefined) po.timeoutMs = opts.timeoutMs;
    await this.client.produce(topic, next, po);
    return { topic, envelope: next };
  }

  /**
   * handler turns a tiered handler into a consumer handler for the main topic and every
   * due topic: it runs `handler` and routes a failure to the next tier or to parking,
   * then acks. When the lease is lost or the consumer stops, the failure is left to
   * redelivery instead. It does not hold messages whose `notBefore` is still ahead: the
   * waiting is the delay children's.
   */
  handler(handler: TieredHandler): Handler {
    return async (message, ctx) => {
      const envelope = this.envelopeOf(message);
      try {
        await handler({ message, envelope }, ctx);
      } catch (e) {
        if (ctx.signal.aborted) throw e; // lease lost or shutting down: let it be redelivered
        await this.route(message, e);
        await message.ack();
      }
    };
  }

  /**
   * consume starts one consumer on the main topic and one on each tier's due topic
   * ({@link RetryTiers.consumedTopics}), all running `handler`; stop them together with
   * the returned function (or stop each).
   */
  consume(handler: TieredHandler, opts: ConsumeOptions = {}): { consumers: Consumer[]; stop: () => Promise<void> } {
    const h = this.handler(handler);
    const consumers = this.consumedTopics().map((t) => this.client.consume(t, h, opts));
    return { consumers, stop: async () => void (await Promise.all(consumers.map((c) => c.stop()))) };
  }
}
