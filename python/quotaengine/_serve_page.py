"""The live page of ``quotaengine serve`` (SPEC 27.3): one self-contained HTML document,
its style and script inline, that redraws itself from ``/api/snapshot`` every 2 s."""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>quotaengine</title>
<style>
:root {
  --bg: #f5f6f8; --card: #fff; --ink: #1d2430; --mute: #6b7585; --line: #e2e6ec;
  --used: #3b82f6; --flight: #93c5fd; --warn: #f59e0b; --full: #dc2626; --ok: #16a34a;
  --track: #edf0f4;
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header { position: sticky; top: 0; z-index: 1; background: #1d2430; color: #fff;
  padding: 10px 20px; display: flex; flex-wrap: wrap; gap: 4px 16px; align-items: baseline; }
header h1 { font-size: 17px; margin: 0; font-weight: 650; letter-spacing: .2px; }
header .path { color: #b8c2d0; overflow-wrap: anywhere; min-width: 0; }
header .status { margin-left: auto; color: #b8c2d0; font-variant-numeric: tabular-nums; }
.dot { display: inline-block; width: 8px; height: 8px; border-radius: 50%; background: var(--ok);
  margin-right: 6px; vertical-align: 1px; }
.dot.stale { background: var(--full); }
main { max-width: 1400px; margin: 0 auto; padding: 14px 20px 40px; }
h2 { font-size: 15px; margin: 22px 0 10px; color: var(--mute); text-transform: uppercase; letter-spacing: .6px; }
h2 .count { font-weight: 400; }
h3 { font-size: 16px; margin: 16px 0 8px; }
.summary { display: flex; flex-wrap: wrap; gap: 10px; }
.tile { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 120px; }
.tile b { display: block; font-size: 22px; font-variant-numeric: tabular-nums; }
.tile span { color: var(--mute); font-size: 12px; }
#platforms { display: flex; flex-wrap: wrap; gap: 0 28px; align-items: flex-start; }
#platforms > section { flex: 0 1 auto; min-width: 0; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
.route { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px;
  width: 290px; min-width: 0; }
.route.benched { border-color: #fca5a5; box-shadow: inset 3px 0 0 var(--full); }
.route .name { font-weight: 600; overflow-wrap: anywhere; }
.route .key { color: var(--mute); font-weight: 400; }
.badges { display: flex; flex-wrap: wrap; gap: 6px; margin: 6px 0 4px; }
.badge { font-size: 12px; border-radius: 10px; padding: 1px 8px; background: var(--track); color: var(--ink); }
.badge.cooldown { background: #fee2e2; color: #991b1b; }
.badge.forecast { background: #fef3c7; color: #92400e; }
.badge.flight { background: #dbeafe; color: #1e40af; }
.win { margin-top: 6px; }
.win .label { display: flex; justify-content: space-between; gap: 8px; font-size: 12px; color: var(--mute); }
.win .label .v { color: var(--ink); font-variant-numeric: tabular-nums; white-space: nowrap; }
.bar { position: relative; height: 8px; background: var(--track); border-radius: 4px; overflow: hidden; margin-top: 2px; display: flex; }
.bar .used { background: var(--used); }
.bar .flight { background: var(--flight); }
.bar.hot .used { background: var(--warn); }
.bar.full .used { background: var(--full); }
.nolimit { font-size: 12px; color: var(--mute); }
.panel { background: var(--card); border: 1px solid var(--line); border-radius: 8px; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 10px; border-top: 1px solid var(--line); vertical-align: middle; }
th { border-top: 0; color: var(--mute); font-weight: 500; font-size: 12px; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
td .bar { min-width: 80px; }
.warnings li { padding: 6px 10px; border-top: 1px solid var(--line); overflow-wrap: anywhere; }
.warnings li:first-child { border-top: 0; }
.warnings ul { list-style: none; margin: 0; padding: 0; }
.lvl { font-size: 11px; font-weight: 600; text-transform: uppercase; margin-right: 6px; color: #b45309; }
.lvl.error { color: var(--full); }
.when { color: var(--mute); font-variant-numeric: tabular-nums; margin-right: 6px; }
.empty { color: var(--mute); padding: 8px 10px; }
#error { display: none; background: #fee2e2; color: #991b1b; padding: 8px 12px; border-radius: 6px; margin-top: 10px; }
@media (max-width: 600px) {
  header { padding: 8px 12px; }
  header .status { margin-left: 0; }
  main { padding: 8px 10px 30px; }
  .summary { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 6px; }
  .tile { min-width: 0; padding: 6px 8px; }
  .tile b { font-size: 18px; }
  .tile span { font-size: 11px; }
  #platforms > section { flex: 1 1 100%; }
  .route { width: 100%; }
  th, td { padding: 5px 6px; }
  .hide-narrow { display: none; }
}
</style>
</head>
<body>
<header>
  <h1>quotaengine</h1>
  <span class="path" id="path"></span>
  <span class="status"><span class="dot" id="dot"></span><span id="updated">loading…</span></span>
</header>
<main>
  <div id="error"></div>
  <div class="summary" id="summary"></div>
  <div id="platforms"></div>
  <h2>Tenants <span class="count" id="tenant-count"></span></h2>
  <div class="panel"><table id="tenants"><thead><tr><th>tenant</th><th>window</th><th>used / limit</th>
    <th style="width:30%">fill</th><th class="hide-narrow">runs out</th></tr></thead><tbody></tbody></table></div>
  <h2>Recent warnings <span class="count" id="warning-count"></span></h2>
  <div class="panel warnings"><ul id="warnings"></ul></div>
</main>
<script>
"use strict";
const CLASSIC = ["rpm", "rpd", "tpm", "tpd"];
let last = null, fetchedAt = 0;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}
function num(v) { return Number(v).toLocaleString("en-US"); }
function amount(win, v) {
  if (/(^|:)cost\//.test(win)) return "$" + (v / 1e6).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 6});
  return num(v);
}
function left(ms) {
  let s = Math.max(0, Math.floor(ms / 1000));
  if (s >= 86400) return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
  if (s >= 3600) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  if (s >= 60) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return s + "s";
}
function clockTime(ms, nowMs) {
  const d = new Date(ms), n = new Date(nowMs);
  if (isNaN(d.getTime())) return "after year 9999";
  const hm = d.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", hour12: false});
  return d.toDateString() === n.toDateString() ? hm : d.toLocaleDateString() + " " + hm;
}
function now() { return last ? last.generated_at_ms + (Date.now() - fetchedAt) : Date.now(); }
function routeId(r) { return r.platform + "/" + r.model_id + "/" + (r.key_id === null ? "*" : r.key_id); }

function bar(used, flight, limit) {
  const b = el("div", {class: "bar"});
  const pct = x => +x.toFixed(2);
  const u = pct(Math.min(100, 100 * used / limit)), f = pct(Math.max(0, Math.min(100 - u, 100 * flight / limit)));
  const fill = (used + flight) / limit;
  if (fill >= 1) b.classList.add("full"); else if (fill >= 0.8) b.classList.add("hot");
  b.append(el("div", {class: "used", style: "width:" + u + "%"}), el("div", {class: "flight", style: "width:" + f + "%"}));
  b.setAttribute("data-used", used); b.setAttribute("data-limit", limit); b.setAttribute("data-in-flight", flight);
  return b;
}

function windowsOf(r) {
  const names = [...CLASSIC];
  for (const k of Object.keys(r)) {
    if (k.endsWith("_used")) { const w = k.slice(0, -5); if (!names.includes(w)) names.push(w); }
  }
  const out = [];
  for (const w of names) {
    const used = r[w + "_used"], limit = r[w + "_limit"];
    if (used === undefined || used === null) continue;
    if (limit === null || limit === undefined) { if (used > 0) out.push({w, used, limit: null}); continue; }
    out.push({w, used, limit});
  }
  return out;
}
function isRequests(w) { return w === "rpm" || w === "rpd" || w.startsWith("requests/"); }

function routeCard(r, cds, fcs, t) {
  const id = routeId(r);
  const card = el("div", {class: "route", "data-route": id});
  card.append(el("div", {class: "name"}, r.model_id + " ", el("span", {class: "key", text: "key " + r.key_id})));
  const badges = el("div", {class: "badges"});
  for (const c of cds) {
    const ms = c.expires_at_ms - t;
    if (ms <= 0) continue;
    card.classList.add("benched");
    badges.append(el("span", {class: "badge cooldown", "data-cooldown": c.source, "data-left-ms": ms,
      text: "cooling down " + left(ms) + " (" + c.source + (c.key_id === null ? ", every key" : "") + ")"}));
  }
  if (r.in_flight > 0) badges.append(el("span", {class: "badge flight", text: r.in_flight + " in flight"}));
  const soon = fcs.filter(f => f.exhausts_at_ms !== null).sort((a, b) => a.exhausts_at_ms - b.exhausts_at_ms)[0];
  if (soon) badges.append(el("span", {class: "badge forecast", "data-forecast": soon.window,
      text: soon.window + " runs out " + (soon.exhausts_at_ms <= t ? "now" : "at " + clockTime(soon.exhausts_at_ms, t) + " (in " + left(soon.exhausts_at_ms - t) + ")")}));
  if (badges.childElementCount) card.append(badges);
  const wins = windowsOf(r);
  for (const {w, used, limit} of wins) {
    const flight = isRequests(w) ? r.in_flight : 0;
    const value = limit === null ? amount(w, used) + " (no limit)"
      : amount(w, used) + " / " + amount(w, limit) + (flight ? " +" + flight : "");
    const row = el("div", {class: "win", "data-window": w},
      el("div", {class: "label"}, el("span", {text: w}), el("span", {class: "v", text: value})));
    if (limit !== null) row.append(bar(used, flight, limit));
    card.append(row);
  }
  if (!wins.length) card.append(el("div", {class: "nolimit", text: "no usage today"}));
  return card;
}

function render(s) {
  const t = now();
  document.getElementById("path").textContent = s.path;
  const cdsBy = new Map(), fcBy = new Map();
  for (const c of s.cooldowns) {
    const k = c.platform + "/" + c.model_id;
    if (!cdsBy.has(k)) cdsBy.set(k, []);
    cdsBy.get(k).push(c);
  }
  for (const f of s.forecasts) {
    const k = routeId(f);
    if (!fcBy.has(k)) fcBy.set(k, []);
    fcBy.get(k).push(f);
  }
  const byPlatform = new Map();
  for (const r of s.routes) {
    if (!byPlatform.has(r.platform)) byPlatform.set(r.platform, []);
    byPlatform.get(r.platform).push(r);
  }
  const benched = s.cooldowns.filter(c => c.expires_at_ms > t).length;
  const soonest = s.forecasts.filter(f => f.exhausts_at_ms !== null).length;
  const summary = document.getElementById("summary");
  summary.replaceChildren(
    el("div", {class: "tile"}, el("b", {text: s.routes.length}), el("span", {text: "routes active today"})),
    el("div", {class: "tile"}, el("b", {text: benched}), el("span", {text: "cooldowns active"})),
    el("div", {class: "tile"}, el("b", {text: soonest}), el("span", {text: "windows running out"})),
    el("div", {class: "tile"}, el("b", {text: s.routes.reduce((a, r) => a + r.in_flight, 0)}), el("span", {text: "calls in flight"})),
    el("div", {class: "tile"}, el("b", {text: new Set(s.tenants.map(x => x.tenant)).size}), el("span", {text: "tenants"})));
  const box = document.getElementById("platforms");
  const sections = [];
  for (const [p, routes] of [...byPlatform.entries()].sort()) {
    const grid = el("div", {class: "grid"});
    for (const r of routes) {
      const cds = (cdsBy.get(r.platform + "/" + r.model_id) || []).filter(c => c.key_id === null || c.key_id === r.key_id);
      grid.append(routeCard(r, cds, fcBy.get(routeId(r)) || [], t));
    }
    sections.push(el("section", {class: "platform", "data-platform": p},
      el("h2", {}, p + " ", el("span", {class: "count", text: "· " + routes.length + (routes.length === 1 ? " route" : " routes")})), grid));
  }
  if (!sections.length) sections.push(el("p", {class: "empty", text: "No route has usage today, a lease or a cooldown."}));
  box.replaceChildren(...sections);

  const tbody = document.querySelector("#tenants tbody");
  const rows = s.tenants.map(x => el("tr", {"data-tenant": x.tenant, "data-window": x.window},
    el("td", {text: x.tenant}), el("td", {text: x.window}),
    el("td", {class: "num", text: amount(x.window, x.used) + " / " + amount(x.window, x.limit) + (x.in_flight ? " +" + amount(x.window, x.in_flight) : "")}),
    el("td", {}, bar(x.used, x.in_flight, x.limit)),
    el("td", {class: "num hide-narrow", text: x.exhausts_at_ms === null ? "—" : clockTime(x.exhausts_at_ms, t)})));
  if (!rows.length) rows.push(el("tr", {}, el("td", {class: "empty", colspan: "5", text: "No tenant has limits or usage today."})));
  tbody.replaceChildren(...rows);
  document.getElementById("tenant-count").textContent = "· " + new Set(s.tenants.map(x => x.tenant)).size;

  const ul = document.getElementById("warnings");
  const items = s.warnings.map(w => el("li", {"data-level": w.level},
    el("span", {class: "lvl " + w.level, text: w.level}),
    el("span", {class: "when", text: clockTime(w.created_at_ms, t)}),
    (w.event ? w.event + ": " : "") + w.message));
  if (!items.length) items.push(el("li", {class: "empty", text: "No warnings."}));
  ul.replaceChildren(...items);
  document.getElementById("warning-count").textContent = "· " + s.warnings.length;
}

async function refresh() {
  try {
    const r = await fetch("/api/snapshot", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    last = s; fetchedAt = Date.now();
    render(s);
    document.getElementById("error").style.display = "none";
    document.getElementById("dot").classList.remove("stale");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString([], {hour12: false});
    document.body.setAttribute("data-generated-at", s.generated_at_ms);
  } catch (err) {
    const e = document.getElementById("error");
    e.textContent = "Cannot read /api/snapshot (" + err.message + "); retrying every 2 s.";
    e.style.display = "block";
    document.getElementById("dot").classList.add("stale");
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
