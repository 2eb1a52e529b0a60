"""`AttributionGraph`: the nodes and edges of one sequence's (or one pair's margin) attribution graph.

Nodes, in circuit-tracer's order: the feature nodes, the error nodes (layer-major, then position), the
tokens, and the root (the reward, or the margin of a pair). Edges are held as the target rows only
(`adjacency` [R, N], row `i` the incoming edges of node `rows[i]`): errors and tokens have no incoming
edges, so the graph is never a dense [N × N] matrix. Closure: every target's value equals the sum of
its incoming edges plus its constant (a feature's encoder bias and what biases upstream write; the
reward's head bias and bias paths) — `closure_gap` says by how much it does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..plotting import HtmlView
from ._influence import influence, normalise, prune_masks, scores

CLOSURE_FLOOR = 1e-3
"""`closure_gap`'s floor on a target's scale, relative to the graph's largest (tests/graphs/test_closure.py's too)."""

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ._interventions import InterventionCheck

KINDS = ("feature", "error", "token", "reward")
"""Node kinds by their code in `Nodes.kind`."""


@dataclass(frozen=True)
class Nodes:
    """Per node: Part name, kind code (`KINDS`), layer (-1 tokens, n_layers the root), position, feature id
    (token id for tokens, -1 otherwise), activation, value and constant (targets; NaN for sources)."""

    names: list[str]
    kind: np.ndarray
    layer: np.ndarray
    position: np.ndarray
    feature: np.ndarray
    activation: np.ndarray
    value: np.ndarray
    constant: np.ndarray
    side: np.ndarray | None = None
    """Margin graphs: 'both', 'chosen' or 'rejected' (where the node was found)."""

    def take(self, index: np.ndarray) -> Nodes:
        """The nodes at `index`, in that order."""
        return Nodes([self.names[i] for i in index], self.kind[index], self.layer[index], self.position[index],
                     self.feature[index], self.activation[index], self.value[index], self.constant[index],
                     side=None if self.side is None else self.side[index])


@dataclass(frozen=True)
class Scores:
    """circuit-tracer's two scores of a graph (graphs/_influence.py)."""

    replacement: float
    """Share of the tokens' and errors' influence on the reward that the tokens carry (1: no error on any path)."""
    completeness: float
    """Influence-weighted share of every node's incoming edges that come from features or tokens."""


@dataclass(frozen=True)
class AttributionGraph(HtmlView):
    """One attribution graph (module docstring). Build with `rewardlens.graphs.graph`."""

    _html_rank = "influence"

    nodes: Nodes
    adjacency: np.ndarray
    """[R, N] float32: row i holds the incoming edges of node `rows[i]` (features, then the root)."""
    rows: np.ndarray
    tokens: list[str]
    """The token strings by position (the chosen side's then the rejected side's, for a margin graph)."""
    label: str
    basis: str
    n_layers: int
    read_at: int
    dropped: int = 0
    """Active features past the node cap, folded into the error nodes at their layer and position."""
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- the numbers ------------------------------------------------------------------------
    @property
    def root(self) -> int:
        """The root node's index (the last)."""
        return len(self.nodes.names) - 1

    @property
    def reward(self) -> float:
        """The root's value: the reward (or the pair's margin)."""
        return float(self.nodes.value[self.root])

    def incoming(self) -> np.ndarray:
        """Σ incoming edges of every target row [R] (float64)."""
        return self.adjacency.astype(np.float64).sum(1)

    @property
    def closure_gap(self) -> float:
        """Largest |value − Σ incoming − constant| over targets, relative to the target's Σ |incoming| + |constant|
        (in a margin graph, the two sides' sum of those: a prompt feature's sides cancel to their rounding),
        floored at `CLOSURE_FLOOR` of the graph's largest such scale: a target that small is the cancelled sum
        of far larger inputs, whose float32 rounding (not a missing edge, which would show on every row) then
        dominates — on a tiny Llama a layer-0 neuron of 3e-5 missed its one edge by 3e-9 (1e-4 of itself)."""
        value, const = self.nodes.value[self.rows], self.nodes.constant[self.rows]
        scale = np.abs(self.adjacency).astype(np.float64).sum(1) + np.abs(const)
        scale = np.maximum(scale, np.asarray(self.meta.get("row_scale", 0.0)))
        if len(scale):
            scale = np.maximum(scale, CLOSURE_FLOOR * float(scale.max()))
        gap = np.abs(value - self.incoming() - const) / np.maximum(scale, 1e-30)
        return float(gap.max()) if len(gap) else 0.0

    def _weights(self) -> torch.Tensor:
        w = torch.zeros(len(self.nodes.names), dtype=torch.float64)
        w[self.root] = 1.0
        return w

    def _tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(self.adjacency.astype(np.float64)), torch.from_numpy(self.rows).long(),
                torch.from_numpy(self.nodes.kind.astype(np.int64)))

    @cached_property
    def influence(self) -> np.ndarray:
        """Each node's influence on the reward [N]: its share through every path (graphs/_influence.py)."""
        adjacency, rows, _ = self._tensors()
        return influence(normalise(adjacency), rows, self._weights()).numpy()

    @cached_property
    def scores(self) -> Scores:
        """The replacement and completeness scores (circuit-tracer's definitions)."""
        adjacency, rows, kinds = self._tensors()
        return Scores(*scores(adjacency, rows, self._weights(), kinds))

    # ---- pruning ----------------------------------------------------------------------------
    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> AttributionGraph:
        """The graph keeping the nodes that carry `node_threshold` of the influence on the reward and the
        edges that carry `edge_threshold` of it (circuit-tracer's `prune_graph`); tokens and the root stay.
        Removed edges are zeroed, so a pruned graph no longer closes (`closure_gap`)."""
        adjacency, rows, kinds = self._tensors()
        keep, edges, share = prune_masks(adjacency, rows, self._weights(), kinds, node_threshold, edge_threshold)
        kept = keep.numpy().nonzero()[0]
        kept_rows = np.array([i for i, r in enumerate(self.rows) if keep[r]])
        matrix = np.where(edges.numpy(), self.adjacency, 0.0)[kept_rows][:, kept].astype(np.float32)
        index = {int(n): i for i, n in enumerate(kept)}
        meta = {**self.meta, "pruned": {"node_threshold": node_threshold, "edge_threshold": edge_threshold},
                "cumulative_influence": share.numpy()[kept].tolist()}
        return replace(self, nodes=self.nodes.take(kept), adjacency=matrix,
                       rows=np.array([index[int(self.rows[i])] for i in kept_rows]), meta=meta)

    # ---- views ------------------------------------------------------------------------------
    def to_frame(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(nodes, edges): one row per node (name, kind, layer, position, token, feature, activation, value,
        constant, influence) and one per nonzero edge (source, target, weight)."""
        import pandas as pd

        n = self.nodes
        frame = pd.DataFrame({
            "node": n.names, "kind": [KINDS[k] for k in n.kind], "layer": n.layer, "position": n.position,
            "token": [self._token(i) for i in range(len(n.names))], "feature": n.feature,
            "activation": n.activation, "value": n.value, "constant": n.constant, "influence": self.influence})
        if n.side is not None:
            frame["side"] = n.side
        r, s = self.adjacency.nonzero()
        edges = pd.DataFrame({"source": [n.names[j] for j in s], "target": [n.names[self.rows[i]] for i in r],
                              "weight": self.adjacency[r, s].astype(np.float64)})
        return frame, edges.sort_values("weight", key=np.abs, ascending=False, ignore_index=True)

    def _token(self, node: int) -> str:
        pos = int(self.nodes.position[node])
        return self.tokens[pos] if 0 <= pos < len(self.tokens) else ""

    def top_paths(self, k: int = 5) -> list[tuple[list[str], float]]:
        """The `k` token → reward paths of largest |product of edge weights| (graphs/_paths.py)."""
        from ._paths import top_paths

        return top_paths(self, k)

    def intervene(self, model: Any, transcoders: Any, interventions: Mapping[str, tuple[str, float] | str]
                  ) -> InterventionCheck:
        """Ablate, clamp or steer feature nodes in the real model (transcoders spliced in, errors kept, attention
        live) and report each one's real change of the reward beside the graph's predictions
        (graphs/_interventions.py): `{"tc_L3_F120_P5": "ablate", "tc_L1_F7_P2": ("steer", 2.0)}`."""
        from ._interventions import intervene

        return intervene(self, model, transcoders, interventions)

    def plot(self, *, max_nodes: int = 60, ax: Axes | None = None) -> Figure:
        """Nodes laid out by layer (y; the reward on top) and position (x), the `max_nodes` most influential
        features and errors shown, edges coloured by sign and weighted by |weight|."""
        from ._plot import plot_graph

        return plot_graph(self, max_nodes=max_nodes, ax=ax)

    def to_json(self) -> dict[str, Any]:
        """The graph in circuit-tracer's graph-file schema (metadata, qParams, nodes, links) (graphs/_files.py)."""
        from ._files import graph_json

        return graph_json(self)

    def save(self, folder: str | Path, slug: str | None = None, *, node_threshold: float = 0.8,
             edge_threshold: float = 0.98) -> Path:
        """Write `<slug>.json` and circuit-tracer's `graph-metadata.json` index into `folder`, so its local
        frontend (`circuit_tracer.frontend.local_server.serve(folder)`) lists and opens the graph; a graph not
        yet pruned is pruned first, as circuit-tracer's `create_graph_files` does. Returns the graph file."""
        from ._files import save_graph

        return save_graph(self, Path(folder), slug, node_threshold, edge_threshold)

    def __repr__(self) -> str:
        counts = {k: int((self.nodes.kind == i).sum()) for i, k in enumerate(KINDS)}
        return (f"AttributionGraph({self.label!r}, basis={self.basis!r}, reward={self.reward:.4g}, "
                f"features={counts['feature']}, errors={counts['error']}, tokens={counts['token']}, "
                f"edges={int(np.count_nonzero(self.adjacency))})")
