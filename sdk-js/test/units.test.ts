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
    assert.deepEqual(p.toJSON(), { offsets: { "0": 5, "2": 9 }, time_ms: 1000 });
    assert.deepEqual(Position.fromJSON(p.toJSON()).toJSON(), p.toJSON());
    assert.equal(Position.earliest().otherwise, "earliest");
    assert.equal(Position.latest().otherwise, "latest");
  });

  // The one JSON form every Narad SDK writes and reads (docs/sdk/contract.md, Replay).
  it("positions write the one form, byte for byte", () => {
    const cases: [Position, string][] = [
      [Position.earliest(), '{"offsets":{}}'],
      [Position.at(1733500000000), '{"offsets":{},"time_ms":1733500000000}'],
      [Position.latest(), '{"offsets":{},"start":"latest"}'],
      [Position.offsets({ 10: 1, 3: 7, 0: 12 }), '{"offsets":{"0":12,"3":7,"10":1}}'],
      [Position.offsets({ 0: 12 }, { time: 1733500000000 }, "42"), '{"offsets":{"0":12},"time_ms":1733500000000,"incarnation":"42"}'],
      [Position.offsets({ 1: 2 }, "latest", "7"), '{"offsets":{"1":2},"start":"latest","incarnation":"7"}'],
    ];
    for (const [p, want] of cases) {
      assert.equal(JSON.stringify(p), want);
      assert.equal(JSON.stringify(Position.fromJSON(JSON.parse(want))), want);
    }
  });

  it("positions read the one form and the forms Go, Python and TypeScript wrote before it", () => {
    const at = 1733500000000;
    const cases: [string, Position][] = [
      ['{"offsets":{"0":12,"3":7},"time_ms":1733500000000,"incarnation":"42"}', Position.offsets({ 0: 12, 3: 7 }, { time: at }, "42")],
      ['{"offsets":{"0":12},"start":"latest"}', Position.offsets({ 0: 12 }, "latest")],
      ['{"incarnation":"42"}', Position.offsets({}, "earliest", "42")],
      ['{"offsets":null,"time_ms":null,"start":null,"incarnation":null}', Position.earliest()],
      // Go: "time" in RFC 3339 (nanoseconds, any offset).
      ['{"offsets":{"0":12},"time":"2024-12-06T15:46:40.000123456Z","incarnation":"42"}', Position.offsets({ 0: 12 }, { time: at }, "42")],
      ['{"time":"2024-12-06T16:46:40+01:00"}', Position.at(at)],
      ['{"time":"2024-12-06T15:46:40.5-00:30"}', Position.at(at + 1_800_500)],
      // Python: sorted keys.
      ['{"incarnation":"42","offsets":{"0":12},"time_ms":1733500000000}', Position.offsets({ 0: 12 }, { time: at }, "42")],
      // TypeScript: "otherwise".
      ['{"offsets":{"0":12},"otherwise":"earliest","incarnation":"42"}', Position.offsets({ 0: 12 }, "earliest", "42")],
      ['{"offsets":{},"otherwise":"latest"}', Position.latest()],
      ['{"offsets":{"1":3},"otherwise":{"time":1733500000000}}', Position.offsets({ 1: 3 }, { time: at })],
    ];
    for (const [text, want] of cases) assert.deepEqual(Position.fromJSON(JSON.parse(text)).toJSON(), want.toJSON(), text);
  });

  it("positions refuse malformed JSON, saying what is wrong", () => {
    const cases: [string, RegExp][] = [
      ["[]", /JSON object/],
      ['"x"', /JSON object/],
      ['{"offsets":[1]}', /offsets must be an object/],
      ['{"offsets":{"0":1.5}}', /integer from 0/],
      ['{"offsets":{"0":"12"}}', /integer from 0/],
      ['{"offsets":{"0":-1}}', /integer from 0/],
      ['{"offsets":{"0":true}}', /integer from 0/],
      ['{"offsets":{"x":1}}', /partition/],
      ['{"offsets":{"-1":1}}', /partition/],
      ['{"offsets":{"01":1}}', /partition/],
      ['{"offsets":{"4294967296":1}}', /partition/],
      ['{"time_ms":1.5}', /time_ms/],
      ['{"time_ms":"1733500000000"}', /time_ms/],
      ['{"start":"earliest"}', /start/],
      ['{"start":"newest"}', /start/],
      ['{"start":1}', /start/],
      ['{"time_ms":1,"start":"latest"}', /both/],
      ['{"time_ms":1,"otherwise":"latest"}', /both/],
      ['{"time":"yesterday"}', /RFC 3339/],
      ['{"time":"2024-13-06T15:46:40Z"}', /RFC 3339/],
      ['{"time":"2024-02-30T15:46:40Z"}', /RFC 3339/],
      ['{"otherwise":"soon"}', /otherwise/],
      ['{"otherwise":{"time":"x"}}', /otherwise\.time/],
      ['{"incarnation":42}', /incarnation/],
    ];
    for (const [text, why] of cases) assert.throws(() => Position.fromJSON(JSON.parse(text)), (e: unknown) => e instanceof TypeError && why.test(e.message), text);
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
