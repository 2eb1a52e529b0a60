"""`bench`: a reward model on RewardBench-schema pairs, scored the way RewardBench scores it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..data import Pair, margin
from ..errors import DataError
from ..model import RewardModel, dtype_name, score_pairs
from ..stats import wilson
from ._items import Items, SubsetLayout, checksum, correct, counted, items, layout
from ._result import Bench, SubsetScore
from ._sections import RB2, RB2_SUBSETS, SECTION_OF
from ._stats import intervals, scores, support


def bench(model: RewardModel, pairs: Sequence[Pair], *, against: RewardModel | None = None, batch_size: int = 16,
          n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Bench:
    """Score `pairs` with `model` and report them as RewardBench does; with `against`, compare two models.

    Every pair is scored once, in length-sorted batches of `batch_size` (`RewardModel.score`: the
    model's own reward, fp32 head). An item is a pair, or the pairs of one RewardBench 2 record
    (`Pair.group`: one chosen against its rejected responses, best-of-N: right only when the chosen
    beats every rejected one). A margin of exactly 0 counts as RewardBench counts it: wrong for a
    RewardBench 1 pair (`chosen > rejected`), right for a RewardBench 2 group (its `argmax` takes the
    first maximum, and the chosen response comes first).

    Reported: each subset's accuracy with a Wilson interval; each RewardBench section present
    (Chat, Chat Hard, Safety, Reasoning) as `Σ n_s a_s / Σ n_s` over its subsets, where math-prm
    weighs as much as all hep-* code subsets together; the overall score, the mean of the sections
    present; RewardBench 2's score, the unweighted mean of its subsets' best-of-N accuracies; and the
    accuracy over all items. Subsets and all items get Wilson intervals; section, overall and
    RewardBench 2 scores the MOVER-Wilson interval of their weighted sum of subset accuracies
    (`INTERVALS`), at `level`. The weighting is documented with its sources in
    `rewardlens.bench._sections`.

    Non-finite numbers: an item with a NaN or infinite reward on any of its pairs is left out of
    every count (never a loss) and its pairs are named (`Bench.excluded`); no finite pair at all
    raises `NonFiniteError`. Every counted margin exactly 0 on more than one pair warns and sets
    `Bench.saturated` (`rewardlens.model.score_pairs`).

    `against`: a second model scored on the same pairs; the result's `comparison` holds every
    score's difference (model − against) over the items both count, with its paired bootstrap
    interval (`n_boot` draws within subsets, seeded by `seed`) and the two-sided p-value of a paired
    randomization test over items (`Bench.compare`, `BenchComparison`).

    Raises `DataError` for pairs that cannot be counted (a group split apart or mixing prompts, a
    subset mixing pairs and groups, RewardBench 2's Ties subset).
    """
    pairs = list(pairs)
    if not pairs:
        raise DataError("bench got no pairs. Fix: pass at least one rewardlens.Pair (e.g. from load_pairs).")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    found = items(pairs)  # refuse what cannot be counted before any forward pass
    first = _run(model, pairs, found, batch_size, n_boot, seed, level)
    if against is None:
        return first
    second = _run(against, pairs, found, batch_size, n_boot, seed, level)
    return replace(first, comparison=first.compare(second))


def _run(model: RewardModel, pairs: list[Pair], found: Items, batch_size: int, n_boot: int, seed: int,
         level: float) -> Bench:
    reward = model.score(pairs, batch_size=batch_size)
    ids = tuple(p.id if p.id is not None else str(i) for i, p in enumerate(pairs))
    finite, acc = score_pairs(reward, ids, dtype=dtype_name(model))  # raises when no pair is finite
    keep = counted(found, finite.finite)
    right = correct(found, margin(reward)) & keep
    lay = layout(found.subsets, found.grouped, keep)
    kept = right[keep]
    estimates = {k: float(v) for k, v in scores(kept, lay).items()}
    keys = list(estimates)
    return Bench(
        model=repr(model), pair_ids=ids, reward=reward, item_of_pair=found.of_pair, item_ids=found.ids,
        item_subsets=found.subsets, grouped=found.grouped, correct=right, counted=keep,
        excluded=finite.excluded, saturated=acc.saturated, notes=acc.notes,
        subsets=_subsets(lay, found.size[keep], kept, level), estimates=estimates,
        intervals=intervals(kept, lay, keys, level), support=dict(zip(keys, support(lay, keys).tolist())),
        checksum=checksum(pairs), n_boot=n_boot, seed=seed, level=level)


def _subsets(lay: SubsetLayout, size: np.ndarray, right: np.ndarray, level: float) -> tuple[SubsetScore, ...]:
    """One score per subset of the counted items: `size` [k] pairs per item, `right` [k] per item."""
    out = []
    for subset, ix, grouped in zip(lay.subsets, lay.index, lay.grouped):
        section = (RB2 if subset in RB2_SUBSETS else None) if grouped else SECTION_OF.get(subset or "")
        weight = float("nan")
        if subset in lay.weights:
            total = sum(w for s, w in lay.weights.items() if SECTION_OF[s] == section)
            weight = lay.weights[subset] / total
        sizes = sorted(set((size[ix] + 1).tolist()))
        kind = "pairwise" if not grouped else f"best-of-{sizes[0]}" if len(sizes) == 1 else \
            f"best-of-{sizes[0]}..{sizes[-1]}"
        wins = int(right[ix].sum())
        out.append(SubsetScore(subset, section, kind, len(ix), wins, wins / len(ix), wilson(wins, len(ix), level),
                               weight))
    return tuple(out)
