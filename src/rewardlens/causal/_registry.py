"""The patching engines as one registry: each states what it can run and what it costs; the cheapest runs.

Every engine computes the same numbers (each is tested against `reference`, the naive one forward per
(target, part) loop); they differ in speed and in what they need. `choose` asks each engine, before any
forward, whether it `supports` a `Job` (None, or the reason it cannot) and what it would `cost`; the
engines that accept run cheapest first. An engine whose run-time proof fails (a cache that does not
reproduce the clean run, copies that differ by column, layers that cannot be stepped) declines then, and
the next one runs. `Provenance` records the engine that ran, every one that declined and why, and the
proof's verdict; `patch` puts it on its result. `engine=` forces one (a `UsageError` names why it declines).

Cost model (`Engine.cost`): token-layers, one layer applied to one token position, over every patched
run and the clean or proof forwards the engine adds, times a per-engine factor: the measured time of
one of its token-layers relative to one in a plain batched forward (`FACTORS`, from
`benchmarks/engines.py`; a factor stands for what token-layers miss: a copied cache, a 4-D mask, per-call
overhead). With `n` targets of `T_i` tokens, `L` layers, `S` parts whose runs need `d_s = L - l_s`
layers (from the part's own layer `l_s`) and `q_i` leading positions no patch changes:

- batched_sweep   Σ_i T_i · S · L                             (a full forward per run)
- stepped_sweep   Σ_i T_i · (Σ_s d_s + 3L)                    (each run from its layer; recording; proof)
- suffix_sweep    Σ_i [(T_i − q_i) · (Σ_s d_s + 2L) + T_i · L] (the suffix only; proof; cached clean run)
- read_sweep      Σ_i (⌈S/chunk⌉ · T_i + S + 2) · L            (the read token copied S times per row)
- cached_read_sweep Σ_i (T_i · L + Σ_s d_s)                     (copies from their layer on the cache)
- direct_rewards, direct_reads  n · S                         (no forward: the clean traces suffice)
- patch_reads     as stepped_sweep                            (it runs it, or batched_sweep)
- reference       Σ_i T_i · S · L, unbatched                   (never the cheapest: the yardstick)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

from torch import Tensor

from ..errors import UsageError
from ..model import RewardModel
from ..model.internal import Tokenized, cache_name, not_continuable, proof_tol
from ._engine import Site
from ._plan import Clean, PatchPlan, sides
from ._spec import PatchSpec

log = logging.getLogger("rewardlens.causal")

Needs = Literal["all", "sources", "own"]
"""What the clean trace must cover before an engine runs: every sequence; the sources only (the engine's
own forward gives the targets' clean rewards); or nothing (the engine traces its own)."""


@dataclass(frozen=True)
class Provenance:
    """Which engine computed a result: `engine` ran; `declined` holds (engine, reason) for each that
    could not (before any forward, or when its run-time proof failed); `proof` the verdict of the proof
    the engine that ran made (None: it makes none); `forced`: chosen by `engine=`, not by cost."""

    engine: str
    declined: tuple[tuple[str, str], ...] = ()
    proof: str | None = None
    forced: bool = False

    def __str__(self) -> str:
        how = "forced" if self.forced else "cheapest that accepted"
        proof = f"; proof: {self.proof}" if self.proof else ""
        return f"engine {self.engine} ({how}{proof}; {len(self.declined)} declined)"

    @classmethod
    def of(cls, record: dict[str, Any]) -> Provenance:
        """A `Provenance` from its plain record (`dataclasses.asdict`, as a store keeps it)."""
        return cls(str(record["engine"]), tuple((str(a), str(b)) for a, b in record.get("declined", ())),
                   record.get("proof"), bool(record.get("forced", False)))

    def reason(self, engine: str) -> str | None:
        """Why `engine` declined (None: it did not)."""
        return next((why for name, why in self.declined if name == engine), None)


@dataclass(frozen=True)
class Job:
    """What an engine is asked to run, known before any forward: the pairs' sequences (interleaved
    chosen, rejected), the patch's choices, the parts, and the options the engines take."""

    model: RewardModel
    seqs: list[Tokenized]
    spec: PatchSpec
    sweep: list[Site]
    divergence: bool = False
    batch_size: int = 8
    chunk: int = 512

    @cached_property
    def targets(self) -> list[int]:
        """The sequences the patch runs on (`sides`)."""
        return sides(self.spec.mode, len(self.seqs))[0]

    @cached_property
    def lengths(self) -> list[int]:
        """Tokens T_i of each target."""
        return [len(self.seqs[t].ids) for t in self.targets]

    @cached_property
    def depths(self) -> int:
        """Σ_s d_s: layers the runs of every part need, each from its own layer."""
        return sum(self.model.n_layers - (0 if s.kind == "embed" else s.layer) for s in self.sweep)

    @cached_property
    def unchanged(self) -> list[int]:
        """q_i: leading positions each target shares with its source (all of them when none: ablation)."""
        sources = sides(self.spec.mode, len(self.seqs))[1]
        if sources is None:
            return [0] * len(self.targets)
        out = []
        for t, s in zip(self.targets, sources):
            a, b = self.seqs[t].ids, self.seqs[s].ids
            out.append(next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
        return out


@dataclass(frozen=True)
class State:
    """What a run needs beyond its job: the clean runs and the plan (None for engines that trace their own)
    and divergence's scorer of a patched run's residuals (None without divergence)."""

    clean: Clean | None
    plan: PatchPlan | None
    score: Callable[[Tensor], Tensor] | None = None


@dataclass(frozen=True)
class Outcome:
    """An engine's numbers: patched rewards [n_targets, S]; `target_clean` [n_targets] the targets' clean
    rewards from the engine's own forward (None: the clean trace's stand); `clean`, `targets` where the
    engine traced its own clean runs (a set of reads); divergence `streams`; the `proof` verdict."""

    rewards: Tensor
    target_clean: Tensor | None = None
    streams: Tensor | None = None
    clean: Clean | None = None
    targets: list[int] | None = None
    proof: str | None = None


class Engine(Protocol):
    """One way to run a patch sweep. `run` returns None when its run-time proof fails (it declines)."""

    name: str
    needs: Needs

    def supports(self, job: Job) -> str | None:
        """None when this engine can run `job`, else the reason it cannot (checked before any forward)."""
        ...

    def cost(self, job: Job) -> float:
        """The stated cost model's estimate of running `job` (module docstring)."""
        ...

    def run(self, job: Job, state: State) -> Outcome | None:
        """The sweep's numbers, or None when a proof made at run time fails."""
        ...


FACTORS: dict[str, float] = {}
"""Each engine's measured time per token-layer relative to `batched_sweep` (filled in by `_engines`)."""

REGISTRY: dict[str, Engine] = {}
"""Every engine by name, in the order they were registered (no order carries meaning: cost decides)."""


def register(engine: Engine) -> Engine:
    """Add `engine` to the registry (its name must be new)."""
    assert engine.name not in REGISTRY, engine.name
    REGISTRY[engine.name] = engine
    return engine


@dataclass
class Choice:
    """The engines that accept a job, cheapest first, with their costs, and those that declined."""

    ranked: list[tuple[Engine, float]]
    declined: list[tuple[str, str]] = field(default_factory=list)
    forced: bool = False

    def provenance(self, ran: Engine, proof: str | None) -> Provenance:
        """The record of a run by `ran`."""
        return Provenance(ran.name, tuple(self.declined), proof, self.forced)


def choose(job: Job, engine: str | None = None) -> Choice:
    """The registry's answer for `job`: every engine that supports it, cheapest first (`engine`: that one
    only; a `UsageError` when it is not known or declines). One debug line per decision."""
    if engine is not None and engine not in REGISTRY:
        raise UsageError(f"engine must be one of {sorted(REGISTRY)} or None (the cheapest that accepts), got "
                         f"{engine!r}", option="engine")
    declined: list[tuple[str, str]] = []
    ranked: list[tuple[Engine, float]] = []
    for name, candidate in REGISTRY.items():
        if engine is not None and name != engine:
            continue
        why = candidate.supports(job)
        if why is not None:
            log.debug("patch %s: %s declines: %s", job.spec.name, name, why)
            declined.append((name, why))
            continue
        cost = candidate.cost(job) * FACTORS.get(name, 1.0)
        log.debug("patch %s: %s accepts, cost %.3g", job.spec.name, name, cost)
        ranked.append((candidate, cost))
    if engine is not None and not ranked:
        raise UsageError(f"engine={engine!r} cannot run this patch ({job.spec.name}): {declined[0][1]}; leave "
                         "engine=None to run the cheapest engine that accepts", option="engine")
    ranked.sort(key=lambda pair: pair[1])  # a stable sort: equal costs keep the registry's order
    if not ranked:  # batched_sweep and reference take every single-read job; the set-of-reads ones the rest
        raise AssertionError(f"no patching engine accepts {job.spec.name}: {declined}")
    log.debug("patch %s: order %s", job.spec.name, [e.name for e, _ in ranked])
    return Choice(ranked, declined, forced=engine is not None)


def multi_reads(job: Job) -> str | None:
    """Why an engine that reads one token per sequence cannot run `job` (None: it reads one)."""
    return "the reward is read at a set of positions (the set-of-reads engines run it)" if job.model.reads.multi \
        else None


def first(*reasons: str | None) -> str | None:
    """The first reason given (None when every check passed)."""
    return next((r for r in reasons if r is not None), None)


def copies_possible(job: Job) -> str | None:
    """Why read-token copies (`read_sweep`, `cached_read_sweep`) cannot run `job`, or None."""
    return first(
        multi_reads(job),
        "estimand='direct' runs no patched forward" if job.spec.estimand != "total" else None,
        f"positions={job.spec.positions!r}: copies patch the read token only" if job.spec.positions != "read"
        else None,
        not_continuable(job.model, job.seqs))


def suffix_reason(job: Job) -> str | None:
    """Why `suffix_sweep` cannot run `job`, or None (it still proves itself on every batch). The checks run
    in order and stop at the first that fails, so the costly ones (a low-precision proof's calibration) run
    only for a job the engine could otherwise take."""
    model, spec = job.model, job.spec
    checks: list[Callable[[], str | None]] = [
        lambda: multi_reads(job),
        lambda: "estimand='direct' runs no patched forward" if spec.estimand != "total" else None,
        lambda: "positions='read': the read-token engines run it" if spec.positions == "read" else None,
        lambda: "divergence scores every layer of a whole run" if job.divergence else None,
        lambda: "ablation changes every position it patches: no shared prefix to skip" if spec.mode == "ablation"
        else None,
        lambda: "a gate read at its own position" if model.gated else None,
        lambda: not_continuable(model, job.seqs),
        lambda: "the model keeps no cache to continue" if cache_name(model) is None else None,
        lambda: "no target shares a leading position with its source" if not any(job.unchanged) else None,
        lambda: "no proof can tell a bug from rounding at this dtype" if proof_tol(model) is None else None,
    ]
    return next((why for check in checks if (why := check()) is not None), None)


def total_reason(job: Job) -> str | None:
    """Why a total-effect engine for one read token cannot run `job`, or None."""
    return first(multi_reads(job), "estimand='direct': path-frozen patching" if job.spec.estimand != "total"
                 else None)
