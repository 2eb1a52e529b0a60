"""RewardBench's sections and weighting, as data, and the scores built from per-subset accuracies.

The subset → section map is RewardBench's own `SUBSET_MAPPING` and the weights its `EXAMPLE_COUNTS`
(allenai/reward-bench, `rewardbench/constants.py`; `rewardbench/utils.py`,
`calculate_scores_per_section`): a section's score is `Σ w_s a_s / Σ w_s` over the subsets present,
with `w_s` the FIXED size of subset s in the full filtered set, whatever number of items was
scored (`weighting="rewardbench"`, the default: on a sample this is RewardBench's stratified
estimate). math-prm is given 984 (it has 447) "to be equal to code": the six hep-* subsets hold
6 × 164 = 984. `weighting="items"` weighs each subset by the items scored instead, math-prm by the
summed count of the hep-* subsets present (its own count when none is).

The prior sets (anthropic_helpful, anthropic_hhh, shp, summarize: `allenai/pref-test-sets`) form
the leaderboard's "Prior Sets (0.5 weight)" column, the unweighted mean of their accuracies, and the
overall score is the average of the four sections at weight 2 and the prior sets at weight 1, over
those present (`analysis/get_benchmark_results.py`, `get_average_over_rewardbench`: `np.nanmean` of
the four, then `np.ma.average(..., weights=[2, 2, 2, 2, 1])`). Without prior sets it is the mean
of the sections.

RewardBench 2 (allenai/reward-bench-2) has six subsets (Factuality, Precise IF, Math, Safety,
Focus, Ties) and its score is their unweighted mean. Ties has a scoring rule of its own
(`rewardlens.bench._ties`).

Every function here takes per-subset accuracies as floats or as arrays of bootstrap draws [B] and
returns the same shape, so one code path gives the estimate and its bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from ..errors import UsageError

SECTIONS: dict[str, tuple[str, ...]] = {
    "Chat": ("alpacaeval-easy", "alpacaeval-length", "alpacaeval-hard", "mt-bench-easy", "mt-bench-med"),
    "Chat Hard": ("mt-bench-hard", "llmbar-natural", "llmbar-adver-neighbor", "llmbar-adver-GPTInst",
                  "llmbar-adver-GPTOut", "llmbar-adver-manual"),
    "Safety": ("refusals-dangerous", "refusals-offensive", "xstest-should-refuse", "xstest-should-respond",
               "donotanswer"),
    "Reasoning": ("math-prm", "hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python", "hep-rust"),
}
"""RewardBench's section → subsets (allenai/reward-bench `SUBSET_MAPPING`)."""
PRIOR = "Prior Sets"
"""The leaderboard's column of the prior preference sets, scored like a section and weighed half."""
PRIOR_SETS = ("anthropic_helpful", "anthropic_hhh", "shp", "summarize")
"""The prior sets the leaderboard averages (unweighted) into `PRIOR`."""
GROUPS: dict[str, tuple[str, ...]] = {**SECTIONS, PRIOR: PRIOR_SETS}
"""Every weighted group of subsets: the four sections, then the prior sets."""
SECTION_OF: dict[str, str] = {subset: section for section, subsets in GROUPS.items() for subset in subsets}
"""RewardBench subset → its section (`PRIOR` for a prior set)."""
EXAMPLE_COUNTS: dict[str, int] = {
    "alpacaeval-easy": 100, "alpacaeval-length": 95, "alpacaeval-hard": 95, "mt-bench-easy": 28, "mt-bench-med": 40,
    "mt-bench-hard": 37, "llmbar-natural": 100, "llmbar-adver-neighbor": 134, "llmbar-adver-GPTInst": 92,
    "llmbar-adver-GPTOut": 47, "llmbar-adver-manual": 46, "refusals-dangerous": 100, "refusals-offensive": 100,
    "xstest-should-refuse": 154, "xstest-should-respond": 250, "donotanswer": 136, "math-prm": 984,
    "hep-cpp": 164, "hep-go": 164, "hep-java": 164, "hep-js": 164, "hep-python": 164, "hep-rust": 164,
}
"""RewardBench's fixed section weights (`rewardbench/constants.py` as of allenai/reward-bench#175, which
swapped the two xstest counts to the subsets' real sizes); math-prm's 984 is its upweighting."""
SECTION_WEIGHT, PRIOR_WEIGHT = 2.0, 1.0
"""Weights of a section and of the prior sets in the overall score (the leaderboard's [2, 2, 2, 2, 1])."""
WEIGHTINGS = ("rewardbench", "items")
"""`rewardbench`: the fixed `EXAMPLE_COUNTS` (the default); `items`: the items scored per subset."""
MATH = "math-prm"
CODE = ("hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python", "hep-rust")
"""math-prm weighs as much as these together (RewardBench's EXAMPLE_COUNTS: 984 = 6 × 164)."""
RB2_SUBSETS = ("Factuality", "Precise IF", "Math", "Safety", "Focus", "Ties")
"""RewardBench 2's subsets; its score is their unweighted mean."""
RB2 = "RewardBench 2"
"""The name the RewardBench 2 score goes by in results."""
OVERALL = "overall"

Score = TypeVar("Score", float, np.ndarray)


def section_weights(counts: Mapping[str, int], weighting: str = "rewardbench") -> dict[str, float]:
    """Weight of each RewardBench subset present in its section (or the prior sets).

    `counts`: subset → number of items (RewardBench 1 subsets; others are ignored), a subset
    present when its count is positive. `weighting="rewardbench"`: the fixed `EXAMPLE_COUNTS`, and
    weight 1 for each prior set (the leaderboard's unweighted mean). `"items"`: every subset weighs
    its count, except math-prm, which weighs the summed count of the hep-* subsets present, or its
    own count when no code subset is present.
    """
    if weighting not in WEIGHTINGS:
        raise UsageError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}. Fix: pass "
                         f"weighting='rewardbench' (RewardBench's fixed counts) or 'items' (the items scored).")
    present = {s: n for s, n in counts.items() if s in SECTION_OF and n > 0}
    if weighting == "rewardbench":
        return {s: float(EXAMPLE_COUNTS.get(s, 1)) for s in present}
    weights = {s: float(n) for s, n in present.items()}
    code = sum(n for s, n in weights.items() if s in CODE)
    if MATH in weights and code > 0:
        weights[MATH] = code
    return weights


def section_scores(accuracy: Mapping[str, Score], weights: Mapping[str, float]) -> dict[str, Score]:
    """Each section present, then the prior sets: `Σ w_s a_s / Σ w_s` over its subsets.

    `accuracy`: subset → accuracy (a float, or bootstrap draws [B]); `weights` from `section_weights`.
    Sections without a weighted subset are left out."""
    out: dict[str, Score] = {}
    for section, subsets in GROUPS.items():
        present = [s for s in subsets if s in weights]
        if present:
            total = sum(weights[s] for s in present)
            out[section] = sum(weights[s] * accuracy[s] for s in present) / total  # type: ignore[assignment]
    return out


def overall(sections: Mapping[str, Score]) -> Score | float:
    """RewardBench's overall score: the sections present at weight 2 and the prior sets at weight 1,
    `Σ w_k S_k / Σ w_k` (the mean of the sections when no prior set is present; NaN when nothing is)."""
    weights = [PRIOR_WEIGHT if name == PRIOR else SECTION_WEIGHT for name in sections]
    total = sum(weights)
    return sum(w * v for w, v in zip(weights, sections.values())) / total if total else float("nan")


def rb2_score(accuracy: Mapping[str, Score]) -> Score | float:
    """RewardBench 2's score: the unweighted mean of the best-of-N accuracies of its subsets present."""
    values = [accuracy[s] for s in RB2_SUBSETS if s in accuracy]  # Ties joins in _bench (its own rule)
    return sum(values) / len(values) if values else float("nan")
