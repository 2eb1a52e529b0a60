"""The exact decomposition: every part's contribution to the reward, and the two lenses.

With the final norm's scale frozen (and, in post-norm encoders, every residual norm's), the
reward is affine in what each part writes to the residual at the read position `t*`:
`r = Σ_parts u_p · c_p + const`. We walk the read-out vectors `u` from the head back through
the norms (docs/design.md §1); a part's value is `u · c`, a head's `(W_Oᵀu)_h · z_h`, a neuron's
`(W_downᵀu)_n · act_n`. Values are in reward units, per objective and for the readout scalar.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import get_args

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs
from ..errors import UsageError
from ..model import Part, RewardModel, SublayerKind, Trace, TraceKey, trace, verify
from ..model.internal import (
    Batch,
    Tokenized,
    check_bookkeeping,
    expert_parts,
    is_moe_layer,
    out_projection,
    projection_inputs,
    sublayer_part,
)
from ..types import Level, PaddingSide
from ._experts import expert_values
from ._steps import Steps, batch_steps, fold, join_steps

LEVELS: tuple[Level, ...] = get_args(Level)


def part_names(model: RewardModel, level: Level, layers: Iterable[int]) -> list[str]:
    """Ordered part names for `level`; fine-grained only on `layers`, sublayers elsewhere."""
    return [part.name for part in parts(model, level, layers)]


def parts(model: RewardModel, level: Level, layers: Iterable[int]) -> list[Part]:
    """The ordered parts behind `part_names`."""
    layers, out = set(layers), [Part.embed()]
    for layer in range(model.n_layers):
        if level == "head" and layer in layers:
            out += [Part.attn(layer, h) for h in range(model.n_heads)]
            out += [Part.attn(layer, bias=True)] if has_bias_part(model, "attn", layer) else []
        else:
            out.append(Part.attn(layer))
        if level == "neuron" and layer in layers and is_moe_layer(model, layer):
            out += expert_parts(model, layer)  # a sparse block splits into its experts
        elif level == "neuron" and layer in layers:
            out += [Part.mlp(layer, n) for n in range(projection_inputs(model, "mlp", layer)[0])]
            out += [Part.mlp(layer, bias=True)] if has_bias_part(model, "mlp", layer) else []
        else:
            out.append(Part.mlp(layer))
    return out


def _sublayer(model: RewardModel, tr: Trace, kind: SublayerKind, layer: int, u: Tensor, fine: bool) -> Tensor:
    """Values [n, k, m] of sublayer `kind` of `layer` read along `u` [n, k, d]: m = 1, or its
    heads/neurons (plus one bias part when the projection or post-norm has a bias) when `fine`;
    a mixture-of-experts block's experts (`expert_values`)."""
    if not fine:
        return torch.einsum("nkd,nd->nk", u, sublayer_part(model, tr, kind, layer))[..., None]
    if kind == "mlp" and is_moe_layer(model, layer):
        return expert_values(model, tr, layer, u)
    post = model.arch.attn_post_norm if kind == "attn" else model.arch.mlp_post_norm
    const = None
    if post is not None:  # heads/neurons pass through the post-norm with its scale frozen
        u, const = model.norm(post, layer).pullback(u, tr[TraceKey.sublayer(kind, layer)])
        const = const if model.norm(post, layer).beta is not None else None
    weight, bias = out_projection(model, kind, layer)
    proj = u @ weight  # [n, k, in]
    if kind == "attn":
        n, k = proj.shape[:2]
        z = tr[TraceKey.attn_z(layer)]
        per = (proj.view(n, k, model.n_heads, -1) * z.view(n, 1, model.n_heads, -1)).sum(-1)
    else:
        per = proj * tr[TraceKey.mlp_act(layer)][:, None, :]
    if bias is None:
        if const is None:
            return per
        extra = const
    else:
        extra = u @ bias if const is None else u @ bias + const
    return torch.cat([per, extra[..., None]], dim=-1)


def has_bias_part(model: RewardModel, kind: SublayerKind, layer: int) -> bool:
    """Whether a fine-grained split of this sublayer carries a separate bias part."""
    post = model.arch.attn_post_norm if kind == "attn" else model.arch.mlp_post_norm
    post_beta = post is not None and model.norm(post, layer).beta is not None
    return projection_inputs(model, kind, layer)[1] or post_beta


def readout_vectors(
    model: RewardModel, tr: Trace, coef: Tensor | None = None
) -> tuple[Tensor, list[Tensor], list[Tensor], dict[int, Tensor]]:
    """Effective read-out vectors where each part writes: `(u_embed, u_attn[l], u_mlp[l], constants)`.

    Each `u` is [n, k, d]: the head's rows pulled back through the frozen norms between that
    part and the head. `constants` maps a depth (0 = embeddings, l+1 = layer l) to the [n, k]
    constant added there by post-norm residual norms; key -1 holds the constant of the head and
    the final norm, which applies at every depth. With readout coefficients `coef` [n, k], the
    rows are contracted first (k becomes 1): exact, since every later step is linear in `u`.
    """
    arch, n_layers = model.arch, model.n_layers
    u, head_const = model.head_rows(model.final_hidden(tr[TraceKey.final()]), tr.batch)
    if coef is not None:
        u, head_const = (coef[..., None] * u).sum(1, keepdim=True), (coef * head_const).sum(-1, keepdim=True)
    consts = {-1: head_const.clone()}
    if arch.final_norm is not None:
        u, c = model.norm(arch.final_norm).pullback(u, tr[TraceKey.final()])
        consts[-1] = consts[-1] + c
    u_attn: list[Tensor] = [u] * n_layers
    u_mlp: list[Tensor] = [u] * n_layers
    if arch.layout == "post_norm":
        attn_rnorm, mlp_rnorm = arch.residual_norms
        for layer in reversed(range(n_layers)):
            u, c_mlp = model.norm(mlp_rnorm, layer).pullback(u, tr[TraceKey.mlp_rnorm(layer)])
            u_mlp[layer] = u
            u, c_attn = model.norm(attn_rnorm, layer).pullback(u, tr[TraceKey.attn_rnorm(layer)])
            u_attn[layer] = u
            consts[layer + 1] = consts.get(layer + 1, 0) + c_mlp + c_attn
    return u, u_attn, u_mlp, consts


def decompose_trace(
    model: RewardModel, tr: Trace, level: Level, layers: set[int], coef: Tensor | None = None
) -> tuple[Tensor, list[int], dict[int, Tensor]]:
    """Decompose one traced batch: values [n, k, P] in `part_names` order (k = 1 when the
    readout `coef` is given), each part's depth (0 = embeddings, l+1 = layer l) and the
    constants by depth."""
    u_embed, u_attn, u_mlp, consts = readout_vectors(model, tr, coef)
    blocks = [torch.einsum("nkd,nd->nk", u_embed, tr[TraceKey.embed()])[..., None]]
    depth = [0]
    for layer in range(model.n_layers):
        sublayers: tuple[tuple[SublayerKind, Tensor, bool], ...] = (
            ("attn", u_attn[layer], level == "head" and layer in layers),
            ("mlp", u_mlp[layer], level == "neuron" and layer in layers),
        )
        for kind, u, fine in sublayers:
            block = _sublayer(model, tr, kind, layer, u, fine)
            blocks.append(block)
            depth += [layer + 1] * block.shape[-1]
    return torch.cat(blocks, dim=-1), depth, consts


@dataclass(frozen=True)
class Decomposition:
    """Batched decomposition of many sequences (pairs interleaved chosen, rejected), numpy fp32.

    `values` [N, k, P] per objective; `coefficients` [N, k] the readout (frozen gate for ArmoRM);
    `objectives` [N, k] the head's own outputs; `head_constant` [N, k] the head's and final norm's
    constant; `constants` [N, k, L+1] the constant entering at each depth (post-norm encoders);
    `normed` [N, k, L+1] the head applied to the re-normalised residual at each depth;
    `depth` [P] where each part enters; `n_tokens` [N] each sequence's length (for per-token
    rates).
    """

    names: list[str]
    depth: np.ndarray
    values: np.ndarray
    head_constant: np.ndarray
    constants: np.ndarray
    objectives: np.ndarray
    coefficients: np.ndarray
    normed: np.ndarray
    n_tokens: np.ndarray
    is_pairs: bool
    labels: list[str]
    steps: Steps | None = None
    """Multi-position read-outs (PRMs, DPO): every read's own reward and constant, and, for step
    separators, its parts — so a PRM audit can say at which step a preference forms."""

    @property
    def reward(self) -> np.ndarray:
        return (self.objectives * self.coefficients).sum(-1)

    def scalar(self, arr: np.ndarray) -> np.ndarray:
        """Contract the objective axis of `arr` [N, k, ...] with the readout → [N, ...]."""
        return np.einsum("nk...,nk->n...", arr, self.coefficients)

    def coarsen(self) -> Decomposition:
        """The same decomposition at sublayer level: each head's or neuron's value (and its
        sublayer's bias part) summed into its sublayer, [N, k, P] → [N, k, 2L+1]. Exact: a
        sublayer's output is the sum of its heads' (neurons') writes and its bias."""
        sublayers = [Part.parse(name).sublayer for name in self.names]
        names = list(dict.fromkeys(part.name for part in sublayers))
        index = {name: i for i, name in enumerate(names)}
        member = np.zeros((len(self.names), len(names)))  # [P, S]: part p belongs to sublayer s
        member[np.arange(len(self.names)), [index[part.name] for part in sublayers]] = 1.0
        values = (self.values.astype(np.float64) @ member).astype(self.values.dtype)
        depth = np.array([Part.parse(name).depth for name in names])
        return replace(self, names=names, values=values, depth=depth)


def decompose(
    model: RewardModel,
    inputs: Inputs,
    *,
    level: Level = "sublayer",
    layers: Iterable[int] | None = None,
    batch_size: int = 8,
    padding_side: PaddingSide = "right",
    per_objective: bool | None = None,
    on_trace: Callable[[np.ndarray, Batch, Trace], None] | None = None,
    encoded: tuple[list[Tokenized], bool] | None = None,
) -> Decomposition:
    """Exact decomposition of every input's reward (see module docstring); one forward per batch.

    `per_objective` keeps every head output's decomposition ([N, k, P]); otherwise only the
    readout scalar is kept ([N, 1, P]), which costs 1/k of the memory and of the read-out work.
    Default: kept, except at neuron level, where k × L × d_mlp values per input add up fast.
    `on_trace(rows, batch, trace)` sees each batch's trace (rows index `inputs`' sequences), so a
    caller that needs the same clean runs (the patch engines' `Clean`) does not trace again.
    `encoded`: what `model.encode(inputs)` returns, when the caller has it already (so the inputs are
    tokenized once for every instrument of a chunk).
    """
    if level not in LEVELS:
        raise UsageError(f"level must be one of {LEVELS}, got {level!r}")
    fine_layers = set(range(model.n_layers) if layers is None else layers)
    bad = sorted(x for x in fine_layers if not 0 <= x < model.n_layers)
    if bad:
        raise UsageError(f"layers {bad} out of range for a model with {model.n_layers} layers")
    if not model.verified:
        verify(model)
    seqs, is_pairs = model.encode(inputs) if encoded is None else encoded
    names = part_names(model, level, fine_layers)
    keep = per_objective if per_objective is not None else level != "neuron"
    keep = keep and model.head.n_objectives > 1
    n, k, n_parts, depth_count = len(seqs), model.head.n_objectives if keep else 1, len(names), model.n_layers + 1
    values = np.zeros((n, k, n_parts), dtype=np.float32)
    constants = np.zeros((n, k, depth_count), dtype=np.float32)
    head_constant = np.zeros((n, k), dtype=np.float32)
    normed = np.zeros((n, k, depth_count), dtype=np.float32)
    objectives = np.zeros((n, k), dtype=np.float32)
    coefficients = np.zeros((n, k), dtype=np.float32)
    depth: list[int] = []
    heads, neurons = fine_layers if level == "head" else set(), fine_layers if level == "neuron" else set()
    checked, steps = False, []
    for rows, batch in model.batches(seqs, batch_size, padding_side, is_pairs):
        tr = trace(model, batch, heads=heads, neurons=neurons)
        if on_trace is not None:
            on_trace(rows, batch, tr)
        if not checked:
            check_bookkeeping(model, tr)
            checked = True
        out, coef = model.head_readout(tr.captured, batch)
        vals, depth, consts = decompose_trace(model, tr, level, fine_layers, None if keep else coef)
        weights = model.fold(batch, (out * coef).sum(-1))  # multi-position read-outs: reads → sequences
        if weights is not None:
            steps.append(_steps_of(batch, rows, weights, out, coef, vals, consts[-1], keep))
            out, coef = fold(weights, out), coef[:1].expand(len(rows), -1)
        values[rows] = fold(weights, vals).cpu().numpy()
        for d, c in consts.items():
            if d == -1:
                head_constant[rows] = fold(weights, c).cpu().numpy()
            else:
                constants[rows, :, d] = fold(weights, c).cpu().numpy()
        lens_obj = fold(weights, torch.stack([model.head_values(model.final_hidden(tr[TraceKey.at_depth(d)]), batch)
                                              for d in range(model.n_layers + 1)], 2))
        if not keep:  # contract objectives with the readout; the coefficients become 1
            out = (out * coef).sum(-1, keepdim=True)
            lens_obj = (lens_obj * coef[..., None]).sum(1, keepdim=True)
            coef = torch.ones_like(out)
        objectives[rows], coefficients[rows] = out.cpu().numpy(), coef.cpu().numpy()
        normed[rows] = lens_obj.cpu().numpy()
    return Decomposition(
        names=names, depth=np.asarray(depth), values=values, head_constant=head_constant, constants=constants,
        objectives=objectives, coefficients=coefficients, normed=normed, n_tokens=np.array([len(s.ids) for s in seqs]),
        is_pairs=is_pairs, labels=list(model.head.labels) if keep or model.head.n_objectives == 1 else ["readout"],
        steps=join_steps(steps, names) if steps else None,
    )


def _steps_of(
    batch: Batch, rows: np.ndarray, weights: Tensor, out: Tensor, coef: Tensor, vals: Tensor, head_const: Tensor,
    keep: bool,
) -> dict[str, np.ndarray]:
    """A multi-position batch's per-read columns: scalar reward, constant and (PRM steps) parts."""
    scalar = vals if not keep else torch.einsum("mkp,mk->mp", vals, coef)[:, None]
    const = (head_const * coef).sum(-1) if keep else head_const[:, 0]
    kept = scalar[:, 0] if batch.reads is not None and batch.reads.targets is None else None
    return batch_steps(batch, rows, weights, (out * coef).sum(-1), const, kept)
