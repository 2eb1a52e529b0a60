"""RewardBench 2's best-of-N credit for one record, and the shape of a record read back from its pairs.

A RewardBench 2 record lists `C` correct (chosen) and `R` incorrect (rejected) responses; `load_pairs`
reads it as its `C · R` pairs, chosen-major (chosen 0 against rejected 0, 1, ..., then chosen 1 ...).
rewardbench scores the record from its responses' rewards in the record's order, chosen first:
`s = [c_0, ..., c_{C-1}, r_0, ..., r_{R-1}]`. Two rules, by `best_of_n_ties`:

- `"shared"` (the default; rewardbench 0.1.4, `rewardbench/utils.py`, `reroll_and_score_dataset`,
  "penalty for ties"): with `top = max(s)` and `k = #{i : s_i = top}`, the record scores `1/k` when
  `s_0 = top`, else 0. A chosen response tied with k − 1 others at the top shares the credit; with
  several chosen responses only the first is the one that must reach the top, as in rewardbench.
- `"argmax"` (the earlier rule, `rewardbench/utils_v2.py`, `np.argmax(scores) == 0`, which 0.1.4
  comments out): the record is right (1) when every chosen response is `>=` every rejected one, so a
  tie with the best rejected one is right; else 0. Kept as a named option, not the default.

A subset's accuracy is then the mean of its records' scores (rewardbench: `sum(results) / len`).

The responses are read back from the pairs: `C` from the pair ids `load_pairs` gives (`<id>/<j>-<k>`,
or `<id>/<k>` for one chosen response), else from the runs of equal chosen text. Identical chosen
texts (RewardBench 2 has Ties records whose two correct answers are one text) are told apart only by
their ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ..data import Pair, side
from ..data.internal import pair_span
from ..errors import DataError, UsageError

BEST_OF_N_TIES = ("shared", "argmax")
"""The best-of-N tie rules: `shared` (rewardbench 0.1.4, the default) and `argmax` (utils_v2.py, the earlier one)."""
RULES = {
    "shared": "RewardBench 1 pairs: right when chosen > rejected (a margin of exactly 0 is wrong); RewardBench 2 "
              "groups: 1/k when the chosen reward is the top one, shared with k - 1 others (rewardbench 0.1.4, "
              "reroll_and_score_dataset), else 0",
    "argmax": "RewardBench 1 pairs: right when chosen > rejected (a margin of exactly 0 is wrong); RewardBench 2 "
              "groups: right when the chosen reward is >= every rejected one (a tie is right: utils_v2.py's "
              "argmax rule, not rewardbench 0.1.4's)",
}
"""How a tie counts under each rule, for tables and JSON."""
_SUFFIX = re.compile(r"(\d+)(?:-(\d+))?")


def check_rule(best_of_n_ties: str) -> None:
    """Refuse an unknown best-of-N tie rule (a `ValueError`, one line with the fix)."""
    if best_of_n_ties not in BEST_OF_N_TIES:
        raise UsageError(f"best_of_n_ties must be one of {BEST_OF_N_TIES}, got {best_of_n_ties!r}. Fix: pass "
                         f"'shared' (rewardbench 0.1.4: a tie at the top scores 1/k) or 'argmax' (the earlier "
                         f"utils_v2.py rule: a tie with the best rejected response is right).")


def n_chosen(group: Sequence[Pair]) -> int:
    """The number of chosen responses `C` of one record from its pairs (module docstring), checked:
    the pairs must be chosen-major, each chosen response against the same rejected responses."""
    n = len(group)
    c = _from_ids(group)
    if c is None:
        c = 1 + sum(a.chosen != b.chosen for a, b in zip(group, group[1:]))
    r = n // c
    grid = n % c == 0 and all(p.chosen == group[(i // r) * r].chosen and p.rejected == group[i % r].rejected
                              for i, p in enumerate(group))
    if not grid:
        raise DataError(f"group {group[0].group!r} is not one RewardBench 2 record: its {n} pairs are not each of "
                        f"{c} chosen responses against the same rejected responses, in order. Fix: read the record "
                        f"with load_pairs, or give each chosen response one pair per rejected one, chosen-major.")
    return c


def _from_ids(group: Sequence[Pair]) -> int | None:
    """`C` from the pair ids `load_pairs` writes (`<group>/<k>`: one chosen; `<group>/<j>-<k>`: chosen j), or
    None when the ids are not exactly those, in order."""
    found = [_SUFFIX.fullmatch(p.id[len(f"{p.group}/"):]) if p.id and p.id.startswith(f"{p.group}/") else None
             for p in group]
    if not all(found):
        return None
    if all(m.group(2) is None for m in found if m):
        return 1 if [int(m.group(1)) for m in found if m] == list(range(len(group))) else None
    if any(m.group(2) is None for m in found if m):
        return None
    index = [(int(m.group(1)), int(m.group(2))) for m in found if m]
    c, r = index[-1][0] + 1, index[-1][1] + 1
    return c if index == [(j, k) for j in range(c) for k in range(r)] else None


def credit(reward: np.ndarray, start: int, size: int, chosen: int, best_of_n_ties: str) -> float:
    """One record's best-of-N score from the pairs' rewards [2n] (chosen, rejected alternating): its
    `size` pairs from `start`, `chosen` chosen responses (module docstring, by `best_of_n_ties`)."""
    rows = np.asarray(reward, dtype=np.float64)[pair_span(start, start + size)]
    good, bad = side(rows, "chosen"), side(rows, "rejected")
    if best_of_n_ties == "argmax":
        return float(np.min(good - bad) >= 0)
    per = size // chosen
    scores = np.concatenate([good[::per], bad[:per]])  # the record's responses, in its order: chosen first
    top = scores.max()
    return float(1 / np.sum(scores == top)) if scores[0] == top else 0.0
