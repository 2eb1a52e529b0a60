"""One clean traced forward per batch, read two ways: the exact decomposition and the patch engines' `Clean`.

The decomposition (`exact.decompose`) and every patch engine start from the same thing: each
sequence's clean run, traced at its read position. Traced once here, it feeds attribution at
every level, the lens, path-frozen patching, the read-position sweeps and attribution patching,
instead of each instrument tracing the pairs again (`faithfulness`, the audit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..data import Pair
from ..exact import Decomposition, decompose
from ..model import RewardModel
from ..types import PatchLevel
from ._plan import Clean, CleanRuns, encode_pairs, flatten_pairs


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


def trace_pairs(model: RewardModel, pairs: Sequence[Pair], *, level: PatchLevel = "head",
                batch_size: int = 8) -> Traced:
    """Trace every pair's two sides once (length-sorted batches of `batch_size`) and keep both views."""
    pairs = flatten_pairs(pairs)
    seqs = encode_pairs(model, pairs)
    if model.reads.multi:  # the set-of-reads engines trace their own batches; the view keeps the rewards
        dec = decompose(model, pairs, level=level, batch_size=batch_size)
        reward = torch.as_tensor(dec.reward, device=model.device)
        return Traced(pairs, level, dec, Clean(seqs, {}, [0] * len(seqs), model.head.coefficients(len(seqs)), reward))
    runs = CleanRuns(len(seqs))
    dec = decompose(model, pairs, level=level, batch_size=batch_size, on_trace=runs)
    return Traced(pairs, level, dec, Clean.of(model, seqs, runs))
