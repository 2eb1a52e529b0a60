"""What replaces each MLP in the local replacement model: a transcoder, or the MLP's own neurons.

Transcoders (`basis="transcoders"`): layer `l`'s MLP output becomes
`Σ_f a_f W_dec[f] + err + b_dec + x W_skip`, with the active set and the activations `a_f` frozen at this
input (they are sources), `err = MLP(x₀) − transcoder(x₀)` an error source per position, and the skip
term a linear path through the MLP's input `x`. A feature's pre-activation is `x W_enc[:, f] + b_enc[f]`.
At each sequence's first `skip_first` positions (`sae.internal.skip_first_for`: the tokens the transcoders were trained
and measured without, a decoder's attention sink) the MLP is kept whole: no feature, and the error node is
the MLP's exact output `MLP(x₀)` there (fidelity keeps those tokens' output exact the same way).

Neurons (`basis="neurons"`): the output projection's input `a` (one activation per neuron) is the
source, so the MLP is exact (no error node). The linearisation, so a neuron's activation is an affine
function of the residual: a gated MLP's `a_n = act(g_n(x)) · up_n(x)` keeps its gate factor `act(g_n(x₀))`
frozen and stays linear in `up_n(x)`; a plain MLP's `a_n = act(z_n(x))` keeps its slope
`act(z_n(x₀)) / z_n(x₀)` frozen (0 where `z_n(x₀) = 0`, where `a_n = act(0) = 0`). Both equal the
model's activation at this input. A neuron's "pre-activation" is that linearised activation.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ArchitectureError, UsageError
from ..model import Part, RewardModel
from ..model.internal import first_output, hidden_arg, is_moe_layer
from ..sae.internal import mlp_module, mlp_modules
from ._frozen import Frozen, Run, layer_module

Hook = tuple[nn.Module, str, Any]


class Active:
    """One layer's active features: positions `pos` [n], ids `ids` [n], activations `acts` [n]."""

    def __init__(self, pos: Tensor, ids: Tensor, acts: Tensor) -> None:
        self.pos, self.ids, self.acts = pos, ids, acts

    def __len__(self) -> int:
        return len(self.pos)


class TranscoderBasis:
    """Each MLP replaced by its transcoder, the error kept as a source (module docstring)."""

    name = "transcoders"

    def __init__(self, model: RewardModel, transcoders: Any, exact_layers: set[int], skip_first: int = 0) -> None:
        self.model, self.skip_first = model, skip_first
        self.tcs: dict[int, Any] = {}
        for layer in range(model.n_layers):
            if layer not in exact_layers:
                self.tcs[layer] = transcoders[layer].to(device=model.device, dtype=torch.float32)
        self.x0: dict[int, Tensor] = {}
        self.src0: dict[int, Tensor] = {}
        self.err0: dict[int, Tensor] = {}
        self.active: dict[int, Active] = {}
        self._dec: dict[int, tuple[Tensor, Tensor]] = {}
        self._replaced: dict[int, Tensor] = {}
        """Per layer, [T, 1]: 1 where the transcoder replaces the MLP, 0 at the first `skip_first` positions."""
        self._inputs: dict[int, Tensor] = {}

    def hooks(self, run: Run, zero: bool) -> list[Hook]:
        out: list[Hook] = []
        for layer in range(self.model.n_layers):  # the MLP's input and output modules (one on pre-norm layouts)
            source, target = mlp_modules(self.model, layer)
            out.append((source, "pre", functools.partial(self._one_row, layer)))
            out.append((target, "post", functools.partial(self._mlp, layer, run, zero)))
        return out

    def _one_row(self, layer: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        """The MLP's own output is only read on the first row (every row is the same sequence, and the rows'
        outputs are replaced), so it computes one row, not one per copy: the copies cost attention only.
        (Post-norm layers: the input module gets one row and so does the output projection after it.)"""
        x = hidden_arg(args, kwargs)
        self._inputs[layer] = x
        return x[:1]

    def _mlp(self, layer: int, run: Run, zero: bool, _args: tuple[Any, ...], _kwargs: dict[str, Any], out: Any
             ) -> Tensor:
        x, y = self._inputs.pop(layer), first_output(out)
        tc = self.tcs.get(layer)
        if layer not in self.x0:  # first run: the active set and the error, frozen from now on
            x0, y0 = x.detach()[0].float(), y.detach()[0].float()  # every row is the same sequence
            self.x0[layer] = x0
            if tc is None:  # an MLP kept whole: one exact error node per position
                self.src0[layer] = self.err0[layer] = y0
                empty = torch.zeros(0, dtype=torch.long, device=x0.device)
                self.active[layer] = Active(empty, empty, torch.zeros(0, device=x0.device))
            else:
                with torch.no_grad():
                    # the first `skip_first` positions, which the transcoder never saw in training, keep the MLP
                    # whole: no feature, no bias or skip term, the error node is the MLP's exact output there
                    replaced = (torch.arange(x0.shape[0], device=x0.device) >= self.skip_first).float()[:, None]
                    acts = tc.encode(x0) * replaced
                    pos, ids = acts.nonzero(as_tuple=True)
                    self.active[layer] = Active(pos, ids, acts[pos, ids])
                    self._replaced[layer] = replaced
                    self.err0[layer] = y0 - replaced * tc.decode(acts, x0)
                    self.src0[layer] = y0 - replaced * (tc.b_dec.detach() + tc.skip(x0))
                    self._dec[layer] = _by_position(tc.W_dec.detach()[ids], pos, x0.shape[0])
        run.targets[layer] = x
        delta = torch.zeros_like(x, dtype=y.dtype, requires_grad=not zero)
        run.deltas[layer] = delta
        base = torch.zeros_like(self.src0[layer]) if zero else self.src0[layer]
        new = base + delta.float()
        if tc is not None:
            new = new + self._replaced[layer] * (tc.b_dec.detach() + tc.skip(x.float()))
        return new.to(y.dtype)

    def feature_edges(self, layer: int, grad: Tensor) -> Tensor:
        """Edges [B, n] from the layer's active features, given the gradient [B, T, d] at its MLP output:
        `a_f · (W_dec[f] · g[p_f])`, one batched product per position over its (at most k) active features."""
        act = self.active[layer]
        if not len(act):  # an MLP kept whole (exact_layers): no feature
            return grad.new_zeros(grad.shape[0], 0, dtype=torch.float32)
        dec, slot = self._dec[layer]
        per_position = torch.bmm(grad.float().transpose(0, 1), dec.transpose(1, 2))  # [T, B, K]
        return per_position[act.pos, :, slot].T * act.acts

    def error_edges(self, layer: int, grad: Tensor) -> Tensor:
        """Edges [B, T] from the layer's error nodes."""
        return torch.einsum("btd,td->bt", grad.float(), self.err0[layer])

    def inject(self, layer: int, ids: Tensor) -> Tensor:
        """The cotangent [n, d] at the MLP input that reads features `ids`' pre-activations."""
        return self.tcs[layer].W_enc.detach()[:, ids].T

    def read(self, layer: int, x: Tensor, pos: Tensor, ids: Tensor) -> Tensor:
        """Pre-activations [n] of features `ids` at positions `pos`, from MLP inputs `x` [T, d]."""
        tc = self.tcs[layer]
        return (x.float()[pos] * tc.W_enc.detach()[:, ids].T).sum(-1) + tc.b_enc.detach()[ids]

    def part(self, layer: int, feature: int) -> Part:
        return Part.transcoder(layer, feature)

    def error_part(self, layer: int) -> Part:
        return Part.transcoder(layer, error=True)

    def has_errors(self) -> bool:
        return True


class NeuronBasis:
    """The MLPs' own neurons as features, exact (module docstring)."""

    name = "neurons"

    def __init__(self, model: RewardModel) -> None:
        moe = [layer for layer in range(model.n_layers) if is_moe_layer(model, layer)]
        if moe:
            raise UsageError(f"basis='neurons' needs dense MLPs, but layers {moe} of {model.arch.name!r} are "
                             "mixtures of experts; use basis='transcoders'", option="basis")
        self.model = model
        self.acts = [_activation_module(model, layer) for layer in range(model.n_layers)]
        self.gated: dict[int, bool] = {}
        self.gate0: dict[int, Tensor] = {}
        self.a0: dict[int, Tensor] = {}
        self.active: dict[int, Active] = {}

    def probe(self, frozen: Frozen) -> None:
        """One no-grad forward: is each MLP gated (its activation function's output is not what the output
        projection receives)?"""
        seen: dict[int, Tensor] = {}
        hooks = []
        for layer, act in enumerate(self.acts):
            hooks.append(act.register_forward_hook(lambda _m, _a, o, layer=layer: seen.__setitem__(layer, o)))
            down = layer_module(self.model, layer, self.model.arch.mlp_out)
            hooks.append(down.register_forward_pre_hook(
                lambda _m, a, layer=layer: self.gated.__setitem__(layer, a[0] is not seen.get(layer))))
        try:
            with torch.no_grad():
                self.model.backbone(**self.model.batch_kwargs(frozen.batch))
        finally:
            for h in hooks:
                h.remove()

    def hooks(self, run: Run, zero: bool) -> list[Hook]:
        out: list[Hook] = []
        for layer, act in enumerate(self.acts):
            out.append((act, "post", functools.partial(self._act, layer)))
            out.append((layer_module(self.model, layer, self.model.arch.mlp_out), "pre",
                        functools.partial(self._down, layer, run, zero)))
        return out

    def _act(self, layer: int, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Tensor:
        z, y = hidden_arg(args, kwargs), first_output(out)
        if layer not in self.gate0:
            z0, y0 = z.detach()[:1], y.detach()[:1]
            self.gate0[layer] = y0 if self.gated[layer] else torch.where(z0 != 0, y0 / z0, torch.zeros_like(y0))
        if self.gated[layer]:
            return self.gate0[layer].expand_as(y)
        return self.gate0[layer] * z

    def _down(self, layer: int, run: Run, zero: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        a = hidden_arg(args, kwargs)
        if layer not in self.a0:
            a0 = a.detach()[0].float()
            self.a0[layer] = a0
            pos, ids = (a0 != 0).nonzero(as_tuple=True)
            self.active[layer] = Active(pos, ids, a0[pos, ids])
        run.targets[layer] = a
        delta = torch.zeros_like(a, requires_grad=not zero)
        run.deltas[layer] = delta
        base = torch.zeros_like(self.a0[layer]) if zero else self.a0[layer]
        return (base + delta.float()).to(a.dtype)

    def feature_edges(self, layer: int, grad: Tensor) -> Tensor:
        act = self.active[layer]
        return grad.float()[:, act.pos, act.ids] * act.acts

    def error_edges(self, _layer: int, grad: Tensor) -> Tensor:
        return grad.new_zeros(grad.shape[0], grad.shape[1]).float()

    def inject(self, layer: int, ids: Tensor) -> Tensor:
        width = self.a0[layer].shape[-1]
        return torch.nn.functional.one_hot(ids, width).float()

    def read(self, _layer: int, a: Tensor, pos: Tensor, ids: Tensor) -> Tensor:
        return a.float()[pos, ids]

    def part(self, layer: int, feature: int) -> Part:
        return Part.mlp(layer, feature)

    def error_part(self, layer: int) -> Part:
        return Part.mlp(layer)

    def has_errors(self) -> bool:
        return False


def _activation_module(model: RewardModel, layer: int) -> nn.Module:
    """The MLP's activation function module: the child without parameters that is not dropout of the module
    whose input is the MLP's input (the MLP itself, or a post-norm layer's `mlp_in`: BERT's `intermediate`,
    whose `intermediate_act_fn` feeds the down-projection)."""
    mlp = mlp_module(model, layer)
    found = [m for m in mlp.children() if next(m.parameters(), None) is None and not isinstance(m, nn.Dropout)]
    if len(found) != 1:
        raise ArchitectureError(
            f"basis='neurons' freezes the MLP's activation function, but layer {layer}'s MLP "
            f"({type(mlp).__name__}) has {len(found)} parameter-free children; use basis='transcoders'")
    return found[0]


def _by_position(dec: Tensor, pos: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """The active features' decoder rows `dec` [n, d] grouped by position: ([T, K, d] zero-padded, each feature's
    slot [n]), K the most features active at one position (k for TopK)."""
    counts = torch.bincount(pos, minlength=length)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(pos), device=pos.device) - starts[pos]  # `nonzero` lists features position by position
    out = dec.new_zeros(length, int(counts.max()) if len(pos) else 0, dec.shape[-1])
    out[pos, slot] = dec
    return out, slot
