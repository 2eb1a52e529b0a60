"""Edited copies of a batch: each input run once per edit, the edits stacked along the batch axis.

An edit adds a vector `e` [d] to the residual after layer `l` (the output of the model's own layer
module) at the read position `t*`, or at every real token; the rest of the model runs as it is, so
later layers respond (a *total* effect). Below the edit every copy equals the clean run, so one clean
forward of the inputs is recorded (`model.internal.Recording`) and each copy starts at layer `l+1`
from the recorded residual with its edit added, `copies` edits of every input in one batch of rows:
an edit after the last layer costs only the read-out. A model whose layers cannot be stepped
(`stepping_works` fails on the batch) runs each copy as a whole forward with a hook instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..model import RewardModel, TraceKey
from ..model.internal import (
    Batch,
    Recording,
    Tokenized,
    one_read_only,
    points,
    rewriting,
    stepped_readout,
    stepping_works,
)
from ..types import SaePositions

POSITIONS: tuple[SaePositions, ...] = ("read", "all")


def check_single_read(model: RewardModel, what: str) -> None:
    """Refuse a multi-position read-out: the edits are defined at one read token per sequence."""
    if model.reads.multi:
        raise one_read_only(what)


def check_positions(positions: str) -> None:
    if positions not in POSITIONS:
        raise DataError(f"positions must be 'read' (t* only) or 'all' (every real token), got {positions!r}",
                        option="positions")


def stacked(batch: Batch, copies: int) -> Batch:
    """`batch` with every row repeated `copies` times in a row ([b·copies, ...]: row r, copy c at r·copies + c)."""
    rep = lambda t: t.repeat_interleave(copies, 0)  # noqa: E731 - one rule for every tensor of the batch
    types = batch.token_type_ids
    return replace(batch, input_ids=rep(batch.input_ids), attention_mask=rep(batch.attention_mask),
                   position_ids=rep(batch.position_ids), token_type_ids=None if types is None else rep(types),
                   read_at=rep(batch.read_index),
                   labels=None if batch.labels is None else [x for x in batch.labels for _ in range(copies)])


@dataclass(frozen=True)
class Edits:
    """A batch of inputs, each to run `copies` times (input r's copy c is row r·copies + c), and the batch's
    clean recording (None where its layers cannot be stepped: whole forwards then)."""

    batch: Batch
    copies: int
    rec: Recording | None


def _push(x: Tensor, add: Tensor, mask: Tensor, read: Tensor, positions: SaePositions) -> Tensor:
    """`x` [b, T, d] with `add` [b, d] added at each row's read position `read` [b], or at every real token
    of `mask` [b, T] (pads stay as they are: nothing reads them)."""
    step = add.to(x.device, x.dtype)
    if positions == "all":
        return x + mask.to(x.device, x.dtype)[:, :, None] * step[:, None]
    x = x.clone()
    x[torch.arange(x.shape[0], device=x.device), read.to(x.device)] += step
    return x


@torch.no_grad()
def clean_rewards(model: RewardModel, batch: Batch) -> Tensor:
    """The model's reward [b] of an untouched batch (fp32 head and readout, as `model.score`)."""
    values, coef = model.head_readout(model.run(batch, model.final_points(batch)))
    return (values * coef).sum(-1)


@torch.no_grad()
def edited_rewards(model: RewardModel, edits: Edits, layer: int, add: Tensor,
                   positions: SaePositions = "read") -> Tensor:
    """The reward [b·copies] of every copy, with `add` [b·copies, d] added to the residual after `layer`, at
    `t*` or at every real token: stepped from layer `layer + 1` of the recording, else whole forwards."""
    if edits.rec is None:
        return _whole(model, stacked(edits.batch, edits.copies), layer, add, positions)
    rec, batch = edits.rec, edits.batch
    rows = torch.arange(batch.input_ids.shape[0]).repeat_interleave(edits.copies)
    x = rec.resid(layer)[rows.to(rec.top.device)]
    x = _push(x, add, batch.attention_mask[rows.to(batch.attention_mask.device)],
              batch.read_index[rows.to(batch.read_index.device)], positions)
    return stepped_readout(model, rec, rec.run(model, layer + 1, rows, x), rows)


def _whole(model: RewardModel, batch: Batch, layer: int, add: Tensor, positions: SaePositions) -> Tensor:
    """`edited_rewards` by one hooked whole forward of the stacked batch [b·copies]."""
    point = points(model, batch, heads=[], neurons=[], gate=False)[TraceKey.resid(layer)]
    push = lambda x: _push(x, add, batch.attention_mask, batch.read_index, positions)  # noqa: E731
    with rewriting([(point.module, point.where, push)]):
        return clean_rewards(model, batch)


def _recording(model: RewardModel, batch: Batch) -> Recording | None:
    """The batch's clean recording, once its stepping is proven (else None: whole forwards)."""
    rec = Recording(model, batch)
    return rec if stepping_works(model, rec) else None


def chunks(n_edits: int, batch_size: int) -> tuple[int, int]:
    """(inputs per forward, edits per input per forward): about `batch_size` rows in all."""
    per_input = max(1, min(n_edits, batch_size))
    return max(1, batch_size // per_input), per_input


def each_edit_batch(model: RewardModel, seqs: list[Tokenized], index: np.ndarray, n_edits: int,
                    batch_size: int) -> Iterator[tuple[np.ndarray, Edits, slice]]:
    """(rows of `seqs` [b], the batch of those rows to run once per edit of the slice, which edits) for
    every batch of the inputs `index` and every slice of the `n_edits` edits; each batch is recorded once."""
    inputs, per = chunks(n_edits, batch_size)
    for local, batch in model.batches([seqs[i] for i in index], inputs, index=[int(i) for i in index]):
        rec = _recording(model, batch)
        for start in range(0, n_edits, per):
            part = slice(start, min(start + per, n_edits))
            yield index[local], Edits(batch, part.stop - part.start, rec), part
