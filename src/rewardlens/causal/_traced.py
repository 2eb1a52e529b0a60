"""One clean traced forward per batch, read two ways: the exact decomposition and the patch engines' `Clean`.

The decomposition (`exact.decompose`) and every patch engine start from the same thing: each
sequence's clean run, traced at its read position. Traced once here, it feeds attribution at
every level, the lens, path-frozen patching, the read-position sweeps and attribution patching,
instead of each instrument tracing the pairs again (`faithfulness`, the audit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data import Pair
from ..exact import Decomposition, decompose
from ..model import Batch, RewardModel, Trace
from ..types import PatchLevel
from ._plan import Clean, encode_pairs, flatten_pairs


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


class _Gather:
    """Collects each batch's read-position captures in the order of the input sequences."""

    def __init__(self, n: int) -> None:
        self.parts: dict[str, list[Tensor]] = {}
        self.order: list[np.ndarray] = []
        self.read = [0] * n

    def __call__(self, rows: np.ndarray, batch: Batch, tr: Trace) -> None:
        for key, value in tr.captured.items():
            self.parts.setdefault(key, []).append(value)
        for row, at in zip(np.asarray(rows).tolist(), batch.read_index.tolist()):
            self.read[row] = at
        self.order.append(np.asarray(rows))

    def clean(self, model: RewardModel, seqs: list) -> Clean:
        inverse = torch.as_tensor(np.argsort(np.concatenate(self.order)))
        run = {k: torch.cat(v)[inverse.to(v[0].device)] for k, v in self.parts.items()}
        values, coef = model.head_readout(run)
        return Clean(seqs, run, self.read, coef, (values * coef).sum(-1))


def trace_pairs(model: RewardModel, pairs: Sequence[Pair], *, level: PatchLevel = "head",
                batch_size: int = 8) -> Traced:
    """Trace every pair's two sides once (length-sorted batches of `batch_size`) and keep both views."""
    pairs = flatten_pairs(pairs)
    seqs = encode_pairs(model, pairs)
    gather = _Gather(len(seqs))
    dec = decompose(model, pairs, level=level, batch_size=batch_size, on_trace=gather)
    return Traced(pairs, level, dec, gather.clean(model, seqs))
