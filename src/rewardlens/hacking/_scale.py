"""The probes' reward scale: what a typical preference is worth, against which an effect is flagged.

One rule everywhere (`rewardlens.probe`, `rewardlens probe`, the audit, calibrate, compare, monitor): the
scale is the standard deviation (ddof 1) of the rewards of the probe's base items, the whole item set a run
may use (all stages'), so it depends on the model and the items alone, is fixed before any axis is scored,
and is the same whichever stage a staged run stops at. The mean |margin| of reference pairs (a few audited
pairs, say) is the named alternative (`probe(scale="reference")`): given pairs, the flags are computed under
it too, and an axis whose flag differs between the two scales is *fragile* (`fragility`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..data import Pair, margin
from ..errors import UsageError
from ..model import RewardModel

SCALES = ("items", "reference")
"""The flag floor's scales, by name (`probe(scale=)`): the base items' sd (the rule), reference pairs' mean |margin|."""


def reward_scale(model: RewardModel, reference: Sequence[Pair] | np.ndarray | float | None,
                 base_reward: np.ndarray, batch_size: int) -> tuple[float, str]:
    """The reward scale for flagging and where it came from: the mean |margin| of `reference` (pairs,
    scored here in batches of `batch_size`, or their margins [n]), that scale as a number, or with no
    reference the standard deviation of the base items' rewards `base_reward` [n_items]."""
    if reference is None:
        return items_scale(base_reward)
    if isinstance(reference, np.ndarray):
        if not reference.size:
            raise UsageError("reference margins must be a non-empty array; pass the pairs, or None for the base "
                             "items' spread")
        return _mean_margin(reference.astype(np.float64).ravel(), "reference margins")
    if isinstance(reference, (int, float)):
        if reference <= 0:
            raise UsageError(f"reference scale must be positive, got {reference}")
        return float(reference), "given"
    pairs = list(reference)
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        raise UsageError("reference must be a number or a non-empty list of rewardlens.Pair")
    return _mean_margin(margin(model.score(pairs, batch_size=batch_size)), "reference pairs")


def items_scale(base_reward: np.ndarray) -> tuple[float, str]:
    """The scale of base items with these rewards [n_items]: their standard deviation (ddof 1; 0 for fewer
    than two items, which flags nothing), and its source."""
    n = len(base_reward)
    return (float(np.std(base_reward, ddof=1)) if n > 1 else 0.0), f"sd of the rewards of {n} base items"


def choose(scale: str | float, items: tuple[float, str],
           reference: tuple[float, str] | None) -> tuple[tuple[float, str], tuple[float, str] | None]:
    """(the flag floor's scale, the alternative it is checked against or None) for `probe(scale=)`: "items"
    the items' sd (`items`), checked against `reference` when given; "reference" the reference pairs' mean
    |margin|, checked against the items' sd; a number that scale, checked against `reference` when given."""
    if scale == "items":
        return items, reference
    if scale == "reference":
        assert reference is not None  # `probe` refuses scale="reference" without reference pairs
        return reference, items
    return (float(scale), "given"), reference


def check_choice(scale: object, reference: object) -> None:
    """`ValueError` unless `scale` is "items", "reference" (with `reference` given) or a positive number."""
    if scale == "reference" and reference is None:
        raise UsageError("scale='reference' takes the flag floor from reference pairs' mean |margin|, and no "
                         "reference= was given; pass reference=pairs, or scale='items' (the default)")
    if isinstance(scale, str):
        if scale not in SCALES:
            raise UsageError(f"scale must be one of {list(SCALES)} or a positive number, got {scale!r}")
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise UsageError(f"scale must be one of {list(SCALES)} or a positive number, got {scale!r}")


def fragility(mean: np.ndarray, q: np.ndarray, rule: tuple[float, float], scale: tuple[float, str],
              alt: tuple[float, str] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Per axis (arrays [n_axes]): whether its flag differs under the alternative scale `alt`, and why
    ('' where it does not, or there is no alternative). `rule` is (min_effect, level); an axis is flagged
    under a scale s when q < level and |mean| >= min_effect × s."""
    min_effect, level = rule
    if alt is None:
        return np.zeros(len(mean), dtype=bool), ("",) * len(mean)
    under = [(q < level) & (np.abs(mean) >= min_effect * s) for s, _ in (scale, alt)]
    fragile = under[0] != under[1]
    words = [f"{s:.3g} ({source})" for s, source in (scale, alt)]
    reasons = tuple((f"flagged under the scale {words[0]} but not under {words[1]}" if f else
                     f"not flagged under the scale {words[0]} but flagged under {words[1]}") if frag else ""
                    for f, frag in zip(under[0], fragile))
    return fragile, reasons


def flag_summary(axes: Sequence[str], flagged: np.ndarray, reasons: Sequence[str], scale: tuple[float, str],
                 alt: tuple[float, str] | None, min_effect: float, level: float) -> str:
    """The flags in words (`Probes.summary`): the findings (flagged and not fragile), each fragile axis with
    why, and the floor with its scale (and the alternative it was checked against)."""
    robust = [a for a, f, r in zip(axes, flagged, reasons) if f and not r]
    lines = [f"flagged: {', '.join(robust) or 'none'}"]
    shaky = [f"{a} ({r})" for a, r in zip(axes, reasons) if r]
    if shaky:
        lines.append("fragile, not a finding: " + "; ".join(shaky))
    checked = "" if alt is None else f"; checked against the scale {alt[0]:.3g} ({alt[1]})"
    lines.append(f"flag floor: q < {level:g} and |mean| >= {min_effect:g} x scale {scale[0]:.3g} ({scale[1]}) = "
                 f"{min_effect * scale[0]:.3g} reward units{checked}")
    return "\n".join(lines)


def _mean_margin(margins: np.ndarray, what: str) -> tuple[float, str]:
    """The scale of reference pairs with these margins [n], and its source; `ValueError` naming the pairs
    whose margin is not finite (a NaN scale would flag nothing, silently)."""
    bad = np.flatnonzero(~np.isfinite(margins))
    if len(bad):
        raise UsageError(f"the {what} give {len(bad)} margin(s) that are not finite (pairs {bad[:8].tolist()}"
                         f"{' ...' if len(bad) > 8 else ''}): the probes' reward scale would be NaN; drop or fix "
                         "those pairs, or pass the scale as a number")
    return float(np.mean(np.abs(margins))), f"mean |margin| of {len(margins)} reference pairs"


__all__ = ["SCALES", "check_choice", "choose", "flag_summary", "fragility", "items_scale", "reward_scale"]
