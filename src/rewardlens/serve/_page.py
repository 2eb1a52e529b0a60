"""The live dashboard (`GET /`): one static page, the same bytes for every request, that polls
`dashboard.json` every two seconds and draws the mean reward per monitor record, the alarms per record and
the alarms in plain words.

Escaped by construction: the page holds no data when served, and its script writes every value it fetches
with `textContent` and SVG attributes set one by one (never `innerHTML`), so a message holding markup is
shown as text. It loads nothing from the network but `dashboard.json` from its own server.
"""

from __future__ import annotations

DASHBOARD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; connect-src 'self'; \
script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>rewardlens serve</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
svg{border:1px solid #ccc;background:#fafafa}
.k{color:#666}
li.alarm{color:#b00}
</style></head><body>
<h1>rewardlens reward server</h1>
<p><span class="k">sequences scored</span> <b id="sequences">-</b>
 · <span class="k">queue</span> <b id="queue">-</b>
 · <span class="k">reward mean (latest 1024)</span> <b id="mean">-</b>
 · <span class="k">sd</span> <b id="sd">-</b>
 · <span class="k">updated</span> <span id="updated">never</span></p>
<h2>Mean reward per monitor record</h2>
<svg id="reward" width="720" height="220" role="img" aria-label="mean reward per step"></svg>
<h2>Alarms raised per record</h2>
<svg id="alarms" width="720" height="120" role="img" aria-label="alarms per step"></svg>
<h2>Alarms</h2>
<ol id="list"><li class="k">none yet</li></ol>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
function text(id, value) { document.getElementById(id).textContent = value === null ? "-" : String(value); }
function el(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}
function curve(id, xs, ys, colour) {
  const svg = document.getElementById(id);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const w = +svg.getAttribute("width"), h = +svg.getAttribute("height"), pad = 30;
  const pts = xs.map((x, i) => [x, ys[i]]).filter(p => p[1] !== null && isFinite(p[1]));
  if (!pts.length) {
    const t = el("text", {x: pad, y: h / 2}); t.textContent = "no record yet"; svg.appendChild(t); return;
  }
  const x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  const y0 = Math.min(0, ...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  const sx = x => pad + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (w - 2 * pad);
  const sy = y => h - pad - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (h - 2 * pad);
  svg.appendChild(el("polyline", {points: pts.map(p => sx(p[0]) + "," + sy(p[1])).join(" "),
                                  fill: "none", stroke: colour, "stroke-width": 2}));
  for (const [label, x, y] of [[String(x0), pad, h - 8], [String(x1), w - pad, h - 8],
                               [y1.toPrecision(3), 2, pad], [y0.toPrecision(3), 2, h - pad]]) {
    const t = el("text", {x: x, y: y, "font-size": 11}); t.textContent = label; svg.appendChild(t);
  }
}
async function refresh() {
  try {
    const r = await fetch("dashboard.json", {cache: "no-store"});
    const d = await r.json();
    text("sequences", d.sequences); text("queue", d.queue);
    text("mean", d.reward_mean === null ? null : d.reward_mean.toFixed(4));
    text("sd", d.reward_sd === null ? null : d.reward_sd.toFixed(4));
    text("updated", new Date().toLocaleTimeString());
    const steps = d.records.map(x => x.step);
    curve("reward", steps, d.records.map(x => x.reward), "#1f77b4");
    curve("alarms", steps, d.records.map(x => x.alarms), "#d62728");
    const list = document.getElementById("list");
    while (list.firstChild) list.removeChild(list.firstChild);
    for (const a of d.alarms) {
      const li = document.createElement("li"); li.className = "alarm";
      li.textContent = "step " + a.step + ": " + a.message; list.appendChild(li);
    }
    if (!d.alarms.length) { const li = document.createElement("li"); li.className = "k";
      li.textContent = d.monitor ? "none yet" : "the monitor is off"; list.appendChild(li); }
  } catch (e) { text("updated", "unreachable (" + e + ")"); }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""
"""The dashboard page (static: every value arrives through `dashboard.json`)."""
