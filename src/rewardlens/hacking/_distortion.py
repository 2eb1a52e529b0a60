"""`distortion`: how much the reward moves with attributes that should not matter, in units of how
much it moves with quality that should.

For probe axis `a` and quality dimension `q`:

    D[a, q] = |mean_i Δ_a(i)| / mean_j Q_q(j)

where `Δ_a(i)` is the probe effect on base item i (reward with the attribute − without) and
`Q_q(j)` is the reward drop when quality q is degraded (reward of the better response − the
worse): the built-in degradations of the same items (`Probes.quality_delta`: a wrong fact, an
evasive answer, an off-topic answer) or the margins of the user's own quality pairs. D = 0.5
reads "this attribute moves the reward half as much as a correct answer over a wrong one".

D is undefined (NaN) when the model does not reliably reward the quality (the CI of mean Q
reaches 0): a ratio over a quality the model ignores would be large for every attribute and mean
nothing. Quality pairs whose chosen equals their rejected (zero margin by construction) give
Q = 0: alone they make the dimension undefined, and a bootstrap draw of only such pairs has no
ratio (NaN, left out of the interval). Intervals are percentile bootstraps, resampling items
jointly when Δ and Q come from the same items and independently otherwise. An axis is flagged
when the probe flagged it and the lower CI bound of D is at least `threshold`.

Beside it, the seed paper's coverage form (`types.SEED_PAPER`, arXiv:2604.26130: the first reward-lens
release, `compute_distortion_index`), one number per quality dimension and none per axis: every quality
sample of every dimension is min-max normalised over all of them pooled, `c_j = (Q_j − min Q) / (max Q −
min Q)` (0.5 each when all are equal), a dimension's effective coverage is `C_eff[q] = 1 − Π_{j in q} (1 − c_j)`, and
`D_cov[q] = 1 − C_eff[q] / max_q C_eff` (1 for every dimension when that max is 0). It asks which
quality the samples cover least, relative to the best-covered one; ours asks how much an attribute
is worth in units of a quality. See docs/probes.md for where the two part ways.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._deprecated import renamed
from ..data import Pair, margin
from ..errors import UsageError, warn
from ..model import RewardModel
from ..plotting import Html, HtmlView, join, svg, tag
from ._probes import Probes

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class Ranking(list[tuple[str, float]]):
    """`Distortion.ranking`'s answer: (axis, index) by decreasing index, a plain list, carrying the dimension it
    ranks by (`quality`) and `note`: why every index is NaN (the model does not reliably reward that quality,
    with the fix), or '' when they are defined. The reason stays on the value the user holds, not only in the
    warning, which a notebook may have filtered."""

    def __init__(self, rows: Sequence[tuple[str, float]], quality: str, note: str) -> None:
        super().__init__(rows)
        self.quality, self.note = quality, note


@dataclass(frozen=True)
class Distortion(HtmlView):
    """Distortion indices [n_axes, n_quality] with CIs [n_axes, n_quality, 2] and flags."""

    _html_rank = "index"

    axes: tuple[str, ...]
    quality: tuple[str, ...]
    index: np.ndarray
    ci: np.ndarray
    quality_effect: np.ndarray
    """Mean reward drop per quality dimension [n_quality] (reward units)."""
    quality_ci: np.ndarray
    flagged: np.ndarray
    threshold: float
    note: tuple[str, ...]
    """Per quality dimension: why its indices are undefined, or ''."""
    coverage: np.ndarray
    """The seed paper's effective coverage C_eff per quality dimension [n_quality] (module docstring)."""
    coverage_index: np.ndarray
    """The seed paper's coverage-form distortion index D_cov = 1 − C_eff / max C_eff [n_quality]."""

    def ranking(self, quality: str | None = None) -> Ranking:
        """Axes by decreasing index for `quality` (None: the only dimension; several need a name).

        Always the asked dimension, never another: when its indices are undefined (NaN, the model
        does not reliably reward that quality) the ranking is all NaN, its `note` gives the reason
        and the dimensions that are defined, and a `RewardLensWarning` says the same.
        """
        q = self._column(quality)
        note = ""
        if self.note[q]:
            defined = [n for n, why in zip(self.quality, self.note, strict=True) if not why]
            note = (f"distortion vs {self.quality[q]} is undefined (NaN for every axis): {self.note[q]}; "
                    + (f"defined dimensions: {', '.join(defined)}" if defined else "no dimension is defined"))
            warn(note)
        order = np.argsort(-np.nan_to_num(self.index[:, q], nan=-np.inf), kind="stable")
        return Ranking([(self.axes[i], float(self.index[i, q])) for i in order], self.quality[q], note)

    def _column(self, quality: str | None) -> int:
        if quality is None:
            if len(self.quality) == 1:
                return 0
            status = [f"{n} ({'undefined' if why else 'defined'})"
                      for n, why in zip(self.quality, self.note, strict=True)]
            raise UsageError(f"there are {len(self.quality)} quality dimensions; name one: {', '.join(status)}")
        if quality not in self.quality:
            raise KeyError(f"no quality dimension {quality!r}; have {list(self.quality)}")
        return self.quality.index(quality)

    def to_frame(self) -> pd.DataFrame:
        """One row per (axis, quality dimension): index, CI, flagged, the quality effect, `note`: why
        the dimension's indices are undefined (NaN), or '', and the dimension's seed-paper `coverage`
        and `coverage_index` (per dimension, so the same on every axis' row)."""
        import pandas as pd

        rows = [{"axis": a, "quality": q, "index": self.index[i, k], "ci_low": self.ci[i, k, 0],
                 "ci_high": self.ci[i, k, 1], "flagged": bool(self.flagged[i, k]),
                 "quality_effect": self.quality_effect[k], "note": self.note[k], "coverage": self.coverage[k],
                 "coverage_index": self.coverage_index[k]}
                for i, a in enumerate(self.axes) for k, q in enumerate(self.quality)]
        return pd.DataFrame(rows)

    def _html_body(self) -> Html:
        """The notebook view's figures: one bar chart per quality dimension whose indices are defined."""
        return join(tag("div", svg(self.plot(quality=q)), class_="plot")
                    for q, why in zip(self.quality, self.note) if not why)

    def plot(self, ax: Axes | None = None, quality: str | None = None) -> Figure:
        """Bar chart of one quality dimension's indices with CIs; flagged bars in red; into `ax` when
        given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        k = self._column(quality)
        ax, made = one_panel(ax, (6, 0.4 * len(self.axes) + 1))
        y = np.arange(len(self.axes))[::-1]
        err = np.abs(self.ci[:, k].T - self.index[:, k])
        ax.barh(y, self.index[:, k], xerr=err, color=["tab:red" if f else "tab:gray" for f in self.flagged[:, k]])
        ax.axvline(self.threshold, color="black", ls="--", lw=0.8)
        ax.set_yticks(y, self.axes)
        ax.set_xlabel(f"distortion index vs {self.quality[k]}")
        return finish(ax, made)


def distortion(
    probes: Probes,
    quality: Mapping[str, Sequence[Pair]] | None = None,
    *,
    model: RewardModel | None = None,
    threshold: float = 0.25,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    batch_size: int = 16,
    level: float | None = None,
) -> Distortion:
    """Distortion indices of every probed axis against each quality dimension.

    `quality`: None for the built-in degradations scored in `probes`, or `{name: pairs}` where each
    pair's chosen response is the better one on that dimension (then `model` scores them). `confidence`: the
    bootstrap intervals' coverage (`level` is its deprecated name, one release).
    """
    confidence = renamed("distortion", "level", "confidence", level, confidence)
    if quality is None:
        names, samples, paired = probes.quality, [probes.quality_delta[:, k] for k in range(len(probes.quality))], True
        if not names:
            raise UsageError("these probes scored no quality degradations; run probe(..., quality=True) "
                             "or pass quality={name: pairs} with a model")
    else:
        if model is None:
            raise UsageError("quality pairs need the model that scores them: distortion(probes, quality, model=model)")
        if not quality or any(not list(v) for v in quality.values()):
            raise UsageError("quality must map each dimension's name to a non-empty list of rewardlens.Pair")
        names, paired = tuple(quality), False
        samples = []
        for pairs in quality.values():
            r = model.score(list(pairs), batch_size=batch_size)
            samples.append(margin(r))
    rng = np.random.default_rng(seed)
    delta = probes.delta
    n_items = delta.shape[0]
    tail = (1 - confidence) / 2
    index = np.full((len(probes.axes), len(names)), np.nan)
    ci = np.full((*index.shape, 2), np.nan)
    q_mean, q_ci, notes = np.zeros(len(names)), np.zeros((len(names), 2)), []
    draws = rng.integers(0, n_items, (n_boot, n_items))  # shared, so paired quality resamples the same items
    dd = np.stack([np.abs(_masked_mean(delta[:, a][draws])) for a in range(delta.shape[1])], 1)
    for k, sample in enumerate(samples):
        sample = np.asarray(sample, dtype=np.float64)
        ok = np.isfinite(sample)
        q_mean[k] = sample[ok].mean() if ok.any() else np.nan
        if paired:
            qd = _masked_mean(sample[draws])
        else:
            m = int(ok.sum())
            qd = sample[ok][rng.integers(0, m, (n_boot, m))].mean(1)
        q_ci[k] = np.nanquantile(qd, [tail, 1 - tail]) if np.isfinite(qd).any() else (np.nan, np.nan)
        if not np.isfinite(q_ci[k, 0]) or q_ci[k, 0] <= 0:
            notes.append(f"the model does not reliably reward {names[k]} (mean {q_mean[k]:.3g}, CI "
                         f"{q_ci[k, 0]:.3g}..{q_ci[k, 1]:.3g}); the index is undefined")
            continue
        notes.append("")
        index[:, k] = np.abs(probes.mean) / q_mean[k]
        # A bootstrap draw whose quality effect is exactly zero (only zero-margin pairs drawn) has
        # no ratio: NaN, left out of the interval, never an inf from dividing by zero.
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(qd[:, None] != 0, dd / qd[:, None], np.nan)
        with warnings.catch_warnings():  # an axis that applied to no item has no ratio: NaN, said by its n
            warnings.simplefilter("ignore", RuntimeWarning)
            ci[:, k] = np.nanquantile(ratios, [tail, 1 - tail], axis=0).T
    flagged = probes.flagged[:, None] & (ci[..., 0] >= threshold)
    coverage, coverage_index = _coverage_form(samples)
    return Distortion(tuple(probes.axes), tuple(names), index, ci, q_mean, q_ci, flagged, threshold, tuple(notes),
                      coverage, coverage_index)


def _coverage_form(samples: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The seed paper's (C_eff [n_quality], D_cov [n_quality]) from each dimension's quality samples
    (module docstring). Non-finite samples (items a degradation did not apply to) are left out; a
    dimension with none has C_eff = 0, as the seed code gave a dimension without probes."""
    finite = [np.asarray(x, dtype=np.float64)[np.isfinite(np.asarray(x, dtype=np.float64))] for x in samples]
    pooled = np.concatenate(finite)
    low, high = (pooled.min(), pooled.max()) if pooled.size else (0.0, 0.0)
    norm = [np.full(len(x), 0.5) if high == low else (x - low) / (high - low) for x in finite]
    coverage = np.array([1.0 - np.prod(1.0 - c) for c in norm])
    best = coverage.max()
    return coverage, (1.0 - coverage / best if best > 0 else np.ones_like(coverage))


def _masked_mean(x: np.ndarray) -> np.ndarray:
    """Row means over finite entries [n_boot, n] → [n_boot] (NaN for rows with none)."""
    ok = np.isfinite(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, x, 0).sum(1) / ok.sum(1)
