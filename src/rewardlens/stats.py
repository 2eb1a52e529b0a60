"""Statistics that do not lie (docs/design.md §4): rank correlations that are NaN when undefined,
bootstrap intervals over the units that were actually sampled, top-k overlap, Wilson intervals of
proportions and of weighted sums of them, the one rule that writes numbers as strict JSON, and the one
shape of every result's `summary()` (`summary_frame`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import rankdata

from .errors import UsageError

if TYPE_CHECKING:
    import pandas as pd


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman ρ of two vectors (average ranks for ties); NaN when either is constant or has < 3 values."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    n = len(ra)
    if len(np.unique(ra)) == n and len(np.unique(rb)) == n:  # no ties: the exact formula, so a perfect order is 1
        return float(1 - 6 * np.sum((ra - rb) ** 2) / (n * (n * n - 1)))
    return float(np.corrcoef(ra, rb)[0, 1])


def rowwise_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman ρ of each row of `a` [n, P] with the same row of `b` [n] (NaN where undefined)."""
    return np.array([spearman(x, y) for x, y in zip(a, b)])


def spearman_matrix(m: np.ndarray) -> np.ndarray:
    """Spearman ρ between the columns of each batch of `m` [B, n, k] → [B, k, k] (average ranks;
    NaN where a column is constant). Vectorised for bootstrap draws."""
    r = rankdata(m, axis=1)
    r = r - r.mean(1, keepdims=True)
    cov = np.einsum("bni,bnj->bij", r, r)
    sd = np.sqrt(np.einsum("bii->bi", cov))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = cov / (sd[:, :, None] * sd[:, None, :])
    return np.where((sd[:, :, None] > 0) & (sd[:, None, :] > 0), rho, np.nan)


def bootstrap_ci(
    values: np.ndarray, *, stat: Callable[[np.ndarray], float] = np.mean, n_boot: int = 2000,
    level: float = 0.95, seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over the finite entries of `values` [n] (resampling units).

    NaN interval with fewer than two finite values: one unit says nothing about spread.
    """
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return float("nan"), float("nan")
    return percentile_interval(_draws(x, stat, n_boot, np.random.default_rng(seed)), len(x), level)


_AXIS_STATS: tuple[Callable[..., object], ...] = (np.mean, np.median, np.nanmean, np.nanmedian)
"""Statistics that reduce along an axis: their draws are computed all at once, not one resample at a time."""
_BLOCK = 1 << 22
"""Resampled values held at once (32 MiB of float64): the draws of a long input are made in blocks."""


def _draws(x: np.ndarray, stat: Callable[[np.ndarray], float], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """`stat` of `n_boot` resamples of `x` [n] → [n_boot]. Drawing a block of resamples at once takes the
    generator's stream in the same order as one resample at a time, and a row's mean is the same pairwise
    sum as a vector's, so the draws are bit-equal to the one-at-a-time loop."""
    n = len(x)
    if not any(stat is s for s in _AXIS_STATS):
        return np.array([stat(x[rng.integers(0, n, n)]) for _ in range(n_boot)])
    rows = max(1, _BLOCK // n)
    blocks = [np.asarray(stat(x[rng.integers(0, n, (min(rows, n_boot - start), n))], axis=1))  # type: ignore[call-arg]
              for start in range(0, n_boot, rows)]
    return np.concatenate(blocks)


def percentile_interval(draws: np.ndarray, n: int, level: float) -> tuple[float, float]:
    """Percentile interval at `level` of bootstrap draws [B] over `n` units; NaN from fewer than two units or
    with an undefined draw (the house rule `bootstrap_ci` keeps, for draws a caller made itself)."""
    if n < 2 or not np.isfinite(draws).all():
        return float("nan"), float("nan")
    tail = (1 - level) / 2
    return float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))


def min_boot(level: float) -> int:
    """The fewest bootstrap draws whose percentile interval at `level` is one: `⌈2 / (1 − level)⌉` (40 at
    95%), so that each tail, a share `(1 − level) / 2` of the draws, holds at least one draw. With fewer,
    the bounds are the extreme draws (or one draw twice), whatever the level says."""
    return math.ceil(round(2 / (1 - level), 9))


def ranked(score: np.ndarray, k: int | None = None) -> np.ndarray:
    """Indices of `score` [P] from largest to smallest, NaN last, ties in their given order; the first `k`.

    The one ordering every "top" list uses (a sort by `-score` alone would put NaN first on some
    inputs and break ties by the sort's whim)."""
    s = np.asarray(score, dtype=np.float64)
    nan = np.isnan(s)
    order = np.argsort(np.where(nan, 0.0, -s), kind="stable")
    order = np.concatenate([order[~nan[order]], order[nan[order]]])  # NaN after every number, -inf included
    return order if k is None else order[:k]


def mean_abs(values: np.ndarray) -> np.ndarray:
    """The ranking statistic of every table of top parts: `mean_i |values[i, p]|` [P] over the rows of
    `values` [n, P] (0 for every column when there are no rows). Tables print it as the "mean |effect|"
    (or "mean |score|") column beside the signed mean, so the reader sees what the rows are sorted by."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise UsageError(f"mean_abs averages the columns of an [n, P] array, got shape {v.shape}")
    return np.abs(v).mean(0) if v.shape[0] else np.zeros(v.shape[1])


def top_parts(values: np.ndarray, k: int | None = None) -> np.ndarray:
    """Indices of the columns of `values` [n, P] by `mean_abs` (mean |value| over rows), largest first,
    NaN last, ties stable; the first `k`.

    The ranking rule of every table of top parts (docs/design.md §4): the mean of |effect|, not
    |mean effect|, so a part that moves the margin a lot with a sign that flips between pairs is
    large, and stays in the list. Every ranked table shows `mean_abs` as a column beside the signed
    mean (which need not be sorted)."""
    return ranked(mean_abs(values), k)


SMALL_MEAN_MARGIN = 0.5
"""A share of the mean margin is ill-conditioned when `|mean margin| < SMALL_MEAN_MARGIN × mean |margin|`:
the pairs disagree in sign enough that the mean cancels to under half of their typical size."""


def margin_share(values: np.ndarray, margins: np.ndarray, min_margin: float = 1e-4) -> np.ndarray:
    """Each column of `values` [n, P] (or [n]) as a share of each pair's own clean margin `margins` [n], pooled:

        share = Σ_i sign(m_i) · v_i / Σ_i |m_i|,

    the |m_i|-weighted mean of the per-pair shares `v_i / m_i` (1: the part or circuit carries every pair's
    own margin, whichever side the pair prefers). Its denominator is the mean |margin|, which pairs that
    disagree in sign cannot cancel, unlike the share of the mean margin `Σ v_i / Σ m_i`; a pair with a
    near-zero margin weighs nearly nothing instead of blowing up. NaN when the mean |margin| is under
    `min_margin` (no margin to share) or there are no pairs."""
    v, m = np.asarray(values, dtype=np.float64), np.asarray(margins, dtype=np.float64)
    scale = float(np.abs(m).mean()) if len(m) else float("nan")
    if not np.isfinite(scale) or scale < min_margin:
        return np.full(v.shape[1:], np.nan)
    sign = np.sign(m).reshape(-1, *([1] * (v.ndim - 1)))
    return (sign * v).mean(0) / scale


def share_warning(margins: np.ndarray, min_margin: float = 1e-4) -> str | None:
    """One line when a share of the mean margin `Σ v_i / Σ m_i` is ill-conditioned on these clean
    margins [n] (`|mean| < SMALL_MEAN_MARGIN × mean |margin|`, or every margin near zero), saying what to
    read instead; None when it is well-conditioned. The one check every command and the report run."""
    m = np.asarray(margins, dtype=np.float64)
    m = m[np.isfinite(m)]
    if not len(m):
        return None
    mean, scale = float(m.mean()), float(np.abs(m).mean())
    if scale < min_margin:
        return (f"warning: every pair's margin is near zero (mean |margin| {scale:.3g} < {min_margin:g}): no share "
                "of it is defined; audit pairs the model separates")
    if abs(mean) >= SMALL_MEAN_MARGIN * scale:
        return None
    return (f"warning: the pairs' margins disagree in sign ({int((m < 0).sum())} of {len(m)} pairs prefer the "
            f"rejected side): the mean margin {mean:+.3g} is {abs(mean) / scale:.0%} of the mean |margin| {scale:.3g}, "
            "so a share of the mean margin is ill-conditioned; read the share of each pair's own |margin|, or split "
            "the pairs by the sign of their margin")


def topk_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """Share of the `k` largest entries of `a` that are also among the `k` largest of `b`."""
    if k < 1:
        raise UsageError(f"k must be at least 1, got {k}")
    top_a, top_b = set(np.argsort(-a)[:k].tolist()), set(np.argsort(-b)[:k].tolist())
    return len(top_a & top_b) / k


def rank_agreement(exact: np.ndarray, approx: np.ndarray, k: int = 10) -> dict[str, float]:
    """How well `approx` [n, P] ranks parts like `exact` [n, P].

    `spearman_per_pair`: mean over rows of Spearman ρ across parts; `spearman_mean`: ρ between the
    column means; `topk_overlap`: share of the top-`k` parts by |mean value| that both put there
    (the overlap of the two means' orders, which a ρ of the means also measures; tables of top
    parts rank by mean |value|, `top_parts`);
    `max_abs_error`: largest |approx − exact|.
    """
    per_row = rowwise_spearman(exact, approx)
    a, b = exact.mean(0), approx.mean(0)
    k = min(k, len(a))
    return {
        "spearman_per_pair": float(np.nanmean(per_row)) if np.isfinite(per_row).any() else float("nan"),
        "spearman_mean": spearman(a, b),
        "topk_overlap": topk_overlap(np.abs(a), np.abs(b), k),
        "k": float(k),
        "max_abs_error": float(np.abs(exact - approx).max()),
    }


def fit_slope(alphas: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of `y` [n_alphas, ...] against `alphas` (intercept free)."""
    da = alphas - alphas.mean()
    return np.tensordot(da, y - y.mean(0), axes=(0, 0)) / (da @ da)


def linearity(alphas: np.ndarray, curve: np.ndarray) -> tuple[float, float]:
    """(R² of the linear fit of the mean curve, slope on α ≥ 0 / slope on α ≤ 0)."""
    fitted = curve.mean() + fit_slope(alphas, curve) * (alphas - alphas.mean())
    total = ((curve - curve.mean()) ** 2).sum()
    r2 = float(1 - ((curve - fitted) ** 2).sum() / total) if total > 0 else float("nan")
    pos, neg = alphas >= 0, alphas <= 0
    if pos.sum() < 2 or neg.sum() < 2:
        return r2, float("nan")
    low = fit_slope(alphas[neg], curve[neg])
    return r2, float(fit_slope(alphas[pos], curve[pos]) / low) if low != 0 else float("nan")


def auroc(score: np.ndarray, label: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counted half; NaN without both classes."""
    score, label = np.asarray(score, dtype=np.float64), np.asarray(label, dtype=bool)
    pos, neg = score[label], score[~label]
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = rankdata(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def paired_test(differences: np.ndarray) -> float:
    """Two-sided p-value that paired differences [n] are centred on zero: Wilcoxon signed-rank.

    Exact for small samples without ties (scipy's choice), normal approximation otherwise. Zero
    differences are dropped (Wilcoxon's convention); all-zero differences give p = 1 (nothing moved),
    and fewer than two finite values give NaN.
    """
    from scipy.stats import wilcoxon

    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return float("nan")
    if not np.any(d != 0):
        return 1.0
    return float(wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue)


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (q) for a family of tests [m]; NaN entries stay NaN and
    do not count towards the family size."""
    p = np.asarray(p, dtype=np.float64)
    q = np.full_like(p, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if not len(ok):
        return q
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    scaled = p[order] * m / np.arange(1, m + 1)
    q[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return q


def standardized(differences: np.ndarray) -> float:
    """Standardised paired effect (Cohen's d_z: mean / sd of the differences) [n] → float.

    Undefined (NaN), not infinite, when the differences have zero variance or fewer than two values.
    """
    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return float("nan")
    sd = d.std(ddof=1)
    return float(d.mean() / sd) if sd > 0 else float("nan")


def wilson(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion `successes / n` (NaN, NaN when n = 0).

    `p̂ = k/n`, `z` the two-sided normal quantile: centre `(p̂ + z²/2n) / (1 + z²/n)`, half-width
    `z √(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n)`. Unlike p̂ ± z·se it stays inside [0, 1] and is not empty
    at k = 0 or k = n, which per-subset accuracies on a few dozen pairs hit often. `successes` may be a
    sum of scores in [0, 1] (a best-of-N record tied at the top scores 1/k): such a score's variance is at
    most p̂(1−p̂), the binomial one the interval assumes.
    """
    if not 0 <= successes <= n:
        raise UsageError(f"successes must be in [0, n], got {successes} of {n}")
    if n == 0:
        return float("nan"), float("nan")
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def wilson_sum(successes: np.ndarray, n: np.ndarray, coef: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Interval of a weighted sum of proportions `θ = Σ_s c_s k_s/n_s` [S] by MOVER-Wilson (Zou & Donner 2008):
    `mover` over each proportion's Wilson interval (`wilson`).

    It always holds θ, and it cannot collapse to a point where a bootstrap within strata does (every
    stratum all right or all wrong): a Wilson interval has width at k = 0 and k = n. With one
    stratum it is that stratum's Wilson interval. Terms with c_s = 0 drop out; NaN when a weighted
    stratum has no units or a weight is NaN.
    """
    k, m, c = (np.asarray(x, dtype=np.float64) for x in (successes, n, coef))
    used = c != 0
    if not used.any() or np.isnan(c).any() or np.any(m[used] <= 0):
        return float("nan"), float("nan")
    k, m, c = k[used], m[used], c[used]
    bounds = np.array([wilson(float(a), int(b), level) for a, b in zip(k, m)])  # [S, 2]
    return mover(k / m, bounds, c)


def mover(points: np.ndarray, bounds: np.ndarray, coef: np.ndarray) -> tuple[float, float]:
    """MOVER interval of `θ = Σ_j c_j θ_j` from each part's estimate `points` [J] and interval `bounds` [J, 2]
    (Zou & Donner 2008): `L = θ − √Σ_j (c_j θ̂_j − min(c_j l_j, c_j u_j))²`, `U = θ + √Σ_j (max(c_j l_j, c_j u_j) −
    c_j θ̂_j)²`. Parts with c_j = 0 drop out; NaN when a used part's interval is NaN. `wilson_sum` is it over
    Wilson intervals; a score whose parts are not all proportions (RewardBench 2 with Ties) uses it directly."""
    c = np.asarray(coef, dtype=np.float64)
    used = c != 0
    p, b, c = np.asarray(points, dtype=np.float64)[used], np.asarray(bounds, dtype=np.float64)[used], c[used]
    if not used.any() or not np.isfinite(b).all():
        return float("nan"), float("nan")
    point, ends = c * p, c[:, None] * b
    theta = float(point.sum())
    return (theta - float(np.sqrt(np.sum((point - ends.min(1)) ** 2))),
            theta + float(np.sqrt(np.sum((ends.max(1) - point) ** 2))))


def json_number(x: float) -> float | None:
    """`x` as a JSON number, or None (JSON null) where it is NaN or infinite: JSON has no NaN, and
    strict parsers refuse the `NaN` and `Infinity` literals Python's `json` would write."""
    return float(x) if math.isfinite(x) else None


def json_ready(x: Any) -> Any:
    """`x` with numpy scalars and arrays made Python values and every non-finite float made None,
    through dicts (keys made str), lists and tuples; anything else is returned as it is."""
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [json_ready(v) for v in (x.tolist() if isinstance(x, np.ndarray) else x)]
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return json_number(float(x))
    return x


def to_json(x: Any, *, indent: int | None = 2, ensure_ascii: bool = True) -> str:
    """Strict JSON text of `x`: `json_ready`, then `allow_nan=False`, so no `NaN` or `Infinity`
    literal reaches a file or a pipe. The one writer of every `--json` output and JSON file."""
    return json.dumps(json_ready(x), indent=indent, ensure_ascii=ensure_ascii, allow_nan=False)


SUMMARY_COLUMNS = ("value", "low", "high", "n")
"""The columns every `summary()` frame leads with: the statistic, its interval's ends, how many pairs."""


def summary_frame(rows: Sequence[Mapping[str, Any]], name: str = "name") -> pd.DataFrame:
    """The one type of every result's `summary()`: a DataFrame with one row per headline statistic (or per
    item a result summarises), indexed by its name (the rows' `name` key), its columns `value` and, where the
    rows carry them, `low`, `high` (the interval) and `n` (how many pairs) first, then the rest in row order."""
    import pandas as pd

    frame = pd.DataFrame(list(rows), columns=None if len(rows) else [name, "value"]).set_index(name)
    frame.index.name = name
    lead = [c for c in SUMMARY_COLUMNS if c in frame.columns]
    if "value" not in lead:
        raise AssertionError(f"a summary has a 'value' column, got {list(frame.columns)}")  # a bug, not bad input
    return frame[[*lead, *(c for c in frame.columns if c not in lead)]]
