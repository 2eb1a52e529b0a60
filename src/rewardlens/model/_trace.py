"""One forward with hooks → a Trace: every part's output, norm inputs and the residual at `t*`.

Everything is captured at the read position only (one [n, width] tensor per point), in fp32, so a
trace of an 80-layer model over a batch costs a few hundred vectors per row, never a
[tokens × d_mlp] cache. Analyses ask a Trace, never Hugging Face modules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from torch import Tensor, nn

from ..errors import ArchitectureError
from ._core import RewardModel
from ._hooks import Point
from ._keys import TraceKey
from ._norms import resident_fp32
from ._parts import SublayerKind
from ._placement import onloaded
from ._tokens import Batch


@dataclass
class Trace:
    """Captured activations for one batch, keyed by `TraceKey`, each [n, width] fp32.

    Keys: `embed` (input of layer 0), `resid(l)` (output of layer l), `attn(l)`/`mlp(l)` (raw
    output of the sublayer's output projection), `attn_z(l)`/`mlp_act(l)` (its input: heads,
    neurons; for a mixture-of-experts block, the block's input, which its experts read),
    `attn_rnorm(l)`/`mlp_rnorm(l)` (post-norm layout: input of the residual norm),
    `final` (input of the final norm, or the last layer's output) and `gate` (gated heads).
    """

    batch: Batch | None
    """The traced batch; None for a trace assembled from stored activations (path-frozen patching)."""
    captured: dict[TraceKey, Tensor]

    def __getitem__(self, key: TraceKey) -> Tensor:
        """The activation [n, width] at `key`."""
        if isinstance(key, str):  # the string form is for the boundary only: say how to cross it
            raise TypeError(f"a trace is keyed by TraceKey values, not strings: use TraceKey.parse({key!r})")
        return self.captured[key]


def points(
    model: RewardModel, batch: Batch, *, heads: Iterable[int] = (), neurons: Iterable[int] = (), gate: bool = True
) -> dict[TraceKey, Point]:
    """Capture points for a full trace, by key; `heads`/`neurons` name the layers whose inputs to keep."""
    arch = model.arch

    def at(module: nn.Module, where: str) -> Point:
        return model.read_point(batch, module, where)

    pts = dict(model.final_points(batch, gate=gate))
    pts[TraceKey.embed()] = at(model.layers[0], "in")
    heads, neurons = set(heads), set(neurons)
    for layer in range(model.n_layers):
        pts[TraceKey.resid(layer)] = at(model.layers[layer], "out")
        attn_out, mlp_out = model.layer_module(layer, arch.attn_out), model.layer_module(layer, arch.mlp_out)
        pts[TraceKey.attn(layer)] = at(attn_out, "out")
        pts[TraceKey.mlp(layer)] = at(mlp_out, "out")
        if layer in heads:
            pts[TraceKey.attn_z(layer)] = at(attn_out, "in")
        if layer in neurons:
            pts[TraceKey.mlp_act(layer)] = at(mlp_out, "in")
        if arch.layout == "post_norm":
            attn_rnorm, mlp_rnorm = arch.residual_norms
            pts[TraceKey.attn_rnorm(layer)] = at(model.layer_module(layer, attn_rnorm), "in")
            pts[TraceKey.mlp_rnorm(layer)] = at(model.layer_module(layer, mlp_rnorm), "in")
    return pts


def trace(
    model: RewardModel, batch: Batch, *, heads: Iterable[int] = (), neurons: Iterable[int] = (), gate: bool = True
) -> Trace:
    """Run `batch` once and capture every point of `points`."""
    return Trace(batch, model.run(batch, points(model, batch, heads=heads, neurons=neurons, gate=gate)))


def sublayer_part(model: RewardModel, tr: Trace, kind: SublayerKind, layer: int) -> Tensor:
    """What sublayer `kind` ('attn'/'mlp') of `layer` adds to the residual [n, d] (post-norm applied)."""
    post = model.arch.attn_post_norm if kind == "attn" else model.arch.mlp_post_norm
    raw = tr[TraceKey.sublayer(kind, layer)]
    return raw if post is None else model.norm(post, layer)(raw)


def _projection_module(model: RewardModel, kind: SublayerKind, layer: int) -> nn.Module:
    path = model.arch.attn_out if kind == "attn" else model.arch.mlp_out
    module = model.layer_module(layer, path)
    if not isinstance(getattr(module, "weight", None), Tensor):  # a mixture-of-experts block, or a dense MLP beside one
        raise ArchitectureError(
            f"layer {layer}'s {kind} output {path!r} ({type(module).__name__}) is not a linear projection, so it "
            "has no neurons to split: in a mixture-of-experts model the map names the whole MLP block, and "
            "level='neuron' splits a sparse block into its experts (not into the neurons inside them) and "
            "cannot split a dense MLP block; pass layers= with only the sparse layers, or level='sublayer'/'head'"
        )
    return module


def out_projection(model: RewardModel, kind: SublayerKind, layer: int) -> tuple[Tensor, Tensor | None]:
    """fp32 weight [d, in] and bias [d] of a sublayer's output projection (Linear or GPT-2 Conv1D)."""
    module = _projection_module(model, kind, layer)
    what = f"layer {layer}'s {kind} output projection"
    with onloaded(module):  # offloaded weights (device_map with disk/CPU offload) exist only in here
        weight = resident_fp32(cast(Tensor, module.weight), model.device, what)
        raw_bias = getattr(module, "bias", None)
        bias = None if raw_bias is None else resident_fp32(raw_bias, model.device, what)
    if type(module).__name__ == "Conv1D":  # stores [in, out]
        weight = weight.T
    return weight, bias


def projection_inputs(model: RewardModel, kind: SublayerKind, layer: int) -> tuple[int, bool]:
    """(input width, has bias) of a sublayer's output projection, without copying its weight."""
    module = _projection_module(model, kind, layer)
    weight = cast(Tensor, module.weight)
    width = weight.shape[0] if type(module).__name__ == "Conv1D" else weight.shape[1]
    return int(width), getattr(module, "bias", None) is not None


def bookkeeping_error(model: RewardModel, tr: Trace) -> float:
    """Largest relative gap between the captured residual and the sum of its parts, over layers.

    Zero (to float precision) when the map names every part; a map that misses a part (a post-norm,
    a second residual branch) shows up here before any number is reported.
    """
    arch, worst = model.arch, 0.0
    x = tr[TraceKey.embed()]
    for layer in range(model.n_layers):
        attn, mlp = sublayer_part(model, tr, "attn", layer), sublayer_part(model, tr, "mlp", layer)
        if arch.layout == "post_norm":
            attn_rnorm, mlp_rnorm = arch.residual_norms
            at_attn, at_mlp = tr[TraceKey.attn_rnorm(layer)], tr[TraceKey.mlp_rnorm(layer)]
            worst = max(worst, _rel(at_attn, x + attn))
            mid = model.norm(attn_rnorm, layer)(at_attn)
            worst = max(worst, _rel(at_mlp, mid + mlp))
            x = model.norm(mlp_rnorm, layer)(at_mlp)
        else:
            x = x + attn + mlp
        worst = max(worst, _rel(tr[TraceKey.resid(layer)], x))
        x = tr[TraceKey.resid(layer)]  # restart from the truth so errors do not compound across layers
    if arch.final_norm is not None:
        worst = max(worst, _rel(tr[TraceKey.final()], x))
    return worst


def _rel(actual: Tensor, expected: Tensor) -> float:
    return float(((actual - expected).norm(dim=-1) / actual.norm(dim=-1).clamp_min(1e-12)).max())

