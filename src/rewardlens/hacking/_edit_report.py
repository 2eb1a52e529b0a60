"""`edit_report`: what an edit did to the margins of the bias pairs, the quality pairs and the probe axes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._deprecated import renamed
from ..data import Pair, margin
from ..errors import DataError, UsageError
from ..model import RewardModel
from ..model.internal import finite_accuracy
from ..plotting import HtmlView
from ..stats import bootstrap_ci, summary_frame
from ..types import EditMethod
from ._editing import Edit

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# ---- what the edit did --------------------------------------------------------------------------

@dataclass(frozen=True)
class EditReport(HtmlView):
    """Margins (chosen − rejected, reward units) before and after an edit.

    `probe_before`/`probe_after` [n_probe]: pairs that differ only in the concept (chosen carries it);
    `other_before`/`other_after` [n_other]: untargeted pairs, whose accuracy should not move.
    """

    probe_ids: list[str]
    probe_before: np.ndarray
    probe_after: np.ndarray
    other_ids: list[str]
    other_before: np.ndarray
    other_after: np.ndarray
    method: EditMethod | None = None
    name: str | None = None

    @property
    def targeted_before(self) -> float:
        """Mean concept margin before the edit (the targeted effect); NaN without probe pairs."""
        return _mean(self.probe_before)

    @property
    def targeted_after(self) -> float:
        return _mean(self.probe_after)

    @property
    def share_removed(self) -> float:
        """1 − after/before of the mean concept margin (1: all removed, 0: none, < 0: it grew, > 1:
        it reversed); NaN when the effect before the edit is zero or was not measured."""
        before = self.targeted_before
        return 1.0 - self.targeted_after / before if before != 0 else float("nan")

    @property
    def accuracy_before(self) -> float:
        """Share of untargeted pairs with a positive margin before the edit (non-finite margins left out)."""
        return finite_accuracy(self.other_before)

    @property
    def accuracy_after(self) -> float:
        return finite_accuracy(self.other_after)

    @property
    def accuracy_change(self) -> float:
        """Change of the untargeted pair accuracy, in percentage points (after − before)."""
        return 100.0 * (self.accuracy_after - self.accuracy_before)

    def intervals(self, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
                  level: float | None = None) -> dict[str, tuple[float, float]]:
        """Bootstrap intervals (pairs resampled with before and after together) of the share removed
        (probe pairs) and of the accuracy change in points (untargeted pairs), of coverage `confidence`
        (`level` is its deprecated name, one release)."""
        confidence = renamed("EditReport.intervals", "level", "confidence", level, confidence)

        def ci(before: np.ndarray, after: np.ndarray,
               stat: Callable[[np.ndarray, np.ndarray], float]) -> tuple[float, float]:
            rows = np.arange(len(before), dtype=np.float64)
            return bootstrap_ci(rows, stat=lambda i: stat(before[i.astype(int)], after[i.astype(int)]),
                                n_boot=n_boot, level=confidence, seed=seed)

        share = lambda b, a: 1.0 - _mean(a) / _mean(b) if _mean(b) != 0 else float("nan")  # as `share_removed`
        points = lambda b, a: 100.0 * (finite_accuracy(a) - finite_accuracy(b))
        return {"share_removed": ci(self.probe_before, self.probe_after, share),
                "accuracy_change_points": ci(self.other_before, self.other_after, points)}

    def summary(self) -> pd.DataFrame:
        """One row per number of the edit's report (`stats.summary_frame`): `value`, with `low`, `high` (the
        bootstrap intervals of `intervals()`) for the share removed and the accuracy change and `n` the pairs
        each is over; NaN where unmeasured."""
        nan, ci = float("nan"), self.intervals()
        n_probe, n_other = len(self.probe_before), len(self.other_before)
        rows = [("targeted_before", self.targeted_before, n_probe), ("targeted_after", self.targeted_after, n_probe),
                ("share_removed", self.share_removed, n_probe), ("accuracy_before", self.accuracy_before, n_other),
                ("accuracy_after", self.accuracy_after, n_other),
                ("accuracy_change_points", self.accuracy_change, n_other),
                ("other_margin_before", _mean(self.other_before), n_other),
                ("other_margin_after", _mean(self.other_after), n_other)]
        return summary_frame([{"name": k, "value": v, "low": ci.get(k, (nan, nan))[0], "high": ci.get(k, (nan, nan))[1],
                               "n": n} for k, v, n in rows])

    def row(self) -> dict[str, Any]:
        """Every number of the edit's report as one flat dict (bootstrap intervals as `*_lo`/`*_hi`), NaN where
        unmeasured, so the rows of several edits stack into a frame (what `rewardlens edit --json` writes)."""
        out: dict[str, Any] = {
            "targeted_before": self.targeted_before, "targeted_after": self.targeted_after,
            "share_removed": self.share_removed, "accuracy_before": self.accuracy_before,
            "accuracy_after": self.accuracy_after, "accuracy_change_points": self.accuracy_change,
            "other_margin_before": _mean(self.other_before), "other_margin_after": _mean(self.other_after),
            "n_probe": len(self.probe_before), "n_other": len(self.other_before),
        }
        for key, (lo, hi) in self.intervals().items():
            out[f"{key}_lo"], out[f"{key}_hi"] = lo, hi
        return out

    def to_frame(self) -> pd.DataFrame:
        """Rows: targeted mean margin, untargeted accuracy and mean margin; columns before, after, change."""
        import pandas as pd

        s = self.row()
        rows = [("targeted mean margin", s["targeted_before"], s["targeted_after"]),
                ("untargeted accuracy", s["accuracy_before"], s["accuracy_after"]),
                ("untargeted mean margin", s["other_margin_before"], s["other_margin_after"])]
        frame = pd.DataFrame(rows, columns=["quantity", "before", "after"])
        frame["change"] = frame["after"] - frame["before"]
        return frame

    def plot(self, ax: Axes | None = None) -> Figure:
        """Margins before against after: the concept pairs should fall to 0, the others stay on the diagonal;
        into `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (4.5, 4.5))
        ax.scatter(self.other_before, self.other_after, s=10, alpha=0.6, label="untargeted pairs")
        ax.scatter(self.probe_before, self.probe_after, s=10, alpha=0.6, label="concept pairs")
        span = np.concatenate([[0.0], self.probe_before, self.other_before])
        ax.plot([span.min(), span.max()], [span.min(), span.max()], color="grey", lw=0.8)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="margin before the edit", ylabel="margin after the edit",
               title=f"{self.method or 'edit'}: {self.share_removed:.0%} of the targeted effect removed")
        ax.legend()
        return finish(ax, made)


def _mean(x: np.ndarray) -> float:
    """Mean of the finite entries of `x` (a non-finite margin is undefined, not a number to average); NaN if none."""
    finite = np.asarray(x, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.mean(finite)) if len(finite) else float("nan")


def _margins(model: RewardModel, pairs: Sequence[Pair], batch_size: int) -> np.ndarray:
    if not len(pairs):
        return np.zeros(0, dtype=np.float32)
    scores = model.score(pairs, batch_size=batch_size)
    return margin(scores)


def _axis_margins(model: RewardModel, axis: str, items: Sequence[Any] | None, batch_size: int) -> np.ndarray:
    # the probe suite's transformations: the same items with and without the axis' attribute
    from ._axes import contrast_sets

    with_, without = contrast_sets(axis, items)
    return model.score(with_, batch_size=batch_size) - model.score(without, batch_size=batch_size)


def edit_report(
    model: RewardModel,
    edited: Edit | RewardModel,
    *,
    probe_pairs: Sequence[Pair] | None = None,
    other_pairs: Sequence[Pair] = (),
    axis: str | None = None,
    items: Sequence[Any] | None = None,
    batch_size: int = 16,
) -> EditReport:
    """How much an edit shrank the targeted effect and moved everything else.

    The targeted effect is the mean margin on `probe_pairs` (pairs that differ only in the concept,
    chosen with it), or, with `axis` (a probe axis such as 'formatting'), the mean probe effect
    reward(with) − reward(without) on the probe suite's built-in items (or `items`); with neither,
    only `other_pairs` are compared. `other_pairs` are untargeted pairs: their accuracy and mean
    margin before and after.
    """
    if probe_pairs is not None and axis is not None:
        raise UsageError("pass one of probe_pairs= (pairs differing only in the concept) or axis=, not both")
    after = edited.model if isinstance(edited, Edit) else edited
    other_pairs = list(other_pairs)
    if probe_pairs is None and axis is None and not other_pairs:
        raise UsageError("nothing to report: pass probe_pairs= or axis= (the targeted effect), other_pairs= or both")
    if probe_pairs is not None and not len(probe_pairs):
        raise DataError("probe_pairs is empty; the targeted effect needs at least one pair")
    if axis is None:
        probe_pairs = list(probe_pairs or [])
        ids = [p.id if p.id is not None else str(i) for i, p in enumerate(probe_pairs)]
        before_p, after_p = (_margins(m, probe_pairs, batch_size) for m in (model, after))
    else:
        before_p, after_p = (_axis_margins(m, axis, items, batch_size) for m in (model, after))
        ids = [f"{axis}/{i}" for i in range(len(before_p))]
    info = (edited.method, edited.name) if isinstance(edited, Edit) else (None, None)
    return EditReport(ids, before_p, after_p, [p.id if p.id is not None else str(i) for i, p in enumerate(other_pairs)],
                      _margins(model, other_pairs, batch_size), _margins(after, other_pairs, batch_size), *info)
