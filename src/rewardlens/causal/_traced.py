"""One clean traced forward per batch, read two ways: the exact decomposition and the patch engines' `Clean`.

The decomposition (`exact.decompose`) and every patch engine start from the same thing: each
sequence's clean run, traced at its read position. Traced once here, it feeds attribution at
every level, the lens, path-frozen patching, the read-position sweeps and attribution patching,
instead of each instrument tracing the pairs again (`faithfulness`, the audit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor

from ..data import Pair, flatten_pairs
from ..errors import UsageError
from ..exact import Attribution, Decomposition, decompose
from ..model import RewardModel, Trace
from ..model.internal import Batch, LayerTaps, Tokenized, continuable
from ..types import Mode, PatchLevel
from ._layerwise import Recorded
from ._plan import Clean, CleanRuns, encode_pairs, sides


@dataclass(frozen=True)
class Traced:
    """The clean runs of some pairs, traced once at `level` (rows alternate chosen, rejected).

    `decomposition` [2n, k, P] the exact decomposition at `level`; `clean` the patch engines'
    view of the same traces (read-position activations of every point, rewards, readout).
    """

    pairs: list[Pair]
    level: PatchLevel
    decomposition: Decomposition
    clean: Clean
    _views: dict[PatchLevel, Attribution] = field(default_factory=dict, init=False, compare=False, repr=False)

    def attribution(self, level: PatchLevel) -> Attribution:
        """Exact attribution at `level` ('sublayer', or this trace's own level), built once and shared by
        every instrument that asks (the audit's tables and faithfulness alike)."""
        if level != self.level and level != "sublayer":
            raise UsageError(f"runs traced at level {self.level!r} cannot give level={level!r}; trace at "
                             f"level='head' (it serves both) or at {level!r}")
        if level not in self._views:
            dec = self.decomposition if level == self.level else self.decomposition.coarsen()
            self._views[level] = Attribution.from_decomposition(dec, level)
        return self._views[level]


def trace_pairs(model: RewardModel, pairs: Sequence[Pair], *, level: PatchLevel = "head",
                batch_size: int = 8, seqs: Sequence[Tokenized] | None = None, record: Mode | None = None) -> Traced:
    """Trace every pair's two sides once (length-sorted batches of `batch_size`) and keep both views.

    `seqs`: the pairs' token ids (`encode_pairs(model, pairs)`) when the caller has them, so a run
    that tokenized its pairs once to decide how to patch them does not tokenize them again.
    `record`: the mode attribution patching will patch in: the same traced forward also records its
    targets' layer inputs and arguments ([L, r, T, d] per batch of r targets), or, on a causal decoder
    whose cache can be continued, the model's keys and values ([L, r, T, 2·kv]: the read token's backward
    continues them), held in `clean.recorded` until `attribution_patch(clean=...)` backpropagates from
    them instead of running them again (and, for the caches, until `patch(clean=...)`'s read-position sweep
    continues them). A reward read at a set of positions records nothing (its
    estimate backpropagates whole)."""
    pairs = flatten_pairs(pairs)
    if seqs is not None and len(seqs) != 2 * len(pairs):
        raise UsageError(f"seqs= holds {len(seqs)} sequences for {len(pairs)} pairs; pass encode_pairs(model, pairs)")
    seqs = encode_pairs(model, pairs) if seqs is None else list(seqs)
    if model.reads.multi:  # the set-of-reads engines trace their own batches; the view keeps the rewards
        dec = decompose(model, pairs, level=level, batch_size=batch_size, encoded=(seqs, True))
        reward = torch.as_tensor(dec.reward, device=model.device)
        return Traced(pairs, level, dec, Clean(seqs, {}, [0] * len(seqs), model.head.coefficients(len(seqs)), reward))
    runs = CleanRuns(len(seqs))
    if record is None:
        dec = decompose(model, pairs, level=level, batch_size=batch_size, on_trace=runs, encoded=(seqs, True))
        return Traced(pairs, level, dec, Clean.of(model, seqs, runs))
    recorded = Recorded()
    targets = sides(record, len(seqs))[0]
    # A causal decoder's read-token backward continues the clean cache; other models (and low precision
    # where the calibrated proof is refused: `proof_tol`) step every layer from the recorded inputs.
    cache = continuable(model, seqs)
    with LayerTaps(model, keep=_rows_of({tuple(seqs[i].ids) for i in targets}), cache=cache) as taps:
        dec = decompose(model, pairs, level=level, batch_size=batch_size, encoded=(seqs, True),
                        on_trace=_recording(runs, taps, recorded, set(targets)))
    return Traced(pairs, level, dec, replace(Clean.of(model, seqs, runs), recorded=recorded))


def _rows_of(wanted: set[tuple[int, ...]]) -> Callable[[Tensor, Tensor], Tensor]:
    """The rows of a forward to record, known before it runs by their tokens (`decompose` says which
    sequences a batch held only after its forward); a non-target with a target's tokens is kept too."""
    def keep(ids: Tensor, mask: Tensor) -> Tensor:
        real = mask.bool()
        return torch.tensor([r for r in range(ids.shape[0]) if tuple(ids[r][real[r]].tolist()) in wanted],
                            dtype=torch.long)
    return keep


def _recording(runs: CleanRuns, taps: LayerTaps, recorded: Recorded, targets: set[int]
               ) -> Callable[[np.ndarray, Batch, Trace], None]:
    """`decompose`'s per-batch callback: keep the trace (`runs`) and, of the forward `taps` just saw, the
    recording of the batch's rows in `targets`."""
    def on_trace(rows: np.ndarray, batch: Batch, tr: Trace) -> None:
        runs(rows, batch, tr)
        mine = [j for j, i in enumerate(np.asarray(rows).tolist()) if i in targets]
        rec = taps.take(batch, torch.tensor(mine, dtype=torch.long))
        recorded.add([int(rows[j]) for j in mine], rec)
    return on_trace
