"""The results of `bench`: per-subset accuracies, RewardBench's section scores, and paired differences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data import Pair, margin, record_columns, record_fields
from ..errors import DataError, NonFiniteError
from ..plotting import HtmlView
from ..stats import json_ready, percentile_interval
from ._best_of_n import RULES
from ._items import layout, ties_mask
from ._sections import OVERALL, RB2, SECTIONS
from ._stats import ALL_ITEMS, Key, check_n_boot, coefficients, picks, rb2_share, scores, sign_flip, support
from ._ties import RULE as TIES_SCORE_RULE
from ._ties import WEIGHTS as TIES_WEIGHTS
from ._ties import TiesScore, draws, estimated, records

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TIES_RULE = RULES["shared"]
"""How a margin of exactly 0 counts by default (as rewardbench 0.1.4 counts it; `best_of_n_ties="argmax"`: `RULES`)."""
INTERVALS = ("subsets and all items: Wilson; sections, overall and RewardBench 2: MOVER-Wilson, the subsets' "
             "Wilson intervals combined with the weights the score gives them (Zou & Donner 2008); Ties: "
             "percentile bootstrap over prompts, joined into RewardBench 2 by MOVER")
"""How one model's intervals are made (`rewardlens.bench._stats`); a comparison's come from a paired bootstrap."""


@dataclass(frozen=True)
class SubsetScore:
    """One subset: `n` items, `correct` the sum of their scores (the items right, a RewardBench 2 record tied at
    the top counting 1/k), `accuracy` = correct / n with its Wilson interval `ci`. `section` is its RewardBench
    section, `RewardBench 2` for a RewardBench 2 subset, or None (then it enters only the accuracy over all
    items). `weight` is its share of its section's score (RewardBench's count weighting, math-prm upweighted;
    NaN outside a section). `kind` is `pairwise` or `best-of-N` (`best-of-3..5` when groups differ in size), or
    `ties rule` for RewardBench 2's Ties subset, whose `accuracy` is then its Ties score (not a proportion;
    `Bench.ties`), `correct` its strictly right records and `ci` a bootstrap over prompts."""

    subset: str | None
    section: str | None
    kind: str
    n: int
    correct: float
    accuracy: float
    ci: tuple[float, float]
    weight: float


@dataclass(frozen=True)
class BenchComparison(HtmlView):
    """Two models on the same items: each score of `a` and `b` and the paired difference a − b.

    Row r is the score `keys[r]` = (level, name), level `subset`, `section` or `score`; `n[r]`
    items behind it; `ci_low`, `ci_high` the percentile interval of the difference from `n_boot`
    paired bootstrap draws of the items within each subset (seeded, the same draws for both
    models); `p_value` the two-sided paired randomization (sign-flip) test of a zero difference,
    exact up to 12 differing items (`rewardlens.bench._stats`: a bootstrap of two items that both
    favour one model collapses to one value and would claim p ≈ 0). NaN where fewer than two
    items stand behind a score."""

    _html_rank = "difference"

    models: tuple[str, str]
    keys: tuple[Key, ...]
    n: np.ndarray
    a: np.ndarray
    b: np.ndarray
    difference: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p_value: np.ndarray
    n_boot: int
    seed: int
    level: float

    def to_frame(self) -> pd.DataFrame:
        """One row per score: level, name, n, a, b, difference, ci_low, ci_high, p_value."""
        import pandas as pd

        return pd.DataFrame({"level": [k[0] for k in self.keys], "name": [k[1] for k in self.keys], "n": self.n,
                             "a": self.a, "b": self.b, "difference": self.difference, "ci_low": self.ci_low,
                             "ci_high": self.ci_high, "p_value": self.p_value})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN becomes None)."""
        rows = [{"level": k[0], "name": k[1], "n": n, "a": a, "b": b, "difference": d, "ci": [lo, hi], "p_value": p}
                for k, n, a, b, d, lo, hi, p in zip(self.keys, self.n, self.a, self.b, self.difference, self.ci_low,
                                                    self.ci_high, self.p_value)]
        return json_ready({"models": list(self.models), "n_boot": self.n_boot, "seed": self.seed,
                           "level": self.level, "scores": rows})

    def plot(self, ax: Axes | None = None) -> Figure:
        """The difference a − b of every score with its interval (subsets, sections, scores); into `ax`
        when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        y = np.arange(len(self.keys))[::-1]
        ax, made = one_panel(ax, (7, 0.28 * len(self.keys) + 1.2))
        err = np.nan_to_num([self.difference - self.ci_low, self.ci_high - self.difference])
        ax.errorbar(self.difference, y, xerr=err, fmt="o", capsize=2)
        ax.set_yticks(y, [f"{name} ({lvl})" if lvl != "subset" else name for lvl, name in self.keys], fontsize=7)
        ax.axvline(0, color="gray", lw=0.6)
        ax.set(xlabel="a − b (accuracy / score)", title=f"paired bootstrap, {self.level:.0%} intervals")
        return finish(ax, made)


@dataclass(frozen=True)
class Bench(HtmlView):
    """One reward model on a RewardBench-schema set: n pairs forming m items.

    `reward` [2n] rows alternate chosen, rejected (`rewardlens.data` layout); `item_of_pair` [n]
    the item of each pair; `item_ids`, `item_subsets`, `grouped` [m] (a RewardBench 2 group,
    scored best-of-N) and `correct` [m] each item's score in [0, 1]: 1 right, 0 wrong, 1/k for a
    RewardBench 2 record whose chosen reward shares the top with k − 1 others (`best_of_n_ties`:
    `RULES`; a Ties record 1 when strictly right). `subsets` holds each subset's
    accuracy with its Wilson interval. `estimates[(level, name)]` is every score: each subset,
    each RewardBench section present and the prior sets (`section`, weighted by `weighting`:
    RewardBench's fixed `EXAMPLE_COUNTS` or the items scored), and (`score`) `overall` (sections at
    weight 2, prior sets at weight 1, over those present; RewardBench's overall once all are),
    `RewardBench 2` (the mean of its subsets present, Ties by its own rule: `ties`) and `all
    items` (the plain accuracy over the pass/fail items, Ties records excluded); `intervals` their
    intervals (`INTERVALS`) and `support` the items behind each. Accuracies are fractions in [0, 1].

    Every score counts only the items with `counted` [m] True: an item with a NaN or infinite
    reward on any pair is left out (never a loss); `excluded` names those pairs. `saturated`: every
    counted margin is exactly 0 on more than one pair (`rewardlens.model.internal.SATURATED`). `notes` says
    both in words, for tables.

    `pairs` [n] are the pairs scored: `pair_frame`, `item_frame` and `to_dict`'s `items` name each pair or
    item by them (`record_fields`: id, subset, group and the record's other fields), so the numbers join
    back to the data by id. A RewardBench 2 item is named by its first pair (its record's fields).
    """

    model: str
    pair_ids: tuple[str, ...]
    reward: np.ndarray
    item_of_pair: np.ndarray
    item_ids: tuple[str, ...]
    item_subsets: tuple[str | None, ...]
    grouped: np.ndarray
    correct: np.ndarray
    counted: np.ndarray
    excluded: tuple[str, ...]
    saturated: bool
    notes: tuple[str, ...]
    subsets: tuple[SubsetScore, ...]
    estimates: Mapping[Key, float]
    intervals: Mapping[Key, tuple[float, float]]
    support: Mapping[Key, int]
    checksum: str
    pairs: tuple[Pair, ...]
    n_boot: int
    seed: int
    level: float
    weighting: str = "rewardbench"
    best_of_n_ties: str = "shared"
    ties: TiesScore | None = None
    comparison: BenchComparison | None = field(default=None)

    @property
    def margin(self) -> np.ndarray:
        """Chosen − rejected reward per pair [n]."""
        return margin(self.reward)

    @property
    def sections(self) -> dict[str, float]:
        """RewardBench section → score, for the sections present in RewardBench's order, then the prior sets."""
        return {name: v for (lvl, name), v in self.estimates.items() if lvl == "section"}

    @property
    def missing_sections(self) -> tuple[str, ...]:
        """RewardBench sections with no item here (the overall score is then over fewer than four)."""
        return tuple(s for s in SECTIONS if s not in self.sections)

    @property
    def overall(self) -> float:
        """RewardBench's overall score: sections at weight 2 and the prior sets at weight 1, over those
        present (the mean of the sections without prior sets; NaN when none is)."""
        return self.estimates[("score", OVERALL)]

    @property
    def rewardbench2(self) -> float:
        """RewardBench 2's score: the mean best-of-N accuracy of its subsets present (NaN when none is)."""
        return self.estimates[("score", RB2)]

    @property
    def accuracy(self) -> float:
        """The share of items right, over every counted item."""
        return self.estimates[("score", ALL_ITEMS)]

    def compare(self, other: Bench, *, n_boot: int | None = None, seed: int | None = None,
                level: float | None = None) -> BenchComparison:
        """Every score's difference self − other on the same items: paired bootstrap interval, sign-flip p-value.

        Both must have scored the same pairs (same text, subsets and groups, in the same order);
        `n_boot`, `seed` and `level` default to this result's. Only the items both count (finite
        rewards in both) enter, so `a` and `b` are each model's scores over those items. The Ties
        score (and RewardBench 2's with it) gets a paired bootstrap over prompts and no p-value."""
        if other.best_of_n_ties != self.best_of_n_ties:
            raise DataError(f"the two results count best-of-N ties by different rules ({self.best_of_n_ties!r} and "
                            f"{other.best_of_n_ties!r}). Fix: bench both models with the same best_of_n_ties.")
        if other.checksum != self.checksum:
            raise DataError(f"the two results scored different pairs (checksums {self.checksum} and "
                            f"{other.checksum}); a paired comparison needs the same items. Fix: bench both models "
                            f"on the same pairs, e.g. bench(model, pairs, against=other_model).")
        n_boot, seed = n_boot or self.n_boot, self.seed if seed is None else seed
        level = self.level if level is None else level
        check_n_boot(n_boot, level)
        keep = self.counted & other.counted
        if not keep.any():
            raise NonFiniteError("the two models count no item in common (each item has a non-finite reward in one "
                                 "of them), so there is nothing to compare; check both models' weights, or load "
                                 "them in float32 (dtype='float32')", option="dtype")
        tie = keep & ties_mask(self.item_subsets, self.grouped)
        keep = keep & ~tie
        lay = layout(self.item_subsets, self.grouped, keep, self.weighting)
        ca, cb = self.correct[keep], other.correct[keep]
        ea, eb = scores(ca, lay), scores(cb, lay)
        keys = [k for k, v in ea.items() if np.isfinite(v)]
        draws = picks(lay, n_boot, seed)
        da, db = scores(ca, lay, draws), scores(cb, lay, draws)
        n = support(lay, keys)
        diff = [da[k] - db[k] for k in keys]
        ci = np.array([percentile_interval(d, m, level) for d, m in zip(diff, n)]).reshape(-1, 2)
        a, b = (np.array([float(e[k]) for k in keys]) for e in (ea, eb))
        p = sign_flip(ca - cb, coefficients(lay, keys), n, n_boot, seed)
        if tie.any():
            keys, n, a, b, ci, p = self._with_ties(other, tie, rb2_share(lay), (keys, n, a, b, ci, p),
                                                   (da, db), n_boot, seed, level)
        return BenchComparison((self.model, other.model), tuple(keys), n, a, b, a - b, ci[:, 0], ci[:, 1], p,
                               n_boot, seed, level)

    def _with_ties(self, other: Bench, tie: np.ndarray, share: float, rows: tuple[Any, ...],
                   lin: tuple[dict[Key, np.ndarray], dict[Key, np.ndarray]], n_boot: int, seed: int,
                   level: float) -> tuple[Any, ...]:
        """The comparison's rows with the Ties score added and joined into RewardBench 2: its
        difference's interval from paired bootstrap draws over prompts (the same draws for both
        models); no sign-flip p-value (NaN), as the Ties score is not a sum over items."""
        keys, n, a, b, ci, p = rows
        recs = [records(r.item_ids, r.reward, r.item_of_pair, tie) for r in (self, other)]
        parts = [draws(r, n_boot, seed) @ TIES_WEIGHTS for r in recs]  # same prompts drawn: paired
        est = [float(estimated(r) @ TIES_WEIGHTS) for r in recs]
        name = self.ties.subset if self.ties is not None else ""
        keys, n = [*keys, ("subset", name)], np.append(n, len(recs[0].tied))
        a, b = np.append(a, est[0]), np.append(b, est[1])
        ci = np.vstack([ci, percentile_interval(parts[0] - parts[1], len(recs[0].prompts), level)])
        p = np.append(p, np.nan)
        rb2 = ("score", RB2)
        if share > 0 and rb2 in keys:
            r = keys.index(rb2)
            a[r], b[r] = share * a[r] + (1 - share) * est[0], share * b[r] + (1 - share) * est[1]
            mixed = share * (lin[0][rb2] - lin[1][rb2]) + (1 - share) * (parts[0] - parts[1])
            ci[r] = percentile_interval(mixed, int(n[r]) + len(recs[0].tied), level)
            n[r], p[r] = n[r] + len(recs[0].tied), np.nan
        elif share == 0:
            keys, n = [*keys, rb2], np.append(n, len(recs[0].tied))
            a, b, p = np.append(a, est[0]), np.append(b, est[1]), np.append(p, np.nan)
            ci = np.vstack([ci, ci[-1]])
        return keys, n, a, b, ci, p

    def to_frame(self) -> pd.DataFrame:
        """One row per subset: subset, section, kind, n, correct, accuracy, ci_low, ci_high, weight."""
        import pandas as pd

        return pd.DataFrame([{"subset": s.subset, "section": s.section, "kind": s.kind, "n": s.n, "correct": s.correct,
                              "accuracy": s.accuracy, "ci_low": s.ci[0], "ci_high": s.ci[1], "weight": s.weight}
                             for s in self.subsets])

    def scores_frame(self) -> pd.DataFrame:
        """One row per score (subsets, sections, overall, RewardBench 2, all items): value, interval, n."""
        import pandas as pd

        return pd.DataFrame([{"level": k[0], "name": k[1], "value": v, "ci_low": self.intervals[k][0],
                              "ci_high": self.intervals[k][1], "n": self.support[k]}
                             for k, v in self.estimates.items()])

    def pair_frame(self) -> pd.DataFrame:
        """One row per pair: pair (its id), item, subset, chosen and rejected reward, margin, counted (its
        item is), then the pair's naming columns (`record_columns`: id, group and the record's other fields)."""
        import pandas as pd

        from ..data import chosen, rejected

        item = self.item_of_pair
        own = {"pair": self.pair_ids, "item": [self.item_ids[i] for i in item],
               "subset": [self.item_subsets[i] for i in item], "chosen": chosen(self.reward),
               "rejected": rejected(self.reward), "margin": self.margin, "counted": self.counted[item]}
        named = record_columns(self.pairs, self.pair_ids, taken=own)
        return pd.DataFrame({**own, **{k: v for k, v in named.items() if k not in own}})

    def item_frame(self) -> pd.DataFrame:
        """One row per item: its naming columns (`record_columns` of its first pair: id, subset, group and
        the record's other fields), then pairs (in the item), correct, counted."""
        import pandas as pd

        firsts = np.flatnonzero(np.r_[True, np.diff(self.item_of_pair) != 0])
        own = {"pairs": np.bincount(self.item_of_pair, minlength=len(self.item_ids)), "correct": self.correct,
               "counted": self.counted}
        named = record_columns([self.pairs[i] for i in firsts], self.item_ids, taken=own)
        return pd.DataFrame({**named, **own})

    def _items(self) -> list[dict[str, Any]]:
        """`to_dict`'s items: each item's `record_fields` (JSON), then pairs, correct, counted."""
        firsts = np.flatnonzero(np.r_[True, np.diff(self.item_of_pair) != 0]).tolist()
        sizes = np.bincount(self.item_of_pair, minlength=len(self.item_ids)).tolist()
        own = ("pairs", "correct", "counted")
        return [{**record_fields(self.pairs[f], iid, taken=own), "pairs": size, "correct": float(ok),
                 "counted": bool(kept)}
                for f, iid, size, ok, kept in zip(firsts, self.item_ids, sizes, self.correct.tolist(),
                                                  self.counted.tolist())]

    def to_dict(self) -> dict[str, Any]:
        """Every number as a JSON-ready dict (NaN becomes None)."""
        def entry(k: Key) -> dict[str, Any]:
            return {"value": self.estimates[k], "ci": list(self.intervals[k]), "n": int(self.support[k])}

        return json_ready({
            "model": self.model, "n_pairs": len(self.pair_ids), "n_items": len(self.item_ids),
            "checksum": self.checksum, "ties": RULES[self.best_of_n_ties], "best_of_n_ties": self.best_of_n_ties,
            "intervals": INTERVALS, "weighting": self.weighting,
            "counted_items": int(self.counted.sum()), "excluded": list(self.excluded), "saturated": self.saturated,
            "notes": list(self.notes),
            "subsets": [{"subset": s.subset, "section": s.section, "kind": s.kind, "n": s.n, "correct": s.correct,
                         "accuracy": s.accuracy, "ci": list(s.ci), "weight": s.weight} for s in self.subsets],
            "sections": {name: entry(("section", name)) for name in self.sections},
            "missing_sections": list(self.missing_sections),
            "overall": entry(("score", OVERALL)), "rewardbench2": entry(("score", RB2)),
            "accuracy": entry(("score", ALL_ITEMS)),
            "bootstrap": {"n_boot": self.n_boot, "seed": self.seed, "level": self.level},
            "ties_subset": None if self.ties is None else {**vars(self.ties), "rule": TIES_SCORE_RULE},
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "items": self._items(),
        })

    def plot(self, ax: Sequence[Axes] | None = None) -> Figure:
        """Per-subset accuracy with Wilson intervals (left, coloured by section) and the section,
        overall, RewardBench 2 and all-item scores with their intervals (right). `ax`: two axes (left,
        right) to draw into (their figure is returned), else a new figure."""
        from ..plotting import finish, panels

        axes, made = panels(ax, (1, 2), (11, 0.25 * max(len(self.subsets), 6) + 1.5), "Bench.plot")
        y = np.arange(len(self.subsets))[::-1]
        colours = {name: f"C{i}" for i, name in enumerate([*SECTIONS, RB2])}
        for yi, s in zip(y, self.subsets):
            err = np.nan_to_num([[s.accuracy - s.ci[0]], [s.ci[1] - s.accuracy]])
            axes[0].errorbar(s.accuracy, yi, xerr=err, fmt="o", capsize=2, color=colours.get(s.section or "", "gray"))
        axes[0].set_yticks(y, [f"{s.subset} (n={s.n})" for s in self.subsets], fontsize=7)
        axes[0].set(xlim=(-0.02, 1.02), xlabel="accuracy", title="subsets (Wilson 95% intervals)")
        keys = [k for k in self.estimates if k[0] != "subset" and np.isfinite(self.estimates[k])]
        v = np.array([self.estimates[k] for k in keys])
        lo, hi = (np.array([self.intervals[k][j] for k in keys]) for j in (0, 1))
        yk = np.arange(len(keys))[::-1]
        axes[1].errorbar(v, yk, xerr=np.nan_to_num([v - lo, hi - v]), fmt="o", capsize=2)
        axes[1].set_yticks(yk, [k[1] for k in keys], fontsize=8)
        axes[1].set(xlim=(-0.02, 1.02), xlabel="score", title="sections and scores")
        return finish(axes[0], made)

