"""Finiteness of results: which pairs have finite numbers, and the pair accuracy over those alone.

One NaN or inf in a weight, or a forward that overflows in the backbone's dtype, gives NaN (or a
saturated, constant) reward. Counted as it comes, a NaN margin is a loss (`NaN > 0` is False) and
a table prints `nan` with exit code 0. Every instrument table that counts pairs goes through
here instead: a pair whose reward (either side) or any part is non-finite is named and left out
of the counts, with the count said beside them; when no pair is left, `NonFiniteError` says why.
Every margin exactly 0 on more than one pair (rewards finite) is named too: the model saturates,
or both sides encode alike. See docs/scoring.md, "Finite numbers".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data import chosen, margin, rejected
from ..errors import NonFiniteError, UsageError, warn
from ..stats import wilson

SATURATED = "every margin is exactly 0: the model saturates or both sides encode alike"
"""The note (and warning) when every counted pair has a margin of exactly 0.0."""
SHOWN = 10
"""How many excluded pair ids a note lists before it says how many more."""


@dataclass(frozen=True)
class FinitePairs:
    """Which of `n` pairs have finite numbers: `ids` [n] their ids, `finite` [n] bool (both sides'
    rewards and every part finite)."""

    ids: tuple[str, ...]
    finite: np.ndarray

    @property
    def excluded(self) -> tuple[str, ...]:
        """Ids of the pairs left out, in pair order."""
        return tuple(i for i, ok in zip(self.ids, self.finite.tolist()) if not ok)

    def take(self, mask: np.ndarray) -> FinitePairs:
        """The pairs in the boolean `mask` [n] (e.g. one subset)."""
        keep = np.flatnonzero(mask)
        return FinitePairs(tuple(self.ids[i] for i in keep), self.finite[keep])


def excluded_note(ids: Sequence[str]) -> str | None:
    """'2 pairs with non-finite rewards excluded: p3, p5' for the excluded pair `ids` (None when empty)."""
    if not ids:
        return None
    shown = ", ".join(ids[:SHOWN]) + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")
    return f"{len(ids)} pair{'s' * (len(ids) != 1)} with non-finite rewards excluded: {shown}"


def finite_pairs(reward: np.ndarray, ids: Sequence[str], *, parts: Sequence[np.ndarray] = (),
                 dtype: str | None = None) -> FinitePairs:
    """Which pairs have a finite reward on both sides [2n] (rows alternate chosen, rejected) and finite
    `parts` (arrays [2n, ...] per input, e.g. `Attribution.values`).

    Raises `NonFiniteError` when pairs were given and none is finite: the message says what the
    rewards hold (NaN, inf), the likely cause, and the fix for `dtype` (the backbone's, e.g.
    'bfloat16', from `dtype_name`; None when unknown)."""
    rows = np.isfinite(np.asarray(reward, dtype=np.float64))
    for p in parts:
        values = np.asarray(p, dtype=np.float64)
        rows &= np.isfinite(values.reshape(len(values), -1)).all(1)
    ok = np.asarray(chosen(rows) & rejected(rows), dtype=bool)
    if len(ids) != len(ok):
        raise UsageError(f"finite_pairs got {len(ids)} pair ids for {len(ok)} pairs of rewards; pass one id per pair")
    if len(ok) and not ok.any():
        raise NonFiniteError(_nothing_finite(np.asarray(reward, dtype=np.float64), dtype), option="dtype")
    return FinitePairs(tuple(str(i) for i in ids), ok)


def _nothing_finite(reward: np.ndarray, dtype: str | None) -> str:
    bad = reward[~np.isfinite(reward)]
    what = ("every reward is NaN" if np.isnan(reward).all() else
            "every reward is infinite" if np.isinf(reward).all() else
            "every pair has a NaN or infinite reward" if len(bad) else "every pair has a NaN or infinite part")
    where = f"in {dtype}" if dtype else "in the backbone's dtype"
    fix = ("check the weights (torch.isfinite over model.model.parameters())" if dtype in ("float32", "float64")
           else "check the weights, or load the model in float32 (dtype='float32')")
    return f"{what}: a weight of the model is non-finite or overflows {where}; {fix}"


def dtype_name(model: Any) -> str | None:
    """The backbone's dtype name ('bfloat16') of a `RewardModel`; None for an object without one
    (a stand-in model that only scores)."""
    try:
        return str(next(model.model.parameters()).dtype).removeprefix("torch.")
    except (AttributeError, StopIteration, TypeError):
        return None


def saturated(margins: np.ndarray, *, say: bool = True) -> bool:
    """Whether every margin [k] of the counted pairs is exactly 0.0 on more than one pair; with `say`, warns
    (`RewardLensWarning`, `SATURATED`) when it is. One pair at 0 is a tie, not a pattern."""
    m = np.asarray(margins, dtype=np.float64)
    if len(m) > 1 and np.all(m == 0):
        if not say:
            return True
        warn(f"{SATURATED}: all {len(m)} counted pairs have chosen reward == rejected reward. Check that the "
             "rewards vary at all (model.score), and the weights; a half-precision model may overflow: load it in "
             "float32 (dtype='float32')")
        return True
    return False


@dataclass(frozen=True)
class PairAccuracy:
    """The share of counted pairs with chosen > rejected (a margin of exactly 0 is a loss), with its
    Wilson interval `ci` at `level`. `n` pairs counted of `total`; `excluded` the ids of pairs with
    non-finite numbers (never counted as losses); `ties` counted pairs with margin 0; `saturated`
    every counted margin is exactly 0 on more than one pair."""

    total: int
    n: int
    correct: int
    ties: int
    accuracy: float
    ci: tuple[float, float]
    excluded: tuple[str, ...]
    saturated: bool
    level: float

    @property
    def over(self) -> str:
        """'over 4 of 6 pairs', or 'over 6 pairs' when none is left out."""
        plural = "s" * (self.total != 1)
        return f"over {self.total} pair{plural}" if self.n == self.total else f"over {self.n} of {self.total} pairs"

    @property
    def notes(self) -> tuple[str, ...]:
        """What the count leaves out or cannot tell: the excluded pairs, a saturated model."""
        return tuple(x for x in (excluded_note(self.excluded), SATURATED if self.saturated else None) if x)

    def line(self, *, interval: bool = False) -> str:
        """'pair accuracy: 0.750 over 4 of 6 pairs; 2 pairs with non-finite rewards excluded: p3, p5'
        (with `interval`, the Wilson interval after the count)."""
        text = f"pair accuracy: {self.accuracy:.3f} {self.over}"
        if interval:
            text += f" ({self.level:.0%} Wilson interval [{self.ci[0]:.2f}, {self.ci[1]:.2f}])"
        return "; ".join([text, *self.notes])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: n (counted), total, correct, ties, accuracy, lo, hi, excluded, saturated, notes."""
        return {"n": self.n, "total": self.total, "correct": self.correct, "ties": self.ties,
                "accuracy": self.accuracy, "lo": self.ci[0], "hi": self.ci[1], "excluded": list(self.excluded),
                "saturated": self.saturated, "notes": list(self.notes)}


def pair_accuracy(margins: np.ndarray, pairs: FinitePairs, level: float = 0.95, *,
                  check: bool = False) -> PairAccuracy:
    """Pair accuracy over the finite pairs of `pairs` from the chosen − rejected `margins` [n].

    Neither raises nor warns: a subset whose pairs are all non-finite gets NaN over 0 pairs. With
    `check` (the whole run's accuracy, once) a saturated run warns (`saturated`)."""
    m = np.asarray(margins, dtype=np.float64)[pairs.finite]
    n, correct = len(m), int(np.sum(m > 0))
    flat = saturated(m, say=check)
    return PairAccuracy(total=len(pairs.ids), n=n, correct=correct, ties=int(np.sum(m == 0)),
                        accuracy=correct / n if n else float("nan"), ci=wilson(correct, n, level),
                        excluded=pairs.excluded, saturated=flat, level=level)


def finite_accuracy(margins: np.ndarray) -> float:
    """Share of the finite margins [n] that are positive: a NaN or infinite margin (a non-finite reward) is
    left out, never a loss; NaN when no margin is finite. For instruments that keep no pair ids (compare,
    the monitors, an edit's report); a table that names pairs uses `pair_accuracy`."""
    m = np.asarray(margins, dtype=np.float64)
    m = m[np.isfinite(m)]
    return float(np.mean(m > 0)) if len(m) else float("nan")


def score_pairs(reward: np.ndarray, ids: Sequence[str], *, parts: Sequence[np.ndarray] = (),
                dtype: str | None = None, level: float = 0.95) -> tuple[FinitePairs, PairAccuracy]:
    """The whole run's finite pairs and pair accuracy from rewards [2n]: raises `NonFiniteError` when
    no pair is finite, warns when every counted margin is exactly 0 (`finite_pairs`, `pair_accuracy`)."""
    pairs = finite_pairs(reward, ids, parts=parts, dtype=dtype)
    return pairs, pair_accuracy(margin(np.asarray(reward, dtype=np.float64)), pairs, level, check=True)
