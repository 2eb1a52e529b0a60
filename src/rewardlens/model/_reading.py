"""`Reading`: what the head reads at the read position, one row per sequence (`RewardModel.read`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Reading:
    """What the head reads at the read position `t*`, one row per sequence (fp32, on the model's device).

    `final` [N, d] the residual the final norm reads; `hidden` [N, d] the head's input ĥ (the final
    norm's output); `layers` {label: [N, d]} the residual after each asked depth (`"embed"` = input of
    layer 0, `"l"` = output of layer `l`); `values` [N, k] the head's objectives; `coefficients`
    [N, k] the readout (ArmoRM's frozen gate; ones for a single output); `readout` [N, d] the
    effective read-out vector `Σ_k coefficients_k · row_k(ĥ)` when asked for, else None.
    """

    final: Tensor
    hidden: Tensor
    layers: dict[str, Tensor]
    values: Tensor
    coefficients: Tensor
    readout: Tensor | None

    @property
    def reward(self) -> Tensor:
        """The scalar reward [N]."""
        return (self.values * self.coefficients).sum(-1)
