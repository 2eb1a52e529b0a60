"""Capture activations at chosen positions with forward hooks that are always removed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Point:
    """Where to read: a module's input ('in') or output ('out'), at positions `cols` of each row:
    [n] (one position per row → [n, width]) or [n, m] (m positions per row → [n, m, width])."""

    module: nn.Module
    where: str
    cols: Tensor


def _first(x: object) -> Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


@contextlib.contextmanager
def capture(points: dict[str, Point], device: torch.device) -> Iterator[dict[str, Tensor]]:
    """Record `[rows, cols]` of every point in fp32 on `device` during the forward passes inside.

    Only the named positions are kept, so memory is [n, width] per point (or [n, m, width]) whatever
    the sequence length. Hooks are removed on exit, also when the forward raises.
    """
    store: dict[str, Tensor] = {}
    handles = []

    def grab(name: str, point: Point, value: Tensor) -> None:
        rows, cols = torch.arange(value.shape[0], device=value.device), point.cols.to(value.device)
        store[name] = value[rows if cols.ndim == 1 else rows[:, None], cols].detach().to(device=device, dtype=torch.float32)

    try:
        for name, point in points.items():
            if point.where == "in":
                hook = lambda m, args, kwargs, n=name, p=point: grab(  # noqa: E731
                    n, p, args[0] if args else kwargs["hidden_states"]
                )
                handles.append(point.module.register_forward_pre_hook(hook, with_kwargs=True))
            else:
                hook = lambda m, args, out, n=name, p=point: grab(n, p, _first(out))  # noqa: E731
                handles.append(point.module.register_forward_hook(hook))
        yield store
    finally:
        for handle in handles:
            handle.remove()


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
