"""The registry's engines: each sweep of `_engine`, `_cached`, `_suffix`, `_stepped`, `_direct`,
`_reads_patch` and `_reference` behind the `Engine` protocol (`_registry`), with what it supports and
what it costs under the stated cost model (`_registry` module docstring; factors in `FACTORS`)."""

from __future__ import annotations

import math

from ..model.internal import cache_name, sequence_label
from ._cached import cached_read_sweep
from ._direct import direct_rewards
from ._engine import batched_sweep, read_sweep
from ._plan import Clean, PatchPlan
from ._reads_patch import direct_reads, patch_reads
from ._reference import reference_sweep
from ._registry import (
    FACTORS,
    Job,
    Needs,
    Outcome,
    State,
    copies_possible,
    first,
    multi_reads,
    register,
    suffix_reason,
    total_reason,
)
from ._stepped import stepped_sweep
from ._suffix import suffix_sweep

FACTORS.update({
    "batched_sweep": 1.0,
    "stepped_sweep": 1.0,
    "suffix_sweep": 1.7,
    "read_sweep": 1.0,
    "cached_read_sweep": 1.0,
    "reference": 4.0,
})
"""Time per token-layer relative to `batched_sweep`, measured by `python benchmarks/engines.py` (CPU, 2 shared
cores, 2026-12-05). The suffix engine's token-layers cost 1.7× the stepped engine's: on SmolLM2-135M's reward
model (30 layers, prefix noising, `--real`) it ran 2.71× [2.61, 2.96] faster than stepped where token-layers
alone predict 4.52× (toy Llamas of 2 and 24 layers: 1.35-1.4×); a cached continuation moves a copy of the
cache per run. The others stay 1.0: on width-64 toys per-call overhead dominates (batched measured 0.5-0.8×
stepped, the copy engine 0.7× the cached one), which no per-token factor transfers to real widths: the last full
run of benchmarks/patching.py (32 layers, hidden 128) had the cached engine 1.6-2.4× faster than the copy engine
on the head sweep, and no measurement at a real width separates stepped from batched (token-layers decide:
stepped on deep models). `reference` is 4: it never wins."""


def _state(state: State) -> tuple[Clean, PatchPlan, list[int], list[str]]:
    """The clean runs, the plan, its targets and their labels (for errors that name a sequence)."""
    assert state.clean is not None and state.plan is not None  # engines that run a plan are given one
    return state.clean, state.plan, state.plan.targets, [sequence_label(i, True) for i in state.plan.targets]


class DirectRewards:
    """Path-frozen patching at one read token, from the clean traces alone (`direct_rewards`)."""

    name = "direct_rewards"
    needs: Needs = "all"

    def supports(self, job: Job) -> str | None:
        return first(multi_reads(job), "estimand='total' needs patched forwards" if job.spec.estimand != "direct"
                     else None)

    def cost(self, job: Job) -> float:
        return len(job.targets) * len(job.sweep)

    def run(self, job: Job, state: State) -> Outcome:
        clean, plan, targets, _ = _state(state)
        return Outcome(direct_rewards(job.model, clean, targets, job.sweep, plan.values, plan.cols))


class CachedReadSweep:
    """Read-token copies from their own layer on the prefix's cache (`cached_read_sweep`)."""

    name = "cached_read_sweep"
    needs: Needs = "sources"

    def supports(self, job: Job) -> str | None:
        return first(copies_possible(job), "the model keeps no cache" if cache_name(job.model) is None else None)

    def cost(self, job: Job) -> float:
        return sum(t * job.model.n_layers + job.depths for t in job.lengths)

    def run(self, job: Job, state: State) -> Outcome | None:
        clean, plan, targets, _ = _state(state)
        out = cached_read_sweep(
            job.model, [job.seqs[i] for i in targets], [clean.read[i] for i in targets], job.sweep, plan.values,
            clean.coef[targets], batch_size=job.batch_size, index=targets, resid=state.score, states=clean.captured,
            held=clean.recorded.take_caches() if clean.recorded is not None else None)
        if out is None:
            return None
        return Outcome(out[1], target_clean=out[0], streams=out[2],
                       proof="two unpatched copies per group reproduced the clean read token")


class ReadSweep:
    """Read-token copies through every layer beside their prefix, one row per target (`read_sweep`)."""

    name = "read_sweep"
    needs: Needs = "sources"

    def supports(self, job: Job) -> str | None:
        return copies_possible(job)

    def cost(self, job: Job) -> float:
        s, chunks = len(job.sweep), math.ceil(len(job.sweep) / job.chunk)
        return sum((chunks * t + s + 2 * chunks) * job.model.n_layers for t in job.lengths)

    def run(self, job: Job, state: State) -> Outcome | None:
        clean, plan, targets, _ = _state(state)
        out = read_sweep(job.model, [job.seqs[i] for i in targets], [clean.read[i] for i in targets], job.sweep,
                         plan.values, clean.coef[targets], batch_size=job.batch_size, chunk=job.chunk,
                         resid=state.score, index=targets)
        if out is None:
            return None
        return Outcome(out[1], target_clean=out[0], streams=out[2],
                       proof="the first and last unpatched copies agreed")


class SuffixSweep:
    """Whole-sequence runs that compute only the positions a patch can change (`suffix_sweep`)."""

    name = "suffix_sweep"
    needs: Needs = "sources"

    def supports(self, job: Job) -> str | None:
        return suffix_reason(job)

    def cost(self, job: Job) -> float:
        layers = job.model.n_layers
        return sum((t - q) * (job.depths + 2 * layers) + t * layers for t, q in zip(job.lengths, job.unchanged))

    def run(self, job: Job, state: State) -> Outcome | None:
        clean, plan, targets, labels = _state(state)
        if plan.unchanged is None:
            return None
        cols, _, values = plan.at_columns(clean)
        got = suffix_sweep(job.model, [job.seqs[i] for i in targets], job.sweep, cols, values, plan.unchanged,
                           batch_size=job.batch_size, labels=labels, index=targets)
        if got is None:
            return None
        return Outcome(got[1], target_clean=got[0],
                       proof="unpatched continuations reproduced the clean run at every computed position")


class SteppedSweep:
    """Whole-sequence runs, each from its patched layer on a recording of the clean run (`stepped_sweep`)."""

    name = "stepped_sweep"
    needs: Needs = "all"

    def supports(self, job: Job) -> str | None:
        return first(total_reason(job), "divergence scores layers a stepped run skips" if job.divergence else None)

    def cost(self, job: Job) -> float:
        return sum(t * (job.depths + 3 * job.model.n_layers) for t in job.lengths)

    def run(self, job: Job, state: State) -> Outcome | None:
        clean, plan, targets, labels = _state(state)
        cols, _, values = plan.at_columns(clean)
        rewards = stepped_sweep(job.model, [job.seqs[i] for i in targets], job.sweep, cols, values,
                                batch_size=job.batch_size, labels=labels, index=targets)
        return None if rewards is None else Outcome(rewards, proof="stepped layers reproduced the model's own")


class BatchedSweep:
    """A full forward per (target, part), batched along the batch dimension (`batched_sweep`)."""

    name = "batched_sweep"
    needs: Needs = "all"

    def supports(self, job: Job) -> str | None:
        return total_reason(job)

    def cost(self, job: Job) -> float:
        return sum(t * len(job.sweep) * job.model.n_layers for t in job.lengths)

    def run(self, job: Job, state: State) -> Outcome:
        clean, plan, targets, labels = _state(state)
        cols, _, values = plan.at_columns(clean)
        rewards, streams = batched_sweep(job.model, [job.seqs[i] for i in targets], job.sweep, cols, values,
                                         batch_size=job.batch_size, resid=state.score, labels=labels, index=targets)
        return Outcome(rewards, streams=streams)


class PatchReads:
    """Total effects of a reward read at a set of positions, the reads patched k-th to k-th (`patch_reads`)."""

    name = "patch_reads"
    needs: Needs = "own"

    def supports(self, job: Job) -> str | None:
        return first(None if job.model.reads.multi else "the reward is read at one token",
                     "estimand='direct': path-frozen patching" if job.spec.estimand != "total" else None)

    def cost(self, job: Job) -> float:
        return sum(t * (job.depths + 3 * job.model.n_layers) for t in job.lengths)

    def run(self, job: Job, state: State) -> Outcome:  # noqa: ARG002  # it traces its own clean runs
        clean, targets, rewards = patch_reads(job.model, job.seqs, job.sweep, mode=job.spec.mode,
                                              level=job.spec.level, batch_size=job.batch_size)
        return Outcome(rewards, clean=clean, targets=targets)


class DirectReads:
    """Path-frozen effects at a set of reads, from the clean traces alone (`direct_reads`)."""

    name = "direct_reads"
    needs: Needs = "own"

    def supports(self, job: Job) -> str | None:
        return first(None if job.model.reads.multi else "the reward is read at one token",
                     "estimand='total' needs patched forwards" if job.spec.estimand != "direct" else None)

    def cost(self, job: Job) -> float:
        return len(job.targets) * len(job.sweep)

    def run(self, job: Job, state: State) -> Outcome:  # noqa: ARG002  # it traces its own clean runs
        clean, targets, rewards = direct_reads(job.model, job.seqs, job.sweep, mode=job.spec.mode,
                                               level=job.spec.level, batch_size=job.batch_size)
        return Outcome(rewards, clean=clean, targets=targets)


class Reference:
    """The yardstick: one unbatched forward per (target, part) (`_reference`); never chosen by cost."""

    name = "reference"
    needs: Needs = "all"

    def supports(self, job: Job) -> str | None:
        return first(multi_reads(job), "divergence scores are not computed by the reference loop"
                     if job.divergence else None)

    def cost(self, job: Job) -> float:
        return sum(t * len(job.sweep) * job.model.n_layers for t in job.lengths) + 1.0

    def run(self, job: Job, state: State) -> Outcome:
        clean, plan, _, _ = _state(state)
        return Outcome(reference_sweep(job.model, clean, plan, job.sweep,
                                       direct=job.spec.estimand == "direct"))


for _engine in (DirectRewards(), DirectReads(), PatchReads(), CachedReadSweep(), ReadSweep(), SuffixSweep(),
                SteppedSweep(), BatchedSweep(), Reference()):
    register(_engine)
