"""What every audit figure is drawn on: a pyplot-free `Figure`, PNG bytes, and the shared helpers.

Figures are built on `matplotlib.figure.Figure` directly, not through pyplot: no global state is
touched (a notebook's backend stays as it is, nothing accumulates in pyplot's figure list), and
`to_png` renders them with the Agg canvas.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import RewardLensError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_T = TypeVar("_T")

KIND_COLORS = {"linear": "tab:blue", "normed": "tab:orange"}
PART_COLORS = {"embed": "tab:green", "attn": "tab:blue", "mlp": "tab:red"}


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout figure of `width` × `height` inches, outside pyplot."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def to_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes, rendered by the Agg canvas (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def legend_below(fig: Figure, axes: Sequence[Axes], ncols: int = 3) -> None:
    """One legend for `axes`, below them and outside every axis (constrained layout makes room for it):
    a legend inside a panel covers what it plots. Each label once (panels repeat theirs); a legend a
    result's own `plot` drew inside an axis is moved out. Nothing is drawn when no artist has a label."""
    handles: dict[str, Any] = {}
    for ax in axes:
        drawn = ax.get_legend()
        if drawn is not None:  # its entries may be proxies no artist of the axis carries
            found = zip(drawn.legend_handles, [t.get_text() for t in drawn.get_texts()])
            drawn.remove()
        else:
            found = zip(*ax.get_legend_handles_labels())
        for handle, label in found:
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(ncols, len(handles)), fontsize=7)


def need(value: _T | None, name: str, how: str) -> _T:
    """`value` (the audit's `name` result), or `RewardLensError` when the audit lacks it."""
    if value is None:
        raise RewardLensError(f"this audit has no {name} result (audit.{name} is None), so there is nothing to "
                              f"plot; {how}")
    return value
