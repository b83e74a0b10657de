"""The dashboard's single HTML page: inline CSS, SVG and JavaScript, no external resources (it
must render offline). The server inlines every panel's data; the script then polls
``/api/summary`` and reloads the panels when the run's files change."""

from __future__ import annotations

import json


def render_page(data: dict, poll_seconds: float = 3.0) -> str:
    """The page with ``data`` (``{panel: json}``) inlined."""
    blob = json.dumps(data).replace("<", "\\u003c")  # nothing in the data can close the script tag
    return _PAGE.replace("__DATA__", blob).replace("__POLL_MS__", str(int(poll_seconds * 1000)))


_PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>autocurricula dashboard</title>
<style>
:root { --fg:#1d2330; --muted:#6b7385; --line:#dde1e8; --bg:#f5f6f8; --card:#fff; --accent:#3b6fd8; }
* { box-sizing: border-box; }
body { margin:0; font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; color:var(--fg); background:var(--bg); }
header { display:flex; gap:18px; align-items:baseline; padding:10px 18px; background:#1d2330; color:#fff; }
header h1 { font-size:16px; margin:0; font-weight:600; }
header .stat { color:#c9cfdb; } header .stat b { color:#fff; font-weight:600; }
#live { margin-left:auto; font-size:12px; color:#9fe0a8; }
#live.stale { color:#f0c36b; }
main { display:grid; grid-template-columns: minmax(0,1.45fr) minmax(0,1fr); gap:12px; padding:12px 18px; }
section { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:10px 12px; min-width:0; overflow-x:auto; }
section h2 { font-size:13px; margin:0 0 8px; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); }
.wide { grid-column: 1 / -1; }
table { border-collapse:collapse; width:100%; }
th, td { padding:3px 5px; border-bottom:1px solid var(--line); text-align:left; white-space:nowrap; }
th { color:var(--muted); font-weight:600; font-size:12px; }
td.num { text-align:right; font-variant-numeric: tabular-nums; }
.ci { color:var(--muted); font-size:11px; }
.dot { display:inline-block; width:9px; height:9px; border-radius:50%; margin-right:5px; vertical-align:middle; }
.tag { font-size:11px; color:var(--muted); border:1px solid var(--line); border-radius:3px; padding:0 4px; margin-left:4px; }
.empty { color:var(--muted); font-style:italic; padding:8px 0; }
svg text { font-family: inherit; }
.scroll { overflow:auto; max-height:520px; }
.game { border-top:1px solid var(--line); padding:6px 0; }
.game .head { font-weight:600; }
.turn { margin:4px 0 4px 10px; }
.turn pre { margin:2px 0; padding:4px 6px; background:#f3f4f7; border-radius:4px; white-space:pre-wrap; word-break:break-word;
            font:12px/1.35 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; }
.turn pre.completion { background:#e8f0fe; }
a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
select { font:inherit; padding:2px 4px; }
label.ctl { font-size:12px; color:var(--muted); text-transform:none; letter-spacing:0; font-weight:normal; margin-left:10px; }
.legend { display:flex; flex-wrap:wrap; gap:2px 12px; margin-top:4px; font-size:11px; }
.legend span.item { white-space:nowrap; }
.legend .dim { opacity:.5; }
.curves { display:grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap:10px; }
.curve h3 { font-size:12px; margin:0 0 2px; font-weight:600; }
.flats { margin-top:6px; }
.flat { color:var(--muted); font-size:12px; padding:1px 0; }
tr.unrated td { color:var(--muted); }
td.wrap, .wrap { white-space:normal; word-break:break-all; }
.note { color:var(--muted); font-size:11px; margin-top:6px; white-space:normal; }
.lin { padding:2px 0; white-space:normal; }
.lin .marker { display:inline-block; width:10px; height:10px; margin-right:6px; vertical-align:middle; box-sizing:border-box; }
.lin .extra { color:var(--muted); font-size:11px; margin-left:6px; }
</style></head>
<body>
<header><h1>autocurricula</h1><span id="summary" class="stat"></span><span id="live">live</span></header>
<main>
<section><h2>Leaderboard <span id="lb-note" class="tag"></span></h2><div id="leaderboard"></div></section>
<section><h2>Elo over time <label class="ctl">role <select id="elo-role"></select></label>
<label class="ctl"><input type="checkbox" id="elo-smooth" checked> smoothed</label></h2><div id="elo"></div></section>
<section class="wide"><h2>Learning curves <label class="ctl">role <select id="curve-role"></select></label>
<label class="ctl">x axis <select id="curve-x"><option value="round">round</option></select></label></h2>
<div id="curves" class="curves"></div><div id="flat-curves" class="flats"></div></section>
<section><h2>Payoff (row's win rate against column, %)</h2><div id="payoff" class="scroll"></div></section>
<section><h2>Lineage</h2><div id="lineage" class="scroll"></div></section>
<section class="wide"><h2>Last games <select id="pair"></select></h2><div id="transcripts" class="scroll"></div></section>
<section class="wide"><h2>Adapters <span id="ad-note" class="tag"></span></h2><div id="adapters"></div></section>
</main>
<script>
"use strict";
const DATA = __DATA__;
const POLL_MS = __POLL_MS__;
const PALETTE = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f","#bcbd22","#17becf",
                 "#aec7e8","#ffbb78","#98df8a","#ff9896","#c5b0d5","#c49c94","#f7b6d2","#dbdb8d","#9edae5","#393b79"];
const colours = Object.create(null);  // no prototype: a player named "__proto__" is a player like any other
function colour(id) {
  if (!(id in colours)) colours[id] = PALETTE[Object.keys(colours).length % PALETTE.length];
  return colours[id];
}
// Every value that comes from the run's files goes into the HTML through esc(), numbers included
// (a "number" in metrics.jsonl may be any JSON); num() writes only the digits of a finite number.
function esc(s) {
  return String(s == null ? "" : s).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
}
function num(v, d) {
  if (v == null || !isFinite(v)) return "–";
  const t = Number(v).toFixed(d == null ? 0 : d);
  return /^-0\.?0*$/.test(t) ? t.slice(1) : t;  // no "-0.00"
}
function set(id, html) { document.getElementById(id).innerHTML = html; }
// A link may choose the filters: #role=main_agent&x=games (the page writes them there as they change).
const HASH = new URLSearchParams(location.hash.slice(1));
function chosen(sel, values, key) {  // the select's value kept across redraws; the link's on the first draw
  const want = sel.dataset.drawn ? sel.value : (HASH.get(key) || sel.value);
  sel.dataset.drawn = "1";
  if (values.includes(want)) sel.value = want;
  return sel.value;
}
function remember(key, value) {
  if (value) HASH.set(key, value); else HASH.delete(key);
  history.replaceState(null, "", HASH.toString() ? "#" + HASH.toString() : location.pathname + location.search);
}
function figure(v) {  // a number as a reader writes it: 4 significant digits, no "-0"
  if (v == null || !isFinite(v)) return "–";
  const t = String(Number(Number(v).toPrecision(4)));
  return t === "-0" ? "0" : t;
}
function empty(text) { return `<div class="empty">${esc(text)}</div>`; }

function renderSummary(s) {
  const parts = [["games", s.games], ["players", s.players], ["epoch", s.epoch], ["step", s.step], ["checkpoint", s.checkpoint || "none yet"]];
  set("summary", `<span title="${esc(s.output_dir)}">${esc(s.output_dir.split("/").slice(-1)[0])}</span> · ` +
      parts.map(([k, v]) => `${k} <b>${esc(v == null ? "–" : v)}</b>`).join(" · "));
}

function renderLeaderboard(lb) {
  const rows = lb.rows || [];
  document.getElementById("lb-note").textContent = lb.ci ? `BT ${Math.round(lb.ci * 100)}% CI, ${lb.bootstrap} bootstrap rounds` : "no CI yet";
  if (!rows.length) return set("leaderboard", empty("no games yet"));
  const los = rows.map(r => r.bt_low).filter(v => v != null), his = rows.map(r => r.bt_high).filter(v => v != null);
  const lo = Math.min(...los, 1e9), hi = Math.max(...his, -1e9), W = 56;
  const x = v => lo >= hi ? W / 2 : 4 + (v - lo) / (hi - lo) * (W - 8);
  const mix = rows.some(r => r.deploy != null);
  let h = `<table><tr><th>#</th><th>player</th><th>role</th><th class="num">Elo</th>
           <th class="num">BT (CI)</th><th>interval</th><th class="num">games</th>` +
      (mix ? `<th class="num" title="weight in the Nash mixture over the players with an adapter: the mixture to deploy">deploy</th>
              <th class="num" title="weight in the Nash mixture over every player, scripted ones included: the league's meta-strategy">nash (all)</th>` : "") + `</tr>`;
  for (const r of rows) {
    const rated = r.games > 0;
    const bar = r.bt == null ? "" : `<svg width="${W}" height="12"><title>${num(r.bt_low)} – ${num(r.bt_high)}</title><line x1="${num(x(r.bt_low), 2)}" x2="${num(x(r.bt_high), 2)}" y1="6" y2="6"
      stroke="${esc(colour(r.id))}" stroke-width="3" stroke-linecap="round"/><circle cx="${num(x(r.bt), 2)}" cy="6" r="3.5" fill="#1d2330"/></svg>`;
    const tags = (r.frozen && !r.scripted ? '<span class="tag">frozen</span>' : "") + (r.scripted ? '<span class="tag">scripted</span>' : "");
    h += `<tr class="${rated ? "" : "unrated"}"><td>${esc(r.rank)}</td><td><span class="dot" style="background:${esc(colour(r.id))}"></span>${esc(r.id)}${tags}</td>
          <td title="entered at epoch ${esc(r.epoch)}">${esc(r.role)}</td><td class="num">${rated ? num(r.elo) : "unrated"}</td>
          <td class="num">${r.bt == null ? "–" : `${num(r.bt)} <span class="ci">(${num(r.bt_low)}–${num(r.bt_high)})</span>`}</td>
          <td>${bar}</td><td class="num">${esc(r.games)}</td>` +
         (mix ? `<td class="num">${r.scripted ? "–" : num(r.deploy, 3)}</td><td class="num">${num(r.nash, 3)}</td>` : "") + `</tr>`;
  }
  const note = mix ? `<div class="note"><b>deploy</b>: the Nash mixture over the players with an adapter, the mixture to deploy.
    <b>nash (all)</b>: over every player, scripted ones included: the league's meta-strategy, which may weigh a scripted policy.
    Unrated players have played no game yet.</div>` : "";
  set("leaderboard", h + "</table>" + note);
}

function smooth(points, on) {  // an exponential moving average, so that a league's noise does not hide its trend
  if (!on || points.length < 3) return points;
  const a = Math.min(1, 4 / points.length + 0.15);
  let m = points[0][1];
  return points.map(([s, v]) => { m = a * v + (1 - a) * m; return [s, m]; });
}

// series: {name: [[x, value], ...]}; opts: W, H, colourOf, strong (a Set), fmt, minSpan, xName (the x axis's unit)
function lineChart(series, opts) {
  const ids = Object.keys(series), W = opts.W || 620, H = opts.H || 250, L = 46, R = 12, T = 8, B = 34;
  const xName = opts.xName || "round";
  let xs = [], ys = [];
  for (const id of ids) for (const [s, v] of series[id]) if (s != null) { xs.push(s); ys.push(v); }
  if (!ys.length) return "";
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x0 === x1) x1 = x0 + 1;
  const span = opts.minSpan || 1e-6;
  if (y1 - y0 < span) { const c = (y0 + y1) / 2; y0 = c - span / 2; y1 = c + span / 2; }
  const px = s => L + (s - x0) / (x1 - x0) * (W - L - R), py = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  // as many decimals as the ticks' spacing needs: five distinct labels, never five "0.00"
  const decimals = Math.max(0, Math.min(6, Math.ceil(-Math.log10((y1 - y0) / 4))));
  const fmt = v => esc((opts.fmt || (u => num(u, decimals)))(v));
  let g = "";
  for (let k = 0; k <= 4; k++) {
    const v = y0 + (y1 - y0) * k / 4, y = py(v);
    g += `<line x1="${L}" x2="${W - R}" y1="${y}" y2="${y}" stroke="#eceef2"/><text x="${L - 4}" y="${y + 4}" text-anchor="end" font-size="10" fill="#6b7385">${fmt(v)}</text>`;
  }
  const ticks = [...new Set([0, 1, 2, 3, 4].map(k => Math.round(x0 + (x1 - x0) * k / 4)))];
  for (const s of ticks) g += `<text x="${num(px(s), 1)}" y="${H - 18}" text-anchor="middle" font-size="10" fill="#6b7385">${num(s)}</text>`;
  g += `<text class="xlabel" x="${num((L + W - R) / 2, 1)}" y="${H - 3}" text-anchor="middle" font-size="10" fill="#6b7385">${esc(xName)}</text>`;
  const at = x => xName === "round" ? `round ${esc(x)}` : `${esc(x)} ${esc(xName)}`;
  const strongOf = id => !opts.strong || opts.strong.has(id);
  for (const id of ids.filter(id => !strongOf(id)).concat(ids.filter(strongOf))) {  // the highlighted lines on top
    const strong = strongOf(id), pts = series[id].filter(([s]) => s != null);
    if (!pts.length) continue;
    const last = pts[pts.length - 1], c = esc(opts.colourOf(id));
    g += `<polyline points="${pts.map(([s, v]) => `${num(px(s), 1)},${num(py(v), 1)}`).join(" ")}" fill="none" stroke="${c}"
          stroke-width="${strong ? 2.4 : 1.1}" stroke-opacity="${strong ? 1 : 0.45}"><title>${esc(id)}: ${esc(figure(last[1]))} at ${at(last[0])}</title></polyline>`;
    if (pts.length <= 60) for (const [s, v] of pts)
      g += `<circle cx="${num(px(s), 1)}" cy="${num(py(v), 1)}" r="${strong ? 2.2 : 1.4}" fill="${c}" fill-opacity="${strong ? 1 : 0.45}"><title>${esc(id)}: ${esc(figure(v))} at ${at(s)}</title></circle>`;
  }
  return `<svg viewBox="0 0 ${W} ${H}" width="100%" preserveAspectRatio="xMinYMin meet">${g}</svg>`;
}

function legend(ids, colourOf, strong) {
  return `<div class="legend">` + ids.map(id => `<span class="item${strong && !strong.has(id) ? " dim" : ""}"><span class="dot"
    style="background:${esc(colourOf(id))}"></span>${esc(id)}</span>`).join("") + `</div>`;
}

function renderElo(e) {
  const all = e.series || {}, roles = e.roles || {}, sel = document.getElementById("elo-role"), keep = sel.value;
  const roleList = [...new Set(Object.keys(all).map(id => String(roles[id])))];
  sel.innerHTML = `<option value="">all</option>` + roleList.map(r => `<option value="${esc(r)}">${esc(r)}</option>`).join("");
  sel.value = keep;
  chosen(sel, roleList, "role");
  const on = document.getElementById("elo-smooth").checked;
  const ids = Object.keys(all).filter(id => !sel.value || String(roles[id]) === sel.value);
  if (!ids.length) return set("elo", empty("no metrics yet"));
  const series = Object.create(null);
  ids.forEach(id => series[id] = smooth(all[id], on));
  const strong = new Set(e.current || []);
  set("elo", lineChart(series, {colourOf: colour, strong, minSpan: 20, fmt: v => num(v)}) + legend(ids, colour, strong) +
      `<div class="note">thick: the players that still train; thin: frozen snapshots and scripted players. Hover a line for its name.</div>`);
}

const CURVE_PALETTE = ["#3b6fd8", "#e4572e", "#29a36a", "#9467bd", "#f0a202", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
const LEAGUE_COLOUR = "#1d2330";
// Reward, win rate and loss come per role (and per player in a role of several learners). "all"
// shows the league's line and one line per role; a role shows its line and its players', the
// league's line thin beside them. A panel whose series each hold one value is one line of text.
function renderCurves(c) {
  const panels = c.panels || [], roles = (c.roles || []).map(String);
  const roleSel = document.getElementById("curve-role"), xSel = document.getElementById("curve-x");
  const keepRole = roleSel.value, keepX = xSel.value;
  roleSel.innerHTML = `<option value="">all</option>` + roles.map(r => `<option value="${esc(r)}">${esc(r)}</option>`).join("");
  roleSel.value = keepRole;
  const role = chosen(roleSel, roles, "role");
  const games = c.games || [];
  xSel.innerHTML = `<option value="round">round</option>` + (games.length ? `<option value="games">games played</option>` : "");
  xSel.value = keepX;
  const x = chosen(xSel, games.length ? ["round", "games"] : ["round"], "x");
  const gamesAt = new Map(games.map(([s, n]) => [s, n]));
  const xOf = x === "games" ? s => gamesAt.get(s) : s => s;
  const xName = x === "games" ? "games played" : "round";
  if (!panels.length) { set("flat-curves", ""); return set("curves", empty("no metrics yet")); }
  let h = "", flats = "";
  for (const p of panels) {
    if (p.flat) { flats += `<div class="flat">${esc(p.flat)}</div>`; continue; }
    const info = p.info || {}, series = Object.create(null), strong = new Set(), of = Object.create(null);
    const plain = Object.keys(p.series).filter(k => !(info[k] || {}).level);
    // one role: its line is the league's, drawn once
    const same = roles.length === 1 && Object.values(info).some(i => i && i.level === "role");
    for (const [k, points] of Object.entries(p.series)) {
      const i = info[k] || {label: k.slice(k.indexOf("/") + 1), role: null, level: null};
      const mine = i.role != null && String(i.role) === role;
      if (i.level === "player" ? !mine : i.level === "role" && role && !mine) continue;
      if (i.level === "league" && same) continue;
      if (!(i.level === "league" && role)) strong.add(i.label);
      series[i.label] = points.map(([s, v]) => [xOf(s), v]).filter(([s]) => s != null);
      of[i.label] = i.level === "league" ? LEAGUE_COLOUR : i.level === "player" ? colour(i.label)
        : i.level === "role" ? CURVE_PALETTE[roles.indexOf(String(i.role)) % CURVE_PALETTE.length]
        : CURVE_PALETTE[plain.indexOf(k) % CURVE_PALETTE.length];
    }
    const ids = Object.keys(series), colourOf = id => of[id];
    h += `<div class="curve"><h3>${esc(p.title)}</h3>${lineChart(series, {W: 360, H: 180, colourOf, strong, xName})}${legend(ids, colourOf, strong)}</div>`;
  }
  set("curves", h || empty("every panel holds one value throughout: see below"));
  set("flat-curves", flats);
}

function heat(v) {  // 0 red, 0.5 light, 1 green
  if (v == null) return "#f3f4f7";
  const a = [228, 87, 46], m = [247, 247, 240], b = [41, 163, 106], t = Math.max(0, Math.min(1, v));
  const [p, q, u] = t < 0.5 ? [a, m, t * 2] : [m, b, (t - 0.5) * 2];
  return `rgb(${p.map((c, i) => Math.round(c + (q[i] - c) * u)).join(",")})`;
}

function renderPayoff(p) {
  const ids = p.players || [], roles = p.roles || [];
  if (!ids.length) return set("payoff", empty("no games yet"));
  const n = ids.length, L = 130, T = 100, room = document.getElementById("payoff").clientWidth || 560;
  const C = Math.max(16, Math.min(44, Math.floor((room - L - 16) / n)));  // the whole matrix in the panel's width
  const fs = Math.min(11, Math.floor(C * 0.45));
  let g = "";
  ids.forEach((id, i) => {
    g += `<text x="${L - 6}" y="${T + i * C + C / 2 + 4}" text-anchor="end" font-size="11">${esc(id)}</text>`;
    g += `<text transform="translate(${L + i * C + C / 2 + 4},${T - 6}) rotate(-55)" font-size="11">${esc(id)}</text>`;
    ids.forEach((jd, j) => {
      const v = p.win_rate[i][j], games = p.games[i][j];
      g += `<rect x="${L + j * C}" y="${T + i * C}" width="${C - 1}" height="${C - 1}" fill="${esc(heat(v))}">
        <title>${esc(id)} vs ${esc(jd)}: ${v == null ? "never met" : num(v, 2) + " over " + num(games, 1) + " (decayed) games"}</title></rect>`;
      if (v != null) g += `<text x="${L + j * C + C / 2}" y="${T + i * C + C / 2 + fs / 2 - 1}" text-anchor="middle"
        font-size="${fs}" pointer-events="none">${num(v * 100)}</text>`;
    });
    if (i > 0 && roles[i] !== roles[i - 1]) {  // lines between the roles' blocks
      g += `<line x1="${L - 2}" x2="${L + n * C}" y1="${T + i * C - 0.5}" y2="${T + i * C - 0.5}" stroke="#1d2330" stroke-width="1.2"/>
            <line y1="${T - 2}" y2="${T + n * C}" x1="${L + i * C - 0.5}" x2="${L + i * C - 0.5}" stroke="#1d2330" stroke-width="1.2"/>`;
    }
  });
  set("payoff", `<svg width="${L + n * C + 10}" height="${T + n * C + 10}">${g}</svg>
    <div class="note">ordered by role, then Elo; hover a cell for its games; blank: never met</div>`);
}

function renderLineage(l) {
  const nodes = l.nodes || [];
  if (!nodes.length) return set("lineage", empty("the lineage appears with the first checkpoint"));
  const byId = Object.create(null), kids = Object.create(null);
  nodes.forEach(n => { byId[n.id] = n; kids[n.id] = []; });
  const roots = [];
  nodes.forEach(n => (n.parent && byId[n.parent] ? kids[n.parent].push(n) : roots.push(n)));
  const order = [], depth = Object.create(null);
  const walk = (n, d) => { depth[n.id] = d; order.push(n); kids[n.id].forEach(k => walk(k, d + 1)); };
  roots.forEach(r => walk(r, 0));
  let h = "";
  for (const n of order) {
    const c = colour(n.id);
    const marker = n.scripted ? `<span class="marker" style="background:${esc(c)}"></span>`
        : n.frozen ? `<span class="marker" style="border:2px solid ${esc(c)}; border-radius:50%"></span>`
        : `<span class="marker" style="background:${esc(c)}; border-radius:50%"></span>`;
    const extra = [n.role, "epoch " + n.epoch, n.snapshot_of ? "snapshot of " + n.snapshot_of : n.parent ? "from " + n.parent : "",
                   n.resets ? "reset ×" + n.resets : "", n.scripted ? "scripted: " + n.scripted : "",
                   n.unsaved ? "not in a checkpoint yet" : ""].filter(Boolean).join(" · ");
    h += `<div class="lin" style="padding-left:${depth[n.id] * 20}px">${depth[n.id] ? "└ " : ""}${marker}<b>${esc(n.id)}</b><span class="extra">${esc(extra)}</span></div>`;
  }
  set("lineage", h + `<div class="note">● learner &nbsp; ○ frozen snapshot &nbsp; ■ scripted &nbsp; indented: made from the player above it</div>`);
}

function renderTranscripts(t) {
  const sel = document.getElementById("pair"), pairs = t.pairs || [], keep = sel.value;
  sel.innerHTML = pairs.map(p => `<option value="${esc(p.pair)}">${esc(p.pair)} (${esc(p.games.length)})</option>`).join("");
  if (pairs.some(p => p.pair === keep)) sel.value = keep;
  if (!pairs.length) return set("transcripts", empty("no transcripts (transcripts_per_pair = 0, or no games yet)"));
  const p = pairs.find(p => p.pair === sel.value) || pairs[0];
  let h = "";
  for (const g of p.games) {
    const score = g.players.map((id, i) => `<span class="dot" style="background:${esc(colour(id))}"></span>${esc(id)} <b>${num(g.rewards[i], 2)}</b>`).join(" &nbsp; ");
    h += `<div class="game"><div class="head">${esc(g.game_id)} <span class="tag">epoch ${esc(g.epoch)}, round ${esc(g.round)}</span> &nbsp; ${score}</div>`;
    for (const turn of g.turns) {
      h += `<div class="turn"><span class="dot" style="background:${esc(colour(turn.player))}"></span>${esc(turn.player)} (seat ${esc(turn.seat)})
            <pre>${esc(turn.prompt)}</pre><pre class="completion">${esc(turn.completion)}</pre></div>`;
    }
    if (g.turns_total > g.turns.length) h += `<div class="empty">${num(g.turns_total - g.turns.length)} more turns not kept</div>`;
    h += "</div>";
  }
  set("transcripts", h);
}

function renderAdapters(a) {
  document.getElementById("ad-note").textContent = a.checkpoint || "no checkpoint yet";
  const list = a.adapters || [];
  if (!list.length) return set("adapters", empty("adapters appear with the first checkpoint"));
  let h = `<table><tr><th>player</th><th>role</th><th>files</th><th>download</th><th>folder (PeftModel.from_pretrained)</th></tr>`;
  for (const d of list) {
    const files = d.files.map(f => `<a href="${esc(f.url)}">${esc(f.name)}</a> <span class="tag">${num(f.bytes / 1024)} KB</span>`).join(" ");
    h += `<tr><td><span class="dot" style="background:${esc(colour(d.id))}"></span>${esc(d.id)}</td><td>${esc(d.role)}</td>
          <td class="wrap">${files}</td><td><a href="${esc(d.zip)}">${esc(d.id)}.zip</a></td><td class="wrap"><code>${esc(d.path)}</code></td></tr>`;
  }
  set("adapters", h + "</table>");
}

// The sections whose content is wider than their box: a headless browser test reads them from
// <body data-clipped>, and a reader sees a scrollbar there.
function markClipped() {
  const wider = el => el.scrollWidth > el.clientWidth + 1;
  document.body.dataset.clipped = [...document.querySelectorAll("main section")]
    .filter(s => wider(s) || wider(s.querySelector("div[id]"))).map(s => s.querySelector("div[id]").id).join(" ");
}

let last = null;
function renderAll(d) {
  (d.leaderboard.rows || []).forEach(r => colour(r.id));  // colours follow the leaderboard's first order
  renderSummary(d.summary); renderLeaderboard(d.leaderboard); renderCurves(d.curves); renderElo(d.elo); renderPayoff(d.payoff);
  renderLineage(d.lineage); renderTranscripts(d.transcripts); renderAdapters(d.adapters);
  last = d;
  markClipped();
}
document.getElementById("pair").addEventListener("change", () => last && renderTranscripts(last.transcripts));
for (const id of ["elo-role", "elo-smooth"]) document.getElementById(id).addEventListener("change", () => last && renderElo(last.elo));
document.getElementById("curve-role").addEventListener("change", e => { remember("role", e.target.value); last && renderCurves(last.curves); });
document.getElementById("curve-x").addEventListener("change", e => {
  remember("x", e.target.value === "round" ? "" : e.target.value); last && renderCurves(last.curves); });

async function poll() {
  const live = document.getElementById("live");
  try {
    const summary = await (await fetch("api/summary", {cache: "no-store"})).json();
    if (!last || summary.fingerprint !== last.summary.fingerprint) {
      const names = ["leaderboard", "curves", "elo", "payoff", "lineage", "transcripts", "adapters"];
      const got = await Promise.all(names.map(n => fetch("api/" + n, {cache: "no-store"}).then(r => r.json())));
      const d = {summary};
      names.forEach((n, i) => d[n] = got[i]);
      renderAll(d);
    } else {
      renderSummary(summary);
    }
    const age = summary.updated ? summary.now - summary.updated : null;
    live.className = age != null && age > 120 ? "stale" : "";
    live.textContent = age == null ? "waiting for the first round" : age > 120 ? `idle ${Math.round(age / 60)} min` : "live";
  } catch (err) {
    live.className = "stale"; live.textContent = "dashboard server unreachable";
  }
}
renderAll(DATA);
setInterval(poll, POLL_MS);
</script>
</body></html>
"""
