import type { Client } from "./client.js";
import type { ConsumeOptions, Consumer, Handler, HandlerContext } from "./consumer.js";
import { Envelope } from "./envelope.js";
import type { Message } from "./message.js";
import type { CallOptions } from "./options.js";
import type { TopicSettings } from "./types.js";
import { utf8Decode } from "./internal/util.js";

/** RetryTier is one delay step: a plain topic where failed messages wait `delayMs`. */
export interface RetryTier {
  /** The tier's topic. */
  topic: string;
  /** How long a message waits in this tier before it is handled again, in ms. */
  delayMs: number;
}

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
 * all in user space on plain topics, with the opt-in {@link Envelope}:
 *
 * - a handler failure on the main topic (attempt 1) re-produces the message to tier 1
 *   with `attempt` 2 and `notBefore` = now + tier 1's delay, then acks the original;
 * - a tier's consumer holds early messages back with a delayed nack until `notBefore`,
 *   then runs the same handler; a failure moves the message to the next tier;
 * - after the last tier it goes to the parking topic with its last error, for people
 *   (or a repair job) to look at.
 *
 * The envelope's id stays the same all the way, so handlers can deduplicate.
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

  /** ensureTopics creates the main, tier and parking topics that do not exist yet. */
  async ensureTopics(settings: TopicSettings = {}, opts?: CallOptions): Promise<void> {
    const names = [this.options.topic, ...this.options.tiers.map((t) => t.topic), this.options.parkingTopic];
    for (const name of names) await this.client.ensureTopic({ ...settings, name }, opts);
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

  /** wrap turns a tiered handler into a consumer handler that holds early messages back and routes failures. */
  handler(handler: TieredHandler): Handler {
    return async (message, ctx) => {
      const envelope = this.envelopeOf(message);
      const wait = envelope.notBefore !== undefined ? envelope.notBefore - Date.now() : 0;
      if (wait > 0) {
        // Not due yet: give it back to come round again when it is.
        await message.nack({ delayMs: wait });
        return;
      }
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
   * consume starts one consumer on the main topic and one on each tier, all running
   * `handler`; stop them together with the returned function (or stop each).
   */
  consume(handler: TieredHandler, opts: ConsumeOptions = {}): { consumers: Consumer[]; stop: () => Promise<void> } {
    const h = this.handler(handler);
    const consumers = [this.options.topic, ...this.options.tiers.map((t) => t.topic)].map((t) => this.client.consume(t, h, opts));
    return { consumers, stop: async () => void (await Promise.all(consumers.map((c) => c.stop()))) };
  }
}
