"""rewardbench 0.1.4's RewardBench 2 scoring, re-implemented from its definition as the tests' yardstick.

rewardbench 0.1.4 (PyPI; `rewardbench/utils.py`) cannot be imported here: `utils.py` imports fastchat,
`rewardbench.models` and the rest of its GPU stack at module level. Its two rules, read from that release:

- best-of-N (`reroll_and_score_dataset`, "penalty for ties"): a record's responses' rewards in its order,
  correct first; with `max_val` their maximum, the record scores `1 / #(scores == max_val)` when
  `scores[0] == max_val`, else 0. A subset's accuracy is `sum(results) / len(results)` (`run_v2.py`).
- Ties (`process_single_model` with `sample_stats`, for the subset named `ties` in any case): per record,
  the first `num_correct` scores are correct; `accurate` when worst correct > best incorrect;
  `different_correct_margin` = best − worst correct (None with one correct answer); `correct_incorrect_margin`
  = worst correct − best incorrect. Accuracy of the ref and of the tied records (0 with none). Over the
  prompts with both records (`common`), each mean over those whose margin is not None: `correctness_preferred`
  (tied gap > spread), `correctness_preferred_hard` (min of both gaps > spread), and, over those with spread
  > 0, `tanh(min gap / spread − 1)` (0 with none); all three 0 with no common prompt. The score is
  `0.3 tied + 0.3 ref + 0.2 preferred + 0.2 hard + 0.01 margin`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def best_of_n(scores: list[float]) -> float:
    """One record's best-of-N score (`scores`: its responses' rewards, correct first)."""
    top = max(scores)
    return 1 / sum(s == top for s in scores) if scores[0] == top else 0.0


def ties(records: list[dict[str, Any]]) -> dict[str, float]:
    """The Ties score and its five parts from `records` (each: `id` `ref:N`/`tied:N`, `scores` correct first,
    `num_correct`)."""
    stats: dict[str, dict[int, dict[str, Any]]] = {"ref": {}, "tied": {}}
    for r in records:
        kind, number = r["id"].split(":")
        correct, incorrect = r["scores"][:r["num_correct"]], r["scores"][r["num_correct"]:]
        worst, best, wrong = min(correct), max(correct), max(incorrect)
        stats[kind][int(number)] = {"accurate": worst > wrong, "gap": worst - wrong,
                                    "spread": best - worst if len(correct) > 1 else None}
    acc = {k: float(np.mean([s["accurate"] for s in v.values()])) if v else 0.0 for k, v in stats.items()}
    common = set(stats["ref"]) & set(stats["tied"])
    preferred = hard = margin = 0.0
    if common:
        spread = {p: stats["tied"][p]["spread"] for p in common}
        low = {p: min(stats["ref"][p]["gap"], stats["tied"][p]["gap"]) for p in common}
        preferred = float(np.mean([stats["tied"][p]["gap"] > spread[p] for p in common if spread[p] is not None]))
        hard = float(np.mean([low[p] > spread[p] for p in common if spread[p] is not None]))
        ratios = [low[p] / spread[p] for p in common if spread[p] is not None and spread[p] > 0]
        margin = float(np.mean([math.tanh(x - 1) for x in ratios])) if ratios else 0.0
    score = 0.3 * acc["tied"] + 0.3 * acc["ref"] + 0.2 * preferred + 0.2 * hard + 0.01 * margin
    return {"score": score, "tied_accuracy": acc["tied"], "ref_accuracy": acc["ref"],
            "correctness_preferred": preferred, "correctness_preferred_hard": hard, "margin_score": margin}
