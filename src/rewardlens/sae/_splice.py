"""Edited copies of a batch: each input run once per edit, the edits stacked along the batch axis.

An edit adds a vector `e` [d] to the residual after layer `l` (the output of the model's own layer
module, found through the trace's capture points) at the read position `t*`, or at every real
token; the rest of the model runs as it is, so later layers respond (a *total* effect). One forward
holds `copies` edits of every input of a batch, one edit per row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, Tokenized, one_read_only, points, rewriting
from ..types import SaePositions

POSITIONS: tuple[SaePositions, ...] = ("read", "all")


def check_single_read(model: RewardModel, what: str) -> None:
    """Refuse a multi-position read-out: the edits are defined at one read token per sequence."""
    if model.reads.multi:
        raise one_read_only(what)


def check_positions(positions: str) -> None:
    if positions not in POSITIONS:
        raise DataError(f"positions must be 'read' (t* only) or 'all' (every real token), got {positions!r}")


def stacked(batch: Batch, copies: int) -> Batch:
    """`batch` with every row repeated `copies` times in a row ([b·copies, ...]: row r, copy c at r·copies + c)."""
    rep = lambda t: t.repeat_interleave(copies, 0)  # noqa: E731 - one rule for every tensor of the batch
    types = batch.token_type_ids
    return replace(batch, input_ids=rep(batch.input_ids), attention_mask=rep(batch.attention_mask),
                   position_ids=rep(batch.position_ids), token_type_ids=None if types is None else rep(types),
                   read_at=rep(batch.read_index),
                   labels=None if batch.labels is None else [x for x in batch.labels for _ in range(copies)])


@torch.no_grad()
def edited_rewards(model: RewardModel, batch: Batch, layer: int, add: Tensor | None,
                   positions: SaePositions = "read") -> Tensor:
    """The model's reward [b] (fp32 head and readout, as `model.score`) with `add` [b, d] added to the
    residual after `layer`, at `t*` or at every real token; `add=None` runs the batch untouched."""
    final = model.final_points(batch)
    if add is None:
        values, coef = model.head_readout(model.run(batch, final))
        return (values * coef).sum(-1)
    point = points(model, batch, heads=[], neurons=[], gate=False)[TraceKey.resid(layer)]

    def push(x: Tensor) -> Tensor:
        step = add.to(x.device, x.dtype)
        if positions == "all":  # pads stay as they are: nothing reads them
            return x + batch.attention_mask.to(x.device, x.dtype)[:, :, None] * step[:, None]
        x = x.clone()
        rows = torch.arange(x.shape[0], device=x.device)
        x[rows, batch.read_index.to(x.device)] += step
        return x

    with rewriting([(point.module, point.where, push)]):
        values, coef = model.head_readout(model.run(batch, final))
    return (values * coef).sum(-1)


def chunks(n_edits: int, batch_size: int) -> tuple[int, int]:
    """(inputs per forward, edits per input per forward): about `batch_size` rows in all."""
    per_input = max(1, min(n_edits, batch_size))
    return max(1, batch_size // per_input), per_input


def each_edit_batch(model: RewardModel, seqs: list[Tokenized], index: np.ndarray, n_edits: int,
                    batch_size: int) -> Iterator[tuple[np.ndarray, Batch, slice]]:
    """(rows of `seqs` [b], the batch of those rows stacked once per edit of the slice, which edits) for
    every batch of the inputs `index` and every slice of the `n_edits` edits."""
    inputs, per = chunks(n_edits, batch_size)
    for local, batch in model.batches([seqs[i] for i in index], inputs, index=[int(i) for i in index]):
        for start in range(0, n_edits, per):
            part = slice(start, min(start + per, n_edits))
            yield index[local], stacked(batch, part.stop - part.start), part
