"""Norm modules with their scale frozen at the first run: `y = y₀ + J (x − x₀)`, exact at `x₀`.

`J` is the norm's map with its scale `s₀` held (model/_norms.py): `γ s₀ ⊙ v` for RMS norms,
`γ s₀ ⊙ (v − mean v)` for LayerNorm. The module's own output `y₀` is kept, so the frozen run's values
equal the model's to the bit; `NormParams` is proven against that output on the first run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import ArchitectureError
from ..model import RewardModel


@dataclass(frozen=True)
class _Frozen:
    x0: Tensor
    y0: Tensor
    gain: Tensor
    centred: bool


class NormFreezer:
    """Every norm module of the model's backbone, and each call's frozen state."""

    def __init__(self, model: RewardModel) -> None:
        named = [(path, m) for path, m in model.model.named_modules() if _is_norm(m)]
        self.modules: list[nn.Module] = [m for _, m in named]
        self._params = {id(m): model.norm(path) for path, m in named}  # fp32, on the model's device, cached
        self._state: dict[tuple[int, int], _Frozen] = {}

    def frozen(self, module: nn.Module, key: tuple[int, int], x: Tensor, y: Tensor, first: bool) -> Tensor:
        """The frozen norm's output for input `x` (the module's own output was `y`)."""
        if first:
            params = self._params[id(module)]
            x0 = x.detach()[:1].float()
            ours = params(x0)
            tol = 1e-4 if y.dtype == torch.float32 else 2e-2
            atol = tol * float(ours.abs().max().clamp_min(1))
            if not torch.allclose(ours, y.detach()[:1].float(), rtol=tol, atol=atol):
                raise ArchitectureError(
                    f"norm module {type(module).__name__} does not compute a {params.kind!r} norm on this input, so "
                    "its scale cannot be frozen; attribution graphs need RMSNorm or LayerNorm modules")
            gain = params.scale(x0).unsqueeze(-1) * params.gamma
            self._state[key] = _Frozen(x0, y.detach()[:1], gain, params.kind == "layer")
        state = self._state[key]
        v = x.float() - state.x0
        if state.centred:
            v = v - v.mean(-1, keepdim=True)
        return (state.y0.float() + v * state.gain).to(y.dtype)


def _is_norm(module: nn.Module) -> bool:
    """A normalisation module: its class is named for a norm and it has an epsilon."""
    name = type(module).__name__.lower()
    return "norm" in name and any(hasattr(module, a) for a in ("variance_epsilon", "eps", "epsilon"))
