"""The probes' reward scale: what a typical preference is worth, against which an effect is flagged."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..data import Pair, margin
from ..model import RewardModel


def reward_scale(model: RewardModel, reference: Sequence[Pair] | np.ndarray | float | None,
                 base_reward: np.ndarray, batch_size: int) -> tuple[float, str]:
    """The reward scale for flagging and where it came from: the mean |margin| of `reference` (pairs,
    scored here in batches of `batch_size`, or their margins [n]), that scale as a number, or with no
    reference the standard deviation of the base items' rewards `base_reward` [n_items]."""
    if reference is None:
        return float(np.std(base_reward, ddof=1)) if len(base_reward) > 1 else 0.0, "sd of base-item rewards"
    if isinstance(reference, np.ndarray):
        if not reference.size:
            raise ValueError("reference margins must be a non-empty array; pass the pairs, or None for the base "
                             "items' spread")
        return _mean_margin(reference.astype(np.float64).ravel(), "reference margins")
    if isinstance(reference, (int, float)):
        if reference <= 0:
            raise ValueError(f"reference scale must be positive, got {reference}")
        return float(reference), "given"
    pairs = list(reference)
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        raise ValueError("reference must be a number or a non-empty list of rewardlens.Pair")
    return _mean_margin(margin(model.score(pairs, batch_size=batch_size)), "reference pairs")


def _mean_margin(margins: np.ndarray, what: str) -> tuple[float, str]:
    """The scale of reference pairs with these margins [n], and its source; `ValueError` naming the pairs
    whose margin is not finite (a NaN scale would flag nothing, silently)."""
    bad = np.flatnonzero(~np.isfinite(margins))
    if len(bad):
        raise ValueError(f"the {what} give {len(bad)} margin(s) that are not finite (pairs {bad[:8].tolist()}"
                         f"{' ...' if len(bad) > 8 else ''}): the probes' reward scale would be NaN; drop or fix "
                         "those pairs, or pass the scale as a number")
    return float(np.mean(np.abs(margins))), f"mean |margin| on {len(margins)} reference pairs"


__all__ = ["reward_scale"]
