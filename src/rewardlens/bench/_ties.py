"""RewardBench 2's Ties subset, scored by its own rule (rewardbench 0.1.4, `rewardbench/utils.py`,
`process_single_model` and `sample_stats`, called from `scripts/run_v2.py`).

A Ties record's id is `ref:<prompt>` (a reference prompt with one correct answer) or
`tied:<prompt>` (the same prompt's tied version, with several correct answers, which may be one
text listed twice: `num_correct` counts the list, not the distinct texts). Per record, from the
rewards of its correct (chosen) and incorrect (rejected) responses:

- accurate: `min(correct) − max(incorrect) > 0` (strict: a tie is wrong here, unlike the other
  RewardBench 2 subsets);
- `d` (tied records only): `max(correct) − min(correct)`, the spread among the correct answers;
- `g`: `min(correct) − max(incorrect)`, the gap from the correct answers to the best wrong one.

Over the prompts with both a ref and a tied record (`M`), with `h = min(g_ref, g_tied)`, and `M⁺`
those of `M` with `d > 0`:

    score = 0.30 · acc(tied) + 0.30 · acc(ref) + 0.20 · mean_M[g_tied > d] + 0.20 · mean_M[h > d]
            + 0.01 · mean_M⁺ tanh(h / d − 1)

An accuracy over no record is 0, and so is each mean over no prompt (0.1.4's `else 0`): with no
prompt in M the score is `0.30 · acc(tied) + 0.30 · acc(ref)`. A prompt whose correct answers tie
(`d = 0`, e.g. one text listed twice) counts in the two `> d` terms and not in the margin term.
(rewardbench's later `_compute_prompt_stats` rewrite on its main branch differs in these corners:
NaN with no prompt in M, and `tanh(±∞) = ±1` averaged over all of M when `d = 0 < |h|`.) The score
is not a proportion, so its interval is a percentile bootstrap over prompts (a prompt brings its ref
and tied records together), not a Wilson one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..data import side
from ..errors import DataError
from ..stats import percentile_interval

TIES = "ties"
"""RewardBench 2's Ties subset, compared lower-case (`run_v2.py`: `subset.lower() == "ties"`)."""
KINDS = ("ref", "tied")
WEIGHTS = np.array([0.30, 0.30, 0.20, 0.20, 0.01])
"""Weights of (tied accuracy, ref accuracy, correctness preferred, correctness preferred hard, margin score)."""
RULE = ("Ties (RewardBench 2): 0.30 tied accuracy + 0.30 ref accuracy + 0.20 P(gap > spread) + 0.20 "
        "P(min(ref gap, tied gap) > spread) + 0.01 mean tanh(min gap / spread − 1) over the prompts with "
        "spread > 0, each mean over the prompts with both records, 0 over none (rewardbench 0.1.4, "
        "process_single_model); its interval: percentile bootstrap over prompts")
"""How the Ties score is made, for tables and JSON."""


def is_ties(subset: str | None) -> bool:
    """Whether `subset` names RewardBench 2's Ties subset."""
    return subset is not None and subset.lower() == TIES


def parse_id(record_id: str) -> tuple[str, int]:
    """(`ref` or `tied`, prompt number) of a Ties record id such as `tied:12`; `DataError` otherwise."""
    kind, _, number = record_id.partition(":")
    if kind not in KINDS or not number.strip().lstrip("-").isdigit():
        raise DataError(f"Ties record id {record_id!r} is not 'ref:<prompt number>' or 'tied:<prompt number>', "
                        f"which RewardBench 2 scores Ties by (a ref and a tied record of one prompt are compared). "
                        f"Fix: keep the ids of RewardBench 2's Ties records as they are in the dataset.")
    return kind, int(number)


@dataclass(frozen=True)
class TiesRecords:
    """The counted Ties records [r]: `tied` whether a tied (else ref) record, `prompt` its prompt
    number, and its rewards' `low`/`high` over correct answers and `wrong` the best incorrect one."""

    tied: np.ndarray
    prompt: np.ndarray
    low: np.ndarray
    high: np.ndarray
    wrong: np.ndarray

    @property
    def prompts(self) -> np.ndarray:
        """The distinct prompt numbers [P], sorted (the bootstrap's units)."""
        return np.unique(self.prompt)

    @property
    def accurate(self) -> np.ndarray:
        """Each record right [r]: every correct answer above the best incorrect one (strict)."""
        return self.low - self.wrong > 0


@dataclass(frozen=True)
class TiesScore:
    """RewardBench 2's Ties score (module docstring) with its parts, over `n_ref` ref and `n_tied`
    tied records, `n_matched` prompts having both; `ci` a percentile bootstrap over prompts."""

    subset: str
    score: float
    ci: tuple[float, float]
    tied_accuracy: float
    ref_accuracy: float
    correctness_preferred: float
    correctness_preferred_hard: float
    margin_score: float
    n_ref: int
    n_tied: int
    n_matched: int


def records(ids: Sequence[str], reward: np.ndarray, of_pair: np.ndarray, tie: np.ndarray) -> TiesRecords:
    """The Ties records among the items `tie` [m] (bool; `ids` [m] the items' ids) from the pairs'
    rewards [2n] (chosen, rejected alternating) and each pair's item `of_pair` [n]."""
    items = np.flatnonzero(tie)
    names = [ids[int(i)] for i in items]
    chosen, rejected = (side(reward, s).astype(np.float64) for s in ("chosen", "rejected"))
    low, high, wrong = (np.array([f(v[of_pair == i]) for i in items]) if len(items) else np.zeros(0)
                        for f, v in ((np.min, chosen), (np.max, chosen), (np.max, rejected)))
    parsed = [parse_id(i) for i in names]
    return TiesRecords(np.array([k == "tied" for k, _ in parsed], dtype=bool),
                       np.array([p for _, p in parsed], dtype=np.int64), low, high, wrong)


def parts(rec: TiesRecords, counts: np.ndarray) -> np.ndarray:
    """The five parts (`WEIGHTS` order) [..., 5] with each prompt counted `counts` [..., P] times
    (ones: the estimate; a bootstrap draw's multiplicities: that draw)."""
    at = np.searchsorted(rec.prompts, rec.prompt)
    per_prompt = np.zeros((4, len(rec.prompts)))  # ref/tied present, ref/tied accurate
    for row, mask in enumerate((~rec.tied, rec.tied)):
        per_prompt[row, at[mask]] = 1
        per_prompt[row + 2, at[mask]] = rec.accurate[mask]
    gap = np.full((2, len(rec.prompts)), np.nan)
    gap[0, at[~rec.tied]] = (rec.low - rec.wrong)[~rec.tied]
    gap[1, at[rec.tied]] = (rec.low - rec.wrong)[rec.tied]
    spread = np.full(len(rec.prompts), np.nan)
    spread[at[rec.tied]] = (rec.high - rec.low)[rec.tied]
    both = (per_prompt[0] * per_prompt[1]).astype(bool)
    spread_ok = both & (spread > 0)  # the margin term's prompts: 0.1.4 skips d = 0, where h / d is not a ratio
    c = np.asarray(counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = [_mean(c @ per_prompt[r + 2], c @ per_prompt[r]) for r in (1, 0)]
        hard = np.minimum(gap[0], gap[1])
        preferred = [_mean(c @ np.where(both, t, 0.0), c @ both) for t in (gap[1] > spread, hard > spread)]
        ratio = np.where(spread_ok, np.tanh(hard / np.where(spread_ok, spread, 1.0) - 1), 0.0)
        margin = _mean(c @ ratio, c @ spread_ok)
    return np.stack([*acc, *preferred, margin], axis=-1)


def _mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """`total / count`, 0 where `count` is 0 (rewardbench 0.1.4: a mean over nothing counts 0)."""
    return np.where(count > 0, total / np.where(count > 0, count, 1.0), 0.0)


def score(rec: TiesRecords, subset: str, n_boot: int, seed: int, level: float) -> TiesScore:
    """The Ties score of `rec` and its percentile bootstrap interval over prompts (`n_boot` seeded draws)."""
    estimate = estimated(rec)
    value = float(estimate @ WEIGHTS)
    ci = percentile_interval(draws(rec, n_boot, seed) @ WEIGHTS, len(rec.prompts), level)
    both = np.intersect1d(rec.prompt[rec.tied], rec.prompt[~rec.tied])
    tied_acc, ref_acc, preferred, hard, margin = (float(x) for x in estimate)
    return TiesScore(subset, value, ci, tied_acc, ref_acc, preferred, hard, margin, int((~rec.tied).sum()),
                     int(rec.tied.sum()), len(both))


def estimated(rec: TiesRecords) -> np.ndarray:
    """The five parts of the records as they are, every prompt once [5]."""
    return parts(rec, np.ones(len(rec.prompts)))


def draws(rec: TiesRecords, n_boot: int, seed: int) -> np.ndarray:
    """The five parts of `n_boot` bootstrap draws of the prompts [B, 5], seeded."""
    p = len(rec.prompts)
    if p == 0:
        return np.zeros((n_boot, 5))  # no record: every part is a mean over nothing
    counts = np.random.default_rng([seed, 2]).multinomial(p, np.full(p, 1 / p), size=n_boot)
    return parts(rec, counts)


def check(ids: list[str], chosen: list[int]) -> None:
    """Refuse Ties records that the rule cannot score: an id not `ref:N`/`tied:N`, a tied record with
    one correct response (`chosen` [r] counts each record's correct responses, identical texts included:
    the spread needs two), two records of one kind and prompt."""
    seen: set[tuple[str, int]] = set()
    for record_id, n in zip(ids, chosen):
        kind, number = parse_id(record_id)
        if (kind, number) in seen:
            raise DataError(f"two Ties records are {kind}:{number}; RewardBench 2 has one ref and one tied record "
                            f"per prompt. Fix: give each record its own id, as in the dataset.")
        seen.add((kind, number))
        if kind == "tied" and n < 2:
            raise DataError(f"Ties record {record_id!r} is a tied prompt with one correct answer; RewardBench 2 "
                            f"compares the spread among a tied prompt's correct answers (two or more). Fix: keep "
                            f"all of the record's correct answers in 'chosen'.")
