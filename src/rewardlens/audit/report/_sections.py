"""The report's sections for the instruments beside the audit's core: per-subset tables, the
crystallization-depth distribution, the direct / indirect split, divergence flags, tokens,
distortion, cascades and conflicts. Each opens with one plain-language line (`how`): what it
measures and how to read it. `_page` lays them out; the numbers come from `summary` (numbers.json).
"""

from __future__ import annotations

from typing import Any

from ...types import SEED_PAPER
from .._runner import Audit
from . import _figures as figures
from ._groups import labels
from ._html import TOP_ROWS, Html, e, figure, how, interval, kv, notrun, num, rho, table
from ._numbers import margins
from ._schema import AuditSummary
from ._tokens import token_section


def _depth(c: dict[str, Any]) -> str:
    return f"{num(c['median'], 2)} {interval(c['q25'], c['q75'])}" if c["defined"] else "— (no pair has a depth)"


def _counted(acc: dict[str, Any]) -> str:
    """A subset's pairs: '5', or '4 of 5' when pairs with non-finite numbers were left out."""
    return str(acc["n"]) if acc["n"] == acc["total"] else f"{acc['n']} of {acc['total']}"


def _notes(s: AuditSummary) -> Html:
    """The pairs the counts leave out and a saturated model, one note each (nothing when neither)."""
    return Html("".join(f'<p class="note">{e(note)}</p>' for note in s["scores"]["notes"]))


def subsets(_a: Audit, s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    g = s["subsets"]
    if g is None:
        return notrun("The pairs carry no subset (<code>Pair.subset</code>; RewardBench's <code>subset</code> "
                      "field), so there are no per-subset tables.")
    text = how("Does the model behave differently on different kinds of prompt? One row per subset of the pairs: "
               "accuracy with its 95% Wilson interval, the median crystallization depth with its interquartile "
               f"range, and the statistic of the seed paper ({SEED_PAPER}) with a 95% bootstrap interval over the "
               "subset's pairs (the "
               "mean total effect of the top parts in each subset is under Attribution). Intervals that do not "
               "overlap mark a real difference; overlapping ones on a few dozen pairs are not evidence that there is "
               "none. Pick a subset at the top of the page to narrow every per-pair table to it.")
    rows = []
    for name in g["names"]:
        acc, c, seed = g["accuracy"][name], g["crystallization"][name], g["seed_statistic"][name]
        rows.append((name, _counted(acc), f"{num(acc['accuracy'], 2)} {interval(acc['lo'], acc['hi'])}",
                     _depth(c["linear"]), _depth(c["normed"]), rho(seed["rho"], seed["lo"], seed["hi"])))
    return Html(text + _notes(s) + table(["subset", "pairs", "accuracy [95% CI]", "depth linear, median [IQR]",
                              "depth normed, median [IQR]", "seed statistic ρ [95% CI]"], rows, **_by(g["names"])))


def _by(names: list[str]) -> dict[str, Any]:
    """A per-subset table's rows: narrowed by the subset selector; collapsed to the first `TOP_ROWS` in the
    groups' own order (by name; `_groups.groups`) — subsets have no ranking of their own."""
    return {"subsets": names, "top": range(min(TOP_ROWS, len(names)))}


def subset_parts(s: AuditSummary) -> Html:
    """The top parts' mean total effect per subset (`_groups.subsets`), one row per subset ('' without subsets)."""
    g = s["subsets"]
    if g is None:
        return Html("")
    parts = g["top_parts"]
    rows = [(name, *(num(v) for v in parts["mean_total_effect"][name])) for name in g["names"]]
    return Html("<h3>Mean total effect of the top parts per subset (reward units)</h3>"
                + table(["subset", *parts["parts"]], rows, **_by(g["names"])))


def _depth_by_subset(s: AuditSummary) -> Html:
    """Median depth [IQR] per subset and lens (`_groups.subsets`), one row per subset ('' without subsets)."""
    g = s["subsets"]
    if g is None:
        return Html("")
    rows = [(name, g["crystallization"][name]["linear"]["defined"], _depth(g["crystallization"][name]["linear"]),
             _depth(g["crystallization"][name]["normed"])) for name in g["names"]]
    return Html("<h3>By subset</h3>" + table(["subset", "pairs with a depth (linear)", "linear, median [IQR]",
                                              "normed, median [IQR]"], rows, **_by(g["names"])))


def crystallization(a: Audit, s: AuditSummary) -> Html:
    lens = s["lens"]
    text = how(f"Crystallization depth is the first depth l/L (0 = embeddings, 1 = the reward) after which a pair's "
               f"chosen − rejected margin stays on its final side and beyond {lens['fraction']:g} of it. An early "
               "depth means the preference is settled in the first layers, a late one in the last; a wide "
               "interquartile range means the pairs are settled at different depths. Pairs whose final margin is "
               "too small to have a side have no depth.")
    iqr = lens["crystallization_iqr"]
    rows = [(kind, f"{lens['crystallization_defined'][kind]} of {s['n_pairs']}",
             num(lens["crystallization_median"][kind], 2), interval(iqr[kind][0], iqr[kind][1]))
            for kind in ("linear", "normed")]
    by = " stacked by subset" if s["subsets"] is not None else ""
    fig = figure("crystallization", figures.fig_crystallization(a),
                 f"Pairs per crystallization depth l/L{by}, linear (left) and normed (right) lens; dashed: median; "
                 "shaded: interquartile range.", "crystallization depth histogram")
    # Named here too: this section is always on the page, and a pair left out has no depth either.
    return Html(text + _notes(s) + table(["lens", "pairs with a depth", "median", "interquartile range"], rows)
                + _depth_by_subset(s) + fig)


def estimands(a: Audit, s: AuditSummary) -> Html:
    text = how("For the parts with the largest mean total effect: the direct effect (what the part writes straight "
               "into the reward; path-frozen patching), the indirect effect (what it changes in later layers) and "
               "their sum, the total effect (activation patching at the read position). Attribution measures the "
               "direct path only, so it tracks the direct effect; a part with a large indirect share looks small to "
               "attribution yet matters to patching. That is why attribution and patching rank parts differently: "
               "they answer different questions, and neither is wrong.")
    rows = [(r["part"], num(r["mean_abs_total"]), num(r["total"]), num(r["attribution"]), num(r["direct"]),
             num(r["indirect"]), num(r["indirect_share"], 2)) for r in s["estimands"]]
    fig = figure("estimands", figures.fig_estimands(a),
                 "Mean direct (blue), indirect (orange) and total (grey) effect on the margin of the parts with the "
                 "largest mean |total effect| (reward units); black tick: mean attribution.", "estimand split")
    return Html(text + table(["part", "mean |total| (ranked by)", "total", "attribution", "direct", "indirect",
                              "indirect share |ind| / (|dir| + |ind|)"], rows) + fig)


def divergence(_a: Audit, s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    d = s["divergence"]
    assert d is not None  # render() shows the not-run note instead
    text = how("A patched run can move the reward only because it pushed later layers somewhere the model never "
               "goes. Each patched run's later residual stream is measured against natural runs (whitened distance "
               "over the 99th percentile of natural distances); a score above 1 flags the run as out of "
               "distribution. An effect marked here rests on such runs: read it as what the model does off its own "
               "distribution, not as evidence about its normal computation.")
    facts = kv([("patched runs flagged", num(d["flagged_share"], 2)),
                ("share of total |effect| from flagged runs", num(d["effect_share_flagged"], 2)),
                ("flagged share among the ten largest parts", num(d["top_flagged_share"], 2))])
    rows, marks = [], []
    for p in d["parts"]:
        ood = p["flagged_runs"] > 0
        mark = f"out of distribution in {p['flagged_runs']} of {p['runs']} runs" if ood else "in distribution"
        rows.append((p["part"], num(p.get("mean_abs_total")), num(p["mean_effect"]), mark, num(p["max_score"], 2),
                     num(p["mean_effect_in_distribution"])))
        marks.append("bad" if ood else "")
    return Html(text + facts + table(["part", "mean |total effect| (ranked by)", "mean total effect", "patched states",
                                      "largest score", "mean effect, in-distribution runs only"], rows, marks))


def tokens(a: Audit, _s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    assert a.tokens is not None  # render() shows the not-run note instead
    text = how("Which words the reward was built from. At the read position each attention head's write splits "
               "exactly over the source tokens it attends to; a token's value sums its share over every head and "
               "layer (reward units). What is written at the read token itself (embeddings, MLPs, biases) and the "
               "constant complete each side's reward. Chosen and rejected have their own tokens, so there is no "
               "token-by-token difference: compare where each side's reward comes from. A token's value is its "
               "direct effect through one attention hop, not everything it changes.")
    _, _, m = margins(a)
    shown = a.token_pairs  # the audit attributes the tokens of these pairs only (at most TOKEN_PAIRS)
    more = (f"<p>The audit attributes the tokens of the {len(shown)} pairs with the largest |margin| of "
            f"{len(a.pair_ids)}; <code>rewardlens tokens</code> attributes any others.</p>"
            if len(shown) < len(a.pair_ids) else "")
    names = labels(a)
    return Html(text + more + token_section(a.tokens, [str(a.pair_ids[i]) for i in shown], m[shown],
                                            subsets=None if names is None else [names[i] for i in shown]))


def distortion(_a: Audit, s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    d = s["distortion"]
    assert d is not None  # render() shows the not-run note instead
    text = how("How much the reward moves with an attribute that should not matter (a probe axis) in units of how "
               "much it moves with a quality that should: D = |mean probe effect| / mean quality drop. D = 0.5 "
               "reads 'this attribute moves the reward half as much as a correct answer over a wrong one'. "
               f"Flagged: the probe flagged the axis and the interval's low end is at least {num(d['threshold'])}. "
               "Undefined (—) when the model does not reliably reward the quality; the reason is given below.")
    quality = list(d["quality"])
    notes = "".join(f"<p class=\"note\">{e(q)}: {e(v['note'])}</p>" for q, v in d["quality"].items() if v["note"])
    effects = table(["quality", "mean drop (reward units) [95% CI]"],
                    [(q, f"{num(v['effect'])} {interval(v['lo'], v['hi'])}") for q, v in d["quality"].items()])
    rows, marks = [], []
    for axis, per in d["axes"].items():
        rows.append((axis, *(f"{num(per[q]['index'], 2)} {interval(per[q]['lo'], per[q]['hi'])}" for q in quality)))
        marks.append("bad" if any(per[q]["flagged"] for q in quality) else "")
    return Html(text + effects + Html(notes) + table(["axis", *(f"D vs {q} [95% CI]" for q in quality)], rows, marks))


def cascades(a: Audit, s: AuditSummary) -> Html:
    c = s["cascades"]
    assert c is not None  # render() shows the not-run note instead
    text = how("Which probe axes fail together: Spearman ρ between two axes' per-item effects, each oriented so "
               "that larger means further in the model's bias. A cluster is a group of flagged axes linked by "
               f"ρ ≥ {num(c['threshold'])} with an interval above 0: the items on which one bias bites hard are "
               "the items on which the other does too. A correlation needs at least "
               f"{c['min_items']} shared items (— below that).")
    clusters = ("; ".join(" + ".join(g) for g in c["clusters"]) if c["clusters"]
                else "none (no two flagged axes fail together)")
    facts = kv([("clusters", clusters), ("defined correlations", c["defined_links"]),
                ("most items two axes share", c["max_shared_items"])])
    rows = [(r["axis_a"], r["axis_b"], rho(r["rho"], r["lo"], r["hi"]), r["n_shared"]) for r in c["links"]]
    fig = figure("cascades", figures.fig_cascades(a),
                 "Spearman ρ between probe axes' oriented per-item effects; grey: too few shared items.",
                 "cascade correlations")
    return Html(text + facts + Html("<h3>Strongest links</h3>")
                + table(["axis", "axis", "ρ [95% CI]", "shared items"], rows) + fig)


def conflicts(a: Audit, s: AuditSummary) -> Html:
    c = s["conflicts"]
    assert c is not None  # render() shows the not-run note instead
    text = how("Does a head with several outputs (ArmoRM-like) pull preferences apart? For every two of its terms: "
               "the cosine of their directions, the Spearman ρ of their per-pair margins, and the share of pairs "
               "on which both are decisive and point opposite ways. The relation comes from 95% bootstrap intervals "
               "over pairs: aligned, orthogonal, conflicting (they disagree on a real share of pairs) or mixed.")
    rows = [(r["term_a"], r["term_b"], num(r["cosine"], 2), rho(r["spearman"], r["spearman_lo"], r["spearman_hi"]),
             f"{num(r['disagree'], 2)} {interval(r['disagree_lo'], r['disagree_hi'])}", r["relation"])
            for r in c["pairs"]]
    fig = figure("conflicts", figures.fig_conflicts(a),
                 f"Terms of the head ({c['source']}; {c['direction_note']}): cosine of their directions (left) and "
                 "the decisive disagreement share with each pair's relation (right).", "conflict matrix")
    return Html(text + table(["term", "term", "cosine", "margin ρ [95% CI]", "disagreement share [95% CI]",
                              "relation"], rows, ["bad" if r["relation"] == "conflicting" else "" for r in c["pairs"]])
                + fig)
