"""Attention rows at the read position, recomputed from the queries and keys the model itself used.

For every layer, the head outputs at `t*` are `o_h = Σ_s A_h[t*, s] v_h(s)`. Rather than switching
the model to eager attention, we watch the call the model makes to its attention kernel (sdpa,
eager, flash) through transformers' `AttentionInterface`: the wrapper sees the post-RoPE (and
post-q/k-norm) queries and keys, the values, the mask and the kernel's options, recomputes the one
row `A[t*, :]` per head (`softmax(softcap(scale · q_t·k_s) + position bias + mask)`, keys and values
repeated over a GQA group) and proves it on the spot: `Σ_s A v` must equal the kernel's own output
at `t*`. Nothing of the model is modified; `get_interface` is restored on exit, also on error.

Models whose attention does not go through the interface (DeBERTa-v2's disentangled attention)
return their attention probabilities with `output_attentions=True`; their values are read at the
value projection the architecture map names (`ArchitectureMap.attn_values`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..errors import ArchitectureError
from ..model import RewardModel
from ..model.internal import Batch, eval_mode, first_output, rewriting


@dataclass
class Rows:
    """Per layer: `split[l]` [n, H, T] = `A_h[t*, s] · (g_h · v_h(s))`, the head's contribution from
    each source column; `gap[l]` the relative gap between `Σ_s A v` and the kernel's own output at `t*`."""

    split: dict[int, Tensor] = field(default_factory=dict)
    gap: dict[int, float] = field(default_factory=dict)


def _expand(x: Tensor, n_heads: int) -> Tensor:
    """Keys or values [n, H_kv, T, d] → [n, H, T, d]: query head h reads kv head h // (H / H_kv)."""
    return x if x.shape[1] == n_heads else x.repeat_interleave(n_heads // x.shape[1], dim=1)


def _keep(mask: Tensor | None, at: Tensor, length: int, causal: bool, window: int | None) -> Tensor:
    """[n, 1, T] bool: the sources a kernel without a 4-D mask lets `t*` see (padding, causality, window)."""
    s = torch.arange(length, device=at.device)[None, None, :]
    t = at[:, None, None]
    keep = torch.ones(len(at), 1, length, dtype=torch.bool, device=at.device)
    if mask is not None:  # 2-D padding mask (flash attention)
        keep = keep & mask[:, None, :].bool()
    if causal:
        keep = keep & (s <= t)
    if window is not None:
        keep = keep & (s > t - window)
    return keep


def attention_row(
    module: Any, query: Tensor, key: Tensor, mask: Tensor | None, at: Tensor, impl: str, kwargs: dict[str, Any]
) -> Tensor:
    """The attention row `A_h[t*, :]` [n, H, T] in fp32 from one kernel call's own inputs.

    `query` [n, H, T, d], `key` [n, H_kv, T, d] as the kernel received them (after RoPE, q/k norms);
    scores `scale · q_t·k_s`, soft-capped `c·tanh(x/c)` when `softcap` is set, plus `position_bias`
    (ALiBi-style additive biases) and the mask; a missing or 2-D mask means the kernel's own rule
    (causal per `is_causal`, and flash kernels' `sliding_window`)."""
    n, n_heads, length = query.shape[0], query.shape[1], key.shape[2]
    rows = torch.arange(n, device=query.device)
    q = query[rows, :, at.to(query.device)].float()  # [n, H, d]
    scale = kwargs.get("scaling")
    scores = torch.einsum("nhd,nhtd->nht", q, _expand(key.float(), n_heads))
    scores = scores * (q.shape[-1] ** -0.5 if scale is None else float(scale))
    softcap = kwargs.get("softcap")
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    at = at.to(scores.device)
    bias = kwargs.get("position_bias")
    if bias is not None:
        scores = scores + bias.float().expand(n, n_heads, -1, -1)[rows, :, at]
    if mask is not None and mask.ndim == 4:
        picked = mask.expand(n, n_heads, -1, -1)[rows, :, at]
        scores = scores.masked_fill(~picked, float("-inf")) if picked.dtype == torch.bool else scores + picked.float()
    else:
        causal = kwargs.get("is_causal")
        causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
        window = kwargs.get("sliding_window") if impl.startswith("flash") else None
        scores = scores.masked_fill(~_keep(mask, at, length, causal, window), float("-inf"))
    return torch.softmax(scores, dim=-1)


def _owners(model: RewardModel) -> dict[int, int]:
    """id(module) → layer, for every module inside a transformer layer."""
    return {id(m): layer for layer in range(model.n_layers) for m in model.layers[layer].modules()}


def _record(rows: Rows, owners: dict[int, int], at: Tensor, g: dict[int, Tensor], impl: str, module: Any,
            query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, out: Tensor, kwargs: dict[str, Any]
            ) -> None:
    layer = owners.get(id(module))
    if layer is None or layer in rows.split:  # not one of the map's layers (or a second call): not ours
        return
    weights = attention_row(module, query, key, mask, at, impl, kwargs)  # [n, H, T]
    values = _expand(value.float(), query.shape[1])  # [n, H, T, d]
    mixed = torch.einsum("nht,nhtd->nhd", weights, values)
    own = out[torch.arange(len(at), device=out.device), at.to(out.device)].float()  # [n, H, d]
    # Rows whose kernel output is non-finite (a NaN weight, an overflow) prove nothing either way: their parts
    # come out non-finite, and the instruments name those pairs. The rest must reproduce the kernel.
    ok = torch.isfinite(own).flatten(1).all(1)
    gap = (mixed[ok] - own[ok]).norm() / own[ok].norm().clamp_min(1e-12)
    rows.gap[layer] = float(gap) if bool(ok.any()) else 0.0
    rows.split[layer] = weights * torch.einsum("nhd,nhtd->nht", g[layer].to(values.device), values)


@contextlib.contextmanager
def _watching(record: Callable[..., None]) -> Iterator[None]:
    """While inside, every attention kernel the model fetches from `AttentionInterface` reports its call."""
    from transformers.modeling_utils import AttentionInterface

    original = AttentionInterface.get_interface

    def wrapped(kernel: Callable[..., Any], impl: str, module: Any, query: Tensor, key: Tensor, value: Tensor,
                mask: Tensor | None, *args: Any, **kwargs: Any) -> Any:
        out = kernel(module, query, key, value, mask, *args, **kwargs)
        record(impl, module, query, key, value, mask, out[0], kwargs)
        return out

    def get_interface(self: Any, impl: str, default: Callable[..., Any]) -> Callable[..., Any]:
        return functools.partial(wrapped, original(self, impl, default), str(impl))

    AttentionInterface.get_interface = get_interface  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        AttentionInterface.get_interface = original  # type: ignore[method-assign]


def rows_at_read(model: RewardModel, batch: Batch, g: dict[int, Tensor]) -> Rows:
    """One forward of `batch`: every layer's attention row at `t*`, contracted with `g[l]` [n, H, d_head]
    (each head's read-out vector in its value space) into `Rows.split`."""
    rows, at = Rows(), batch.read_index
    values_path = model.arch.attn_values
    kwargs = model.batch_kwargs(batch)
    with torch.no_grad(), eval_mode(model.model):
        if values_path is None:
            record = functools.partial(_record, rows, _owners(model), at, g)
            with _watching(record):
                model.backbone(**kwargs)
        else:
            _eager_rows(model, rows, at, g, values_path, kwargs)
    tol = 1e-3 if next(model.model.parameters()).dtype == torch.float32 else 5e-2
    bad = {layer: gap for layer, gap in rows.gap.items() if not gap <= tol}
    if bad:
        raise ArchitectureError(
            f"attention rows recomputed at the read position of {model.arch.name!r} do not reproduce the kernel's "
            f"own output (relative gap by layer {bad}, tolerance {tol:g}): the kernel applies a score rule "
            "attention_row does not know (a mask, bias or cap it was not given)"
        )
    missing = [layer for layer in range(model.n_layers) if layer not in rows.split]
    if missing:
        raise ArchitectureError(
            f"layers {missing} of {model.arch.name!r} did not call an attention kernel through transformers' "
            "AttentionInterface, so their attention rows at the read position cannot be recomputed; token "
            "attribution supports models whose attention does (or whose map names `attn_values`)"
        )
    return rows


def _eager_rows(model: RewardModel, rows: Rows, at: Tensor, g: dict[int, Tensor], path: str,
                kwargs: dict[str, Any]) -> None:
    """Attention modules outside the interface: probabilities from `output_attentions=True`, values
    from the value projection's output."""
    values: dict[int, Tensor] = {}

    def keep(layer: int, x: Tensor) -> None:
        values[layer] = x.float()

    hooks = [(model.layer_module(layer, path), "out", functools.partial(keep, layer))
             for layer in range(model.n_layers)]
    with rewriting(hooks):
        out = model.backbone(**kwargs, output_attentions=True)
    attentions = getattr(out, "attentions", None)
    if attentions is None or len(attentions) != model.n_layers:
        raise ArchitectureError(f"{model.arch.name!r} returned no attention probabilities with output_attentions=True")
    n = len(at)
    for layer in range(model.n_layers):
        probs = first_output(attentions[layer]).float()  # [n, H, T, T]
        weights = probs[torch.arange(n, device=probs.device), :, at.to(probs.device)]  # [n, H, T]
        v = values[layer].view(n, values[layer].shape[1], weights.shape[1], -1).transpose(1, 2)  # [n, H, T, d]
        rows.split[layer] = weights * torch.einsum("nhd,nhtd->nht", g[layer].to(v.device), v)
        rows.gap[layer] = 0.0  # no kernel output to compare with; the closure check in `tokens` proves it
