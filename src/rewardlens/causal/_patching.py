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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from torch import Tensor

from ..data import Inputs, Pair, chosen, pair_ids, rejected
from ..data.internal import counting
from ..errors import UsageError
from ..model import RewardModel
from ..model.internal import Tokenized, not_continuable, sequence_label
from ..stats import top_parts
from ..types import Ablation, Estimand, Mode, PatchLevel, Positions, Spans
from ._cached import cached_read_sweep
from ._direct import direct_rewards
from ._divergence import NaturalFit, score_patched, scorer
from ._engine import Site, batched_sweep, neuron_layers, read_sweep
from ._margins import PatchedMargins
from ._neurons import Neurons, check_traced, level_sites
from ._plan import Clean, PatchPlan, pair_seqs, sources_only
from ._reads_patch import check_reads_options, direct_reads, mode_for, patch_reads
from ._spec import MODES as MODES
from ._spec import PatchSpec, spec_of
from ._stepped import stepped_sweep
from ._suffix import suffix_possible, suffix_sweep

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure



@dataclass(frozen=True)
class Patching(PatchedMargins):
    """Patched rewards of every pair under every part's patch, and the effects they imply.

    `chosen`, `rejected` [n] are the clean rewards; `patched_chosen`, `patched_rejected` [n, P] the
    rewards with part p patched (equal to the clean reward on the side a mode leaves alone).
    `divergence` [n, P] (when asked for): how far the patched run's downstream residual stream left
    the natural one, as a ratio to the natural threshold (> 1: out of distribution).
    `approximate` is True for attribution patching (a first-order estimate, not a patched run).
    """

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
    """
    with counting("patch", progress):
        seqs = pair_seqs(model, pairs, clean)
        given = mode if spec is not None else mode_for(model, pairs, mode, seqs)
        spec = spec_of(spec, mode=given, ablation=ablation, positions=positions, level=level, estimand=estimand)
        mode, ablation, positions, level, estimand = spec.mode, spec.ablation, spec.positions, spec.level, spec.estimand
        if natural is not None and (not divergence or reference is not None):
            raise UsageError("natural= is divergence's fitted natural distribution: pass it with divergence=True "
                             "and without reference= (which would fit another one)", option="natural")
        if divergence and estimand == "direct":
            raise UsageError("divergence scores patched runs' later activations; estimand='direct' holds them "
                             "frozen, so there is nothing to score: use estimand='total'", option="divergence")
        if sweep is not None and neurons is not None:
            raise UsageError("pass the parts to patch either as sweep= or as neurons=, not both")
        sweep = level_sites(model, level, neurons) if sweep is None else list(sweep)
        heads, neurons_at = level == "head", neuron_layers(sweep)  # what the clean trace keeps
        if model.reads.multi:  # a reward read at a set of positions is patched at that set
            check_reads_options(mode, ablation, positions, divergence)
            engine = direct_reads if estimand == "direct" else patch_reads
            runs, read_targets, patched = engine(model, seqs, sweep, mode=mode, level=level, batch_size=batch_size)
            return assemble(pairs, runs, read_targets, patched, sweep, mode=mode, positions="read", level=level,
                            estimand=estimand, min_margin=min_margin)
        # The read-position engine can read each target's clean reward off an unpatched copy, so the
        # clean trace need only cover the sequences whose activations are inserted.
        copies = estimand == "total" and positions == "read" and not_continuable(model, seqs) is None
        # Where the targets' clean rewards come from the engine's own clean forward (the read-position
        # copies, or the suffix engine's trace), only the sources are traced here.
        suffix = (estimand == "total" and positions != "read" and not divergence and mode != "ablation"
                  and suffix_possible(model, seqs))
        only = sources_only(model, mode, len(seqs)) if (copies or suffix) and not divergence else None
        if clean is None:
            clean = Clean.run(model, seqs, heads=heads, batch_size=batch_size, only=only, neurons=neurons_at)
        else:  # every side is traced already; the read-position engine rewrites its targets' clean
            only = None  # rewards, so the caller's are kept intact
            check_traced(clean, sweep)
            clean = dataclasses.replace(clean, reward=clean.reward.clone())
        ref_seqs = None if reference is None else model.encode(reference)[0]
        plan = PatchPlan.make(model, clean, sweep, mode, ablation, positions, ref_seqs, batch_size, ids=pair_ids(pairs))
        targets, cols_t, values = plan.targets, plan.cols, plan.values
        tgt = [seqs[i] for i in targets]
        score = natural if natural is not None or not divergence else scorer(model, clean, ref_seqs, batch_size)
        rewards: Tensor | None = None
        streams: Tensor | None = None
        if estimand == "direct":
            rewards = direct_rewards(model, clean, targets, sweep, values, cols_t)
        elif copies:
            read = [clean.read[i] for i in targets]
            # Cheapest first: copies from their own layer on the prefix's cache, then copies through
            # every layer; each proves itself or declines, and each gives divergence its streams.
            # The caches a caller's trace kept (`trace_pairs(record=)`) are taken: the cached engine starts
            # from them and lets each go once used (layer inputs stay, for attribution patching).
            out = cached_read_sweep(model, tgt, read, sweep, values, clean.coef[targets], batch_size=batch_size,
                                    index=targets, resid=score, states=clean.captured,
                                    held=clean.recorded.take_caches() if clean.recorded is not None else None
                                    ) or read_sweep(
                model, tgt, read, sweep, values, clean.coef[targets], batch_size=batch_size, chunk=chunk, resid=score,
                index=targets)
            if out is not None:
                clean_reward, rewards, streams = out
                clean.reward[targets] = clean_reward.to(clean.reward.dtype)
            elif only is not None:  # full forwards after all: they need the targets' clean runs too
                clean, only = Clean.run(model, seqs, heads=heads, batch_size=batch_size, neurons=neurons_at), None
        if rewards is None:
            clean, rewards, streams = _any_positions(model, seqs, clean, plan, sweep, suffix=suffix,
                                                     traced_all=only is None, heads=level == "head",
                                                     batch_size=batch_size, score=score)
        scores = None
        if divergence:
            assert streams is not None  # every engine given a scorer returns the streams it scored
            scores = score_patched(sweep, targets, streams, len(seqs) // 2)
        return assemble(pairs, clean, targets, rewards, sweep, mode=mode, positions=positions, level=level,
                        estimand=estimand, divergence=scores, min_margin=min_margin)


def _any_positions(
    model: RewardModel, seqs: list[Tokenized], clean: Clean, plan: PatchPlan, sweep: list[Site], *, suffix: bool,
    traced_all: bool, heads: bool, batch_size: int, score: Callable[[Tensor], Tensor] | None,
) -> tuple[Clean, Tensor, Tensor | None]:
    """(the clean runs, patched rewards [n_targets, S], divergence streams or None) of the total effect at
    the plan's columns: the suffix engine (only what a patch changes, where `suffix`), then the stepped
    engine (unless divergence `score`s the layers it skips), then full forwards. `traced_all`: whether
    `clean` traced every sequence (else only the sources, and the suffix engine reads the targets')."""
    targets = plan.targets
    tgt, labels = [seqs[i] for i in targets], [sequence_label(i, True) for i in targets]
    cols_t, _, values = plan.at_columns(clean)
    if suffix and plan.unchanged is not None:
        got = suffix_sweep(model, tgt, sweep, cols_t, values, plan.unchanged, batch_size=batch_size, labels=labels,
                           index=targets)
        if got is not None:
            clean.reward[targets] = got[0].to(clean.reward.dtype)
            return clean, got[1], None
    if not traced_all:  # the other engines need the targets' clean runs too
        clean = Clean.run(model, seqs, heads=heads, batch_size=batch_size, neurons=neuron_layers(sweep))
    if score is None:
        rewards = stepped_sweep(model, tgt, sweep, cols_t, values, batch_size=batch_size, labels=labels,
                                index=targets)
        if rewards is not None:
            return clean, rewards, None
    rewards, streams = batched_sweep(model, tgt, sweep, cols_t, values, batch_size=batch_size, resid=score,
                                     labels=labels, index=targets)
    return clean, rewards, streams


def assemble(
    pairs: Pair | Sequence[Pair], clean: Clean, targets: list[int], rewards: Tensor, sweep: list[Site], *,
    mode: Mode, positions: Positions | Spans, level: PatchLevel, estimand: Estimand,
    divergence: np.ndarray | None = None,
    approximate: bool = False, min_margin: float = 1e-4,
) -> Patching:
    """A `Patching` from the patched rewards [n_targets, S] of `targets` (other sequences keep their clean reward)."""
    rows = clean.reward[:, None].repeat(1, len(sweep))
    rows[targets] = rewards.to(rows.dtype)
    patched = rows.cpu().numpy()
    reward = clean.reward.cpu().numpy()
    return Patching(
        names=[s.name for s in sweep], chosen=chosen(reward), rejected=rejected(reward),
        patched_chosen=chosen(patched), patched_rejected=rejected(patched), mode=mode,
        positions=positions if isinstance(positions, str) else "spans", level=level, estimand=estimand,
        pair_ids=pair_ids(pairs), divergence=divergence,
        approximate=approximate, min_margin=min_margin,
    )
