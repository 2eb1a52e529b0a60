"""`bench`: a reward model on RewardBench-schema pairs, scored the way RewardBench scores it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .._deprecated import renamed
from ..data import Pair
from ..errors import DataError, UsageError, warn
from ..model import RewardModel
from ..model.internal import dtype_name, score_pairs
from ..stats import mover, wilson
from ._best_of_n import check_rule
from ._items import NO_SUBSET, Items, SubsetLayout, checksum, counted, credit, items, layout, ties_mask
from ._result import Bench, SubsetScore
from ._sections import RB2, RB2_SUBSETS, SECTION_OF, section_weights
from ._stats import Key, check_n_boot, intervals, rb2_share, scores, support
from ._ties import TiesRecords, TiesScore, is_ties, records
from ._ties import score as ties_score


def bench(model: RewardModel, pairs: Sequence[Pair], *, against: RewardModel | None = None, batch_size: int = 16,
          n_boot: int = 2000, seed: int = 0, confidence: float = 0.95, weighting: str = "rewardbench",
          best_of_n_ties: str = "shared", level: float | None = None) -> Bench:
    """Score `pairs` with `model` and report them as RewardBench does; with `against`, compare two models.

    Every pair is scored once, in length-sorted batches of `batch_size` (`RewardModel.score`: the
    model's own reward, fp32 head). An item is a pair, or the pairs of one RewardBench 2 record
    (`Pair.group`: one chosen against its rejected responses, best-of-N: right when the chosen
    response has the top reward). A margin of exactly 0 counts as rewardbench 0.1.4 counts it: wrong
    for a RewardBench 1 pair (`chosen > rejected`); a RewardBench 2 record whose chosen reward shares
    the top with k − 1 others scores 1/k (`reroll_and_score_dataset`). `best_of_n_ties="argmax"`
    keeps the earlier rule (`utils_v2.py`): such a record is right (`rewardlens.bench._best_of_n`).

    Reported: each subset's accuracy with a Wilson interval; each RewardBench section present
    (Chat, Chat Hard, Safety, Reasoning, and the prior sets) as `Σ w_s a_s / Σ w_s` over its
    subsets, with `weighting="rewardbench"` (the default) RewardBench's fixed `EXAMPLE_COUNTS`
    (math-prm 984, as much as all six hep-* code subsets) and with `"items"` the items scored; the
    overall score, sections at weight 2 and prior sets at weight 1 over those present; RewardBench
    2's score, the unweighted mean of its subsets (best-of-N accuracies, and the Ties score by its
    own rule, `rewardlens.bench._ties`); and the accuracy over all pass/fail items (Ties records
    excluded). Subsets and all items get Wilson intervals; section, overall and RewardBench 2 scores
    the MOVER interval of their weighted sum (`INTERVALS`), Ties a bootstrap over prompts, at
    `confidence` (`level` is its deprecated name, one release). The weighting is documented with its sources
    in `rewardlens.bench._sections`.

    A subset that is in neither benchmark is scored under its own name, left out of every section,
    and named in one `RewardLensWarning`; a pair without a subset is the subset `(no subset)`. RewardBench
    1 pairs and RewardBench 2 groups in one list are scored apart (sections from the pairs, the
    RewardBench 2 score from the groups), and `notes` says so.

    Non-finite numbers: an item with a NaN or infinite reward on any of its pairs is left out of
    every count (never a loss) and its pairs are named (`Bench.excluded`); no finite pair at all
    raises `NonFiniteError`. Every counted margin exactly 0 on more than one pair warns and sets
    `Bench.saturated` (`rewardlens.model.internal.score_pairs`).

    `against`: a second model scored on the same pairs; the result's `comparison` holds every
    score's difference (model − against) over the items both count, with its paired bootstrap
    interval (`n_boot` draws within subsets, seeded by `seed`) and the two-sided p-value of a paired
    randomization test over items (`Bench.compare`, `BenchComparison`). `n_boot` must be at least
    `2 / (1 − confidence)` (40 at 95%), so that each tail of a percentile interval holds a draw.

    Raises `DataError` for pairs that cannot be counted (a group split apart, mixing prompts or not
    chosen-major, a subset mixing pairs and groups, a Ties record without a `ref:N`/`tied:N` id), and
    `ValueError` for an unknown `weighting` or `best_of_n_ties`, or `n_boot` under `2 / (1 − confidence)`.
    """
    pairs = list(pairs)
    if not pairs:
        raise DataError("bench got no pairs. Fix: pass at least one rewardlens.Pair (e.g. from load_pairs).")
    confidence = renamed("bench", "level", "confidence", level, confidence)
    if not 0 < confidence < 1:
        raise UsageError(f"confidence must be in (0, 1), got {confidence}", option="confidence")
    section_weights({}, weighting)  # a bad weighting, rule or n_boot is refused before any forward pass
    check_rule(best_of_n_ties)
    check_n_boot(n_boot, confidence)
    found = items(pairs)  # refuse what cannot be counted before any forward pass
    unknown = _unknown(found)
    if unknown:  # warned here, so the warning points at the caller's line
        warn(unknown)
    first = _run(model, pairs, found, batch_size, n_boot, seed, confidence, weighting, best_of_n_ties)
    if against is None:
        return first
    second = _run(against, pairs, found, batch_size, n_boot, seed, confidence, weighting, best_of_n_ties)
    return replace(first, comparison=first.compare(second))


def _run(model: RewardModel, pairs: list[Pair], found: Items, batch_size: int, n_boot: int, seed: int,
         level: float, weighting: str, best_of_n_ties: str) -> Bench:
    reward = model.score(pairs, batch_size=batch_size)
    ids = tuple(p.id if p.id is not None else str(i) for i, p in enumerate(pairs))
    finite, acc = score_pairs(reward, ids, dtype=dtype_name(model))  # raises when no pair is finite
    keep = counted(found, finite.finite)
    tie = ties_mask(found.subsets, found.grouped) & keep
    plain = keep & ~tie  # Ties has a rule of its own: it stays out of the pass/fail scores
    right = np.where(keep, credit(found, reward, best_of_n_ties), 0.0)  # an item's score in [0, 1]
    lay = layout(found.subsets, found.grouped, plain, weighting)
    kept = right[plain]
    estimates = {k: float(v) for k, v in scores(kept, lay).items()}
    keys = list(estimates)
    ints = intervals(kept, lay, keys, level)
    sup = dict(zip(keys, support(lay, keys).tolist()))
    subsets = _subsets(lay, found.size[plain], kept, level)
    ties = None
    if tie.any():
        rec = records(found.ids, reward, found.of_pair, tie)
        right[tie] = rec.accurate
        ties = ties_score(rec, next(s for s, t in zip(found.subsets, tie) if t) or "", n_boot, seed, level)
        subsets += (_ties_row(ties, rec),)
        _join_ties(ties, len(rec.tied), rb2_share(lay), estimates, ints, sup)
    return Bench(
        model=repr(model), pair_ids=ids, reward=reward, item_of_pair=found.of_pair, item_ids=found.ids,
        item_subsets=found.subsets, grouped=found.grouped, correct=right, counted=keep,
        excluded=finite.excluded, saturated=acc.saturated, notes=acc.notes + _mixed(found),
        subsets=subsets, estimates=estimates, intervals=ints, support=sup,
        checksum=checksum(pairs), n_boot=n_boot, seed=seed, level=level, weighting=weighting,
        best_of_n_ties=best_of_n_ties, ties=ties,
        pairs=tuple(pairs))


def _ties_row(ties: TiesScore, rec: TiesRecords) -> SubsetScore:
    """The Ties subset's row: its score in the accuracy column (it is not a proportion), its bootstrap interval."""
    return SubsetScore(ties.subset, RB2, "ties rule", len(rec.tied), float(rec.accurate.sum()), ties.score, ties.ci,
                       float("nan"))


def _join_ties(ties: TiesScore, n: int, share: float, estimates: dict[Key, float],
               ints: dict[Key, tuple[float, float]], sup: dict[Key, int]) -> None:
    """Enter the Ties score as a subset and into the RewardBench 2 score (the mean of its subsets):
    `RB2 = share · (mean of the pass/fail subsets) + (1 − share) · Ties`, its interval MOVER."""
    key, rb2 = ("subset", ties.subset), ("score", RB2)
    estimates[key], ints[key], sup[key] = ties.score, ties.ci, n
    if share == 0:  # Ties is the only RewardBench 2 subset
        estimates[rb2], ints[rb2], sup[rb2] = ties.score, ties.ci, n
        return
    points = np.array([estimates[rb2], ties.score])
    coef = np.array([share, 1 - share])
    estimates[rb2] = float(points @ coef)
    ints[rb2] = mover(points, np.array([ints[rb2], ties.ci]), coef)
    sup[rb2] += n


def _unknown(found: Items) -> str:
    """The warning naming the subsets in neither benchmark (scored under their own name, in no
    section), or "" when there is none."""
    unknown = [s for s, g in dict(zip(found.subsets, found.grouped.tolist())).items()
               if s is not None and (s not in RB2_SUBSETS and not is_ties(s) if g else s not in SECTION_OF)]
    if not unknown:
        return ""
    return (f"{len(unknown)} subset(s) are not RewardBench subsets: {', '.join(map(repr, unknown))}. Each is "
            f"scored under its own name and left out of every section, the overall and the RewardBench 2 score "
            f"(it counts in the accuracy over all items). Fix: if a name is a RewardBench subset spelt "
            f"differently, rename it (e.g. 'alpacaeval-easy', 'Factuality').")


def _mixed(found: Items) -> tuple[str, ...]:
    """A note when RewardBench 1 pairs and RewardBench 2 groups share one list: they are scored apart."""
    groups = int(found.grouped.sum())
    if groups == 0 or groups == len(found.ids):
        return ()
    return (f"{len(found.ids) - groups} RewardBench 1 pairs and {groups} RewardBench 2 groups are scored apart: "
            f"sections and overall from the pairs, the RewardBench 2 score from the groups; the accuracy over "
            f"all items mixes both rules",)


def _subsets(lay: SubsetLayout, size: np.ndarray, right: np.ndarray, level: float) -> tuple[SubsetScore, ...]:
    """One score per subset of the counted items: `size` [k] pairs per item, `right` [k] each item's score."""
    out = []
    for subset, ix, grouped in zip(lay.subsets, lay.index, lay.grouped):
        section = (RB2 if subset in RB2_SUBSETS else None) if grouped else SECTION_OF.get(subset or NO_SUBSET)
        weight = float("nan")
        if subset in lay.weights:
            total = sum(w for s, w in lay.weights.items() if SECTION_OF[s] == section)
            weight = lay.weights[subset] / total
        sizes = sorted(set((size[ix] + 1).tolist()))
        kind = "pairwise" if not grouped else f"best-of-{sizes[0]}" if len(sizes) == 1 else \
            f"best-of-{sizes[0]}..{sizes[-1]}"
        wins = float(right[ix].sum())
        out.append(SubsetScore(subset, section, kind, len(ix), wins, wins / len(ix), wilson(wins, len(ix), level),
                               weight))
    return tuple(out)
