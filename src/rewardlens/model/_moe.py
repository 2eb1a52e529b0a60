"""Mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE): the sparse block is the MLP sublayer,
and at the read position it splits exactly into its experts.

A sparse block computes, per token, `y = Σ_{e ∈ top-k(x)} g_e(x)·E_e(x) [+ σ(w_s·x)·S(x)]`: the
router's top-k weights `g_e(x)` times each chosen expert's output, plus (Qwen2-MoE) a shared
expert `S` behind a sigmoid gate. The whole block's output is what the layer adds to the residual,
so an architecture map names the block itself as `mlp_out`. Its finer parts are the terms of that
sum on this input: with the router's weights computed on the captured input (a frozen gain, like a
norm's frozen scale), the terms add up to the block's output exactly, and `expert_writes` proves
that on every call. The terms come from the model's own modules (router, fused experts, shared
expert) called on the captured input, never from re-implemented expert math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..errors import ArchitectureError
from ._hooks import eval_mode
from ._parts import Part
from ._placement import execution_device, onloaded
from ._sparse import EXPERTS, is_moe_block, moe_paths

if TYPE_CHECKING:
    from ._backbone import Backbone

_KNOWN_CHILDREN = {"gate", EXPERTS, "shared_expert", "shared_expert_gate"}
# Relative gap allowed between the experts' sum and the block's captured output, by weight dtype:
# fp32 sums the same terms in another order (~1e-7); half precision rounds each expert's output.
SUM_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
_HALF_TOLERANCE = 5e-2


@dataclass(frozen=True)
class MoeBlock:
    """The modules of one understood sparse block (Mixtral, Qwen2-MoE, Qwen3-MoE layout)."""

    path: str
    """Path of the block relative to its layer (the map's `mlp_out`), for messages."""
    module: nn.Module
    """The block itself."""
    router: nn.Module
    """`gate`: hidden [n, d] → (logits [n, E], top-k weights [n, k], top-k indices [n, k])."""
    experts: nn.Module
    """`experts`: (hidden [n, d], indices [n, k], weights [n, k]) → Σ_j weights_j · E_{indices_j}(hidden)."""
    n_experts: int
    shared: nn.Module | None
    """`shared_expert` (an MLP on every token), or None."""
    shared_gate: nn.Module | None
    """`shared_expert_gate` (a linear map to one logit; the block multiplies by its sigmoid), or None."""


def _refuse(path: str, block: nn.Module, what: str) -> ArchitectureError:
    return ArchitectureError(
        f"the mixture-of-experts block {path!r} ({type(block).__name__}) has {what}; rewardlens splits a "
        "sparse block into experts only in the layout of Mixtral, Qwen2-MoE and Qwen3-MoE (children 'gate': "
        "a router returning (logits, top-k weights, top-k indices); 'experts': called as experts(hidden, "
        "indices, weights); optionally 'shared_expert' with 'shared_expert_gate'). Use level='sublayer' or "
        "'head' (the whole block stays one exact part), or pass layers= without this layer"
    )


def moe_block(model: Backbone, layer: int) -> MoeBlock:
    """The understood sparse block of `layer` (the map's `mlp_out`); ArchitectureError naming what is not."""
    path = model.arch.mlp_out
    block = model.layer_module(layer, path)
    if not is_moe_block(block):
        raise ArchitectureError(
            f"layer {layer}'s MLP {path!r} ({type(block).__name__}) is not a mixture-of-experts block")
    children = dict(block.named_children())
    unknown = sorted(set(children) - _KNOWN_CHILDREN)
    if unknown:
        raise _refuse(path, block, f"children {unknown} whose role in the sum is not understood")
    experts, router = children[EXPERTS], children.get("gate")
    n_experts = getattr(experts, "num_experts", None)
    if router is None or not isinstance(n_experts, int):
        raise _refuse(path, block, "no 'gate' router" if router is None else "experts without an int num_experts")
    shared, shared_gate = children.get("shared_expert"), children.get("shared_expert_gate")
    if (shared is None) != (shared_gate is None):
        raise _refuse(path, block, "a shared expert without its gate (or a gate without its shared expert)")
    return MoeBlock(path, block, router, experts, n_experts, shared, shared_gate)


def is_moe_layer(model: Backbone, layer: int) -> bool:
    """Whether `layer`'s MLP sublayer (the map's `mlp_out`) is a sparse block."""
    return is_moe_block(model.layer_module(layer, model.arch.mlp_out))


def expert_parts(model: Backbone, layer: int) -> list[Part]:
    """The parts of a sparse layer at the fine level: `mlp_L{l}_E{e}` for every expert, then `mlp_L{l}_shared`."""
    block = moe_block(model, layer)
    out = [Part.mlp(layer, expert=e) for e in range(block.n_experts)]
    return out + ([Part.mlp(layer, shared=True)] if block.shared is not None else [])


def _is_top_k(got: object, n: int) -> bool:
    """Whether a router returned (logits, top-k weights [n, k], integer top-k indices [n, k])."""
    if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(t, Tensor) for t in got)):
        return False
    _, weights, index = got
    return weights.ndim == 2 and weights.shape == index.shape and len(weights) == n and not index.is_floating_point()


def _route(block: MoeBlock, h: Tensor) -> tuple[Tensor, Tensor]:
    """The router's (top-k weights [n, k], top-k indices [n, k]) on `h` [n, d], checked for shape."""
    got = block.router(h)
    if not _is_top_k(got, len(h)):
        shapes = [tuple(getattr(t, "shape", ())) for t in got] if isinstance(got, tuple) else type(got).__name__
        raise _refuse(block.path, block.module, f"a router that returned {shapes} on {len(h)} tokens, not "
                      "(logits [n, E], top-k weights [n, k], top-k indices [n, k])")
    return got[1], got[2]


def _terms(block: MoeBlock, h: Tensor) -> Tensor:
    """Every term of the block's sum on `h` [n, d]: [n, E (+1), d] in the model's dtype.

    Each chosen expert runs alone (the fused module called with one index and its router weight per
    row), so the terms are the module's own arithmetic; unchosen experts are exactly zero."""
    weights, index = _route(block, h)
    n, k = index.shape
    rows = h.repeat_interleave(k, dim=0)  # [n·k, d]: row i·k + j is token i sent to its j-th choice
    one = block.experts(rows, index.reshape(-1, 1), weights.reshape(-1, 1))  # [n·k, d]
    terms = h.new_zeros(n, block.n_experts + (block.shared is not None), h.shape[-1], dtype=one.dtype)
    terms[torch.arange(n, device=h.device).repeat_interleave(k), index.reshape(-1)] = one
    if block.shared is not None and block.shared_gate is not None:
        # The block's own expression: sigmoid(shared_expert_gate(x)) * shared_expert(x).
        terms[:, -1] = (torch.sigmoid(block.shared_gate(h)) * block.shared(h)).to(one.dtype)
    return terms


def expert_writes(model: Backbone, layer: int, x: Tensor, out: Tensor) -> Tensor:
    """Each expert's write of `layer`'s sparse block: [..., E (+1), d] fp32, in `expert_parts` order.

    `x` [..., d] is the block's captured input and `out` [..., d] its captured output, at the same
    positions (fp32). Routed expert e writes `g_e(x)·E_e(x)` (0 when the router did not choose it),
    the shared expert `σ(w_s·x)·S(x)`. Raises ArchitectureError unless the writes sum to `out`.
    """
    block = moe_block(model, layer)
    module = block.module
    device = execution_device(model.model, module)
    dtype = next(p.dtype for p in block.experts.parameters())
    flat = x.reshape(-1, x.shape[-1])
    with torch.no_grad(), onloaded(module), eval_mode(module):  # eval: Mixtral jitters inputs in training
        terms = _terms(block, flat.to(device=device, dtype=dtype)).to(device=x.device, dtype=torch.float32)
    terms = terms.view(*x.shape[:-1], *terms.shape[-2:])
    _prove(block, layer, terms.sum(-2), out, dtype)
    return terms


def _prove(block: MoeBlock, layer: int, total: Tensor, out: Tensor, dtype: torch.dtype) -> None:
    """The experts' sum must be the block's captured output, else nothing is reported."""
    gap = float(((total - out).norm(dim=-1) / out.norm(dim=-1).clamp_min(1e-12)).max())
    tol = SUM_TOLERANCE.get(dtype, _HALF_TOLERANCE)
    if not gap <= tol:
        raise _refuse(block.path, block.module, f"experts whose router-weighted outputs do not add up to the "
                      f"block's output at layer {layer} (relative gap {gap:.2e} > {tol:.0e} for {dtype}): the "
                      "block adds something rewardlens does not see")


def check_moe_map(model: Backbone) -> None:
    """Refuse a map whose MLP output is not a layer's sparse block itself (a module inside it, such as
    'mlp.experts' or the shared expert's down-projection, writes only part of the sum, on flattened
    [n·T, d] states), before any check input runs."""
    for layer, module in enumerate(model.layers):
        paths = moe_paths(module)
        if paths and model.arch.mlp_out != paths[0]:
            kind = type(module.get_submodule(paths[0])).__name__
            raise ArchitectureError(
                f"map {model.arch.name!r} names {model.arch.mlp_out!r} as layer {layer}'s MLP output, but that "
                f"layer's MLP is the mixture-of-experts block {paths[0]!r} ({kind}):"
                " only the whole block's output (the router-weighted experts plus any shared expert) is what the "
                f"layer adds to the residual stream. Set mlp_out={paths[0]!r}"
            )
