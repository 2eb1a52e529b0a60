"""One self-contained HTML page to browse a `FeatureReport`: a sortable, searchable table of the
features, and a card per feature with its contexts, token highlights and numbers.

Everything is in the file: inline CSS, a few lines of inline script, no external URL. Every piece
of text from the user or the model (tokens, contexts, axis names) goes through `_e`
(`html.escape`), so a corpus holding `<script>` renders as text. The page's own escaping rule is kept
here, small, rather than shared with the audit's report: `sae` may not import `audit` (the layer
rules of tests/test_layers.py), and the base layer has no HTML helper.

The script takes its start state from the URL hash (`#sort=<column>&dir=asc|desc&q=<text>`), and
writes the features left visible, in their shown order, to `<body data-order="...">` after each
sort or search, so a headless browser's DOM dump shows what a reader would see.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from ..errors import DataError
from ._cards import Context, FeatureCard
from ._report import FeatureReport

HIGHLIGHT = (255, 140, 0)
"""Colour of a token at the card's largest activation; lower activations are mixed towards white."""
STRENGTH = 0.85
"""Opacity of the largest activation, so the token's text stays readable on it."""

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:78em}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{cursor:pointer;background:#f3f3f3}td.text{text-align:left;max-width:28em;overflow:hidden}
.card{border:1px solid #ccc;border-radius:6px;padding:.6em 1em;margin:1em 0}
.ctx{font-family:ui-monospace,monospace;font-size:13px;margin:.3em 0;white-space:pre-wrap}
.tok.peak{outline:1px solid #a33}.muted{color:#777}dl{display:grid;grid-template-columns:auto 1fr;gap:0 1em}
dt{color:#555}dd{margin:0}input#q{width:24em;padding:3px;margin:.5em 0}
"""

_JS = """
(function(){
var tb=document.querySelector('#features tbody'),q=document.getElementById('q'),dir={};
function rows(){return Array.prototype.slice.call(tb.rows);}
function record(){document.body.setAttribute('data-order',rows().filter(function(r){return !r.hidden;})
 .map(function(r){return r.getAttribute('data-feature');}).join(','));}
function sortBy(key,d){var th=document.querySelector('th[data-key="'+key+'"]');if(!th)return;var i=th.cellIndex;
 rows().sort(function(a,b){var x=parseFloat(a.cells[i].getAttribute('data-value')),
 y=parseFloat(b.cells[i].getAttribute('data-value'));if(isNaN(x)||isNaN(y))return isNaN(x)-isNaN(y);
 return d*(x-y);}).forEach(function(r){tb.appendChild(r);});dir[key]=d;record();}
function search(text){var t=text.toLowerCase();rows().forEach(function(r){
 var hide=t!==''&&r.getAttribute('data-search').indexOf(t)<0;r.hidden=hide;
 var c=document.getElementById('feature-'+r.getAttribute('data-feature'));if(c)c.hidden=hide;});record();}
Array.prototype.forEach.call(document.querySelectorAll('th[data-key]'),function(th){
 th.addEventListener('click',function(){var k=th.getAttribute('data-key');sortBy(k,dir[k]===-1?1:-1);});});
q.addEventListener('input',function(){search(q.value);});
var h=new URLSearchParams(location.hash.slice(1));
if(h.get('sort'))sortBy(h.get('sort'),h.get('dir')==='asc'?1:-1);
if(h.get('q')){q.value=h.get('q');search(h.get('q'));}
record();
})();
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _num(x: float | None, digits: int = 3) -> str:
    """`x` to `digits` significant figures; '—' for None or a non-finite value."""
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _value(x: float | None) -> str:
    """A cell's sort key (the browser reads NaN as missing, sorted last)."""
    return "NaN" if x is None or not math.isfinite(x) else repr(float(x))


def _tokens(ctx: Context, vmax: float) -> str:
    """The context's tokens, each coloured by the feature's activation on it (value in its title)."""
    spans = []
    for i, (tok, v) in enumerate(zip(ctx.tokens, ctx.values)):
        read = math.isfinite(v)
        alpha = min(max(v, 0.0) / vmax, 1.0) * STRENGTH if read and vmax > 0 else 0.0
        title = f"{tok!r} · activation {_num(v, 4)}" if read else f"{tok!r} · not read by the corpus pass"
        style = f"background:rgba({HIGHLIGHT[0]},{HIGHLIGHT[1]},{HIGHLIGHT[2]},{alpha:.3f})"
        cls = "tok peak" if i == ctx.peak else "tok"
        spans.append(f'<span class="{cls}" style="{style}" title="{_e(title)}" data-activation="{_value(v)}">'
                     f"{_e(tok)}</span>")
    return "".join(spans)


def _card(card: FeatureCard) -> str:
    vmax = max((v for c in card.contexts for v in c.values if math.isfinite(v)), default=0.0)
    lo, hi = card.difference_ci
    numbers = [
        (f"{card.score_kind} (reward units)", _num(card.score)),
        ("u · d (reward per unit activation)", _num(card.write)),
        ("cos(d, read-out)", _num(card.alignment)), ("firing frequency", _num(card.frequency)),
        ("mean activation, chosen / rejected", f"{_num(card.chosen)} / {_num(card.rejected)}"),
        ("chosen − rejected (95% interval)", f"{_num(card.difference)} [{_num(lo)}, {_num(hi)}]"),
        ("causal effect", _num(card.effect) if card.effect is not None else "not measured"),
        *((f"ρ with {name}", _num(rho, 2)) for name, rho in card.correlations.items()),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in numbers)
    contexts = "".join(f'<div class="ctx" data-input="{c.input}" data-position="{c.position}">'
                       f'<span class="muted">{_e(_num(c.activation))} · input {c.input}</span> {_tokens(c, vmax)}</div>'
                       for c in card.contexts)
    empty = f'<p class="muted">{_e(card.note)}</p>' if card.note else ""
    return (f'<section class="card" id="feature-{card.feature}" data-feature="{card.feature}">'
            f"<h2>feature {card.feature}</h2><dl>{dl}</dl>{empty}{contexts}</section>")


def _columns(report: FeatureReport) -> list[tuple[str, str]]:
    """(sort key, header) of the table's columns."""
    axes = [(f"rho_{a}", f"ρ {a}") for a in report.cards.axes]
    return [("feature", "feature"), ("score", report.score_kind), ("write", "u · d"), ("alignment", "cos"),
            ("frequency", "frequency"), ("difference", "chosen − rejected"), ("lo", "lo"), ("hi", "hi"),
            ("effect", "effect"), *axes, ("context", "strongest context")]


def _row(card: FeatureCard) -> str:
    values = [card.feature, card.score, card.write, card.alignment, card.frequency, card.difference,
              *card.difference_ci, card.effect, *card.correlations.values()]
    cells = "".join(f'<td data-value="{_value(v)}">{_e(_num(v) if i else v)}</td>' for i, v in enumerate(values))
    top = card.contexts[0].text if card.contexts else card.note
    search = " ".join([f"feature {card.feature}", *(c.text for c in card.contexts), card.note]).lower()
    return (f'<tr data-feature="{card.feature}" data-search="{_e(search)}">{cells}'
            f'<td class="text" data-value="NaN">{_e(top)}</td></tr>')


def feature_page(report: FeatureReport, *, title: str = "SAE features") -> str:
    """The report as one self-contained HTML page (see the module docstring)."""
    head = "".join(f'<th data-key="{_e(k)}">{_e(h)}</th>' for k, h in _columns(report))
    fit = (f"layer {report.layer} · explained variance {_num(report.explained_variance)} · L0 {_num(report.l0)} · "
           f"dead fraction {_num(report.dead_fraction)} · {report.n_activations} activations ({report.positions})")
    how = ("Click a column to sort, type to search the contexts. Each token's background is the feature's "
           "activation on it, on the card's own scale (hover for the value); the outlined token is where it peaks.")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1><p>{_e(fit)}</p><p class=\"muted\">{_e(how)}</p>"
            f'<input id="q" type="search" placeholder="search contexts"><table id="features"><thead><tr>{head}</tr>'
            f'</thead><tbody>{"".join(_row(c) for c in report.cards)}</tbody></table>'
            f'{"".join(_card(c) for c in report.cards)}<script>{_JS}</script></body></html>')


def write_feature_page(report: FeatureReport, path: str | Path, *, title: str = "SAE features") -> Path:
    """Write `feature_page(report)` to `path` (UTF-8, missing parent folders created, as the audit creates its
    folder) and return the path; a path that is a folder is refused by name."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"the feature page's path {path} is a folder; name an HTML file in it, e.g. "
                        f"{path / 'features.html'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(feature_page(report, title=title), encoding="utf-8")
    return path
