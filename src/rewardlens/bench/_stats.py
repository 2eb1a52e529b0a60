"""Every benchmark score from per-item correctness, its bootstrap over items, and the paired test.

Scores, keyed `(level, name)`: each subset's accuracy (`"subset"`), each RewardBench section and
the prior sets (`"section"`: weighted as `_sections` says), and (`"score"`) the overall RewardBench
score (sections at weight 2, prior sets at 1), the RewardBench 2 score (mean of its pass/fail
subsets present; Ties joins it in `_bench`, by its own rule) and the accuracy over all items.
Every one of them is linear in the items' correctness: `score = Σ_i c_i x_i`.

One model's intervals (`intervals`): Wilson for a subset's accuracy and for the accuracy over all
items (proportions); every other score is a weighted sum of subset accuracies, `Σ_s c_s a_s`, and
gets the MOVER-Wilson interval of that sum (`stats.wilson_sum`: the subsets' Wilson intervals
recovered with the same weights `c_s`). A bootstrap within subsets would collapse to a point
whenever every subset is all right or all wrong (`Chat 0.375 [0.375, 0.375]` on 8 items); a
Wilson interval has width at 0 and at n right, so these cannot.

A comparison of two models resamples items **within each subset** (the benchmark's subsets are
fixed strata, so every draw keeps the counts and with them the weights), `B` times, seeded, with
the same draws for both (paired); its interval is the percentile interval of the difference
a − b. The bootstrap cannot see variation its few items do not show: two items that
both favour one model give the interval [d, d] at any level. So the p-value comes from the paired
randomization (sign-flip) test instead: under "the two models are exchangeable" each item's
difference `d_i = a_i − b_i` is as likely to have the other sign, and `p = P(|Σ c_i ε_i d_i| ≥
|Σ c_i d_i|)` over independent signs ε_i = ±1. It is exact (all 2^k sign patterns of the k items
the score weighs that differ) for k ≤ `EXACT`, Monte Carlo with `B` seeded draws beyond. Two identical models give
p = 1; on one subset it is McNemar's exact test. Fewer than two items behind a score give a NaN
interval and p-value.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..stats import min_boot, wilson, wilson_sum
from ._items import NO_SUBSET, SubsetLayout
from ._sections import GROUPS, OVERALL, RB2, RB2_SUBSETS, overall, rb2_score, section_scores

Key = tuple[str, str]
ALL_ITEMS = "all items"


EXACT = 12
"""Up to this many differing items the sign-flip test enumerates every sign pattern (4096)."""


def scores(correct: np.ndarray, lay: SubsetLayout, picks: list[np.ndarray] | None = None) -> dict[Key, np.ndarray]:
    """Every score from per-item correctness `correct` [m]: floats, or with `picks` (per subset,
    resampled positions [B, n_s]) bootstrap draws [B]. Undefined scores (no subset of a kind) are NaN."""
    c = np.asarray(correct, dtype=np.float64)
    acc: dict[str | None, np.ndarray] = {}
    for k, (subset, ix) in enumerate(zip(lay.subsets, lay.index)):
        acc[subset] = c[ix].mean() if picks is None else c[ix][picks[k]].mean(1)
    return combine(acc, lay)


def coefficients(lay: SubsetLayout, keys: list[Key]) -> np.ndarray:
    """Each score's weight on each item [len(keys), m]: `score = coefficients @ correct`.

    Read off the same code that computes the scores, fed each subset's accuracy as the vector
    `1/n_s` on its items (every score is linear in the subset accuracies)."""
    m = sum(len(ix) for ix in lay.index)
    acc: dict[str | None, np.ndarray] = {}
    for subset, ix in zip(lay.subsets, lay.index):
        acc[subset] = np.zeros(m)
        acc[subset][ix] = 1 / len(ix)
    out = combine(acc, lay)
    return np.stack([np.broadcast_to(out[k], (m,)) for k in keys])


def combine(acc: dict[str | None, np.ndarray], lay: SubsetLayout) -> dict[Key, np.ndarray]:
    """Every score from the subsets' accuracies (floats, draws [B], or coefficient vectors [m])."""
    out: dict[Key, np.ndarray] = {subset_key(s): a for s, a in acc.items()}
    plain = {s: a for (s, a), g in zip(acc.items(), lay.grouped) if s is not None and not g}
    sections = section_scores(plain, lay.weights)
    out |= {("section", name): v for name, v in sections.items()}
    out[("score", OVERALL)] = np.asarray(overall(sections))
    out[("score", RB2)] = np.asarray(rb2_score({s: a for (s, a), g in zip(acc.items(), lay.grouped)
                                                if s is not None and g}))
    counts = [len(ix) for ix in lay.index]
    total = sum(counts)  # 0 when every item is a Ties record (scored apart)
    out[("score", ALL_ITEMS)] = np.asarray(sum(n * a for n, a in zip(counts, acc.values())) / total if total
                                           else np.nan)
    return out


def intervals(correct: np.ndarray, lay: SubsetLayout, keys: list[Key], level: float) -> dict[Key, tuple[float, float]]:
    """Each score's interval at `level` from per-item correctness [m] (module docstring): Wilson for
    subsets and all items, MOVER-Wilson over the subsets' Wilson intervals for the weighted scores."""
    c = np.asarray(correct, dtype=np.float64)  # an item's score in [0, 1]: a tied best-of-N record counts 1/k
    wins = np.array([float(c[ix].sum()) for ix in lay.index])
    n = np.array([len(ix) for ix in lay.index])
    coef = coefficients(lay, keys)  # [K, m]: a subset's weight is spread evenly over its items
    per_subset = np.stack([coef[:, ix].sum(1) for ix in lay.index], axis=1) if lay.index else coef[:, :0]
    own = {subset_key(s): (float(w), int(k)) for s, w, k in zip(lay.subsets, wins, n)}
    own[("score", ALL_ITEMS)] = (float(wins.sum()), int(n.sum()))
    return {k: wilson(*own[k], level) if k in own else wilson_sum(wins, n, row, level)
            for k, row in zip(keys, per_subset)}


def support(lay: SubsetLayout, keys: list[Key]) -> np.ndarray:
    """Number of items behind each score [len(keys)] (the units its bootstrap resamples)."""
    n = {subset_key(s): len(ix) for s, ix in zip(lay.subsets, lay.index)}
    weighted = [(s, len(ix)) for s, ix, g in zip(lay.subsets, lay.index, lay.grouped) if s in lay.weights and not g]
    for section, members in GROUPS.items():
        n[("section", section)] = sum(k for s, k in weighted if s in members)
    n[("score", OVERALL)] = sum(k for _, k in weighted)
    n[("score", RB2)] = sum(len(ix) for s, ix, g in zip(lay.subsets, lay.index, lay.grouped) if g and s in RB2_SUBSETS)
    n[("score", ALL_ITEMS)] = sum(len(ix) for ix in lay.index)
    return np.array([n[k] for k in keys])


def check_n_boot(n_boot: int, level: float) -> None:
    """Refuse `n_boot` below `min_boot(level)` (a `ValueError`, one line with the fix)."""
    if n_boot < min_boot(level):
        raise UsageError(f"n_boot is {n_boot}, under {min_boot(level)}: a {level:.0%} percentile interval needs "
                         f"at least 2 / (1 - level) = {min_boot(level)} bootstrap draws to hold one in each tail. "
                         f"Fix: pass n_boot >= {min_boot(level)} (the default 2000 is what a reported interval wants).",
                         option="n_boot")


def picks(lay: SubsetLayout, n_boot: int, seed: int) -> list[np.ndarray]:
    """Resampled positions within each subset [B, n_s], one array per subset, seeded."""
    if n_boot < 1:
        raise UsageError(f"n_boot must be at least 1, got {n_boot}", option="n_boot")
    rng = np.random.default_rng(seed)
    return [rng.integers(0, len(ix), (n_boot, len(ix))) for ix in lay.index]


def sign_flip(difference: np.ndarray, coef: np.ndarray, n: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Two-sided p-value of each score's paired difference [K] (module docstring).

    `difference` [m] per item a − b (in [−1, 1]: an item scores 1/k when tied at the top); `coef` [K, m] from
    `coefficients`; `n` [K] items behind each score (NaN below two). Only the items a score weighs and where the
    models differ are flipped: all their sign patterns up to `EXACT` of them, else `n_boot` seeded draws."""
    d = np.asarray(difference, dtype=np.float64)
    rng = np.random.default_rng([seed, 1])
    out = np.full(len(coef), np.nan)
    for r, row in enumerate(coef):
        terms = (row * d)[(d != 0) & (row != 0)]  # [k]
        k = len(terms)
        if k <= EXACT:
            signs = 1.0 - 2.0 * ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1)
        else:
            signs = rng.choice([-1.0, 1.0], size=(n_boot, k))
        hits = int(np.sum(np.abs(signs @ terms) >= abs(terms.sum()) - 1e-12))
        p = hits / len(signs) if k <= EXACT else (hits + 1) / (len(signs) + 1)
        out[r] = min(p, 1.0) if n[r] >= 2 else np.nan
    return out


def subset_key(subset: str | None) -> Key:
    """The score key of a subset's accuracy."""
    return "subset", NO_SUBSET if subset is None else subset


def rb2_share(lay: SubsetLayout) -> float:
    """The weight of the RewardBench 2 score's pass/fail subsets when Ties joins them: k / (k + 1)
    for the k such subsets present (the score is the unweighted mean of its subsets, Ties included)."""
    k = sum(1 for s, g in zip(lay.subsets, lay.grouped) if g and s in RB2_SUBSETS)
    return k / (k + 1)
