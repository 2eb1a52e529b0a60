"""Figures of the instruments beside the audit's core: the crystallization-depth distribution, the
direct / indirect split of the top parts, cascades and a multi-objective head's conflicts.

Re-exported by `_figures` (`rewardlens.audit.report.figures`); same rules: no pyplot, the result's own
`plot(ax=...)` where there is one (cascades, conflicts), and a `RewardLensError` when the audit lacks
the instrument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._canvas import KIND_COLORS, need, new_figure
from ._groups import KINDS, groups, spread
from ._instruments import estimands

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .._runner import Audit


def fig_crystallization(audit: Audit) -> Figure:
    """Histogram over pairs of the crystallization depth l/L, linear and normed lens side by side; stacked
    by subset when the pairs have subsets; median dashed, interquartile range shaded."""
    lens = audit.lens
    n_layers = lens.n_layers
    edges = (np.arange(n_layers + 2) - 0.5) / n_layers  # one bin per depth l/L
    masks = groups(audit)
    fig = new_figure(9, 3.2)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, kind in zip(axes, KINDS):
        depth = lens.crystallization(kind, audit.fraction)
        stats = spread(depth)
        if masks is None:
            ax.hist(depth[np.isfinite(depth)], bins=edges, color=KIND_COLORS[kind], edgecolor="white")
        else:
            parts = [depth[m & np.isfinite(depth)] for m in masks.values()]
            ax.hist(parts, bins=edges, stacked=True, label=list(masks), edgecolor="white")
        if stats["defined"]:
            ax.axvspan(stats["q25"], stats["q75"], color="gray", alpha=0.15, label="interquartile range")
            ax.axvline(stats["median"], color="black", ls="--", lw=1, label=f"median {stats['median']:.2f}")
        ax.set_title(f"{kind} lens: {stats['defined']} of {len(depth)} pairs have a depth", fontsize=10)
        ax.set_xlabel("crystallization depth l / L (0 = embeddings, 1 = reward)")
        ax.set_xlim(edges[0], edges[-1])
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("pairs")
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
    ax.legend(fontsize=7, loc="best")
    return fig


def fig_cascades(audit: Audit) -> Figure:
    """Spearman ρ between probe axes' per-item effects (each oriented by its mean's sign); grey: too few
    shared items for a correlation (`Cascades.plot`)."""
    c = need(audit.cascades, "cascades", "run the audit with probes (rewardlens.cascade(probes) alone)")
    k = len(c.axes)
    fig = new_figure(2.2 + 0.42 * k, 1.6 + 0.38 * k)
    c.plot(ax=fig.subplots())
    return fig


def fig_conflicts(audit: Audit) -> Figure:
    """A multi-objective head's terms: cosine of their directions (left) and the share of pairs on which
    two terms are both decisive and point opposite ways, with each pair's relation (right): `Conflicts.plot`."""
    c = need(audit.conflicts, "conflicts", "it needs a head with several outputs (rewardlens.conflict(model, pairs))")
    k = len(c.names)
    fig = new_figure(4.5 + 1.1 * k, 2.0 + 0.45 * k)
    c.plot(ax=fig.subplots(1, 2))
    return fig
