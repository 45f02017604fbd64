// Conformance driver of the TypeScript SDK (@narad/client, its built dist/).
//
// Reads DRIVER.md commands as JSON Lines on stdin, runs them concurrently through the
// SDK's public exports, and writes responses and events as JSON Lines on stdout. The
// SDK is loaded from $NARAD_SDK_JS (a package directory with dist/ built) or from
// ../../../sdk-js relative to this file.

import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkgDir = resolve(process.env.NARAD_SDK_JS ?? join(here, "..", "..", "..", "sdk-js"));
const sdk = await import(pathToFileURL(join(pkgDir, "dist", "index.js")).href);
const { Client, Position, NaradError } = sdk;
const version = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8")).version;

const CAPABILITIES = [
  "produce", "produce_batch", "publisher", "publisher.nonblocking", "receive", "ack", "nack", "extend",
  "consume", "consume.panic", "consume.dead_letter", "replay", "replay.time", "replay.saved", "topics", "children", "close",
];

const clients = new Map();
const messages = new Map();
const consumers = new Map();
const byTopic = new Map();
const publishers = new Map();
let nextMsg = 0;

function write(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}
function event(name, data) {
  write({ event: name, data });
}

function normErr(e) {
  if (e instanceof NaradError) {
    let kind = e.kind;
    if (e.code === "buffer_full") kind = "BufferFull";
    const out = { kind, code: e.code ?? null, status: e.status ?? null, retryable: e.retryable, uncertain: e.uncertain, message: e.message };
    if (e.retryAfterMs !== undefined) out.retry_after_ms = Math.round(e.retryAfterMs);
    return out;
  }
  if (e && e.unsupported) return { kind: "Unsupported", code: null, status: null, retryable: false, uncertain: false, message: e.message };
  return { kind: "Other", code: null, status: null, retryable: false, uncertain: false, message: String(e && e.message ? e.message : e) };
}

const b64 = (u8) => Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength).toString("base64");

function bodyOf(b) {
  if (b.b64 !== undefined) return { body: new Uint8Array(Buffer.from(b.b64, "base64")) };
  if (b.text !== undefined) return { body: String(b.text) };
  if ("json" in b) {
    // A JSON document that is one string: a string would be sent as text.
    if (typeof b.json === "string") return { body: new TextEncoder().encode(JSON.stringify(b.json)), contentType: "application/json" };
    return { body: b.json };
  }
  throw new Error("a body is {b64}, {text} or {json}");
}

function msgView(m, keep) {
  const v = {
    topic: m.topic, partition: m.partition, offset: m.offset, key: m.key ?? null, body_b64: b64(m.body),
    delivery_attempt: m.deliveryAttempt ?? null, has_lease: m.receiptHandle !== undefined,
    receipt_handle: m.receiptHandle ?? null,
  };
  if (keep) {
    const id = `m${++nextMsg}`;
    messages.set(id, m);
    v.id = id;
  }
  return v;
}

function client(a) {
  const c = clients.get(a.client || "default");
  if (!c) throw new Error(`no client ${a.client}`);
  return c;
}

function onEvent(clientName, e) {
  if (e.type !== "consumer") return;
  const cname = byTopic.get(`${clientName}\u0000${e.topic}`);
  if (cname === undefined) return;
  const where = e.partition === undefined ? {} : { partition: e.partition, offset: e.offset, message: { topic: e.topic, partition: e.partition, offset: e.offset } };
  const settled = { acked: "acked", nacked: "nacked", ack_failed: "failed" }[e.event];
  if (settled) {
    const data = { consumer: cname, outcome: settled, ...where };
    if (e.error !== undefined) data.error = normErr(e.error);
    event("settled", data);
  } else if (e.event === "lease_lost") {
    event("lease_lost", { consumer: cname, ...where });
    event("settled", { consumer: cname, outcome: "lost", ...where });
  } else if (e.event === "poll_error") {
    event("error", { consumer: cname, error: normErr(e.error), terminal: false });
  }
}

function newClient(a) {
  const name = a.client || "default";
  const opts = { endpoints: a.endpoints, onEvent: (e) => onEvent(name, e) };
  if (a.auth) opts.auth = { username: a.auth.username, password: a.auth.password };
  const retry = {};
  if (a.attempts) retry.attempts = a.attempts;
  if (a.min_backoff_ms != null) retry.minBackoffMs = a.min_backoff_ms;
  if (a.max_backoff_ms != null) retry.maxBackoffMs = a.max_backoff_ms;
  if (Object.keys(retry).length) opts.retry = retry;
  if (a.timeout_ms != null) opts.timeoutMs = a.timeout_ms;
  if (a.allow_duplicates === false) opts.allowDuplicates = false;
  clients.set(name, new Client(opts));
  return {};
}

function pick(script, m) {
  for (const r of script.rules ?? []) {
    if (r.body_text != null && Buffer.compare(Buffer.from(r.body_text, "utf8"), Buffer.from(m.body)) !== 0) continue;
    if (r.attempt != null && r.attempt !== m.deliveryAttempt) continue;
    return r;
  }
  return script.default ?? { do: "ok" };
}

function sleepSignal(ms, signal, ignore) {
  return new Promise((res) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      res();
    }
    if (!ignore) {
      if (signal.aborted) return done();
      signal.addEventListener("abort", done, { once: true });
    }
  });
}

function startConsumer(a) {
  const c = client(a);
  const cname = a.consumer || "c";
  const script = a.script ?? {};
  const handler = (m, { signal }) => {
    const view = msgView(m, false);
    event("started", { consumer: cname, message: view });
    const act = pick(script, m);
    const t0 = Date.now();
    const report = (outcome, cancelled) => {
      let reason = null;
      if (cancelled) reason = signal.reason?.kind === "LeaseLost" ? "lease_lost" : signal.reason?.kind === "Closed" ? "shutdown" : "other";
      event("handled", { consumer: cname, message: view, outcome, cancelled, cancel_reason: reason, elapsed_ms: Date.now() - t0 });
    };
    switch (act.do) {
      case "fail":
        report("fail", false);
        return Promise.reject(new Error("scripted failure"));
      case "panic":
        report("panic", false);
        // The nearest thing to a panic: a synchronous throw of something that is not an Error.
        throw "scripted panic";
      case "sleep":
        return sleepSignal(act.ms ?? 0, signal, act.ignore_cancel).then(() => {
          const outcome = act.then || "ok";
          report(outcome, signal.aborted);
          if (outcome === "fail") throw new Error("scripted failure");
        });
      default:
        report("ok", false);
        return Promise.resolve();
    }
  };
  const opts = {};
  if (a.concurrency) opts.concurrency = a.concurrency;
  if (a.wait_ms != null) opts.waitMs = a.wait_ms;
  if (a.nack_delay_ms != null) opts.nackDelayMs = a.nack_delay_ms;
  if (a.max_lease_ms != null) opts.maxLeaseMs = a.max_lease_ms;
  if (a.grace_ms != null) opts.shutdownGraceMs = a.grace_ms;
  if (a.renew === false) opts.leaseRenewal = false;
  if (a.max_deliveries) opts.maxDeliveries = a.max_deliveries;
  if (a.dead_letter_topic != null) opts.deadLetterTopic = a.dead_letter_topic;
  const st = { stopping: false, consumer: undefined, error: null };
  consumers.set(cname, st);
  byTopic.set(`${a.client || "default"}\u0000${a.topic}`, cname);
  const cons = c.consume(a.topic, handler, opts);
  st.consumer = cons;
  cons.done.then(
    () => {
      if (!st.stopping) event("stopped", { consumer: cname, error: null });
    },
    (e) => {
      st.error = e;
      event("error", { consumer: cname, error: normErr(e), terminal: true });
      if (!st.stopping) event("stopped", { consumer: cname, error: normErr(e) });
    },
  );
  return { started: true };
}

async function stopConsumer(a) {
  const st = consumers.get(a.consumer || "c");
  if (!st) throw new Error(`no consumer ${a.consumer}`);
  st.stopping = true;
  await st.consumer.stop();
  return { error: st.error ? normErr(st.error) : null };
}

async function publisherCmd(cmd, a) {
  const pname = a.publisher || "p";
  if (cmd === "publisher.new") {
    const opts = {};
    if (a.linger_ms != null) opts.lingerMs = a.linger_ms;
    if (a.max_batch) opts.maxBatchMessages = a.max_batch;
    if (a.max_buffered) opts.maxBufferedMessages = a.max_buffered;
    if (a.block === false) opts.whenFull = "error";
    publishers.set(pname, { p: client(a).publisher(a.topic, opts), n: 0 });
    return {};
  }
  const ps = publishers.get(pname);
  if (!ps) throw new Error(`no publisher ${pname}`);
  if (cmd === "publisher.publish") {
    const { body } = bodyOf(a.body);
    const popts = a.key != null ? { key: a.key } : {};
    const result = ps.p.publish(body, popts);
    // publish resolves when the message is durable; a refusal (buffer full, closed)
    // rejects before the message is buffered, so look once the event loop turns.
    const early = await Promise.race([
      result.then(() => undefined, (e) => e),
      new Promise((r) => setImmediate(() => r(undefined))),
    ]);
    if (early !== undefined && early instanceof NaradError && (early.code === "buffer_full" || early.kind === "Closed")) throw early;
    const ticket = `${pname}-${++ps.n}`;
    result.then(
      (r) => event("published", { publisher: pname, ticket, ok: true, partition: r.partition, offset: r.offset }),
      (e) => event("published", { publisher: pname, ticket, ok: false, error: normErr(e) }),
    );
    return { ticket };
  }
  if (cmd === "publisher.flush") await ps.p.flush();
  else await ps.p.close();
  return {};
}

async function replay(a) {
  const c = client(a);
  const frm = a.from ?? {};
  let from = Position.earliest();
  if (frm.time_ms != null) from = Position.at(frm.time_ms);
  if ((frm.offsets && Object.keys(frm.offsets).length) || frm.incarnation != null) {
    from = Position.offsets(Object.fromEntries(Object.entries(frm.offsets ?? {}).map(([k, v]) => [Number(k), v])), from.otherwise, frm.incarnation ?? undefined);
  }
  // A position some SDK saved: the library reads it, as a service resuming would.
  if (a.saved != null) from = Position.fromJSON(JSON.parse(a.saved));
  const opts = { from };
  if (a.partition != null) opts.partition = a.partition;
  const r = c.replay(a.topic, opts);
  const out = [];
  for await (const m of r) {
    out.push(msgView(m, false));
    if (a.limit && out.length >= a.limit) break;
  }
  const pos = r.position.toJSON();
  const position = { offsets: pos.offsets };
  if (pos.incarnation != null) position.incarnation = pos.incarnation;
  return { messages: out, position, saved: JSON.stringify(r.position) };
}

function topicView(t) {
  const v = { name: t.name, partitions: t.partitions, visibility_timeout_ms: t.visibilityTimeoutMs, parent: t.parent ?? null, fanout_delay_ms: t.fanoutDelayMs ?? 0 };
  if (t.partitionStats) v.partition_stats = t.partitionStats.map((s) => ({ partition: s.partition, next_offset: s.nextOffset, backlog: s.backlog, in_flight: s.inFlight }));
  return v;
}

async function handle(cmd, a) {
  switch (cmd) {
    case "hello":
      return { name: "narad-js", version, language: "typescript", capabilities: CAPABILITIES };
    case "client.new":
      return newClient(a);
    case "close":
      await client(a).close();
      return {};
    case "produce": {
      const { body, contentType } = bodyOf(a.body);
      const opts = {};
      if (a.key != null) opts.key = a.key;
      if (a.partition != null) opts.partition = a.partition;
      if (contentType) opts.contentType = contentType;
      if (a.allow_duplicates != null) opts.allowDuplicates = a.allow_duplicates;
      const p = await client(a).produce(a.topic, body, opts);
      return { topic: p.topic, partition: p.partition, offset: p.offset };
    }
    case "produce_batch": {
      const msgs = a.messages.map((m) => {
        const o = { body: bodyOf(m.body).body };
        if (m.key != null) o.key = m.key;
        if (m.partition != null) o.partition = m.partition;
        return o;
      });
      const opts = a.allow_duplicates != null ? { allowDuplicates: a.allow_duplicates } : {};
      const res = await client(a).produceBatchResults(a.topic, msgs, opts);
      return { results: res.map((r) => (r.ok ? { ok: true, partition: r.produced.partition, offset: r.produced.offset } : { ok: false, error: normErr(r.error) })) };
    }
    case "receive": {
      const opts = { max: a.max || 1 };
      if (a.wait_ms != null) opts.waitMs = a.wait_ms;
      const got = await client(a).receive(a.topic, opts);
      return { messages: got.map((m) => msgView(m, true)) };
    }
    case "ack":
    case "nack":
    case "extend": {
      const m = messages.get(a.msg);
      if (!m) throw new Error(`no message ${a.msg}`);
      if (cmd === "ack") await m.ack();
      else if (cmd === "nack") await m.nack({ delayMs: a.delay_ms ?? 0 });
      else await m.extend(a.lease_ms != null ? { leaseMs: a.lease_ms } : {});
      return {};
    }
    case "consume.start":
      return startConsumer(a);
    case "consume.stop":
      return stopConsumer(a);
    case "replay":
      return replay(a);
    case "topic.create": {
      const spec = { name: a.name };
      if (a.partitions != null) spec.partitions = a.partitions;
      if (a.visibility_timeout_ms != null) spec.visibilityTimeoutMs = a.visibility_timeout_ms;
      if (a.retention_ms != null) spec.retentionMs = a.retention_ms;
      if (a.parent != null) spec.parent = a.parent;
      if (a.fanout_delay_ms != null) spec.fanoutDelayMs = a.fanout_delay_ms;
      return topicView(await client(a).createTopic(spec));
    }
    case "topic.get":
      return topicView(await client(a).getTopic(a.name));
    case "topic.delete":
      await client(a).deleteTopic(a.name);
      return {};
    case "topic.attach_child": {
      const ch = await client(a).attachChild(a.parent, a.child, a.delay_ms != null ? { fanoutDelayMs: a.delay_ms } : {});
      return { child: ch.child ?? ch.name, fanout_delay_ms: ch.fanoutDelayMs ?? 0 };
    }
    case "topic.children":
      return { children: (await client(a).listChildren(a.parent)).map((ch) => ({ child: ch.child ?? ch.name, fanout_delay_ms: ch.fanoutDelayMs ?? 0 })) };
    case "publisher.new":
    case "publisher.publish":
    case "publisher.flush":
    case "publisher.close":
      return publisherCmd(cmd, a);
  }
  const e = new Error(`unsupported command ${cmd}`);
  e.unsupported = true;
  throw e;
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  if (!line.trim()) return;
  const req = JSON.parse(line);
  if (req.cmd === "exit") {
    write({ id: req.id, ok: true, result: {} });
    process.exit(0);
  }
  Promise.resolve()
    .then(() => handle(req.cmd, req.args ?? {}))
    .then(
      (res) => write({ id: req.id, ok: true, result: res ?? {} }),
      (e) => write({ id: req.id, ok: false, error: normErr(e) }),
    );
});
rl.on("close", () => process.exit(0));
// A stray rejection in the SDK must show, not kill the driver silently.
process.on("unhandledRejection", (e) => process.stderr.write(`driver-js: unhandled rejection: ${e && e.stack ? e.stack : e}\n`));
