"""Capture activations at chosen positions with forward hooks that are always removed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle


@dataclass(frozen=True)
class Point:
    """Where to read: a module's input ('in') or output ('out'), at positions `cols` of each row:
    [n] (one position per row → [n, width]) or [n, m] (m positions per row → [n, m, width]); with
    `rows` [m], at `(rows[i], cols[i])` for each read row i (cols [m] → [m, width])."""

    module: nn.Module
    where: str
    cols: Tensor
    rows: Tensor | None = None


PointKey = TypeVar("PointKey", bound=Hashable)
"""The key of a capture point: a `TraceKey` for a trace's points, anything hashable for an engine's own."""


def hidden_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """A module call's hidden-state input: its first positional argument, or `hidden_states=`."""
    return args[0] if args else kwargs["hidden_states"]


Output = Tensor | tuple[Any, ...] | list[Any]
"""What a module returns: its hidden state, or a tuple (list) whose first item it is."""


def first_output(out: Output) -> Tensor:
    """A module's hidden-state output: the output itself, or the first item of a tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


Rewrite = Callable[[Tensor], "Tensor | None"]


@contextlib.contextmanager
def rewriting(hooks: Sequence[tuple[nn.Module, str, Rewrite]]) -> Iterator[None]:
    """During the forwards inside, call `fn` on each module's hidden-state input ('in') or output
    ('out'); a tensor it returns replaces that value (None leaves it). Hooks are removed on exit,
    also when the forward raises."""

    def pre(
        fn: Rewrite, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        new = fn(hidden_arg(args, kwargs))
        if new is None:
            return None
        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    def post(fn: Rewrite, out: Output) -> Output | None:
        new = fn(first_output(out))
        if new is None:
            return None
        return (new, *out[1:]) if isinstance(out, tuple) else new

    handles: list[RemovableHandle] = []
    try:
        for module, where, fn in hooks:  # torch calls a hook (module, args[, kwargs][, output]) positionally
            if where == "in":
                handles.append(module.register_forward_pre_hook(
                    lambda _m, a, k, fn=fn: pre(fn, a, k), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(lambda _m, _a, o, fn=fn: post(fn, o)))
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Index:
    """Where a forward's captured positions lie, computed once per position tensor, device and
    activation shape (every point of a trace shares the batch's read index), not once per hook."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int, int, int, int], tuple[Tensor, Tensor, Tensor]] = {}

    def __call__(self, cols: Tensor, value: Tensor, at_rows: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(rows [n] or [n, 1], cols [n] or [n, m], flat row-major indices [n·m]) on `value`'s device;
        with `at_rows` [m], the rows are those (one per read row)."""
        b, t = value.shape[0], value.shape[1]
        key = (id(cols), value.get_device(), b, t, id(at_rows))  # get_device: an int, cheaper than a torch.device
        got = self._cache.get(key)
        if got is None:
            c = cols.to(value.device)
            rows = torch.arange(b, device=value.device) if at_rows is None else at_rows.to(value.device)
            rows = rows if c.ndim == 1 else rows[:, None]
            got = self._cache[key] = (rows, c, (rows * t + c).reshape(-1))
        return got


def _pick(index: _Index, point: Point, value: Tensor) -> Tensor:
    """`value[rows, cols]`: one `index_select` on the flattened activation when it is a contiguous
    [B, T, w] tensor (one kernel, no index built), advanced indexing otherwise."""
    rows, c, flat = index(point.cols, value, point.rows)
    if value.ndim != 3 or not value.is_contiguous():
        return value[rows, c]
    picked = value.view(-1, value.shape[-1]).index_select(0, flat)
    return picked if c.ndim == 1 else picked.view(*c.shape, value.shape[-1])


def _to_fp32(picked: dict[PointKey, Tensor], device: torch.device) -> dict[PointKey, Tensor]:
    """Every picked activation in fp32 on `device`; those that need a cast or a move are stacked by
    shape first, so a half-precision trace casts once per shape instead of once per point."""
    out: dict[PointKey, Tensor] = {}
    groups: dict[tuple[tuple[int, ...], torch.dtype, torch.device], list[PointKey]] = {}
    for name, value in picked.items():
        if value.dtype == torch.float32 and value.device == device:
            out[name] = value
        else:
            groups.setdefault((tuple(value.shape), value.dtype, value.device), []).append(name)
    for names in groups.values():
        stacked = torch.stack([picked[n] for n in names]).to(device=device, dtype=torch.float32)
        out.update(zip(names, stacked.unbind(0)))
    return {name: out[name] for name in picked}


@contextlib.contextmanager
def capture(points: Mapping[PointKey, Point], device: torch.device) -> Iterator[dict[PointKey, Tensor]]:
    """Record `[rows, cols]` of every point in fp32 on `device` during the forward passes inside, under
    the point's key (a `TraceKey` for trace points; an engine's own points may use keys of their own).

    Only the named positions are kept, so memory is [n, width] per point (or [n, m, width]) whatever
    the sequence length. The dictionary is filled when the block exits normally (the cast to fp32
    is done then, once per shape); hooks are removed on exit, also when the forward raises. Points
    on the same module share one hook, and the positions' indices are built once per forward.
    """
    captured: dict[PointKey, Tensor] = {}
    picked: dict[PointKey, Tensor] = {}
    index = _Index()
    by_module: dict[int, tuple[nn.Module, list[tuple[PointKey, Point]], list[tuple[PointKey, Point]]]] = {}
    for name, point in points.items():
        _, ins, outs = by_module.setdefault(id(point.module), (point.module, [], []))
        (ins if point.where == "in" else outs).append((name, point))

    def grab(group: list[tuple[PointKey, Point]], value: Tensor) -> None:
        value = value.detach()
        for name, point in group:
            got = _pick(index, point, value)
            # Many positions per row ([n, m, w], large): cast now, so no half-precision copy waits.
            picked[name] = got if got.ndim == 2 else got.to(device=device, dtype=torch.float32)

    def both(ins: list[tuple[PointKey, Point]], outs: list[tuple[PointKey, Point]], args: tuple[Any, ...],
             kwargs: dict[str, Any], out: Output) -> None:
        if ins:
            grab(ins, hidden_arg(args, kwargs))
        grab(outs, first_output(out))

    # One hook where one suffices: a leaf module whose input and output are both asked for (an
    # output projection, for heads or neurons) reads its input from the forward hook's arguments;
    # a module with children keeps a pre-hook, since a layer might update its input in place.
    handles: list[RemovableHandle] = []
    try:
        for module, ins, outs in by_module.values():
            leaf = bool(ins and outs) and next(module.children(), None) is None
            if ins and not (outs and leaf):
                handles.append(module.register_forward_pre_hook(  # torch passes the module first, positionally
                    lambda _m, a, k, g=ins: grab(g, hidden_arg(a, k)), with_kwargs=True))
            if outs:
                handles.append(module.register_forward_hook(
                    lambda _m, a, k, o, i=ins if leaf else [], g=outs: both(i, g, a, k, o), with_kwargs=True))
        yield captured
    finally:
        for handle in handles:
            handle.remove()
    captured.update(_to_fp32(picked, device))


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run with dropout off, restoring every module's own training flag afterwards."""
    training = [m for m in model.modules() if m.training]
    for module in training:
        module.training = False
    try:
        yield
    finally:
        for module in training:
            module.training = True
