"""The report's attribution-graph section (`Plan(graph=True)`, `rewardlens audit --graph`): one sentence per
graphed pair and a table, every number the graph computed of itself (`AuditGraphs`, read from the audit
summary: the page and `numbers.json` show the same ones), and a link to each pair's interactive page, which
`graph_pages` writes beside the report with the graphs' page writer from the stored pruned graph."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...graphs import write_graph_page
from ...graphs.internal import Context
from .._graph import GRAPH_FEATURES, GRAPH_MAX_NODES, GRAPH_PAIRS, GRAPH_PATHS, NEURON_LIMIT
from ._html import Html, e, how, num, table

if TYPE_CHECKING:
    from .._runner import Audit
    from ._schema import AuditSummary

PAGES = "graphs"
"""The folder beside `report.html` that holds each graphed pair's page, `pair_<i>.html` (i: the audit's pair)."""
_OWN_PAGE = re.compile(r"pair_\d+\.html")


def page_path(pair: int) -> str:
    """A graphed pair's page, relative to the report."""
    return f"{PAGES}/pair_{pair}.html"


def graph_pages(audit: Audit, out: Path) -> list[Path]:
    """Write each graphed pair's interactive page into `out/graphs/` (its pruned margin graph, notes and feature
    contexts, as stored); pages an earlier run left there that this one does not write are removed."""
    folder = out / PAGES
    written = []
    if audit.graphs is not None:
        for k, i in enumerate(audit.graphs.pairs):
            page = audit.graphs.pages[k]
            contexts = {name: [Context(str(text), float(act)) for text, act in found]
                        for name, found in page["contexts"].items()}
            written.append(write_graph_page(audit.graphs.page_graph(k), out / page_path(i), contexts=contexts,
                                            notes=[f"pair {audit.pair_ids[i]}", *page["notes"]]))
    if folder.is_dir():
        for stale in folder.iterdir():
            if _OWN_PAGE.fullmatch(stale.name) and stale not in written:
                stale.unlink()
    return written


def _score(x: Any) -> str:
    """A score in [0, 1] to three decimals; '—' where undefined (no influence reaches the margin)."""
    return "—" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _path(p: dict[str, Any]) -> str:
    return " → ".join(p["path"])


def _sentence(pair_id: str, r: dict[str, Any]) -> str:
    best = r["paths"][0] if r["paths"] else None
    top = (f"its strongest path to the margin is {_path(best)} ({num(best['weight'])} of the margin's "
           "attribution)" if best else "no token path survives pruning")
    features = ", ".join(f"{f['node']} ({num(f['influence'])})" for f in r["top_features"]) or "none"
    return (f"Pair {pair_id} (margin {num(r['margin'])}: chosen {num(r['chosen'])}, rejected {num(r['rejected'])}): "
            f"the margin graph has {r['nodes']} nodes ({r['features']} feature nodes) and {r['edges']} edges and "
            f"closes on the margin to {r['closure_gap']:.1e} (relative); {r['dropped']} active features past the "
            f"node cap joined the error nodes; replacement score "
            f"{_score(r['replacement'])}, completeness {_score(r['completeness'])}; "
            f"pruned to {r['pruned_nodes']} nodes and {r['pruned_edges']} edges, {top}. Top feature nodes by "
            f"influence on the margin: {features}.")


def graphs_section(a: Audit, s: AuditSummary) -> Html:
    """What the graphs are, one sentence per pair, the table of their numbers, and the links to their pages."""
    g = s["graphs"]
    assert g is not None  # render() shows the not-run note instead
    basis = ("the MLPs' own neurons (exact: the error nodes hold only the active neurons past the node cap)"
             if g["basis"] == "neurons" else "the given transcoders (their error nodes carry what they miss)")
    text = how(f"The attribution graph (Ameisen et al. 2025, docs/graphs.md) of the first {GRAPH_PAIRS} pairs this "
               f"report shows (the largest |margin| first), over {basis}, at most {GRAPH_MAX_NODES} feature nodes a "
               "side (chosen by estimated influence on the reward): attention patterns and norm scales frozen "
               "at each side's input, each edge the direct linear effect of a token, feature or error node on a "
               "later feature or on the reward, and the margin graph the chosen side's minus the rejected side's, "
               "closing on the margin. Replacement score: the tokens' share of the influence that reaches the "
               "margin from tokens and errors (1: no path through an error); completeness: the influence-weighted "
               "share of edges from features or tokens. Paths (the top "
               f"{GRAPH_PATHS}) and the top {GRAPH_FEATURES} feature nodes are read from the graph pruned to 80 % "
               "of the node and 98 % of the edge influence; a path's share is the product of its edges' shares "
               "of their targets' attribution. Without --transcoders the neurons are graphed on models of at most "
               f"{NEURON_LIMIT} MLP neurons.")
    fit = Html(f'<p class="note">Transcoder fidelity on these pairs: {e(g["fidelity"])}</p>') if g["fidelity"] \
        else Html("")
    said = "".join(f"<p>{e(_sentence(str(a.pair_ids[r['pair']]), r))}</p>" for r in g["pairs"])
    rows = [(a.pair_ids[r["pair"]], num(r["margin"]), r["nodes"], r["features"], r["edges"], r["pruned_nodes"],
             r["pruned_edges"], _score(r["replacement"]), _score(r["completeness"]), f"{r['closure_gap']:.1e}",
             _path(r["paths"][0]) if r["paths"] else "—",
             Html(f'<a href="{e(page_path(r["pair"]))}">{e(page_path(r["pair"]))}</a>')) for r in g["pairs"]]
    head = ["pair", "margin", "nodes", "feature nodes", "edges", "pruned nodes", "pruned edges", "replacement",
            "completeness", "closure gap", "top path to the margin", "interactive page"]
    pages = how("Each pair's page (pan, zoom, click a node for its card) is written beside this report, under "
                f"{PAGES}/; a report copied without that folder still reads, its links left dangling.")
    return Html(text + fit + Html(said) + table(head, rows) + pages)
