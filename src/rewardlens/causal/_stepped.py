"""Whole-sequence patching that starts each patched run at its own layer.

Below the patched layer a patched run equals the clean one, so recomputing those layers is
waste. One clean forward of the targets records every decoder layer's input and the exact
arguments the model passed to it (masks, rotary tables, relative positions: whatever this
architecture computes); a run patched at layer l then starts from the cached input of layer l
and calls the model's own layer modules l..L-1 with those arguments, rows of many parts batched
together. Nothing is re-implemented: the layers, their attention and their masks are the model's.

Arguments are matched to rows by their batch dimension. `stepping_works` proves on the clean
batch that stepping reproduces the model's own forward before any number is taken from it; a
model where it does not (some layer argument we cannot slice by row) falls back to full forwards.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ..data import part
from ..model import RewardModel, TraceKey
from ..model.internal import (
    OOM_ERRORS,
    Batch,
    ReadSet,
    Tokenized,
    collate,
    each_batch,
    eval_mode,
    get_module,
    hidden_arg,
)
from ._engine import Declined, Overwrite, Site, head_slice, patched, take_values


class Recording:
    """A clean forward's per-layer inputs [B, T, d] and the other arguments of every layer call."""

    def __init__(self, model: RewardModel, batch: Batch) -> None:
        self.batch = batch
        self.inputs: list[Tensor] = []
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        handles: list[RemovableHandle] = []

        def keep(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:  # torch's pre-hook call
            hidden = hidden_arg(args, kwargs)
            self.inputs.append(hidden.detach())
            self.calls.append((args[1:] if args else (), {k: v for k, v in kwargs.items() if k != "hidden_states"}))

        try:
            handles = [layer.register_forward_pre_hook(keep, with_kwargs=True) for layer in model.layers]
            kwargs = model.batch_kwargs(batch)
            with torch.no_grad(), eval_mode(model.model):
                out = model.backbone(**kwargs)
        finally:
            for handle in handles:
                handle.remove()
        self.last: Tensor = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def run(self, model: RewardModel, start: int, rows: Tensor) -> Tensor:
        """Layers `start`..L-1 on batch rows `rows` [r] (repeats allowed), from the recorded input."""
        hidden = self.inputs[start][rows]
        size = self.inputs[0].shape[0]
        with torch.no_grad(), eval_mode(model.model):
            for layer in range(start, model.n_layers):
                args, kwargs = self.calls[layer]
                out = model.layers[layer](hidden, *_rows(args, rows, size), **_rows(kwargs, rows, size))
                hidden = out[0] if isinstance(out, (tuple, list)) else out
        return hidden


def _rows(value: Any, rows: Tensor, size: int) -> Any:
    """`value` with every tensor whose first dimension is the batch (`size`) indexed by `rows`; `value` is
    any layer argument (tensors, possibly nested in tuples, lists and dicts) and keeps its structure."""
    if isinstance(value, Tensor):
        return value[rows.to(value.device)] if value.ndim and value.shape[0] == size else value
    if isinstance(value, tuple):
        return tuple(_rows(v, rows, size) for v in value)
    if isinstance(value, list):
        return [_rows(v, rows, size) for v in value]
    if isinstance(value, dict):
        return {k: _rows(v, rows, size) for k, v in value.items()}
    return value


def stepped_readout(model: RewardModel, rec: Recording, hidden: Tensor, rows: Tensor) -> Tensor:
    """Rewards [r] of stepped rows from the last layer's output [r, T, d] (gate: the run's own)."""
    if rec.batch.reads is not None:
        return _read_set(model, rec.batch.reads, hidden, rows)
    at = rec.batch.read_index[rows.to(rec.batch.read_index.device)]
    r = torch.arange(len(rows), device=hidden.device)
    x = hidden[r, at.to(hidden.device)].float().to(model.device)
    values = model.head(model.final_hidden(x))
    if model.gated:
        gate_at = model.gate_index(rec.batch)[rows.to(model.device)]
        gate_h = model.final_hidden(hidden[r, gate_at.to(hidden.device)].float().to(model.device))
        coef = model.head.coefficients(len(rows), gate_h)
    else:
        coef = model.head.coefficients(len(rows))
    return (values * coef).sum(-1)


def _read_set(model: RewardModel, reads: ReadSet, hidden: Tensor, rows: Tensor) -> Tensor:
    """A multi-position read-out's rewards [r] of stepped rows (batch rows `rows`, repeats allowed):
    every read of each row's sequence, its head value, recombined as the patched run's own."""
    mine = [torch.nonzero(reads.rows == b)[:, 0] for b in rows.tolist()]
    job = torch.cat([torch.full((len(m),), r, dtype=torch.long) for r, m in enumerate(mine)])
    idx = torch.cat(mine)
    pick = lambda t: None if t is None else t[idx.to(t.device)]  # noqa: E731
    sub = ReadSet(job.to(reads.rows.device), reads.cols[idx.to(reads.cols.device)],
                  reads.steps[idx.to(reads.steps.device)], pick(reads.targets), pick(reads.offsets))
    x = hidden[job.to(hidden.device), sub.cols.to(hidden.device)].float().to(model.device)
    values = model.head(model.final_hidden(x), sub.targets)
    if sub.offsets is not None:
        values = values + sub.offsets.to(values.device)[:, None]
    scores = (values * model.head.coefficients(1)).sum(-1)
    return sub.weights(len(rows), scores, model.reads.combine) @ scores


def stepping_works(model: RewardModel, rec: Recording, tol: float = 1e-4) -> bool:
    """Does stepping reproduce the recorded forward? Rows are taken reversed and twice over, so an
    argument sliced by row that is not per row (or one that should have been) shows up as a gap."""
    size = rec.inputs[0].shape[0]
    rows = torch.arange(size - 1, -1, -1).repeat(2)
    try:
        mine = rec.run(model, 0, rows)
        if model.arch.final_norm is not None:  # the backbone's output is after the final norm
            with torch.no_grad():
                mine = get_module(model.model, model.arch.final_norm)(mine)
    except OOM_ERRORS:
        raise  # memory, not a model we cannot step: the batch loop backs off
    except Exception:  # noqa: BLE001 - an argument we could not slice by row; the caller falls back
        return False
    want = rec.last[rows.to(rec.last.device)]
    if mine.shape != want.shape:
        return False
    mask = rec.batch.attention_mask.bool()[rows.to(rec.batch.attention_mask.device)].to(want.device)
    gap = (mine - want)[mask].float().norm(dim=-1) / want[mask].float().norm(dim=-1).clamp_min(1e-12)
    return bool(gap.max() <= tol)


def stepped_sweep(
    model: RewardModel,
    seqs: list[Tokenized],
    sweep: list[Site],
    cols: Tensor,
    values: dict[TraceKey, Tensor],
    *,
    batch_size: int = 8,
    labels: list[str] | None = None,
    index: Sequence[int] | None = None,
) -> Tensor | None:
    """Patched rewards [n, S], as `patch_engine.batched_sweep`, each run starting at its patched
    layer. None when this model's layers cannot be stepped (the caller runs full forwards).
    `index`: each sequence's number in the caller's input (for `OutOfMemoryError`)."""
    rewards = torch.zeros(len(seqs), len(sweep), device=model.device)
    by_start: dict[int, list[int]] = defaultdict(list)
    for s, site in enumerate(sweep):
        by_start[0 if site.kind == "embed" else site.layer].append(s)
    size = batch_size  # of the patched runs' batches: the clean batch's, shrunk with it on out-of-memory

    def work(rows: list[int]) -> None:
        nonlocal size
        size = min(size, len(rows))
        for group in unambiguous(seqs, rows):
            step(group, size)

    def step(index: list[int], size: int) -> None:
        batch = collate([seqs[i] for i in index], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device, labels=[labels[i] for i in index] if labels else None)
        rec = Recording(model, batch)
        if not stepping_works(model, rec):
            raise Declined
        for done, (start, group) in enumerate(sorted(by_start.items())):
            part(done, len(by_start))
            jobs = [(b, s) for s in group for b in range(len(index))]
            for at in range(0, len(jobs), size):
                job = jobs[at : at + size]
                rows = torch.tensor([b for b, _ in job])
                seq = torch.tensor([index[b] for b, _ in job])
                by_site: dict[int, list[int]] = defaultdict(list)
                for r, (_, s) in enumerate(job):
                    by_site[s].append(r)
                edits = [Overwrite(sweep[s], torch.tensor(rs), cols[seq[rs]],
                              take_values(values[sweep[s].key], seq[rs], head_slice(model, sweep[s])))
                         for s, rs in by_site.items()]
                with patched(model, edits):
                    hidden = rec.run(model, start, rows)
                rewards[seq, [s for _, s in job]] = stepped_readout(model, rec, hidden, rows)

    try:
        each_batch(sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids)), batch_size, work, ids=index,
                   is_pairs=True)
    except Declined:
        return None
    return rewards


def unambiguous(seqs: list[Tokenized], rows: list[int]) -> Iterator[list[int]]:
    """`rows` (length-sorted) in groups whose count never equals their padded length, so a
    per-position argument ([T]) cannot be mistaken for a per-row one ([B])."""
    while rows:
        index = rows
        while len(index) > 1 and len(index) == max(len(seqs[i].ids) for i in index):
            index = index[:-1]
        rows = rows[len(index):]
        yield index
