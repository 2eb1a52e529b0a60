"""Steering with an SAE feature: the reward's dose-response to adding `α · d_i` at a layer.

The feature-level twin of the concept dose-response (docs/concepts.md), with the same conventions:
`α · d_i` is added to the residual after `layer` at the read position `t*` ('read', the default)
or at every real token ('all'); every α of an input runs as one row of a batch of copies, stepped
from the layer after the edit (`_splice`); `dose`
is reward(α) − reward(0) and `base` is reward(0), the number `model.score` gives. The unit of α is
one unit of the feature's own activation (`α · d_i` is what the SAE decodes from `f_i = α`); with
unit-norm decoder rows that is one unit of residual-stream length. `slope` is Δreward per unit of
α, the mean over inputs of each input's least-squares slope; `slope_ci` a percentile bootstrap over
inputs. At an earlier layer the slope is the feature's total effect, at the last layer its direct one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data import Inputs
from ..errors import DataError
from ..model import RewardModel
from ..plotting import HtmlView
from ..stats import bootstrap_ci, fit_slope
from ..types import SaePositions
from ._attribution import check_width
from ._autoencoder import TopKSAE
from ._splice import check_positions, check_single_read, each_edit_batch, edited_rewards

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DOSES = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)
"""The default α grid, the concept dose-response's (`rewardlens.hacking.ALPHAS`)."""


@dataclass(frozen=True)
class FeatureSteer(HtmlView):
    """Reward as `α · d_feature` is added at `layer`: `alphas` [a] (0 always included), `base` [n] the
    reward at α = 0, `dose` [a, n] reward(α) − reward(0); `slope` (Δreward per unit of α, mean of
    the per-input least-squares slopes `slopes` [n]) and its bootstrap interval `slope_ci`."""

    layer: int
    feature: int
    positions: SaePositions
    alphas: np.ndarray
    base: np.ndarray
    dose: np.ndarray
    slopes: np.ndarray
    slope: float
    slope_ci: tuple[float, float]

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (α, input) with Δ reward."""
        import pandas as pd

        a, n = self.dose.shape
        return pd.DataFrame({"alpha": np.repeat(self.alphas, n), "input": np.tile(np.arange(n), a),
                             "delta_reward": self.dose.ravel()})

    def plot(self, ax: Axes | None = None) -> Figure:
        """Mean Δ reward against α with each input's curve faint; into `ax` when given, else a new figure."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (4.5, 3.2))
        ax.plot(self.alphas, self.dose, color="tab:blue", alpha=0.15, lw=0.8)
        ax.plot(self.alphas, self.dose.mean(1), color="tab:blue", marker="o", lw=2)
        ax.axhline(0, color="gray", lw=0.5)
        lo, hi = self.slope_ci
        ax.set_title(f"feature {self.feature} at layer {self.layer} ({self.positions}): "
                     f"slope {self.slope:.3g} [{lo:.3g}, {hi:.3g}]", fontsize=9)
        ax.set_xlabel("α (units of the feature's activation)")
        ax.set_ylabel("reward(α) − reward(0)")
        return finish(ax, made)


def _grid(doses: Sequence[float]) -> np.ndarray:
    grid = np.array(sorted({float(a) for a in doses} | {0.0}))
    if not np.all(np.isfinite(grid)) or len(grid) < 2:
        raise DataError(f"doses must be finite and hold at least one non-zero α, got {list(doses)}; "
                        "pass e.g. doses=(-1, 0, 1)")
    return grid


def feature_steer(model: RewardModel, sae: TopKSAE, inputs: Inputs, *, layer: int, feature: int,
                  doses: Sequence[float] = DOSES, positions: SaePositions = "read", batch_size: int = 16,
                  n_boot: int = 2000, seed: int = 0) -> FeatureSteer:
    """Dose-response of the reward to `α · d_feature` added to the residual after `layer` (module
    docstring). `inputs`: texts, conversations or pairs (rows interleave chosen, rejected).
    `batch_size`: rows per forward (inputs × doses)."""
    check_width(model, sae, layer)
    check_single_read(model, "feature_steer")
    check_positions(positions)
    if not isinstance(feature, (int, np.integer)) or not 0 <= int(feature) < sae.n_latents:
        raise DataError(f"feature {feature!r} is out of range for an SAE with {sae.n_latents} latents; "
                        f"pass a latent id in 0..{sae.n_latents - 1}")
    grid = _grid(doses)
    d = sae.W_dec.detach()[int(feature)].to(model.device, torch.float32)
    alphas = torch.as_tensor(grid, dtype=torch.float32, device=model.device)
    seqs, _ = model.encode(inputs)
    rewards = np.zeros((len(seqs), len(grid)))
    for rows, big, part in each_edit_batch(model, seqs, np.arange(len(seqs)), len(grid), batch_size):
        add = alphas[part].repeat(len(rows))[:, None] * d[None]  # [b·a, d]: each input once per α
        got = edited_rewards(model, big, layer, add, positions)
        rewards[rows[:, None], np.arange(part.start, part.stop)[None]] = got.double().cpu().numpy().reshape(
            len(rows), -1)
    zero = int(np.flatnonzero(grid == 0)[0])
    dose = (rewards - rewards[:, zero:zero + 1]).T
    slopes = fit_slope(grid, dose)  # per input: the concept dose-response's least squares
    return FeatureSteer(layer=layer, feature=int(feature), positions=positions, alphas=grid,
                        base=rewards[:, zero], dose=dose, slopes=slopes, slope=float(slopes.mean()),
                        slope_ci=bootstrap_ci(slopes, n_boot=n_boot, seed=seed))
