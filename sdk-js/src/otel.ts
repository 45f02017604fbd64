// OpenTelemetry tracing for the Narad client, as an optional module: import it from
// "@narad/client/otel". @opentelemetry/api is an optional peer dependency, loaded
// lazily (a dynamic import) only when this module's functions run, so the core package
// never needs it. The types below are the few structural pieces of the API used here,
// so this file's declarations do not require @opentelemetry/api to be installed.

import type { Envelope, EnvelopeOptions } from "./envelope.js";
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

/** OtelTracer is the part of an OpenTelemetry Tracer this module uses. */
export interface OtelTracer {
  /** Starts a span (as a child of the given context, when one is given). */
  startSpan(name: string, options?: { kind?: number; attributes?: Record<string, string | number | boolean> }, context?: unknown): OtelSpan;
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

const SPAN_KIND_CLIENT = 2;
const STATUS_ERROR = 2;

async function loadApi(api: OtelApi | undefined): Promise<OtelApi> {
  if (api) return api;
  const name = "@opentelemetry/api";
  try {
    return (await import(name)) as OtelApi;
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
  const tracer = opts.tracer ?? api.trace.getTracer("@narad/client");
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
  const m = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(envelope.traceparent ?? "");
  if (!m) return a.context.active();
  return a.trace.setSpanContext(a.context.active(), { traceId: m[1] as string, spanId: m[2] as string, traceFlags: parseInt(m[3] as string, 16), isRemote: true });
}
