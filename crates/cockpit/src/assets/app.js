// The cockpit's page (lw-cockpit(1)).  Everything shown that an agent
// could have written goes in as text (textContent / text nodes), never as
// markup: there is no innerHTML in this file.  Control characters and
// bidirectional overrides are shown as visible escapes, so a subject can
// neither move the cursor of a terminal it is pasted into nor reorder
// what the person reads.
//
// Access (lw-cockpit(1), SECURITY): the URL lw-cockpit printed carries a
// one-time ticket in its fragment; the page takes it out of the address
// bar and the history entry at once, trades it for this tab's secret,
// keeps that in sessionStorage (this origin's, this tab's: a reload keeps
// it, another port never sees it) and sends it in a header.  No cookie is
// sent: every fetch says credentials "omit".
"use strict";

const SESSION = "lw-cockpit-session";
let secret = null;

const $ = (id) => document.getElementById(id);
const PAGE = 50;
const state = { log: [], next: null, busy: {}, dirty: {}, sandboxes: [], tags: {} };

// Controls, DEL, C1 controls, zero-width and bidi marks, overrides, isolates.
const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;
function vis(s, keepLines) {
  if (s === null || s === undefined) return "";
  s = String(s);
  const re = keepLines ? UNSAFE : /[\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;
  return s.replace(re, (c) => "\\u{" + c.charCodeAt(0).toString(16).padStart(4, "0") + "}");
}

// el("td", {class: "x"}, "text", otherNode): strings become text nodes.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : vis(k));
  return e;
}

// Refused for want of access: the page says how to get it back.
class AccessError extends Error {}

// This tab's secret: a ticket in the address traded for a new one, else
// the one this tab kept.
async function session() {
  const m = /^#ticket=([0-9a-f]{32})$/.exec(location.hash);
  if (location.hash || location.search) history.replaceState(null, "", location.pathname);
  if (m) {
    const r = await fetch("/api/session", { method: "POST", credentials: "omit", cache: "no-store",
      headers: { "content-type": "application/json" }, body: JSON.stringify({ ticket: m[1] }) });
    const d = await r.json().catch(() => ({}));
    if (!r.ok) throw new AccessError(d.error || "the link's ticket was refused");
    sessionStorage.setItem(SESSION, d.secret);
  }
  secret = sessionStorage.getItem(SESSION);
  if (!secret) throw new AccessError("open the URL lw-cockpit printed: this tab has no access of its own");
}

// Access is gone (a ticket used twice, lw-cockpit restarted): say so, once.
function denied(why) {
  const n = $("access");
  n.textContent = vis(why);
  n.hidden = false;
  document.body.dataset.access = "denied";
  $("live").textContent = "no access";
  $("live").className = "live off";
}

// A GET given a `tag` (the entity tag of the view the page holds) answers
// null when that view is still the server's.
async function api(path, body, tag) {
  const opts = { headers: { "x-lw-session": secret }, credentials: "omit", cache: "no-store" };
  if (tag) opts.headers["if-none-match"] = tag;
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["content-type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 304) return null;
  state.tags[path] = r.headers.get("etag");
  const ctype = r.headers.get("content-type") || "";
  const data = ctype.startsWith("application/json") ? await r.json() : await r.text();
  if (r.status === 403) {
    const why = "this tab has no access any more (was lw-cockpit restarted?): open a new URL from it. " + String(data).trim();
    denied(why);
    throw new AccessError(why);
  }
  if (!r.ok) throw new Error((data && data.error) || String(data) || r.statusText);
  return data;
}

// Runs the fetch of one topic at a time; an event during it runs it again after.
async function refresh(topic) {
  if (state.busy[topic]) { state.dirty[topic] = true; return; }
  state.busy[topic] = true;
  try {
    do {
      state.dirty[topic] = false;
      await LOADERS[topic]();
    } while (state.dirty[topic]);
  } catch (e) {
    note("cannot load " + topic + ": " + e.message, true);
  } finally {
    state.busy[topic] = false;
  }
}

function note(text, bad) {
  const n = $("action-result");
  n.textContent = vis(text);
  n.className = bad ? "note error" : "note";
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

// A link to a published port, built from numbers only.
function portLink(p) {
  const host = p.ip && /^[0-9.]+$/.test(p.ip) ? p.ip : "127.0.0.1";
  const port = Number(p.host);
  if (!Number.isInteger(port) || port <= 0 || port > 65535) return el("span", {}, p.container);
  return el("a", { href: "http://" + host + ":" + port + "/", rel: "noopener noreferrer", target: "_blank" },
    p.container + " → " + host + ":" + port);
}

// The state as the engine says it (lw-sandbox ls's word), else the record's
// with why the engine's word is missing.
function stateOf(s, engine) {
  if (s.listed) return s.listed.state_text;
  if (!s.image) return s.state;
  if (engine.state === "unreachable") return s.state + " (engine unreachable)";
  if (engine.state === "checking") return s.state + " (asking the engine)";
  return s.state + " (not listed by the engine)";
}

function agentOf(s) {
  if (!s.kit) return "-";
  const parts = [s.kit];
  const a = s.listed && s.listed.agent;
  if (a) parts.push("model proxy " + (a.model_proxy_down ? "DOWN" : a.model_proxy), a.tokens_hour + " tokens/h");
  parts.push("last request " + (s.last_model_request || "none"));
  return parts.join(", ");
}

function statOf(s) {
  const t = s.stat;
  if (!t) return "-";
  return t.ahead + " ahead; " + t.files + " file" + (t.files === 1 ? "" : "s") + " +" + t.insertions + " −" + t.deletions;
}

function engineLine(e, every) {
  const n = $("engine-status");
  if (e.state === "unreachable") {
    n.textContent = vis("engine unreachable: " + (e.error || "") + " (showing lw-sandbox's records; asking again every " + every + " s)");
    n.className = "note error";
  } else if (e.state === "checking") {
    n.textContent = "asking the engine…";
    n.className = "note";
  } else {
    n.textContent = vis("engine " + (e.address || "") + ", asked " + (e.checked || "") + " (again every " + every + " s while this page is open)");
    n.className = "note";
  }
}

// One sandbox's row.
function sandboxRow(s, engine) {
  const ports = el("td", {});
  s.ports.forEach((p, i) => { if (i) ports.append(", "); ports.append(portLink(p)); });
  const diff = el("button", { type: "button", on: { click: () => showDiff(s.name) } }, "diff");
  const runtime = (s.listed && s.listed.runtime) || s.runtime;
  return el("tr", { "data-name": vis(s.name) },
    el("td", { class: "name" }, s.name + (s.host ? " @" + s.host : "")),
    el("td", { class: "state" }, stateOf(s, engine)),
    el("td", { class: "engine" }, (s.engine || (s.image && engine.address) || "-") + " / " + (runtime || "-")),
    el("td", { class: "agent" }, agentOf(s)),
    el("td", { class: "branch" }, s.branch || "-"),
    el("td", { class: "stat" }, statOf(s)),
    el("td", {}, s.scope.join(", ") || "-"),
    ports,
    el("td", {}, diff));
}

// Only the cells of a sandbox that changed are made again, in place: the
// others (and the focus, a selection in them) stay as they are.
async function loadSandboxes() {
  // Told to look again when nothing shown changed: 304, nothing to draw.
  const d = await api("/api/sandboxes", undefined, state.tags["/api/sandboxes"]);
  if (!d) return;
  state.sandboxes = d.sandboxes;
  engineLine(d.engine, d.refresh_secs);
  const body = $("sandboxes").tBodies[0];
  const engine = { state: d.engine.state, address: d.engine.address };
  const old = new Map(Array.from(body.rows).map((r) => [r.dataset.name, r]));
  let at = body.firstChild;
  for (const s of d.sandboxes) {
    const sig = JSON.stringify([s, engine]);
    let row = old.get(vis(s.name));
    if (!row) {
      row = sandboxRow(s, d.engine);
      row.lwSig = sig;
    } else if (row.lwSig !== sig) {
      // Cell by cell: when the engine's answer changes every row's state,
      // the name and the diff button (and the focus on it) stay.
      const fresh = Array.from(sandboxRow(s, d.engine).cells);
      fresh.forEach((c, i) => {
        const was = row.cells[i];
        if (!was) row.append(c);
        else if (was.outerHTML !== c.outerHTML) was.replaceWith(c);
      });
      while (row.cells.length > fresh.length) row.lastChild.remove();
      row.lwSig = sig;
    }
    old.delete(vis(s.name));
    if (row !== at) body.insertBefore(row, at);
    at = row.nextSibling;
  }
  for (const r of old.values()) r.remove();
  $("sandbox-count").textContent = "(" + d.sandboxes.length + ")";
  const sel = $("filter-sandbox");
  const names = d.sandboxes.map((s) => s.name);
  if (JSON.stringify(names) !== JSON.stringify(Array.from(sel.options).slice(1).map((o) => o.value))) {
    const keep = sel.value;
    while (sel.options.length > 1) sel.remove(1);
    for (const n of names) sel.append(el("option", { value: n }, n));
    sel.value = keep;
  }
}

function logQuery(before) {
  const q = new URLSearchParams({ limit: String(PAGE) });
  if ($("filter-sandbox").value) q.set("sandbox", $("filter-sandbox").value);
  if ($("filter-kind").value) q.set("kind", $("filter-kind").value);
  if (before) q.set("before", before);
  return "/api/log?" + q.toString();
}

function logRow(e) {
  const to = e.to.length ? e.to.join(", ") : "-";
  // Reached with Tab, opened with Enter or Space, as a button would be.
  const open = (ev) => {
    if (ev.type === "keydown" && ev.key !== "Enter" && ev.key !== " ") return;
    ev.preventDefault();
    showEntry(e.name).catch((err) => note(err.message, true));
  };
  return el("tr", { "data-name": vis(e.name), class: "entry", tabindex: "0",
    "aria-label": "open " + vis(e.subject || e.kind || e.name), on: { click: open, keydown: open } },
    el("td", {}, e.logged),
    el("td", { class: "route" }, e.sender + " → " + to),
    el("td", { class: "kind" }, e.kind || "-"),
    el("td", { class: "subject" }, e.subject || ""),
    el("td", { class: "decision decision-" + e.action.replace(/[^a-z-]/g, "") }, e.action),
    el("td", { class: "rule" }, e.reason));
}

function drawLog() {
  const body = $("log").tBodies[0];
  clear(body);
  for (const e of state.log) body.append(logRow(e));
  $("older").hidden = !state.next;
}

// The newest page again; older pages already loaded stay below it.
async function loadLog() {
  const d = await api(logQuery());
  const last = d.entries.length ? d.entries[d.entries.length - 1].key : null;
  const older = last && d.next ? state.log.filter((e) => e.key < last) : [];
  state.log = d.entries.concat(older);
  if (!older.length) state.next = d.next;
  $("log-count").textContent = "(" + d.total + " entries)";
  drawLog();
}

async function loadOlder() {
  const d = await api(logQuery(state.next));
  state.log = state.log.concat(d.entries);
  state.next = d.next;
  drawLog();
}

function showDetail(title, text) {
  $("detail-section").hidden = false;
  $("detail-title").textContent = vis(title);
  $("detail").textContent = vis(text, true);
  $("detail-section").scrollIntoView();
}

async function showEntry(name) {
  const e = await api("/api/entry?name=" + encodeURIComponent(name));
  const m = e.message;
  const head = [
    "entry:   " + e.name, "logged:  " + e.logged, "from:    " + e.sender,
    "to:      " + e.decision.to.join(", "), "action:  " + e.decision.action,
    "rule:    " + e.decision.reason,
  ];
  if (m) head.push("kind:    " + m.kind, "subject: " + m.subject, "refs:    " + m.refs.join(", "), "", m.body);
  showDetail("Message " + e.message_id, head.join("\n"));
}

async function showDiff(name) {
  showDetail("Diff of " + name, "loading…");
  showDetail("Diff of " + name, await api("/api/diff?sandbox=" + encodeURIComponent(name)));
}

// Runs an action once: its controls are disabled while it is sent (a
// double click sends one), and again usable only when it failed.
async function act(path, body, what, controls) {
  if (controls.some((c) => c.disabled)) return;
  for (const c of controls) c.disabled = true;
  try {
    const r = await api(path, body);
    note(what + ": " + JSON.stringify(r));
  } catch (e) {
    note(what + " failed: " + e.message, true);
    for (const c of controls) c.disabled = false;
  }
  refresh("queues");
}

// A queued message's recipients and body (as the log keeps it), as text.
function message(q) {
  const to = el("div", { class: "to" }, "to: " + ((q.to || []).join(", ") || "-"));
  const body = el("pre", { class: "body" });
  body.textContent = q.body === null || q.body === undefined ? "(no body in the log)" : vis(q.body, true);
  return [to, body];
}

function questionItem(q) {
  const text = el("textarea", { "aria-label": "answer", class: "answer-text" });
  const send = el("button", { type: "button", class: "answer", on: { click: () => {
    if (text.value.trim()) act("/api/answer", { id: q.id, text: text.value }, "answered " + q.id, [send, text]);
  } } }, "answer");
  return el("li", { "data-id": vis(q.id) },
    el("div", { class: "subject" }, q.sender + ": " + q.kind + " “" + q.subject + "”"),
    ...message(q), el("div", { class: "note" }, q.reason), text, send);
}

function heldItem(h) {
  const reason = el("input", { type: "text", placeholder: "reason to drop", class: "drop-reason" });
  const release = el("button", { type: "button", class: "release", on: { click: () =>
    act("/api/release", { id: h.id }, "released " + h.id, [release, drop, reason]) } }, "release");
  const drop = el("button", { type: "button", class: "drop", on: { click: () =>
    act("/api/drop", { id: h.id, reason: reason.value }, "dropped " + h.id, [release, drop, reason]) } }, "drop");
  return el("li", { "data-id": vis(h.id) },
    el("div", { class: "subject" }, h.sender + ": " + h.kind + " “" + h.subject + "”"),
    ...message(h), el("div", { class: "note" }, h.reason), reason, release, drop);
}

async function loadQueues() {
  const d = await api("/api/queues");
  for (const [id, items, make] of [["human", d.human, questionItem], ["held", d.held, heldItem]]) {
    const list = $(id);
    // Keep a half-written answer: only items that changed are redrawn.
    const want = new Set(items.map((q) => vis(q.id)));
    for (const li of Array.from(list.children)) if (!want.has(li.dataset.id)) li.remove();
    const have = new Set(Array.from(list.children).map((li) => li.dataset.id));
    for (const q of items) if (!have.has(vis(q.id))) list.append(make(q));
    $(id + "-count").textContent = "(" + items.length + ")";
  }
}

// A link to a GitHub issue: only the address the server built from a
// plain OWNER/REPO#N on the GitHub lw-sync posts to (its api_url's).
function issueLink(t) {
  if (!t.url || !/^https:\/\/[A-Za-z0-9.:-]+\/[\w.-]+\/[\w.-]+\/issues\/[0-9]+$/.test(t.url)) return el("span", {}, t.target);
  return el("a", { href: t.url, rel: "noopener noreferrer", target: "_blank" }, t.target);
}

async function loadState() {
  const d = await api("/api/state");
  const sync = $("sync");
  clear(sync);
  if (!d.sync) sync.append(el("p", { class: "note" }, "lw-sync has not run on this root"));
  else if (d.sync.error) sync.append(el("p", { class: "error" }, d.sync.error));
  else {
    for (const t of d.sync.targets)
      sync.append(el("p", { class: "target" }, issueLink(t), ": " + t.synced + " entries synced, " + t.in_flight + " in flight"));
    if (d.sync.not_synced !== null)
      sync.append(el("p", { class: "pending" }, d.sync.not_synced + " log entries on no issue yet (quiet ones are never posted)"));
    sync.append(el("p", { class: "note last-error" }, "last error: " + (d.sync.last_error || "not known: " + d.sync.last_error_note)));
  }
  const radar = $("radar");
  clear(radar);
  if (!d.radar) radar.append(el("p", { class: "note" }, "lw-radar has not run on this root"));
  else if (!d.radar.pairs.length) radar.append(el("p", { class: "note" }, "no conflicts between task branches"));
  else for (const p of d.radar.pairs)
    radar.append(el("p", { class: "conflict" }, p.a + " × " + p.b + ": " + p.announced.join(", ")));
}

const LOADERS = { sandboxes: loadSandboxes, log: loadLog, queues: loadQueues, state: loadState };

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

// The event stream (server-sent events), read with fetch so that it carries
// this tab's secret in a header.  A dropped stream is opened again, and
// everything is fetched again then (what changed meanwhile was not told).
async function listen() {
  let wait = 250, again = false, lost = false;
  for (;;) {
    try {
      const r = await fetch("/api/events", { headers: { "x-lw-session": secret }, credentials: "omit", cache: "no-store" });
      if (r.status === 403) {
        denied(lost ? "lw-cockpit was restarted: this tab's access ended with it; open the URL it printed when it started again"
          : "this tab has no access any more (was lw-cockpit restarted?): open a new URL from it");
        return;
      }
      if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
      $("live").textContent = "live"; $("live").className = "live"; $("live").title = "";
      lost = false;
      delete document.body.dataset.conn;
      wait = 250;
      if (again) for (const t of Object.keys(LOADERS)) refresh(t);
      again = true;
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n?/g, "\n");
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let ev = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) ev = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (ev === "change" && LOADERS[data]) refresh(data);
        }
      }
    } catch (e) {
      // The server is gone or the connection broke: try again below.
    }
    // Say why, and what to do: the server may be gone for good.
    lost = true;
    document.body.dataset.conn = "lost";
    $("live").textContent = "reconnecting: lw-cockpit does not answer (stopped, or restarting?); trying again every " +
      Math.ceil(Math.min(wait * 2, 4000) / 1000) + " s";
    $("live").title = "if it was restarted, open the URL it printed then: this tab's access ended with the old one";
    $("live").className = "live off";
    await sleep(wait);
    wait = Math.min(wait * 2, 4000);
  }
}

// Another tab of its own: a new ticket, opened apart from this page.
async function newTab() {
  try {
    const r = await api("/api/ticket", {});
    window.open(r.url, "_blank", "noopener,noreferrer");
  } catch (e) {
    note("cannot open another tab: " + e.message, true);
  }
}

async function start() {
  await session();
  const meta = await api("/api/meta");
  $("root").textContent = vis(meta.root);
  $("operator").textContent = vis("acting as " + meta.operator);
  for (const k of meta.kinds) $("filter-kind").append(el("option", { value: k }, k));
  const refilter = () => { state.log = []; state.next = null; refresh("log"); };
  $("filter-sandbox").addEventListener("change", refilter);
  $("filter-kind").addEventListener("change", refilter);
  $("older").addEventListener("click", () => loadOlder().catch((e) => note(e.message, true)));
  $("detail-close").addEventListener("click", () => { $("detail-section").hidden = true; });
  $("new-tab").addEventListener("click", newTab);
  listen();
  await Promise.all(Object.keys(LOADERS).map(refresh));
  document.body.dataset.ready = "1";
}

start().catch((e) => {
  if (e instanceof AccessError) denied(e.message);
  else note("cannot start: " + e.message, true);
});
