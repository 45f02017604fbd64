// Drives the console in Debian's headless Chromium (playwright-core pointed at
// /usr/bin/chromium) against a real narad: security on, 127.0.0.1, a free port, a temp
// data directory, stopped by its PID at the end. Each step takes a screenshot into
// $CONSOLE_SCREENSHOTS (make console-screenshots: docs/assets/console; otherwise a temp
// directory). Waits are for conditions, never for time.
//
//   NARAD_BIN=/abs/bin/narad node --test test/browser.test.mjs
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { chromium } from "playwright-core";
import { narad, startNarad, stopNarad, until } from "./narad.mjs";

const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const adminPassword = "console-admin-1";

const browserArgs = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"];

// openNarad starts a narad with security off (on with admin: the admin's password) in a
// temp dir and a Chromium page, and gives call(method, path, body): a request to its API
// (as the admin with security on) that fails the test on an error answer and returns
// the answer's JSON (null for a 204). The after hooks run in the order they are added:
// the browser, then narad, then the files.
async function openNarad(t, name, { admin } = {}) {
  const work = mkdtempSync(join(tmpdir(), `narad-console-${name}-`));
  let browser;
  t.after(async () => {
    await browser?.close();
  });
  const env = { PATH: process.env.PATH, HOME: work };
  if (admin) env.NARAD_ADMIN_PASSWORD = admin;
  const base = await startNarad(t, work, env);
  t.after(() => rmSync(work, { recursive: true, force: true }));
  const headers = { "Content-Type": "application/json" };
  if (admin) headers.Authorization = `Basic ${btoa(`admin:${admin}`)}`;
  const call = async (method, path, body) => {
    const r = await fetch(`${base}${path}`, { method, headers, body: body && JSON.stringify(body) });
    const text = await r.text();
    assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
    return r.status === 204 ? null : JSON.parse(text);
  };
  browser = await chromium.launch({ executablePath: chromiumPath, args: browserArgs });
  const page = await browser.newPage();
  // Marks when the page has read an answer holdAnswer gave it late (see there).
  await page.addInitScript(() => {
    const text = Response.prototype.text;
    Response.prototype.text = async function () {
      const t = await text.call(this);
      if (this.headers.get("x-console-test") === "late") window.lateAnswerRead = true;
      return t;
    };
  });
  return { base, call, page };
}

// holdAnswer holds the answer to the first GET the page sends to a URL that match
// takes: the broker's answer is fetched at once (edit may change its JSON), and given to
// the page only when release() is called, which returns once the page has read it. So
// the answer comes after those of requests the page sent later, as a slow node's would.
// The page runs what it does with an answer (the rest of api(), the state it sets and
// Preact's render, queued as microtasks) before the next task: when a page.evaluate
// sees the mark, all of it has run.
async function holdAnswer(page, match, edit = (json) => json) {
  let taken;
  const held = new Promise((r) => {
    taken = r;
  });
  let release;
  const released = new Promise((r) => {
    release = r;
  });
  let once = false;
  await page.route(match, async (route) => {
    if (once || route.request().method() !== "GET") return route.fallback();
    once = true;
    const answer = await route.fetch();
    const json = edit(await answer.json());
    taken();
    await released;
    const headers = { ...answer.headers(), "x-console-test": "late" };
    delete headers["content-length"];
    await route.fulfill({ status: answer.status(), headers, json });
  });
  return {
    held,
    release: async () => {
      release();
      await until("the page to read the late answer", () => page.evaluate(() => window.lateAnswerRead === true));
    },
  };
}

// An error answer of the API, as the broker writes them.
const failure = (status, code, message) => ({ status, json: { error: { code, message } } });

test("with security off the console needs no login, and its writes pass the cross-site checks", { timeout: 120_000 }, async (t) => {
  const { base, page } = await openNarad(t, "open");
  await page.goto(`${base}/console`);
  await page.getByText("security off").waitFor();
  await page.getByLabel("Name").fill("open.topic");
  await page.getByRole("button", { name: "Create topic" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Create" }).click();
  await page.getByRole("status").filter({ hasText: "Created topic open.topic." }).waitFor();
  await page.getByRole("link", { name: "open.topic" }).click();
  await page.getByRole("button", { name: "Delete topic open.topic" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Delete" }).click();
  await page.getByText("No topics you may see.").waitFor();
  assert.equal((await fetch(`${base}/v1/topics/open.topic`)).status, 404);
  // A link whose route is not valid percent-encoding (a truncated or hand-edited URL)
  // opens the page it names with the API's answer, not a blank page.
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${base}/console#/topics/orders%E0`);
  await page.getByRole("heading", { name: "Topic orders%E0" }).waitFor();
  await page.getByRole("alert").filter({ hasText: /^4\d\d / }).waitFor();
  await page.reload();
  await page.getByRole("heading", { name: "Topic orders%E0" }).waitFor();
  assert.deepEqual(errors, []);
});

test("what a producer writes is shown as text, and a deeply nested payload does not swamp the page", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "hostile");
  const post = (path, body) => call("POST", path, body);
  await post("/v1/topics", { name: "hostile", partitions: 1 });
  // Arrays nested 128 deep (the broker's limit), side by side: 200 KiB of them indent
  // to about 26 MiB of text, two spaces per level on every line.
  const unit = `${"[".repeat(127)}${"]".repeat(127)}`;
  const nested = `[${Array(800).fill(unit).join(",")}]`;
  const markup = '<img src="x" onerror="window.hostile = 1"><script>window.hostile = 2</script>';
  await post("/v1/topics/hostile/produce-batch", {
    messages: [
      { key: markup, payload: markup, payload_encoding: "text" },
      { key: "nested", payload: JSON.parse(nested) },
    ],
  });
  await page.goto(`${base}/console#/topics/hostile/partitions/0?from=0`);
  const list = page.getByRole("list", { name: "Messages" });
  await until("two messages", async () => (await list.locator("li").count()) === 2);
  // Markup in a key or a payload is text on the page, never elements or script.
  assert.match(await list.locator("li").first().locator(".meta").textContent(), /key <img src="x" onerror=/);
  assert.equal(await list.locator("li").first().locator("pre").textContent(), `(not JSON) ${markup}`);
  assert.equal(await page.locator("ol.messages img, ol.messages script").count(), 0);
  assert.equal(await page.evaluate(() => window.hostile), undefined);
  // The nested payload is shown as sent, not indented into a hundred times its size.
  const shown = await list.locator("li").nth(1).locator("pre").textContent();
  assert.ok(shown.length < 2 * nested.length, `the nested payload of ${nested.length} bytes is shown as ${shown.length} characters`);
  assert.ok(shown.endsWith(nested), "the nested payload is shown as sent");
});

test("a damaged message the broker read past is named on the messages page", { timeout: 120_000 }, async (t) => {
  const work = mkdtempSync(join(tmpdir(), "narad-console-damaged-"));
  let browser;
  t.after(async () => {
    await browser?.close();
  });
  const env = { PATH: process.env.PATH, HOME: work };
  let base = await startNarad(t, work, env);
  t.after(() => rmSync(work, { recursive: true, force: true }));
  const post = async (path, body) => {
    const r = await fetch(`${base}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const text = await r.text();
    assert.ok(r.ok, `POST ${path}: ${r.status} ${text}`);
    return JSON.parse(text);
  };
  const topic = await post("/v1/topics", { name: "worn", partitions: 1 });
  await post("/v1/topics/worn/produce-batch", { messages: [{ payload: { n: 0 } }, { payload: { n: 1 } }, { payload: { n: 2 } }] });
  await stopNarad(base);
  // Flip a bit in the timestamp of record 1 (each record: its length in 4 bytes, then
  // the rest), so that it fails its checksum, as the broker's own damage tests do.
  const seg = join(work, "data", "topics", `${topic.incarnation}-worn`, "0", "log", "00000000000000000000.log");
  const data = readFileSync(seg);
  const pos = data.readUInt32LE(0) + 4;
  data[pos + 20] ^= 0x01;
  writeFileSync(seg, data);
  base = await startNarad(t, work, env);
  const a0 = await (await fetch(`${base}/v1/topics/worn/partitions/0/messages?from=0`)).json();
  const a1 = await (await fetch(`${base}/v1/topics/worn/partitions/0/messages?from=1`)).json();
  assert.deepEqual(a1.damaged, [1], `the broker's answers: ${JSON.stringify(a0)} ${JSON.stringify(a1)}`);
  browser = await chromium.launch({ executablePath: chromiumPath, args: browserArgs });
  const page = await browser.newPage();
  await page.goto(`${base}/console#/topics/worn/partitions/0?from=0`);
  const list = page.getByRole("list", { name: "Messages" });
  // A read stops before the damaged record; the next one goes past it.
  await until("message 0", async () => (await list.locator("li").count()) === 1);
  await page.getByRole("button", { name: "Next page (from 1)" }).click();
  await until("message 2", async () => (await list.locator("li").first().getAttribute("data-offset")) === "2");
  // The gap between offsets 0 and 2 is explained, not left for the reader to notice.
  await page.getByRole("alert").filter({ hasText: "offset 1" }).waitFor();
});

test("paging through a topic deleted and created again under its name stops with a conflict", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "again");
  const make = async (generation) => {
    await call("POST", "/v1/topics", { name: "again", partitions: 1 });
    await call("POST", "/v1/topics/again/produce-batch", { messages: [0, 1, 2].map((n) => ({ payload: { generation, n } })) });
  };
  await make("old");
  await page.goto(`${base}/console#/topics/again/partitions/0?from=0`);
  const list = page.getByRole("list", { name: "Messages" });
  await until("the old topic's messages", async () => (await list.locator("li").count()) === 3);
  await page.getByLabel("At most").fill("1");
  await page.getByRole("button", { name: "Read", exact: true }).click();
  await until("one message", async () => (await list.locator("li").count()) === 1);
  await call("DELETE", "/v1/topics/again");
  await make("new");
  // The next page of the old topic is not the new topic's offset 1.
  await page.getByRole("button", { name: "Next page (from 1)" }).click();
  await page.getByRole("alert").filter({ hasText: "409 incarnation_mismatch" }).waitFor();
  assert.doesNotMatch(await list.textContent(), /"new"/);
});

test("deleting a topic created again since the page read it deletes nothing", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "delete");
  await call("POST", "/v1/topics", { name: "twice", partitions: 1 });
  const old = await call("GET", "/v1/topics/twice");
  await page.goto(`${base}/console#/topics/twice`);
  await page.getByRole("heading", { name: "Topic twice" }).waitFor();
  // The page keeps the topic as it read it: its refresh (every 5 s) is answered with
  // that reading, as if the topic were created again just after the page's last read.
  await page.route(
    (u) => u.pathname === "/v1/topics/twice",
    (route) => (route.request().method() === "GET" ? route.fulfill({ json: old }) : route.continue()),
  );
  await call("DELETE", "/v1/topics/twice");
  const again = await call("POST", "/v1/topics", { name: "twice", partitions: 1 });
  await page.getByRole("button", { name: "Delete topic twice" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Delete" }).click();
  await page.getByRole("alert").filter({ hasText: "409 incarnation_mismatch" }).waitFor();
  const now = await call("GET", "/v1/topics/twice");
  assert.equal(now.incarnation, again.incarnation, "the topic created again was deleted by a page showing the old one");
});

test("a partition's messages read answered late does not replace a newer read's", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "late-read");
  await call("POST", "/v1/topics", { name: "late", partitions: 1 });
  await call("POST", "/v1/topics/late/produce-batch", { messages: [0, 1, 2, 3].map((n) => ({ payload: { n } })) });
  // The page's first read (from offset 0) is answered after the one from offset 2.
  const first = await holdAnswer(page, (u) => u.pathname === "/v1/topics/late/partitions/0/messages" && u.searchParams.get("from") === "0");
  await page.goto(`${base}/console#/topics/late/partitions/0?from=0`);
  await first.held;
  await page.getByLabel("From offset").fill("2");
  await page.getByRole("button", { name: "Read", exact: true }).click();
  const list = page.getByRole("list", { name: "Messages" });
  await until("the messages from offset 2", async () => (await list.locator("li").first().getAttribute("data-offset")) === "2");
  await first.release();
  // The page still shows what its controls say: the read from offset 2.
  assert.equal(await page.getByLabel("From offset").inputValue(), "2");
  assert.deepEqual(await list.locator("li").evaluateAll((ls) => ls.map((l) => l.dataset.offset)), ["2", "3"]);
});

test("a topic whose figures cannot be read says so in the list, and shows no figures", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "detail-error");
  for (const name of ["broken", "fine"]) await call("POST", "/v1/topics", { name, partitions: 1 });
  await call("POST", "/v1/topics/broken/produce-batch", { messages: [{ payload: { n: 1 } }] });
  const why = "partition 0 of broken: its node could not be reached";
  await page.route(
    (u) => u.pathname === "/v1/topics/broken",
    (route) => (route.request().method() === "GET" ? route.fulfill(failure(503, "unavailable", why)) : route.fallback()),
  );
  await page.goto(`${base}/console`);
  const row = (name) => page.locator(`tr[data-topic="${name}"]`);
  await until("the fine topic's backlog", async () => (await row("fine").locator('td[data-col="backlog"]').textContent()) === "0");
  await row("broken").getByRole("alert").filter({ hasText: `503 unavailable: ${why}` }).waitFor();
  for (const col of ["backlog", "in-flight"]) assert.doesNotMatch(await row("broken").locator(`td[data-col="${col}"]`).textContent(), /\d/);
});

test("a partition whose node cannot be reached is not shown with figures of 0", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "unavailable");
  await call("POST", "/v1/topics", { name: "split", partitions: 2 });
  // The broker's answer for a partition it could not reach, as openapi.yaml defines it:
  // available false, its counters unknown and given as 0.
  await page.route(
    (u) => u.pathname === "/v1/topics/split",
    async (route) => {
      if (route.request().method() !== "GET") return route.fallback();
      const answer = await route.fetch();
      const d = await answer.json();
      const p = d.partition_stats[1];
      for (const k of ["oldest_offset", "next_offset", "high_watermark", "ack_frontier", "acked_ahead", "in_flight", "backlog"]) p[k] = 0;
      p.available = false;
      await route.fulfill({ json: d });
    },
  );
  await page.goto(`${base}/console`);
  const row = page.locator('tr[data-topic="split"]');
  await row.getByRole("alert").filter({ hasText: "partition 1" }).waitFor();
  for (const col of ["backlog", "in-flight"]) assert.doesNotMatch(await row.locator(`td[data-col="${col}"]`).textContent(), /\d/);
  await page.getByRole("link", { name: "split" }).click();
  const partition = (n) => page.getByRole("row").filter({ has: page.getByRole("rowheader", { name: String(n), exact: true }) });
  await partition(0).waitFor();
  assert.match(await partition(1).textContent(), /unavailable/);
  assert.doesNotMatch(await partition(1).locator("td").first().textContent(), /\d/);
});

test("a refresh of the topics list answered late does not take back a topic just created", { timeout: 120_000 }, async (t) => {
  const { base, page } = await openNarad(t, "late-list");
  await page.goto(`${base}/console`);
  await page.getByText("No topics you may see.").waitFor();
  // The next refresh (every 5 s) is answered after the one the create starts: its last
  // read, the stats route's, is held, the list read before the create.
  const refresh = await holdAnswer(page, (u) => u.pathname === "/v1/stats");
  await refresh.held;
  await page.getByLabel("Name").fill("fresh");
  await page.getByRole("button", { name: "Create topic" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Create" }).click();
  await page.getByRole("link", { name: "fresh" }).waitFor();
  await refresh.release();
  assert.equal(await page.getByRole("link", { name: "fresh" }).count(), 1, "the list read before the create replaced the one after it");
});

test("a refresh of a topic answered late does not take back an alter", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "late-topic");
  await call("POST", "/v1/topics", { name: "tuned", partitions: 1 });
  await page.goto(`${base}/console#/topics/tuned`);
  const retention = page.locator('dd[data-setting="retention"]');
  await until("the default retention", async () => (await retention.textContent()) === "7 d");
  // The next refresh (every 5 s) is answered after the one the alter starts.
  const refresh = await holdAnswer(page, (u) => u.pathname === "/v1/topics/tuned");
  await refresh.held;
  await page.getByLabel("Retention, ms").fill("3600000");
  await page.getByRole("button", { name: "Alter topic" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Alter" }).click();
  await until("the new retention", async () => (await retention.textContent()) === "60 min");
  await refresh.release();
  assert.equal(await retention.textContent(), "60 min", "the topic read before the alter replaced the one after it");
});

test("a topic's children that cannot be read are not shown as none", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "children-error");
  await call("POST", "/v1/topics", { name: "parent", partitions: 1 });
  await call("POST", "/v1/topics", { name: "kid", partitions: 1, parent: "parent" });
  const why = "the controller could not be reached";
  await page.route(
    (u) => u.pathname === "/v1/topics/parent/children",
    (route) => (route.request().method() === "GET" ? route.fulfill(failure(503, "unavailable", why)) : route.fallback()),
  );
  await page.goto(`${base}/console#/topics/parent`);
  await page.getByRole("heading", { name: "Children" }).waitFor();
  await page.getByRole("alert").filter({ hasText: `503 unavailable: ${why}` }).waitFor();
  assert.equal(await page.getByText("No children.").count(), 0);
});

test("a topic's trends that cannot be read say so, and the last lines drawn are kept, marked stale", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "trends-error");
  await call("POST", "/v1/topics", { name: "busy", partitions: 1 });
  await call("POST", "/v1/topics/busy/produce-batch", { messages: [{ payload: { n: 1 } }, { payload: { n: 2 } }] });
  await page.goto(`${base}/console#/topics/busy`);
  // The lines draw once the stats route (one sample a second here) has two samples.
  const lines = page.locator(".trends svg.spark");
  await until("the topic's trend lines", async () => (await lines.count()) === 3);
  assert.equal(await page.locator(".trends.stale").count(), 0, "fresh lines are not marked stale");
  const why = "the node holding the stats could not be reached";
  await page.route(
    (u) => u.pathname === "/v1/topics/busy/stats",
    (route) => route.fulfill(failure(503, "unavailable", why)),
  );
  // The next refresh (every 5 s) fails.
  await page.getByRole("alert").filter({ hasText: "trends could not be read" }).filter({ hasText: `503 unavailable: ${why}` }).waitFor();
  assert.equal(await page.locator(".trends.stale svg.spark").count(), 3, "the last lines drawn are kept, marked stale");
});

test("a topic whose trends were never read shows the error, and no lines", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "trends-never");
  await call("POST", "/v1/topics", { name: "quiet", partitions: 1 });
  const why = "stats: internal error";
  await page.route(
    (u) => u.pathname === "/v1/topics/quiet/stats",
    (route) => route.fulfill(failure(500, "internal", why)),
  );
  await page.goto(`${base}/console#/topics/quiet`);
  await page.getByRole("heading", { name: "Partitions" }).waitFor();
  await page.getByRole("alert").filter({ hasText: "trends could not be read" }).filter({ hasText: `500 internal: ${why}` }).waitFor();
  assert.equal(await page.locator("svg.spark").count(), 0, "no lines are drawn for a read that failed");
});

test("a topic's trends read answered late does not hide a newer failed read", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "trends-late");
  await call("POST", "/v1/topics", { name: "slow", partitions: 1 });
  const why = "the node holding the stats could not be reached";
  await page.route(
    (u) => u.pathname === "/v1/topics/slow/stats",
    (route) => route.fulfill(failure(503, "unavailable", why)),
  );
  // The first read's answer (a good one, from the broker) comes after the next
  // refresh's failure.
  const first = await holdAnswer(page, (u) => u.pathname === "/v1/topics/slow/stats");
  await page.goto(`${base}/console#/topics/slow`);
  await first.held;
  const failed = page.getByRole("alert").filter({ hasText: "trends could not be read" });
  await failed.waitFor();
  await first.release();
  assert.equal(await failed.count(), 1, "the read answered late hid the newer read's failure");
});

test("the topics list whose trends cannot be read says so, and still shows the topics and their figures", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "list-trends-error");
  await call("POST", "/v1/topics", { name: "listed", partitions: 1 });
  await call("POST", "/v1/topics/listed/produce-batch", { messages: [{ payload: { n: 1 } }] });
  const why = "the node's stats could not be gathered";
  await page.route(
    (u) => u.pathname === "/v1/stats",
    (route) => route.fulfill(failure(503, "unavailable", why)),
  );
  await page.goto(`${base}/console`);
  await page.getByRole("alert").filter({ hasText: "trends could not be read" }).filter({ hasText: `503 unavailable: ${why}` }).waitFor();
  const row = page.locator('tr[data-topic="listed"]');
  await until("the topic's backlog", async () => (await row.locator('td[data-col="backlog"]').textContent()) === "1");
  // Rates never read are unknown, not 0/s: no traffic and a failed read look different.
  for (const col of ["produce-rate", "ack-rate"]) assert.equal(await row.locator(`td[data-col="${col}"]`).textContent(), "unknown");
  assert.equal(await row.locator("svg.spark").count(), 0, "no lines are drawn for a read that failed");
});

test("a users list answered late does not take back a user just created", { timeout: 120_000 }, async (t) => {
  const { base, page } = await openNarad(t, "late-users", { admin: adminPassword });
  await page.goto(`${base}/console#/users`);
  await page.getByLabel("Username").fill("admin");
  await page.getByLabel("Password").fill(adminPassword);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.getByRole("rowheader", { name: "admin" }).waitFor();
  const create = async (name) => {
    await page.getByLabel("Username").fill(name);
    await page.getByLabel("Password (8 to 72 characters)").fill(`${name}-pass-1`);
    await page.getByRole("button", { name: "Create user" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Create user" }).click();
    await page.getByRole("status").filter({ hasText: `Created user ${name}.` }).waitFor();
  };
  // The list read after the first create is answered after the one after the second.
  const first = await holdAnswer(page, (u) => u.pathname === "/v1/users");
  await create("first");
  await first.held;
  await create("second");
  await page.getByRole("rowheader", { name: "second" }).waitFor();
  await first.release();
  assert.equal(await page.getByRole("rowheader", { name: "second" }).count(), 1, "the list read before the second create replaced the one after it");
});

test("the cluster page: a refresh answered late does not replace a newer one", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "late-cluster");
  const cluster = await call("GET", "/v1/cluster");
  assert.ok(cluster.controller, `a single node leads its own cluster: ${JSON.stringify(cluster)}`);
  // The first read, answered when no controller was known yet, comes after the second.
  const first = await holdAnswer(
    page,
    (u) => u.pathname === "/v1/cluster",
    (c) => ({ ...c, controller: "" }),
  );
  await page.goto(`${base}/console#/cluster`);
  await first.held;
  const controller = page.locator("dt", { hasText: "Controller" }).locator("xpath=following-sibling::dd[1]");
  await until("the second read's controller", async () => (await controller.textContent()) === cluster.controller);
  await first.release();
  assert.equal(await controller.textContent(), cluster.controller, "the read answered late replaced the newer one");
});

test("the cluster page shows a failed read of the node's health, not that it is for admins only", { timeout: 120_000 }, async (t) => {
  const { base, call, page } = await openNarad(t, "health-error");
  // With security off every request is an admin's: the health is there to be shown.
  assert.ok((await call("GET", "/v1/stats")).node_health, "the stats route names the node's health");
  const why = "the node's stats could not be gathered";
  await page.route(
    (u) => u.pathname === "/v1/stats",
    (route) => route.fulfill(failure(503, "unavailable", why)),
  );
  await page.goto(`${base}/console#/cluster`);
  await page.getByRole("heading", { name: "This node's health" }).waitFor();
  await page.getByRole("alert").filter({ hasText: `503 unavailable: ${why}` }).waitFor();
  assert.equal(await page.getByText("shown to admins only").count(), 0);
});

test("the console, driven in Chromium against a real narad", { timeout: 180_000 }, async (t) => {
  const work = mkdtempSync(join(tmpdir(), "narad-console-"));
  const shots = process.env.CONSOLE_SCREENSHOTS ? resolve(process.env.CONSOLE_SCREENSHOTS) : join(work, "shots");
  mkdirSync(shots, { recursive: true });
  const env = { PATH: process.env.PATH, HOME: work, NARAD_ADMIN_PASSWORD: adminPassword };
  let browser;
  t.after(async () => {
    await browser?.close();
  });
  const base = await startNarad(t, work, env);
  t.after(() => rmSync(work, { recursive: true, force: true }));

  browser = await chromium.launch({ executablePath: chromiumPath, args: browserArgs });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  // Anything the page logs as an error, a refused script or style (the content security
  // policy) or a request leaving the broker fails the test.
  const problems = [];
  page.on("console", (m) => {
    // A 4xx answer is logged by Chromium too; the responses are checked below instead.
    if (m.type() === "error" && !/^Failed to load resource: the server responded with a status of 4/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  // The API answers the test provokes (a wrong password, a topic that exists, a user
  // without grants) are expected; any other 4xx or 5xx is a console bug.
  const expected = new Set(["401 GET /v1/topics", "409 POST /v1/topics", "404 GET /v1/topics/orders", "403 GET /v1/users", "400 PATCH /v1/topics/orders"]);
  page.on("response", (r) => {
    const u = new URL(r.url());
    const key = `${r.status()} ${r.request().method()} ${u.pathname}`;
    if (r.status() >= 400 && !expected.has(key)) problems.push(`answer ${key}${u.search}`);
  });
  page.on("request", (r) => {
    if (!r.url().startsWith(base)) problems.push(`request outside the broker: ${r.url()}`);
  });
  let step = 0;
  const shot = async (name) => {
    step++;
    await page.screenshot({ path: join(shots, `${String(step).padStart(2, "0")}-${name}.png`), fullPage: true });
  };
  const logIn = async (user, password) => {
    await page.goto(`${base}/console`);
    await page.getByLabel("Username").fill(user);
    await page.getByLabel("Password").fill(password);
    await page.getByRole("button", { name: "Log in" }).click();
    await page.getByRole("heading", { name: "Topics" }).waitFor();
  };
  const produceCLI = (topic, msg) => {
    const r = spawnSync(narad, ["produce", topic, msg, "--url", base, "--user", "admin"], {
      env: { ...env, NARAD_PASSWORD: adminPassword },
      encoding: "utf8",
    });
    assert.equal(r.status, 0, `narad produce: ${r.stderr}`);
  };
  const cell = (topic, col) => page.locator(`tr[data-topic="${topic}"] td[data-col="${col}"]`);

  await t.test("a wrong password is refused with the broker's error", async () => {
    await page.goto(`${base}/console`);
    await page.getByRole("heading", { name: "Log in" }).waitFor();
    await shot("login");
    await page.getByLabel("Username").fill("admin");
    await page.getByLabel("Password").fill("wrong-password");
    await page.getByRole("button", { name: "Log in" }).click();
    await page.getByRole("alert").filter({ hasText: "401 unauthenticated" }).waitFor();
  });

  await t.test("log in and create a topic, with a confirmation", async () => {
    await logIn("admin", adminPassword);
    await page.getByText("No topics you may see.").waitFor();
    await page.getByLabel("Name").fill("orders");
    await page.getByLabel("Partitions").fill("1");
    await page.getByRole("button", { name: "Create topic" }).click();
    const dialog = page.getByRole("dialog");
    await dialog.getByText("Create topic orders with 1 partitions?").waitFor();
    await shot("create-topic-confirm");
    await dialog.getByRole("button", { name: "Create" }).click();
    await page.getByRole("status").filter({ hasText: "Created topic orders." }).waitFor();
    await until("the new topic's row", async () => (await cell("orders", "backlog").textContent()) === "0");
    // The same name again: the API's 409 is shown as it came.
    await page.getByLabel("Name").fill("orders");
    await page.getByRole("button", { name: "Create topic" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Create" }).click();
    await page.getByRole("alert").filter({ hasText: "409 topic_exists" }).waitFor();
  });

  await t.test("produce with the CLI and watch the backlog move", async () => {
    for (const msg of ['{"order":1,"item":"tea"}', '{"order":2,"item":"rice"}', "plain text, not JSON"]) produceCLI("orders", msg);
    await until("the backlog to show 3", async () => (await cell("orders", "backlog").textContent()) === "3");
    // The sparklines draw once the stats route has two samples with the produce in them.
    await until("the produce-rate line", async () => (await page.locator('tr[data-topic="orders"] svg polyline').count()) >= 3);
    await shot("topics-backlog");
  });

  await t.test("a topic's partitions, then peek its messages without a lease", async () => {
    await page.getByRole("link", { name: "orders" }).click();
    await page.getByRole("heading", { name: "Topic orders" }).waitFor();
    await page.getByRole("heading", { name: "Partitions" }).waitFor();
    await shot("topic");
    await page.getByRole("link", { name: "Browse messages of partition 0" }).click();
    const list = page.getByRole("list", { name: "Messages" });
    await until("three messages", async () => (await list.locator("li").count()) === 3);
    assert.match(await list.locator("li").first().locator("pre").textContent(), /"item": "tea"/);
    await shot("messages-json");
    await page.getByLabel("hex").check();
    assert.match(await list.locator("li").nth(2).locator("pre").textContent(), /^00000000 {2}70 6c 61 69 6e/);
    await shot("messages-hex");
    // Peeking took no lease: every message is still in the backlog, none in flight.
    const d = await (await fetch(`${base}/v1/topics/orders`, { headers: { Authorization: `Basic ${btoa(`admin:${adminPassword}`)}` } })).json();
    assert.equal(d.partition_stats[0].backlog, 3);
    assert.equal(d.partition_stats[0].in_flight, 0);
  });

  await t.test("alter a topic's retention; a value out of range shows the API's 400", async () => {
    await page.goto(`${base}/console#/topics/orders`);
    const retention = page.locator('dd[data-setting="retention"]');
    await until("the default retention", async () => (await retention.textContent()) === "7 d");
    await page.getByLabel("Retention, ms").fill("3600000");
    await page.getByRole("button", { name: "Alter topic" }).click();
    await page.getByRole("dialog").getByText("Alter topic orders: retention_ms from 604800000 to 3600000?").waitFor();
    await shot("alter-topic-confirm");
    await page.getByRole("dialog").getByRole("button", { name: "Alter" }).click();
    await page.getByRole("status").filter({ hasText: "Altered topic orders." }).waitFor();
    await until("the new retention", async () => (await retention.textContent()) === "60 min");
    await page.getByLabel("Retention, ms").fill("10");
    await page.getByRole("button", { name: "Alter topic" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Alter" }).click();
    await page.getByRole("alert").filter({ hasText: /^400 \S+: .*retention_ms/ }).waitFor();
    assert.equal(await retention.textContent(), "60 min");
  });

  await t.test("create a user without grants", async () => {
    await page.getByRole("link", { name: "Users" }).click();
    await page.getByRole("heading", { name: "Users" }).waitFor();
    await page.getByLabel("Username").fill("nobody");
    await page.getByLabel("Password (8 to 72 characters)").fill("nobody-pass-1");
    await page.getByRole("button", { name: "Create user" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Create user" }).click();
    await page.getByRole("status").filter({ hasText: "Created user nobody." }).waitFor();
    await page.getByRole("rowheader", { name: "nobody" }).waitFor();
    await shot("users");
  });

  await t.test("cluster members", async () => {
    await page.getByRole("link", { name: "Cluster" }).click();
    await page.getByRole("heading", { name: "Cluster" }).waitFor();
    await page.getByText("alive").first().waitFor();
    // The node's health: an admin sees its disk and the sync rounds of the last interval.
    await page.getByRole("heading", { name: "This node's health" }).waitFor();
    assert.match(await page.locator('dd[data-health="disk"]').textContent(), /^[\d.]+ [KMGTP]?i?B of [\d.]+ [KMGTP]?i?B \(\d+% free\)/);
    // A produce's sync round shows in the interval it fell in (1 s here): produce again
    // whenever the last one's interval may have passed, and reload until it shows.
    let produced = 0;
    await until("an interval with sync rounds", async () => {
      if (Date.now() - produced > 1500) {
        produceCLI("orders", '{"order":3,"item":"salt"}');
        produced = Date.now();
      }
      await page.reload();
      const text = await page.locator('dd[data-health="sync"]').textContent();
      return /^[1-9]\d* rounds \([\d.]+\/s, [1-9]\d* files\): mean [\d.]+ ms, longest [\d.]+ ms$/.test(text);
    });
    await shot("cluster");
  });

  await t.test("a user without grants sees only what they may see", async () => {
    await page.getByRole("button", { name: "Log out" }).click();
    await logIn("nobody", "nobody-pass-1");
    await page.getByText("No topics you may see.").waitFor();
    await shot("no-grants-topics");
    await page.goto(`${base}/console#/topics/orders`);
    await page.getByRole("alert").filter({ hasText: "404 topic_not_found" }).waitFor();
    await page.goto(`${base}/console#/users`);
    await page.getByRole("alert").filter({ hasText: "403 forbidden" }).waitFor();
    await shot("no-grants-users");
    await page.getByRole("button", { name: "Log out" }).click();
  });

  await t.test("on a phone", async () => {
    await logIn("admin", adminPassword);
    await page.setViewportSize({ width: 390, height: 844 });
    // The cluster step produced more: at least the first three are there.
    await until("the backlog to show", async () => Number(await cell("orders", "backlog").textContent()) >= 3);
    // Nothing but the table's own scroller is wider than the screen.
    const wide = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(wide <= 390, `the page is ${wide} px wide on a 390 px screen`);
    await shot("phone");
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await t.test("delete a user, with a confirmation", async () => {
    await page.getByRole("link", { name: "Users" }).click();
    await page.getByRole("button", { name: "Delete user nobody" }).click();
    await page.getByRole("dialog").getByText("Delete user nobody?").waitFor();
    await shot("delete-user-confirm");
    await page.getByRole("dialog").getByRole("button", { name: "Delete user" }).click();
    await page.getByRole("status").filter({ hasText: "Deleted user nobody." }).waitFor();
    await until("the user's row to go", async () => (await page.getByRole("rowheader", { name: "nobody" }).count()) === 0);
    const r = await fetch(`${base}/v1/topics`, { headers: { Authorization: `Basic ${btoa("nobody:nobody-pass-1")}` } });
    assert.equal(r.status, 401);
  });

  await t.test("delete the topic, with a confirmation", async () => {
    await page.goto(`${base}/console#/topics/orders`);
    await page.getByRole("button", { name: "Delete topic orders" }).click();
    await page.getByRole("dialog").getByText("Delete topic orders and every message in it?").waitFor();
    await shot("delete-confirm");
    await page.getByRole("dialog").getByRole("button", { name: "Delete" }).click();
    await page.getByRole("heading", { name: "Topics" }).waitFor();
    await page.getByText("No topics you may see.").waitFor();
    const r = await fetch(`${base}/v1/topics/orders`, { headers: { Authorization: `Basic ${btoa(`admin:${adminPassword}`)}` } });
    assert.equal(r.status, 404);
  });

  await t.test("credentials that stop working log the console out", async () => {
    const asAdmin = { Authorization: `Basic ${btoa(`admin:${adminPassword}`)}`, "Content-Type": "application/json" };
    const made = await fetch(`${base}/v1/users`, { method: "POST", headers: asAdmin, body: JSON.stringify({ username: "brief", password: "brief-pass-1", grants: [] }) });
    assert.equal(made.status, 201, await made.text());
    await page.getByRole("button", { name: "Log out" }).click();
    await logIn("brief", "brief-pass-1");
    await page.getByText("No topics you may see.").waitFor();
    assert.equal((await fetch(`${base}/v1/users/brief`, { method: "DELETE", headers: asAdmin })).status, 204);
    // The next refresh of the list (every 5 s) is answered 401: the console forgets the
    // credentials and asks for others, saying why.
    await page.getByRole("heading", { name: "Log in" }).waitFor();
    await page.getByRole("alert").filter({ hasText: "401 unauthenticated" }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem("narad-console-auth")), null);
    await logIn("admin", adminPassword);
  });

  await t.test("keyboard only: log in with Tab and Enter", async () => {
    await page.getByRole("button", { name: "Log out" }).click();
    await page.goto(`${base}/console`);
    await page.getByLabel("Username").focus();
    await page.keyboard.type("admin");
    await page.keyboard.press("Tab");
    await page.keyboard.type(adminPassword);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Topics" }).waitFor();
  });

  assert.deepEqual(problems, []);
});
