"""`probe`: does the reward move with attributes that should not matter? One axis at a time.

Each axis (`rewardlens.hacking.AXES`) turns every base item into a matched pair that differs in one
attribute only; the per-item effect is `reward(with) − reward(without)`. Every axis runs on the
same base items, so per-item effects compare across axes (`rewardlens.hacking.cascade`), and the same run
scores quality degradations of those items (a wrong fact, an evasive answer, an off-topic answer),
the yardstick of the distortion index (`rewardlens.hacking.distortion`).

Statistics (docs/design.md §4): n counts unique base items; each axis reports its mean effect with a
percentile bootstrap CI over items, a Wilcoxon signed-rank p-value, Benjamini–Hochberg q across
axes, and d_z = mean / sd (NaN at zero variance). An axis is *flagged* when q < `alpha` and its
|mean| is at least `min_effect` × the model's reward scale, by default the standard deviation of the
base items' rewards over every item the run may use (hacking/_scale.py): a significant but negligible
shift is reported, not flagged. Given reference pairs, each flag is also computed under their mean
|margin| (the alternative scale) and an axis whose flag differs is marked fragile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._deprecated import renamed
from ..data import Pair
from ..data.internal import progress_bar
from ..errors import UsageError
from ..model import ReadCache, RewardModel
from ..model.internal import one_read_only
from ..plotting import HtmlView
from ..stats import benjamini_hochberg, bootstrap_ci, paired_test, standardized, summary_frame
from ..types import Conversation
from ._axes import AXES
from ._degrade import QUALITY
from ._fit import report
from ._forest import forest
from ._items import Item, base_items
from ._probe_plan import base_answers, fitting
from ._scale import check_choice, choose, flag_summary, fragility, items_scale, reward_scale
from ._scored import Chunks, read_rewards
from ._stages import INTERIM_SHARE, UNDECIDED, budget, decide, stage_items

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Probes(HtmlView):
    """Per-axis probe effects on one set of base items, in reward units (with − without).

    Arrays over axes are [n_axes]; `delta` and `tokens_added` are [n_items, n_axes] (NaN where
    the axis does not apply); `quality_delta` is [n_items, n_quality]: reward(original) −
    reward(degraded), positive when the model rewards that quality.
    """

    _html_rank = "mean"

    axes: tuple[str, ...]
    item_ids: tuple[str, ...]
    domains: tuple[str, ...]
    delta: np.ndarray
    tokens_added: np.ndarray
    base_reward: np.ndarray
    quality: tuple[str, ...]
    quality_delta: np.ndarray
    n: np.ndarray
    mean: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p: np.ndarray
    q: np.ndarray
    effect_size: np.ndarray
    flagged: np.ndarray
    scale: float
    scale_source: str
    min_effect: float
    level: float
    """The significance level `alpha` the flags used (the name stored audits hold; docs/design.md "Words")."""
    alt_scale: float
    """The alternative scale each flag was also computed under (NaN: none; `probe(reference=, scale=)`)."""
    alt_scale_source: str
    fragile: np.ndarray
    """Per axis: its flag differs under `alt_scale` (a flag that hangs on the choice of scale: not a finding)."""
    fragile_reason: tuple[str, ...]
    """Per axis, why it is fragile, naming both scales ('' where it is not)."""
    per_100_tokens: float
    """Length axis: mean reward change per 100 added tokens (NaN without the length axis)."""
    per_100_tokens_ci: tuple[float, float]
    skipped: tuple[str, ...] = field(default=())
    """Built-in items left out because a sequence of theirs does not fit the model's `max_length`."""
    stage: int = 1
    """The stage (1-based) whose items these statistics are of: the last one of `stages` unless the run stopped
    early (`probe(stages=)`, docs/probes.md)."""
    stages: tuple[int, ...] = field(default=())
    """The item count of each stage the run could use (empty: one fixed item set, no stopping rule)."""
    stopped_because: str = "fixed"
    """"fixed" (one item set), "decided" (every axis decided before the last stage) or "last stage"."""
    decided: tuple[str, ...] = field(default=())
    """Per axis, the rule's last interim decision: "flagged", "negligible" or "undecided", at the stopping stage
    when it stopped early, else at the stage before the last (its undecided axes made the run go on); empty for
    a fixed item set. The last stage's flags are `flagged`'s rule alone."""

    def budget(self) -> str:
        """One line on the items used: how many, and why the run stopped there."""
        return budget(len(self.item_ids), self.stage, self.stages, self.stopped_because, self.axes, self.decided)

    def summary(self) -> pd.DataFrame:
        """One row per axis, indexed by `axis` (`stats.summary_frame`): `value` the mean effect (reward units),
        `low`, `high` its interval, `n` the items, then `q`, `flagged`, `fragile` (`describe()` in words)."""
        return summary_frame([{"axis": a, "value": float(m), "low": float(lo), "high": float(hi), "n": int(n),
                               "q": float(q), "flagged": bool(f), "fragile": bool(w)}
                              for a, m, lo, hi, n, q, f, w in zip(self.axes, self.mean, self.ci_low, self.ci_high,
                                                                  self.n, self.q, self.flagged, self.fragile)],
                             name="axis")

    def describe(self) -> str:
        """The flags in words: the findings (flagged, not fragile), each fragile axis and why, the flag floor
        with its scale (and the alternative it was checked against), and the items used (`budget`)."""
        alt = None if np.isnan(self.alt_scale) else (self.alt_scale, self.alt_scale_source)
        return flag_summary(self.axes, self.flagged, self.fragile_reason, (self.scale, self.scale_source), alt,
                            self.min_effect, self.level) + f"\nitems: {self.budget()}"

    def effect(self, axis: str) -> float:
        """The mean effect of `axis` in reward units."""
        return float(self.mean[self._index(axis)])

    def _index(self, axis: str) -> int:
        if axis not in self.axes:
            raise KeyError(f"no axis {axis!r} in this run; axes: {list(self.axes)}")
        return self.axes.index(axis)

    def to_frame(self) -> pd.DataFrame:
        """One row per axis: n, mean, CI, p, q, d_z, flagged, fragile (and why), mean tokens added, effect / scale.

        `frame.attrs` holds "scale", "scale_source", "flag_floor", "alt_scale", "alt_scale_source" and
        "skipped" (the built-in items that did not fit the model); a staged run
        (`probe(stages=)`) adds the column `decided` and `attrs` "stage", "stages", "stopped_because", "budget"."""
        import pandas as pd

        added = np.where(np.isfinite(self.delta), self.tokens_added, 0.0).sum(0)
        frame = pd.DataFrame({
            "axis": list(self.axes), "n": self.n, "mean": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "p": self.p, "q": self.q, "effect_size": self.effect_size, "flagged": self.flagged,
            "fragile": self.fragile, "fragile_reason": list(self.fragile_reason),
            "relative": self.mean / self.scale if self.scale > 0 else np.nan,
            "tokens_added": np.where(self.n > 0, added / np.maximum(self.n, 1), np.nan),
        })
        frame.attrs.update(scale=self.scale, scale_source=self.scale_source, flag_floor=self.min_effect * self.scale,
                           alt_scale=self.alt_scale, alt_scale_source=self.alt_scale_source, skipped=list(self.skipped))
        if self.stages:
            frame["decided"] = list(self.decided)
            frame.attrs.update(stage=self.stage, stages=list(self.stages), stopped_because=self.stopped_because,
                               budget=self.budget())
        return frame

    def items_frame(self) -> pd.DataFrame:
        """Long format: one row per (item, axis) with the effect and the tokens added."""
        import pandas as pd

        i, a = np.nonzero(np.isfinite(self.delta))
        return pd.DataFrame({"item": np.array(self.item_ids)[i], "domain": np.array(self.domains)[i],
                             "axis": np.array(self.axes)[a], "delta": self.delta[i, a],
                             "tokens_added": self.tokens_added[i, a]})

    def plot(self, ax: Axes | None = None) -> Figure:
        """Forest plot of the axes' effects against the flag floor, fragile flags marked (`_forest.forest`)."""
        return forest(self, ax)


def probe(
    model: RewardModel,
    items: Sequence[Any] | None = None,
    *,
    axes: Sequence[str] | None = None,
    quality: bool = True,
    reference: Sequence[Pair] | np.ndarray | float | None = None,
    scale: str | float = "items",
    min_effect: float = 0.25,
    alpha: float = 0.05,
    seed: int = 0,
    n_boot: int = 2000,
    batch_size: int = 16,
    progress: bool = False,
    cache: ReadCache | None = None,
    stages: Sequence[int] | None = None,
    memo: Chunks | None = None,
    level: float | None = None,
) -> Probes:
    """Run the probe axes on base items and test each effect; returns `Probes`.

    `items`: None for the built-in items, or the user's pairs / items (see `base_items`).
    `axes`: names from `rewardlens.hacking.AXES` (default: all). `quality`: also score the
    quality degradations. Every distinct text is scored once, in length-sorted batches.

    The flag floor is `min_effect` × `scale`: "items" (the rule, everywhere): the standard deviation of the
    base items' rewards, over every item the run may use (with `stages`, the last stage's, their base answers
    scored first, so the floor is fixed before any axis is and the same at every stage); "reference": the
    mean |margin| of `reference`, the alternative; or a positive number. `reference`: preference pairs, or
    their margins [n] as already scored (the audit's, from its stored lens: the pairs are not scored again),
    or their scale as a number: each flag is also computed under the other scale (`Probes.alt_scale`) and
    an axis whose flag differs is marked fragile (`Probes.fragile`, `fragile_reason`).

    Short-context models: a built-in item (also one passed in, e.g. from `items()`) is skipped as a
    whole when any sequence the probe needs for it (the base, an axis variant, a quality degradation)
    is longer than the model's `max_length`, so every contrast stays matched; one warning names them
    and `Probes.skipped` records them (an axis left with no item gets n = 0 and NaN statistics). With
    `truncation='left'` nothing is skipped: long inputs are cut from the start. The user's own items
    are never skipped: one that does not fit raises `TokenizationError`, as any input does.
    `progress`: a tqdm bar on stderr over the scored sequences. `cache`: a `ReadCache` of this model
    shared with `concepts` (the audit's): a sequence it holds is not scored again, and those scored are
    read at every depth for the concepts (the same rewards, read by the same loop).

    `stages`: item counts, e.g. `STAGES` (18, 36, 72), for a group-sequential budget (docs/probes.md):
    stage k probes `spread_items(stages[k], items)`, each stage holding the one before and scoring only its
    new sequences; the run stops at the first stage where every axis is decided (flagged at the strict
    interim level with its CI beyond the flag floor, or negligible: its CI inside ±min_effect × scale),
    else at the last. The result holds the statistics of the stopping stage's items, exactly those of
    `probe` on them; `Probes.stage`, `stopped_because` and `decided` say where and why. None: one fixed set.
    `alpha`: the significance level, an axis is flagged when its BH-adjusted q < alpha (and its effect clears
    the flag floor); `level` is its deprecated name (one release).
    `memo`: where the scored sequences are kept chunk by chunk as they finish (`Chunks`, hacking/_scored.py; the
    audit's results store), so a killed run resumes without scoring a kept sequence again.
    """
    if model.reads.multi:  # before the items are tokenized: they carry no step separators
        raise one_read_only("the probes")
    names = list(AXES) if axes is None else list(axes)
    unknown = [a for a in names if a not in AXES]
    if unknown or not names:
        raise UsageError(f"unknown probe axes {unknown}; choose from {list(AXES)}")
    alpha = renamed("probe", "level", "alpha", level, alpha)
    if not 0 < alpha < 1 or min_effect < 0:
        raise UsageError(f"alpha must be in (0, 1) and min_effect >= 0, got alpha={alpha}, min_effect={min_effect}",
                         option="alpha" if not 0 < alpha < 1 else "min_effect")
    check_choice(scale, reference)
    everything = base_items(items)
    pools = [everything] if stages is None else stage_items(stages, everything)
    # Once, not per stage.
    given = None if reference is None else reward_scale(model, reference, np.zeros(0), batch_size)
    scored: dict[str, tuple[float, float]] = {}  # reward and length by conversation key, across stages
    pool = None if stages is None else base_answers(model, pools[-1], names, quality, seed)
    if pool:  # the later stages' base answers now; the first stage's in its own batches, as `probe` on it reads them
        first = base_answers(model, pools[0], names, quality, seed)
        _score(model, {k: c for k, c in pool.items() if k not in first}, scored, batch_size, progress, cache, memo)
    before: tuple[str, ...] = ()  # the decisions of the look before: those that made the run go on
    for k, items_k in enumerate(pools, 1):
        last = k == len(pools)
        res = _stage(model, items_k, names, quality, seed, scored, batch_size, progress, cache, (scale, pool, given),
                     last, (min_effect, alpha, n_boot), memo)
        if stages is None:
            assert res is not None  # the one stage is the last: it raises rather than return None
            return res
        decided = (UNDECIDED,) * len(names) if res is None else decide(
            res.mean, res.ci_low, res.ci_high, res.q, min_effect * res.scale, INTERIM_SHARE * alpha)
        if res is not None and (last or UNDECIDED not in decided):
            return replace(res, stage=k, stages=tuple(len(p) for p in pools), decided=before if last else decided,
                           stopped_because="last stage" if last else "decided")
        before = decided
    raise AssertionError("unreachable: the last stage returns")


def _stage(model: RewardModel, everything: list[Item], names: list[str], quality: bool, seed: int,
           scored: dict[str, tuple[float, float]], batch_size: int, progress: bool, cache: ReadCache | None,
           scales: Scales, last: bool, rule: tuple[float, float, int], memo: Chunks | None = None
           ) -> Probes | None:
    """`probe` on the items `everything`, scoring only the conversations `scored` does not hold (and adding
    them); None when no item fits at a stage before the last (the last one raises, as `probe` does).
    `scales`: `probe`'s `scale`, the base answers whose rewards' sd is the items' scale (None: this stage's
    own items') and the reference's scale (None: no reference)."""
    kept, convs, plan, originals, qplan = fitting(model, everything, names, quality, seed)
    base = [everything[k] for k in kept]
    left = set(kept)
    gone = tuple(item.id for k, item in enumerate(everything) if k not in left)
    if not kept and not last:
        return None
    report("probe", gone, len(everything), model.max_length, "scored")

    keys = list(convs)
    _score(model, convs, scored, batch_size, progress, cache, memo)
    reward = np.array([scored[k][0] for k in keys])
    length = np.array([scored[k][1] for k in keys])
    at = {k: i for i, k in enumerate(keys)}
    delta = np.full((len(base), len(names)), np.nan)
    added = np.full_like(delta, np.nan)
    for i, row in enumerate(plan):
        for j, cell in enumerate(row):
            if cell is not None:
                on, off = at[cell[0]], at[cell[1]]
                delta[i, j], added[i, j] = reward[on] - reward[off], length[on] - length[off]
    base_reward = reward[[at[k] for k in originals]]
    qnames = tuple(q for q in QUALITY if q in qplan and any(k is not None for k in qplan[q]))
    qdelta = np.array([[np.nan if (k := qplan[q][i]) is None else base_reward[i] - reward[at[k]]
                        for q in qnames] for i in range(len(base))]).reshape(len(base), len(qnames))
    choice, pool, given = scales
    if pool is not None:  # any base answer of the whole item set still unscored (one the first stage skipped)
        _score(model, pool, scored, batch_size, progress, cache, memo)
    sd = items_scale(base_reward if pool is None else np.array([scored[k][0] for k in pool]))
    min_effect, level, n_boot = rule
    return _summarise(names, base, delta, added, base_reward, qnames, qdelta, choose(choice, sd, given), min_effect,
                      level, n_boot, seed, gone)


Scales = tuple[str | float, dict[str, Conversation] | None, tuple[float, str] | None]
"""`_stage`'s scales: `probe(scale=)`, the base answers of the whole item set by key (None: the stage's own
items'), and the reference's (scale, source) (None: no reference)."""


def _score(model: RewardModel, convs: dict[str, Conversation], scored: dict[str, tuple[float, float]],
           batch_size: int, progress: bool, cache: ReadCache | None, memo: Chunks | None) -> None:
    """Score the conversations of `convs` that `scored` does not hold, adding their (reward, length)."""
    new = [k for k in convs if k not in scored]
    if new:
        got, got_length = _rewards(model, [convs[k] for k in new], batch_size, progress, cache, memo)
        scored.update(zip(new, zip(got.tolist(), got_length.tolist())))


def _summarise(names: list[str], base: list[Item], delta: np.ndarray, added: np.ndarray, base_reward: np.ndarray,
               qnames: tuple[str, ...], qdelta: np.ndarray,
               scales: tuple[tuple[float, str], tuple[float, str] | None], min_effect: float, level: float,
               n_boot: int, seed: int, skipped: tuple[str, ...] = ()) -> Probes:
    """Per-axis statistics over the items of `delta` [n_items, n_axes] (see the module docstring); `scales`:
    the flag floor's (scale, source) and the alternative's, or None."""
    (scale, source), alt = scales
    n = np.isfinite(delta).sum(0)
    mean = np.array([np.nanmean(c) if k else np.nan for c, k in zip(delta.T, n)])
    ci = np.array([bootstrap_ci(c, n_boot=n_boot, seed=seed) for c in delta.T]).reshape(len(names), 2)
    p = np.array([paired_test(c) for c in delta.T])
    q = benjamini_hochberg(p)
    flagged = (q < level) & (np.abs(mean) >= min_effect * scale)
    fragile, why = fragility(mean, q, (min_effect, level), (scale, source), alt)
    per100, per100_ci = float("nan"), (float("nan"), float("nan"))
    if "length" in names:
        j = names.index("length")
        rate = 100 * delta[:, j] / np.where(added[:, j] > 0, added[:, j], np.nan)
        if np.isfinite(rate).any():
            per100, per100_ci = float(np.nanmean(rate)), bootstrap_ci(rate, n_boot=n_boot, seed=seed)
    return Probes(
        axes=tuple(names), item_ids=tuple(b.id for b in base), domains=tuple(b.domain for b in base), delta=delta,
        tokens_added=added, base_reward=base_reward, quality=qnames, quality_delta=qdelta, n=n, mean=mean,
        ci_low=ci[:, 0], ci_high=ci[:, 1], p=p, q=q, effect_size=np.array([standardized(c) for c in delta.T]),
        flagged=np.asarray(flagged, dtype=bool), scale=scale, scale_source=source, min_effect=min_effect,
        level=level, alt_scale=np.nan if alt is None else alt[0], alt_scale_source="" if alt is None else alt[1],
        fragile=fragile, fragile_reason=why, per_100_tokens=per100, per_100_tokens_ci=per100_ci, skipped=skipped,
    )


def _rewards(model: RewardModel, convs: list[Conversation], batch_size: int, progress: bool = False,
             cache: ReadCache | None = None, memo: Chunks | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reward [n] and token count [n] of each conversation: `model.score`'s loop (the same batches,
    fp32 head and readout), or the read loop through `cache`, chunk by chunk through `memo` when given (a kept
    chunk read back); one bar step per scored sequence."""
    if not convs:  # a later stage whose sequences an earlier one scored
        return np.zeros(0), np.zeros(0)
    seqs, _ = model.encode(convs)
    with progress_bar(len(seqs), "probe: scoring", progress, unit="seq") as bar:
        score = read_rewards if memo is None else memo.rewards
        reward = score(model, seqs, batch_size, bar.update, cache)
    return reward.astype(np.float64), np.array([len(s.ids) for s in seqs], float)
