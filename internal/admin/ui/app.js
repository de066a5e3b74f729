// The page map: reads the admin API once, then follows /admin/events.
// Requests carry the admin key the browser logged in with (HTTP Basic on
// this origin); nothing is loaded from anywhere else.
"use strict";

const maxEvents = 200;
let lastSeq = 0;
let updates = 0;

function hue(tenant) {
  // FNV-1a, so a tenant keeps its colour across reloads and nodes.
  let h = 0x811c9dc5;
  for (let i = 0; i < tenant.length; i++) {
    h ^= tenant.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % 360;
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function poolSection(name) {
  const id = "pool-" + name;
  let sec = document.getElementById(id);
  if (sec) return sec;
  sec = el("div", { id: id, class: "pool", "data-node": name });
  sec.append(el("h3", {}, "KV pool · " + name), el("div", { class: "summary" }), el("div", { class: "grid" }));
  document.getElementById("pools").append(sec);
  return sec;
}

function title(p) {
  const parts = ["page " + p.id, p.state];
  if (p.tenant) parts.push("tenant " + p.tenant);
  if (p.request) parts.push("request " + p.request);
  if (p.seq) parts.push("sequence " + p.seq);
  if (p.epoch) parts.push("epoch " + p.epoch);
  parts.push("filled " + p.filled);
  if (p.refs) parts.push("refs " + p.refs);
  return parts.join(" · ");
}

function renderPages(view) {
  for (const node of view.nodes) {
    const sec = poolSection(node.name);
    const summary = sec.querySelector(".summary");
    const grid = sec.querySelector(".grid");
    if (node.error) {
      summary.className = "summary error";
      summary.textContent = "snapshot failed: " + node.error;
      continue;
    }
    summary.className = "summary";
    const c = node.counts;
    summary.textContent = node.total_pages + " pages of " + node.page_size + " tokens: " +
      c.free + " free, " + c.owned + " owned, " + c.shared + " shared, " + c.cached + " cached, " +
      c.transfer + " in transfer, " + c.quarantined + " quarantined";
    while (grid.children.length < node.total_pages) {
      const frag = document.createDocumentFragment();
      for (let i = grid.children.length; i < node.total_pages; i++) {
        frag.append(el("div", { class: "cell", "data-id": String(i + 1), "data-state": "free", title: "page " + (i + 1) + " · free" }));
      }
      grid.append(frag);
    }
    while (grid.children.length > node.total_pages) grid.lastChild.remove();
    const used = new Map(node.pages.map((p) => [p.id, p]));
    const cells = grid.children;
    for (let i = 0; i < cells.length; i++) {
      const cell = cells[i];
      const p = used.get(i + 1) || { id: i + 1, state: "free", filled: 0 };
      const t = title(p);
      if (cell.title === t) continue;
      cell.title = t;
      cell.dataset.state = p.state;
      if (p.tenant) {
        cell.dataset.tenant = p.tenant;
        cell.style.setProperty("--hue", hue(p.tenant));
      } else {
        delete cell.dataset.tenant;
        cell.style.removeProperty("--hue");
      }
    }
  }
}

function renderTenants(view) {
  const body = document.querySelector("#tenants tbody");
  body.replaceChildren();
  for (const t of view.tenants) {
    const tr = el("tr", { "data-tenant": t.tenant });
    const name = el("td");
    const dot = el("span", { class: "tenant-dot" });
    dot.style.setProperty("--hue", hue(t.tenant));
    name.append(dot, document.createTextNode(t.tenant));
    tr.append(name, el("td", {}, String(t.pages)), el("td", {}, String(t.queued)), el("td", {}, String(t.running)));
    body.append(tr);
  }
  const z = view.must_be_zero;
  let quarantined = 0;
  for (const n of view.nodes) quarantined += n.quarantined_pages;
  const counters = document.getElementById("counters");
  counters.replaceChildren();
  for (const [key, label, v] of [
    ["isolation_violations", "isolation violations", z.isolation_violations],
    ["owner_mismatches", "owner mismatches", z.owner_mismatches],
    ["aborted_but_completed", "aborted but completed", z.aborted_but_completed],
    ["quarantined_pages", "quarantined pages", quarantined],
  ]) {
    const d = el("div", { class: "counter", id: "counter-" + key, "data-bad": String(v !== 0) }, label);
    d.append(el("b", {}, String(v)));
    counters.append(d);
  }
}

function addEvent(e) {
  if (e.seq <= lastSeq) return;
  lastSeq = e.seq;
  const list = document.getElementById("events");
  const li = el("li", { "data-level": e.level, "data-seq": String(e.seq), value: String(e.seq) });
  li.append(document.createTextNode(e.time + " " + e.level + " " + e.message + " "));
  const attrs = Object.entries(e.attrs || {}).map(([k, v]) => k + "=" + v).join(" ");
  li.append(el("span", { class: "attrs" }, attrs));
  list.prepend(li);
  while (list.children.length > maxEvents) list.lastChild.remove();
}

function setStatus(state, text) {
  const s = document.getElementById("status");
  s.dataset.state = state;
  s.textContent = text;
}

function applyState(st) {
  renderPages(st.pages);
  renderTenants(st.tenants);
  updates++;
  document.body.dataset.updates = String(updates);
  setStatus("live", "live · " + st.pages.time);
}

async function getJSON(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

async function start() {
  try {
    const [pages, tenants, events] = await Promise.all([
      getJSON("api/pages"), getJSON("api/tenants"), getJSON("api/events"),
    ]);
    applyState({ pages: pages, tenants: tenants });
    for (const e of events.events) addEvent(e);
  } catch (err) {
    setStatus("error", String(err));
  }
  const es = new EventSource("events");
  es.addEventListener("state", (m) => applyState(JSON.parse(m.data)));
  es.addEventListener("audit", (m) => addEvent(JSON.parse(m.data)));
  es.onerror = () => setStatus("error", "disconnected; retrying…");
}

start();
