"""`audit`: the whole run in one call (lock, per-pair chunks, shards, whole-model results, read back),
and `resume_status`: what a store already holds of a run, for the resume message.

A sharded run (under torchrun, `world_size` > 1) is the same run cut by chunk: rank r computes the
chunks c with c mod world_size = r into its own shard (`shard_path`), every rank waits for the
others, and rank 0 merges the shards into the main store and finishes the run there; the merged
store is bit-for-bit a single process's (docs/audit.md, Sharding).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..data import Pair
from ..errors import RunLockedError, UsageError
from ..model import RewardModel
from ..sae import TopKSAE, Transcoders
from ._graph import check_graph
from ._keys import checksum
from ._lock import run_lock
from ._natural import NaturalStates
from ._plan import VERSION, Decided, PairUnits, Plan, run_keys, skipped_key
from ._runner import Audit, collect, plan_for_model, run_pairs
from ._scored import stored_chunks
from ._store import Store
from ._whole import run_whole


def shard_path(store: str | Path, rank: int) -> Path:
    """The shard rank `rank` of a sharded run writes beside the main store: `results.rank{r}.sqlite`."""
    path = Path(store)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


@dataclass(frozen=True)
class ResumeStatus:
    """What a results store holds of one run: the pairs whose every per-pair instrument is stored and sound
    (or that were recorded as skipped), found by content whichever run stored them (this one before an
    interrupt, or an earlier run of a subset, a superset or a reordering of the pairs), and the
    whole-model results stored for the same model and pair set."""

    path: Path
    """The store read."""
    n_pairs: int
    """Pairs of the run."""
    kept: int
    """Pairs a rerun reads from the store instead of computing (0 when the store does not exist)."""
    whole: int
    """Whole-model results (probes, concepts, ...) stored for this model and data."""
    chunks: int = 0
    """Chunks of probe sequences stored for this model and the plan's read (`probe_memo`): a rerun reads them."""

    @staticmethod
    def reused(kept: int, n_pairs: int) -> str:
        """How many of a run's pairs the store held before it, in the words a resumed run says it with."""
        return f"{kept} of {n_pairs} pairs already in the store (reused from an earlier run)"

    def message(self, command_line: str) -> str:
        """The one line an interrupted run prints: what is kept and the command that resumes."""
        if not self.path.is_file():
            return f"rewardlens: interrupted before this run stored anything; start it again with: {command_line}"
        also = f" and {self.whole} whole-model result{'s' * (self.whole != 1)}" if self.whole else ""
        also += f" and {self.chunks} chunk{'s' * (self.chunks != 1)} of probe sequences" if self.chunks else ""
        return (f"rewardlens: interrupted; {self.path} keeps {self.kept} of {self.n_pairs} pairs{also} (a rerun "
                f"reuses them, found by content); resume with: {command_line}")


def resume_status(store: str | Path, model: RewardModel, pairs: Sequence[Pair], plan: Plan = Plan(),
                  decided: Decided | None = None) -> ResumeStatus:
    """What `store` holds of the audit of `pairs` under `plan`, by the run keys `run_pairs` resumes by
    (a store that does not exist holds nothing and is not created); `decided`: the run's decisions
    (`Decided.of`) when the caller made them."""
    path, pairs = Path(store), list(pairs)
    if not path.is_file():
        return ResumeStatus(path, len(pairs), 0, 0)
    db = Store(path)
    try:
        keys = run_keys(model, pairs, plan.for_reads() if model.reads.multi else plan, decided)
        units = PairUnits.of(pairs).units
        done = set.intersection(*(db.done(k, set(units)) for k in keys.values()))
        done |= db.done(skipped_key(model), set(units))
        same = (keys["lens"].model, checksum(pairs), VERSION)  # the whole-model runs: keyed by the pair set
        whole = sum("all" in db.done(k, ["all"]) for k in db.keys() if (k.model, k.data, k.version) == same)
        chunks = stored_chunks(model, db, plan) if plan.probes and not model.reads.multi else 0
    finally:
        db.close()
    return ResumeStatus(path, len(pairs), sum(unit in done for unit in units), whole, chunks)


@contextlib.contextmanager
def _locks(folders: Mapping[Path, str], rank: int, world_size: int) -> Iterator[None]:
    """Rank 0 holds the run lock of every folder this run writes (docs/audit.md, Concurrency), each with the
    fix its refusal names, so a second run into one refuses, naming this one; the other ranks learn of a
    refusal from rank 0 instead of waiting at a barrier for a rank that stopped."""
    with contextlib.ExitStack() as held:
        refusal = None
        if rank == 0:
            try:
                for folder, fix in folders.items():
                    held.enter_context(run_lock(folder, fix=fix))
            except RunLockedError as exc:
                refusal = str(exc)
        if world_size > 1:
            import torch.distributed as dist

            box = [refusal]
            dist.broadcast_object_list(box, src=0)
            refusal = box[0]
        if refusal is not None:
            raise RunLockedError(refusal)
        yield


def _sharded(model: RewardModel, pairs: Sequence[Pair], main: Store, path: Path, plan: Plan, rank: int,
             world_size: int, progress: bool, decided: Decided, natural: NaturalStates | None) -> bool:
    """This rank's chunks into its shard (`natural`: the run's natural fit, which every rank makes from every
    rank's traces); then rank 0 merges every shard into `main`. True on rank 0."""
    import torch.distributed as dist

    shard = Store(shard_path(path, rank))
    try:
        run_pairs(model, pairs, shard, plan, rank=rank, world_size=world_size, progress=progress, skip=main,
                  decided=decided, natural=natural)
    finally:
        shard.close()
    dist.barrier()  # every shard is complete before rank 0 reads them
    if rank == 0:
        for r in range(world_size):
            main.merge(shard_path(path, r))
    return rank == 0


def audit(model: RewardModel, pairs: Sequence[Pair], *, store: Store | str | Path | None = None,
          plan: Plan = Plan(), sae: TopKSAE | None = None, progress: bool = False,
          data: str | Path | None = None, command_line: str | None = None, rank: int = 0, world_size: int = 1,
          hold: Sequence[str | Path] = (), decided: Decided | None = None,
          transcoders: Transcoders | None = None) -> Audit | None:
    """Run (or finish) the audit of `pairs` in `store` and return it.

    `data`, `command_line`: the pairs file and the command, recorded in the audit's `provenance`.

    `store`: a `Store`, a path to one, or None for an in-memory run. Finished pairs already in the
    store are not computed again. Given a path, the run holds the run lock of the store's folder
    (`run_lock`) throughout, and of every folder in `hold` (say, the report's), so a second audit
    into one refuses (`RunLockedError`, naming this run's pid and start time) instead of racing this
    one on the same chunks.

    `rank`, `world_size`: this process's place in a sharded run (torchrun's RANK and WORLD_SIZE, the
    process group initialised; `store` a path). Each rank computes its chunks into `shard_path(store,
    rank)`; rank 0 merges them, runs the whole-model instruments and returns the audit; the other
    ranks return None. `decided`: the run's decisions over `pairs` (`Decided.of`) when the caller made
    them already (to print what a store holds before the run), else made here, once.

    `transcoders`: a `rewardlens.sae.Transcoders` set for `Plan(graph=True)`'s attribution graphs (None: the
    MLPs' own neurons, on a model of at most `NEURON_LIMIT` of them), checked against the model here, before
    any store is written (`check_graph`).
    """
    check_graph(model, plan.graph, transcoders)
    plan = plan_for_model(model, plan, sae)
    path = None if isinstance(store, Store) or store is None or str(store) == ":memory:" else Path(store)
    if world_size > 1 and path is None:
        raise UsageError(f"a sharded audit (world_size={world_size}) writes a shard beside its store: pass store= "
                         "a path, not an in-memory store or a Store object")
    folders = {Path(f).resolve(): "give this run another --out" for f in hold}
    if path is not None:  # a store outside every `hold` folder: a shared one, given by --store (`store=`)
        folders.setdefault(path.parent.resolve(), f"give this run a --store outside that folder (its store: {path})")
    with _locks(folders, rank, world_size):
        db = store if isinstance(store, Store) else Store(path if path is not None else ":memory:")
        try:
            if decided is None:  # once for the run: every chunk, rank and read-back agrees
                decided = Decided.of(model, pairs)
            # Divergence's natural fit, made by `run_pairs` before its chunks (each scores its own sweep) and
            # handed to `run_whole`, which scores the pairs stored without scores.
            natural = NaturalStates() if plan.divergence else None
            if world_size == 1:
                run_pairs(model, pairs, db, plan, progress=progress, decided=decided, natural=natural)
            else:
                assert path is not None  # refused above
                if not _sharded(model, pairs, db, path, plan, rank, world_size, progress, decided, natural):
                    return None
            run_whole(model, pairs, db, plan, sae=sae, progress=progress, decided=decided, natural=natural,
                      transcoders=transcoders)
            return collect(model, pairs, db, plan, sae=sae, data=data, command_line=command_line, decided=decided,
                           transcoders=transcoders)
        finally:
            if db is not store:
                db.close()


__all__ = ["Audit", "ResumeStatus", "audit", "resume_status", "shard_path"]
