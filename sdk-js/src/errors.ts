import type { components } from "./generated/openapi.js";

/** ErrorCode is a stable machine name the broker puts in `error.code` (the `ErrorCode` list of openapi.yaml). */
export type ErrorCode = components["schemas"]["ErrorCode"];

/**
 * SdkErrorCode names failures the SDK detects itself, where no broker answer exists:
 * a connection that failed, a deadline that passed, a closed client, a full buffer, or
 * an answer the SDK could not read.
 */
export type SdkErrorCode = "connection_failed" | "timeout" | "closed" | "buffer_full" | "invalid_response" | "throttled" | "http_error";

/**
 * ErrorKind is the taxonomy shared by every Narad SDK (see docs/sdk/contract.md): the same names in
 * Go, Python and TypeScript. `NotImplemented` (501: the broker does not offer the
 * operation yet) and `Internal` (a broker bug, or a status the SDK does not know) cover
 * the answers outside the shared list.
 */
export type ErrorKind =
  | "BadRequest"
  | "Unauthenticated"
  | "Forbidden"
  | "NotFound"
  | "Conflict"
  | "TooLarge"
  | "LeaseLost"
  | "Unavailable"
  | "Throttled"
  | "Timeout"
  | "Closed"
  | "NotImplemented"
  | "Internal";

/** NaradErrorOptions is what a {@link NaradError} is built from. */
export interface NaradErrorOptions {
  /** The broker's `error.code`, or an {@link SdkErrorCode}. */
  code: ErrorCode | SdkErrorCode;
  /** The HTTP status, when the broker (or a proxy) answered. */
  status?: number | undefined;
  /** Whether trying again is safe and may succeed. Defaults from the kind. */
  retryable?: boolean;
  /** Whether the request may have taken effect although it failed. Defaults to false. */
  uncertain?: boolean;
  /** How long the broker asked to wait before a retry (Retry-After), in ms. */
  retryAfterMs?: number | undefined;
  /** The endpoint that answered or failed. */
  endpoint?: string | undefined;
  /** The underlying error. */
  cause?: unknown;
  /** What part of a produce-batch was stored, when the broker said only part was. */
  partlyStored?: PartlyStored | undefined;
}

/**
 * PartlyStored is what the broker says about a produce-batch of which only part was
 * stored (its error's `partly_stored`): the writes to some partitions succeeded, and
 * those messages will be delivered. Resending the whole batch stores them twice, so
 * the SDK never resends such a batch; resend only the messages of `failedPartitions`
 * if duplicates matter. With code `timeout` the messages of those partitions may or
 * may not be stored.
 */
export interface PartlyStored {
  /** How many messages of the batch were stored. */
  readonly stored: number;
  /** The partitions whose messages were not stored (with code `timeout`: may not be). */
  readonly failedPartitions: readonly number[];
}

const retryableKinds: ReadonlySet<ErrorKind> = new Set<ErrorKind>(["Unavailable", "Throttled", "Timeout"]);

/**
 * NaradError is every error the SDK raises for a failed operation. Branch on
 * {@link NaradError.kind} (or `instanceof` one of the subclasses) and on
 * {@link NaradError.code}, never on the message.
 *
 * `retryable` says a retry is safe and useful (503, 429, timeouts, connection errors);
 * `uncertain` says the operation may have taken effect although it failed — a produce
 * whose reply was lost may have stored the message. `partlyStored` is set on the error
 * of a produce-batch of which only part was stored: such an error is neither retryable
 * (a resend stores the stored part twice) nor certain.
 */
export class NaradError extends Error {
  /** The taxonomy name shared by every SDK. */
  readonly kind: ErrorKind;
  /** The broker's `error.code`, or an {@link SdkErrorCode} for failures the SDK detected. */
  readonly code: ErrorCode | SdkErrorCode;
  /** The HTTP status, or undefined when no answer arrived. */
  readonly status: number | undefined;
  /** Whether trying again is safe and may succeed. */
  readonly retryable: boolean;
  /** Whether the operation may have taken effect although it failed. */
  readonly uncertain: boolean;
  /** The broker's Retry-After in ms, when it sent one. */
  readonly retryAfterMs: number | undefined;
  /** The endpoint that answered or failed, when known. */
  readonly endpoint: string | undefined;
  /**
   * Set when the broker stored only part of a produce-batch: how many messages were
   * stored and which partitions failed. The SDK never resends such a batch.
   */
  readonly partlyStored: PartlyStored | undefined;

  /** Creates an error of the given kind; prefer {@link errorFromResponse} for broker answers. */
  constructor(kind: ErrorKind, message: string, opts: NaradErrorOptions) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = kind === "Internal" || kind === "NotImplemented" ? `Narad${kind}Error` : `${kind}Error`;
    this.kind = kind;
    this.code = opts.code;
    this.status = opts.status;
    this.retryable = opts.retryable ?? retryableKinds.has(kind);
    this.uncertain = opts.uncertain ?? false;
    this.retryAfterMs = opts.retryAfterMs;
    this.endpoint = opts.endpoint;
    this.partlyStored = opts.partlyStored;
  }

  /** Returns a copy of this error with `uncertain` set as given (the same error when it already is). */
  withUncertain(uncertain: boolean): NaradError {
    if (uncertain === this.uncertain) return this;
    const copy = Object.create(Object.getPrototypeOf(this) as object) as NaradError;
    Object.defineProperties(copy, Object.getOwnPropertyDescriptors(this));
    Object.defineProperty(copy, "uncertain", { value: uncertain, enumerable: true });
    return copy;
  }
}

/** BadRequestError: 400, the request is malformed; fix it before retrying. */
export class BadRequestError extends NaradError {
  /** Creates a BadRequest error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("BadRequest", message, opts);
  }
}
/** UnauthenticatedError: 401, no or wrong credentials. Terminal for a consumer. */
export class UnauthenticatedError extends NaradError {
  /** Creates an Unauthenticated error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Unauthenticated", message, opts);
  }
}
/** ForbiddenError: 403, authenticated but not allowed. Terminal for a consumer. */
export class ForbiddenError extends NaradError {
  /** Creates a Forbidden error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Forbidden", message, opts);
  }
}
/** NotFoundError: 404, the topic, partition, user or route does not exist. */
export class NotFoundError extends NaradError {
  /** Creates a NotFound error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("NotFound", message, opts);
  }
}
/** ConflictError: 409, the request conflicts with the state (the topic exists, say). */
export class ConflictError extends NaradError {
  /** Creates a Conflict error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Conflict", message, opts);
  }
}
/** TooLargeError: 413, a message or body is over its limit (1 MiB a message, 8 MiB a batch). */
export class TooLargeError extends NaradError {
  /** Creates a TooLarge error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("TooLarge", message, opts);
  }
}
/**
 * LeaseLostError: 410, the lease behind a receipt handle lapsed, was handed back or the
 * message was settled. Unless it was settled, the message is (or was) delivered again: do
 * not ack it.
 */
export class LeaseLostError extends NaradError {
  /** Creates a LeaseLost error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("LeaseLost", message, opts);
  }
}
/** UnavailableError: 503 (or a failed connection), retryable after {@link NaradError.retryAfterMs}. */
export class UnavailableError extends NaradError {
  /** Creates an Unavailable error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Unavailable", message, opts);
  }
}
/** ThrottledError: 429 from a proxy in front of the broker; retryable. */
export class ThrottledError extends NaradError {
  /** Creates a Throttled error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Throttled", message, opts);
  }
}
/**
 * TimeoutError: the call's deadline passed, the broker answered 503 `timeout`, or a
 * proxy answered 504 (or 408); a write's outcome is then unknown (`uncertain`).
 */
export class TimeoutError extends NaradError {
  /** Creates a Timeout error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Timeout", message, opts);
  }
}
/** ClosedError: the client, publisher or consumer was closed before or during the call. */
export class ClosedError extends NaradError {
  /** Creates a Closed error. */
  constructor(message: string, opts: NaradErrorOptions = { code: "closed" }) {
    super("Closed", message, opts);
  }
}
/** NotImplementedError: 501, this broker version does not offer the operation yet. */
export class NotImplementedError extends NaradError {
  /** Creates a NotImplemented error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("NotImplemented", message, opts);
  }
}
/** InternalError: a 500 (a broker bug) or a status or answer the SDK cannot read. */
export class InternalError extends NaradError {
  /** Creates an Internal error. */
  constructor(message: string, opts: NaradErrorOptions) {
    super("Internal", message, opts);
  }
}
/**
 * BufferFullError: a {@link Publisher} configured with `whenFull: "error"` had no room.
 * Nothing was sent; retry after the buffer drains.
 */
export class BufferFullError extends NaradError {
  /** Creates a buffer-full error. */
  constructor(message: string) {
    super("Unavailable", message, { code: "buffer_full", retryable: true });
    this.name = "BufferFullError";
  }
}

/** retryAfterMs reads a Retry-After header (seconds or an HTTP date) as milliseconds. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const secs = Number(value);
  if (Number.isFinite(secs)) return Math.max(0, secs * 1000);
  const at = Date.parse(value);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - Date.now());
}

/**
 * errorFromStatus builds the taxonomy error for an HTTP answer: the kind comes from
 * the status, the code from the body (or a default for the status).
 */
export function errorFromStatus(
  status: number,
  code: string | undefined,
  message: string | undefined,
  extra: { retryAfterMs?: number | undefined; endpoint?: string | undefined; uncertain?: boolean } = {},
): NaradError {
  const opts = (def: ErrorCode | SdkErrorCode): NaradErrorOptions => ({
    code: (code ?? def) as ErrorCode,
    status,
    retryAfterMs: extra.retryAfterMs,
    endpoint: extra.endpoint,
    ...(extra.uncertain === undefined ? {} : { uncertain: extra.uncertain }),
  });
  const msg = message ?? `HTTP ${status}`;
  switch (status) {
    case 400:
      return new BadRequestError(msg, opts("bad_request"));
    case 401:
      return new UnauthenticatedError(msg, opts("unauthenticated"));
    case 403:
      return new ForbiddenError(msg, opts("forbidden"));
    case 404:
      return new NotFoundError(msg, opts("not_found"));
    case 405:
      return new BadRequestError(msg, opts("method_not_allowed"));
    case 409:
      return new ConflictError(msg, opts("conflict"));
    case 410:
      return new LeaseLostError(msg, opts("lease_lost"));
    case 413:
      return new TooLargeError(msg, opts("payload_too_large"));
    case 429:
      return new ThrottledError(msg, opts("throttled"));
    case 501:
      return new NotImplementedError(msg, opts("not_implemented"));
    case 408:
    case 504:
      // A proxy gave up waiting (504), or a request timed out (408): the request may
      // have reached the broker and taken effect, as after a lost reply. Retryable.
      return new TimeoutError(msg, { ...opts("timeout"), uncertain: extra.uncertain ?? true, retryable: true });
    case 502:
    case 503: {
      // A broker 503 "timeout" means the operation may have happened; so does a 503
      // "maybe_stored" (a failed disk write the broker could not take back).
      const uncertain = extra.uncertain ?? (code === "timeout" || code === "maybe_stored");
      if (code === "timeout") return new TimeoutError(msg, { ...opts("timeout"), uncertain, retryable: true });
      return new UnavailableError(msg, { ...opts("unavailable"), uncertain });
    }
  }
  if (status >= 400 && status < 500) return new BadRequestError(msg, opts("http_error"));
  // A 500 is a broker bug: terminal, and not marked uncertain (as in the Go and Python
  // SDKs); the broker's log says what happened.
  return new InternalError(msg, opts("internal"));
}

/** isNaradError reports whether err is a {@link NaradError}. */
export function isNaradError(err: unknown): err is NaradError;
/** isNaradError reports whether err is a {@link NaradError} of the given kind. */
export function isNaradError(err: unknown, kind: ErrorKind): boolean;
export function isNaradError(err: unknown, kind?: ErrorKind): boolean {
  return err instanceof NaradError && (kind === undefined || err.kind === kind);
}

/** isRetryable reports whether err is a {@link NaradError} that is safe and useful to retry. */
export function isRetryable(err: unknown): boolean {
  return err instanceof NaradError && err.retryable;
}

/** isUncertain reports whether err is a {@link NaradError} whose operation may have taken effect. */
export function isUncertain(err: unknown): boolean {
  return err instanceof NaradError && err.uncertain;
}
