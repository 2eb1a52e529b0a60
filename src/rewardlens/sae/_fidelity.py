"""How well an SAE stands in for its hook point on the user's inputs: explained variance and reward recovered.

At hook point `p` and positions `P` (the read position, or every token but each sequence's first
`skip_first`), three forwards per batch: clean (reward `r`), with `x̂ = SAE(x)` spliced in at `P`
and no error term (`r_s`), and with the activation at `P` zeroed (`r_0`). Then

    explained variance = 1 − Σ_P ‖x − x̂‖² / Σ_P ‖x − x̄‖²        (x̄: the mean over P; `evaluate`'s FVU)
    reward recovered   = 1 − mean_n |r_s − r| / mean_n |r_0 − r|

1 is a perfect stand-in, 0 as bad as deleting the activation, below 0 worse than that; NaN when
zeroing moves no reward (the point does not matter). Under `MIN_EXPLAINED_VARIANCE` or
`MIN_REWARD_RECOVERED` (0.5 each) a warning names both numbers.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs
from ..errors import SAEMismatchError, UsageError, warn
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, rewriting
from ..stats import summary_frame
from ._activations import Activations, ActivationSource, point_at, token_mask
from ._autoencoder import TopKSAE
from ._provenance import base_name, model_fingerprint, model_name
from ._train import evaluate

if TYPE_CHECKING:
    import pandas as pd

MIN_EXPLAINED_VARIANCE = 0.5
"""Below this explained variance at the hook point, `fidelity` warns: the SAE misses half the activation."""
MIN_REWARD_RECOVERED = 0.5
"""Below this share of reward recovered, `fidelity` warns: the reconstruction moves the reward half as
much as deleting the activation does, so feature-level numbers describe the SAE more than the model."""

FitPositions = Literal["auto", "all", "read"]


@dataclass(frozen=True)
class Fidelity:
    """The fit of an SAE at `point` over `positions` ('all' or 'read'): see the module docstring.

    `reward`, `spliced`, `zeroed` [n]: `r`, `r_s`, `r_0` per input (pairs interleaved chosen,
    rejected); `l0` the mean number of active latents; `n_activations` the rows of `P`.
    """

    point: str
    positions: str
    explained_variance: float
    reward_recovered: float
    l0: float
    n_activations: int
    reward: np.ndarray
    spliced: np.ndarray
    zeroed: np.ndarray

    @property
    def poor(self) -> bool:
        """Explained variance or reward recovered under its floor (a NaN recovery alone is not poor)."""
        return self.explained_variance < MIN_EXPLAINED_VARIANCE or self.reward_recovered < MIN_REWARD_RECOVERED

    def summary(self) -> pd.DataFrame:
        """The fit's numbers, one row each (`stats.summary_frame`): `explained_variance`, `reward_recovered`,
        the mean |reward change| spliced and zeroed, `l0`, with `n` the activations or inputs they are over."""
        shift, ablate = (float(np.abs(v - self.reward).mean()) for v in (self.spliced, self.zeroed))
        inputs = len(self.reward)
        return summary_frame([
            {"name": "explained_variance", "value": self.explained_variance, "n": self.n_activations},
            {"name": "reward_recovered", "value": self.reward_recovered, "n": inputs},
            {"name": "mean_abs_reward_change_spliced", "value": shift, "n": inputs},
            {"name": "mean_abs_reward_change_zeroed", "value": ablate, "n": inputs},
            {"name": "l0", "value": self.l0, "n": self.n_activations},
        ])

    def describe(self) -> str:
        """One line: both numbers, the mean |reward change| spliced and zeroed, and 'POOR FIT' under a floor."""
        rec = "n/a (zeroing moves no reward)" if math.isnan(self.reward_recovered) else f"{self.reward_recovered:.3f}"
        shift, ablate = (float(np.abs(v - self.reward).mean()) for v in (self.spliced, self.zeroed))
        flag = " — POOR FIT" if self.poor else ""
        return (f"SAE fidelity at {self.point} ({self.positions} positions, {self.n_activations} activations): "
                f"explained variance {self.explained_variance:.3f}, reward recovered {rec} (mean |Δr| spliced "
                f"{shift:.4g}, zeroed {ablate:.4g}){flag}")

    def __str__(self) -> str:
        return self.describe()


def fit_positions(sae: TopKSAE, positions: FitPositions) -> Literal["all", "read"]:
    """'auto' → the positions the SAE was trained on, when it records them (rewardlens' SAEs), else 'all'."""
    if positions not in ("auto", "all", "read"):
        raise UsageError(f"positions must be 'auto', 'all' or 'read', got {positions!r}", option="positions")
    chosen = sae.provenance.positions if positions == "auto" else positions
    return "read" if chosen == "read" else "all"


def fidelity(model: RewardModel, sae: TopKSAE, inputs: Inputs, point: TraceKey | str, *,
             positions: FitPositions = "auto", skip_first: int | None = None, batch_size: int = 8) -> Fidelity:
    """Explained variance and reward recovered of `sae` at `point` on `inputs` (module docstring), warning
    when either is under its floor. `skip_first`: as `ActivationSource` (positions='all' only)."""
    where = fit_positions(sae, positions)
    source = ActivationSource(model, inputs, point, positions=where, batch_size=batch_size, skip_first=skip_first)
    if sae.d_in != source.d_in:
        raise SAEMismatchError(f"the SAE reads vectors of width {sae.d_in} but this model's {source.point} has width "
                               f"{source.d_in}; load the SAE made for this hook point")
    enc = sae if sae.b_dec.device == model.device else copy.deepcopy(sae).to(model.device)
    rewards = np.zeros((3, len(source.seqs)))
    with torch.no_grad():  # not a decorator: the warning below must name the caller's line
        stats = evaluate(sae, _runs(model, enc, source, rewards))
    r, r_s, r_0 = rewards
    ablated = float(np.abs(r_0 - r).mean())
    recovered = 1 - float(np.abs(r_s - r).mean()) / ablated if ablated > 0 else math.nan
    fit = Fidelity(source.point.name, where, stats.explained_variance, recovered, stats.l0, stats.n_rows,
                   r.astype(np.float32), r_s.astype(np.float32), r_0.astype(np.float32))
    if fit.poor:
        warn(f"{fit.describe()}: under the floors (explained variance {MIN_EXPLAINED_VARIANCE}, reward recovered "
             f"{MIN_REWARD_RECOVERED}): the reconstruction misses what this model computes there, so its "
             f"features' numbers describe the SAE more than the model; {poor_fit_advice(model, sae, fit)}")
    return fit


def trained_here(model: RewardModel, sae: TopKSAE, point: str) -> bool:
    """Whether the SAE's provenance says it was trained on this model at `point`: the same hook point and, by
    fingerprint when recorded (rewardlens' SAEs), else by `base_name`, the same model."""
    p = sae.provenance
    if p.point != point or p.base_model is None:
        return False
    if p.model_fingerprint is not None:
        return p.model_fingerprint == model_fingerprint(model)
    return base_name(p.base_model) == base_name(model_name(model))


def poor_fit_advice(model: RewardModel, sae: TopKSAE, fit: Fidelity) -> str:
    """What to do about a poor fit, by the SAE's provenance: an SAE trained on this model at this point
    needs more training (or the positions it was trained on); any other needs one that was."""
    p = sae.provenance
    if not trained_here(model, sae, fit.point):
        return (f"train longer or wider, or use an SAE trained on this model at {fit.point} "
                f"(positions={fit.positions!r}; rewardlens sae train)")
    if p.positions is not None and p.positions != fit.positions:
        return (f"this SAE was trained on this model at {fit.point} but at positions={p.positions!r}, and is measured "
                f"at positions={fit.positions!r}: measure it where it was trained (positions='auto'), or train one at "
                f"positions={fit.positions!r} (rewardlens sae train --positions {fit.positions})")
    wider = ", --positions all" if fit.positions == "read" else ""
    return (f"this SAE was trained on this model at {fit.point} (positions={fit.positions!r}), so it needs more "
            "training, not another model's: more epochs (--epochs), more latents or a larger k (--latents, "
            f"--expansion-factor, --k), or more data (a larger --pairs file{wider})")


def _runs(model: RewardModel, sae: TopKSAE, source: ActivationSource, rewards: np.ndarray) -> Iterator[Activations]:
    """Per batch, the clean, spliced and zeroed rewards into `rewards` [3, n]; yields the clean activations at
    the positions, so `evaluate` measures the fit on exactly what was spliced."""
    for rows, batch in model.batches(source.seqs, source.batch_size, is_pairs=source.is_pairs):
        mask = _positions(batch, source.positions, source.skip_first)
        got: list[Tensor] = []

        def grab(v: Tensor, got: list[Tensor] = got, mask: Tensor = mask) -> None:
            got.append(v[mask.to(v.device)].float())

        def splice(v: Tensor, mask: Tensor = mask) -> Tensor:
            return _replace(v, mask, lambda x: sae.decode(*sae.encode(x)))

        def zero(v: Tensor, mask: Tensor = mask) -> Tensor:
            return _replace(v, mask, torch.zeros_like)

        runs: tuple[Callable[[Tensor], Tensor | None], ...] = (grab, splice, zero)
        for i, fn in enumerate(runs):
            rewards[i, rows] = _reward(model, batch, source.point, fn)
        pos = batch.position_ids.to(mask.device)[mask].cpu()
        seq = torch.as_tensor(rows, dtype=torch.long).repeat_interleave(mask.sum(1).cpu())
        yield Activations(got[0], seq, pos)


def _positions(batch: Batch, positions: str, skip_first: int) -> Tensor:
    """[b, T] bool: the read position of each row, or every token `ActivationSource` reads."""
    if positions == "all":
        return token_mask(batch, skip_first)
    mask = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    mask[torch.arange(mask.shape[0], device=mask.device), batch.read_index.to(mask.device)] = True
    return mask


def _replace(v: Tensor, mask: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """`v` [b, T, w] with its rows at `mask` [b, T] replaced by `fn` of them (computed in fp32)."""
    out, m = v.clone(), mask.to(v.device)
    out[m] = fn(v[m].float()).to(v.dtype)
    return out


def _reward(model: RewardModel, batch: Batch, key: TraceKey, fn: Callable[[Tensor], Tensor | None]) -> np.ndarray:
    """The scalar reward [b] of one forward of `batch` with `fn` rewriting the value at hook point `key`."""
    pt = point_at(model, key, batch)
    with rewriting([(pt.module, pt.where, fn)]):
        values, weights = model.head_readout(model.run(batch, model.final_points(batch)))
    return (values * weights).sum(-1).double().cpu().numpy()
