"""The audit's figures: plain functions `fig_*(audit) -> matplotlib Figure`, reusable by any face.

Figures are built on `matplotlib.figure.Figure` directly, not through pyplot: no global state is
touched (a notebook's backend stays as it is, nothing accumulates in pyplot's figure list), and
`to_png` renders them with the Agg canvas. Each function raises `RewardLensError` when the audit
lacks the instrument it plots. Every number a figure shows is read under the report's one pair mask
(`_groups.depths`, `counted_mean`, `estimands`), so a figure and its table agree.

Where the report shows what a result draws, the figure is that result's own `plot(ax=...)` on a
report-sized figure (scatter, probes, features; cascades, conflicts): a result given axes touches
no pyplot state. The lens and concept figures differ from `Lens.plot` and `Concepts.plot` on
purpose (every pair's line and the crystallization depth on relative depth; one panel per concept
with its band), and the heatmaps, depth histogram and estimand bars have no result plot: the report
draws those itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...model import Part
from ...types import LensKind
from ._canvas import KIND_COLORS as KIND_COLORS
from ._canvas import PART_COLORS as PART_COLORS
from ._canvas import legend_below, need, new_figure
from ._canvas import to_png as to_png
from ._circuit import fig_circuit as fig_circuit
from ._groups import KINDS, counted_mean, depths, groups, spread
from ._instruments import estimands

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .._runner import Audit

MAX_POINTS = 20_000
"""Scatter plots draw at most this many points (a fixed random subset beyond it)."""
LEGEND_COLUMNS = 6
"""Columns of a figure legend placed below its panels."""


def fig_lens(audit: Audit) -> Figure:
    """Chosen − rejected margin against relative depth l / L, linear and normed lens side by side:
    one thin line per pair, the mean in bold, the median crystallization depth dashed (its value in the
    panel's title). One legend below both panels: inside, it would hide the lines it names."""
    lens = audit.lens
    x = np.arange(lens.n_layers + 1) / lens.n_layers
    fig = new_figure(9, 3.6)
    axes = fig.subplots(1, 2, sharey=True)
    kinds: tuple[LensKind, ...] = ("linear", "normed")
    depth_of = depths(audit)
    for ax, kind in zip(axes, kinds):
        margin, color = lens.margin(kind), KIND_COLORS[kind]
        alpha = float(np.clip(8 / len(margin), 0.04, 0.3))  # many pairs: fainter lines, same ink
        for row in margin:
            ax.plot(x, row, color=color, lw=0.7, alpha=alpha)
        ax.plot(x, counted_mean(audit, margin), color=color, lw=2.2, marker="o", ms=3.5,
                label=f"{kind} lens, mean over pairs")
        depth = spread(depth_of[kind])["median"]
        title = f"{kind} lens"
        if np.isfinite(depth):
            ax.axvline(depth, color="black", ls="--", lw=1,
                       label=f"median crystallization depth (fraction {audit.fraction:g})")
            title += f": median crystallization {depth:.2f}"
        ax.axhline(0, color="gray", lw=0.6)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("depth l / L (0 = embeddings, 1 = reward)")
    axes[0].set_ylabel("chosen − rejected (reward units)")
    legend_below(fig, axes)  # both panels draw the median line: it is named once
    return fig


def fig_scatter(audit: Audit) -> Figure:
    """Attribution (margin contribution) against the direct (path-frozen) and total patching effect,
    one point per (pair, part), coloured by part kind, with the pooled Spearman ρ and its interval:
    `Faithfulness.plot`, at most `MAX_POINTS` points a panel."""
    fig = new_figure(9, 3.9)
    axes = fig.subplots(1, 2)
    audit.faithfulness.plot(max_points=MAX_POINTS, ax=axes)
    legend_below(fig, axes, ncols=4)  # the plot's own legends sit over the points
    return fig


def part_grid(names: list[str], values: np.ndarray) -> tuple[list[str], list[str], np.ndarray]:
    """Arrange per-part values [P] on a grid: rows 'embed', 'L0', ...; columns 'H0', ... (heads),
    'attn' (a whole attention sublayer), 'attn bias', 'MLP · embed' (MLPs, and the embeddings in
    the top row). Cells without a part are NaN; parts of other shapes (neurons) are left out."""
    cells: dict[tuple[int, str], float] = {}
    n_layers = 0
    for name, v in zip(names, values):
        if name == "embed":
            cells[(0, "MLP · embed")] = float(v)
            continue
        part = Part.parse(name)
        if part.kind == "mlp" and not part.is_sublayer:  # neurons and MLP biases have no cell
            continue
        n_layers = max(n_layers, part.layer + 1)
        col = ("MLP · embed" if part.kind == "mlp" else f"H{part.head}" if part.head is not None
               else "attn bias" if part.bias else "attn")
        cells[(part.depth, col)] = float(v)
    heads = sorted({c for _, c in cells if c.startswith("H")}, key=lambda c: int(c[1:]))
    cols = heads + [c for c in ("attn", "attn bias", "MLP · embed") if any(k == c for _, k in cells)]
    grid = np.full((n_layers + 1, len(cols)), np.nan)
    for (row, col), v in cells.items():
        grid[row, cols.index(col)] = v
    return ["embed"] + [f"L{i}" for i in range(n_layers)], cols, grid


def fig_heatmaps(audit: Audit) -> Figure:
    """Mean margin attribution (heads level) and mean total patching effect per part, on a grid of
    layers × heads with the MLPs (and the embeddings, top row) in the right-hand column."""
    import matplotlib

    panels = [("mean attribution (chosen − rejected)", audit.heads.names, counted_mean(audit, audit.heads.margin)),
              (f"mean total patching effect ({audit.faithfulness.mode})", audit.faithfulness.names,
               counted_mean(audit, audit.faithfulness.total))]
    grids = [part_grid(names, values) for _, names, values in panels]
    n_rows, n_cols = max(len(g[0]) for g in grids), max(len(g[1]) for g in grids)
    fig = new_figure(min(14.0, max(8.0, 2.0 + 1.1 * n_cols)), min(14.0, max(2.6, 0.9 + 0.32 * n_rows)))
    axes = fig.subplots(1, 2)
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#eeeeee")
    for ax, (title, _, _), (rows, cols, grid) in zip(axes, panels, grids):
        vmax = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
        vmax = vmax if vmax > 0 else 1.0
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(cols)), cols, fontsize=7, rotation=45 if len(cols) > 12 else 0)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        heads = sum(c.startswith("H") for c in cols)
        if 0 < heads < len(cols):
            ax.axvline(heads - 0.5, color="white", lw=3)  # heads | whole-sublayer columns
        if grid.size <= 160:  # numbers stay legible on small models only
            for (i, j), v in np.ndenumerate(grid):
                if np.isfinite(v):
                    ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=6,
                            color="white" if abs(v) > 0.6 * vmax else "black")
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.9, fraction=0.05, aspect=25).set_label("reward units", fontsize=8)
    return fig


def fig_probes(audit: Audit) -> Figure:
    """Forest plot: each probe axis' mean reward change (with − without) and its bootstrap interval,
    flagged axes in red, the flagging floor ±min_effect × scale shaded, q on the right (`Probes.plot`)."""
    p = need(audit.probes, "probes", "run rewardlens.probe(model) (or `rewardlens audit` with probes)")
    fig = new_figure(7.5, 0.95 + 0.3 * len(p.axes))
    p.plot(ax=fig.subplots())
    return fig


def fig_concepts(audit: Audit) -> Figure:
    """Dose-response per concept: mean reward change against α with a 95% band (±1.96 standard
    errors over dosed inputs), one small panel per concept, shared y axis."""
    c = need(audit.concepts, "concepts", "run rewardlens.concepts(model) (or `rewardlens audit` with concepts)")
    n = len(c.names)
    ncols = min(5, n)
    nrows = -(-n // ncols)
    fig = new_figure(2.0 * ncols + 0.6, 1.75 * nrows + 0.5)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)).ravel()
    for i, ax in enumerate(axes):
        if i >= n:
            ax.set_axis_off()
            continue
        dose = c.dose[i]  # [n_alphas, n_inputs], NaN padding
        k = np.isfinite(dose).sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(k > 0, np.nansum(dose, 1) / np.maximum(k, 1), np.nan)
            sd = np.sqrt(np.nansum((dose - mean[:, None]) ** 2, 1) / np.maximum(k - 1, 1))
            half = 1.96 * sd / np.sqrt(np.maximum(k, 1))
        ax.fill_between(c.alphas, mean - half, mean + half, color="tab:purple", alpha=0.25, lw=0)
        ax.plot(c.alphas, mean, color="tab:purple", marker="o", ms=3, lw=1.5)
        ax.axhline(0, color="gray", lw=0.5)
        ax.axvline(0, color="gray", lw=0.5)
        ax.set_title(f"{c.names[i]}\nslope {c.slope[i]:+.3g} [{c.slope_ci[i, 0]:+.2g}, {c.slope_ci[i, 1]:+.2g}]",
                     fontsize=8, parse_math=False)  # concept names are the user's: '$' is not math
        ax.tick_params(labelsize=7)
    fig.supxlabel(f"α ({c.unit} units), added at layer {c.dose_layer}, {c.positions} position(s)", fontsize=9)
    fig.supylabel("Δ reward (reward units)", fontsize=9)
    return fig


def fig_features(audit: Audit, n: int = 20) -> Figure:
    """The `n` SAE features with the largest mean chosen − rejected contribution (bars, by sign:
    `FeatureAttribution.plot`)."""
    f = need(audit.features, "features", "pass an SAE to `rewardlens audit` (or rewardlens.attribute_features)")
    shown = len(f.top(n, by="margin" if f.is_pairs else "mean"))  # the plot's bars: the height follows them
    fig = new_figure(7, 0.6 + 0.24 * max(shown, 1))
    f.plot(n=n, ax=fig.subplots())
    return fig


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
