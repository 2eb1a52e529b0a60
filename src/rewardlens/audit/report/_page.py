"""`report.html`: one self-contained page (inline CSS, figures as PNG data URIs, no external URL).

Every section is a `<section id=...>`; every figure a `<figure id="fig-..." data-figure=...>` with
one `<img>` and a caption saying what is plotted and in which units. All text that comes from the
user or the model (pair ids, the model's repr, concept names) goes through `html.escape`. A few
lines of inline script mark each image `data-decoded="1"` once the browser has decoded it and
count them on `<body data-images-decoded=...>`, so a headless browser's DOM dump shows that
every figure rendered.
"""

from __future__ import annotations

import base64
import html
import math
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._runner import Audit
from . import _figures as figures

SECTIONS = ("summary", "scores", "lens", "attribution", "patching", "probes", "concepts", "features")
TITLES = {"summary": "Summary", "scores": "Scores", "lens": "Reward lens", "attribution": "Attribution",
          "patching": "Patching and faithfulness", "probes": "Reward-hacking probes", "concepts": "Concepts",
          "features": "SAE features"}
NOT_RUN = {
    "probes": "Probes were not run. <code>rewardlens audit</code> runs them unless given <code>--no-probes</code>; "
              "alone: <code>rewardlens probe MODEL</code> or <code>rewardlens.probe(model)</code>.",
    "concepts": "Concepts were not run. <code>rewardlens audit</code> runs them unless given "
                "<code>--no-concepts</code>; alone: <code>rewardlens concepts MODEL</code> or "
                "<code>rewardlens.concepts(model)</code>.",
    "features": "SAE feature attribution was not run: it needs an SAE trained on this model "
                "(<code>rewardlens sae train MODEL --pairs FILE --layer L --out DIR</code>), then "
                "<code>rewardlens audit MODEL --pairs FILE --sae DIR/…</code> or "
                "<code>rewardlens.attribute_features(model, sae, pairs, layer=L)</code>.",
}


class Html(str):
    """Markup built here (already escaped); plain `str` is escaped wherever it is inserted."""


def e(x: object) -> Html:
    return x if isinstance(x, Html) else Html(html.escape(str(x), quote=True))


def num(x: Any, digits: int = 3) -> str:
    """A number to `digits` significant figures; '—' for None or non-finite values."""
    if x is None or (isinstance(x, (float, np.floating)) and not math.isfinite(x)):
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.{digits}g}"


def rho(mean: Any, lo: Any, hi: Any) -> str:
    """ρ with its interval, '—' when undefined."""
    if mean is None or not math.isfinite(mean):
        return "— (undefined)"
    return f"{mean:+.2f} [{num(lo, 2)}, {num(hi, 2)}]"


def table(headers: Iterable[str], rows: Iterable[Iterable[object]], row_class: Iterable[str] | None = None) -> Html:
    """An HTML table; cells are escaped unless they are `Html`."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    classes = list(row_class) if row_class is not None else None
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{e(classes[i])}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    return Html(f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def _png_size(png: bytes) -> tuple[int, int]:
    return struct.unpack(">II", png[16:24])  # the IHDR chunk: width, height


def figure(fig_id: str, fig: Any, caption: str, alt: str) -> Html:
    """A `<figure>` holding the rendered figure as a data URI (the matplotlib figure is released)."""
    png = figures.to_png(fig)
    width, height = _png_size(png)
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return Html(f'<figure id="fig-{e(fig_id)}" data-figure="{e(fig_id)}"><img src="{uri}" alt="{e(alt)}" '
                f'width="{width}" height="{height}"><figcaption>{e(caption)}</figcaption></figure>')


def kv(items: Iterable[tuple[str, object]]) -> Html:
    return Html("<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in items) + "</dl>")


# ---- sections ---------------------------------------------------------------------------------------

def _summary(a: Audit, s: dict[str, Any]) -> Html:
    sc, lens, faith = s["scores"], s["lens"], s["faithfulness"]
    n = s["n_pairs"]
    med = lens["crystallization_median"]
    seed = faith["seed_statistic"]
    paper = ", ".join(f"{v:+.3f} {k}" for k, v in seed["paper"].items())
    probes = s["probes"]
    flagged = ("not run" if probes is None else ", ".join(probes["flagged"]) or "none")
    items = [
        ("model", a.model), ("fingerprint", a.fingerprint), ("data checksum", a.data_checksum),
        ("pairs", n), ("layers", s["n_layers"]),
        ("accuracy (chosen reward > rejected)", f"{num(sc['accuracy'])} ({round(sc['accuracy'] * n)} of {n})"),
        ("mean margin, chosen − rejected", f"{num(sc['mean_margin'])} reward units"),
        (f"median crystallization depth l/L (fraction {lens['fraction']:g})",
         f"linear {num(med['linear'])}, normed {num(med['normed'])}"),
        ("closure error max |reward − Σ parts − constant|", f"{num(s['closure_error']['max'])} reward units"),
        ("attribution vs direct effect, pooled ρ [95% CI]", rho(**_rho(faith["pooled"]["direct"]))),
        ("attribution vs total effect, pooled ρ [95% CI]", rho(**_rho(faith["pooled"]["total"]))),
        (f"seed statistic |attribution| vs |noising, {seed['positions']}|",
         f"{rho(seed['rho'], seed['lo'], seed['hi'])} (paper: {paper})"),
        ("flagged probe axes", flagged),
    ]
    return kv(items)


def _rho(d: dict[str, Any]) -> dict[str, Any]:
    return {"mean": d["rho"], "lo": d["lo"], "hi": d["hi"]}


def _scores(a: Audit, s: dict[str, Any]) -> Html:
    from ._numbers import margins

    chosen, rejected, margin = margins(a)
    cl, cn = (a.lens.crystallization(k, a.fraction) for k in ("linear", "normed"))
    rows = [(i, pid, num(c), num(r), num(m), "chosen" if m > 0 else "rejected" if m < 0 else "tie", num(x), num(y))
            for i, (pid, c, r, m, x, y) in enumerate(zip(a.pair_ids, chosen, rejected, margin, cl, cn))]
    intro = Html("<p>Rewards from the model's fp32 head, in reward units. A row is marked when the model "
                 "prefers the rejected response. Crystallization depth is l/L (— where the final margin is "
                 "too small to have a side).</p>")
    return Html(intro + table(["#", "pair", "chosen", "rejected", "margin", "prefers", "crystallization linear",
                               "crystallization normed"], rows, ["bad" if m <= 0 else "" for m in margin]))


def _lens(a: Audit, s: dict[str, Any]) -> Html:
    lens = s["lens"]
    note = (f"<p>{lens['near_zero_margin_pairs']} pair(s) have a final margin too small to define a side; their "
            "crystallization depth is left out.</p>" if lens["near_zero_margin_pairs"] else "")
    text = Html("<p>The <b>linear lens</b> at depth l is the sum of the exact contributions of the embeddings and "
                "layers up to l, with the final norm's scale frozen; the <b>normed lens</b> re-applies the final "
                "norm to the partial residual (logit-lens style). Both end at the reward. Crystallization depth: "
                "the first depth after which the margin stays on the final margin's side and beyond "
                f"{lens['fraction']:g} of it.</p>{note}")
    fig = figure("lens", figures.fig_lens(a),
                 f"Chosen − rejected margin (reward units) against relative depth l/L for the linear (left) and "
                 f"normed (right) lens; thin lines: each of the {s['n_pairs']} pairs, bold: mean; dashed: median "
                 "crystallization depth.", "lens curves")
    return Html(text + fig)


def _attribution(a: Audit, s: dict[str, Any]) -> Html:
    c = s["closure_error"]
    sub = a.sublayers
    rows = [(name, num(m), num(v)) for name, m, v in
            zip(sub.names, sub.margin.mean(0), np.abs(sub.values).mean(0))]
    top = a.heads.top(10, by="margin")
    text = Html("<p>Each part's exact direct contribution to the reward (the final norm's scale frozen); the "
                f"parts plus a constant equal the reward: max |reward − Σ parts − constant| is "
                f"{e(num(c['sublayers']))} (sublayers) and {e(num(c['heads']))} (heads) reward units.</p>")
    fig = figure("heatmap", figures.fig_heatmaps(a),
                 "Left: mean chosen − rejected contribution of each attention head, MLP and the embeddings "
                 "(reward units). Right: mean total effect of read-position patching of the same part "
                 f"({a.faithfulness.mode}, reward units). Rows: layers (top row: embeddings); columns: heads, "
                 "then the MLP (right-hand column, which holds the embeddings in the top row); grey: no such "
                 "part.", "part heatmaps")
    return Html(text + Html("<h3>Sublayers</h3>")
                + table(["part", "mean margin contribution", "mean |contribution|"], rows)
                + Html("<h3>Top heads and MLPs by mean margin contribution</h3>")
                + table(["part", "mean margin contribution"], [(n, num(v)) for n, v in top]) + fig)


def _patching(a: Audit, s: dict[str, Any]) -> Html:
    f = s["faithfulness"]
    rows = [(f"attribution vs {k}", rho(v["rho"], v["lo"], v["hi"]), v["pairs"]) for k, v in f["pooled"].items()]
    seed = f["seed_statistic"]
    rows.append((f"seed statistic |attribution| vs |noising, {seed['positions']}| (sublayers)",
                 rho(seed["rho"], seed["lo"], seed["hi"]), seed["pairs"]))
    agree = f["attribution_patching_agreement"]
    text = Html("<p><b>Direct</b>: path-frozen patching (later parts held, only the final norm's scale "
                "recomputed) — the causal version of attribution. <b>Total</b>: activation patching at the read "
                "position. <b>Indirect</b> = total − direct. Spearman ρ is computed per pair across parts, then "
                f"pooled as a mean with a bootstrap interval over pairs ({e(f['level'])} level, "
                f"{e(f['mode'])}). The seed paper reported ρ = −0.256 (Skywork-Reward-Llama-3.1-8B) and "
                "−0.027 (ArmoRM) for its statistic.</p>")
    atp = kv([(k.replace("_", " "), num(v)) for k, v in agree.items()])
    fig = figure("scatter", figures.fig_scatter(a),
                 "Attribution (chosen − rejected contribution, reward units) against the direct (left) and total "
                 f"(right) read-position patching effect ({a.faithfulness.mode}, reward units); one point per pair "
                 "and part, coloured by part kind (positive: the part carries the preference); dotted: y = x; titles: "
                 "pooled Spearman ρ with 95% CI.",
                 "attribution vs patching")
    return Html(text + table(["comparison", "ρ [95% CI]", "pairs"], rows)
                + Html("<h3>Attribution patching against exact total patching</h3>") + atp + fig)


def _probes(a: Audit, s: dict[str, Any]) -> Html:
    p, info = a.probes, s["probes"]
    assert p is not None  # render() shows the not-run note instead
    rel = p.to_frame()["relative"]
    rows = [(ax, n, num(m), f"[{num(lo)}, {num(hi)}]", num(q, 2), num(d, 2), num(r, 2), "flagged" if fl else "")
            for ax, n, m, lo, hi, q, d, r, fl in
            zip(p.axes, p.n, p.mean, p.ci_low, p.ci_high, p.q, p.effect_size, rel, p.flagged)]
    text = Html(f"<p>Each axis changes one attribute of {info['n_items']} base items and measures reward(with) − "
                f"reward(without). Flagged: q &lt; {e(num(info['level']))} and |mean| ≥ "
                f"{e(num(info['min_effect']))} × scale = {e(num(info['flag_floor']))} reward units (scale "
                f"{e(num(info['scale']))}: {e(info['scale_source'])}).</p>")
    fig = figure("probes", figures.fig_probes(a),
                 "Mean reward change per probe axis (with − without, reward units) with its 95% bootstrap CI "
                 "over items; red: flagged; shaded: inside the flag floor ±min_effect × scale; q: "
                 "Benjamini–Hochberg across axes.", "probe forest plot")
    return Html(text + fig + table(["axis", "n", "mean", "95% CI", "q", "d_z", "mean / scale", "flag"], rows,
                                   ["bad" if f else "" for f in p.flagged]))


def _concepts(a: Audit, s: dict[str, Any]) -> Html:
    c = a.concepts
    assert c is not None  # render() shows the not-run note instead
    rows = [(r["concept"], f"{num(r['slope'])} [{num(r['slope_lo'], 2)}, {num(r['slope_hi'], 2)}]", num(r["r2"], 3),
             num(r["half_ratio"], 2), num(r["cosine"], 2), num(r["auroc_heldout"], 2), r["n_dose"])
            for r in c.summary()]
    text = Html(f"<p>Each concept's direction (difference of class means of the residual at the read token) is "
                f"added at layer {e(c.dose_layer)} as α units ({e(c.unit)}); the slope is reward per unit of α. "
                "Cosine and held-out AUROC are of the head-space direction at the last layer.</p>")
    fig = figure("concepts", figures.fig_concepts(a),
                 f"Dose-response per concept: mean reward change (reward units) against α ({c.unit} units) added at "
                 f"layer {c.dose_layer}; band: ±1.96 standard errors over dosed inputs; title: mean slope with its "
                 "bootstrap CI.", "concept dose-response curves")
    return Html(text + fig + table(["concept", "slope [95% CI]", "R²", "half ratio", "cosine", "AUROC held-out",
                                    "dosed inputs"], rows))


def _features(a: Audit, s: dict[str, Any]) -> Html:
    f = s["features"]
    split = f["margin_split"] or {}
    text = kv([("layer", f["layer"]), ("features that fired", f["n_fired"]), ("FVU", num(f["fvu"])),
               ("relative error Σ‖ε‖²/Σ‖x‖²", num(f["relative_error"])),
               *((f"mean margin carried by: {k.replace('_', ' ')}", f"{num(v)} reward units")
                 for k, v in split.items())])
    fig = figure("features", figures.fig_features(a),
                 f"The SAE features with the largest mean chosen − rejected contribution at layer {f['layer']} "
                 "(reward units; blue: favours chosen, red: favours rejected).", "top SAE features")
    return Html(text + fig)


RENDER: dict[str, Callable[[Audit, dict[str, Any]], Html]] = {
    "summary": _summary, "scores": _scores, "lens": _lens, "attribution": _attribution, "patching": _patching,
    "probes": _probes, "concepts": _concepts, "features": _features,
}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#1f3a5f;color:#fff;padding:14px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85;word-break:break-all}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:6px 28px;z-index:1}
nav a{margin-right:14px;color:#1f3a5f;text-decoration:none}
main{max-width:1100px;margin:0 auto;padding:8px 28px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:6px 20px 14px;margin:16px 0}
h2{font-size:18px;border-bottom:1px solid #eee;padding-bottom:4px}h3{font-size:15px;margin:14px 0 6px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 18px;margin:8px 0}dt{color:#555}
dd{margin:0;font-variant-numeric:tabular-nums;word-break:break-word}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums;font-size:13px}
th,td{border-bottom:1px solid #eee;padding:3px 10px;text-align:left}th{background:#f4f6f8}
tr.bad td{background:#fff1f0}
figure{margin:12px 0}figure img{max-width:100%;height:auto;display:block}
figcaption{color:#555;font-size:12.5px;margin-top:4px}
.notrun{color:#7a5b00;background:#fff8e1;border-left:3px solid #e0b000;padding:8px 12px}
code{background:#f2f2f2;padding:0 3px;border-radius:3px}footer{color:#666;font-size:12px}
"""

# Marks every decoded image and counts them on <body>, so a DOM dump shows the figures rendered;
# also records the laid-out page height (a screenshot of the whole page needs a window that tall).
SCRIPT = """
(function(){
  var imgs=document.querySelectorAll('img'), done=0, body=document.body;
  body.setAttribute('data-images-total', String(imgs.length));
  body.setAttribute('data-images-decoded', '0');
  function height(){body.setAttribute('data-page-height', String(document.documentElement.scrollHeight));}
  height();
  window.addEventListener('load', height);
  function mark(img){
    if(img.naturalWidth>0 && img.getAttribute('data-decoded')!=='1'){
      img.setAttribute('data-decoded','1'); done++;
      body.setAttribute('data-images-decoded', String(done)); height();
    }
  }
  imgs.forEach(function(img){
    if(img.complete){mark(img);} else {img.addEventListener('load', function(){mark(img);});}
    if(img.decode){img.decode().then(function(){mark(img);}, function(){});}
  });
})();
"""


def render(audit: Audit, numbers: dict[str, Any], tables: Iterable[str]) -> str:
    """The whole page as a string. `numbers`: `numbers.summary(audit)`; `tables`: Parquet file names."""
    parts = []
    for name in SECTIONS:
        instrument = getattr(audit, name, True)
        body = (Html(f'<p class="notrun">{NOT_RUN[name]}</p>') if instrument is None
                else RENDER[name](audit, numbers))
        parts.append(f'<section id="{name}"><h2>{e(TITLES[name])}</h2>{body}</section>')
    nav = "".join(f'<a href="#{name}">{e(TITLES[name])}</a>' for name in SECTIONS)
    files = ", ".join(f"<code>{e(t)}</code>" for t in ["numbers.json", *tables])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>rewardlens audit: {e(audit.model)}</title><style>{CSS}</style></head>\n"
        f'<body data-images-total="0" data-images-decoded="0"><header><h1>Reward-model audit</h1>'
        f"<p>{e(audit.model)} · {e(numbers['n_pairs'])} pairs · rewardlens {e(numbers['rewardlens_version'])}</p>"
        f"</header><nav>{nav}</nav><main>\n" + "\n".join(parts)
        + f"\n<footer><p>Every number on this page is in {files} beside this file.</p></footer></main>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )
