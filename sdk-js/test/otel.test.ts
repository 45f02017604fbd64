// OpenTelemetry: the process span around handlers (continuing the producer's trace from
// the envelope) and the metrics hook, through the real @opentelemetry/api with a small
// in-memory tracer provider, an AsyncLocalStorage context manager and a recording meter.

import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";

import * as api from "@opentelemetry/api";
import { Client, Envelope, type NaradEvent } from "@narad/client";
import { otelHandler, otelMetrics, otelTracing, traceContext, type OtelMeter } from "@narad/client/otel";
import { startBroker, topicName, waitFor, type TestBroker } from "./helpers.js";

// ---- an in-memory tracer provider ----

interface Recorded {
  name: string;
  kind: number | undefined;
  attributes: Record<string, unknown>;
  links: api.Link[];
  parent: api.SpanContext | undefined;
  context: api.SpanContext;
  status: api.SpanStatus;
  exceptions: unknown[];
  ended: boolean;
}

const spans: Recorded[] = [];

class MemorySpan implements api.Span {
  constructor(readonly rec: Recorded) {}
  spanContext() {
    return this.rec.context;
  }
  setAttribute(k: string, v: api.SpanAttributeValue) {
    this.rec.attributes[k] = v;
    return this;
  }
  setAttributes(a: api.SpanAttributes) {
    Object.assign(this.rec.attributes, a);
    return this;
  }
  addEvent() {
    return this;
  }
  addLink(l: api.Link) {
    this.rec.links.push(l);
    return this;
  }
  addLinks(ls: api.Link[]) {
    this.rec.links.push(...ls);
    return this;
  }
  setStatus(s: api.SpanStatus) {
    this.rec.status = s;
    return this;
  }
  updateName(n: string) {
    this.rec.name = n;
    return this;
  }
  end() {
    this.rec.ended = true;
  }
  isRecording() {
    return !this.rec.ended;
  }
  recordException(e: api.Exception) {
    this.rec.exceptions.push(e);
  }
}

const memoryTracer = {
  startSpan(name: string, options: api.SpanOptions = {}, ctx: api.Context = api.context.active()): api.Span {
    const parent = api.trace.getSpanContext(ctx);
    const context: api.SpanContext = {
      traceId: parent?.traceId ?? randomBytes(16).toString("hex"),
      spanId: randomBytes(8).toString("hex"),
      traceFlags: api.TraceFlags.SAMPLED,
    };
    const rec: Recorded = {
      name,
      kind: options.kind,
      attributes: { ...(options.attributes ?? {}) },
      links: [...(options.links ?? [])],
      parent,
      context,
      status: { code: api.SpanStatusCode.UNSET },
      exceptions: [],
      ended: false,
    };
    spans.push(rec);
    return new MemorySpan(rec);
  },
  startActiveSpan<F extends (span: api.Span) => unknown>(name: string, fn: F): ReturnType<F> {
    const span = this.startSpan(name);
    return api.context.with(api.trace.setSpan(api.context.active(), span), () => fn(span)) as ReturnType<F>;
  },
} as api.Tracer;

class AlsContextManager implements api.ContextManager {
  private readonly als = new AsyncLocalStorage<api.Context>();
  active(): api.Context {
    return this.als.getStore() ?? api.ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: api.Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    return this.als.run(ctx, () => fn.call(thisArg, ...args));
  }
  bind<T>(_ctx: api.Context, target: T): T {
    return target;
  }
  enable() {
    return this;
  }
  disable() {
    this.als.disable();
    return this;
  }
}

// ---- a recording meter ----

const measurements: { instrument: string; value: number; attributes: Record<string, unknown> }[] = [];
const meter: OtelMeter = {
  createHistogram: (name) => ({ record: (value, attributes = {}) => void measurements.push({ instrument: name, value, attributes }) }),
  createCounter: (name) => ({ add: (value, attributes = {}) => void measurements.push({ instrument: name, value, attributes }) }),
};

let broker: TestBroker;

before(async () => {
  api.context.setGlobalContextManager(new AlsContextManager());
  api.trace.setGlobalTracerProvider({ getTracer: () => memoryTracer });
  broker = await startBroker();
});

after(async () => {
  await broker?.stop();
  api.trace.disable();
  api.context.disable();
});

const byName = (name: string) => spans.filter((s) => s.name === name);

describe("otelHandler", () => {
  it("wraps the handler in a process span that continues the producer's trace; the handler's calls are its children", async () => {
    const tracing = await otelTracing();
    const client = new Client({ endpoints: [broker.url], onEvent: tracing });
    const topic = topicName("otel");
    await client.createTopic({ name: topic, partitions: 1 });

    // The producer: a root span, its context carried in the envelope.
    const env = await memoryTracer.startActiveSpan("checkout", async (root) => {
      const e = Envelope.wrap({ order: 1 }, await traceContext());
      await client.produce(topic, e);
      root.end();
      return e;
    });
    const root = byName("checkout")[0] as Recorded;
    assert.equal(env.traceparent, `00-${root.context.traceId}-${root.context.spanId}-01`);
    await client.produce(topic, "plain"); // no envelope: a trace of its own

    const inHandler: (api.SpanContext | undefined)[] = [];
    const handler = await otelHandler(async (m) => {
      inHandler.push(api.trace.getSpanContext(api.context.active()));
      await m.ack(); // a client call made inside the handler
    });
    const consumer = client.consume(topic, handler, { waitMs: 200 });
    await waitFor(() => byName(`process ${topic}`).filter((s) => s.ended).length === 2, "two process spans");
    await consumer.stop();
    await client.close();

    const [first, second] = byName(`process ${topic}`) as [Recorded, Recorded];
    assert.equal(first.kind, api.SpanKind.CONSUMER);
    assert.equal(first.context.traceId, root.context.traceId, "the process span continues the producer's trace");
    assert.equal(first.parent?.spanId, root.context.spanId);
    assert.equal(first.parent?.isRemote, true);
    assert.equal(first.attributes["messaging.system"], "narad");
    assert.equal(first.attributes["messaging.operation.type"], "process");
    assert.equal(first.attributes["messaging.destination.name"], topic);
    assert.equal(first.attributes["messaging.destination.partition.id"], "0");
    assert.equal(first.attributes["messaging.narad.message.offset"], 0);
    assert.equal(first.attributes["messaging.narad.message.delivery_attempt"], 1);
    assert.equal(first.attributes["messaging.message.id"], env.id);
    assert.equal(first.status.code, api.SpanStatusCode.UNSET);
    assert.equal(inHandler[0]?.spanId, first.context.spanId, "the process span is active in the handler");

    // The handler's ack is a client span under the process span.
    const acks = byName("narad ack");
    assert.ok(acks.some((a) => a.parent?.spanId === first.context.spanId), "the ack is a child of the first process span");
    assert.ok(acks.some((a) => a.parent?.spanId === second.context.spanId), "the ack is a child of the second process span");

    // The plain message: a new trace, no message id.
    assert.notEqual(second.context.traceId, root.context.traceId);
    assert.equal(second.parent, undefined);
    assert.equal(second.attributes["messaging.message.id"], undefined);
  });

  it("marks the span failed and hands the error on to the consumer", async () => {
    const client = new Client({ endpoints: [broker.url] });
    const topic = topicName("otelfail");
    await client.createTopic({ name: topic, partitions: 1 });
    await client.produce(topic, Envelope.wrap("x", { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tracestate: "k=v" }));
    const events: NaradEvent[] = [];
    const failing = new Client({ endpoints: [broker.url], onEvent: (e) => void events.push(e) });
    const handler = await otelHandler(() => {
      throw new TypeError("bad order");
    });
    const consumer = failing.consume(topic, handler, { waitMs: 200, nackDelayMs: 60_000 });
    await waitFor(() => events.some((e) => e.type === "consumer" && e.event === "nacked"), "the failed message nacked");
    await consumer.stop();
    await failing.close();
    await client.close();
    const [span] = byName(`process ${topic}`) as [Recorded];
    assert.ok(span.ended);
    assert.equal(span.context.traceId, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert.equal(span.parent?.traceState?.get("k"), "v", "the envelope's tracestate is carried");
    assert.equal(span.status.code, api.SpanStatusCode.ERROR);
    assert.equal(span.status.message, "bad order");
    assert.equal(span.attributes["error.type"], "TypeError");
    assert.equal((span.exceptions[0] as Error).message, "bad order");
    assert.ok(events.some((e) => e.type === "consumer" && e.event === "handler_error"), "the consumer saw the handler's error");
  });
});

describe("otelMetrics", () => {
  it("records call durations, attempts and consumer outcomes", async () => {
    const metrics = await otelMetrics({ meter });
    const client = new Client({ endpoints: [broker.url], onEvent: metrics });
    const topic = topicName("otelm");
    await client.createTopic({ name: topic, partitions: 1 });
    await client.produce(topic, "m");
    await client.getTopic(topicName("missing")).catch(() => undefined);
    const consumer = client.consume(topic, () => undefined, { waitMs: 200 });
    await waitFor(() => measurements.some((m) => m.instrument === "narad.consumer.events" && m.attributes["narad.consumer.event"] === "acked"), "an acked event");
    await consumer.stop();
    await client.close();

    const produce = measurements.find((m) => m.instrument === "narad.client.operation.duration" && m.attributes["messaging.operation.name"] === "produce");
    assert.ok(produce, "a duration for produce");
    assert.equal(produce.attributes["messaging.destination.name"], topic);
    assert.equal(produce.attributes["error.type"], undefined);
    assert.ok(produce.value > 0 && produce.value < 60, "in seconds");
    const failed = measurements.find((m) => m.instrument === "narad.client.operation.duration" && m.attributes["messaging.operation.name"] === "getTopic");
    assert.equal(failed?.attributes["error.type"], "topic_not_found");
    const attempt = measurements.find((m) => m.instrument === "narad.client.attempts" && m.attributes["messaging.operation.name"] === "produce");
    assert.equal(attempt?.value, 1);
    assert.equal(attempt?.attributes["server.address"], broker.url);
    const acked = measurements.find((m) => m.instrument === "narad.consumer.events" && m.attributes["narad.consumer.event"] === "acked");
    assert.equal(acked?.attributes["messaging.destination.name"], topic);
  });

  it("uses the global meter of @opentelemetry/api when none is given", async () => {
    const recorded: string[] = [];
    api.metrics.setGlobalMeterProvider({
      getMeter: () =>
        ({
          createHistogram: (name: string) => ({ record: () => void recorded.push(name) }),
          createCounter: (name: string) => ({ add: () => void recorded.push(name) }),
        }) as unknown as api.Meter,
    });
    try {
      const client = new Client({ endpoints: [broker.url], onEvent: await otelMetrics() });
      await client.ready();
      await client.listTopics();
      await client.close();
      assert.ok(recorded.includes("narad.client.operation.duration"));
    } finally {
      api.metrics.disable();
    }
  });
});
