"""The policy monitor's arithmetic: a reward split along bias directions, the share of a reward gain
each direction explains, rank correlations with reward, all with bootstrap intervals.

The split is exact (docs/design.md §1). The head reads `ĥ` (the final norm's output) at `t*`, and
for one input `r = u · ĥ + c`, with `u` the effective read-out (`Reading.readout`: the head row,
or `Σ_k coef_k row_k` for multi-objective and gated heads; BERT's pooler with its gain frozen) and
`c = r − u · ĥ` the constant no direction owns (the head's bias). The bias directions `v_1..v_m`
(unit vectors in the same space, rows of `V`) are orthonormalised symmetrically (Löwdin):
`Q = (V Vᵀ)^{-1/2} V`, the orthonormal set closest to the given directions in the least-squares
sense and the same whatever their order, so no direction gains from coming first (Gram–Schmidt
would give the first one everything it shares with later ones). With `q_j` the rows of `Q` and
`ĥ_⊥ = ĥ − Σ_j (q_j · ĥ) q_j`, exactly:

    r = Σ_j (u · q_j)(q_j · ĥ)  +  u · ĥ_⊥  +  c
         `along[:, j]`             `rest`    `constant`

`along[:, j]` is the reward the head reads off ĥ's component along the j-th direction. A reward
gain between two sets of samples splits the same way, term by term. Directions that are (nearly)
linearly dependent are refused: their symmetric orthonormalisation is not defined.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import rankdata
from torch import Tensor

from ..errors import UsageError
from ..stats import spearman


def orthonormal(v: Tensor) -> Tensor:
    """Löwdin's symmetric orthonormalisation `(V Vᵀ)^{-1/2} V` of the rows of `v` [m, d] (float64)."""
    evals, evecs = torch.linalg.eigh(v @ v.T)
    if evals.min() < 1e-8 * evals.max():
        raise UsageError(f"the bias directions are (nearly) linearly dependent (Gram matrix eigenvalues down to "
                         f"{float(evals.min()):.2e}); drop a direction that the others already span")
    return evecs @ torch.diag(evals.rsqrt()) @ evecs.T @ v


def split_reward(hidden: Tensor, readout: Tensor, reward: Tensor,
                 directions: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`along` [n, m], `rest` [n], `constant` [n]) of rewards [n] whose head input is `hidden` [n, d]
    and effective read-out `readout` [n, d], along `directions` [m, d] (module docstring), in float64.
    `along.sum(1) + rest + constant` equals `reward` to float precision."""
    h, u, v = (t.detach().to("cpu", torch.float64) for t in (hidden, readout, directions))
    q = orthonormal(v)
    along = (h @ q.T) * (u @ q.T)
    rest = (u * (h - (h @ q.T) @ q)).sum(-1)
    constant = reward.detach().to("cpu", torch.float64) - (u * h).sum(-1)
    return along.numpy(), rest.numpy(), constant.numpy()


@dataclass(frozen=True)
class Gain:
    """A reward gain `total` (mean reward of the current samples − mean of the baseline samples,
    reward units) and its interval `total_ci`; `share` [K] each term's part of it (terms sum to 1),
    `share_ci` [K, 2] their intervals. 95% percentile bootstrap resampling baseline and current
    samples independently, numerator and denominator of each share from the same resample."""

    total: float
    total_ci: tuple[float, float]
    share: np.ndarray
    share_ci: np.ndarray


def gain_shares(baseline: np.ndarray, current: np.ndarray, *, n_boot: int = 1000, seed: int = 0) -> Gain:
    """Shares of the gain of `current` [n_c, K] over `baseline` [n_b, K]: each row is one sample's
    reward split into K exact terms (they sum to its reward)."""
    k = baseline.shape[1]
    diff = current.mean(0) - baseline.mean(0)
    total = float(diff.sum())
    nan = np.full((k, 2), np.nan)
    if len(baseline) < 2 or len(current) < 2:
        return Gain(total, (np.nan, np.nan), diff / total if total else np.full(k, np.nan), nan)
    rng = np.random.default_rng(seed)
    draws = (resample_means(current, rng.integers(0, len(current), (n_boot, len(current))))
             - resample_means(baseline, rng.integers(0, len(baseline), (n_boot, len(baseline)))))  # [B, K]
    totals = draws.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = draws / totals[:, None]
        share = diff / total if total else np.full(k, np.nan)
    ci = np.quantile(shares, [0.025, 0.975], axis=0).T if np.all(totals != 0) else nan
    lo, hi = np.quantile(totals, [0.025, 0.975])
    return Gain(total, (float(lo), float(hi)), share, ci)


def rank_correlation(x: np.ndarray, y: np.ndarray, *, n_boot: int = 500, seed: int = 0) -> tuple[float, float, float]:
    """Spearman ρ of `x` and `y` [n] and its 95% percentile bootstrap interval over samples
    (NaN when undefined: a constant vector or fewer than 3 samples)."""
    return rank_correlations(np.asarray(x)[:, None], y, n_boot=n_boot, seed=seed)[0]


def rank_correlations(xs: np.ndarray, y: np.ndarray, *, n_boot: int = 500,
                      seed: int = 0) -> list[tuple[float, float, float]]:
    """`rank_correlation` of each column of `xs` [n, S] with `y` [n]: every column is resampled with the same
    draws it would take alone (the same `seed`), so `y`'s resampled ranks are computed once for all of them."""
    out: list[tuple[float, float, float]] = []
    idx: np.ndarray | None = None
    ry: np.ndarray | None = None
    for x in np.asarray(xs).T:
        rho = spearman(x, y)
        if not np.isfinite(rho):
            out.append((rho, np.nan, np.nan))
            continue
        if idx is None or ry is None:
            idx = np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))
            ry = resample_ranks(y, idx)
            ry = ry - ry.mean(1, keepdims=True)
        rx = resample_ranks(x, idx)
        rx = rx - rx.mean(1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = (rx * ry).sum(1) / np.sqrt((rx * rx).sum(1) * (ry * ry).sum(1))
        draws = draws[np.isfinite(draws)]  # a resample that drew one value only has no rank order
        if len(draws) < n_boot // 2:
            out.append((rho, np.nan, np.nan))
            continue
        lo, hi = np.quantile(draws, [0.025, 0.975])
        out.append((rho, float(lo), float(hi)))
    return out


def resample_ranks(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`rankdata(x[idx], axis=1)` (average ranks, 1-based, within each resample row of `idx` [B, n]) without
    sorting each row: with `x`'s distinct values in order and `c_bu` the copies of the u-th one in row b, an
    element equal to it ranks `Σ_{v<u} c_bv + (c_bu + 1) / 2`. O(B·n) counting against O(B·n log n) sorts: the
    reward server's monitor bootstraps every statistic over its whole window at each step (it took most of the
    server's CPU). A non-finite `x` takes scipy's path (its NaN policy)."""
    if not np.all(np.isfinite(x)):
        return rankdata(x[idx], axis=1)
    _, code = np.unique(x, return_inverse=True)
    u = int(code.max()) + 1
    c = code.reshape(-1)[idx]  # [B, n]: the rank of each drawn value among x's distinct values
    counts = np.bincount((c + u * np.arange(len(idx))[:, None]).ravel(), minlength=len(idx) * u).reshape(-1, u)
    ranks = np.cumsum(counts, axis=1) - counts + (counts + 1) / 2.0
    return np.take_along_axis(ranks, c, axis=1)


def resample_means(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`x[idx].mean(1)` for resample rows `idx` [B, n] of `x` [n, K], as `counts @ x / n` with `counts` [B, n]
    the copies of each sample a row drew: no [B, n, K] gather (the reward server's monitor computes this over its
    whole window at every step)."""
    b, n = idx.shape
    counts = np.bincount((idx + len(x) * np.arange(b)[:, None]).ravel(), minlength=b * len(x))
    return counts.reshape(b, len(x)).astype(np.float64) @ x / n
