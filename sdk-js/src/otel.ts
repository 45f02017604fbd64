// OpenTelemetry for the Narad client, as an optional module: import it from
// "@narad/client/otel". Client spans per call (otelTracing), a process span around
// handlers that continues the producer's trace (otelHandler), and metrics from the
// event hook (otelMetrics). @opentelemetry/api is an optional peer dependency, loaded
// lazily (a dynamic import) only when this module's functions run, so the core package
// never needs it. The types below are the few structural pieces of the API used here,
// so this file's declarations do not require @opentelemetry/api to be installed.

import type { Handler } from "./consumer.js";
import type { Envelope, EnvelopeOptions } from "./envelope.js";
import type { Message } from "./message.js";
import type { NaradEvent } from "./options.js";

/** OtelSpan is the part of an OpenTelemetry Span this module uses. */
export interface OtelSpan {
  /** Sets one attribute. */
  setAttribute(key: string, value: string | number | boolean): unknown;
  /** Adds a timed event. */
  addEvent(name: string, attributes?: Record<string, string | number | boolean>): unknown;
  /** Sets the status (code 2 = error). */
  setStatus(status: { code: number; message?: string }): unknown;
  /** Records an exception. */
  recordException(exception: Error): unknown;
  /** Ends the span. */
  end(): void;
  /** The span's context. */
  spanContext(): { traceId: string; spanId: string; traceFlags: number };
}

/** OtelSpanContext is a span's identity, as OpenTelemetry's SpanContext. */
export interface OtelSpanContext {
  /** 32 lowercase hex digits. */
  traceId: string;
  /** 16 lowercase hex digits. */
  spanId: string;
  /** W3C trace flags (1 = sampled). */
  traceFlags: number;
  /** Whether it came from another process. */
  isRemote?: boolean;
  /** The W3C trace state, as the API's TraceState. */
  traceState?: unknown;
}

/** OtelTracer is the part of an OpenTelemetry Tracer this module uses. */
export interface OtelTracer {
  /** Starts a span (as a child of the given context, when one is given). */
  startSpan(
    name: string,
    options?: { kind?: number; attributes?: Record<string, string | number | boolean>; links?: { context: OtelSpanContext }[] },
    context?: unknown,
  ): OtelSpan;
}

/** OtelApi is the part of the `@opentelemetry/api` module this module uses. */
export interface OtelApi {
  /** The global trace API. */
  trace: {
    getTracer(name: string, version?: string): OtelTracer;
    getActiveSpan(): OtelSpan | undefined;
    setSpanContext(context: unknown, spanContext: { traceId: string; spanId: string; traceFlags: number; isRemote?: boolean }): unknown;
  };
  /** The global context API. */
  context: { active(): unknown };
}

/** OtelTracingOptions configure {@link otelTracing}. */
export interface OtelTracingOptions {
  /** The API module to use; default `await import("@opentelemetry/api")`. */
  api?: OtelApi;
  /** The tracer to use; default `api.trace.getTracer("@narad/client")`. */
  tracer?: OtelTracer;
}

/**
 * OtelProcessApi is the part of `@opentelemetry/api` {@link otelHandler} uses: spans
 * put into and read from contexts, and a context made active while the handler runs.
 */
export interface OtelProcessApi {
  /** The global trace API. */
  trace: {
    getTracer(name: string, version?: string): OtelTracer;
    setSpan(context: unknown, span: OtelSpan): unknown;
    setSpanContext(context: unknown, spanContext: OtelSpanContext): unknown;
    getSpanContext(context: unknown): OtelSpanContext | undefined;
  };
  /** The global context API. */
  context: { active(): unknown; with<T>(context: unknown, fn: () => T): T };
  /** Parses a W3C tracestate (the API's createTraceState). */
  createTraceState?(value: string): unknown;
}

const SPAN_KIND_CLIENT = 2;
const SPAN_KIND_CONSUMER = 4;
const STATUS_ERROR = 2;
const SCOPE = "@narad/client";

async function loadApi<T>(api: T | undefined): Promise<T> {
  if (api) return api;
  const name = "@opentelemetry/api";
  try {
    return (await import(name)) as T;
  } catch (e) {
    throw new Error("@narad/client/otel needs the optional peer dependency @opentelemetry/api: npm install @opentelemetry/api", { cause: e });
  }
}

/**
 * otelTracing returns an event hook for {@link ClientOptions.onEvent} that records a
 * client span per API call (`narad produce`, `narad consumeBatch`, …) with one event per
 * HTTP attempt, as a child of the span active when the call began.
 *
 * ```ts
 * const client = new Client({ endpoints, onEvent: await otelTracing() });
 * ```
 */
export async function otelTracing(opts: OtelTracingOptions = {}): Promise<(event: NaradEvent) => void> {
  const api = await loadApi(opts.api);
  const tracer = opts.tracer ?? api.trace.getTracer(SCOPE);
  const spans = new Map<number, OtelSpan>();
  return (e: NaradEvent) => {
    switch (e.type) {
      case "operation.start": {
        const attributes: Record<string, string | number | boolean> = {
          "messaging.system": "narad",
          "messaging.operation.name": e.operation,
          "http.request.method": e.method,
        };
        if (e.topic !== undefined) attributes["messaging.destination.name"] = e.topic;
        spans.set(e.id, tracer.startSpan(`narad ${e.operation}`, { kind: SPAN_KIND_CLIENT, attributes }, api.context.active()));
        break;
      }
      case "attempt": {
        const attrs: Record<string, string | number | boolean> = { "narad.attempt": e.attempt, "server.address": e.endpoint };
        if (e.status !== undefined) attrs["http.response.status_code"] = e.status;
        if (e.error) attrs["error.type"] = e.error.code;
        spans.get(e.id)?.addEvent("narad.attempt", attrs);
        break;
      }
      case "operation.end": {
        const span = spans.get(e.id);
        if (!span) break;
        spans.delete(e.id);
        span.setAttribute("narad.attempts", e.attempts);
        if (e.status !== undefined) span.setAttribute("http.response.status_code", e.status);
        if (e.error) {
          span.setAttribute("error.type", e.error.code);
          span.recordException(e.error);
          span.setStatus({ code: STATUS_ERROR, message: e.error.message });
        }
        span.end();
        break;
      }
      default:
        break;
    }
  };
}

/**
 * traceContext returns the active span's W3C trace context, to put into an
 * {@link Envelope} (`Envelope.wrap(body, { ...await traceContext() })`); empty when no
 * span is active.
 */
export async function traceContext(api?: OtelApi): Promise<Pick<EnvelopeOptions, "traceparent">> {
  const a = await loadApi(api);
  const span = a.trace.getActiveSpan();
  if (!span) return {};
  const sc = span.spanContext();
  return { traceparent: `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}` };
}

/**
 * contextFromEnvelope returns an OpenTelemetry context whose parent is the producer's
 * span named by the envelope's traceparent (or the active context when it has none),
 * to start a consumer span under.
 */
export async function contextFromEnvelope(envelope: Envelope, api?: OtelApi): Promise<unknown> {
  const a = await loadApi(api);
  const sc = remoteSpanContext(envelope);
  if (!sc) return a.context.active();
  return a.trace.setSpanContext(a.context.active(), sc);
}

/** remoteSpanContext parses the envelope's W3C traceparent; undefined when it has none or it is invalid. */
function remoteSpanContext(envelope: Envelope): OtelSpanContext | undefined {
  const m = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(envelope.traceparent ?? "");
  if (!m || m[1] === "ff") return undefined;
  const traceId = m[2] as string;
  const spanId = m[3] as string;
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined; // the all-zero ids are invalid
  return { traceId, spanId, traceFlags: parseInt(m[4] as string, 16), isRemote: true };
}

/** OtelHandlerOptions configure {@link otelHandler}. */
export interface OtelHandlerOptions {
  /** The API module to use; default `await import("@opentelemetry/api")`. */
  api?: OtelProcessApi;
  /** The tracer to use; default `api.trace.getTracer("@narad/client")`. */
  tracer?: OtelTracer;
}

/**
 * otelHandler wraps a consumer handler with a "process" span per message (kind
 * consumer, the messaging semantic conventions' attributes). When the message is an
 * {@link Envelope} carrying a traceparent, the span continues the producer's trace
 * (with a link to the context active at delivery, if any); otherwise it is a child of
 * the active context. The span is active while the handler runs, so the calls it makes
 * (an ack, a produce) and its own spans join the trace, given a context manager (the
 * OpenTelemetry Node SDK registers one). A handler that throws marks the span as an
 * error and the error goes on to the consumer, which nacks as usual.
 *
 * ```ts
 * client.consume("orders", await otelHandler(async (msg) => handle(msg)));
 * ```
 */
export async function otelHandler(handler: Handler, opts: OtelHandlerOptions = {}): Promise<Handler> {
  const api = await loadApi(opts.api);
  const tracer = opts.tracer ?? api.trace.getTracer(SCOPE);
  return (message, ctx) => {
    const attributes = processAttributes(message);
    const active = api.context.active();
    let parent = active;
    let links: { context: OtelSpanContext }[] | undefined;
    const envelope = message.envelope();
    if (envelope) {
      attributes["messaging.message.id"] = envelope.id;
      const remote = remoteSpanContext(envelope);
      if (remote) {
        if (envelope.tracestate && api.createTraceState) remote.traceState = api.createTraceState(envelope.tracestate);
        const current = api.trace.getSpanContext(active);
        if (current && /[1-9a-f]/.test(current.traceId)) links = [{ context: current }];
        parent = api.trace.setSpanContext(active, remote);
      }
    }
    const span = tracer.startSpan(`process ${message.topic}`, links ? { kind: SPAN_KIND_CONSUMER, attributes, links } : { kind: SPAN_KIND_CONSUMER, attributes }, parent);
    const failed = (e: unknown) => {
      const err = e instanceof Error ? e : new Error(String(e));
      span.recordException(err);
      span.setStatus({ code: STATUS_ERROR, message: err.message });
      span.setAttribute("error.type", errorType(e));
    };
    let result: Promise<void> | void;
    try {
      result = api.context.with(api.trace.setSpan(parent, span), () => handler(message, ctx));
    } catch (e) {
      failed(e);
      span.end();
      throw e;
    }
    return Promise.resolve(result).then(
      () => span.end(),
      (e: unknown) => {
        failed(e);
        span.end();
        throw e;
      },
    );
  };
}

function processAttributes(message: Message): Record<string, string | number | boolean> {
  const attributes: Record<string, string | number | boolean> = {
    "messaging.system": "narad",
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
    "messaging.destination.name": message.topic,
    "messaging.destination.partition.id": String(message.partition),
    "messaging.narad.message.offset": message.offset,
  };
  if (message.deliveryAttempt !== undefined) attributes["messaging.narad.message.delivery_attempt"] = message.deliveryAttempt;
  if (message.key !== undefined) attributes["messaging.message.key"] = message.key;
  return attributes;
}

/** errorType names an error for the error.type attribute: the broker's (or SDK's) code, else the error's name. */
function errorType(e: unknown): string {
  const code = (e as { code?: unknown } | null)?.code;
  if (typeof code === "string" && code !== "") return code;
  if (e instanceof Error && e.name) return e.name;
  return "error";
}

/** OtelMeter is the part of an OpenTelemetry Meter this module uses. */
export interface OtelMeter {
  /** Creates a histogram. */
  createHistogram(name: string, options?: { description?: string; unit?: string }): { record(value: number, attributes?: Record<string, string | number | boolean>): void };
  /** Creates a monotonic counter. */
  createCounter(name: string, options?: { description?: string; unit?: string }): { add(value: number, attributes?: Record<string, string | number | boolean>): void };
}

/** OtelMetricsApi is the part of the `@opentelemetry/api` module {@link otelMetrics} uses. */
export interface OtelMetricsApi {
  /** The global metrics API. */
  metrics: { getMeter(name: string, version?: string): OtelMeter };
}

/** OtelMetricsOptions configure {@link otelMetrics}. */
export interface OtelMetricsOptions {
  /** The API module to use; default `await import("@opentelemetry/api")`. */
  api?: OtelMetricsApi;
  /** The meter to use; default `api.metrics.getMeter("@narad/client")`. */
  meter?: OtelMeter;
}

/**
 * otelMetrics returns an event hook for {@link ClientOptions.onEvent} that records
 * OpenTelemetry metrics:
 *
 * - `narad.client.operation.duration` (histogram, s): every API call, retries
 *   included, by `messaging.operation.name`, `messaging.destination.name` and
 *   `error.type` (on failure);
 * - `narad.client.attempts` (counter): HTTP attempts, by operation, `server.address`
 *   and `error.type` (on failure);
 * - `narad.client.retries` (counter): retries, by operation and `error.type`;
 * - `narad.client.breaker.transitions` (counter): a node leaving (`open`) or rejoining
 *   (`closed`) the rotation, by `server.address` and `narad.breaker.state`;
 * - `narad.consumer.events` (counter): consumer outcomes (`acked`, `nacked`,
 *   `ack_failed`, `lease_lost`, `handler_error`, `poll_error`, …), by
 *   `messaging.destination.name` and `narad.consumer.event`.
 *
 * To trace as well, call both hooks: `onEvent: (e) => { tracing(e); metrics(e); }`.
 */
export async function otelMetrics(opts: OtelMetricsOptions = {}): Promise<(event: NaradEvent) => void> {
  const api = opts.meter ? undefined : await loadApi(opts.api);
  const meter = opts.meter ?? (api as OtelMetricsApi).metrics.getMeter(SCOPE);
  const duration = meter.createHistogram("narad.client.operation.duration", { description: "Duration of Narad client calls, retries included", unit: "s" });
  const attempts = meter.createCounter("narad.client.attempts", { description: "HTTP attempts made by the Narad client", unit: "{attempt}" });
  const retries = meter.createCounter("narad.client.retries", { description: "Calls the Narad client tried again", unit: "{retry}" });
  const breaker = meter.createCounter("narad.client.breaker.transitions", { description: "Nodes leaving or rejoining the rotation", unit: "{transition}" });
  const consumer = meter.createCounter("narad.consumer.events", { description: "What Narad consumers did with messages and polls", unit: "{event}" });
  return (e: NaradEvent) => {
    switch (e.type) {
      case "operation.end": {
        const attrs: Record<string, string | number | boolean> = { "messaging.system": "narad", "messaging.operation.name": e.operation };
        if (e.topic !== undefined) attrs["messaging.destination.name"] = e.topic;
        if (e.error) attrs["error.type"] = e.error.code;
        duration.record(e.durationMs / 1000, attrs);
        break;
      }
      case "attempt": {
        const attrs: Record<string, string | number | boolean> = { "messaging.system": "narad", "messaging.operation.name": e.operation, "server.address": e.endpoint };
        if (e.error) attrs["error.type"] = e.error.code;
        attempts.add(1, attrs);
        break;
      }
      case "retry":
        retries.add(1, { "messaging.system": "narad", "messaging.operation.name": e.operation, "error.type": e.error.code });
        break;
      case "breaker":
        breaker.add(1, { "messaging.system": "narad", "server.address": e.endpoint, "narad.breaker.state": e.state });
        break;
      case "consumer": {
        const attrs: Record<string, string | number | boolean> = { "messaging.system": "narad", "messaging.destination.name": e.topic, "narad.consumer.event": e.event };
        if (e.error !== undefined) attrs["error.type"] = errorType(e.error);
        consumer.add(1, attrs);
        break;
      }
      default:
        break;
    }
  };
}
