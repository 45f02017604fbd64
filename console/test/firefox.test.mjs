// Drives the console in Debian's headless Firefox ESR (puppeteer-core over WebDriver
// BiDi, pointed at /usr/bin/firefox-esr, a fresh profile in a temp directory) against a
// real narad: security on, 127.0.0.1, a free port, a temp data directory, stopped by its
// PID at the end. Issue 29 asks for a console that works in Firefox as well as Chromium;
// this is the main path (log in, create, backlog, peek, delete) in Gecko, short enough
// to run on every `make test`. browser.test.mjs covers the rest in Chromium.
//
//   NARAD_BIN=/abs/bin/narad node --test test/firefox.test.mjs
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import puppeteer from "puppeteer-core";
import { bound, freePort, startNarad, until } from "./narad.mjs";

const firefoxPath = process.env.FIREFOX ?? "/usr/bin/firefox-esr";
const adminPassword = "console-admin-1";

// Firefox's own background traffic (updates, telemetry, remote settings, region and
// captive portal checks, DNS over HTTPS, prefetching) is off or pointed at a port
// nothing listens on, on top of what puppeteer's profile already turns off; what is left
// goes to that dead port as a proxy, so nothing leaves the machine. (An empty URL is not
// enough: Firefox then looks up its default host.) Loopback is never proxied.
function firefoxPrefs(deadPort) {
  const dead = `http://127.0.0.1:${deadPort}/`;
  return {
    "app.update.auto": false,
    "app.update.url": dead,
    "browser.region.network.url": dead,
    "browser.region.update.enabled": false,
    "browser.safebrowsing.provider.mozilla.updateURL": dead,
    "browser.search.geoip.url": dead,
    "browser.topsites.contile.enabled": false,
    "extensions.systemAddon.update.enabled": false,
    "extensions.systemAddon.update.url": dead,
    "messaging-system.rsexperimentloader.enabled": false,
    "network.captive-portal-service.enabled": false,
    "network.connectivity-service.enabled": false,
    "network.dns.disablePrefetch": true,
    "network.predictor.enabled": false,
    "network.prefetch-next": false,
    "network.proxy.allow_hijacking_localhost": false,
    "network.proxy.failover_direct": false,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": deadPort,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": deadPort,
    "network.proxy.type": 1,
    "network.trr.mode": 5,
    "services.settings.server": `${dead}v1`,
    "toolkit.telemetry.enabled": false,
    "toolkit.telemetry.server": dead,
    "toolkit.telemetry.unified": false,
  };
}

test("the console's main path, driven in Firefox ESR against a real narad", { timeout: 120_000 }, async (t) => {
  const work = mkdtempSync(join(tmpdir(), "narad-console-firefox-"));
  const env = { PATH: process.env.PATH, HOME: work, NARAD_ADMIN_PASSWORD: adminPassword };
  const auth = { Authorization: `Basic ${btoa(`admin:${adminPassword}`)}` };
  // after hooks run in the order they are added: the browser, then narad, then the files.
  let browser;
  t.after(async () => {
    await browser?.close();
  });
  const base = await startNarad(t, work, env);
  t.after(() => rmSync(work, { recursive: true, force: true }));

  // A port that was free a moment ago: the dead proxy. Were something to take it, the
  // traffic would still stay on this machine.
  const deadPort = await freePort();
  browser = await puppeteer.launch({
    browser: "firefox",
    executablePath: firefoxPath,
    headless: true,
    userDataDir: join(work, "profile"),
    extraPrefsFirefox: firefoxPrefs(deadPort),
    // A release build ignores services.settings.server unless this is set.
    env: { PATH: process.env.PATH, HOME: work, MOZ_REMOTE_SETTINGS_DEVTOOLS: "1" },
    timeout: bound,
  });
  const page = await browser.newPage();
  page.setDefaultTimeout(bound);
  await page.setViewport({ width: 1280, height: 800 });

  // A page error, anything logged as an error, a refused script or style (Firefox
  // reports the content security policy's refusals as page errors) or a request to
  // another host fails the test.
  const problems = [];
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  // data: URLs (the page's empty icon) are not network requests.
  page.on("request", (r) => {
    if (!r.url().startsWith(`${base}/`) && !r.url().startsWith("data:")) problems.push(`request outside the broker: ${r.url()}`);
  });
  // Expected: the console's first probe, before logging in. The page declares an empty
  // icon, so Firefox does not ask the broker for /favicon.ico (which would be a 401).
  // Any other 4xx or 5xx is a console bug.
  const expected = new Set(["401 GET /v1/topics"]);
  page.on("response", (r) => {
    const key = `${r.status()} ${r.request().method()} ${new URL(r.url()).pathname}`;
    if (r.status() >= 400 && !expected.has(key)) problems.push(`answer ${key}`);
  });

  // Each action names what it waited for when it times out (puppeteer's error does not).
  const named = async (what, action) => {
    try {
      await action;
    } catch (e) {
      throw new Error(`${what}: ${e.message}`);
    }
  };
  // Seeing polls a one-shot query: puppeteer's own wait (locator.wait, waitForSelector)
  // was seen to miss an element that appeared during the console's hash navigation
  // after a delete, when Firefox ran slowly.
  const see = (sel) => until(`seeing ${sel}`, async () => (await page.$(sel)) !== null);
  const click = (sel) => named(`clicking ${sel}`, page.locator(sel).click());
  // An input by the text of the <label> around it, as the user reads it. (A bare
  // ::-p-aria(Username) finds the label first, and Firefox gives a password input a
  // role of its own, so the accessibility query would need one per kind of input.)
  const fill = (label, value) => named(`filling ${label}`, page.locator(`::-p-xpath(//label[normalize-space(text())="${label}"]/input)`).fill(value));
  const button = (name) => `::-p-aria([name="${name}"][role="button"])`;
  const backlog = () => page.$eval('tr[data-topic="orders"] td[data-col="backlog"]', (el) => el.textContent).catch(() => null);

  await t.test("log in", async () => {
    await page.goto(`${base}/console`);
    await fill("Username", "admin");
    await fill("Password", adminPassword);
    await click(button("Log in"));
    await see('::-p-aria([name="Topics"][role="heading"])');
    await see("::-p-text(No topics you may see.)");
  });

  await t.test("create a topic, with a confirmation", async () => {
    await fill("Name", "orders");
    await fill("Partitions", "1");
    await click(button("Create topic"));
    await see("dialog[open] ::-p-text(Create topic orders with 1 partitions?)");
    await click(`dialog[open] ${button("Create")}`);
    await see('[role="status"]::-p-text(Created topic orders.)');
    await until("the new topic's row", async () => (await backlog()) === "0");
  });

  await t.test("produce two messages with the API and watch the backlog reach 2", async () => {
    for (const [i, item] of ["tea", "rice"].entries()) {
      const r = await fetch(`${base}/v1/topics/orders/produce`, {
        method: "POST",
        headers: { ...auth, "Content-Type": "application/json" },
        body: JSON.stringify({ order: i + 1, item }),
      });
      assert.equal(r.status, 202, `produce: ${await r.text()}`);
    }
    await until("the backlog to show 2", async () => (await backlog()) === "2");
  });

  await t.test("open the topic and peek a message as JSON", async () => {
    await click('::-p-aria([name="orders"][role="link"])');
    await see('::-p-aria([name="Topic orders"][role="heading"])');
    await click("::-p-aria(Browse messages of partition 0)");
    const payloads = () => page.$$eval('ol[aria-label="Messages"] li pre', (els) => els.map((e) => e.textContent));
    await until("two messages", async () => (await payloads()).length === 2);
    // The JSON view (the default) shows the payload pretty-printed.
    const [first] = await payloads();
    assert.match(first, /"item": "tea"/);
    assert.match(first, /"order": 1/);
  });

  await t.test("delete the topic, with a confirmation", async () => {
    await page.goto(`${base}/console#/topics/orders`);
    await click(button("Delete topic orders"));
    await see("dialog[open] ::-p-text(Delete topic orders and every message in it?)");
    await click(`dialog[open] ${button("Delete")}`);
    await see("::-p-text(No topics you may see.)");
    assert.equal((await fetch(`${base}/v1/topics/orders`, { headers: auth })).status, 404);
  });

  assert.deepEqual(problems, []);
});
