"""The one rule every result's `plot` follows: draw into the caller's axes, or into a new figure.

`result.plot(..., ax=None) -> Figure`. With `ax`, the result draws into those axes and returns
their figure (`ax.figure`; the root figure when they lie in a subfigure), leaving its size and
layout to the caller: an audit report, a grid of a notebook's own making. Without `ax`, it makes a
new pyplot figure (what a notebook shows) and lays it out tight. A plot of one panel takes one
`Axes`; a plot of several takes a sequence (list, tuple or the array `subplots` returns) of exactly
that many, in the order its docstring lists. The base layer: matplotlib is imported only when a
figure is made, and no rewardlens module is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def one_panel(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Axes, bool]:
    """(the axes to draw in, whether this plot made their figure): `ax` itself, or the one axes of a
    new pyplot figure of `figsize` inches (width, height)."""
    from matplotlib.axes import Axes

    if ax is None:
        import matplotlib.pyplot as plt

        return plt.subplots(figsize=figsize)[1], True
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes (or None for a new figure), got {type(ax).__name__}")
    return ax, False


def panels(ax: Sequence[Axes] | None, shape: tuple[int, int], figsize: tuple[float, float], what: str,
           **subplots: Any) -> tuple[list[Axes], bool]:
    """(the rows × cols axes to draw in, flattened row by row; whether this plot made their figure).

    `ax`: the caller's rows × cols axes, or None for a new pyplot figure of `figsize` inches, made
    with `subplots` keywords (sharex=, sharey=: a caller's axes are shared or not as they are).
    `what` names the plot in the error a wrong `ax` gets."""
    import numpy as np
    from matplotlib.axes import Axes

    n = shape[0] * shape[1]
    if ax is None:
        import matplotlib.pyplot as plt

        made = plt.subplots(*shape, figsize=figsize, squeeze=False, **subplots)[1]
        return list(made.ravel()), True
    if isinstance(ax, Axes):
        raise TypeError(f"{what} draws {n} panels: pass ax as a sequence of {n} matplotlib Axes "
                        f"(e.g. plt.subplots({shape[0]}, {shape[1]})[1]), not one Axes")
    given = list(np.asarray(ax, dtype=object).ravel())
    if len(given) != n or not all(isinstance(a, Axes) for a in given):
        raise UsageError(f"{what} draws {n} panels: ax must hold {n} matplotlib Axes, got {len(given)} object(s) "
                         f"({sorted({type(a).__name__ for a in given})})")
    return given, False


def finish(ax: Axes, made: bool) -> Figure:
    """The figure a plot returns: the root figure of `ax`. A figure the plot made is laid out tight;
    the caller's keeps its own layout (a constrained-layout figure would warn at `tight_layout`)."""
    fig = ax.figure.figure
    if made:
        fig.tight_layout()
    return fig
