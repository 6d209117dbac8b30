// Drives lw-cockpit's page in headless Chromium through playwright-core,
// for crates/cockpit/tests/cockpit/main.rs.  Usage: node browser.cjs story|xss|held|panels|
// ports|twice|two, with
//   PLAYWRIGHT   the playwright-core module directory
//   COCKPIT_URL  the URL lw-cockpit printed
//   LW_POST      the lw-post binary;  LW_ROOT  the mailbox root
//   SHOT         where to keep a screenshot
//   CORPUS       (xss) the number of log entries the corpus made
//   RELEASE, DROP, REASON  (held) the held messages to release and drop
//   SANDBOX      (panels) a sandbox whose diff to open, once its stat shows;
//                (ports, two) the sandbox that posts
//   RECORDER     (ports) the URL of a sandbox's published port
//   COCKPIT_URL2, LW_ROOT2  (two) the second cockpit and its root
//   BROWSER_SECS how long it may take (default 90)
// Prints one JSON line of results; exits 1 with the reason on a failed check.
"use strict";
const { chromium } = require(process.env.PLAYWRIGHT);
const { execFileSync } = require("child_process");
const fs = require("fs");
const path = require("path");

const url = process.env.COCKPIT_URL;
const origin = new URL(url).origin;
const mode = process.argv[2];
const secs = Number(process.env.BROWSER_SECS || 90);
setTimeout(() => fail(`the browser test took longer than ${secs} s`), secs * 1000).unref();

function fail(why) {
  console.error("browser.cjs: " + why);
  process.exit(1);
}

// lw-post as the sandbox NAME would run it; returns the message id.
function post(name, kind, subject, body) {
  const mailbox = path.join(process.env.LW_ROOT, "sandboxes", name);
  return execFileSync(process.env.LW_POST, ["-m", mailbox, "-k", kind, "-s", subject, body])
    .toString().trim();
}

function launch() {
  return chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

// The page at URL u, loaded, in a new page of `within` (a browser or a
// context; a new browser when none), its misbehaviour collected in `bad`.
async function open(u = url, within = null) {
  // A fresh profile each run: launch() makes a temporary user-data-dir.
  const browser = within || await launch();
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const origin = new URL(u).origin;
  const bad = [];
  page.on("dialog", (d) => { bad.push("dialog: " + d.message()); d.dismiss().catch(() => {}); });
  page.on("console", (m) => { if (m.type() === "error") bad.push("console error: " + m.text()); });
  page.on("pageerror", (e) => bad.push("page error: " + e.message));
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(origin + "/")) bad.push("request to another origin: " + u);
  });
  await page.goto(u);
  await ready(page, bad);
  return { browser, page, bad };
}

async function ready(page, bad) {
  await page.waitForSelector("body[data-ready='1']", { timeout: 10_000 })
    .catch(async () => fail("the page did not finish loading; it says: " +
      await page.textContent("body").catch(() => "?") + "; seen: " + bad.join("; ")));
  // The ticket is out of the address bar and this history entry.
  if (page.url() !== new URL(page.url()).origin + "/") fail("the address still holds " + page.url());
}

async function story() {
  const { browser, page, bad } = await open();
  const names = await page.$$eval("#sandboxes tbody tr", (rows) => rows.map((r) => r.dataset.name));
  for (const n of ["producer", "consumer"]) if (!names.includes(n)) fail("sandbox " + n + " is not listed: " + names);
  // Live: the producer's contract change, then the consumer's question.
  const subject = "users.email is now required " + Date.now();
  const t0 = Date.now();
  post("producer", "contract-change", subject, "schema v2: users.email NOT NULL");
  await page.waitForSelector(`#log tbody tr:has(td.subject:text-is("${subject}"))`, { timeout: 1000 })
    .catch(() => fail("the contract-change did not appear within 1 s"));
  const contractMs = Date.now() - t0;
  const t1 = Date.now();
  const qid = post("consumer", "question", "may email be empty for legacy users?", "old rows have none");
  const item = `#human li[data-id="${qid}"]`;
  await page.waitForSelector(item, { timeout: 1000 })
    .catch(() => fail("the question did not reach the human queue within 1 s"));
  const questionMs = Date.now() - t1;
  await page.fill(`${item} textarea`, "yes: backfill them with a placeholder");
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  await page.click(`${item} button.answer`);
  await page.waitForSelector(item, { state: "detached", timeout: 10_000 })
    .catch(() => fail("the answered question stayed in the human queue"));
  const row = `#log tbody tr:has(td.kind:text-is("answer")):has(td.route:text-is("human → consumer"))`;
  await page.waitForSelector(row, { timeout: 5000 }).catch(() => fail("the answer is not in the log"));
  await page.click(row);
  await page.waitForSelector("#detail:has-text('(lw-cockpit)')", { timeout: 5000 })
    .catch(() => fail("the answer's log entry does not name the person"));
  const detail = await page.textContent("#detail");
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ contract_ms: contractMs, question_ms: questionMs, qid, detail }));
}

async function xss() {
  const { browser, page, bad } = await open();
  const want = Number(process.env.CORPUS);
  await page.waitForFunction((n) => document.querySelectorAll("#log tbody tr").length >= n, want,
    { timeout: 10_000 }).catch(() => fail("the log does not show the " + want + " corpus entries"));
  const rows = await page.$$("#log tbody tr");
  for (const r of rows) {
    const before = await page.textContent("#detail");
    await r.click();
    await page.waitForFunction((b) => document.getElementById("detail").textContent !== b, before,
      { timeout: 5000 });
    const shown = await page.textContent("#detail");
    if (/[\u001b\u202e\u0007]/.test(shown)) bad.push("a raw escape or override in a body: " + JSON.stringify(shown));
  }
  await page.click(`#sandboxes tbody tr[data-name="evil"] button`);
  await page.waitForSelector("#detail:has-text('no lw-sandbox record')", { timeout: 5000 });
  const dom = await page.evaluate(() => ({
    scripts: document.querySelectorAll("script").length,
    foreign: document.querySelectorAll(
      "img,svg,iframe,object,embed,video,audio,source,base,math,details,form,style,meta[http-equiv]," +
      "link:not([href='/app.css']),[onerror],[onload],[onfocus],[ontoggle],[autofocus],a[href^='javascript']").length,
    text: document.body.innerText,
    raw: /[\u001b\u202e\u0007]/.test(document.body.textContent),
  }));
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  if (page.url().split("?")[0] !== origin + "/") bad.push("the page navigated to " + page.url());
  if (dom.scripts !== 1) bad.push(dom.scripts + " script elements");
  if (dom.foreign) bad.push(dom.foreign + " elements made from the corpus");
  if (dom.raw) bad.push("a raw escape or override character reached the page");
  if (bad.length) fail("the corpus was not inert: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ rows: rows.length, text: dom.text }));
}

// What a page made of untrusted text must not hold.
async function inert(page, bad) {
  const dom = await page.evaluate(() => ({
    scripts: document.querySelectorAll("script").length,
    foreign: document.querySelectorAll(
      "img,svg,iframe,object,embed,video,audio,source,base,math,details,form,style,meta[http-equiv]," +
      "link:not([href='/app.css']),[onerror],[onload],[onfocus],[ontoggle],[autofocus],a[href^='javascript']").length,
    raw: /[\u001b\u202e\u0007]/.test(document.body.textContent),
  }));
  if (page.url().split("?")[0] !== origin + "/") bad.push("the page navigated to " + page.url());
  if (dom.scripts !== 1) bad.push(dom.scripts + " script elements");
  if (dom.foreign) bad.push(dom.foreign + " elements made from untrusted text");
  if (dom.raw) bad.push("a raw escape or override character reached the page");
}

async function held() {
  const { browser, page, bad } = await open();
  const rel = `#held li[data-id="${process.env.RELEASE}"]`;
  const drop = `#held li[data-id="${process.env.DROP}"]`;
  await page.waitForSelector(rel, { timeout: 5000 }).catch(() => fail("the held message to release is not listed"));
  await page.waitForSelector(drop, { timeout: 5000 }).catch(() => fail("the held message to drop is not listed"));
  await page.click(`${rel} button.release`);
  await page.waitForSelector(rel, { state: "detached", timeout: 10_000 })
    .catch(() => fail("the released message stayed in the held queue"));
  await page.fill(`${drop} input.drop-reason`, process.env.REASON);
  await page.click(`${drop} button.drop`);
  await page.waitForSelector(drop, { state: "detached", timeout: 10_000 })
    .catch(() => fail("the dropped message stayed in the held queue"));
  const result = await page.textContent("#action-result");
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ result }));
}

async function panels() {
  const { browser, page, bad } = await open();
  await page.waitForFunction(() => !/asking the engine/.test(document.getElementById("engine-status").textContent),
    null, { timeout: 15_000 }).catch(() => fail("the engine's view never arrived"));
  let detail = null;
  const name = process.env.SANDBOX;
  if (name) {
    const row = `#sandboxes tbody tr[data-name="${name}"]`;
    await page.waitForSelector(`${row} td.stat:has-text("ahead")`, { timeout: 15_000 })
      .catch(() => fail("the branch's stat never showed"));
    await page.click(`${row} button`);
    await page.waitForSelector("#detail:has-text('diff --git')", { timeout: 10_000 })
      .catch(() => fail("the diff did not show"));
    detail = await page.textContent("#detail");
  }
  await inert(page, bad);
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  const text = (id) => page.textContent(id);
  const out = { engine: await text("#engine-status"), sandboxes: await text("#sandboxes"),
    sync: await text("#sync"), detail,
    links: await page.$$eval("#sandboxes a, #sync a", (as) => as.map((a) => a.getAttribute("href"))) };
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify(out));
}

// Waits until a log row with `subject` is on `page`, at most `ms`.
function logged(page, subject, ms) {
  return page.waitForSelector(`#log tbody tr:has(td.subject:text-is("${subject}"))`, { timeout: ms });
}

// Uses the page, follows a sandbox's port link to a hostile server there
// (which plants cookies for 127.0.0.1, a cookie bomb among them), then
// uses the page again: reloaded, live, answering.
async function ports() {
  const { browser, page, bad } = await open();
  const rec = process.env.RECORDER;
  const secret = await page.evaluate(() => sessionStorage.getItem("lw-cockpit-session"));
  const q1 = `#human li[data-id="${process.env.QID}"]`;
  await page.waitForSelector(q1, { timeout: 5000 }).catch(() => fail("the question is not listed"));
  await page.fill(`${q1} textarea`, "before the port link");
  await page.click(`${q1} button.answer`);
  await page.waitForSelector(q1, { state: "detached", timeout: 10_000 })
    .catch(() => fail("the answer before the port link did not go"));
  await page.click("#log tbody tr");
  await page.waitForFunction(() => document.getElementById("detail").textContent.length > 0, null, { timeout: 5000 });
  const link = `#sandboxes a[href="${rec}"]`;
  await page.waitForSelector(link, { timeout: 10_000 }).catch(() => fail("no link to " + rec));
  const rel = await page.getAttribute(link, "rel");
  const [tab] = await Promise.all([page.context().waitForEvent("page"), page.click(link)]);
  await tab.waitForFunction(() => document.title === "planted", null, { timeout: 10_000 })
    .catch(() => fail("the sandbox's page did not plant its cookies"));
  const opener = await tab.evaluate(() => window.opener === null);
  const jar = (await page.context().cookies()).filter((c) => c.domain === "127.0.0.1");
  const names = jar.map((c) => c.name + " " + c.path);
  for (const want of ["lw-cockpit-token /api/events", "lw-cockpit-session /", "x-lw-session /api/session"])
    if (!names.includes(want)) fail("the planted cookie " + want + " is not in the jar: " + names.slice(0, 8));
  const bytes = jar.reduce((n, c) => n + c.name.length + c.value.length, 0);
  await tab.close();
  // The cockpit again, the cookies riding along on its page's request.
  await page.reload();
  await ready(page, bad);
  const subject = "after the plant " + Date.now();
  post(process.env.SANDBOX, "status", subject, "live still");
  await logged(page, subject, 2000).catch(() => fail("the live stream stopped after the plant"));
  const qid2 = post(process.env.SANDBOX, "question", "after the plant too?", "yes");
  const q2 = `#human li[data-id="${qid2}"]`;
  await page.waitForSelector(q2, { timeout: 2000 }).catch(() => fail("the second question did not arrive live"));
  await page.fill(`${q2} textarea`, "after the port link");
  await page.click(`${q2} button.answer`);
  await page.waitForSelector(q2, { state: "detached", timeout: 10_000 })
    .catch(() => fail("the answer after the plant did not go: " + bad.join("; ")));
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ secret, rel, opener, cookies: jar.length, cookie_bytes: bytes, qid2 }));
}

// The printed URL opens one tab, once; a reload keeps it; "new tab" makes
// another with its own secret.
async function twice() {
  const { browser, page, bad } = await open();
  const a = await page.evaluate(() => sessionStorage.getItem("lw-cockpit-session"));
  await page.reload();
  await ready(page, bad);
  const again = await browser.newPage();
  await again.goto(url);
  await again.waitForSelector("body[data-access='denied']", { timeout: 10_000 })
    .catch(() => fail("the printed URL worked a second time"));
  const said = await again.textContent("#access");
  const ready2 = await again.evaluate(() => document.body.dataset.ready || "");
  const other = await (await browser.newContext()).newPage();
  await other.goto(url);
  await other.waitForSelector("body[data-access='denied']", { timeout: 10_000 })
    .catch(() => fail("the printed URL worked in another profile"));
  const [tab] = await Promise.all([page.context().waitForEvent("page"), page.click("#new-tab")]);
  await ready(tab, bad);
  const b = await tab.evaluate(() => sessionStorage.getItem("lw-cockpit-session"));
  const opener = await tab.evaluate(() => window.opener === null);
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ a, b, said, ready2, opener }));
}

// Two cockpits (two roots) in one browser: each works after reloads.
async function two() {
  const browser = await launch();
  const context = await browser.newContext();
  const one = await open(url, context);
  const two = await open(process.env.COCKPIT_URL2, context);
  const roots = [process.env.LW_ROOT, process.env.LW_ROOT2];
  const seen = [];
  for (let round = 0; round < 2; round++) {
    for (const p of [one, two]) { await p.page.reload(); await ready(p.page, p.bad); }
    for (const [i, p] of [one, two].entries()) {
      const subject = `cockpit ${i + 1} round ${round} ${Date.now()}`;
      process.env.LW_ROOT = roots[i];
      post(process.env.SANDBOX, "status", subject, "live");
      await logged(p.page, subject, 2000).catch(() => fail(`cockpit ${i + 1} is not live after a reload`));
      seen.push(await p.page.textContent("#root"));
    }
  }
  const bad = one.bad.concat(two.bad);
  if (bad.length) fail("a page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ seen }));
}

// scripts/main-job --cockpit: its story as the page shows it, live, from
// the printed URL (which then does not open the page again).
async function mainjob() {
  const { browser, page, bad } = await open();
  const t0 = Date.now();
  const at = {};
  const wait = async (what, sel) => {
    await page.waitForSelector(sel, { timeout: (secs - 30) * 1000 })
      .catch(() => fail(what + " never showed; the log shows: " + bad.join("; ")));
    at[what] = Date.now() - t0;
  };
  const row = (kind, route) => `#log tbody tr:has(td.kind:text-is("${kind}"))` +
    (route ? `:has(td.route:text-is("${route}"))` : "");
  await wait("producer", '#sandboxes tbody tr[data-name="producer"]');
  await wait("consumer", '#sandboxes tbody tr[data-name="consumer"]');
  await wait("contract-change", row("contract-change", "producer → consumer"));
  await wait("conflict", row("conflict"));
  await wait("question", row("question", "consumer → human"));
  await wait("answer", row("answer", "human → consumer"));
  await page.click(row("answer", "human → consumer"));
  await page.waitForSelector("#detail:has-text('keep the fallback')", { timeout: 5000 })
    .catch(() => fail("the answer's body is not shown"));
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  const again = await browser.newPage();
  await again.goto(url);
  await again.waitForSelector("body[data-access='denied']", { timeout: 10_000 })
    .catch(() => fail("the printed URL worked a second time"));
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ at }));
}

// One answer per question: a double click on "answer", then three answers
// to another question sent at once.
async function once() {
  const { browser, page, bad } = await open();
  const q1 = `#human li[data-id="${process.env.QID}"]`;
  await page.waitForSelector(q1, { timeout: 5000 }).catch(() => fail("the question is not listed"));
  await page.fill(`${q1} textarea`, "double-clicked");
  await page.dblclick(`${q1} button.answer`);
  await page.waitForSelector(q1, { state: "detached", timeout: 10_000 })
    .catch(() => fail("the double-clicked question stayed"));
  const q2 = process.env.QID2;
  await page.waitForSelector(`#human li[data-id="${q2}"]`, { timeout: 5000 });
  const statuses = await page.evaluate((id) => Promise.all([1, 2, 3].map((i) => fetch("/api/answer", {
    method: "POST", credentials: "omit",
    headers: { "x-lw-session": sessionStorage.getItem("lw-cockpit-session"), "content-type": "application/json" },
    body: JSON.stringify({ id, text: "at once " + i }) }).then((r) => r.status))), q2);
  // The refused answers logged console errors (409): expected here.
  const unexpected = bad.filter((b) => !/409/.test(b));
  if (unexpected.length) fail("the page misbehaved: " + unexpected.join("; "));
  await browser.close();
  console.log(JSON.stringify({ statuses: statuses.sort() }));
}

// The timeline is in the order things were logged: an old held message,
// released now, is the newest row, live.
async function order() {
  const { browser, page, bad } = await open();
  const rel = `#held li[data-id="${process.env.RELEASE}"]`;
  await page.waitForSelector(rel, { timeout: 5000 }).catch(() => fail("the held message is not listed"));
  await page.click(`${rel} button.release`);
  await page.waitForFunction(() => {
    const top = document.querySelector("#log tbody tr");
    return top && top.querySelector("td.decision").textContent === "release";
  }, null, { timeout: 5000 }).catch(async () => fail("the release is not the newest row; the top row: " +
    await page.textContent("#log tbody tr")));
  const top = await page.textContent("#log tbody tr td.subject");
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ top }));
}

// What a held message and a question say before a person acts: their
// recipients and body, as text.
async function bodies() {
  const { browser, page, bad } = await open();
  const out = {};
  for (const [k, sel] of [["held", `#held li[data-id="${process.env.HELD}"]`],
    ["question", `#human li[data-id="${process.env.QID}"]`], ["leak", `#held li[data-id="${process.env.LEAK}"]`]]) {
    await page.waitForSelector(sel, { timeout: 5000 }).catch(() => fail("the " + k + " is not listed"));
    out[k] = { to: await page.textContent(`${sel} .to`), body: await page.textContent(`${sel} pre.body`) };
  }
  await inert(page, bad);
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify(out));
}

// The sandbox table redraws only what changed: rows whose sandbox did not
// change stay the same elements, and keep the focus.
async function churn() {
  const { browser, page, bad } = await open();
  let fetched = 0;
  let same = 0;
  page.on("requestfinished", (r) => { if (new URL(r.url()).pathname === "/api/sandboxes") fetched++; });
  page.on("response", (r) => { if (new URL(r.url()).pathname === "/api/sandboxes" && r.status() === 304) same++; });
  await page.waitForSelector('#sandboxes tbody tr[data-name="api"]', { timeout: 5000 });
  // Marked before the engine has answered: its answer changes every row's
  // state cell, and must leave the rest of each row (and the focus) alone.
  await page.evaluate(() => {
    for (const r of document.querySelectorAll("#sandboxes tbody tr")) { r.lwMark = 1; r.cells[0].lwMark = 1; r.cells[r.cells.length - 1].lwMark = 1; }
  });
  await page.focus('#sandboxes tbody tr[data-name="api"] button');
  const register = (name) => execFileSync(process.env.LW_MEDIATE, ["--root", process.env.LW_ROOT, "register", name]);
  for (let i = 0; i < 3; i++) {
    const again = page.waitForResponse((r) => new URL(r.url()).pathname === "/api/sandboxes", { timeout: 5000 });
    register("api");
    await again.catch(() => fail("re-registering did not make the page fetch the sandboxes again"));
  }
  register("web2");
  await page.waitForSelector('#sandboxes tbody tr[data-name="web2"]', { timeout: 5000 })
    .catch(() => fail("a new sandbox did not show"));
  await page.waitForFunction(() => !/asking the engine/.test(document.getElementById("engine-status").textContent),
    null, { timeout: 20_000 }).catch(() => fail("the engine's answer never showed"));
  const out = await page.evaluate(() => ({
    kept: Array.from(document.querySelectorAll("#sandboxes tbody tr")).map((r) =>
      r.dataset.name + ":" + ((r.lwMark || 0) & (r.cells[0].lwMark || 0) & (r.cells[r.cells.length - 1].lwMark || 0))),
    engine: document.getElementById("engine-status").textContent,
    focus: document.activeElement.closest("tr") ? document.activeElement.closest("tr").dataset.name : document.activeElement.tagName,
  }));
  out.fetched = fetched;
  out.same = same;
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify(out));
}

// The log's rows are reached with Tab and opened with Enter, then Space.
async function keys() {
  const { browser, page, bad } = await open();
  await page.waitForSelector("#log tbody tr", { timeout: 5000 });
  const inRow = () => page.evaluate(() => {
    const r = document.activeElement && document.activeElement.closest("#log tbody tr");
    return r ? r.dataset.name : null;
  });
  let tabs = 0, row = null;
  while (!row && tabs < 300) { await page.keyboard.press("Tab"); tabs++; row = await inRow(); }
  if (!row) fail("no log row is reached with Tab in " + tabs + " presses");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#detail:has-text('entry:')", { timeout: 5000 })
    .catch(() => fail("Enter on a log row did not open it"));
  const first = await page.textContent("#detail");
  await page.keyboard.press("Tab");
  const second = await inRow();
  await page.keyboard.press(" ");
  await page.waitForFunction((f) => document.getElementById("detail").textContent !== f, first, { timeout: 5000 })
    .catch(() => fail("Space on the next log row did not open it"));
  if (bad.length) fail("the page misbehaved: " + bad.join("; "));
  await browser.close();
  console.log(JSON.stringify({ tabs, row, second, first }));
}

// lw-cockpit stops while the page is open, then starts again on its port:
// the page says what happened and what to do, and the new URL works.
async function restart() {
  const { browser, page, bad } = await open();
  // As a person stops it (Ctrl-C, or systemd's SIGTERM): it closes its port
  // first, so it can be started again on it at once.
  process.kill(Number(process.env.COCKPIT_PID), "SIGTERM");
  // Generous: on a loaded 2-core machine the page's next read can lag.
  await page.waitForSelector("body[data-conn='lost']", { timeout: 20_000 })
    .catch(() => fail("the page did not notice the server went away"));
  const down = await page.textContent("#live");
  const port = new URL(url).port;
  const child = require("child_process").spawn(process.env.COCKPIT_BIN,
    ["--root", process.env.LW_ROOT, "--port", port], { stdio: ["ignore", "pipe", "ignore"] });
  const early = (code) => fail("the restarted lw-cockpit exited " + code + " before printing its URL");
  child.on("exit", early);
  const again = await new Promise((ok) => {
    let buf = "";
    child.stdout.on("data", (d) => { buf += d; if (buf.includes("\n")) ok(buf.split("\n")[0]); });
  });
  child.off("exit", early);
  try {
    await page.waitForSelector("body[data-access='denied']", { timeout: 30_000 })
      .catch(() => fail("the page did not say its access ended with the old server"));
    const said = await page.textContent("#access");
    await page.goto(again);
    await page.waitForSelector("body[data-ready='1']", { timeout: 30_000 })
      .catch(() => fail("the new URL did not open the page"));
    // Console errors of the refused requests (403) and of the stopped
    // server's cut connections are expected here.
    const unexpected = bad.filter((b) => !/403|ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE|ERR_INCOMPLETE_CHUNKED_ENCODING|Failed to fetch/.test(b));
    if (unexpected.length) fail("the page misbehaved: " + unexpected.join("; "));
    await browser.close();
    console.log(JSON.stringify({ down, said }));
  } finally {
    child.kill("SIGTERM");
  }
}

const MODES = { story, xss, held, panels, ports, twice, two, mainjob, once, order, bodies, churn, keys, restart };
(MODES[mode] ? MODES[mode]() : Promise.reject(new Error("mode?")))
  .catch((e) => fail(e.stack || String(e)));
