import { encodeBody, type Body, type EncodedBody, type SelfEncoding } from "./body.js";
import { fromBase64, randomId, toBase64, utf8Decode, utf8Encode } from "./internal/util.js";

/** ENVELOPE_FORMAT marks a message body as a Narad envelope (version 1). */
export const ENVELOPE_FORMAT = "narad.envelope/1";

/** EnvelopeOptions fill an envelope's optional fields. */
export interface EnvelopeOptions {
  /** The message id; generated (a UUID) when absent. Keep it when re-sending the same message. */
  id?: string;
  /** The delivery attempt this copy stands for, from 1 (default 1). */
  attempt?: number;
  /** Application headers. */
  headers?: Record<string, string>;
  /** W3C trace context of the producer, so consumers can join the trace. */
  traceparent?: string;
  /** W3C trace state, with `traceparent`. */
  tracestate?: string;
  /** Unix ms before which the message should not be handled (set by retry tiers). */
  notBefore?: number;
  /** The last error that sent this message to a retry tier or the parking topic. */
  lastError?: string;
  /** The topic the message was first produced to (set by retry tiers). */
  origin?: string;
}

interface EnvelopeWire {
  format: typeof ENVELOPE_FORMAT;
  id: string;
  attempt: number;
  headers?: Record<string, string>;
  traceparent?: string;
  tracestate?: string;
  not_before?: number;
  last_error?: string;
  origin?: string;
  body?: unknown;
  body_text?: string;
  body_base64?: string;
}

/**
 * Envelope is the opt-in JSON wrapper for the patterns that need more than a body: a
 * message id stable across produce retries (for deduplication), an attempt count,
 * headers and a trace context. Produce one by passing it as the body; read one back
 * with {@link Message.envelope}. Plain messages never need it.
 *
 * On the wire it is a JSON object `{"format":"narad.envelope/1","id","attempt",
 * "headers","traceparent","body"|"body_text"|"body_base64",…}`, so any language can read it.
 */
export class Envelope implements SelfEncoding {
  /** The message id, stable across produce retries and re-deliveries. */
  readonly id: string;
  /** The delivery attempt, from 1; retry tiers count it up. */
  readonly attempt: number;
  /** Application headers. */
  readonly headers: Readonly<Record<string, string>>;
  /** W3C traceparent of the producer, if any. */
  readonly traceparent: string | undefined;
  /** W3C tracestate of the producer, if any. */
  readonly tracestate: string | undefined;
  /** Unix ms before which the message should wait (retry tiers). */
  readonly notBefore: number | undefined;
  /** The last error recorded by a retry tier. */
  readonly lastError: string | undefined;
  /** The first topic the message was produced to. */
  readonly origin: string | undefined;
  /** The wrapped body's exact bytes. */
  readonly body: Uint8Array;
  /** How the wrapped body was given: bytes, text or a JSON value. */
  readonly bodyKind: "bytes" | "text" | "json";

  private constructor(body: EncodedBody, opts: EnvelopeOptions) {
    this.id = opts.id ?? randomId();
    this.attempt = opts.attempt ?? 1;
    this.headers = { ...opts.headers };
    this.traceparent = opts.traceparent;
    this.tracestate = opts.tracestate;
    this.notBefore = opts.notBefore;
    this.lastError = opts.lastError;
    this.origin = opts.origin;
    this.body = body.bytes;
    this.bodyKind = body.kind;
  }

  /** wrap puts a body into a new envelope (with a fresh id unless one is given). */
  static wrap(body: Body, opts: EnvelopeOptions = {}): Envelope {
    if (body instanceof Envelope) throw new TypeError("Envelope.wrap: the body is already an envelope");
    return new Envelope(encodeBody(body), opts);
  }

  /**
   * @internal fromEncoded wraps already-encoded bytes as the given kind, keeping them
   * exact (a plain message re-routed by retry tiers).
   */
  static fromEncoded(body: EncodedBody, opts: EnvelopeOptions = {}): Envelope {
    return new Envelope(body, opts);
  }

  /**
   * decode reads an envelope from a message body; undefined when the bytes are not one
   * (so plain messages and envelopes can share a topic).
   */
  static decode(bytes: Uint8Array): Envelope | undefined {
    let w: Partial<EnvelopeWire>;
    try {
      w = JSON.parse(utf8Decode(bytes)) as Partial<EnvelopeWire>;
    } catch {
      return undefined;
    }
    if (typeof w !== "object" || w === null || w.format !== ENVELOPE_FORMAT || typeof w.id !== "string") return undefined;
    let body: EncodedBody;
    if (typeof w.body_base64 === "string") body = { bytes: fromBase64(w.body_base64), contentType: "application/octet-stream", kind: "bytes" };
    else if (typeof w.body_text === "string") body = { bytes: utf8Encode(w.body_text), contentType: "text/plain; charset=utf-8", kind: "text" };
    else body = { bytes: utf8Encode(JSON.stringify(w.body ?? null)), contentType: "application/json", kind: "json" };
    const opts: EnvelopeOptions = { id: w.id, attempt: typeof w.attempt === "number" ? w.attempt : 1 };
    if (w.headers && typeof w.headers === "object") opts.headers = w.headers;
    if (typeof w.traceparent === "string") opts.traceparent = w.traceparent;
    if (typeof w.tracestate === "string") opts.tracestate = w.tracestate;
    if (typeof w.not_before === "number") opts.notBefore = w.not_before;
    if (typeof w.last_error === "string") opts.lastError = w.last_error;
    if (typeof w.origin === "string") opts.origin = w.origin;
    return new Envelope(body, opts);
  }

  /** with returns a copy with some fields changed; the id and body stay. */
  with(changes: Omit<EnvelopeOptions, "id">): Envelope {
    const cur: EnvelopeOptions = { id: this.id, attempt: this.attempt, headers: { ...this.headers } };
    if (this.traceparent !== undefined) cur.traceparent = this.traceparent;
    if (this.tracestate !== undefined) cur.tracestate = this.tracestate;
    if (this.notBefore !== undefined) cur.notBefore = this.notBefore;
    if (this.lastError !== undefined) cur.lastError = this.lastError;
    if (this.origin !== undefined) cur.origin = this.origin;
    return new Envelope({ bytes: this.body, contentType: "", kind: this.bodyKind }, { ...cur, ...changes });
  }

  /** text decodes the wrapped body as UTF-8 (throws TypeError on invalid bytes). */
  text(): string {
    return utf8Decode(this.body);
  }

  /** json parses the wrapped body as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(utf8Decode(this.body)) as T;
  }

  /** toBody returns the envelope's wire form (JSON). */
  toBody(): EncodedBody {
    const w: EnvelopeWire = { format: ENVELOPE_FORMAT, id: this.id, attempt: this.attempt };
    if (Object.keys(this.headers).length > 0) w.headers = { ...this.headers };
    if (this.traceparent !== undefined) w.traceparent = this.traceparent;
    if (this.tracestate !== undefined) w.tracestate = this.tracestate;
    if (this.notBefore !== undefined) w.not_before = this.notBefore;
    if (this.lastError !== undefined) w.last_error = this.lastError;
    if (this.origin !== undefined) w.origin = this.origin;
    let json: string;
    if (this.bodyKind === "json") {
      // Splice the body's own JSON text in, so its bytes stay exactly as given.
      const head = JSON.stringify(w);
      json = `${head.slice(0, -1)},"body":${utf8Decode(this.body)}}`;
    } else {
      if (this.bodyKind === "text") w.body_text = utf8Decode(this.body);
      else w.body_base64 = toBase64(this.body);
      json = JSON.stringify(w);
    }
    return { bytes: utf8Encode(json), contentType: "application/json", kind: "json" };
  }
}
