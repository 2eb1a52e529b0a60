"""∂r/∂(input of every node) from one forward and one backward: the gradients edge attribution reads.

Each sublayer receiver d gets a zero leaf δ_d [B, T, d] through `_receivers.receiving` (δ added
upstream of the node and cancelled at its write), so `∂r/∂δ_d` is the gradient of the reward through
node d's input alone, every later path open (no graph is cut: the leaves are zeros). A head receiver
(l, h, x ∈ q/k/v) gets a zero leaf ε on each projection's output; `W_x[h]ᵀ ∂r/∂ε[h]` is the gradient at
the projection's input through head h's x alone, pulled back through the module between the stream and
the projections (the input norm; nothing in an encoder) by one vector-Jacobian product against the
attention receiver's leaf, whose only route to the projections' input is that module. The user's
parameters collect no `.grad` (`torch.autograd.grad` on the leaves only). The heads' gradients are
made one layer at a time, on demand (`NodeGrads.heads`), and scored as they come (`chunk_scores`),
so at most one layer's [B, n_x·H, m, d] of them is alive, never all D node inputs' [B, D, m, d].
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model import RewardModel, TraceKey
from ..model.internal import Batch, capture, eval_mode, out_projection, rewriting
from ._engine import Site, site_point
from ._receivers import QKVS, Receiver, receiving, wiring


def _leaf(store: dict[str, Tensor], key: str, x: Tensor) -> Tensor:
    leaf = torch.zeros_like(x, requires_grad=True)
    store[key] = leaf
    return x + leaf


def _keep(store: dict[str, Tensor], key: str, x: Tensor) -> None:
    store[key] = x


def _projections(model: RewardModel, layer: int) -> dict[str, nn.Module]:
    arch = model.arch
    paths = {"q": arch.attn_q, "k": arch.attn_k, "v": arch.attn_v}
    return {x: model.layer_module(layer, str(paths[x])) for x in QKVS}


@contextlib.contextmanager
def _leaves(model: RewardModel, b: int, t: int, heads: bool, base: dict[str, Tensor] | None,
            ) -> Iterator[tuple[dict[str, Tensor], dict[str, Tensor]]]:
    """Zero leaves on every sublayer receiver (each added to its `base` input shift, if any) and, with
    `heads`, every projection's output; yields (leaves, the projections' inputs as computed)."""
    leaves: dict[str, Tensor] = {}
    inputs: dict[str, Tensor] = {}
    dtype = next(model.model.parameters()).dtype
    hooks: list[tuple[nn.Module, str, Callable[[Tensor], Tensor | None]]] = []
    if heads:
        for layer in range(model.n_layers):
            for x, module in _projections(model, layer).items():
                key = f"{layer}{x}"
                hooks += [(module, "in", functools.partial(_keep, inputs, key)),
                          (module, "out", functools.partial(_leaf, leaves, key))]
    with contextlib.ExitStack() as stack:
        for layer in range(model.n_layers):
            for kind in ("attn", "mlp"):
                r = Receiver(kind, layer)
                leaves[r.name] = torch.zeros(b, t, model.d_model, device=model.device, dtype=dtype,
                                             requires_grad=True)
                shift = leaves[r.name] if base is None else base[r.name].to(dtype) + leaves[r.name]
                stack.enter_context(receiving(model, wiring(model, r), shift))
        if base is not None:  # the read-out on the same line
            stack.enter_context(receiving(model, wiring(model, Receiver.reward()), base["reward"]))
        stack.enter_context(rewriting(hooks))
        yield leaves, inputs


@dataclass(frozen=True)
class NodeGrads:
    """One gradient pass. `grad` [B, len(rows), m, d] fp32: the receivers `recvs[rows]` that are not
    heads (zeros for 'reward'); `layers`: per layer with head receivers, their indices in `recvs` and a
    function giving their gradients [B, n, m, d] fp32 on demand, so that one layer's head gradients are
    alive at a time, never all D of them (the pass's graph lives as long as this result). On a clean pass
    (no `base`) also the activations asked for at the columns (`act`, key → [B, m, w] fp32, as
    `capture_columns` gives them) and the final residual at the read token (`final` [B, d] fp32): the
    leaves are zeros, so these are the clean run's own values and no separate capture forward is needed."""

    grad: Tensor
    rows: tuple[int, ...]
    layers: tuple[tuple[tuple[int, ...], Callable[[], Tensor]], ...]
    act: dict[TraceKey, Tensor]
    final: Tensor

    def heads(self) -> Iterator[tuple[list[int], Tensor]]:
        """(indices in `recvs`, their gradients [B, n, m, d]) of the head receivers, layer by layer."""
        for index, grads in self.layers:
            yield list(index), grads()


def node_grads(model: RewardModel, batch: Batch, coef: Tensor, recvs: list[Receiver], cols: Tensor,
               base: dict[str, Tensor] | None, keys: Mapping[TraceKey, Site] | None = None) -> NodeGrads:
    """∂r/∂(input of each receiver) at columns `cols` [B, m], in fp32 (`NodeGrads`: the heads' per layer).

    `coef` [B, k]: the clean readout coefficients (a gate held clean); `base` (EAP-IG's point on the
    line to the corrupted run) maps each sublayer receiver's name and 'reward' to the shift [B, T, d]
    its input gets, or None (the clean run); `keys`: sites whose activations to record at `cols`."""
    b, t = batch.input_ids.shape
    heads = any(r.kind == "head" for r in recvs)
    final = model.final_points(batch, gate=False)[TraceKey.final()]
    kept: dict[str, Tensor] = {}
    read = [(final.module, final.where, functools.partial(_keep, kept, "final"))]
    c = cols.to(model.device)
    points = {k: site_point(model, site, c) for k, site in (keys or {}).items()}
    with torch.enable_grad(), eval_mode(model.model), _leaves(model, b, t, heads, base) as (leaves, inputs):
        with rewriting(read), capture(points, model.device) as act:
            model.backbone(**model.batch_kwargs(batch))
        rows = torch.arange(b, device=kept["final"].device)
        h = kept["final"][rows, batch.read_index.to(rows.device)].float().to(model.device)
        reward = (model.head_values(model.final_hidden(h)) * coef).sum()
        names = list(leaves)
        got = dict(zip(names, torch.autograd.grad(reward, [leaves[k] for k in names], retain_graph=heads,
                                                  allow_unused=True)))
    sub = tuple(k for k, r in enumerate(recvs) if r.kind != "head")
    out = torch.zeros(b, len(sub), c.shape[1], model.d_model, device=model.device)
    for j, k in enumerate(sub):
        g = got.get(recvs[k].name) if recvs[k].kind != "reward" else None
        if g is not None:
            out[:, j] = _at(g, c)
    by_layer: dict[int, list[int]] = {}
    for k, r in enumerate(recvs):
        if r.kind == "head":
            by_layer.setdefault(r.layer, []).append(k)
    layers = tuple((tuple(ks), functools.partial(_layer_grads, model, [recvs[k] for k in ks], got, leaves, inputs, c))
                   for _, ks in sorted(by_layer.items()))
    return NodeGrads(out, sub, layers, act, h.detach())


def _at(g: Tensor, cols: Tensor) -> Tensor:
    """g [B, T, d] at columns `cols` [B, m]: [B, m, d] fp32."""
    return g[torch.arange(g.shape[0], device=g.device)[:, None], cols].float()


def _layer_grads(model: RewardModel, recvs: list[Receiver], got: Mapping[str, Tensor | None],
                 leaves: dict[str, Tensor], inputs: dict[str, Tensor], cols: Tensor) -> Tensor:
    """The gradients [B, n, m, d] fp32 of one layer's head receivers `recvs` at columns `cols` [B, m]
    (zeros where a head's inputs do not reach the reward), one head's VJP at a time."""
    out = torch.zeros(cols.shape[0], len(recvs), cols.shape[1], model.d_model, device=model.device)
    for k, r in enumerate(recvs):
        g = _head_grad(model, r, got, leaves, inputs)
        if g is not None:
            out[:, k] = _at(g, cols)
    return out


def _head_grad(model: RewardModel, r: Receiver, got: Mapping[str, Tensor | None], leaves: dict[str, Tensor],
               inputs: dict[str, Tensor]) -> Tensor | None:
    """The gradient at the residual through head r.head's chosen inputs alone: per input x, the head's
    columns of ∂r/∂(x projection) through its weight, then back through the input module (one VJP)."""
    assert r.head is not None  # a head receiver
    wiring(model, r)  # refuses what path patching refuses: fused qkv, grouped k/v, a q/k norm over all heads
    size = _weight(_projections(model, r.layer)["q"]).shape[0] // model.n_heads
    cols = slice(r.head * size, (r.head + 1) * size)
    total: Tensor | None = None
    for x, module in _projections(model, r.layer).items():
        g = got[f"{r.layer}{x}"]
        if x not in r.inputs or g is None:
            continue
        back = g[..., cols] @ _weight(module)[cols].to(g.dtype)  # [B, T, d_in]
        pulled = torch.autograd.grad(inputs[f"{r.layer}{x}"], leaves[Receiver("attn", r.layer).name],
                                     grad_outputs=back.to(inputs[f"{r.layer}{x}"].dtype), retain_graph=True)[0]
        total = pulled if total is None else total + pulled
    return total


def _weight(module: nn.Module) -> Tensor:
    """A projection's weight [out, in] (nn.Linear's layout; fused Conv1D projections are refused before)."""
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight


def chunk_scores(model: RewardModel, ups: list[Site], dsp: list[int], zs: list[int],
                 deltas: dict[tuple[int, int], Tensor], dz: dict[int, Tensor], index: list[int],
                 grad: Tensor) -> Tensor:
    """First-order reward changes [B, U, n] into the downstream nodes `index` (their g [B, n, m, d]):
    Δ[b, u, m·d] @ g[b, n, m·d]ᵀ for the d-space parts, and Σ_{m,i} Δz_h[b, m, i] · (W_O[:, h]ᵀ g)[b, n, m, i]
    for the head-space heads (one W_O product per layer)."""
    b, n_down = grad.shape[0], grad.shape[1]
    out = torch.zeros(b, len(ups), n_down, device=grad.device)
    g = grad.flatten(2)  # [b, n, m·d]
    if dsp and all(deltas[s, k] is deltas[s, index[0]] for s in range(len(dsp)) for k in index):
        d = torch.stack([deltas[s, index[0]] for s in range(len(dsp))], 1).flatten(2)  # [b, U', m·d]
        out[:, dsp] = torch.bmm(d.to(g.device), g.transpose(1, 2))
    elif dsp:  # a post-norm encoder: δ carried to each receiver's depth
        for j, kk in enumerate(index):
            d = torch.stack([deltas[s, kk] for s in range(len(dsp))], 1).flatten(2)
            out[:, dsp, j] = torch.bmm(d.to(g.device), g[:, j, :, None])[..., 0]
    for layer, z in dz.items():
        weight, _ = out_projection(model, "attn", layer)  # [d, H·d_head]
        gz = (grad @ weight.to(grad.device)).view(*grad.shape[:3], model.n_heads, -1)  # [b, n, m, H, d_head]
        per_head = torch.einsum("bmhi,bkmhi->bhk", z.view(*z.shape[:2], model.n_heads, -1).to(gz.device), gz)
        for s in zs:
            if ups[s].layer == layer:
                out[:, s] = per_head[:, ups[s].head]
    return out
