"""Stepping: run a model's own layers from a recorded layer input, rows of many runs batched together.

Below a change at layer l a run equals the clean one, so recomputing those layers is waste. One clean
forward records every decoder layer's input and the exact arguments the model passed to it (masks,
rotary tables, relative positions: whatever this architecture computes); a run changed at layer l
then starts from the recorded input of layer l (or a changed copy of it) and calls the model's own
layer modules l..L-1 with those arguments. Nothing is re-implemented. Arguments are matched to rows by
their batch dimension; `stepping_works` proves on the clean batch that stepping reproduces the
model's own forward before any number is taken from it (docs/design.md §5, the stepped engine).
Patching, path patching, attribution patching's layer-at-a-time backward and SAE feature edits
all step from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._arch import get_module
from ._hooks import eval_mode, hidden_arg
from ._oom import OOM_ERRORS
from ._reads import ReadSet
from ._tokens import Batch, Tokenized

if TYPE_CHECKING:
    from ._core import RewardModel


class Recording:
    """A clean forward's per-layer inputs [B, T, d], the other arguments of every layer call, and the last
    layer's output (`top`, before any final norm)."""

    def __init__(self, model: RewardModel, batch: Batch) -> None:
        self.batch = batch
        self.inputs: list[Tensor] = []
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.top = torch.empty(0)
        handles: list[RemovableHandle] = []

        def keep(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:  # torch's pre-hook call
            hidden = hidden_arg(args, kwargs)
            self.inputs.append(hidden.detach())
            self.calls.append((args[1:] if args else (), {k: v for k, v in kwargs.items() if k != "hidden_states"}))

        def top(_module: nn.Module, _args: tuple[Any, ...], out: Any) -> None:  # torch's forward-hook call
            self.top = (out[0] if isinstance(out, (tuple, list)) else out).detach()

        try:
            handles = [layer.register_forward_pre_hook(keep, with_kwargs=True) for layer in model.layers]
            handles.append(model.layers[model.n_layers - 1].register_forward_hook(top))
            kwargs = model.batch_kwargs(batch)
            with torch.no_grad(), eval_mode(model.model):
                out = model.backbone(**kwargs)
        finally:
            for handle in handles:
                handle.remove()
        self.last: Tensor = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def resid(self, layer: int) -> Tensor:
        """The residual after layer `layer` [B, T, d]: the next layer's recorded input, or the last layer's own
        output (before any final norm) for the last."""
        return self.inputs[layer + 1] if layer + 1 < len(self.inputs) else self.top

    def run(self, model: RewardModel, start: int, rows: Tensor, hidden: Tensor | None = None) -> Tensor:
        """Layers `start`..L-1 on batch rows `rows` [r] (repeats allowed), from the recorded input of layer
        `start`, or from `hidden` [r, T, d] (a changed copy of it; with `start == L`, returned as it is)."""
        hidden = self.inputs[start][rows] if hidden is None else hidden
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


def unambiguous(seqs: list[Tokenized], rows: list[int]) -> Iterator[list[int]]:
    """`rows` (length-sorted) in groups whose count never equals their padded length, so a
    per-position argument ([T]) cannot be mistaken for a per-row one ([B])."""
    while rows:
        index = rows
        while len(index) > 1 and len(index) == max(len(seqs[i].ids) for i in index):
            index = index[:-1]
        rows = rows[len(index):]
        yield index
