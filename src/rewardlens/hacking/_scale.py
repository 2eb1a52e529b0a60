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
        margins = reference.astype(np.float64).ravel()
        if not len(margins) or not np.isfinite(margins).all():
            raise ValueError(f"reference margins must be a non-empty array of finite numbers, got {len(margins)} "
                             f"with {int((~np.isfinite(margins)).sum())} not finite; pass the pairs instead")
        return _mean_margin(margins)
    if isinstance(reference, (int, float)):
        if reference <= 0:
            raise ValueError(f"reference scale must be positive, got {reference}")
        return float(reference), "given"
    pairs = list(reference)
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        raise ValueError("reference must be a number or a non-empty list of rewardlens.Pair")
    return _mean_margin(margin(model.score(pairs, batch_size=batch_size)))


def _mean_margin(margins: np.ndarray) -> tuple[float, str]:
    """The scale of reference pairs with these margins [n], and its source."""
    return float(np.mean(np.abs(margins))), f"mean |margin| on {len(margins)} reference pairs"


__all__ = ["reward_scale"]
