"""Grader of attribution graphs (rewardlens.graphs) on organisms whose mechanism is planted.

- `two_step` and `circuit`: the rule is carried by heads from the tokens where the two sides differ (the
  swapped bigram; 'Notably' against its rival) to the read token. Attention is frozen in a graph, so a
  head is no node: its work is in the edges out of the tokens and features at the positions it reads.
  The pruned margin graph's top path to the reward must start at a token where the sides differ and visit
  only nodes at those positions or at the read position (the planted heads' positions).
- the planted-neuron organism (calibrate/_neurons.py: three neurons of layer 1 carry the rule): with
  `basis="neurons"` the margin graph's top feature nodes by influence must be those neurons; with
  transcoders trained here on the organism, the top feature must be a layer-1 feature writing along the
  read-out direction û (what the planted neurons feed).
- interventions: the graph's predicted margin change for zeroing its top feature node (its total effect
  through the frozen linear graph) beside the real model's (attention not frozen), as a relative gap; and,
  with the transcoders, each pair's top transcoder feature node zeroed and clamped to twice its activation
  with graphs' intervention API (the real model with every MLP replaced by its transcoder plus its error on
  the clean run, attention and norms live, downstream features re-encoded) against the graph's prediction
  through every path of that side's graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..data import Pair
from ..graphs import AttributionGraph, PairGraph, graph
from ..model import Part, RewardModel
from ..sae import Transcoders, TranscoderTrainConfig, train_transcoders
from ..zoo.organisms import ORGANISMS
from ._core import Grade, OrganismBench
from ._neurons import HOST, plant_neurons

GRAPH_PAIRS = 4
"""Held-out pairs each graph grade runs on (graphs are per pair)."""
PATH_SHARE = 0.75
"""Share of pairs whose top path must run through the planted positions."""
TOP_FEATURES = 3
"""The planted neurons must be the top this-many feature nodes by influence."""
COS_FLOOR = 0.5
"""|cos(decoder row, û)| the top transcoder feature must reach to count as fed by the planted neurons."""
INTERVENTION_GAP = 0.25
"""Largest relative gap allowed between graph-predicted and real margin changes of a feature ablation (neurons)
or of a transcoder feature's ablation and clamp (measured at seed 0: 0.0074 and 0.021 medians)."""
CLAMP = 2.0
"""The transcoder intervention's clamp: the feature set to this multiple of its activation."""
MAX_NODES = 256
"""Feature nodes with rows per side: an organism's rule is carried by a handful; the rest join the error nodes."""
KIND_FEATURE, KIND_TOKEN = 0, 2


@dataclass(frozen=True)
class Planted:
    """Where two sides differ: chosen-side and rejected-side positions, and each side's read position."""

    chosen: frozenset[int]
    rejected: frozenset[int]
    read: tuple[int, int]


def differing(model: RewardModel, pair: Pair) -> Planted:
    """The positions of the tokens where the sides differ (after their shared prefix, before their shared
    suffix), on each side, and each side's read position (its last token)."""
    (c, r), _ = model.encode([pair])
    a, b = c.ids, r.ids
    pre = 0
    while pre < min(len(a), len(b)) and a[pre] == b[pre]:
        pre += 1
    post = 0
    while post < min(len(a), len(b)) - pre and a[-1 - post] == b[-1 - post]:
        post += 1
    return Planted(frozenset(range(pre, len(a) - post)), frozenset(range(pre, len(b) - post)),
                   (len(a) - 1, len(b) - 1))


def _where(g: AttributionGraph, name: str) -> tuple[str, int]:
    """A margin-graph node's side ('chosen' or 'rejected') and position."""
    i = g.nodes.names.index(name)
    side = "rejected" if g.nodes.side is not None and g.nodes.side[i] == "rejected" else "chosen"
    return side, int(g.nodes.position[i])


def path_through(g: AttributionGraph, path: list[str], planted: Planted) -> bool:
    """Whether `path` (token → … → root) starts at a differing token and visits only differing or read positions."""
    inner = [_where(g, n) for n in path[:-1] if n != "margin"]
    if not inner:
        return False
    allowed = {"chosen": planted.chosen | {planted.read[0]}, "rejected": planted.rejected | {planted.read[1]}}
    side, pos = inner[0]
    starts = pos in (planted.chosen if side == "chosen" else planted.rejected)
    return starts and all(p in allowed[s] for s, p in inner)


def grade_graphs(bench: OrganismBench) -> list[Grade]:
    """Attribution graphs find the planted mechanisms (module docstring)."""
    rows: list[Grade] = []
    for name in ("two_step", "circuit"):
        if name in bench.organisms:
            rows += _paths(bench.model(name), bench.pairs(name)[:GRAPH_PAIRS], name)
    if HOST in bench.organisms:
        rows += _neurons(bench)
    return rows


TWO_STEP_KNOWN = (
    "frozen attention: a margin graph gives a shared-prefix token the difference of its two sides' attention-"
    "weighted routes, and two_step's rule is which token a head attends to (a QK effect the graph freezes), so "
    "such a token's path can outweigh the planted tokens' own (docs/graphs.md, Ground truth)")
"""Why the two_step path row may fail: measured 0.25 of 4 pairs at seed 0; circuit, an OV rule, passes."""


def _paths(model: RewardModel, pairs: list[Pair], name: str) -> list[Grade]:
    hits, closure = [], 0.0
    for pair, pg in zip(pairs, _graphs(model, pairs, None)):
        closure = max(closure, pg.margin.closure_gap)
        top = pg.margin.prune().top_paths(1)
        hits.append(bool(top) and path_through(pg.margin, top[0][0], differing(model, pair)))
    return [Grade.of("graphs", name, "largest relative closure gap of the margin graph (basis='neurons')", closure,
                     1e-5, "<="),
            Grade.of("graphs", name, f"share of {len(pairs)} pairs whose pruned margin graph's top path runs from a "
                     "token where the sides differ through only those positions and the read token (basis='neurons')",
                     float(np.mean(hits)), PATH_SHARE, known=TWO_STEP_KNOWN if name == "two_step" else "")]


def _graphs(model: RewardModel, pairs: list[Pair], tcs: Transcoders | None) -> list[PairGraph]:
    """Each pair's graphs, one call per pair (a graph is per pair; basis='neurons' when `tcs` is None)."""
    basis: Literal["transcoders", "neurons"] = "neurons" if tcs is None else "transcoders"
    return [graph(model, pair, tcs, basis=basis, max_nodes=MAX_NODES, batch_size=64)[0] for pair in pairs]


def _top_features(g: AttributionGraph, k: int) -> list[str]:
    """The `k` feature nodes of largest influence on the root, by name without position or side."""
    feats = np.flatnonzero(g.nodes.kind == KIND_FEATURE)
    order = feats[np.argsort(-g.influence[feats], kind="stable")]
    out: list[str] = []
    for i in order:
        base = Part.parse(g.nodes.names[i].removesuffix("_rejected")).at(0).name.removesuffix("_P0")
        if base not in out:
            out.append(base)
        if len(out) == k:
            break
    return out


def neuron_transcoders(model: RewardModel, seed: int = 0) -> Transcoders:
    """Transcoders for the planted-neuron organism, trained on fresh pairs of its host's rule."""
    train = ORGANISMS[HOST].pairs(200, seed=seed + 7, strength=1.0)
    cfg = TranscoderTrainConfig(d_sae=4 * model.d_model, k=8, batch_size=256, buffer_rows=4096, epochs=3, lr=3e-3,
                                seed=seed)
    return train_transcoders(model, train, config=cfg).transcoders


def _neurons(bench: OrganismBench) -> list[Grade]:
    head = ORGANISMS[HOST].planted_part
    assert head is not None  # the circuit organism plants its rule in one head
    model, planted = plant_neurons(bench.model(HOST), head)
    pairs, name = bench.pairs(HOST)[:GRAPH_PAIRS], f"{HOST}+neurons"
    exact = _graphs(model, pairs, None)
    found = [set(_top_features(pg.margin, TOP_FEATURES)) == set(planted) for pg in exact]
    rows = [Grade.of("graphs", name, f"share of {len(pairs)} pairs whose top {TOP_FEATURES} feature nodes by "
                     f"influence on the margin are the planted neurons {', '.join(planted)} (basis='neurons')",
                     float(np.mean(found)), PATH_SHARE)]
    tcs = neuron_transcoders(model, bench.seed)
    u = model.head.weight[0].detach().float().cpu()
    u = u / u.norm()
    layer = Part.parse(planted[0]).layer
    cos, closure = [], 0.0
    spliced = _graphs(model, pairs, tcs)
    for pg in spliced:
        closure = max(closure, pg.margin.closure_gap)
        top = Part.parse(_top_features(pg.margin, 1)[0])
        w = tcs[top.layer].W_dec[top.feature].detach().float().cpu() if top.feature is not None else None
        cos.append(abs(float(w @ u / w.norm())) if w is not None and top.layer == layer else 0.0)
    rows += [Grade.of("graphs", name, "largest relative closure gap of the margin graph (transcoders)", closure,
                      1e-5, "<="),
             Grade.of("graphs", name, f"median |cos(decoder, û)| of the top transcoder feature by influence on the "
                      f"margin (0 if not at layer {layer}, where the planted neurons are)", float(np.median(cos)),
                      COS_FLOOR)]
    return rows + _interventions(model, pairs, exact, name) + _feature_interventions(model, tcs, spliced, name)


def _interventions(model: RewardModel, pairs: list[Pair], graphs: list[PairGraph], name: str) -> list[Grade]:
    """Per pair: zero the top feature node (a neuron at one position, on its side) in the real model and compare
    the margin's change with the graph's prediction, its total effect −Σ_paths (product of edge weights)."""
    gaps = []
    for pair, pg in zip(pairs, graphs):
        g = pg.margin
        feats = np.flatnonzero(g.nodes.kind == KIND_FEATURE)
        i = int(feats[np.argmax(g.influence[feats])])
        predicted = -total_effect(g, i)
        side, pos = _where(g, g.nodes.names[i])
        part = Part.parse(g.nodes.names[i].removesuffix("_rejected"))
        real = _zeroed_margin(model, pair, side, pos, part) - g.reward
        gaps.append(abs(predicted - real) / max(abs(real), 1e-9))
    return [Grade.of("graphs", name, f"median relative gap between the graph-predicted and the real margin change "
                     f"of zeroing each pair's top neuron node ({len(pairs)} pairs; attention not frozen in the real "
                     "model)", float(np.median(gaps)), INTERVENTION_GAP, "<=")]


def _feature_interventions(model: RewardModel, tcs: Transcoders, graphs: list[PairGraph], name: str) -> list[Grade]:
    """Per pair: the margin graph's top transcoder feature node, on its side's graph, zeroed and clamped to `CLAMP`×
    its activation in the real model (`AttributionGraph.intervene`: transcoders spliced in, errors kept,
    attention live); the gap between the graph's prediction through every path and the real change."""
    gaps = []
    for pg in graphs:
        g = pg.margin
        feats = np.flatnonzero(g.nodes.kind == KIND_FEATURE)
        top = g.nodes.names[int(feats[np.argmax(g.influence[feats])])]
        side = pg.rejected if _where(g, top)[0] == "rejected" else pg.chosen
        node = top.removesuffix("_rejected")  # the side graph's own name of that node
        a = float(side.nodes.activation[side.nodes.names.index(node)])
        for mode in ("ablate", ("clamp", CLAMP * a)):
            row = side.intervene(model, tcs, {node: mode}).rows[0]
            gaps.append(abs(row["graph"] - row["real"]) / max(abs(row["real"]), 1e-9))
    return [Grade.of("graphs", name, f"median relative gap between the graph-predicted and the real reward change of "
                     f"zeroing, and of clamping to {CLAMP:g}× its activation, each pair's top transcoder feature node "
                     f"({len(graphs)} pairs; transcoders spliced in with their errors kept, attention not frozen)",
                     float(np.median(gaps)), INTERVENTION_GAP, "<=")]


def total_effect(g: AttributionGraph, node: int) -> float:
    """Σ over paths node → root of the product of edge weights: row `root` of (I − A)⁻¹ at column `node`,
    with A the graph's adjacency (targets' rows) as a square matrix over its nodes."""
    n = len(g.nodes.names)
    a = np.zeros((n, n))
    a[g.rows] = g.adjacency
    e = np.zeros(n)
    e[g.root] = 1.0
    # x = e (I − A)⁻¹ solves x (I − A) = e, i.e. (I − A)ᵀ xᵀ = eᵀ.
    return float(np.linalg.solve(np.eye(n) - a.T, e)[node])


def _zeroed_margin(model: RewardModel, pair: Pair, side: str, pos: int, part: Part) -> float:
    """The real model's margin with neuron `part` zeroed at position `pos` of one side (attention free)."""
    (c, r), _ = model.encode([pair])
    down = model.layer_module(part.layer, model.arch.mlp_out)

    def reward(ids: list[int], zero: bool) -> float:
        def hook(_m: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            x = args[0].clone()
            x[0, pos, part.neuron] = 0
            return (x, *args[1:])

        h = down.register_forward_pre_hook(hook) if zero else None
        try:
            with torch.no_grad():  # an organism is a sequence classifier read at its last token: logits[0, 0]
                return float(model.model(input_ids=torch.tensor([ids], device=model.device)).logits[0, 0])
        finally:
            if h is not None:
                h.remove()

    return reward(c.ids, side == "chosen") - reward(r.ids, side == "rejected")
