"""`report.html`: one self-contained page (inline CSS, figures as PNG data URIs, no external URL).

Every section is a `<section id=...>`; every figure a `<figure id="fig-..." data-figure=...>` with
one `<img>` and a caption saying what is plotted and in which units. All text that comes from the
user or the model (pair ids, the model's repr, concept names) goes through `html.escape`. A few
lines of inline script mark each image `data-decoded="1"` once the browser has decoded it and
count them on `<body data-images-decoded=...>`, so a headless browser's DOM dump shows that
every figure rendered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ...stats import mean_abs, top_parts
from ...types import SEED_PAPER, SEED_PAPER_RHO
from .._runner import Audit
from . import _figures as figures
from . import _html
from . import _sections as more
from ._circuit import circuit_section
from ._findings import findings_html
from ._graphs import graphs_section
from ._groups import counted, counted_mean
from ._html import TOP_ROWS, Html, e, figure, how, kv, notrun, num, rho, subset_picker, table
from ._pairs import scores
from ._schema import AuditSummary
from ._steps import steps_section

SECTIONS = ("findings", "summary", "scores", "subsets", "steps", "lens", "crystallization", "attribution", "patching",
            "estimands", "divergence", "circuit", "graphs", "tokens", "probes", "distortion", "cascades", "concepts",
            "conflicts", "features")
TITLES = {"findings": "Findings", "summary": "Summary", "scores": "Scores", "subsets": "By subset", "steps": "Steps",
          "lens": "Reward lens",
          "crystallization": "Crystallization depth", "attribution": "Attribution",
          "patching": "Patching and faithfulness", "estimands": "Direct, indirect and total effects",
          "divergence": "Divergence of patched states", "circuit": "Circuit of the top edges",
          "graphs": "Attribution graphs", "tokens": "Tokens",
          "probes": "Reward-hacking probes",
          "distortion": "Distortion index", "cascades": "Cascades", "concepts": "Concepts",
          "conflicts": "Conflicts between terms", "features": "SAE features"}
NOT_RUN = {
    "steps": "This model reads its reward at one token per sequence, so there are no steps. A process reward "
             "model (<code>rewardlens.model.load_prm</code>) or a DPO reward "
             "(<code>rewardlens.model.load_dpo</code>) reads it at a set of positions; this section then says "
             "where each pair's preference forms.",
    "probes": "Probes were not run. <code>rewardlens audit</code> runs them unless given <code>--no-probes</code>; "
              "alone: <code>rewardlens probe MODEL</code> or <code>rewardlens.probe(model)</code>.",
    "concepts": "Concepts were not run. <code>rewardlens audit</code> runs them unless given "
                "<code>--no-concepts</code>; alone: <code>rewardlens concepts MODEL</code> or "
                "<code>rewardlens.concepts(model)</code>.",
    "features": "SAE feature attribution was not run: it needs an SAE trained on this model "
                "(<code>rewardlens sae train MODEL --pairs FILE --layer L --out DIR</code>), then "
                "<code>rewardlens audit MODEL --pairs FILE --sae DIR/…</code> or "
                "<code>rewardlens.attribute_features(model, sae, pairs, layer=L)</code>.",
    "tokens": "Token attribution was not computed for this audit; alone: <code>rewardlens tokens MODEL --pairs "
              "FILE</code> or <code>rewardlens.tokens(model, pairs)</code>.",
    "divergence": "Divergence scores were not computed: they need at least 4 pairs (the natural fit needs 8 "
                  "sequences), and <code>rewardlens audit</code> computes them unless given "
                  "<code>--no-divergence</code>; alone: <code>rewardlens patch MODEL --pairs FILE --level head "
                  "--divergence</code> or <code>rewardlens.patch(model, pairs, level='head', divergence=True)</code>.",
    "circuit": "The circuit was not computed: it costs EAP-IG's 5 backwards and one forward per circuit size for "
               "every pair, so <code>rewardlens audit</code> computes it only when given <code>--circuit</code> "
               "(<code>Plan(circuit=True)</code>); a model with a parallel layout or a post-norm encoder has no "
               "edge circuit. Alone: <code>rewardlens circuit MODEL --pairs FILE</code> or "
               "<code>rewardlens.circuit(model, pairs, top=10)</code>.",
    "graphs": "The attribution graphs were not computed: each costs many backward passes a side, so "
              "<code>rewardlens audit</code> builds the margin graphs of the first pairs it shows only when given "
              "<code>--graph</code> (<code>Plan(graph=True)</code>), over <code>--transcoders DIR</code> or, on a "
              "small model, the MLPs' own neurons. Alone: <code>rewardlens graph MODEL --pairs FILE --transcoders "
              "DIR --out DIR</code> or <code>rewardlens.graph(model, pairs, transcoders)</code> (docs/graphs.md).",
    "distortion": "The distortion index is derived from the probes' quality degradations, and the probes were not "
                  "run (or scored none); alone: <code>rewardlens.hacking.distortion(rewardlens.probe(model))</code>.",
    "cascades": "Cascades are derived from the probes' per-item effects, and the probes were not run; alone: "
                "<code>rewardlens.hacking.cascade(rewardlens.probe(model))</code>.",
    "conflicts": "Conflicts between terms are measured for heads with several outputs (ArmoRM-like); this model's "
                 "head has one output, or the audit has fewer than 3 pairs. Terms of your own (pair sets): "
                 "<code>rewardlens conflict MODEL --pairs FILE --term NAME=FILE --term NAME=FILE</code>.",
}


# ---- sections ---------------------------------------------------------------------------------------

def _summary(a: Audit, s: AuditSummary) -> Html:
    sc, lens, faith = s["scores"], s["lens"], s["faithfulness"]
    n = s["n_pairs"]
    med = lens["crystallization_median"]
    seed = faith["seed_statistic"]
    paper = ", ".join(f"{v:+.3f} {k}" for k, v in seed["paper"].items())
    probes = s["probes"]
    flagged = "not run" if probes is None else probes["headline"]  # findings apart from fragile flags, the scale
    items = [
        ("model", a.model), ("fingerprint", a.fingerprint), ("data checksum", a.data_checksum),
        ("pairs", n if not s["skipped"] else f"{n} ({len(s['skipped'])} skipped: "
                  + "; ".join(f"{k}: {v}" for k, v in s["skipped"].items()) + ")"), ("layers", s["n_layers"]),
        ("accuracy (chosen reward > rejected) [95% Wilson CI]",
         f"{num(sc['accuracy'])} [{num(sc['accuracy_ci'][0], 2)}, {num(sc['accuracy_ci'][1], 2)}] "
         f"({sc['correct']} of {sc['counted']} counted)"),
        *(("not counted", note) for note in sc["notes"]),  # non-finite pairs (named), a saturated model
        ("subsets", "none given" if s["subsets"] is None else ", ".join(s["subsets"]["names"])),
        ("mean margin, chosen − rejected", f"{num(sc['mean_margin'])} reward units"),
        (f"median crystallization depth l/L (fraction {lens['fraction']:g})",
         f"linear {num(med['linear'])}, normed {num(med['normed'])}"),
        ("closure error max |reward − Σ parts − constant|", f"{num(s['closure_error']['max'])} reward units"),
        ("attribution vs direct effect, pooled ρ [95% CI]", rho(**_rho(faith["pooled"]["direct"]))),
        ("attribution vs total effect, pooled ρ [95% CI]", rho(**_rho(faith["pooled"]["total"]))),
        (f"seed statistic |attribution| vs |{seed['mode']}, {seed['positions']}|",
         f"{rho(seed['rho'], seed['lo'], seed['hi'])} (the seed paper, {SEED_PAPER}: {paper})"),
        ("flagged probe axes", flagged),
        ("score parity, rewardlens against the model's own forward",
         s["parity_line"] or s["parity_note"] or "not run"),
        *_more_summary(s),
    ]
    return kv(items)


def _more_summary(s: AuditSummary) -> list[tuple[str, str]]:
    """Headlines of the divergence, circuit, distortion, cascade and conflict results ('not run' without them)."""
    div, dist, casc, conf, circ = s["divergence"], s["distortion"], s["cascades"], s["conflicts"], s["circuit"]
    return [
        ("patched runs out of distribution (divergence > 1)",
         "not run" if div is None else f"{num(div['flagged_share'], 2)} of runs, carrying "
                                       f"{num(div['effect_share_flagged'], 2)} of the total |effect|"),
        ("share of each pair's own clean margin the circuit carries", "not run" if circ is None else
         f"{num(circ['share'], 3)} with {len(circ['kept'])} {circ['level']} edges"
         + (f" ({circ['warning']})" if circ.get("warning") else "")),
        ("flagged distortion indices", "not run" if dist is None else ", ".join(dist["flagged"]) or "none"),
        ("cascade clusters", "not run" if casc is None else "; ".join(" + ".join(g) for g in casc["clusters"])
         or "none"),
        ("conflicting terms", "not applicable" if conf is None else ", ".join(
            f"{r['term_a']} / {r['term_b']}" for r in conf["pairs"] if r["relation"] == "conflicting") or "none"),
    ]


def _rho(d: Mapping[str, Any]) -> dict[str, Any]:
    return {"mean": d["rho"], "lo": d["lo"], "hi": d["hi"]}


def _lens(a: Audit, s: AuditSummary) -> Html:
    lens = s["lens"]
    note = (f"<p>{lens['near_zero_margin_pairs']} pair(s) have a final margin too small to define a side; their "
            "crystallization depth is left out.</p>" if lens["near_zero_margin_pairs"] else "")
    text = Html("<p class=\"how\">The <b>linear lens</b> at depth l is the sum of the exact contributions of the "
                "embeddings and "
                "layers up to l, with the final norm's scale frozen; the <b>normed lens</b> re-applies the final "
                "norm to the partial residual (logit-lens style). Both end at the reward. Crystallization depth: "
                "the first depth after which the margin stays on the final margin's side and beyond "
                f"{lens['fraction']:g} of it.</p>{note}")
    fig = figure("lens", figures.fig_lens(a),
                 f"Chosen − rejected margin (reward units) against relative depth l/L for the linear (left) and "
                 f"normed (right) lens; thin lines: each of the {s['n_pairs']} pairs, bold: mean; dashed: median "
                 "crystallization depth.", "lens curves")
    return Html(text + fig)


def _attribution(a: Audit, s: AuditSummary) -> Html:
    c = s["closure_error"]
    sub = a.sublayers
    rows = [(name, num(m), num(v)) for name, m, v in
            zip(sub.names, counted_mean(a, sub.margin), counted_mean(a, np.abs(sub.values)))]
    heads = a.heads.margin[counted(a).finite]  # the counted pairs, as every table of parts
    size, top = mean_abs(heads), top_parts(heads, 10)  # the one ranking rule, its statistic shown as a column
    mean = counted_mean(a, a.heads.margin)
    text = Html("<p class=\"how\">Each part's exact direct contribution to the reward (the final norm's scale "
                "frozen); the "
                f"parts plus a constant equal the reward: max |reward − Σ parts − constant| is "
                f"{e(num(c['sublayers']))} (sublayers) and {e(num(c['heads']))} (heads) reward units.</p>")
    fig = figure("heatmap", figures.fig_heatmaps(a),
                 "Left: mean chosen − rejected contribution of each attention head, MLP and the embeddings "
                 "(reward units). Right: mean total effect of read-position patching of the same part "
                 f"({a.faithfulness.mode}, reward units). Rows: layers (top row: embeddings); columns: heads, "
                 "then the MLP (right-hand column, which holds the embeddings in the top row); grey: no such "
                 "part.", "part heatmaps")
    shown = [sub.names.index(n) for n, _ in sub.top(TOP_ROWS)]  # the result's own ranking: mean |contribution|
    return Html(text + Html("<h3>Sublayers</h3>")
                + table(["part", "mean margin contribution", "mean |contribution|"], rows, top=shown)
                + more.subset_parts(s)
                + Html("<h3>Top heads and MLPs by mean |margin contribution|</h3>")
                + table(["part", "mean |margin contribution| (ranked by)", "mean margin contribution"],
                        [(a.heads.names[i], num(size[i]), num(mean[i])) for i in top]) + fig)


def _patching(a: Audit, s: AuditSummary) -> Html:
    f = s["faithfulness"]
    rows = [(f"attribution vs {k}", rho(v["rho"], v["lo"], v["hi"]), v["pairs"]) for k, v in f["pooled"].items()]
    seed = f["seed_statistic"]
    rows.append((f"seed statistic |attribution| vs |{seed['mode']}, {seed['positions']}| (sublayers)",
                 rho(seed["rho"], seed["lo"], seed["hi"]), seed["pairs"]))
    if f["paper_statistic"] is not None:
        ps = f["paper_statistic"]
        rows.append(("seed statistic, the paper's way: |attribution| vs |noising, prefix| (attention and MLP "
                     "sublayers)", rho(ps["rho"], ps["lo"], ps["hi"]), ps["pairs"]))
    agree = f["attribution_patching_agreement"]
    text = Html("<p class=\"how\"><b>Direct</b>: path-frozen patching (later parts held, only the final norm's scale "
                "recomputed) — the causal version of attribution. <b>Total</b>: activation patching at the read "
                "position. <b>Indirect</b> = total − direct. Spearman ρ is computed per pair across parts, then "
                f"pooled as a mean with a bootstrap interval over pairs ({e(f['level'])} level, "
                f"{e(f['mode'])}). The seed paper, {e(SEED_PAPER)}, reported ρ = "
                f"{e(', '.join(f'{v:+.3f}'.replace('-', '−') + f' ({k})' for k, v in SEED_PAPER_RHO.items()))} for its "
                "statistic.</p>")
    atp = kv([(k.replace("_", " "), num(v)) for k, v in agree.items()])
    fig = figure("scatter", figures.fig_scatter(a),
                 "Attribution (chosen − rejected contribution, reward units) against the direct (left) and total "
                 f"(right) read-position patching effect ({a.faithfulness.mode}, reward units); one point per pair "
                 "and part, coloured by part kind (positive: the part carries the preference); dotted: y = x; titles: "
                 "pooled Spearman ρ with 95% CI.",
                 "attribution vs patching")
    return Html(text + table(["comparison", "ρ [95% CI]", "pairs"], rows)
                + Html("<h3>Attribution patching against exact total patching</h3>") + atp + fig)


def _probes(a: Audit, s: AuditSummary) -> Html:
    p, info = a.probes, s["probes"]
    assert p is not None and info is not None  # render() shows the not-run note instead
    rel = p.to_frame()["relative"]
    flags = [("flagged" if fl else "") + (", fragile: " if fl and why else "fragile: " if why else "") + why
             for fl, why in zip(p.flagged, p.fragile_reason)]
    rows = [(ax, n, num(m), f"[{num(lo)}, {num(hi)}]", num(q, 2), num(d, 2), num(r, 2), flag)
            for ax, n, m, lo, hi, q, d, r, flag in
            zip(p.axes, p.n, p.mean, p.ci_low, p.ci_high, p.q, p.effect_size, rel, flags)]
    alt = "" if info["alt_scale"] is None or info["alt_scale"] != info["alt_scale"] else (
        f" Each flag is also computed under the scale {num(info['alt_scale'])} ({info['alt_scale_source']}, the "
        f"audit's {s['n_pairs']} pairs): an axis whose flag differs is fragile, shown but never a finding.")
    text = Html(f"<p class=\"how\">Each axis changes one attribute of {info['n_items']} base items and measures "
                "reward(with) − "
                f"reward(without). Flagged: q &lt; {e(num(info['level']))} and |mean| ≥ "
                f"{e(num(info['min_effect']))} × scale = {e(num(info['flag_floor']))} reward units (scale "
                f"{e(num(info['scale']))}: {e(info['scale_source'])}).{e(alt)} {e(info['budget'])}</p>")
    fig = figure("probes", figures.fig_probes(a),
                 "Mean reward change per probe axis (with − without, reward units) with its 95% bootstrap CI "
                 "over items; red: flagged; orange, hollow: fragile; shaded: inside the flag floor ±min_effect × "
                 "scale; q: "
                 "Benjamini–Hochberg across axes.", "probe forest plot")
    return Html(text + fig + table(["axis", "n", "mean", "95% CI", "q", "d_z", "mean / scale", "flag"], rows,
                                   ["bad" if f and not w else "" for f, w in zip(p.flagged, p.fragile)]))


def _concepts(a: Audit, _s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    c = a.concepts
    assert c is not None  # render() shows the not-run note instead
    rows = [(r["concept"], f"{num(r['slope'])} [{num(r['slope_lo'], 2)}, {num(r['slope_hi'], 2)}]", num(r["r2"], 3),
             num(r["half_ratio"], 2), num(r["cosine"], 2), num(r["auroc_heldout"], 2), r["n_dose"])
            for r in c.rows()]
    text = Html("<p class=\"how\">Each concept's direction (difference of class means of the residual at the read "
                "token) is "
                f"added at layer {e(c.dose_layer)} as α units ({e(c.unit)}); the slope is reward per unit of α. "
                "Cosine and held-out AUROC are of the head-space direction at the last layer.</p>")
    fig = figure("concepts", figures.fig_concepts(a),
                 f"Dose-response per concept: mean reward change (reward units) against α ({c.unit} units) added at "
                 f"layer {c.dose_layer}; band: ±1.96 standard errors over dosed inputs; title: mean slope with its "
                 "bootstrap CI.", "concept dose-response curves")
    return Html(text + fig + table(["concept", "slope [95% CI]", "R²", "half ratio", "cosine", "AUROC held-out",
                                    "dosed inputs"], rows))


def _features(a: Audit, s: AuditSummary) -> Html:
    f = s["features"]
    assert f is not None  # render() shows the not-run note instead
    split = f["margin_split"] or {}
    text = how("Which sparse-autoencoder features of the residual stream at one layer carry the margin: each "
               "feature's exact share of what the head reads (reward units), with the SAE's error and the parts "
               "after the layer completing the margin.") + kv([
               ("layer", f["layer"]), ("features that fired", f["n_fired"]), ("FVU", num(f["fvu"])),
               ("relative error Σ‖ε‖²/Σ‖x‖²", num(f["relative_error"])),
               *((f"mean margin carried by: {k.replace('_', ' ')}", f"{num(v)} reward units")
                 for k, v in split.items())])
    fig = figure("features", figures.fig_features(a),
                 f"The SAE features with the largest mean chosen − rejected contribution at layer {f['layer']} "
                 "(reward units; blue: favours chosen, red: favours rejected).", "top SAE features")
    return Html(text + fig)


RENDER: dict[str, Callable[[Audit, AuditSummary], Html]] = {
    "findings": lambda _a, s: Html(findings_html(s["findings"])),
    "summary": _summary, "lens": _lens, "attribution": _attribution, "patching": _patching,
    "probes": _probes, "concepts": _concepts, "features": _features, "subsets": more.subsets,
    "scores": scores,
    "crystallization": more.crystallization, "estimands": more.estimands, "divergence": more.divergence,
    "circuit": circuit_section, "graphs": graphs_section,
    "tokens": more.tokens, "distortion": more.distortion, "cascades": more.cascades, "conflicts": more.conflicts,
    "steps": steps_section,
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
.how{color:#333;background:#f4f8fc;border-left:3px solid #1f3a5f;padding:6px 12px}.note{color:#7a5b00}
.finding .strength{font-size:11px;background:#e8eef5;border-radius:3px;padding:0 4px;color:#1f3a5f}
.finding[data-strength="too few pairs"] .strength,.finding[data-strength=fragile] .strength{background:#fff1d6}
.tokpair h3{margin:16px 0 4px}.sides{display:grid;grid-template-columns:1fr 1fr;gap:12px}.sides h4{margin:2px 0;
font-size:12.5px;font-weight:500;color:#333}.toks{white-space:pre-wrap;word-break:break-word;font:12px/1.75
ui-monospace,Menlo,Consolas,monospace;border:1px solid #e6e6e6;border-radius:4px;padding:6px;max-height:360px;
overflow:auto}.tok{border-radius:2px}.tok.read{outline:2px solid #1d1d1f}.legend{display:flex;align-items:center;
gap:8px;font-size:12.5px;margin:8px 0}.legend .bar{display:inline-block;width:220px;height:12px;border:1px solid #ccc}
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


def render(audit: Audit, numbers: AuditSummary, tables: Iterable[str]) -> str:
    """The whole page as a string. `numbers`: `numbers.summary(audit)`; `tables`: Parquet file names."""
    parts = []
    for name in SECTIONS:
        instrument = getattr(audit, name, True)
        body = notrun(NOT_RUN[name]) if instrument is None else RENDER[name](audit, numbers)
        parts.append(f'<section id="{name}"><h2>{e(TITLES[name])}</h2>{body}</section>')
    nav = "".join(f'<a href="#{name}">{e(TITLES[name])}</a>' for name in SECTIONS)
    if numbers["subsets"] is not None:
        nav = subset_picker(numbers["subsets"]["names"]) + nav
    files = ", ".join(f"<code>{e(t)}</code>" for t in ["numbers.json", *tables])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>rewardlens audit: {e(audit.model)}</title><style>{CSS}{_html.CSS}</style></head>\n"
        f'<body data-images-total="0" data-images-decoded="0"><header><h1>Reward-model audit</h1>'
        f"<p>{e(audit.model)} · {e(numbers['n_pairs'])} pairs · rewardlens {e(numbers['rewardlens_version'])}</p>"
        f"</header><nav>{nav}</nav><main>\n" + "\n".join(parts)
        + f"\n<footer><p>Every number on this page is in {files} beside this file.</p></footer></main>"
        f"<script>{SCRIPT}{_html.SCRIPT}</script></body></html>\n"
    )
