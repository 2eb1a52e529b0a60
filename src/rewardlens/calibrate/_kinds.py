"""Graders on the organisms of other reward-model kinds: a process reward model and a DPO policy.

Their truth is planted as the circuit organism's: one head is the only part that trained, and
the step (PRM) or token (DPO) where each pair's preference forms is known from the text. The
organisms are graded on their own forward (held-out accuracy, ablating the planted part) and
the instruments on it: exact attribution closes per read and per sequence and ranks the planted
part first; patching at the set of reads ranks it first; the reward lens crystallizes after the
planted layer; the per-read decomposition (`att.steps`) puts the largest chosen-vs-rejected gap at
the hedged step or at the keyword.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
from torch import nn

from ..causal import patch
from ..data import Pair
from ..data.internal import rows_of
from ..errors import UsageError
from ..exact import attribute, lens
from ..model import Part, RewardModel
from ..types import Level
from ..zoo.organisms import (
    KIND_ORGANISMS as KINDS,
)
from ..zoo.organisms import (
    PolicyOrganism,
    StepOrganism,
    ablated,
    build,
    implicit_rewards,
    open_kind,
    prm_accuracy,
    step_scores,
)
from ..zoo.organisms.internal import READY, organism_dir
from ._core import ACCURACY, STRENGTHS, Grade, OrganismBench, localisation, sublayer_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CLOSURE = 1e-4
"""Largest |reward − (Σ parts + constant)| an exact decomposition may leave (float32 sums)."""
ABLATED_SHARE = 0.05
"""Largest |mean margin| left, as a share of the full one, with the planted part ablated."""


class KindBench(OrganismBench):
    """A `OrganismBench` that also holds organisms of `KINDS` (`kinds`, default all), built on demand and
    opened as their record says (`open_kind`), with held-out pairs `spec.pairs(n_pairs, seed + 1)`."""

    def __init__(self, *, kinds: Sequence[str] | None = None, seed: int = 0, n_pairs: int = 100,
                 strengths: Sequence[float] = STRENGTHS, organisms: Sequence[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        super().__init__(seed=seed, n_pairs=n_pairs, strengths=strengths, organisms=organisms, progress=progress)
        unknown = sorted(set(kinds or ()) - set(KINDS))
        if unknown:
            raise UsageError(f"no PRM or DPO organism named {unknown}; choose from {sorted(KINDS)}")
        self.kinds = tuple(kinds) if kinds is not None else tuple(KINDS)
        self._kind_models: dict[str, RewardModel] = {}
        self._kind_pairs: dict[str, list[Pair]] = {}

    def kind_model(self, name: str) -> RewardModel:
        if name not in self._kind_models:
            if not (organism_dir(name, 1.0, self.seed) / READY).exists():
                self.progress(f"training organism {name!r} (seed {self.seed}) ...")
            self._kind_models[name] = open_kind(build(name, seed=self.seed))
        return self._kind_models[name]

    def kind_pairs(self, name: str) -> list[Pair]:
        if name not in self._kind_pairs:
            self._kind_pairs[name] = KINDS[name].pairs(self.n_pairs, seed=self.seed + 1)
        return self._kind_pairs[name]


def kind_bench(bench: OrganismBench) -> KindBench:
    """`bench` itself when it holds kinds; for a plain `OrganismBench`, one with its settings and every kind
    (a grader of these organisms called on its own grades them all)."""
    if isinstance(bench, KindBench):
        return bench
    return KindBench(seed=bench.seed, n_pairs=bench.n_pairs, strengths=bench.strengths, organisms=bench.organisms,
                     progress=bench.progress)


def _kinds(bench: OrganismBench, kind: type) -> list[tuple[KindBench, str]]:
    kb = kind_bench(bench)
    return [(kb, name) for name in kb.kinds if isinstance(KINDS[name], kind)]


def _closure(name: str, model: RewardModel, pairs: list[Pair]) -> list[Grade]:
    """Exactness per sequence, of the fold of the reads into the sequence (Σ_k α_k r_k) and, where the
    reads keep their parts (a PRM's steps; a DPO reward's tokens do not), per read."""
    att = attribute(model, pairs[:20])
    steps = att.steps
    assert steps is not None  # multi-read models report their reads
    folded = np.bincount(steps.sequence, steps.weight * steps.reward, minlength=len(att.reward))
    rows = [Grade.of("attribution", name, "max |reward - (sum of parts + constant)|",
                     float(np.abs(att.residual_error).max()), CLOSURE, "<="),
            Grade.of("attribution", name, "max |reward - sum of weighted read rewards|",
                     float(np.abs(folded - att.reward).max()), CLOSURE, "<=")]
    if steps.values is not None:
        per_read = np.abs(steps.values.sum(-1) + steps.constant - steps.reward).max()
        rows.append(Grade.of("attribution", name, "max |read reward - (sum of parts + constant)| over reads",
                             float(per_read), CLOSURE, "<="))
    return rows


def _localised(name: str, model: RewardModel, pairs: list[Pair], part: str,
               drop_embed: bool = False) -> list[Grade]:
    """Attribution (mean margin) and read-set noising (mean effect) rank `part` first at sublayer
    and head level. `drop_embed`: rank patching among the other parts, because noising the embedding
    at every read of a DPO reward swaps the whole response, i.e. is the input itself, not a mechanism."""
    rows: list[Grade] = []
    targets: list[tuple[Level, str]] = [("sublayer", sublayer_of(part)), ("head", part)]
    for level, target in targets:
        att = attribute(model, pairs, level=level)
        rows += localisation("attribution", name, att.names, att.margin.mean(0), target, level)
        result = patch(model, pairs[:40], level=level)
        names, effect = list(result.names), result.effect.mean(0)
        by = "mean noising effect"
        if drop_embed:
            keep = [i for i, n in enumerate(names) if n != "embed"]
            names, effect, by = [names[i] for i in keep], effect[keep], "mean noising effect, embedding aside"
        rows += localisation("patching", name, names, effect, target, level, by=by)
    return rows


def _crystallizes(name: str, model: RewardModel, pairs: list[Pair], part: str) -> Grade:
    """The reward lens: with the rule planted in layer l, the margin crystallizes after layer l."""
    depth = np.nanmedian(lens(model, pairs).crystallization("linear", 0.5))
    return Grade.of("lens", name, "median crystallization depth (linear, fraction 0.5)", float(depth),
                    (Part.parse(part).layer + 1) / model.n_layers, "==")


def _gap_at(att_steps_reward: np.ndarray, seq: np.ndarray, i: int) -> np.ndarray:
    """Per read of pair `i`: chosen's read reward − rejected's (reads k to k; equal counts). Signed: the
    preference forms where the chosen side's read is most above the rejected side's."""
    chosen, rejected = (att_steps_reward[seq == row] for row in rows_of(i))
    if len(chosen) != len(rejected):
        raise UsageError(f"pair {i} has {len(chosen)} reads on the chosen side and {len(rejected)} on the rejected")
    return chosen - rejected


def _min_margin(model: nn.Module, tokenizer: PreTrainedTokenizerBase, pairs: list[Pair]) -> float:
    """Mean over pairs of min-over-steps chosen − rejected, from the model's own forward."""
    s = step_scores(model, tokenizer, [(str(p.prompt), t) for p in pairs for t in (p.chosen, p.rejected)])
    return float(np.mean([s[i].min() - s[i + 1].min() for i in range(0, len(s), 2)]))


def grade_prm(bench: OrganismBench) -> list[Grade]:
    """The PRM organism: step and pair accuracy on its own forward, the margin gone with the planted
    head ablated, exact attribution per sequence and per step, the planted head ranked first by
    attribution and by patching, the lens crystallizing after its layer, and the step where the
    chosen side's score is most above the rejected side's (the attribution's per-step rewards, step k
    against step k) is the hedged one."""
    rows: list[Grade] = []
    for kb, name in _kinds(bench, StepOrganism):
        spec, model, pairs = cast(StepOrganism, KINDS[name]), kb.kind_model(name), kb.kind_pairs(name)
        acc = prm_accuracy(model.model, model.tokenizer, pairs)
        rows += [Grade.of("organism", name, "held-out pair accuracy (min over steps)", acc["pair"], ACCURACY),
                 Grade.of("organism", name, "held-out step accuracy (both sides)", acc["step"], ACCURACY)]
        cut = _min_margin(ablated(model.model, spec.planted_part), model.tokenizer, pairs)
        share = abs(cut / _min_margin(model.model, model.tokenizer, pairs))
        rows.append(Grade.of("organism", name, f"|mean margin| left with {spec.planted_part} ablated, as a share",
                             share, ABLATED_SHARE, "<="))
        rows += _closure(name, model, pairs)
        rows += _localised(name, model, pairs, spec.planted_part)
        rows.append(_crystallizes(name, model, pairs, spec.planted_part))
        att = attribute(model, pairs)
        assert att.steps is not None  # a PRM reads every step
        hit = [int(np.argmax(_gap_at(att.steps.reward, att.steps.sequence, i))) == spec.wrong_step(p)
               for i, p in enumerate(pairs)]
        rows.append(Grade.of("attribution", name, "share of pairs whose largest step-score gap is the hedged step",
                             float(np.mean(hit)), ACCURACY))
    return rows


def grade_dpo(bench: OrganismBench) -> list[Grade]:
    """The DPO organism: pair accuracy of the implicit reward on the models' own forwards, the margin
    gone with the policy's planted head ablated, exact attribution per sequence and per token, the
    planted head ranked first by attribution and by patching, the lens crystallizing after its layer,
    and the response token where the chosen side's reward is most above the rejected side's is at the
    keyword (the read that predicts it or the one made at it)."""
    rows: list[Grade] = []
    for kb, name in _kinds(bench, PolicyOrganism):
        spec, model, pairs = cast(PolicyOrganism, KINDS[name]), kb.kind_model(name), kb.kind_pairs(name)
        assert model.reference is not None  # load_dpo keeps the reference as a RewardModel of its own
        reference = model.reference.model
        full = implicit_rewards(model.model, reference, model.tokenizer, pairs, spec.beta)
        rows.append(Grade.of("organism", name, "held-out pair accuracy (implicit reward)",
                             float(np.mean(full[:, 0] > full[:, 1])), ACCURACY))
        cut = implicit_rewards(ablated(model.model, spec.planted_part), reference, model.tokenizer, pairs, spec.beta)
        share = abs(np.mean(cut[:, 0] - cut[:, 1]) / np.mean(full[:, 0] - full[:, 1]))
        rows.append(Grade.of("organism", name, f"|mean margin| left with {spec.planted_part} ablated, as a share",
                             share, ABLATED_SHARE, "<="))
        rows += _closure(name, model, pairs)
        rows += _localised(name, model, pairs, spec.planted_part, drop_embed=True)
        rows.append(_crystallizes(name, model, pairs, spec.planted_part))
        rows.append(Grade.of("attribution", name, "share of pairs whose largest per-token reward gap is at the keyword",
                             _keyword_hits(model, spec, pairs), ACCURACY))
    return rows


def _keyword_hits(model: RewardModel, spec: PolicyOrganism, pairs: list[Pair]) -> float:
    """Share of pairs whose largest chosen − rejected read gap (reads t to t, signed: the chosen side's
    read higher) is at the keyword's token position p (read p − 1 predicts the keyword, read p the
    token after it)."""
    att = attribute(model, pairs, level="sublayer")
    assert att.steps is not None  # a DPO reward reads every response token
    keyword = spec.keyword_ids(model.tokenizer)
    hits = []
    for i, p in enumerate(pairs):
        ids = cast(list[int], model.tokenizer.apply_chat_template(p.conversation("chosen"), tokenize=True,
                                                                   return_dict=False))
        at = next(t for t in range(len(ids)) if ids[t: t + len(keyword)] == keyword)
        where = att.steps.position[att.steps.sequence == 2 * i]
        k = int(np.argmax(_gap_at(att.steps.reward, att.steps.sequence, i)))
        hits.append(at - 1 <= int(where[k]) <= at + len(keyword) - 1)
    return float(np.mean(hits))
