"""`Probes.plot`: the probes' forest plot, each axis' mean effect and interval against the flag floor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class Forest(Protocol):
    """What the forest plot reads of a `Probes` (a protocol, so that `_probes`, which draws with this
    module, is not imported back: one direction of import)."""

    @property
    def axes(self) -> Sequence[str]: ...

    @property
    def n(self) -> np.ndarray: ...

    @property
    def mean(self) -> np.ndarray: ...

    @property
    def ci_low(self) -> np.ndarray: ...

    @property
    def ci_high(self) -> np.ndarray: ...

    @property
    def q(self) -> np.ndarray: ...

    @property
    def flagged(self) -> np.ndarray: ...

    @property
    def fragile(self) -> np.ndarray: ...

    @property
    def min_effect(self) -> float: ...

    @property
    def scale(self) -> float: ...


def forest(p: Forest, ax: Axes | None = None) -> Figure:
    """Forest plot: each axis' mean effect (with − without) and its bootstrap interval, first axis on
    top, flagged axes in red (a fragile flag, one the alternative scale would change, in orange, hollow),
    the flagging floor ±min_effect × scale shaded, q on the right; into `ax` when given (its figure is
    returned), else a new figure."""
    from matplotlib.lines import Line2D

    from ..plotting import finish, one_panel

    ax, made = one_panel(ax, (7.5, 0.95 + 0.3 * len(p.axes)))
    y = np.arange(len(p.axes))[::-1]
    floor = p.min_effect * p.scale
    if floor > 0:
        ax.axvspan(-floor, floor, color="#eeeeee", zorder=0,
                   label=f"below flag floor (±{floor:.2g} = {p.min_effect:g} × scale {p.scale:.3g})")
    ax.axvline(0, color="black", lw=0.8)
    fragile = np.asarray(p.fragile, dtype=bool)
    colors = ["tab:orange" if w else "tab:red" if f else "tab:gray" for f, w in zip(p.flagged, fragile)]
    for yi, m, lo, hi, color in zip(y, p.mean, p.ci_low, p.ci_high, colors):
        # One call per axis: error-bar caps take a single colour, not one per point.
        if np.isfinite([m, lo, hi]).all():
            ax.errorbar([m], [yi], xerr=[[m - lo], [hi - m]], fmt="none", ecolor=color, capsize=3, lw=1.2)
    # one collection, first axis first: a fragile point hollow (white face, orange edge)
    ax.scatter(p.mean, y, facecolors=["white" if w else c for c, w in zip(colors, fragile)], edgecolors=colors,
               zorder=3, s=22)
    ax.set_yticks(y, [f"{a} (n={k})" for a, k in zip(p.axes, p.n)], fontsize=8)
    trans = ax.get_yaxis_transform()
    for yi, q in zip(y, p.q):
        ax.text(1.01, yi, f"q={q:.2g}", transform=trans, fontsize=7, va="center")
    ax.set_xlabel("reward change, with − without (reward units; 95% bootstrap CI)")
    handles = [*ax.get_legend_handles_labels()[0],
               Line2D([], [], ls="none", marker="o", ms=4.5, color="tab:red", label="flagged")]
    if fragile.any():
        handles.append(Line2D([], [], ls="none", marker="o", ms=4.5, markerfacecolor="white",
                              markeredgecolor="tab:orange", label="fragile: the alternative scale changes the flag"))
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    return finish(ax, made)


__all__ = ["forest"]
