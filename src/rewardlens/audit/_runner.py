"""`audit`: every per-pair instrument and the whole-model ones in one resumable run.

The distinct pairs are cut into fixed chunks of `chunk_size`; each chunk runs the lens, attribution at sublayer and
head level and the faithfulness report (attribution next to read-position patching, total and direct), and its
pairs' rows are committed to the results store in one transaction, each pair under its `content_key`. A run that
dies loses at most the chunk in flight; run again with the same store (the same pairs, a subset, a superset or a
reordering) and it computes only the pairs that are missing, or damaged. Chunks are the unit of sharding too (chunk
c goes to rank c mod world size), so a sharded run does the same computations as one process and its merged store is
bit-for-bit the same. The `Audit` is read back from the store in the order given; the report is a view.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..causal import Circuit, Faithfulness, Patching, trace_pairs
from ..causal.internal import scored_faithfulness
from ..data import Pair, record_columns, record_fields, row_labels
from ..data.internal import UnitMeter, progress_bar, rows_of
from ..errors import HeadError, OutOfMemoryError, RewardLensWarning, StoreError
from ..exact import Attribution, Lens, Steps
from ..exact.internal import STEP_FIELDS
from ..hacking import Concepts, Conflicts, Probes, cascade, distortion
from ..model import Parity, RewardModel
from ..plotting import CompositeView
from ..sae import FeatureAttribution, TopKSAE
from ._divergence import Scoring, stored_divergence
from ._divergence import entries as divergence_entries
from ._graph import AuditGraphs, graph_name
from ._keys import RunKey, checksum
from ._natural import NaturalStates
from ._plan import Decided, PairUnits, Plan, run_keys, skipped_key
from ._store import Store, Units
from ._whole import CIRCUIT, CONFLICT, sae_name, stored_parity, stored_tokens, stored_whole

if TYPE_CHECKING:  # annotations only
    from ..exact import TokenAttribution
    from ..hacking import Cascades, Distortion
    from ..sae import Transcoders

_Result = TypeVar("_Result")


@dataclass(frozen=True)
class Audit(CompositeView):
    """One model's audit over one set of pairs, assembled from the results store.

    Per-pair instruments hold every pair (rows alternate chosen, rejected where they are per
    input): `lens` [2n, L+1], `sublayers` and `heads` (exact attribution at sublayer and head
    level), `faithfulness` (head level, read-position noising: its `total` is the read-position
    patching effect [n, P], `direct` the path-frozen one, plus the seed paper's statistic).
    Whole-model instruments (`probes` on the built-in items, `concepts` on the probe axes'
    contrast sets, `features` when an SAE was given) are None when they were not run.
    """

    model: str
    fingerprint: str
    data_checksum: str
    pair_ids: list[str]
    lens: Lens
    sublayers: Attribution
    heads: Attribution
    faithfulness: Faithfulness
    probes: Probes | None = None
    concepts: Concepts | None = None
    features: FeatureAttribution | None = None
    fraction: float = 0.5
    """Crystallization threshold (share of the final margin) the report uses."""
    provenance: dict[str, Any] = field(default_factory=dict)
    """What the results are of: `model_path` (what `load` was given), `data` (the pairs file),
    `command_line`, `rewardlens_version` and `time_utc` (None where unknown); see `provenance`."""
    subsets: list[str | None] = field(default_factory=list)
    """Each pair's `Pair.subset` in pair order (None where it has none); empty when not recorded."""
    tokens: TokenAttribution | None = None
    """Exact per-token direct contributions of both sides of the pairs in `token_pairs` (rows
    alternate chosen, rejected in that order), when computed."""
    token_pairs: list[int] = field(default_factory=list)
    """The pairs (indices into `pair_ids`) whose tokens `tokens` holds: at most 12, by |margin|."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Pairs left out of every result, by pair id, with the reason (a pair too long for accelerator
    memory even alone); `pair_ids` and every per-pair array hold the others."""
    divergence: Patching | None = None
    """Read-position head noising with divergence scores (`patch(..., divergence=True)`): which of the
    patching effects came from out-of-distribution patched states; None when not run (under 4 pairs)."""
    conflicts: Conflicts | None = None
    """Relations between a multi-objective head's terms on the pairs (`conflict`); None for one output."""
    distortion: Distortion | None = None
    """Distortion indices of the probe axes against the probes' quality degradations (from `probes`)."""
    cascades: Cascades | None = None
    """Which probe axes fail together item by item (from `probes`)."""
    steps: Steps | None = None
    """A reward read at a set of positions (PRM steps, DPO tokens): every read's own score and weight, both
    sides of every pair (`Steps.sequence` = 2·pair + side); None for a reward read at one token."""
    parity: Parity | None = None
    """`rewardlens.model.parity` on the first `parity_pairs` pairs (at most 8): rewardlens' scores against the
    model's own forward; None when not run, and `parity_note` says why (a kind parity refuses, an old store)."""
    parity_note: str = ""
    parity_pairs: int = 0
    circuit: Circuit | None = None
    """The circuit of the top sublayer edges by EAP-IG (`audit_circuit`); None unless `Plan(circuit=True)`."""
    pairs: list[Pair] = field(default_factory=list)
    """The pairs audited, in `pair_ids`' order (empty when not kept): what names each pair in a table."""
    graphs: AuditGraphs | None = None
    """The margin attribution graphs of the first shown pairs (`audit/_graph.py`); None unless `Plan(graph=True)`."""

    def named(self) -> list[Pair]:
        """The pairs that name the audit's rows: `pairs`, else stand-ins holding only each pair's subset."""
        if len(self.pairs) == len(self.pair_ids):
            return self.pairs
        subsets = self.subsets if len(self.subsets) == len(self.pair_ids) else [None] * len(self.pair_ids)
        return [Pair("", "", "", subset=s) for s in subsets]

    def record_rows(self, taken: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Each pair's JSON naming (`record_fields`: id, subset, group and the record's other fields, every key
        present); a field whose name is in `taken` is written as `record.<name>`."""
        return [record_fields(p, str(pid), taken=taken, every=True) for p, pid in zip(self.named(), self.pair_ids)]

    def record_columns(self, taken: Sequence[str] = ()) -> dict[str, list[Any]]:
        """The table columns naming each pair (`record_columns`; Parquet-safe: nested values as JSON text)."""
        return record_columns(self.named(), [str(p) for p in self.pair_ids], taken=taken)


def _split(result: Lens | Attribution | Faithfulness, field_names: Sequence[str], per: int, j: int) -> dict[str, Any]:
    return {f: getattr(result, f)[per * j: per * (j + 1)] for f in field_names}


def _constants(result: Lens | Attribution | Faithfulness, varying: Sequence[str]) -> dict[str, Any]:
    return {f.name: getattr(result, f.name) for f in fields(result)
            if f.name not in (*varying, *result.STORED.derived, *result.STORED.per_chunk)}


def _per_chunk(result: Lens | Attribution | Faithfulness) -> dict[str, Any]:
    """The fields `result` declares per chunk (`STORED.per_chunk`: how it was computed), as plain data for
    every pair's record (a nested dataclass as `asdict`; None left out: nothing was recorded)."""
    plain = {f: getattr(result, f) for f in result.STORED.per_chunk if getattr(result, f) is not None}
    return {f: {k: asdict(v) for k, v in value.items()} if isinstance(value, dict) else asdict(value)
            for f, value in plain.items()}


def _varying(result: Lens | Attribution | Faithfulness) -> tuple[tuple[str, ...], int]:
    """The fields `result` declares cut by chunk (`STORED`), and rows per pair they have (2 or 1); a
    per-pair field left None (the paper's statistic, not asked for) is the run's metadata."""
    stored = result.STORED
    if stored.per_row:
        return stored.per_row, 2
    return tuple(f for f in stored.per_pair if getattr(result, f) is not None), 1


def _chunk_entries(model: RewardModel, pairs: Sequence[Pair], span: Sequence[int], keys: dict[str, RunKey],
                   decided: Decided, plan: Plan, units: Sequence[str], scoring: Scoring | None
                   ) -> tuple[list[tuple[RunKey, str, int, dict[str, Any]]], dict[RunKey, dict[str, Any]]]:
    """The store entries of the pairs `span` (indices into `pairs`, each stored as its unit `units[i]`);
    `scoring`: the run's natural fit, which faithfulness's head-level sweep scores its patched runs against
    (the divergence scores, stored per pair beside it)."""
    part = [pairs[i] for i in span]
    # One traced forward per batch: the lens and both attribution levels are views of its head-level
    # decomposition, and every patching estimand starts from its clean runs; the same forward records
    # attribution patching's targets, so its backward runs no forward of its own.
    traced = trace_pairs(model, part, level="head", batch_size=plan.batch_size, seqs=decided.seqs_of(span),
                         record=decided.spec.mode)
    dec = traced.decomposition
    faithful, scored = scored_faithfulness(
        model, part, None if scoring is None else scoring.fit, level=decided.spec.level, mode=decided.spec.mode,
        batch_size=plan.batch_size, seed_positions=decided.seed_positions, paper=plan.paper, traced=traced)
    results: dict[str, Lens | Attribution | Faithfulness] = {
        "lens": Lens.from_decomposition(dec),
        "sublayers": traced.attribution("sublayer"),
        "heads": traced.attribution("head"),
        "faithfulness": faithful,
    }
    entries: list[tuple[RunKey, str, int, dict[str, Any]]] = []
    meta: dict[RunKey, dict[str, Any]] = {}
    if scoring is not None:  # the pairs the fit covers (one too long for its batches is skipped here too)
        mine = [(j, i) for j, i in enumerate(span) if units[i] in scoring.units]
        rows, meta[scoring.key] = divergence_entries(scoring.key, scored, [units[i] for _, i in mine],
                                                     [i for _, i in mine], [j for j, _ in mine])
        entries += rows
    if dec.steps is not None:
        entries += _step_entries(dec.steps, [units[i] for i in span], span, keys["steps"])
        meta[keys["steps"]] = {}
    for name, res in results.items():
        varying, per = _varying(res)
        meta[keys[name]] = _constants(res, varying)
        entries += [(keys[name], units[i], i, {**_split(res, varying, per, j), **_per_chunk(res)})
                    for j, i in enumerate(span)]
    return entries, meta


def _step_entries(steps: Steps, units: Sequence[str], span: Sequence[int], key: RunKey
                  ) -> list[tuple[RunKey, str, int, dict[str, Any]]]:
    """Each pair's reads (both sides, `sequence` numbered by side: 0 chosen, 1 rejected, so the unit reads
    the same whatever the pair's place in a run) as one store unit."""
    out = []
    for j, (unit, i) in enumerate(zip(units, span)):
        first, second = rows_of(j)
        mine = (steps.sequence == first) | (steps.sequence == second)
        record = {f: getattr(steps, f)[mine] for f in STEP_FIELDS}
        record["sequence"] = record["sequence"] - first
        out.append((key, unit, i, record))
    return out


def run_pairs(model: RewardModel, pairs: Sequence[Pair], store: Store, plan: Plan = Plan(), *,
              rank: int = 0, world_size: int = 1, progress: bool = False, skip: Store | None = None,
              decided: Decided | None = None, natural: NaturalStates | None = None) -> int:
    """Compute this rank's missing pairs, chunk by chunk, storing each chunk as it finishes; returns the
    pairs computed (distinct ones: a pair given twice is one unit, computed once).

    A pair is stored under its content (`content_key`), so the pairs any earlier run of the model stored (a
    subset, a superset, a reordering of these) are read, not computed. The distinct pairs are cut into fixed
    chunks (`PairUnits.spans`), chunk c for rank c mod `world_size`. A damaged unit (its checksum fails)
    counts as missing: it is computed again, replaces the damaged row, and a warning names it.

    `skip`: another store whose finished pairs count as done too (a rank's shard resumes against
    the merged store of an earlier run). `decided`: the run's decisions over all its pairs, when the
    caller made them (`Decided.of`), else made here, once. With `plan.divergence`, the natural fit over every
    pair is made first (`Scoring.of`, unless every pair's scores are stored) and each chunk's faithfulness sweep
    is scored against it; `natural`: holds the fit's states and the fit, for `run_whole` (`finish`)."""
    pairs = list(pairs)
    decided = Decided.of(model, pairs) if decided is None else decided
    if decided.mode != "noising":
        warnings.warn("audit: some pairs read the reward at different numbers of positions on their two sides "
                      "(PRM answers with different numbers of steps, DPO responses of different lengths), so no read "
                      "of one side maps to one of the other: faithfulness patches by zero ablation at every read "
                      "instead of noising, its seed statistic too (docs/rm-kinds.md)", RewardLensWarning, stacklevel=2)
    keys, units = run_keys(model, pairs, plan, decided), PairUnits.of(pairs)
    mine, done = _stored(store, model, keys, units)
    held, seen = mine[1], [mine]
    if skip is not None:
        other, also = _stored(skip, model, keys, units)
        seen.append(other)
        done |= also
    todo = [left for c, span in enumerate(units.spans(plan.chunk_size))
            if c % world_size == rank and (left := [u for u in span if u not in done])]
    scoring = None
    if plan.divergence and not model.reads.multi:  # fitted before any chunk: each chunk's sweep is scored
        natural = NaturalStates() if natural is None else natural
        scoring = natural.scoring = Scoring.of(model, pairs, [s for s, _ in seen], plan, decided, natural, done,
                                               rank, world_size)
        if scoring is not None:
            held[scoring.key] = store.status(scoring.key, units.first)
    desc = f"audit: pairs (rank {rank})" if world_size > 1 else "audit: pairs"
    bar = progress_bar(sum(map(len, todo)), desc, progress, unit="pair")
    meter = UnitMeter(bar)  # pairs: the first span is one pair, which says what a pair costs
    for left in todo:
        with meter.chunk(len(left)):
            _compute(model, pairs, store, [units.first[u] for u in left], keys, held, decided, plan, units, scoring)
    bar.close()
    _say_damaged(seen, {u for left in todo for u in left}, pairs, units)
    return sum(map(len, todo))


def _stored(store: Store, model: RewardModel, keys: dict[str, RunKey], units: PairUnits
            ) -> tuple[tuple[Store, dict[RunKey, Units]], set[str]]:
    """What `store` holds of the run's units, per key (the per-pair instruments and the skipped record), and
    the units finished: stored sound in every instrument, or recorded as skipped."""
    skipped = skipped_key(model)
    held = {key: store.status(key, units.first) for key in [*keys.values(), skipped]}
    done = set.intersection(*(set(held[k].done) for k in keys.values())) | held[skipped].done
    return (store, held), done


def _compute(model: RewardModel, pairs: Sequence[Pair], store: Store, left: list[int], keys: dict[str, RunKey],
             held: dict[RunKey, Units], decided: Decided, plan: Plan, units: PairUnits,
             scoring: Scoring | None = None) -> None:
    """The pairs `left` (indices: one chunk's missing pairs) computed and stored in one transaction; those
    too long for memory even alone are recorded as skipped and the others computed."""
    while left:
        try:
            entries, meta = _chunk_entries(model, pairs, left, keys, decided, plan, units.units, scoring)
        except OutOfMemoryError as exc:  # pairs that fit in no batch: recorded, and the rest computed
            left = _skip(store, skipped_key(model), pairs, units.units, left, exc)
            continue
        # Chunks are written whole (one transaction), so none is ever half stored; an instrument that
        # already holds a sound unit (a store filled by an older run of fewer instruments) keeps it.
        store.write([e for e in entries if e[1] not in held[e[0]].done], meta)
        return


def _say_damaged(seen: Sequence[tuple[Store, dict[RunKey, Units]]], computed: set[str], pairs: Sequence[Pair],
                 units: PairUnits) -> None:
    """One warning per store naming the damaged units this run computed again (instrument, pair, unit)."""
    for store, held in seen:
        named = [f"{key.instrument} pair {_pair_id(pairs, units.first[u])} (unit {u})"
                 for key, got in held.items() for u in got.damaged if u in computed]
        if named:
            more = f", and {len(named) - DAMAGE_NAMED} more" if len(named) > DAMAGE_NAMED else ""
            warnings.warn(f"audit: {len(named)} damaged unit(s) in {store.path} were recomputed: "
                          f"{', '.join(named[:DAMAGE_NAMED])}{more}", RewardLensWarning, stacklevel=3)


DAMAGE_NAMED = 8
"""Damaged units a warning names (the rest are counted)."""


def _skip(store: Store, key: RunKey, pairs: Sequence[Pair], units: Sequence[str], left: list[int],
          exc: OutOfMemoryError) -> list[int]:
    """Record the pairs of `left` that `exc` names as skipped for memory; return the others."""
    if not exc.pairs:  # an error that names no pair would loop forever: it is not the per-pair kind
        raise exc
    bad = sorted({left[p] for p in exc.pairs})
    warnings.warn(f"audit: {len(bad)} pair(s) did not fit in accelerator memory even alone and are skipped "
                  f"(recorded in the store; the report lists them): {', '.join(_pair_id(pairs, i) for i in bad)}",
                  RewardLensWarning, stacklevel=4)
    store.write([(key, units[i], i, {"reason": "out of accelerator memory at batch size 1"}) for i in bad])
    return [i for i in left if i not in set(bad)]


def _pair_id(pairs: Sequence[Pair], i: int) -> str:
    given = pairs[i].id
    return given if given is not None else str(i)


def provenance(model: RewardModel, data: str | Path | None = None, command_line: str | None = None) -> dict[str, Any]:
    """What a report is of: the model's folder or hub id (as given to `load`; an existing folder made
    absolute), the data file, the command line, the rewardlens version and the time (UTC, ISO 8601)."""
    from .._version import __version__

    def where(path: object) -> str | None:
        if path is None:
            return None
        local = Path(str(path)).expanduser()
        return str(local.resolve()) if local.exists() else str(path)

    return {"model_path": where(getattr(model, "source", None)), "data": where(data), "command_line": command_line,
            "rewardlens_version": __version__, "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def collect(model: RewardModel, pairs: Sequence[Pair], store: Store, plan: Plan = Plan(), *,
            sae: TopKSAE | None = None, data: str | Path | None = None, command_line: str | None = None,
            decided: Decided | None = None, transcoders: Transcoders | None = None) -> Audit:
    """Read the audit of `pairs` back from `store`; `StoreError` when some pairs are missing.

    `data` (the pairs file) and `command_line` go into the audit's `provenance`, with the model's
    path (`load`'s `path_or_id`), the rewardlens version and the time. `decided`: the run's decisions
    (`Decided.of`), when the caller has them; `transcoders`: the graphs', which name their stored run."""
    keys, every = run_keys(model, pairs, plan, decided), list(pairs)
    units = PairUnits.of(every).units
    reasons = dict(store.records(skipped_key(model), set(units)))
    skipped = {i: reasons[u]["reason"] for i, u in enumerate(units) if u in reasons}
    kept = [i for i in range(len(every)) if i not in skipped]  # pair i of the audit is pair kept[i] of the input
    pairs, n = [every[i] for i in kept], len(kept)
    parts = {name: _stacked(store, key, [units[i] for i in kept], by_side=name == "steps")
             for name, key in keys.items()}
    ids = [_pair_id(every, i) for i in kept]
    rows = row_labels(2 * n, True)

    def per_pair(cls: Callable[..., _Result], name: str) -> _Result:
        stacked, meta = parts[name]
        return cls(**stacked, **meta, rows=rows, is_pairs=True)

    def whole(cls: Callable[..., _Result], name: str) -> _Result | None:
        record = stored_whole(model, every, store, name)
        return None if record is None else cls(**record)

    lens_, sublayers, heads = per_pair(Lens, "lens"), per_pair(Attribution, "sublayers"), per_pair(Attribution, "heads")
    steps = None
    if "steps" in parts:
        got = parts["steps"][0]
        steps = Steps(**{f: np.asarray(got[f]) for f in STEP_FIELDS}, values=None, names=[])
    stacked, meta = parts["faithfulness"]
    probes = whole(Probes, plan.probes_name())
    concepts_ = whole(Concepts, plan.concepts_name(stored_whole(model, every, store, plan.probes_name())))
    features = whole(FeatureAttribution, sae_name(sae, plan))
    conflicts_ = whole(Conflicts, CONFLICT)
    if conflicts_ is not None:  # stored as a list of lists (`_plain`)
        conflicts_ = replace(conflicts_, relation=np.array(conflicts_.relation, dtype=object))
    # Derived from the stored probes, no forward: the quality degradations the probes scored, and
    # the per-item effects they hold.
    distortion_ = distortion(probes) if probes is not None and probes.quality else None
    tokens_, token_pairs = stored_tokens(model, every, store)
    position = {i: j for j, i in enumerate(kept)}
    parity_, parity_note, parity_pairs = stored_parity(model, every, store)
    graphs = whole(AuditGraphs, graph_name(transcoders)) if plan.graph else None
    if graphs is not None:  # stored by the run's pair index, read back by the audit's
        graphs = replace(graphs, pairs=[position[i] for i in graphs.pairs])
    return Audit(model=repr(model), fingerprint=keys["lens"].model, data_checksum=checksum(every), pair_ids=ids,
                 faithfulness=Faithfulness(**stacked, **meta, pair_ids=ids), fraction=plan.fraction,
                 lens=lens_, sublayers=sublayers, heads=heads, probes=probes, concepts=concepts_, features=features,
                 provenance=provenance(model, data, command_line), subsets=[p.subset for p in pairs],
                 divergence=stored_divergence(model, every, store, ids), conflicts=conflicts_, distortion=distortion_,
                 tokens=tokens_, token_pairs=[position[i] for i in token_pairs],
                 skipped={_pair_id(every, i): reason for i, reason in skipped.items()}, steps=steps,
                 cascades=None if probes is None else cascade(probes), parity=parity_, parity_note=parity_note,
                 parity_pairs=parity_pairs, circuit=whole(Circuit, CIRCUIT), pairs=pairs, graphs=graphs)


def _stacked(store: Store, key: RunKey, want: Sequence[str], by_side: bool
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The records of the units `want` (one per pair, in the audit's order; a unit given twice is read for
    both places) concatenated field by field, and the run's metadata; `StoreError` when some are missing.
    `by_side`: the steps' `sequence` is a side (0, 1) in a unit and becomes the audit's row, 2·pair + side."""
    got = dict(store.records(key, set(want)))
    missing = sum(u not in got for u in want)
    if missing:
        raise StoreError(f"the store {store.path} holds {len(want) - missing} of {len(want)} pairs for "
                         f"{key.instrument}; {missing} are missing — run the audit again with this store to "
                         "finish them")
    records = [got[u] for u in want]
    if by_side:
        records = [{**r, "sequence": (r["sequence"] + 2 * j).astype(np.int64)} for j, r in enumerate(records)]
    meta = store.meta(key)
    assert meta is not None  # the run's row exists: it holds the records just read
    # arrays are cut by pair and concatenate; anything else is per chunk (`Stored.per_chunk`), one per pair
    return {f: np.concatenate([r[f] for r in records]) if isinstance(records[0][f], np.ndarray)
            else [r[f] for r in records] for f in records[0]}, meta


def plan_for_model(model: RewardModel, plan: Plan, sae: TopKSAE | None) -> Plan:
    """`plan` as `model` can run it (every audit entry point asks this before any store is written): a
    reward read at a set of positions gets the per-pair instruments, patched at that set, and each
    read's score; the steps that read one token per sequence are left out, and said so."""
    if not model.reads.multi:
        return plan
    if sae is not None:  # before any store is made: nothing half-written to clean up
        raise HeadError("SAE features are read at one token per sequence; this model reads its reward at a set of "
                        "positions: audit it without --sae")
    left = [name for name, on in (("probes", plan.probes), ("concepts", plan.concepts), ("divergence",
            plan.divergence), ("tokens", plan.tokens), ("the paper's prefix statistic", plan.paper),
            ("the circuit", plan.circuit), ("the attribution graphs", plan.graph)) if on]
    if left:
        warnings.warn(f"audit: the model reads its reward at a set of positions (Reads(at={model.reads.at!r})); "
                      f"{', '.join(left)} read one token per sequence and are left out (docs/rm-kinds.md)",
                      RewardLensWarning, stacklevel=3)
    return plan.for_reads()


__all__ = ["Audit", "collect", "plan_for_model", "provenance", "run_pairs"]
