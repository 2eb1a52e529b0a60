"""Normalisation layers as affine maps with their scale frozen at the observed input.

With `s = 1/sqrt(mean(x²) + ε)` (RMS) or `1/sqrt(var(x) + ε)` (LayerNorm) held fixed, every norm
is `N(x) = D x + β` with `D = diag(γ s)` (RMS) or `diag(γ s) C` (LayerNorm, `C` the centring
matrix). That is what makes the reward an exact sum of parts; all of it is computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor, nn

from ..errors import ArchitectureError
from ..types import NormKind

NORM_KINDS: tuple[NormKind, ...] = get_args(NormKind)


def resident_fp32(tensor: Tensor, device: torch.device, what: str) -> Tensor:
    """An fp32 copy of a weight on `device`; offloaded (meta) weights are refused with the fix."""
    if tensor.is_meta:
        raise ArchitectureError(
            f"the weights of {what} are on the meta device with no accelerate offload hook to load them "
            "from, so rewardlens cannot read them; load the model with real weights (no device_map='meta')"
        )
    return tensor.detach().to(device=device, dtype=torch.float32).clone()


@dataclass(frozen=True)
class NormParams:
    """fp32 parameters of one norm module: `kind`, effective `gamma` [d], `beta` [d] or None, `eps`."""

    kind: NormKind
    gamma: Tensor
    beta: Tensor | None
    eps: float

    @classmethod
    def from_module(cls, module: nn.Module, kind: NormKind) -> NormParams:
        if kind not in NORM_KINDS:
            raise ArchitectureError(f"norm kind must be one of {NORM_KINDS}, got {kind!r}")
        eps = next(
            (float(getattr(module, a)) for a in ("variance_epsilon", "eps", "epsilon") if hasattr(module, a)),
            None,
        )
        if eps is None:
            raise ArchitectureError(
                f"norm module {type(module).__name__} has no eps attribute (variance_epsilon/eps/epsilon); "
                "declare a map whose norm paths point at RMSNorm or LayerNorm modules"
            )
        weight = getattr(module, "weight", None)
        if weight is None:
            dim = _norm_dim(module)
            gamma = torch.ones(dim, dtype=torch.float32)
        else:
            gamma = resident_fp32(weight, torch.device("cpu"), f"norm {type(module).__name__}")
        if kind == "rms_offset":  # Gemma stores γ - 1
            gamma = gamma + 1.0
        bias = getattr(module, "bias", None)
        beta = resident_fp32(bias, torch.device("cpu"), "a norm bias") if isinstance(bias, Tensor) else None
        return cls(kind, gamma, beta, eps)

    def to(self, device: torch.device) -> NormParams:
        beta = None if self.beta is None else self.beta.to(device)
        return NormParams(self.kind, self.gamma.to(device), beta, self.eps)

    def scale(self, x: Tensor) -> Tensor:
        """Frozen scale `s` [n] of inputs `x` [n, d] (fp32)."""
        if self.kind == "layer":
            return torch.rsqrt(x.var(-1, unbiased=False) + self.eps)
        return torch.rsqrt(x.pow(2).mean(-1) + self.eps)

    def __call__(self, x: Tensor) -> Tensor:
        """The norm's true output for `x` [..., d], in fp32."""
        x = x.float()
        if self.kind == "layer":
            y = (x - x.mean(-1, keepdim=True)) * self.scale(x).unsqueeze(-1) * self.gamma
        else:
            y = x * self.scale(x).unsqueeze(-1) * self.gamma
        return y if self.beta is None else y + self.beta

    def pullback(self, u: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """Move read-out vectors `u` [n, k, d] from the norm's output to its input `x` [n, d].

        Returns `(Dᵀu [n, k, d], u·β [n, k])`: the read-out of the input with the scale frozen at `x`,
        and the constant the norm's bias adds to each read-out.
        """
        v = u * (self.scale(x)[:, None, None] * self.gamma)
        if self.kind == "layer":
            v = v - v.mean(-1, keepdim=True)
        const = torch.zeros(u.shape[:2], dtype=u.dtype, device=u.device) if self.beta is None else u @ self.beta
        return v, const


def _norm_dim(module: nn.Module) -> int:
    shape = getattr(module, "normalized_shape", None)
    if shape is not None:
        return int(shape[-1] if isinstance(shape, (tuple, list)) else shape)
    raise ArchitectureError(f"cannot tell the width of norm module {type(module).__name__}")


def detect_norm_kind(module: nn.Module, width: int) -> NormKind | None:
    """Which of NORM_KINDS reproduces `module` on a check input, or None."""
    param = next(module.parameters(), None)
    dtype = param.dtype if param is not None else torch.float32
    device = param.device if param is not None else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, width, generator=gen) * 2 + 0.5).to(device=device, dtype=dtype)
    with torch.no_grad():
        y = module(x).float().cpu()
    for kind in NORM_KINDS:
        try:
            ours = NormParams.from_module(module, kind)(x.float().cpu())
        except ArchitectureError:
            return None
        if torch.allclose(ours, y, rtol=1e-2 if dtype != torch.float32 else 1e-4, atol=1e-3):
            return kind
    return None
