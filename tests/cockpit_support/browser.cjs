// Drives lw-cockpit's page in headless Chromium through playwright-core,
// for tests/cockpit.rs.  Usage: node browser.cjs story|xss|held|panels, with
//   PLAYWRIGHT   the playwright-core module directory
//   COCKPIT_URL  the URL lw-cockpit printed
//   LW_POST      the lw-post binary;  LW_ROOT  the mailbox root
//   SHOT         where to keep a screenshot
//   CORPUS       (xss) the number of log entries the corpus made
//   RELEASE, DROP, REASON  (held) the held messages to release and drop
//   SANDBOX      (panels) a sandbox whose diff to open, once its stat shows
// Prints one JSON line of results; exits 1 with the reason on a failed check.
"use strict";
const { chromium } = require(process.env.PLAYWRIGHT);
const { execFileSync } = require("child_process");
const fs = require("fs");
const path = require("path");

const url = process.env.COCKPIT_URL;
const origin = new URL(url).origin;
const mode = process.argv[2];
setTimeout(() => fail("the browser test took longer than 90 s"), 90_000).unref();

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

async function open() {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  // A fresh profile each run: launch() makes a temporary user-data-dir.
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const bad = [];
  page.on("dialog", (d) => { bad.push("dialog: " + d.message()); d.dismiss().catch(() => {}); });
  page.on("console", (m) => { if (m.type() === "error") bad.push("console error: " + m.text()); });
  page.on("pageerror", (e) => bad.push("page error: " + e.message));
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(origin + "/")) bad.push("request to another origin: " + u);
  });
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", { timeout: 10_000 })
    .catch(() => fail("the page did not finish loading; seen: " + bad.join("; ")));
  return { browser, page, bad };
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

const MODES = { story, xss, held, panels };
(MODES[mode] ? MODES[mode]() : Promise.reject(new Error("mode?")))
  .catch((e) => fail(e.stack || String(e)));
