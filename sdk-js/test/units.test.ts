// Pure pieces without a broker: body encoding, positions, envelopes, error helpers and
// the trace context of the OpenTelemetry module.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { encodeBody, Envelope, isNaradError, isRetryable, isUncertain, Message, NaradError, Position, TimeoutError, UnavailableError } from "@narad/client";
import { traceContext, type OtelApi } from "@narad/client/otel";

describe("units", () => {
  it("encodes bodies by their JavaScript type, never by guessing", () => {
    assert.deepEqual(encodeBody(new Uint8Array([1, 2])).contentType, "application/octet-stream");
    assert.deepEqual([...encodeBody(new Uint16Array([258]).buffer).bytes], [2, 1]);
    assert.equal(encodeBody(new DataView(new ArrayBuffer(3))).kind, "bytes");
    assert.equal(encodeBody('{"looks":"like json"}').kind, "text", "a string is text even when it parses as JSON");
    assert.equal(encodeBody({ a: 1 }).contentType, "application/json");
    assert.equal(new TextDecoder().decode(encodeBody(null).bytes), "null");
    assert.equal(encodeBody('"quoted"', "application/json").contentType, "application/json");
    assert.equal(encodeBody(Envelope.wrap("x")).kind, "json");
    assert.throws(() => encodeBody(undefined as unknown as null), TypeError);
  });

  it("positions serialise, and say where each partition starts", () => {
    const p = Position.offsets({ 0: 5, 2: 9 }, Position.at(1000).otherwise);
    assert.equal(p.offset(0), 5);
    assert.equal(p.offset(1), undefined);
    assert.deepEqual(p.toJSON(), { offsets: { "0": 5, "2": 9 }, otherwise: { time: 1000 } });
    assert.deepEqual(Position.fromJSON(p.toJSON()).toJSON(), p.toJSON());
    assert.equal(Position.earliest().otherwise, "earliest");
    assert.equal(Position.latest().otherwise, "latest");
  });

  it("builds messages from every payload form the broker sends", () => {
    const b64 = new Message({ topic: "t", partition: 0, offset: 1, payload: "AP8=", payload_encoding: "base64", timestamp: 5 }, undefined);
    assert.deepEqual([...b64.bytes()], [0, 255]);
    assert.equal(b64.settled, true, "a replayed message has nothing to settle");
    const text = new Message({ topic: "t", partition: 0, offset: 2, payload: "hi", timestamp: 5 }, undefined);
    assert.equal(text.text(), "hi");
    const json = new Message({ topic: "t", partition: 0, offset: 3, payload: { a: 1 }, timestamp: 5, receipt_handle: "h", delivery_attempt: 1 }, undefined);
    assert.deepEqual(json.json(), { a: 1 });
    assert.equal(json.settled, false);
    assert.equal(json.envelope(), undefined);
  });

  it("error helpers answer for anything", () => {
    const e = new UnavailableError("x", { code: "unavailable", status: 503 });
    assert.ok(isNaradError(e) && isNaradError(e, "Unavailable") && !isNaradError(e, "Timeout"));
    assert.ok(isRetryable(e) && !isUncertain(e));
    const u = e.withUncertain(true);
    assert.ok(u instanceof UnavailableError && u.uncertain && u.status === 503 && u.message === "x");
    assert.equal(e.uncertain, false, "the original is unchanged");
    assert.equal(e.withUncertain(false), e);
    assert.ok(!isNaradError(new Error("x")) && !isRetryable("x") && !isUncertain(undefined));
    const t = new TimeoutError("slow", { code: "timeout" });
    assert.ok(t instanceof NaradError && t.retryable && t.name === "TimeoutError");
  });

  it("traceContext renders the active span as a W3C traceparent", async () => {
    const api = {
      context: { active: () => undefined },
      trace: {
        getTracer: () => ({ startSpan: () => assert.fail() }),
        getActiveSpan: () => ({ spanContext: () => ({ traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1 }) }),
        setSpanContext: () => undefined,
      },
    } as unknown as OtelApi;
    assert.deepEqual(await traceContext(api), { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" });
  });
});
