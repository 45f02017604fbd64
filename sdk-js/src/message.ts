import { Envelope } from "./envelope.js";
import { fromBase64, utf8Decode, utf8Encode } from "./internal/util.js";
import type { CallOptions } from "./options.js";
import type { components } from "./generated/openapi.js";

/**
 * SettleOptions are the options of a lease operation (ack, nack, extend): a call's
 * options and the endpoint that leased the message.
 */
export interface SettleOptions extends CallOptions {
  /**
   * The endpoint that leased the message (`message.endpoint`): the operation goes there
   * first, and to the other endpoints only when it fails. Default the client's
   * preferred endpoint. {@link Message} methods fill it in.
   */
  endpoint?: string;
}

/** NackOptions say when a handed-back message becomes deliverable again. */
export interface NackOptions extends SettleOptions {
  /** Delay before redelivery in ms (default 0: at once). Capped by the broker at 12 h. */
  delayMs?: number;
}

/** ExtendOptions say how long a renewed lease lasts. */
export interface ExtendOptions extends SettleOptions {
  /** The lease ends this long from now, in ms; default the topic's visibility timeout. */
  leaseMs?: number;
}

/** @internal The client functions a message settles through. */
export interface Settler {
  ack(topic: string, handle: string, opts?: SettleOptions): Promise<void>;
  nack(topic: string, handle: string, opts?: NackOptions): Promise<void>;
  extend(topic: string, handle: string, opts?: ExtendOptions): Promise<void>;
}

/** MessageState is where a leased message stands from this client's point of view. */
export type MessageState = "leased" | "acked" | "nacked" | "lost" | "replayed";

type WireMessage = components["schemas"]["Message"];

/**
 * Message is one consumed (or replayed) message. Its body is the exact bytes that were
 * produced; {@link Message.text} and {@link Message.json} decode them on request.
 * A consumed message carries a lease: settle it with {@link Message.ack} or
 * {@link Message.nack}, or renew it with {@link Message.extend}. A replayed message has
 * no lease (`receiptHandle` is undefined) and cannot be settled.
 */
export class Message {
  /** The topic it was consumed from. */
  readonly topic: string;
  /** Its partition. */
  readonly partition: number;
  /** Its offset in the partition's log. */
  readonly offset: number;
  /** The key it was produced with, if any. */
  readonly key: string | undefined;
  /** When it was written, Unix ms. */
  readonly timestamp: number;
  /** The opaque lease token; undefined on replay. */
  readonly receiptHandle: string | undefined;
  /** 1 on the first delivery, counting up on redeliveries; undefined on replay. */
  readonly deliveryAttempt: number | undefined;
  /** The exact bytes that were produced. */
  readonly body: Uint8Array;
  /** When this client received it (Unix ms): the start of its lease as the client sees it. */
  readonly receivedAt: number;
  /**
   * The endpoint that leased it (undefined on replay): its ack, nack and extend go
   * there first, since a node that did not issue a lease cannot settle it.
   */
  readonly endpoint: string | undefined;
  private _state: MessageState;

  /** @internal Built by the client from the wire form. */
  constructor(
    wire: WireMessage,
    private readonly settler: Settler | undefined,
    receivedAt = Date.now(),
    endpoint?: string,
  ) {
    this.endpoint = wire.receipt_handle === undefined ? undefined : endpoint;
    this.topic = wire.topic;
    this.partition = wire.partition;
    this.offset = wire.offset;
    this.key = wire.key ?? undefined;
    this.timestamp = wire.timestamp;
    this.receiptHandle = wire.receipt_handle;
    this.deliveryAttempt = wire.delivery_attempt;
    this.receivedAt = receivedAt;
    if (wire.payload_encoding === "base64" && typeof wire.payload === "string") this.body = fromBase64(wire.payload);
    else if (typeof wire.payload === "string") this.body = utf8Encode(wire.payload);
    else this.body = utf8Encode(JSON.stringify(wire.payload ?? null));
    this._state = this.receiptHandle === undefined ? "replayed" : "leased";
  }

  /** Where the message stands: leased, acked, nacked, lost (its lease lapsed) or replayed. */
  get state(): MessageState {
    return this._state;
  }

  /** Whether it was acked or nacked (or its lease was lost) through this client. */
  get settled(): boolean {
    return this._state !== "leased";
  }

  /** bytes returns the exact bytes that were produced. */
  bytes(): Uint8Array {
    return this.body;
  }

  /** text decodes the body as UTF-8, throwing a TypeError when it is not valid UTF-8. */
  text(): string {
    return utf8Decode(this.body);
  }

  /** json parses the body as JSON, throwing a SyntaxError when it is not JSON. */
  json<T = unknown>(): T {
    return JSON.parse(utf8Decode(this.body)) as T;
  }

  /** envelope reads the body as an {@link Envelope}; undefined when it is not one. */
  envelope(): Envelope | undefined {
    return Envelope.decode(this.body);
  }

  private lease<T extends CallOptions>(opts: T | undefined): T & SettleOptions {
    const o = { ...opts } as T & SettleOptions;
    if (o.endpoint === undefined && this.endpoint !== undefined) o.endpoint = this.endpoint;
    return o;
  }

  private handle(op: string): string {
    if (this.receiptHandle === undefined || this.settler === undefined) {
      throw new TypeError(`Message.${op}: a replayed message has no lease to settle`);
    }
    return this.receiptHandle;
  }

  /**
   * ack settles the message: it is not delivered again. The ack is confirmed: retried
   * on 503 and connection errors, and a 410 on a retry whose first reply was lost counts
   * as success. Rejects with LeaseLostError when the lease had lapsed (the message is
   * then delivered again; do not treat it as done).
   */
  async ack(opts?: SettleOptions): Promise<void> {
    const h = this.handle("ack");
    try {
      await (this.settler as Settler).ack(this.topic, h, this.lease(opts));
      this._state = "acked";
    } catch (e) {
      if ((e as { kind?: unknown }).kind === "LeaseLost") this._state = "lost";
      throw e;
    }
  }

  /** nack hands the message back, to be delivered again after `delayMs` (default at once). */
  async nack(opts?: NackOptions): Promise<void> {
    const h = this.handle("nack");
    try {
      await (this.settler as Settler).nack(this.topic, h, this.lease(opts));
      this._state = "nacked";
    } catch (e) {
      if ((e as { kind?: unknown }).kind === "LeaseLost") this._state = "lost";
      throw e;
    }
  }

  /** extend renews the lease: it ends `leaseMs` from now (default the topic's visibility timeout). */
  async extend(opts?: ExtendOptions): Promise<void> {
    const h = this.handle("extend");
    try {
      await (this.settler as Settler).extend(this.topic, h, this.lease(opts));
    } catch (e) {
      if ((e as { kind?: unknown }).kind === "LeaseLost") this._state = "lost";
      throw e;
    }
  }

  /** @internal Marks the lease lost (the consumer saw it lapse). */
  markLost(): void {
    if (this._state === "leased") this._state = "lost";
  }
}
