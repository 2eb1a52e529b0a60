"""Figures of the instruments beside the audit's core: the crystallization-depth distribution, the
direct / indirect split of the top parts, cascades and a multi-objective head's conflicts.

Re-exported by `_figures` (`rewardlens.audit.report.figures`); same rules: no pyplot, the result's own
`plot(ax=...)` where there is one (cascades, conflicts), and a `RewardLensError` when the audit lacks
the instrument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._canvas import KIND_COLORS, legend_below, need, new_figure
from ._groups import KINDS, depths, groups, spread
from ._instruments import estimands

LEGEND_COLUMNS = 6
"""Columns of a figure legend placed below its panels."""

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .._runner import Audit


def subset_colors(n: int) -> list[tuple[float, ...]]:
    """`n` distinct colours for subsets: tab10, tab20, then evenly spaced on turbo (no colour repeats)."""
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, n)]


def fig_crystallization(audit: Audit) -> Figure:
    """Histogram over pairs of the crystallization depth l/L, linear and normed lens side by side; stacked
    by subset when the pairs have subsets; median dashed, interquartile range shaded. One legend for both
    panels, below them (outside every axis: with 21 subsets a legend inside would cover the bars)."""
    lens = audit.lens
    n_layers = lens.n_layers
    # One bin per depth l/L, centred on it; the outer two are cut at 0 and 1 (half width) so that no bar
    # is drawn at a depth that cannot exist.
    edges = np.clip((np.arange(n_layers + 2) - 0.5) / n_layers, 0.0, 1.0)
    masks = groups(audit)
    rows = 0 if masks is None else -(-len(masks) // LEGEND_COLUMNS)
    fig = new_figure(9, 3.4 + 0.2 * rows)
    axes = fig.subplots(1, 2, sharey=True)
    depth_of = depths(audit)
    for ax, kind in zip(axes, KINDS):
        depth = depth_of[kind]
        stats = spread(depth)
        if masks is None:
            ax.hist(depth[np.isfinite(depth)], bins=edges, color=KIND_COLORS[kind], edgecolor="white")
        else:
            parts = [depth[m & np.isfinite(depth)] for m in masks.values()]
            ax.hist(parts, bins=edges, stacked=True, label=list(masks), edgecolor="white",
                    color=subset_colors(len(parts)))
        median = ""
        if stats["defined"]:
            ax.axvspan(stats["q25"], stats["q75"], color="gray", alpha=0.15, label="interquartile range")
            ax.axvline(stats["median"], color="black", ls="--", lw=1, label="median")
            median = f", median {stats['median']:.2f}"
        ax.set_title(f"{kind} lens: {stats['defined']} of {len(depth)} pairs have a depth{median}", fontsize=10)
        ax.set_xlabel("crystallization depth l / L (0 = embeddings, 1 = reward)")
        ax.set_xlim(edges[0], edges[-1])
    axes[0].set_ylabel("pairs")
    legend_below(fig, axes, ncols=LEGEND_COLUMNS)
    return fig


def fig_estimands(audit: Audit) -> Figure:
    """The top parts (largest |mean total effect|): mean direct, indirect and total effect as grouped bars,
    mean attribution as a black tick."""
    rows = estimands(audit)
    fig = new_figure(7.5, 0.9 + 0.42 * max(len(rows), 1))
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1].astype(float)
    for k, (name, color) in enumerate((("direct", "tab:blue"), ("indirect", "tab:orange"), ("total", "tab:gray"))):
        ax.barh(y + (1 - k) * 0.26, [r[name] for r in rows], height=0.25, color=color, label=f"{name} effect")
    ax.scatter([r["attribution"] for r in rows], y, marker="|", s=160, color="black", zorder=3, label="attribution")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [r["part"] for r in rows], fontsize=8)
    ax.set_xlabel(f"mean effect on the margin ({audit.faithfulness.mode}, read position; reward units)")
    legend_below(fig, [ax], ncols=4)  # bars reach every edge of the axis
    return fig


def fig_cascades(audit: Audit) -> Figure:
    """Spearman ρ between probe axes' per-item effects (each oriented by its mean's sign); grey: too few
    shared items for a correlation (`Cascades.plot`)."""
    c = need(audit.cascades, "cascades", "run the audit with probes (rewardlens.hacking.cascade(probes) alone)")
    k = len(c.axes)
    fig = new_figure(2.2 + 0.42 * k, 1.6 + 0.38 * k)
    c.plot(ax=fig.subplots())
    return fig


def fig_conflicts(audit: Audit) -> Figure:
    """A multi-objective head's terms: cosine of their directions (left) and the share of pairs on which
    two terms are both decisive and point opposite ways, with each pair's relation (right): `Conflicts.plot`."""
    c = need(audit.conflicts, "conflicts",
             "it needs a head with several outputs (rewardlens.hacking.conflict(model, pairs))")
    k = len(c.names)
    fig = new_figure(4.5 + 1.1 * k, 2.0 + 0.45 * k)
    c.plot(ax=fig.subplots(1, 2))
    return fig
