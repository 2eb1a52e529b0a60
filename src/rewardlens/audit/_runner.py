"""`audit`: every per-pair instrument and the whole-model ones in one resumable run.

Pairs are cut into fixed chunks of `chunk_size`; each chunk runs the lens, attribution at
sublayer and head level and the faithfulness report (attribution next to read-position
patching, total and direct), and its pairs' rows are committed to the results store in one
transaction. A run that dies loses at most the chunk in flight; run again with the same store
and it computes only the chunks that are missing. Chunks are the unit of sharding too (chunk c
goes to rank c mod world size), so a sharded run does the very same computations as a single
process and its merged store is bit-for-bit the same. The `Audit` is then read back from the
store: the report is a view over it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..causal import Faithfulness, aligned, faithfulness
from ..data import Pair, progress_bar, row_labels
from ..errors import StoreError
from ..exact import Attribution, Lens, attribute, lens
from ..hacking import Concepts, Item, Probes, concepts, probe
from ..model import RewardModel
from ..sae import FeatureAttribution, TopKSAE, attribute_features
from ..types import Positions
from ._lock import RunLock, run_lock
from ._store import RunKey, Store, checksum, fingerprint

_Result = TypeVar("_Result")

VERSION = "1"
"""Version of every audit instrument's stored numbers: bump when any of them would change."""

# Fields of each per-pair result that are indexed by input row (two per pair) or by pair; the
# rest are the same for every chunk and go into the run's metadata.
_ROW_FIELDS: dict[type, tuple[str, ...]] = {
    Lens: ("linear", "normed", "reward", "linear_objectives", "normed_objectives"),
    Attribution: ("values", "constant", "reward", "per_objective", "objective_constant", "objective_reward"),
}
_PAIR_FIELDS = ("attribution", "direct", "total", "attribution_patching", "seed_attribution", "seed_effect")
_DERIVED = {"rows", "is_pairs", "pair_ids"}


@dataclass(frozen=True)
class Audit:
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



@dataclass(frozen=True)
class Plan:
    """What one audit run computes; the same plan over the same model and pairs finds the same store rows."""

    chunk_size: int = 8
    """Pairs per chunk: the unit of writing, resuming and sharding."""
    batch_size: int = 8
    """Sequences per forward inside a chunk."""
    probes: bool = True
    """Run the hacking probes on the built-in items (scaled by the pairs' mean |margin|)."""
    concepts: bool = True
    """Run the concept directions and dose-response on the probe axes' contrast sets."""
    probe_items: int | None = None
    """Use only this many built-in items (spread over the domains) for probes and concepts: a quick
    smoke run; None uses all 72."""
    sae_layer: int | None = None
    """Residual layer of the SAE, when one is given."""
    fraction: float = 0.5
    """Crystallization threshold the report uses."""

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.batch_size < 1:
            raise ValueError(f"chunk_size and batch_size must be >= 1, got {self.chunk_size} and {self.batch_size}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.probe_items is not None and self.probe_items < 2:
            raise ValueError(f"probe_items must be >= 2 (concepts need two inputs a side) or None, "
                             f"got {self.probe_items}")

    def items(self) -> list[Item] | None:
        """The built-in items the probes and concepts use (None: all of them)."""
        if self.probe_items is None:
            return None
        from ..hacking import ITEMS

        step = max(1, len(ITEMS) // self.probe_items)
        return list(ITEMS[::step][: self.probe_items])

    def suffix(self) -> str:
        return "" if self.probe_items is None else f"/items-{self.probe_items}"


def _run_keys(model: RewardModel, pairs: Sequence[Pair], seed_positions: Positions) -> dict[str, RunKey]:
    fp, data = fingerprint(model), checksum(pairs)
    names = {"lens": "lens", "sublayers": "attribution/sublayer", "heads": "attribution/head",
             "faithfulness": f"faithfulness/head/noising/seed-{seed_positions}"}
    return {field: RunKey(fp, data, name, VERSION) for field, name in names.items()}


def _whole_key(model: RewardModel, pairs: Sequence[Pair], name: str) -> RunKey:
    return RunKey(fingerprint(model), checksum(pairs), name, VERSION)


def chunks(n_pairs: int, chunk_size: int) -> list[range]:
    """The fixed chunks of pair indices every run (and every rank) cuts the pairs into."""
    return [range(s, min(s + chunk_size, n_pairs)) for s in range(0, n_pairs, chunk_size)]


def _split(result: Lens | Attribution | Faithfulness, field_names: Sequence[str], per: int, j: int) -> dict[str, Any]:
    return {f: getattr(result, f)[per * j: per * (j + 1)] for f in field_names}


def _constants(result: Lens | Attribution | Faithfulness, varying: Sequence[str]) -> dict[str, Any]:
    return {f.name: getattr(result, f.name) for f in fields(result)
            if f.name not in varying and f.name not in _DERIVED}


def _chunk_entries(model: RewardModel, pairs: Sequence[Pair], span: range, keys: dict[str, RunKey],
                   seed_positions: Positions, batch_size: int
                   ) -> tuple[list[tuple[RunKey, str, int, dict[str, Any]]], dict[RunKey, dict[str, Any]]]:
    part = [pairs[i] for i in span]
    results: dict[str, Lens | Attribution | Faithfulness] = {
        "lens": lens(model, part, batch_size=batch_size),
        "sublayers": attribute(model, part, batch_size=batch_size),
        "heads": attribute(model, part, level="head", batch_size=batch_size),
        "faithfulness": faithfulness(model, part, level="head", batch_size=batch_size,
                                     seed_positions=seed_positions),
    }
    entries: list[tuple[RunKey, str, int, dict[str, Any]]] = []
    meta: dict[RunKey, dict[str, Any]] = {}
    for name, res in results.items():
        varying, per = (_PAIR_FIELDS, 1) if name == "faithfulness" else (_ROW_FIELDS[type(res)], 2)
        meta[keys[name]] = _constants(res, varying)
        entries += [(keys[name], str(i), i, _split(res, varying, per, j)) for j, i in enumerate(span)]
    return entries, meta


def run_pairs(model: RewardModel, pairs: Sequence[Pair], store: Store, plan: Plan = Plan(), *,
              rank: int = 0, world_size: int = 1, progress: bool = False, skip: Store | None = None) -> int:
    """Compute this rank's missing chunks and store each as it finishes; returns pairs computed.

    `skip`: another store whose finished pairs count as done too (a rank's shard resumes against
    the merged store of an earlier run)."""
    pairs = list(pairs)
    seed_positions: Positions = "all" if aligned(model, pairs) else "read"
    keys = _run_keys(model, pairs, seed_positions)
    done = set.intersection(*(store.done(k) for k in keys.values()))
    if skip is not None:
        done |= set.intersection(*(skip.done(k) for k in keys.values()))
    todo = [span for c, span in enumerate(chunks(len(pairs), plan.chunk_size))
            if c % world_size == rank and not all(str(i) in done for i in span)]
    desc = f"audit: pairs (rank {rank})" if world_size > 1 else "audit: pairs"
    bar = progress_bar(sum(map(len, todo)), desc, progress)
    for span in todo:
        entries, meta = _chunk_entries(model, pairs, span, keys, seed_positions, plan.batch_size)
        # Chunks are written whole (one transaction), so none is ever half stored; an instrument
        # that already holds a unit (a store filled by an older run of fewer instruments) keeps it.
        held = {key: store.done(key) for key in keys.values()}
        entries = [e for e in entries if e[1] not in held[e[0]]]
        store.write(entries, meta)
        bar.update(len(span))
    bar.close()
    return sum(map(len, todo))


def run_whole(model: RewardModel, pairs: Sequence[Pair], store: Store, plan: Plan = Plan(), *,
              sae: TopKSAE | None = None, progress: bool = False) -> None:
    """The whole-model instruments the plan asks for, each stored once (skipped when already there)."""
    pairs = list(pairs)
    items = plan.items()

    def features() -> FeatureAttribution:
        assert sae is not None and plan.sae_layer is not None  # run with an SAE only; _sae_name checked the layer
        return attribute_features(model, sae, pairs, layer=plan.sae_layer, batch_size=plan.batch_size)

    whole: tuple[tuple[str, Callable[[], Probes | Concepts | FeatureAttribution], bool], ...] = (
        ("probes" + plan.suffix(), lambda: probe(model, items, reference=pairs, batch_size=2 * plan.batch_size,
                                                 progress=progress), plan.probes),
        ("concepts" + plan.suffix(), lambda: concepts(model, items=items, batch_size=2 * plan.batch_size,
                                                      progress=progress), plan.concepts),
        (_sae_name(sae, plan), features, sae is not None),
    )
    jobs = [(name, fn) for name, fn, wanted in whole if wanted]
    bar = progress_bar(len(jobs), "audit: whole-model instruments", progress)
    for name, fn in jobs:
        key = _whole_key(model, pairs, name)
        bar.set_postfix_str(name.split("/")[0])  # the outer bar names the step; the step's own bar moves below
        if "all" not in store.done(key):
            res = fn()
            store.write([(key, "all", 0, {f.name: getattr(res, f.name) for f in fields(res)})])
        bar.update(1)
    bar.close()


def _sae_name(sae: TopKSAE | None, plan: Plan) -> str:
    """The SAE's store name: its layer and a checksum of its config and weights (a strided sample
    of the decoder, so a dictionary of millions of latents is not read whole)."""
    if sae is None:
        return "features"
    if plan.sae_layer is None:
        raise ValueError("an SAE needs the residual layer it was trained on: pass Plan(sae_layer=...)")
    flat = sae.W_dec.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // 65536)]
    parts = [t.float().cpu().numpy().tolist() for t in (sample, sae.b_dec.detach(), sae.encoder.bias.detach())]
    return f"features/L{plan.sae_layer}/{checksum([sae.cfg, *parts])}"


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
            sae: TopKSAE | None = None, data: str | Path | None = None, command_line: str | None = None) -> Audit:
    """Read the audit of `pairs` back from `store`; `StoreError` when some pairs are missing.

    `data` (the pairs file) and `command_line` go into the audit's `provenance`, with the model's
    path (`load`'s `path_or_id`), the rewardlens version and the time."""
    pairs = list(pairs)
    keys = _run_keys(model, pairs, "all" if aligned(model, pairs) else "read")
    n = len(pairs)
    parts: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for name, key in keys.items():
        records = store.records(key)
        if [u for u, _ in records] != [str(i) for i in range(n)]:
            missing = n - len(records)
            raise StoreError(f"the store {store.path} holds {len(records)} of {n} pairs for {key.instrument}; "
                                  f"{missing} are missing — run the audit again with this store to finish them")
        meta = store.meta(key)
        assert meta is not None  # the run's row exists: it holds the records just read
        stacked: dict[str, Any] = {f: np.concatenate([r[f] for _, r in records]) for f in records[0][1]}
        parts[name] = stacked, meta
    ids = [p.id if p.id is not None else str(i) for i, p in enumerate(pairs)]
    rows = row_labels(2 * n, True)

    def per_pair(cls: Callable[..., _Result], name: str) -> _Result:
        stacked, meta = parts[name]
        return cls(**stacked, **meta, rows=rows, is_pairs=True)

    def whole(cls: Callable[..., _Result], name: str) -> _Result | None:
        records = store.records(_whole_key(model, pairs, name))
        return cls(**records[0][1]) if records else None

    lens_, sublayers, heads = per_pair(Lens, "lens"), per_pair(Attribution, "sublayers"), per_pair(Attribution, "heads")
    stacked, meta = parts["faithfulness"]
    probes = whole(Probes, "probes" + plan.suffix())
    concepts_ = whole(Concepts, "concepts" + plan.suffix())
    features = whole(FeatureAttribution, _sae_name(sae, plan))
    return Audit(model=repr(model), fingerprint=keys["lens"].model, data_checksum=keys["lens"].data, pair_ids=ids,
                 faithfulness=Faithfulness(**stacked, **meta, pair_ids=ids), fraction=plan.fraction,
                 lens=lens_, sublayers=sublayers, heads=heads, probes=probes, concepts=concepts_, features=features,
                 provenance=provenance(model, data, command_line))


def audit(model: RewardModel, pairs: Sequence[Pair], *, store: Store | str | Path | None = None,
          plan: Plan = Plan(), sae: TopKSAE | None = None, progress: bool = False,
          data: str | Path | None = None) -> Audit:
    """Run (or finish) the audit of `pairs` in `store` and return it.

    `data`: the file the pairs came from, recorded in the audit's `provenance` (None: not known).

    `store`: a `Store`, a path to one, or None for an in-memory run. Finished pairs already in the
    store are not computed again. Given a path, the run holds the run lock of the store's folder
    (`run_lock`) throughout, so a second audit into it refuses (`RunLockedError`, naming this
    run's pid and start time) instead of racing this one on the same chunks.
    """
    path = None if isinstance(store, Store) or store is None or str(store) == ":memory:" else Path(store)
    lock: AbstractContextManager[RunLock | None] = nullcontext() if path is None else run_lock(path.parent)
    with lock:
        db = store if isinstance(store, Store) else Store(path if path is not None else ":memory:")
        own = db is not store
        try:
            run_pairs(model, pairs, db, plan, progress=progress)
            run_whole(model, pairs, db, plan, sae=sae, progress=progress)
            return collect(model, pairs, db, plan, sae=sae, data=data)
        finally:
            if own:
                db.close()


__all__ = ["Audit", "Plan", "audit", "chunks", "collect", "run_pairs", "run_whole"]
