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

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._arch import get_module
from ._continuing import cache_of, cache_rows
from ._hooks import eval_mode, hidden_arg
from ._oom import OOM_ERRORS
from ._reads import ReadSet
from ._tokens import Batch, Tokenized

if TYPE_CHECKING:
    from ._core import RewardModel


class Recording:
    """A clean forward's per-layer inputs [B, T, d], the other arguments of every layer call, and the last
    layer's output (`top`, before any final norm) and the backbone's (`last`).

    `Recording(model, batch)` runs that forward itself; `LayerTaps.take` builds one from a forward
    someone else ran (the audit's traced forward), so the same sequences are not run twice."""

    batch: Batch
    inputs: list[Tensor]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
    top: Tensor
    last: Tensor
    cache: Any = None
    """The model's own cache of keys and values from that forward (a Hugging Face `Cache`, rows as the
    recording's), when the taps kept it instead of the layer inputs (`LayerTaps(cache=True)`): what a
    continuation of the clean run needs. None otherwise; then `inputs` and `calls` hold every layer's."""

    def __init__(self, model: RewardModel, batch: Batch) -> None:
        with LayerTaps(model) as taps, torch.no_grad(), eval_mode(model.model):
            model.backbone(**model.batch_kwargs(batch))
        self._set(batch, taps.inputs, taps.calls, taps.top, taps.last)

    def _set(self, batch: Batch, inputs: list[Tensor], calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
             top: Tensor | None, last: Tensor | None) -> None:
        assert last is not None  # the backbone's forward hook fired: the forward ran
        self.batch, self.inputs, self.calls, self.last = batch, inputs, calls, last
        self.top = torch.empty(0) if top is None else top

    def select(self, rows: Tensor) -> Recording:
        """Rows `rows` [r] of this recording as one of its own, the arguments sliced by the rule stepping
        slices them by (`_rows`; `stepping_works` and `layerwise_grads`' proof catch an argument it
        slices wrongly); itself when `rows` is all of them in order."""
        size = self.size
        if torch.equal(rows.cpu(), torch.arange(size)):
            return self
        rec = Recording.__new__(Recording)
        memo: dict[int, tuple[Tensor, Tensor]] = {}
        rec._set(_batch_rows(self.batch, rows), [x[rows.to(x.device)] for x in self.inputs],
                 [(_rows(a, rows, size, memo), _rows(k, rows, size, memo)) for a, k in self.calls],
                 self.top[rows.to(self.top.device)] if self.top.numel() else self.top,
                 self.last[rows.to(self.last.device)])
        rec.cache = None if self.cache is None else cache_rows(self.cache, rows)
        return rec

    @property
    def size(self) -> int:
        """Rows recorded."""
        return int(self.last.shape[0])

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


def _rows(value: Any, rows: Tensor, size: int, memo: dict[int, tuple[Tensor, Tensor]] | None = None) -> Any:
    """`value` with every tensor whose first dimension is the batch (`size`) indexed by `rows`; `value` is
    any layer argument (tensors, possibly nested in tuples, lists and dicts) and keeps its structure.
    `memo`: tensors already sliced (by id), so one passed to every layer (a mask, a rotary table) is
    sliced, and held, once."""
    if isinstance(value, Tensor):
        seen = None if memo is None else memo.get(id(value))
        if seen is not None and seen[0] is value:
            return seen[1]
        out = value[rows.to(value.device)] if value.ndim and value.shape[0] == size else value
        if memo is not None:
            memo[id(value)] = (value, out)
        return out
    if isinstance(value, tuple):
        return tuple(_rows(v, rows, size, memo) for v in value)
    if isinstance(value, list):
        return [_rows(v, rows, size, memo) for v in value]
    if isinstance(value, dict):
        return {k: _rows(v, rows, size, memo) for k, v in value.items()}
    return value


RowChoice = Callable[[Tensor, Tensor], "Tensor | None"]
"""Which rows of a forward to keep, from its `input_ids` and `attention_mask` [B, T] (None: all)."""


class LayerTaps:
    """Hooks that keep, from the latest forward of the backbone while attached (`with LayerTaps(model) as
    taps:`), every layer's input and call arguments, the last layer's output and the backbone's. They only
    read: the forward they ride on (a trace, a plain forward) computes what it computes.

    `keep` picks the rows to hold as the forward starts, so only those rows' [L, r, T, d] are ever held
    (sliced by stepping's rule, `_rows`; an argument shared by every layer is sliced once).

    `cache=True` keeps the model's own cache of keys and values (asked of the forward with `use_cache`,
    which changes what it returns, not what it computes) instead of the layer inputs: a continuation
    of the clean run needs only that, and it is smaller ([L, r, T, 2·kv] against [L, r, T, d])."""

    def __init__(self, model: RewardModel, keep: RowChoice | None = None, *, cache: bool = False) -> None:
        self.model, self.keep, self.want_cache = model, keep, cache
        self.handles: list[RemovableHandle] = []
        self.clear()

    def clear(self) -> None:
        """Let go of what the latest forward left."""
        self.inputs: list[Tensor] = []
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.top: Tensor | None = None
        self.last: Tensor | None = None
        self.ids: Tensor | None = None
        self.rows: Tensor | None = None
        self.size = 0
        self.sliced: dict[int, tuple[Tensor, Tensor]] = {}
        self.cache: Any = None

    def __enter__(self) -> LayerTaps:
        layers = self.model.layers
        try:
            self.handles = [self.model.backbone.register_forward_pre_hook(self._start, with_kwargs=True)]
            self.handles += [layer.register_forward_pre_hook(self._keep, with_kwargs=True) for layer in layers]
            self.handles.append(layers[len(layers) - 1].register_forward_hook(self._top))
            self.handles.append(self.model.backbone.register_forward_hook(self._end, with_kwargs=True))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _start(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        self.clear()  # a new forward: what an earlier one left is not this one's
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is not None:
            self.size = ids.shape[0]
            self.rows = None if self.keep is None or mask is None else self.keep(ids, mask)
        if self.want_cache and "use_cache" in kwargs:
            return args, {**kwargs, "use_cache": True}
        return None

    def _pick(self, value: Any) -> Any:
        """`value` at the kept rows (all, as the forward passed it, when `keep` chose none)."""
        return value if self.rows is None else _rows(value, self.rows, self.size, self.sliced)

    def _keep(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.want_cache:
            return
        self.inputs.append(self._pick(hidden_arg(args, kwargs).detach()))
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        self.calls.append((self._pick(args[1:] if args else ()), self._pick(rest)))

    def _top(self, _module: nn.Module, _args: tuple[Any, ...], out: Any) -> None:
        self.top = self._pick((out[0] if isinstance(out, (tuple, list)) else out).detach())

    def _end(self, _module: nn.Module, _args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.last = self._pick((out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]).detach())
        self.ids, self.sliced = kwargs.get("input_ids"), {}
        cache = cache_of(out)
        if self.want_cache and cache is not None:
            self.cache = cache if self.rows is None else cache_rows(cache, self.rows)

    def take(self, batch: Batch, rows: Tensor | None = None) -> Recording | None:
        """The latest forward's `Recording` of `batch`'s rows `rows` [r] (None: all), or None when that
        forward was not one whole forward of `batch` (the out-of-memory back-off ran it in pieces), when
        `keep` did not keep all of `rows`, or when no row is asked for. Either way the taps let go of it."""
        ids, kept = self.ids, self.rows
        held = self.cache is not None if self.want_cache else len(self.inputs) == self.model.n_layers
        whole = (self.last is not None and ids is not None and held
                 and ids.shape == batch.input_ids.shape and torch.equal(ids, batch.input_ids.to(ids.device)))
        at = _positions(kept, rows, batch.input_ids.shape[0])
        got = None
        if whole and at is not None and len(at):
            rec = Recording.__new__(Recording)
            rec._set(batch if kept is None else _batch_rows(batch, kept), self.inputs, self.calls, self.top, self.last)
            rec.cache = self.cache
            got = rec.select(at)
        self.clear()
        return got


def _positions(kept: Tensor | None, rows: Tensor | None, size: int) -> Tensor | None:
    """Where batch rows `rows` (None: all `size`) sit among the kept rows `kept` (None: all); None when
    some row was not kept."""
    want = torch.arange(size) if rows is None else rows.cpu()
    if kept is None:
        return want
    where = {int(r): j for j, r in enumerate(kept.cpu().tolist())}
    if any(int(r) not in where for r in want.tolist()):
        return None
    return torch.tensor([where[int(r)] for r in want.tolist()], dtype=torch.long)


def _batch_rows(batch: Batch, rows: Tensor) -> Batch:
    """Rows `rows` of a one-read `batch` at its full width (not `select`, which drops all-padding
    columns): the recorded layer arguments are that wide."""
    if batch.reads is not None:
        raise RuntimeError("internal: a recording's rows are taken of one-read batches only; a reward read at a set of "
                         "positions is backpropagated whole (causal/_attribution_patching.py: _reads_estimate)")

    def pick(t: Tensor) -> Tensor:
        return t[rows.to(t.device)]

    return dataclasses.replace(
        batch, input_ids=pick(batch.input_ids), attention_mask=pick(batch.attention_mask),
        position_ids=pick(batch.position_ids),
        token_type_ids=None if batch.token_type_ids is None else pick(batch.token_type_ids),
        read_at=pick(batch.read_at), labels=None if batch.labels is None else [batch.labels[i] for i in rows.tolist()])


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
