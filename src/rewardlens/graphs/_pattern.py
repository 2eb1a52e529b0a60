"""Frozen attention patterns as matrices: a kernel's output `P v`, with `P` read off the kernel itself.

With its queries and keys frozen (graphs/_frozen.py), an attention kernel's output is linear in its values:
`o[t, h] = Σ_s P_h[t, s] v[s, g(h)]`, with `P_h` query head `h`'s pattern (the softmax of its masked, scaled,
soft-capped scores, any sink included) and `g(h) = h // (H / H_kv)` the key/value head it reads
(transformers' `repeat_kv`). On the first run `P` is read off the kernel by calling it with identity blocks
as values (`P I = P`), so it is whatever that kernel computes (mask, sliding window, GQA, scaling,
softcapping, sinks) without re-deriving any of it, and then proven on the spot: `P v` must equal the
kernel's own output on the first run's values to the dtype's rounding, else that call keeps the kernel.

Why: a later run's output is one batched matmul `P v`, so its backward pass is `Pᵀ g` alone, where the fused
kernel's backward recomputes the softmax and the gradients of the frozen queries and keys. The first run's
output is the kernel's own (so the frozen run's values are the model's, to the bit); its gradient is `Pᵀ g`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Slot = tuple[int, int]
"""(attention module id, how many times it was called before in this run)."""


class Patterns:
    """Each attention call's pattern, grouped by key/value head: [H_kv, n_rep, T_q, T_kv] (or None: the
    check failed there and the kernel is called with the frozen queries and keys instead)."""

    def __init__(self) -> None:
        self.p: dict[Slot, Tensor | None] = {}

    def __call__(self, slot: Slot, first: bool, kernel: Callable[..., Any], module: Any, query: Tensor, key: Tensor,
                 value: Tensor, *args: Any, **kwargs: Any) -> Any:
        """The kernel's output for frozen `query`, `key` [B, H, T, D] and `value` [B, H_kv, T, D], as
        `(out [B, T, H, D], None)` as transformers' kernels return it."""
        if first:
            with torch.no_grad():
                ref = kernel(module, query, key, value.detach(), *args, **kwargs)
            self.p[slot] = read_pattern(kernel, module, query, key, value, ref[0], args, kwargs)
            if self.p[slot] is not None:
                return (_PatternTimesValue.apply(value, self.p[slot], ref[0]), None)
        pattern = self.p[slot]
        if pattern is None:
            return kernel(module, query, key, value, *args, **kwargs)
        return (_PatternTimesValue.apply(value, pattern, None), None)


def read_pattern(kernel: Callable[..., Any], module: Any, query: Tensor, key: Tensor, value: Tensor, ref: Tensor,
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The pattern [H_kv, n_rep, T_q, T_kv] of one call, read off the kernel with identity blocks as values on
    the first row, or None where `P v` is not the kernel's output `ref` (module docstring)."""
    batch, heads, t_q = query.shape[:3]
    _, kv_heads, t_kv, dim = value.shape
    if heads % kv_heads or tuple(ref.shape) != (batch, t_q, heads, dim):
        return None
    one = (lambda x: x[:1] if isinstance(x, Tensor) and x.dim() and x.shape[0] == batch > 1 else x)
    args1, kwargs1 = tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}
    pattern = value.new_zeros(heads, t_q, t_kv)
    with torch.no_grad():
        for start in range(0, t_kv, dim):
            width = min(dim, t_kv - start)
            block = value.new_zeros(1, kv_heads, t_kv, dim)
            block[0, :, start + torch.arange(width), torch.arange(width)] = 1
            out = kernel(module, query[:1], key[:1], block, *args1, **kwargs1)[0]
            if tuple(out.shape) != (1, t_q, heads, dim):
                return None
            pattern[:, :, start: start + width] = out[0, :, :, :width].transpose(0, 1)
        grouped = pattern.view(kv_heads, heads // kv_heads, t_q, t_kv)
        ours = _times(grouped, value[:1].detach())
    tol = 1e-4 if value.dtype == torch.float32 else 2e-2
    atol = tol * float(ref[:1].abs().max().clamp_min(1))
    return grouped if torch.allclose(ours.float(), ref[:1].float(), rtol=tol, atol=atol) else None


def _times(pattern: Tensor, value: Tensor) -> Tensor:
    """`P v`: [B, T_q, H, D] from the pattern [H_kv, n_rep, T_q, T_kv] and values [B, H_kv, T_kv, D]: one batched
    matmul per key/value head over every row at once (the rows ride in the matmul's width)."""
    kv_heads, n_rep, t_q, t_kv = pattern.shape
    batch, dim = value.shape[0], value.shape[-1]
    v = value.permute(1, 2, 0, 3).reshape(kv_heads, t_kv, batch * dim)
    out = torch.bmm(pattern.reshape(kv_heads, n_rep * t_q, t_kv), v.to(pattern.dtype))
    return out.view(kv_heads, n_rep, t_q, batch, dim).permute(3, 2, 0, 1, 4).reshape(batch, t_q, -1, dim)


class _PatternTimesValue(torch.autograd.Function):
    """`P v` (or the kernel's own output `ref`, when given: the first run) with backward `Pᵀ g`."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, pattern: Tensor, ref: Tensor | None) -> Tensor:
        ctx.pattern = pattern
        ctx.shape = value.shape
        return ref.clone() if ref is not None else _times(pattern, value)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        pattern: Tensor = ctx.pattern
        kv_heads, n_rep, t_q, t_kv = pattern.shape
        batch, dim = ctx.shape[0], ctx.shape[-1]
        g = grad.view(batch, t_q, kv_heads, n_rep, dim).permute(2, 3, 1, 0, 4).reshape(kv_heads, n_rep * t_q, -1)
        dv = torch.bmm(pattern.reshape(kv_heads, n_rep * t_q, t_kv).transpose(1, 2), g.to(pattern.dtype))
        return dv.view(kv_heads, t_kv, batch, dim).permute(2, 0, 1, 3), None, None
