"""Pairs → the items a benchmark counts: a RewardBench 1 pair, or a RewardBench 2 group of pairs.

A pair without a `group` is an item of its own. The pairs sharing a `group` (one RewardBench 2
record: its chosen response against each rejected one) form one item, scored best-of-N. The
checks here refuse what would make a count wrong: a group whose pairs are not adjacent (two records
sharing an id, or a list reordered), a group mixing prompts or subsets, a group that is not each
chosen response against the same rejected ones (`_best_of_n.n_chosen`), a subset holding both plain
pairs and groups (two scoring rules under one name), and RewardBench 2 Ties records its rule
cannot score (`_ties.check`).

Ties are counted as RewardBench counts them. RewardBench 1 (`scripts/run_rm.py`) scores a pair
right when `chosen > rejected`, so a margin of exactly 0 is wrong. A RewardBench 2 record scores by
`_best_of_n` (rewardbench 0.1.4's rule by default: a chosen response tied at the top with k − 1
others scores 1/k), so an item's `credit` is a number in [0, 1], not a yes or no.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..data import Pair, side
from ..errors import DataError
from ._best_of_n import credit as record_credit
from ._best_of_n import n_chosen
from ._sections import SECTION_OF, section_weights
from ._ties import check as check_ties
from ._ties import is_ties

NO_SUBSET = "(no subset)"
"""How a pair without a `subset` is named in tables."""


@dataclass(frozen=True)
class Items:
    """The m items of n pairs. `of_pair` [n]: each pair's item (non-decreasing: groups are
    adjacent); `ids` [m]: the group, else the pair's id, else its index; `subsets` [m];
    `grouped` [m] whether the item is a RewardBench 2 group (best-of-N); `chosen` [m] its number of
    chosen responses (1 for a pair; `_best_of_n.n_chosen` for a group)."""

    ids: tuple[str, ...]
    subsets: tuple[str | None, ...]
    grouped: np.ndarray
    of_pair: np.ndarray
    chosen: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        """Index of each item's first pair [m]."""
        return np.flatnonzero(np.r_[True, np.diff(self.of_pair) != 0])

    @property
    def size(self) -> np.ndarray:
        """Pairs per item [m] (the number of rejected responses of a group with one chosen)."""
        return np.bincount(self.of_pair, minlength=len(self.ids))


@dataclass(frozen=True)
class SubsetLayout:
    """Items by subset: `subsets` in order of first appearance, `index[k]` the items of subset k,
    `grouped[k]` whether they are RewardBench 2 groups; `weights` the RewardBench 1 section weights."""

    subsets: tuple[str | None, ...]
    index: tuple[np.ndarray, ...]
    grouped: tuple[bool, ...]
    weights: dict[str, float]


def items(pairs: Sequence[Pair]) -> Items:
    """The items of `pairs`, checked (module docstring); raises `DataError` naming the pairs."""
    ids: list[str] = []
    subsets: list[str | None] = []
    grouped: list[bool] = []
    of_pair = np.zeros(len(pairs), dtype=np.int64)
    first: dict[str, int] = {}  # group → its first pair
    for i, pair in enumerate(pairs):
        if pair.group is not None and pair.group == (pairs[i - 1].group if i else None):
            _same_record(pairs, first[pair.group], i)
            of_pair[i] = len(ids) - 1
            continue
        if pair.group is not None:
            if pair.group in first:
                raise DataError(f"the pairs of group {pair.group!r} are not adjacent (pairs {first[pair.group]} "
                                f"and {i}, with other pairs between). Fix: keep each RewardBench 2 record's pairs "
                                f"together and in order, as load_pairs reads them, and give records distinct ids.")
            first[pair.group] = i
        of_pair[i] = len(ids)
        ids.append(pair.group if pair.group is not None else pair.id if pair.id is not None else str(i))
        subsets.append(pair.subset)
        grouped.append(pair.group is not None)
    starts = [i for i in range(len(pairs)) if i == 0 or of_pair[i] != of_pair[i - 1]]  # each item's first pair
    spans = zip(starts, [*starts[1:], len(pairs)])
    chosen = np.array([n_chosen(pairs[a:b]) if g else 1 for (a, b), g in zip(spans, grouped)], dtype=np.int64)
    found = Items(tuple(ids), tuple(subsets), np.array(grouped, dtype=bool), of_pair, chosen)
    _one_rule_per_subset(found)
    tie = np.flatnonzero(ties_mask(found.subsets, found.grouped))
    check_ties([found.ids[i] for i in tie], [int(found.chosen[i]) for i in tie])
    return found


def ties_mask(subsets: Sequence[str | None], grouped: Sequence[bool] | np.ndarray) -> np.ndarray:
    """Whether each item is a RewardBench 2 Ties record [m] (a group in a subset named Ties, any case), from
    the items' subsets and whether each is a group (`Items`, or a `Bench`'s `item_subsets`, `grouped`)."""
    return np.asarray(grouped, dtype=bool) & np.array([is_ties(s) for s in subsets], dtype=bool)


def _same_record(pairs: Sequence[Pair], start: int, i: int) -> None:
    a, b = pairs[start], pairs[i]
    for field in ("prompt", "subset"):
        if getattr(a, field) != getattr(b, field):
            raise DataError(f"group {a.group!r} mixes {field}s (pairs {start} and {i} differ): a group is one "
                            f"RewardBench 2 record, one prompt in one subset. Fix: give different records "
                            f"different ids.")


def _one_rule_per_subset(found: Items) -> None:
    kinds: dict[str | None, set[bool]] = {}
    for subset, g in zip(found.subsets, found.grouped.tolist()):
        kinds.setdefault(subset, set()).add(g)
    mixed = [s for s, k in kinds.items() if len(k) > 1]
    if mixed:
        raise DataError(f"subset {mixed[0] or NO_SUBSET!r} holds both single pairs and RewardBench 2 groups, "
                        f"which are scored by different rules (pairwise, best-of-N). Fix: give them different "
                        f"subset names.")


def layout(subsets: Sequence[str | None], grouped: np.ndarray, keep: np.ndarray | None = None,
           weighting: str = "rewardbench") -> SubsetLayout:
    """Items grouped by subset, and the RewardBench 1 section weights (`section_weights`, by
    `weighting`); with `keep` [m] (bool), of the kept items only, renumbered 0..k-1 in their order."""
    if keep is not None:
        subsets = [s for s, ok in zip(subsets, np.asarray(keep, dtype=bool).tolist()) if ok]
        grouped = np.asarray(grouped)[keep]
    order = list(dict.fromkeys(subsets))
    keys = np.array([order.index(s) for s in subsets], dtype=np.int64)
    index = tuple(np.flatnonzero(keys == k) for k in range(len(order)))
    kind = tuple(bool(grouped[ix[0]]) for ix in index)
    counts = {s: len(ix) for s, ix, g in zip(order, index, kind) if s in SECTION_OF and not g}
    return SubsetLayout(tuple(order), index, kind, section_weights(counts, weighting))


def credit(found: Items, reward: np.ndarray, best_of_n_ties: str) -> np.ndarray:
    """Each item's score [m] in [0, 1] from the pairs' rewards [2n] (chosen, rejected alternating): a
    pair 1 when `chosen > rejected` else 0, a group its best-of-N score by `best_of_n_ties` (`_best_of_n`)."""
    r = np.asarray(reward, dtype=np.float64)
    out = (side(r, "chosen") > side(r, "rejected")).astype(np.float64)[found.starts] if len(found.ids) else np.zeros(0)
    for i in np.flatnonzero(found.grouped):
        out[i] = record_credit(r, int(found.starts[i]), int(found.size[i]), int(found.chosen[i]), best_of_n_ties)
    return out


def counted(found: Items, finite: np.ndarray) -> np.ndarray:
    """Whether each item is counted [m]: every one of its pairs has finite rewards (`finite` [n]). A
    group with one NaN reward has no best-of-N answer, so the whole item is left out, not scored wrong."""
    if not len(found.ids):
        return np.zeros(0, dtype=bool)
    return np.logical_and.reduceat(np.asarray(finite, dtype=bool), found.starts)


def checksum(pairs: Sequence[Pair]) -> str:
    """A hash of everything scored about the pairs (text, subset, group), to tell two runs on the same items."""
    data = [[p.prompt, p.chosen, p.rejected, p.subset, p.group] for p in pairs]
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]
