import type { NaradError } from "./errors.js";

/**
 * Logger is where the SDK writes what it noticed: retries, a node taken out of the
 * rotation, a consumer's handler failures. `console` fits, as do pino and winston
 * loggers. The SDK is quiet without one.
 */
export interface Logger {
  /** Detail worth having while debugging (each retry). */
  debug?(message: string, fields?: Record<string, unknown>): void;
  /** Things that went as planned but are worth knowing (a consumer started or stopped). */
  info?(message: string, fields?: Record<string, unknown>): void;
  /** Failures the SDK recovered from or worked around (a node taken out of rotation). */
  warn?(message: string, fields?: Record<string, unknown>): void;
  /** Failures the SDK could not recover from (a consumer stopped by a terminal error). */
  error?(message: string, fields?: Record<string, unknown>): void;
}

/** Auth is how the client proves who it is: HTTP Basic with a Narad user. */
export interface BasicAuth {
  /** The user's name. */
  username: string;
  /** The user's password. */
  password: string;
}

/**
 * RetryOptions shape the retries of every call: up to `attempts` tries with full-jitter
 * exponential backoff between `minBackoffMs` and `maxBackoffMs`, never shorter than the
 * broker's Retry-After.
 */
export interface RetryOptions {
  /** Tries per call, the first included (default 4; 1 turns retries off). */
  attempts?: number;
  /** The backoff before the second try, before jitter (default 50 ms). */
  minBackoffMs?: number;
  /** The longest backoff (default 5000 ms). */
  maxBackoffMs?: number;
}

/**
 * BreakerOptions shape the per-node circuit breaker: after `failureThreshold`
 * consecutive failures (connection errors, timeouts, 503s) a node leaves the
 * rotation; it is probed with GET /readyz every `probeIntervalMs` (doubling up to
 * `maxProbeIntervalMs`) and comes back on the first 200.
 */
export interface BreakerOptions {
  /** Consecutive failures (connection errors, timeouts, 503s) that take a node out of the rotation (default 2). */
  failureThreshold?: number;
  /** The first wait before a probe, the cooldown (default 2000 ms). */
  probeIntervalMs?: number;
  /** The longest wait between probes (default 30000 ms). */
  maxProbeIntervalMs?: number;
}

/** ClientOptions configure a {@link Client}. Only `endpoints` is required. */
export interface ClientOptions {
  /**
   * One or more broker base URLs (`http://host:7942`) of ONE cluster. Calls go to the
   * first healthy one in this order and fail over to the next only when it fails; a
   * leased message's ack, nack and extend go to the endpoint that leased it. With
   * several endpoints the client asks each for `GET /v1/cluster` on first use and
   * warns once (through `logger`, else `console.warn`) when they are not one cluster.
   */
  endpoints: string | readonly string[];
  /** Credentials sent with every request, when the broker runs with security on. */
  auth?: BasicAuth;
  /** Retry policy (4 attempts, 50 ms–5 s full-jitter backoff by default). */
  retry?: RetryOptions;
  /** Per-node circuit breaker. */
  breaker?: BreakerOptions;
  /**
   * The request timeout: the bound of EACH attempt of a call, in ms (default 30000).
   * An attempt that runs out counts as a failure of its endpoint (breaker) and the call
   * fails over to the next one, so a hung node never takes a call's whole budget. A
   * call's budget is attempts × this + the backoff between them. A long poll's attempt
   * may take its wait plus {@link ClientOptions.longPollMarginMs}.
   */
  timeoutMs?: number;
  /** What a long poll's attempt may take beyond its wait (default `timeoutMs`). */
  longPollMarginMs?: number;
  /**
   * Whether a produce whose outcome is unknown (its reply was lost) is retried, which
   * may store a second copy (default true: consumers are expected to be idempotent).
   * With false such a produce fails with an error whose `uncertain` is true.
   */
  allowDuplicates?: boolean;
  /** Where the SDK logs; quiet when absent. */
  logger?: Logger;
  /** The one event hook: metrics and tracing adapters plug in here (see {@link NaradEvent}). */
  onEvent?: (event: NaradEvent) => void;
  /** The fetch to use (default the global one); handy for proxies and tests. */
  fetch?: typeof fetch;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
}

/** CallOptions can be given to every call: a signal to cancel it and its own deadline. */
export interface CallOptions {
  /** Cancels the call; it then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** The bound of each attempt of this call, in ms (default the client's `timeoutMs`); see {@link ClientOptions.timeoutMs}. */
  timeoutMs?: number;
}

/** OperationStartEvent: an API call began. `id` ties it to its end and attempts. */
export interface OperationStartEvent {
  /** Always "operation.start". */
  type: "operation.start";
  /** Unique per client; the same in the matching end and attempt events. */
  id: number;
  /** The operation's id from openapi.yaml (`produce`, `consumeBatch`, `ack`…). */
  operation: string;
  /** The topic, when the operation has one. */
  topic: string | undefined;
  /** The HTTP method. */
  method: string;
}

/** OperationEndEvent: an API call finished, successfully or not. */
export interface OperationEndEvent {
  /** Always "operation.end". */
  type: "operation.end";
  /** As in the start event. */
  id: number;
  /** As in the start event. */
  operation: string;
  /** As in the start event. */
  topic: string | undefined;
  /** Wall time of the whole call, retries included. */
  durationMs: number;
  /** How many HTTP attempts it took. */
  attempts: number;
  /** The final HTTP status, when one arrived. */
  status: number | undefined;
  /** The error the call failed with; undefined on success. */
  error: NaradError | undefined;
}

/** AttemptEvent: one HTTP attempt of a call ended. */
export interface AttemptEvent {
  /** Always "attempt". */
  type: "attempt";
  /** The call's id. */
  id: number;
  /** The operation's id. */
  operation: string;
  /** The endpoint tried. */
  endpoint: string;
  /** 1 for the first attempt. */
  attempt: number;
  /** The HTTP status, or undefined when no answer arrived. */
  status: number | undefined;
  /** How long the attempt took. */
  durationMs: number;
  /** Why it failed, when it did. */
  error: NaradError | undefined;
}

/** RetryEvent: a call will try again after `delayMs`. */
export interface RetryEvent {
  /** Always "retry". */
  type: "retry";
  /** The call's id. */
  id: number;
  /** The operation's id. */
  operation: string;
  /** The attempt that failed. */
  attempt: number;
  /** How long until the next attempt. */
  delayMs: number;
  /** Why the attempt failed. */
  error: NaradError;
}

/** BreakerEvent: a node left the rotation (`open`) or came back (`closed`). */
export interface BreakerEvent {
  /** Always "breaker". */
  type: "breaker";
  /** The node's base URL. */
  endpoint: string;
  /** "open": skipped and probed; "closed": back in rotation. */
  state: "open" | "closed";
}

/** ConsumerEvent: something a {@link Consumer} did or ran into, for metrics and alerts. */
export interface ConsumerEvent {
  /** Always "consumer". */
  type: "consumer";
  /** The topic consumed. */
  topic: string;
  /**
   * What happened: `acked`, `nacked`, `ack_failed` (the outcome of one message's
   * settlement), `lease_lost` (a handler was cancelled), `renewed`, `handler_error`,
   * `poll_error` (retried), `stopped`.
   */
  event: "acked" | "nacked" | "ack_failed" | "lease_lost" | "renewed" | "handler_error" | "poll_error" | "stopped";
  /** The message's partition, for per-message events. */
  partition?: number;
  /** The message's offset, for per-message events. */
  offset?: number;
  /** The error, for failures. */
  error?: unknown;
}

/**
 * ReplayEvent: something a {@link Replay} went past. `damaged`: a read skipped the
 * message at `offset`, whose stored record fails its checksum; the broker never serves
 * it, and the replay goes on after it.
 */
export interface ReplayEvent {
  /** Always "replay". */
  type: "replay";
  /** The topic replayed. */
  topic: string;
  /** What happened. */
  event: "damaged";
  /** The partition read. */
  partition: number;
  /** The damaged message's offset. */
  offset: number;
}

/** NaradEvent is everything the event hook receives. */
export type NaradEvent = OperationStartEvent | OperationEndEvent | AttemptEvent | RetryEvent | BreakerEvent | ConsumerEvent | ReplayEvent;
