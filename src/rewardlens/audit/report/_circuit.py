"""The report's circuit section: the audit's `Circuit` (`Plan(circuit=True)`) as its own numbers
(`Circuit.to_dict()`, read from the audit summary: the page and `numbers.json` show the same ones) and
its own `plot()`, drawn on a pyplot-free figure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._canvas import need, new_figure
from ._html import Html, e, figure, how, kv, num, table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .._runner import Audit
    from ._schema import AuditSummary


def fig_circuit(audit: Audit) -> Figure:
    """The kept circuit as a layered graph (`Circuit.plot`: parts by depth, edge width |score|, colour sign)."""
    c = need(audit.circuit, "circuit", "run the audit with --circuit (Plan(circuit=True)), or rewardlens.circuit")
    fig = new_figure(6.5, 6)
    c.plot(ax=fig.subplots())
    return fig


def circuit_section(a: Audit, s: AuditSummary) -> Html:
    """What the circuit measures, its headline numbers, its kept edges, its share curve and its graph."""
    c = s["circuit"]
    assert c is not None  # render() shows the not-run note instead
    text = how(f"Every edge (an upstream part's write into a downstream part's input, or into the reward) is "
               f"scored by {c['method'].upper()} ({c['level']} level, {c['mode']}); the circuit keeps the "
               f"{len(c['kept'])} edges with the largest mean |score|. Faithfulness: each pair's margin when only the "
               "circuit's edges carry the clean run and every other edge carries its upstream part's corrupted "
               "write, as a share of that pair's own clean margin, pooled with weights |margin| (1: the circuit "
               "carries all of it); the share of the mean clean margin, a ratio of means, is shown beside it and is "
               "ill-conditioned when the pairs' margins disagree in sign. Scores of edges into the reward are exact; "
               "the others are first-order estimates. The share is measured, not estimated.")
    warn = Html(f'<p class="note">{e(c["warning"])}</p>') if c.get("warning") else Html("")
    old = c.get("share_of_mean_margin", float("nan"))  # a summary made before it was kept has none
    head = kv([("share of each pair's own clean margin the circuit carries", num(c["share"], 3)),
               ("share of the mean clean margin (ratio of means)", num(old, 3)),
               ("mean clean margin (every edge)", f"{num(c['clean_margin'])} reward units"),
               ("mean margin with no edge kept", f"{num(c['empty_margin'])} reward units"),
               ("edges kept", len(c["kept"]))])
    kept = table(["upstream", "downstream", "mean |score| (ranked by)", "mean score (reward units)", "score"],
                 [(k["upstream"], k["downstream"], num(k.get("mean_abs_score", float("nan"))), num(k["score"]),
                   "exact" if k["exact"] else "estimate") for k in c["kept"]])
    curve = table(["edges kept (best first)", "share of each pair's own margin", "share of the mean clean margin"],
                  [(p["edges"], num(p["share"], 3), num(p.get("share_of_mean_margin", float("nan")), 3))
                   for p in c["curve"]])
    fig = figure("circuit", fig_circuit(a),
                 f"The circuit of {len(c['kept'])} edges as a layered graph: parts by depth (layers; the read-out "
                 "on top), edge width by mean |score| (reward units), blue: the edge carries the preference, red: "
                 "against it.", "circuit graph")
    return Html(text + warn + head + Html("<h3>Kept edges</h3>") + kept
                + Html("<h3>Faithfulness against circuit size</h3>") + curve + fig)
