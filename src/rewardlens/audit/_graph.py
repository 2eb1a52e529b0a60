"""The audit's attribution graphs (`Plan(graph=True)`, `rewardlens audit --graph`): a whole-model job.

The margin graph (`rewardlens.graph`, docs/graphs.md) of the first `GRAPH_PAIRS` pairs the report shows
(`token_choice`: the largest |margin| first), over the given transcoders, or over the MLPs' own neurons
(`basis="neurons"`, exact) when none are given and the model has at most `NEURON_LIMIT` MLP neurons. It
is computed once and stored as the section needs it (`AuditGraphs`): per pair the numbers each graph
computes of itself (scores, closure gap, node and edge counts, top paths of the pruned graph, top feature
nodes by influence), and the pruned graph with its notes and feature contexts, from which the report
writes each pair's interactive page (`graphs.write_graph_page`) without the model.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from ..errors import RewardLensError, RewardLensWarning, UsageError
from ..graphs import AttributionGraph, Nodes, feature_contexts, graph, node_feature
from ..plotting import HtmlView
from ._keys import checksum, schema_version

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from torch import Tensor

    from ..data import Pair
    from ..model import RewardModel
    from ..sae import Transcoders

REVISION = 3
"""Bump when what the job stores changes with no `AuditGraphs` field changing (2: the pages' graphs by their edges;
3: transcoder graphs keep the first `skip_first` positions' MLPs whole, as training skipped them)."""
GRAPH_PAIRS = 3
"""Pairs the audit graphs: the first of those the report shows (largest |margin| first); a graph costs many
backward passes a side, so its cost must not grow with the pair set."""
GRAPH_PATHS = 3
"""Top token → reward paths kept per pair (of the pruned graph, as `rewardlens graph` prints them)."""
GRAPH_FEATURES = 5
"""Top feature nodes kept per pair, by influence on the margin."""
GRAPH_MAX_NODES = 512
"""Feature nodes given rows per side (`graph(max_nodes=)`, chosen by estimated influence; the rest join the error
nodes): the audit's graphs are a first look at a few pairs, and their cost grows with the cap (`rl.graph`'s
default is `MAX_NODES`, 4096)."""
CONTEXTS = 3
"""Top contexts per feature card on a pair's page (over the graphed pairs)."""
NEURON_LIMIT = 8192
"""Most MLP neurons (over all layers) for which the audit graphs the MLPs' own neurons when no transcoders
are given: every neuron is active at every token, so the graph's columns grow with neurons × tokens."""


@dataclass(frozen=True)
class AuditGraphs(HtmlView):
    """The margin graphs of the audit's first `GRAPH_PAIRS` shown pairs, as numbers each graph computed of itself.

    `rows` holds one dict per pair (in `pairs` order): `margin`, `chosen`, `rejected` (reward units), `nodes`,
    `features`, `edges` (the full margin graph), `pruned_nodes`, `pruned_edges`, `replacement`, `completeness`
    (`AttributionGraph.scores`), `closure_gap`, `dropped` (features past the node cap), `paths` (the pruned
    graph's `top_paths(GRAPH_PATHS)`: node names from the token to the margin and the signed share) and
    `top_features` (the `GRAPH_FEATURES` feature nodes of largest influence on the margin). `pages` holds each
    pair's pruned graph (`page_graph`), its page's notes and its features' top contexts."""

    basis: str
    """'transcoders' or 'neurons'."""
    pairs: list[int]
    """The graphed pairs: indices into the audit's pairs (`Audit.pair_ids`)."""
    rows: list[dict[str, Any]]
    pages: list[dict[str, Any]] = field(repr=False)
    fidelity: str | None = None
    """The transcoders' fidelity on the graphed pairs (`TranscoderFidelity.describe`); None for neurons."""

    def page_graph(self, k: int) -> AttributionGraph:
        """The pruned margin graph of the k-th graphed pair, as stored for its page."""
        g = self.pages[k]["graph"]
        side = g["side"]
        arrays = {f: np.asarray(g[f]) for f in ("kind", "layer", "position", "feature", "activation", "value",
                                                 "constant")}
        nodes = Nodes(names=list(g["names"]), **arrays, side=None if side is None else np.array(side, dtype=object))
        adjacency = np.zeros(tuple(g["shape"]), dtype=np.float32)
        adjacency[g["edge_row"], g["edge_source"]] = g["edge_weight"]
        return AttributionGraph(nodes=nodes, adjacency=adjacency,
                                rows=np.asarray(g["rows"]), tokens=list(g["tokens"]), label=str(g["label"]),
                                basis=str(g["basis"]), n_layers=int(g["n_layers"]), read_at=int(g["read_at"]),
                                dropped=int(g["dropped"]), meta=dict(g["meta"]))

    def plot(self, k: int = 0, *, max_nodes: int = 60, ax: Axes | None = None) -> Figure:
        """The k-th graphed pair's pruned margin graph, as its page shows it (`AttributionGraph.plot`)."""
        return self.page_graph(k).plot(max_nodes=max_nodes, ax=ax)

    def to_dict(self) -> dict[str, Any]:
        """The numbers the report shows (JSON-ready but for NaN): basis, fidelity, and each pair's row."""
        return {"basis": self.basis, "fidelity": self.fidelity,
                "pairs": [{"pair": i, **row} for i, row in zip(self.pairs, self.rows)]}

    def to_frame(self) -> pd.DataFrame:
        """One row per graphed pair: its numbers, and its top path and top feature as text."""
        import pandas as pd

        out = []
        for i, row in zip(self.pairs, self.rows):
            flat = {k: v for k, v in row.items() if k not in ("paths", "top_features")}
            best = row["paths"][0] if row["paths"] else None
            out.append({"pair": i, **flat, "top_path": " → ".join(best["path"]) if best else "",
                        "top_path_share": best["weight"] if best else float("nan"),
                        "top_feature": row["top_features"][0]["node"] if row["top_features"] else ""})
        return pd.DataFrame(out)


def mlp_neurons(model: RewardModel) -> int:
    """The MLP neurons over all layers: each output projection's weight holds d_model × its neurons."""
    weights = [cast("Tensor", model.layer_module(layer, model.arch.mlp_out).weight) for layer in range(model.n_layers)]
    return sum(int(w.numel()) // model.d_model for w in weights)


def check_graph(model: RewardModel, graph_on: bool, transcoders: Transcoders | None) -> str | None:
    """The basis the audit's graphs use ('transcoders' or 'neurons'), or None when `graph_on` is off; refuses in
    one line, before any pair is computed: transcoders without the graph, a model the graphs cannot freeze,
    transcoders that do not fit (`check_transcoders`), and no transcoders on a model past `NEURON_LIMIT`."""
    if not graph_on:
        if transcoders is not None:
            raise UsageError("transcoders are read by the audit's attribution graphs only: pass Plan(graph=True) "
                             "(--graph), or drop them", option="transcoders")
        return None
    if model.reads.multi:  # the graphs read one token: `plan_for_model` leaves them out, and says so
        return None
    from ..graphs.internal import check_model

    check_model(model)
    if transcoders is not None:
        from ..sae.internal import check_transcoders

        check_transcoders(model, transcoders, list(range(model.n_layers)))
        return "transcoders"
    neurons = mlp_neurons(model)
    if neurons > NEURON_LIMIT:
        raise UsageError(f"the audit's attribution graphs need --transcoders DIR on this model: it has {neurons} MLP "
                         f"neurons and the exact neuron basis is used up to {NEURON_LIMIT}; train them with "
                         "`rewardlens transcoders train MODEL --pairs FILE --layers all --out DIR`",
                         option="transcoders")
    return "neurons"


def graph_name(transcoders: Transcoders | None) -> str:
    """The graphs' store name: the basis, the job's constants and `AuditGraphs`' fields (a change to either is
    another name, so an older record is never read as this one), and for transcoders a checksum of their
    configs and weights (a strided sample of each decoder)."""
    version = schema_version(REVISION, (AuditGraphs,), [str(x) for x in (GRAPH_PAIRS, GRAPH_PATHS, GRAPH_FEATURES,
                                                                   GRAPH_MAX_NODES, CONTEXTS)])
    if transcoders is None:
        return f"graphs/neurons/{version}"
    parts: list[Any] = []
    for layer in sorted(transcoders):
        tc = transcoders[layer]
        flat = tc.W_dec.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 65536)]
        parts += [tc.cfg, *(t.float().cpu().numpy().tolist() for t in (sample, tc.b_dec.detach(),
                                                                       tc.b_enc.detach()))]
    return f"graphs/transcoders/{version}/{checksum(parts)}"


def audit_graphs(model: RewardModel, pairs: Sequence[Pair], chosen: Sequence[int],
                 transcoders: Transcoders | None, batch_size: int) -> AuditGraphs | None:
    """The margin graphs of `pairs[i]` for the first `GRAPH_PAIRS` of `chosen`, summarised (`AuditGraphs`); None
    with a warning when a pair cannot be graphed (bad input the model check could not see before the run: a pair
    past the length limit, one with no active feature), so the rest of the audit still writes its report, as
    `audit_circuit` does (nothing is stored: a rerun tries again)."""
    picked = list(chosen[:GRAPH_PAIRS])
    part = [pairs[i] for i in picked]
    basis: Literal["transcoders", "neurons"] = "neurons" if transcoders is None else "transcoders"
    fidelity = None
    if transcoders is not None:
        from ..sae import transcoder_fidelity

        fidelity = transcoder_fidelity(model, transcoders, part, batch_size=batch_size).describe()
    rows, pages = [], []
    try:
        graphs = graph(model, part, transcoders, basis=basis, max_nodes=GRAPH_MAX_NODES)
    except RewardLensError as exc:
        warnings.warn(f"audit: the attribution graphs are left out: {exc}", RewardLensWarning, stacklevel=4)
        return None
    for pg in graphs:
        g = pg.margin
        pruned = g.prune()
        frame, edges = g.to_frame()
        s = g.scores
        features = frame[frame["kind"] == "feature"].sort_values("influence", ascending=False, kind="stable")
        rows.append({
            "margin": g.reward, "chosen": pg.chosen.reward, "rejected": pg.rejected.reward,
            "nodes": len(frame), "features": len(features), "edges": len(edges),
            "pruned_nodes": len(pruned.nodes.names), "pruned_edges": int(np.count_nonzero(pruned.adjacency)),
            "replacement": s.replacement, "completeness": s.completeness, "closure_gap": g.closure_gap,
            "dropped": g.dropped,
            "paths": [{"path": p, "weight": w} for p, w in pruned.top_paths(GRAPH_PATHS)],
            "top_features": [{"node": r["node"], "token": r["token"], "layer": int(r["layer"]),
                              "position": int(r["position"]), "activation": float(r["activation"]),
                              "influence": float(r["influence"])}
                             for r in features.head(GRAPH_FEATURES).to_dict("records")]})
        names = [node_feature(n) for n, k in zip(pruned.nodes.names, pruned.nodes.kind) if k == 0]
        contexts = feature_contexts(model, part, names, transcoders=transcoders, n=CONTEXTS) if names else {}
        notes = [f"margin {g.reward:+.4g} (chosen {pg.chosen.reward:+.4g}, rejected {pg.rejected.reward:+.4g})",
                 f"closure gap {g.closure_gap:.2e}; replacement score {s.replacement:.3f}; completeness "
                 f"{s.completeness:.3f}", f"basis {basis}; {g.dropped} active features past the node cap",
                 f"pruned to {len(pruned.nodes.names)} nodes (node 0.8, edge 0.98)", *([fidelity] if fidelity else [])]
        pages.append({"graph": _graph_record(pruned), "notes": notes,
                      "contexts": {k: [[c.text, c.activation] for c in v] for k, v in contexts.items()}})
    return AuditGraphs(basis, picked, rows, pages, fidelity)


def _graph_record(g: AttributionGraph) -> dict[str, Any]:
    """A graph as plain values and arrays (the store keeps no pickles: the margin side labels as strings; the
    adjacency by its nonzero edges, as a pruned graph's is mostly zeros)."""
    n = g.nodes
    r, s = np.nonzero(g.adjacency)
    return {"names": list(n.names), "kind": n.kind, "layer": n.layer, "position": n.position, "feature": n.feature,
            "activation": n.activation, "value": n.value, "constant": n.constant,
            "side": None if n.side is None else [str(x) for x in n.side], "shape": list(g.adjacency.shape),
            "edge_row": r, "edge_source": s, "edge_weight": g.adjacency[r, s], "rows": g.rows,
            "tokens": list(g.tokens), "label": g.label, "basis": g.basis, "n_layers": g.n_layers,
            "read_at": g.read_at, "dropped": g.dropped, "meta": g.meta}
