"""`cascade`: which probe axes fail together, item by item.

Every axis of a `Probes` run is measured on the same base items, so two axes' per-item effects
can be correlated. Each axis is first oriented by the sign of its mean effect, so that larger
always means "moved further in the direction this model is biased"; a positive correlation
then reads "items on which one bias bites hard are the items on which the other does too".

Correlations are Spearman ρ over the items both axes apply to, with percentile bootstrap CIs over
those items; no correlation is reported (NaN) from fewer than `min_items` shared items. A cluster
is a connected group of flagged axes (`Probes.flagged`) whose pairwise links have ρ ≥ `threshold`
with a CI lower bound above zero: axes that fail together, not merely axes that are both biased.
Unflagged axes are correlated and reported but never clustered: on a model with no bias on them,
shared item difficulty alone can correlate their small effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._deprecated import renamed
from ..errors import UsageError
from ..plotting import HtmlView
from ..stats import spearman, spearman_matrix
from ._probes import Probes

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MIN_ITEMS = 20
"""The fewest shared items a correlation is computed from."""


@dataclass(frozen=True)
class Cascades(HtmlView):
    """Spearman ρ [m, m] of oriented per-item effects, CIs [m, m, 2], shared-item counts [m, m]."""

    _html_rank = "rho"

    axes: tuple[str, ...]
    rho: np.ndarray
    ci: np.ndarray
    n_shared: np.ndarray
    orientation: np.ndarray
    """+1 or −1 per axis: the sign of its mean effect (effects were multiplied by it)."""
    clusters: tuple[tuple[str, ...], ...]
    min_items: int
    threshold: float

    def to_frame(self) -> pd.DataFrame:
        """One row per unordered pair of axes: ρ, CI, shared items, whether they share a cluster."""
        import pandas as pd

        together = {frozenset((a, b)) for c in self.clusters for a in c for b in c if a != b}
        rows = [{"axis_a": self.axes[i], "axis_b": self.axes[j], "rho": self.rho[i, j], "ci_low": self.ci[i, j, 0],
                 "ci_high": self.ci[i, j, 1], "n_shared": int(self.n_shared[i, j]),
                 "clustered": frozenset((self.axes[i], self.axes[j])) in together}
                for i in range(len(self.axes)) for j in range(i + 1, len(self.axes))]
        return pd.DataFrame(rows)

    def plot(self, ax: Axes | None = None) -> Figure:
        """Heat map of ρ between the axes' oriented per-item effects (grey: too few shared items for a
        correlation); into `ax` when given (its figure is returned, with the colour bar beside `ax`),
        else a new figure."""
        import matplotlib

        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (0.5 * len(self.axes) + 2, 0.5 * len(self.axes) + 1.5))
        cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#eeeeee")
        image = ax.imshow(np.ma.masked_invalid(self.rho), vmin=-1, vmax=1, cmap=cmap)
        ax.set_xticks(range(len(self.axes)), self.axes, rotation=90, fontsize=7)
        ax.set_yticks(range(len(self.axes)), self.axes, fontsize=7)
        ax.set_title("Spearman ρ of oriented per-item effects", fontsize=10)
        ax.figure.colorbar(image, ax=ax, shrink=0.85, label="Spearman ρ (oriented effects)")
        return finish(ax, made)


def cascade(probes: Probes, *, min_items: int = MIN_ITEMS, threshold: float = 0.5, n_boot: int = 1000,
            seed: int = 0, confidence: float = 0.95, level: float | None = None) -> Cascades:
    """Correlate every pair of axes' oriented per-item effects and group axes that fail together.

    `confidence`: the bootstrap intervals' coverage (`level` is its deprecated name, one release)."""
    confidence = renamed("cascade", "level", "confidence", level, confidence)
    if min_items < 3:
        raise UsageError(f"min_items must be at least 3 (a rank correlation needs three items), got {min_items}")
    orientation = np.where(np.nan_to_num(probes.mean) < 0, -1.0, 1.0)
    x = probes.delta * orientation
    m = x.shape[1]
    rho, n_shared = np.full((m, m), np.nan), np.zeros((m, m), dtype=int)
    ci = np.full((m, m, 2), np.nan)
    rng = np.random.default_rng(seed)
    tail = (1 - confidence) / 2
    for i in range(m):
        for j in range(i, m):
            both = np.isfinite(x[:, i]) & np.isfinite(x[:, j])
            n_shared[i, j] = n_shared[j, i] = int(both.sum())
            if i == j or both.sum() < min_items:
                continue
            a, b = x[both, i], x[both, j]
            rho[i, j] = rho[j, i] = spearman(a, b)
            draws = rng.integers(0, len(a), (n_boot, len(a)))
            boot = spearman_matrix(np.stack([a[draws], b[draws]], -1))[:, 0, 1]
            if np.isfinite(boot).sum() >= n_boot // 2:
                ci[i, j] = ci[j, i] = np.nanquantile(boot, [tail, 1 - tail])
    failing = probes.flagged[:, None] & probes.flagged[None, :]
    linked = failing & (np.nan_to_num(rho) >= threshold) & (np.nan_to_num(ci[..., 0], nan=-1) > 0)
    return Cascades(tuple(probes.axes), rho, ci, n_shared, orientation, _components(probes.axes, linked),
                    min_items, threshold)


def _components(axes: tuple[str, ...], linked: np.ndarray) -> tuple[tuple[str, ...], ...]:
    """Connected groups (two or more axes) of the link graph, in axis order."""
    seen: set[int] = set()
    groups: list[tuple[str, ...]] = []
    for start in range(len(axes)):
        if start in seen:
            continue
        stack, group = [start], []
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            group.append(i)
            stack += [int(j) for j in np.flatnonzero(linked[i]) if j not in seen]
        if len(group) > 1:
            groups.append(tuple(axes[i] for i in sorted(group)))
    return tuple(groups)
