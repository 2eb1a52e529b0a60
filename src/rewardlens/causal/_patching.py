"""`patch`: activation patching between the chosen and the rejected response, exact and batched.

Sign convention: a part's `effect` is the clean chosen − rejected margin minus the patched margin.
Positive means the part carries the preference: in `noising` (run chosen, insert rejected's
activation) the chosen reward falls; in `denoising` (run rejected, insert chosen's) the rejected
reward rises; in `ablation` (zero, or the mean over a reference set, on both sides) the margin
shrinks. `estimand="total"` lets the patch flow through every later layer; `estimand="direct"`
holds every later part at its clean value and recomputes only the final norm's scale (path-frozen
patching: docs/design.md §1), the causal twin of attribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
from torch import Tensor

from ..data import Inputs, Pair, chosen, pair_ids, rejected
from ..data.internal import counting
from ..errors import UsageError
from ..model import RewardModel
from ..model.internal import Tokenized
from ..plotting import HtmlView
from ..stats import top_parts
from ..types import Ablation, Estimand, Mode, PatchLevel, Positions, Spans
from . import _engines as _engines  # noqa: F401  # registers every engine
from ._divergence import NaturalFit, score_patched, scorer
from ._engine import Site, neuron_layers
from ._margins import PatchedMargins
from ._neurons import Neurons, check_traced, level_sites
from ._plan import Clean, PatchPlan, pair_seqs, sources_only
from ._reads_patch import check_reads_options, mode_for
from ._registry import Choice, Job, Provenance, State, choose, log
from ._spec import MODES as MODES
from ._spec import PatchSpec, spec_of

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure



@dataclass(frozen=True)
class Patching(HtmlView, PatchedMargins):
    """Patched rewards of every pair under every part's patch, and the effects they imply.

    `chosen`, `rejected` [n] are the clean rewards; `patched_chosen`, `patched_rejected` [n, P] the
    rewards with part p patched (equal to the clean reward on the side a mode leaves alone).
    `divergence` [n, P] (when asked for): how far the patched run's downstream residual stream left
    the natural one, as a ratio to the natural threshold (> 1: out of distribution).
    `approximate` is True for attribution patching (a first-order estimate, not a patched run).
    `provenance`: the engine that ran (`str(result.provenance)` is its one line).
    """

    _html_top_names = ("part", "mean effect")

    names: list[str]
    chosen: np.ndarray
    rejected: np.ndarray
    patched_chosen: np.ndarray
    patched_rejected: np.ndarray
    mode: Mode
    positions: Positions | Literal["spans"]
    level: PatchLevel
    estimand: Estimand
    pair_ids: list[str]
    divergence: np.ndarray | None = None
    approximate: bool = False
    min_margin: float = 1e-4
    provenance: Provenance | None = None
    """Which engine computed the patched rewards, which declined and why (`Provenance`); None on a result
    made before it was recorded."""

    def __post_init__(self) -> None:
        if isinstance(self.provenance, dict):  # read back from the audit's store, which keeps plain records
            object.__setattr__(self, "provenance", Provenance.of(self.provenance))

    @property
    def flagged(self) -> np.ndarray:
        """[n, P] bool: the patched run left the natural distribution (always False without divergence)."""
        if self.divergence is None:
            return np.zeros(self.patched_chosen.shape, dtype=bool)
        return self.divergence > 1.0

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The `n` parts with the largest mean |effect| over pairs, with their signed mean effect.

        Ranked by the mean of |effect|, not |mean effect|: a part that moves the margin a lot but with
        a sign that flips between pairs is large, and stays in the list (NaN effects rank last).
        """
        mean = self.effect.mean(0)
        return [(self.names[i], float(mean[i])) for i in top_parts(self.effect, n)]

    def reliability(self) -> dict[str, float]:
        """How much of the result rests on out-of-distribution patched runs.

        `flagged_share`: share of (pair, part) runs flagged; `effect_share_flagged`: share of the
        total |effect| that comes from flagged runs; `top_flagged_share`: share of flagged runs
        among the ten parts with the largest mean |effect|. NaN without divergence scores.
        """
        if self.divergence is None:
            return {"flagged_share": np.nan, "effect_share_flagged": np.nan, "top_flagged_share": np.nan}
        size = np.abs(self.effect)
        top = [self.names.index(name) for name, _ in self.top(10)]
        return {
            "flagged_share": float(self.flagged.mean()),
            "effect_share_flagged": float(size[self.flagged].sum() / size.sum()) if size.sum() > 0 else float("nan"),
            "top_flagged_share": float(self.flagged[:, top].mean()),
        }

    def select(self, names: Sequence[str], level: PatchLevel) -> Patching:
        """The same runs restricted to the parts `names` (in that order), labelled `level`: how one
        sweep over two levels' sites (`patch(sweep=...)`) becomes each level's result."""
        index = [self.names.index(name) for name in names]
        return dataclasses.replace(
            self, names=list(names), patched_chosen=self.patched_chosen[:, index],
            patched_rejected=self.patched_rejected[:, index], level=level,
            divergence=None if self.divergence is None else self.divergence[:, index])

    @classmethod
    def joined(cls, parts: Sequence[Patching], pairs: Sequence[Pair]) -> Patching:
        """Pairs patched in parts (chunks, one `patch` call each) as one result, pairs in the parts' order;
        `pairs`: all of them, in that order, for their ids (`pair_ids`: a part numbers its unnamed pairs from 0).

        ValueError unless there are parts, each patched the same parts the same way, and `pairs` are theirs."""
        if not parts:
            raise UsageError("Patching.joined needs at least one result to join; pass the chunks' results")
        if sum(len(p.chosen) for p in parts) != len(pairs):
            raise UsageError(f"Patching.joined: the parts hold {sum(len(p.chosen) for p in parts)} pairs but "
                             f"{len(pairs)} pairs were passed; pass every pair the parts patched, in their order")
        first = parts[0]
        differ = [f for f in ("names", "mode", "positions", "level", "estimand", "approximate", "min_margin")
                  if any(getattr(p, f) != getattr(first, f) for p in parts)]
        differ += ["divergence"] if len({p.divergence is None for p in parts}) > 1 else []
        if differ:
            raise UsageError(f"Patching.joined joins chunks of one sweep, but the parts differ in {differ}; patch "
                             "every chunk with the same sites and options")

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        return dataclasses.replace(
            first, chosen=cat("chosen"), rejected=cat("rejected"), patched_chosen=cat("patched_chosen"),
            patched_rejected=cat("patched_rejected"), pair_ids=pair_ids(pairs),
            divergence=None if first.divergence is None else cat("divergence"))

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (pair, part) with effect, normalised effect and divergence."""
        import pandas as pd

        n, p = self.effect.shape
        frame = pd.DataFrame({
            "pair": np.repeat(self.pair_ids, p), "part": np.tile(self.names, n), "effect": self.effect.ravel(),
            "normalized": self.normalized.ravel(), "patched_chosen": self.patched_chosen.ravel(),
            "patched_rejected": self.patched_rejected.ravel(),
        })
        if self.divergence is not None:
            frame["divergence"] = self.divergence.ravel()
            frame["flagged"] = self.flagged.ravel()
        return frame

    def plot(self, n: int = 20, ax: Axes | None = None) -> Figure:
        """Bar chart of the mean effect of the top `n` parts, into `ax` when given (its figure is
        returned), else a new figure."""
        from ..plotting import finish, one_panel

        top = self.top(n)
        ax, made = one_panel(ax, (6, 0.3 * len(top) + 1))
        ax.barh([t[0] for t in top][::-1], [t[1] for t in top][::-1])
        ax.set_xlabel(f"mean {self.estimand} effect on the margin ({self.mode}, {self.positions} positions)")
        return finish(ax, made)


def patch(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    mode: Mode | None = None,
    ablation: Ablation = "zero",
    positions: Positions | Spans = "read",
    level: PatchLevel = "sublayer",
    estimand: Estimand = "total",
    reference: Inputs | None = None,
    divergence: bool = False,
    natural: NaturalFit | None = None,
    batch_size: int = 8,
    chunk: int = 512,
    min_margin: float = 1e-4,
    clean: Clean | None = None,
    sweep: Sequence[Site] | None = None,
    progress: bool = False,
    spec: PatchSpec | None = None,
    neurons: Neurons | None = None,
    engine: str | None = None,
) -> Patching:
    """Patch every part (`level` 'sublayer' or 'head'), or the chosen MLP `neurons` (`level='neuron'`), of
    every pair and return the patched rewards.

    `mode`: 'noising', 'denoising' or 'ablation'; None (the default) is noising, except for a reward read
    at a set of positions whose pairs have no read-to-read map: zero ablation at every read (`patch_mode`,
    the audit's rule; it warns).
    `positions`: 'read' (only the read token; any two lengths), 'all' (token-aligned pairs),
    'prefix' (the first `min(len(chosen), len(rejected))` tokens of both sides, aligned from the
    start as in the seed paper; warns naming the pairs whose read token it leaves unpatched) or
    spans (see `resolve_positions`). `reference`: inputs whose mean activation `ablation='mean'`
    inserts (default: both sides of `pairs`) and whose natural activations divergence is scored
    against. `divergence=True` scores how far each patched run's later residual stream leaves
    the natural distribution (`Patching.divergence`, `Patching.reliability`). `natural`: that
    distribution fitted already (`NaturalFit`), when the caller fits it once over more pairs than this
    call patches (the audit patches its pairs chunk by chunk against one fit); instead of `reference`.
    `chunk`: patched
    copies of the read token per row in the read-position engine (memory grows with it).
    `clean`: the pairs' clean runs when the caller already traced them (`trace_pairs`; traced with
    heads for `level='head'`), so the sweep does not trace them again. `sweep`: the sites to patch
    instead of every site at `level` (`sites(model, 'head')` plus the attention sublayers serves both
    levels in one sweep; `Patching.select` splits the result). `spec`: the five choices (mode,
    ablation, positions, level, estimand) as one validated `PatchSpec`, instead of the keywords.
    `neurons`: with `level='neuron'`, the neurons to patch, one run each (names such as 'mlp_L1_N17', as
    `attribute(level='neuron')` names them); level 'neuron' without them is refused (every neuron is too many
    runs: choose some, or rank them all by `attribution_patch(level='neuron')`).
    `engine`: run this engine of the registry (`causal._registry.REGISTRY`; 'reference' is the naive one forward
    per part and pair) instead of the cheapest that accepts; a `UsageError` names why it declines. Every engine
    gives the same numbers; `Patching.provenance` records which ran (docs/patching.md, "Engines").
    """
    with counting("patch", progress):
        seqs = pair_seqs(model, pairs, clean)
        given = mode if spec is not None else mode_for(model, pairs, mode, seqs)
        spec = spec_of(spec, mode=given, ablation=ablation, positions=positions, level=level, estimand=estimand)
        if natural is not None and (not divergence or reference is not None):
            raise UsageError("natural= is divergence's fitted natural distribution: pass it with divergence=True "
                             "and without reference= (which would fit another one)", option="natural")
        if divergence and spec.estimand == "direct":
            raise UsageError("divergence scores patched runs' later activations; estimand='direct' holds them "
                             "frozen, so there is nothing to score: use estimand='total'", option="divergence")
        if sweep is not None and neurons is not None:
            raise UsageError("pass the parts to patch either as sweep= or as neurons=, not both", option="sweep")
        sweep = level_sites(model, spec.level, neurons) if sweep is None else list(sweep)
        if model.reads.multi:  # a reward read at a set of positions is patched at that set
            check_reads_options(spec.mode, spec.ablation, spec.positions, divergence)
        job = Job(model, seqs, spec, sweep, divergence, batch_size, chunk)
        choice = choose(job, engine)
        ref_seqs = None if reference is None else model.encode(reference)[0]
        ran = _run(job, choice, clean, ref_seqs, natural, pair_ids(pairs))
        return assemble(pairs, ran.reward, ran.targets, ran.rewards, sweep, spec=spec, divergence=ran.divergence,
                        min_margin=min_margin, provenance=ran.provenance)


@dataclass(frozen=True)
class _Ran:
    """What the engine that ran gave: every sequence's clean reward [N], the targets, their patched rewards
    [n_targets, S], divergence scores (or None) and the record of how."""

    reward: Tensor
    targets: list[int]
    rewards: Tensor
    divergence: np.ndarray | None
    provenance: Provenance


def _run(job: Job, choice: Choice, clean: Clean | None, ref_seqs: list[Tokenized] | None,
         natural: NaturalFit | None, ids: list[str]) -> _Ran:
    """Run the chosen engines cheapest first until one does not decline at run time. The clean trace covers
    what the first needs (`Engine.needs`): only the sources when its own forward gives the targets' clean
    rewards (and no divergence scorer needs them), traced again in full should a later engine need them.
    A caller's `clean` is read, never written."""
    model, seqs, spec, sweep = job.model, job.seqs, job.spec, job.sweep
    first_engine = choice.ranked[0][0]
    if first_engine.needs == "own":  # the set-of-reads engines trace their own batches
        out = first_engine.run(job, State(None, None))
        assert out is not None and out.clean is not None and out.targets is not None  # they never decline
        return _Ran(out.clean.reward, out.targets, out.rewards, None, choice.provenance(first_engine, out.proof))
    heads, neurons_at = spec.level == "head", neuron_layers(sweep)  # what the clean trace keeps
    only = None
    if clean is None:
        if first_engine.needs == "sources" and not job.divergence:
            only = sources_only(model, spec.mode, len(seqs))
        clean = Clean.run(model, seqs, heads=heads, batch_size=job.batch_size, only=only, neurons=neurons_at)
    else:
        check_traced(clean, sweep)
    plan = PatchPlan.make(model, clean, sweep, spec.mode, spec.ablation, spec.positions, ref_seqs, job.batch_size,
                          ids=ids)
    score = natural if natural is not None or not job.divergence else scorer(model, clean, ref_seqs, job.batch_size)
    declined = list(choice.declined)
    for engine, _ in choice.ranked:
        if engine.needs == "all" and only is not None:  # the targets' clean runs are needed after all
            clean, only = Clean.run(model, seqs, heads=heads, batch_size=job.batch_size, neurons=neurons_at), None
        out = engine.run(job, State(clean, plan, score))
        if out is None:
            log.debug("patch %s: %s declined at run time (its proof failed or the model refused its call)",
                      spec.name, engine.name)
            declined.append((engine.name, "declined at run time: its proof failed or the model refused its call"))
            continue
        log.debug("patch %s: %s ran", spec.name, engine.name)
        reward = clean.reward.clone()
        if out.target_clean is not None:  # the engine's own unpatched forward of each target
            reward[plan.targets] = out.target_clean.to(reward.dtype)
        scores = None
        if job.divergence:
            assert out.streams is not None  # every engine given a scorer returns the streams it scored
            scores = score_patched(sweep, plan.targets, out.streams, len(seqs) // 2)
        prov = replace(choice.provenance(engine, out.proof), declined=tuple(declined))
        return _Ran(reward, plan.targets, out.rewards, scores, prov)
    raise UsageError(f"every engine that accepts this patch ({spec.name}) declined at run time: {declined}; "
                     "leave engine=None so the others can run it", option="engine")


def assemble(
    pairs: Pair | Sequence[Pair], reward: Tensor, targets: list[int], rewards: Tensor, sweep: list[Site], *,
    spec: PatchSpec, divergence: np.ndarray | None = None, approximate: bool = False, min_margin: float = 1e-4,
    provenance: Provenance | None = None,
) -> Patching:
    """A `Patching` from every sequence's clean `reward` [N] and the patched rewards [n_targets, S] of `targets`
    (other sequences keep their clean reward)."""
    rows = reward[:, None].repeat(1, len(sweep))
    rows[targets] = rewards.to(rows.dtype)
    patched = rows.cpu().numpy()
    clean = reward.cpu().numpy()
    return Patching(
        names=[s.name for s in sweep], chosen=chosen(clean), rejected=rejected(clean),
        patched_chosen=chosen(patched), patched_rejected=rejected(patched), mode=spec.mode,
        positions=spec.positions if isinstance(spec.positions, str) else "spans", level=spec.level,
        estimand=spec.estimand, pair_ids=pair_ids(pairs), divergence=divergence,
        approximate=approximate, min_margin=min_margin, provenance=provenance,
    )
