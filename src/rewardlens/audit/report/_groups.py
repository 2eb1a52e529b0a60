"""Per-subset numbers: does accuracy, crystallization depth, the top parts' effect or the seed
statistic differ by subset (`Pair.subset`, e.g. RewardBench's `chat`, `math-prm`)?

Accuracy carries a Wilson interval (`stats.wilson`: a proportion over a few dozen pairs), the seed
statistic a percentile bootstrap over the subset's pairs, depth its median and interquartile range.
Every number counts only the pairs whose reward and parts are finite (`counted`,
`rewardlens.model.internal.finite_pairs`); the others are named, never counted as losses. This module is the one
owner of that pair mask and of the numbers read under it: each pair's crystallization depth (`depths`)
and every per-part (or per-depth) mean over the counted pairs (`counted_mean`), so the report's figures, tables and
per-subset blocks show the same numbers.
Pairs without a subset, among pairs that have one, form their own group `NO_SUBSET`; when no pair
has a subset there are no groups (`labels` is None) and the report says so in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...data import margin
from ...data.internal import interleave
from ...model.internal import FinitePairs, finite_pairs, pair_accuracy
from ...stats import bootstrap_ci
from ...types import LensKind
from .._runner import Audit

NO_SUBSET = "(no subset)"
LEVEL = 0.95
"""Coverage of every per-subset interval."""
TOP_PARTS = 10
"""How many parts (largest mean |total effect| over all pairs) the report's tables of top parts follow."""
KINDS: tuple[LensKind, ...] = ("linear", "normed")


def labels(audit: Audit) -> list[str] | None:
    """Each pair's subset name (`NO_SUBSET` for a pair without one), or None when no pair has one."""
    subs = audit.subsets
    if len(subs) != len(audit.pair_ids) or all(s is None for s in subs):
        return None
    return [NO_SUBSET if s is None else str(s) for s in subs]


def groups(audit: Audit) -> dict[str, np.ndarray] | None:
    """{subset: boolean mask over pairs [n]}, subsets sorted by name (`NO_SUBSET` last); None without subsets."""
    names = labels(audit)
    if names is None:
        return None
    arr = np.array(names, dtype=object)
    order = sorted(set(names), key=lambda s: (s == NO_SUBSET, s))
    return {name: arr == name for name in order}


def parts(audit: Audit) -> tuple[np.ndarray, ...]:
    """What must be finite, besides both rewards, for a pair to be counted: its parts at both levels [2n, P]."""
    return audit.sublayers.values, audit.heads.values


def counted(audit: Audit) -> FinitePairs:
    """The pairs the audit's numbers count: finite rewards and parts. Raises `NonFiniteError` when none is."""
    return finite_pairs(audit.lens.reward, [str(i) for i in audit.pair_ids], parts=parts(audit))


def depths(audit: Audit) -> dict[LensKind, np.ndarray]:
    """Each pair's crystallization depth l/L [n] per lens kind (`Lens.crystallization` at the audit's fraction),
    NaN on the pairs `counted` leaves out: the depth every figure, table and per-subset block reads."""
    ok = counted(audit).finite
    return {kind: np.where(ok, audit.lens.crystallization(kind, audit.fraction), np.nan) for kind in KINDS}


def counted_mean(audit: Audit, values: np.ndarray) -> np.ndarray:
    """Column means [P] of per-pair values [n, P] (a part's effect or attribution, a lens margin per depth), or
    of per-sequence rows [2n, P] (both sides of each pair), over the counted pairs: the mean every figure and
    table shows (NaN for every column when no pair is counted)."""
    ok = counted(audit).finite
    kept = values[ok if len(values) == len(ok) else interleave(ok, ok)]
    return kept.mean(0) if len(kept) else np.full(values.shape[1], np.nan)


def accuracy(margins: np.ndarray, pairs: FinitePairs, level: float = LEVEL) -> dict[str, Any]:
    """Share of the finite pairs with chosen > rejected [n] (`pair_accuracy`), with its Wilson interval
    (NaN over no pairs): n (counted), total, correct, ties, accuracy, lo, hi, excluded, saturated, notes."""
    return pair_accuracy(margins, pairs, level).to_dict()


def spread(depth: np.ndarray) -> dict[str, Any]:
    """Median and interquartile range of the finite depths [n] (NaN when none is defined): the one median of a
    depth the summary, the figures and the per-subset blocks show (`np.median` of the finite depths)."""
    finite = np.asarray(depth, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return {"median": float("nan"), "q25": float("nan"), "q75": float("nan"), "defined": 0}
    q25, q75 = np.quantile(finite, [0.25, 0.75])
    return {"median": float(np.median(finite)), "q25": float(q25), "q75": float(q75), "defined": int(len(finite))}


def top_parts(audit: Audit, k: int = TOP_PARTS) -> list[int]:
    """Indices into `faithfulness.names` of the `k` parts with the largest mean |total effect| over the counted
    pairs (`Faithfulness.top`, the rule every table of top parts uses; `counted`)."""
    return audit.faithfulness.top(k, rows=counted(audit).finite)


def seed_statistic(audit: Audit, mask: np.ndarray) -> dict[str, Any]:
    """The seed paper's statistic over the pairs in `mask`: mean per-pair ρ with a bootstrap interval."""
    f = audit.faithfulness
    values = f.seed_rho[mask]
    finite = values[np.isfinite(values)]
    lo, hi = bootstrap_ci(finite, n_boot=f.n_boot, seed=f.seed, level=LEVEL)
    return {"rho": float(finite.mean()) if len(finite) else float("nan"), "lo": lo, "hi": hi,
            "pairs": int(len(finite))}


def subsets(audit: Audit) -> dict[str, Any] | None:
    """Every per-subset number the report, numbers.json and the CLI show; None when no pair has a subset."""
    masks = groups(audit)
    if masks is None:
        return None
    m = margin(np.asarray(audit.lens.reward, dtype=np.float64))
    depth = depths(audit)
    f = audit.faithfulness
    top = top_parts(audit)
    pairs = counted(audit)
    used = {s: mask & pairs.finite for s, mask in masks.items()}  # a non-finite pair enters no statistic
    return {
        "names": list(masks), "level": LEVEL,
        "accuracy": {s: accuracy(m[mask], pairs.take(mask)) for s, mask in masks.items()},
        "crystallization": {s: {kind: spread(depth[kind][mask]) for kind in KINDS} for s, mask in used.items()},
        "top_parts": {"parts": [f.names[i] for i in top],
                      "mean_total_effect": {s: _mean_rows(f.total[mask][:, top]) for s, mask in used.items()}},
        "seed_statistic": {s: seed_statistic(audit, mask) for s, mask in used.items()},
    }


def _mean_rows(values: np.ndarray) -> list[float]:
    """Column means of `values` [k, P]; NaN for every column when no pair is left (k = 0)."""
    return [float(v) for v in values.mean(0)] if len(values) else [float("nan")] * values.shape[1]


def subsets_frame(audit: Audit) -> Any:
    """One row per subset: pairs, accuracy with its Wilson interval, median and IQR of both depths,
    the seed statistic with its interval (None without subsets)."""
    import pandas as pd

    got = subsets(audit)
    if got is None:
        return None
    rows = []
    for s in got["names"]:
        acc, seed = got["accuracy"][s], got["seed_statistic"][s]
        row: dict[str, Any] = {"subset": s, "pairs": acc["n"], "correct": acc["correct"], "accuracy": acc["accuracy"],
                               "accuracy_lo": acc["lo"], "accuracy_hi": acc["hi"]}
        for kind in KINDS:
            c = got["crystallization"][s][kind]
            row.update({f"crystallization_{kind}_median": c["median"], f"crystallization_{kind}_q25": c["q25"],
                        f"crystallization_{kind}_q75": c["q75"]})
        row.update({"seed_rho": seed["rho"], "seed_lo": seed["lo"], "seed_hi": seed["hi"]})
        rows.append(row)
    return pd.DataFrame(rows)
