"""The audit's divergence scores: the head-level read-position sweep faithfulness runs, scored once.

Divergence asks which patched runs left the natural distribution of read-position residuals
(`patch(..., divergence=True)`), fitted over every pair. The audit fits it before the per-pair stage
(`Scoring.of`: every pair's residuals traced head-less, in the chunks' own spans and batch size), so
each chunk's faithfulness sweep scores its own patched runs (`scored_faithfulness`) and the head-level
`Patching` is stored per pair beside faithfulness, under a run key whose `data` is the checksum of the
pairs the fit covers (its scores depend on all of them). The fit is not stored (it is as large as the
states): a run that still has scores to compute fits again. A pair whose faithfulness is stored but whose
scores are not (stored by an audit of another pair set) is patched once more, alone (`finish`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..causal import Patching, patch, trace_pairs
from ..causal.internal import NaturalFit
from ..data import Pair
from ..data.internal import progress_bar
from ..errors import OutOfMemoryError
from ..model import RewardModel
from ..model.internal import Tokenized, continuable
from ..types import Mode, Stored
from ._keys import RunKey, checksum, fingerprint
from ._natural import NaturalStates
from ._plan import VERSION, Decided, PairUnits, Plan, skipped_key
from ._store import Store

DIVERGENCE = "divergence/head/noising"
"""The store name of the scored head-level sweep (per pair, keyed by the fitted pair set's checksum)."""
MIN_PAIRS = 4
"""Pairs divergence needs: the natural fit calibrates on at least 8 sequences (`MIN_REFERENCE`)."""
STORED = Stored(per_pair=("chosen", "rejected", "patched_chosen", "patched_rejected", "divergence"),
                derived=("pair_ids",), per_chunk=("provenance",))
"""How the audit's store keeps the scored `Patching`: one record per pair, the rest the run's metadata.
(Declared here, not on `Patching`, so the audit's schema version, a digest of the results' declarations,
stays that of the stores written before.)"""


def divergence_key(model: RewardModel, fitted: Sequence[Pair]) -> RunKey:
    """The store key of the scores against a fit over `fitted` (in the run's order, a pair given twice twice)."""
    return RunKey(fingerprint(model), checksum(list(fitted)), DIVERGENCE, VERSION)


def kept(model: RewardModel, pairs: Sequence[Pair], stores: Sequence[Store]) -> list[int]:
    """The pairs (indices) no store records as skipped for memory: the ones divergence fits over and scores."""
    units = PairUnits.of(pairs).units
    skipped = set().union(*(store.done(skipped_key(model), set(units)) for store in stores))
    return [i for i, unit in enumerate(units) if unit not in skipped]


@dataclass(frozen=True)
class Scoring:
    """The run's natural fit, the units it covers and the key their scores are stored under."""

    fit: NaturalFit
    key: RunKey
    units: frozenset[str]

    @classmethod
    def of(cls, model: RewardModel, pairs: Sequence[Pair], stores: Sequence[Store], plan: Plan, decided: Decided,
           natural: NaturalStates, done: Collection[str] = frozenset(), rank: int = 0, world_size: int = 1
           ) -> Scoring | None:
        """The fit over every kept pair, or None when under `MIN_PAIRS` are kept or every kept pair's scores are
        stored already (nothing to score). This rank traces its chunks' residuals (`units.spans`: chunk c on
        rank c mod `world_size`), the pairs `done` (stored) apart from the others, so the batches of the pairs
        the per-pair stage computes are its traces' own; under torchrun every rank gathers every rank's. A pair
        too long for memory is left out of the fit (the per-pair stage records it as skipped)."""
        if world_size > 1 and not _grouped():  # one rank's chunks by hand: no fit over every pair to share, so
            return None  # its chunks are stored unscored and `finish` scores them once every pair is stored
        units = PairUnits.of(pairs)
        keep = _agreed(kept(model, pairs, stores), world_size)  # rank 0's view: one fit on every rank
        key = divergence_key(model, [pairs[i] for i in keep])
        want = {units.units[i] for i in keep}
        stored = set().union(*(store.done(key, want) for store in stores))
        if not _agreed(len(keep) >= MIN_PAIRS and not want <= stored, world_size):
            return None
        for c, span in enumerate(units.spans(plan.chunk_size)):
            if c % world_size == rank:
                mine = [u for u in span if u in want]
                for group in ([u for u in mine if u not in done], [u for u in mine if u in done]):
                    _trace(model, natural, group, units, decided, plan.batch_size)
        if world_size > 1:
            import torch.distributed as dist

            held: list[dict[str, Any] | None] = [None] * world_size
            dist.all_gather_object(held, natural.by_unit)
            for got in held:
                natural.by_unit.update(got or {})
        fitted = [i for i in keep if units.units[i] in natural.by_unit]
        if len(fitted) < MIN_PAIRS:
            return None
        fit = natural.fit(model, decided.seqs_of(fitted) or [], [units.units[i] for i in fitted], plan.batch_size)
        return cls(fit, divergence_key(model, [pairs[i] for i in fitted]), frozenset(units.units[i] for i in fitted))


def _trace(model: RewardModel, natural: NaturalStates, group: list[str], units: PairUnits, decided: Decided,
           batch_size: int) -> None:
    """Keep the read-position residuals of the pairs `group` (one batch loop, as a chunk's trace runs it);
    pairs that fit in no batch are left out, and the others traced again."""
    while group:
        try:
            natural.trace(model, decided.seqs_of([units.first[u] for u in group]) or [], group, batch_size)
            return
        except OutOfMemoryError as exc:
            if not exc.pairs:  # not the per-pair kind: a bug or a real failure
                raise
            bad = {group[p] for p in exc.pairs}
            group = [u for u in group if u not in bad]


def entries(key: RunKey, scored: Patching, units: Sequence[str], span: Sequence[int],
            rows: Sequence[int] | None = None) -> tuple[list[tuple[RunKey, str, int, dict[str, Any]]], dict[str, Any]]:
    """The store entries of a scored sweep for the pairs `span` (their units `units`; `rows`: each one's pair in
    `scored`, default in order), and its metadata."""
    per_chunk = {} if scored.provenance is None else {"provenance": asdict(scored.provenance)}
    at = range(len(units)) if rows is None else rows
    out = [(key, unit, i, {**{f: getattr(scored, f)[j: j + 1] for f in STORED.per_pair}, **per_chunk})
           for j, unit, i in zip(at, units, span)]
    meta = {f: getattr(scored, f) for f in ("names", "mode", "positions", "level", "estimand", "approximate",
                                             "min_margin")}
    return out, meta


def finish(model: RewardModel, pairs: Sequence[Pair], store: Store, plan: Plan, decided: Decided | None,
           natural: NaturalStates | None, progress: bool = False) -> None:
    """Score the kept pairs whose scores the store lacks (stored by an audit of another pair set, or by a run
    without divergence), chunk by chunk, each chunk stored as it finishes: its trace, then `patch(natural=fit)`.
    The fit is the per-pair stage's when it covers the same pairs (`natural.scoring`), else fitted here."""
    keep = kept(model, pairs, [store])
    if len(keep) < MIN_PAIRS:
        return
    units = PairUnits.of(pairs)
    key = divergence_key(model, [pairs[i] for i in keep])
    done = store.done(key, {units.units[i] for i in keep})
    todo = [u for u in units.first if u in {units.units[i] for i in keep} and u not in done]
    if not todo:
        return
    decided = Decided.of(model, pairs) if decided is None or not decided.seqs else decided
    natural = NaturalStates() if natural is None else natural
    scoring = natural.scoring if isinstance(natural.scoring, Scoring) and natural.scoring.key == key else (
        Scoring.of(model, pairs, [store], plan, decided, natural))
    if scoring is None or scoring.key != key:  # a pair no batch holds: the per-pair stage records it, a run later
        return
    mode = decided.mode
    bar = progress_bar(len(todo), "audit: divergence of stored pairs", progress, unit="pair")
    for start in range(0, len(todo), plan.chunk_size):
        part = [units.first[u] for u in todo[start:start + plan.chunk_size]]
        scored = _alone(model, [pairs[i] for i in part], decided.seqs_of(part) or [], scoring.fit, mode, plan)
        rows, meta = entries(key, scored, [units.units[i] for i in part], part)
        store.write(rows, {key: meta})
        bar.update(len(part))
    bar.close()


def _alone(model: RewardModel, part: Sequence[Pair], seqs: list[Tokenized], fit: NaturalFit, mode: Mode,
           plan: Plan) -> Patching:
    """One chunk's head-level read-position sweep scored against `fit`, from its own trace (whose recorded
    caches the sweep continues where the model's cache can be continued)."""
    record = mode if continuable(model, seqs) else None
    traced = trace_pairs(model, part, level="head", batch_size=plan.batch_size, seqs=seqs, record=record)
    return patch(model, part, mode=mode, level="head", divergence=True, natural=fit, clean=traced.clean,
                 batch_size=plan.batch_size)


def stored_divergence(model: RewardModel, pairs: Sequence[Pair], store: Store, ids: list[str]) -> Patching | None:
    """The scored sweep of the kept pairs (`ids`: theirs), or None when the store lacks some pair's scores
    (divergence not run, under `MIN_PAIRS` pairs, or a run that did not finish)."""
    keep = kept(model, pairs, [store])
    units = PairUnits.of(pairs).units
    key = divergence_key(model, [pairs[i] for i in keep])
    got = dict(store.records(key, {units[i] for i in keep}))
    meta = store.meta(key)
    if len(keep) < MIN_PAIRS or meta is None or any(units[i] not in got for i in keep):
        return None
    records = [got[units[i]] for i in keep]
    fields: dict[str, Any] = {f: np.concatenate([r[f] for r in records]) for f in STORED.per_pair}
    fields["provenance"] = records[0].get("provenance")  # as `Patching.joined`: the first chunk's engine
    return Patching(**fields, **meta, pair_ids=ids)


def _agreed(value: Any, world_size: int) -> Any:
    """Rank 0's `value` on every rank (a decision every rank must share: a rank left out of a gather hangs)."""
    if world_size == 1:
        return value
    import torch.distributed as dist

    got = [value]
    dist.broadcast_object_list(got, src=0)
    return got[0]


def _grouped() -> bool:
    """Whether a torch.distributed process group is up (the ranks of a torchrun audit share the fit through it)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
