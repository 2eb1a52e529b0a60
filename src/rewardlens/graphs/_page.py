"""One self-contained interactive HTML page of an attribution graph: pan and zoom, click a node for its card
(top contexts, its write on the reward), hover an edge for its weight.

Python computes every number and every position: the layout (x by token position, the rejected side of a
margin graph after the chosen side; y by layer, tokens at the bottom and the reward on top), each node's
card and each edge's label. The script only draws what it is given and shows it. The data travels as one
JSON blob inside `<script type="application/json">`, with `<`, `>` and `&` written as `\\u003c`, `\\u003e`,
`\\u0026`, so no token text can close the tag; the script writes text with `textContent` only, never as
markup — escaped by construction. No external URL: the page works offline.

The URL hash selects a start state (`#node=<name>` opens a card, `#edge=<index>` shows an edge's weight),
and the script mirrors what is shown into `<body data-node=... data-edge=...>` and the card, so a
headless browser's DOM dump shows what a reader would see.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._graph import KINDS, AttributionGraph

COLOURS = {"feature": "#4a7fd6", "error": "#999999", "token": "#3a9a5b", "reward": "#d2691e"}
"""Node fill by kind."""


@dataclass(frozen=True)
class Context:
    """One top-activating context of a feature: the text around the token (the token marked «»), its activation."""

    text: str
    activation: float


def _number(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:+.4g}"


def _layout(g: AttributionGraph) -> tuple[np.ndarray, np.ndarray]:
    """x, y of every node: x by position (the rejected side after the chosen side's tokens), spread within one
    (layer, position) cell; y by layer (tokens -1 at the bottom, the root on top)."""
    n = g.nodes
    offset = int(g.meta.get("rejected_offset", 0))
    side = n.side if n.side is not None else np.array(["chosen"] * len(n.names), dtype=object)
    col = np.where(side == "rejected", n.position + offset, n.position).astype(float)
    root = g.root
    col[root] = float(np.nanmax(col[:root])) / 2 if root else 0.0
    x, y = col * 60.0 + 40.0, (g.n_layers - n.layer.astype(float)) * 90.0 + 40.0
    y[root] = 20.0
    cells: dict[tuple[float, float], int] = {}
    for i in range(len(n.names)):
        k = (float(x[i]), float(y[i]))
        x[i] += 14.0 * cells.get(k, 0)
        cells[k] = cells.get(k, 0) + 1
    return x, y


def page_data(g: AttributionGraph, contexts: dict[str, list[Context]] | None = None,
              notes: list[str] | None = None) -> dict[str, Any]:
    """Everything the page shows, computed here: nodes (name, kind, x, y, token, numbers, card lines),
    edges (source, target, weight, label) and the header's lines."""
    x, y = _layout(g)
    frame, _ = g.to_frame()
    direct = np.zeros(len(g.nodes.names))
    root_row = np.flatnonzero(g.rows == g.root)
    if len(root_row):
        direct = g.adjacency[root_row[0]].astype(np.float64)
    nodes = []
    for i, rec in enumerate(frame.to_dict("records")):
        lines = [f"kind: {rec['kind']}", f"layer: {int(rec['layer'])}", f"position: {int(rec['position'])}",
                 f"token: {rec['token']!r}", f"activation: {_number(float(rec['activation']))}",
                 f"direct write on the {'margin' if g.nodes.side is not None else 'reward'}: "
                 f"{_number(float(direct[i]))}", f"influence on it: {float(rec['influence']):.4g}"]
        if "side" in rec:
            lines.append(f"side: {rec['side']}")
        ctx = [[c.text, f"{c.activation:.4g}"] for c in (contexts or {}).get(node_feature(rec["node"]), [])]
        nodes.append({"name": rec["node"], "kind": rec["kind"], "x": round(float(x[i]), 2),
                      "y": round(float(y[i]), 2), "colour": COLOURS[KINDS[int(g.nodes.kind[i])]],
                      "label": str(rec["token"]) if rec["kind"] == "token" else rec["node"], "lines": lines,
                      "contexts": ctx})
    r, s = g.adjacency.nonzero()
    weights = g.adjacency[r, s].astype(np.float64)
    scale = float(np.abs(weights).max()) if len(weights) else 1.0
    edges = [{"source": int(si), "target": int(g.rows[ri]), "weight": float(w), "label":
              f"{g.nodes.names[si]} → {g.nodes.names[g.rows[ri]]}: {_number(float(w))}",
              "width": round(0.5 + 4.0 * abs(float(w)) / max(scale, 1e-30), 3), "colour": "#c0392b" if w < 0
              else "#2e86c1"} for ri, si, w in zip(r, s, weights)]
    return {"title": g.label, "nodes": nodes, "edges": edges, "notes": list(notes or []),
            "width": round(float(x.max()) + 80.0, 1) if len(x) else 200.0,
            "height": round(float(y.max()) + 60.0, 1) if len(y) else 200.0}


def node_feature(name: str) -> str:
    """A node's feature, without its position or side suffix: `tc_L3_F120_P5_rejected` → `tc_L3_F120`."""
    name = name.removesuffix("_rejected")
    head, _, tail = name.rpartition("_P")
    return head if head and tail.isdigit() else name


def _blob(data: dict[str, Any]) -> str:
    """JSON safe inside a script element: no `<`, `>` or `&` survives, so no text can end the element."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;display:flex;height:100vh}
#view{flex:1;border-right:1px solid #ccc;cursor:grab;background:#fcfcfc}#side{width:26em;padding:1em;overflow:auto}
#edge-info{font-family:ui-monospace,monospace;font-size:12px;min-height:1.4em;color:#333}
.ctx{font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap;margin:.2em 0}
.muted{color:#777}ul{padding-left:1.2em}
"""

_JS = """
(function(){
var D=JSON.parse(document.getElementById('graph-data').textContent),NS='http://www.w3.org/2000/svg';
var svg=document.getElementById('view'),g=document.createElementNS(NS,'g');svg.appendChild(g);
var vb={x:0,y:0,w:D.width,h:D.height};
function setVB(){svg.setAttribute('viewBox',vb.x+' '+vb.y+' '+vb.w+' '+vb.h);}
function el(tag,attrs){var e=document.createElementNS(NS,tag);for(var k in attrs)e.setAttribute(k,attrs[k]);
 return e;}
function text(id,s){document.getElementById(id).textContent=s;}
function showEdge(i){var e=D.edges[i];if(!e)return;text('edge-info',e.label);
 document.body.setAttribute('data-edge',i);}
function showNode(i){var n=D.nodes[i];if(!n)return;text('card-title',n.name);
 var ul=document.getElementById('card-lines');
 ul.textContent='';n.lines.forEach(function(l){var li=document.createElement('li');li.textContent=l;
 ul.appendChild(li);});
 var c=document.getElementById('card-contexts');c.textContent='';
 if(!n.contexts.length){var p=document.createElement('p');p.className='muted';
 p.textContent='no contexts recorded';c.appendChild(p);}
 n.contexts.forEach(function(x){var p=document.createElement('p');p.className='ctx';
 p.textContent=x[1]+'  '+x[0];c.appendChild(p);});
 document.body.setAttribute('data-node',n.name);}
D.edges.forEach(function(e,i){var a=D.nodes[e.source],b=D.nodes[e.target];
 var line=el('line',{
 x1:a.x,y1:a.y,x2:b.x,y2:b.y,stroke:e.colour,'stroke-width':e.width,'stroke-opacity':0.6,'data-edge':i});
 var t=el('title',{});t.textContent=e.label;line.appendChild(t);
 line.addEventListener('mouseenter',function(){showEdge(i);});g.appendChild(line);});
D.nodes.forEach(function(n,i){var c=el('circle',{
 cx:n.x,cy:n.y,r:n.kind==='reward'?9:6,fill:n.colour,'data-node':n.name});
 var t=el('title',{});t.textContent=n.name;c.appendChild(t);c.style.cursor='pointer';
 c.addEventListener('click',function(ev){ev.stopPropagation();showNode(i);});g.appendChild(c);
 if(n.kind==='token'||n.kind==='reward'){var l=el('text',{
 x:n.x,y:n.y+(n.kind==='reward'?-12:18),'font-size':10,'text-anchor':'middle'});
  l.textContent=n.label;g.appendChild(l);}});
svg.addEventListener('wheel',function(ev){ev.preventDefault();
 var f=ev.deltaY>0?1.15:1/1.15,r=svg.getBoundingClientRect();
 var px=vb.x+(ev.clientX-r.left)/r.width*vb.w,py=vb.y+(ev.clientY-r.top)/r.height*vb.h;
 vb.x=px-(px-vb.x)*f;vb.y=py-(py-vb.y)*f;vb.w*=f;vb.h*=f;setVB();},{passive:false});
var drag=null;svg.addEventListener('mousedown',function(ev){drag={x:ev.clientX,y:ev.clientY,vx:vb.x,vy:vb.y};
 });
window.addEventListener('mouseup',function(){drag=null;});
svg.addEventListener('mousemove',function(ev){if(!drag)return;var r=svg.getBoundingClientRect();
 vb.x=drag.vx-(ev.clientX-drag.x)/r.width*vb.w;vb.y=drag.vy-(ev.clientY-drag.y)/r.height*vb.h;setVB();});
setVB();
var h=new URLSearchParams(location.hash.slice(1));
if(h.get('node')){D.nodes.forEach(function(n,i){if(n.name===h.get('node'))showNode(i);});}
if(h.get('edge'))showEdge(parseInt(h.get('edge'),10));
document.body.setAttribute('data-ready','1');
})();
"""


def graph_page(g: AttributionGraph, *, contexts: dict[str, list[Context]] | None = None,
               notes: list[str] | None = None) -> str:
    """The page's HTML text (module docstring). `contexts`: top contexts per feature (`tc_L3_F120` or
    `mlp_L1_N5`); `notes`: header lines (scores, fidelity), computed by the caller."""
    data = page_data(g, contexts, notes)
    notes_html = "".join(f"<li>{html.escape(line)}</li>" for line in data["notes"])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(g.label)}</title>"
            f"<style>{_CSS}</style></head><body>"
            f"<svg id='view' xmlns='http://www.w3.org/2000/svg'></svg>"
            f"<div id='side'><h2>{html.escape(g.label)}</h2><ul>{notes_html}</ul>"
            "<p class='muted'>Drag to pan, wheel to zoom; click a node for its card, hover an edge for its weight.</p>"
            "<div id='edge-info'></div><h3 id='card-title'>no node selected</h3><ul id='card-lines'></ul>"
            "<h4>top contexts</h4><div id='card-contexts'></div></div>"
            f"<script type='application/json' id='graph-data'>{_blob(data)}</script>"
            f"<script>{_JS}</script></body></html>")


def write_graph_page(g: AttributionGraph, path: str | Path, **kwargs: Any) -> Path:
    """Write `graph_page(g, **kwargs)` to `path` (UTF-8); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(graph_page(g, **kwargs), encoding="utf-8")
    return path
