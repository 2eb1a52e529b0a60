"""Draw an attribution graph: nodes by position (x) and layer (y, tokens at the bottom, the reward on top)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..plotting import finish, one_panel

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ._shape import GraphLike

_COLOURS = ("tab:orange", "tab:gray", "tab:green", "black")  # feature, error, token, reward


def plot_graph(g: GraphLike, *, max_nodes: int, ax: Axes | None) -> Figure:
    """The `max_nodes` most influential features and errors, every token and the reward; edges between shown
    nodes, blue for positive and red for negative weight, their width by |weight|."""
    axes, made = one_panel(ax, (10, 6))
    kind, infl = g.nodes.kind, g.influence
    inner = np.nonzero(kind <= 1)[0]
    shown = set(inner[np.argsort(-infl[inner], kind="stable")[:max_nodes]].tolist())
    shown |= set(np.nonzero(kind >= 2)[0].tolist())
    x = g.nodes.position.astype(float)
    y = g.nodes.layer.astype(float) + np.where(kind == 1, 0.3, 0.0)  # errors just above their layer's features
    weights = np.abs(g.adjacency)
    top = float(weights.max()) if weights.size else 1.0
    for i, target in enumerate(g.rows):
        if int(target) not in shown:
            continue
        for j in np.nonzero(g.adjacency[i])[0]:
            if int(j) in shown:
                w = float(g.adjacency[i, j])
                axes.plot([x[j], x[target]], [y[j], y[target]], color="tab:blue" if w > 0 else "tab:red",
                          linewidth=0.3 + 2.5 * abs(w) / max(top, 1e-30), alpha=0.5, zorder=1)
    idx = np.array(sorted(shown))
    axes.scatter(x[idx], y[idx], c=[_COLOURS[int(k)] for k in kind[idx]], s=18, zorder=2)
    axes.set_xlabel("token position")
    axes.set_ylabel("layer (tokens at -1, the reward on top)")
    axes.set_title(f"{g.label}: reward {g.reward:.4g}")
    return finish(axes, made)
