"""Capture activations at chosen positions with forward hooks that are always removed."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle


@dataclass(frozen=True)
class Point:
    """Where to read: a module's input ('in') or output ('out'), at positions `cols` of each row:
    [n] (one position per row → [n, width]) or [n, m] (m positions per row → [n, m, width])."""

    module: nn.Module
    where: str
    cols: Tensor


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
        for module, where, fn in hooks:
            if where == "in":
                handles.append(module.register_forward_pre_hook(
                    lambda m, a, k, fn=fn: pre(fn, a, k), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(lambda m, a, o, fn=fn: post(fn, o)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def capture(points: dict[str, Point], device: torch.device) -> Iterator[dict[str, Tensor]]:
    """Record `[rows, cols]` of every point in fp32 on `device` during the forward passes inside.

    Only the named positions are kept, so memory is [n, width] per point (or [n, m, width]) whatever
    the sequence length. Hooks are removed on exit, also when the forward raises.
    """
    captured: dict[str, Tensor] = {}

    def grab(name: str, point: Point, value: Tensor) -> None:
        rows, cols = torch.arange(value.shape[0], device=value.device), point.cols.to(value.device)
        picked = value[rows if cols.ndim == 1 else rows[:, None], cols]
        captured[name] = picked.detach().to(device=device, dtype=torch.float32)

    hooks = [(p.module, p.where, functools.partial(grab, name, p)) for name, p in points.items()]
    with rewriting(hooks):
        yield captured


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
