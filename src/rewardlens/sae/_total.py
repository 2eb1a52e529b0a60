"""First-order total effects of SAE features: attribution patching over features (an approximation).

A feature's direct attribution `f_i (u_l · d_i)` (`_attribution.py`) is what it writes straight onto
the read-out; a feature at an early layer can matter only through the layers after it and write
nothing directly. Splice the SAE in at the read position `t*` of the residual after `layer`, keeping
its error term: `x = Σ_i f_i d_i + b_dec + ε` with `ε = x − x̂` held fixed, so the spliced forward *is*
the model's own, and

    ∂r/∂f_i = g · d_i,    g = ∂r/∂x  at t* (every later layer and norm responding).

An edit `f → f'` then changes the reward by `Σ_i (f'_i − f_i)(g · d_i)` to first order. For ablation
(`f' = 0`), per input,

    total_approx_i = f_i (g · d_i)        ≈ r − r(f_i → 0),

the reward the feature carries through every path, in the sign of its direct contribution; for pairs
its margin is chosen − rejected, as `FeatureAttribution.margin` (docs/patching.md's sign: clean −
patched). One forward and one backward per batch give `g` for every input, hence the estimate for every
latent at once (the gradient flows through a zero tensor added at `t*`, so no parameter collects a
`.grad`; a gated head's gate is held at its clean value, as `tokens(..., approx=True)` holds it). It is
first order: exact for an edit the reward is linear in, an estimate of a saturated one (`feature_patch`
measures the real thing; its `total_approx` sits beside `total`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, row_labels
from ..model import RewardModel, TraceKey, verify
from ..model.internal import Batch, eval_mode, points, rewriting
from ..types import PaddingSide
from ._attribution import check_width, densify, pair_margin, top_latents
from ._autoencoder import TopKSAE
from ._splice import check_single_read


@dataclass(frozen=True)
class FeatureTotals:
    """First-order total effect of ablating each SAE feature at `layer` (module docstring), in reward units.

    `features` [F]: the latents that fired at the read position of some input (as
    `FeatureAttribution.features` on the same inputs); `activations` [n, F]: `f_i`; `total_approx`
    [n, F]: `f_i (g · d_i)`; `gradient` [n, d]: `g = ∂r/∂x` at `t*` of the residual after `layer`
    (`gradient @ d_i` is `∂r/∂f_i` for any latent, fired or not); `reward` [n] the model's reward from
    the same forward. Rows alternate chosen, rejected for pairs.
    """

    layer: int
    features: np.ndarray
    activations: np.ndarray
    total_approx: np.ndarray
    gradient: np.ndarray
    reward: np.ndarray
    rows: list[str]
    is_pairs: bool

    @property
    def margin(self) -> np.ndarray:
        """Per-feature chosen − rejected first-order total effect [n_pairs, F]."""
        return pair_margin(self.total_approx, self.is_pairs)

    def top(self, n: int = 10, *, by: Literal["mean_abs", "mean", "margin"] = "mean_abs") -> list[tuple[int, float]]:
        """`n` (latent id, score) pairs with the largest |score| (`stats.ranked`): mean |total_approx|
        ('mean_abs'), mean ('mean') or mean chosen − rejected ('margin'), as `FeatureAttribution.top`."""
        return top_latents(self.features, self.total_approx, lambda: self.margin, n, by)


def read_gradient(model: RewardModel, batch: Batch, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """(g [b, d] = ∂r/∂x at each row's read position of the residual after `layer`, that residual x [b, d],
    the reward [b]): one forward with a zero tensor added at `t*`, one backward (`torch.autograd.grad`)."""
    point = points(model, batch, heads=[], neurons=[], gate=False)[TraceKey.resid(layer)]
    finals = model.final_points(batch)
    kept: dict[object, Tensor] = {}

    def touch(x: Tensor) -> Tensor:
        rows, read = torch.arange(x.shape[0], device=x.device), batch.read_index.to(x.device)
        delta = torch.zeros(x.shape[0], x.shape[-1], dtype=x.dtype, device=x.device, requires_grad=True)
        kept["delta"], kept["x"] = delta, x[rows, read].detach()
        return x.index_put((rows, read), x[rows, read] + delta)  # out of place: the graph keeps `delta`

    def keeper(key: TraceKey, cols: Tensor) -> Callable[[Tensor], Tensor | None]:
        def keep(x: Tensor) -> Tensor | None:
            kept[key] = x[torch.arange(x.shape[0], device=x.device), cols.to(x.device)].float()
            return None  # leaves the value as it is
        return keep

    # `touch` first: where the read-out's point is this layer's own output, `keep` sees the touched value.
    hooks = [(point.module, point.where, touch),
             *((p.module, p.where, keeper(key, p.cols)) for key, p in finals.items())]
    with torch.enable_grad(), eval_mode(model.model), rewriting(hooks):
        model.backbone(**model.batch_kwargs(batch))
        captured: Mapping[TraceKey, Tensor] = {
            k: v if k == TraceKey.final() else v.detach() for k, v in kept.items() if isinstance(k, TraceKey)}
        values, coef = model.head_readout(captured)
        reward = (values * coef.detach()).sum(-1)
        (grad,) = torch.autograd.grad(reward.sum(), kept["delta"])
    return grad.float(), kept["x"].float(), reward.detach()


def feature_totals(model: RewardModel, sae: TopKSAE, inputs: Inputs, *, layer: int, batch_size: int = 8,
                   padding_side: PaddingSide = "right") -> FeatureTotals:
    """First-order total effect of ablating each SAE feature at the residual after `layer` (module docstring):
    one forward and one backward per batch of `batch_size` inputs."""
    check_width(model, sae, layer)
    check_single_read(model, "feature_totals")
    if not model.verified:
        verify(model)
    seqs, is_pairs = model.encode(inputs)
    n, k = len(seqs), sae.k
    enc = sae if sae.b_dec.device == model.device else copy.deepcopy(sae).to(model.device)  # never move the caller's
    W = sae.W_dec.detach().to(model.device, torch.float32)
    idx_all, acts_all = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    vals_all = np.zeros((n, k), np.float32)
    grads, reward = np.zeros((n, model.d_model), np.float32), np.zeros(n, np.float32)
    for rows, batch in model.batches(seqs, batch_size, padding_side, is_pairs):
        g, x, r = read_gradient(model, batch, layer)
        with torch.no_grad():
            acts, idx = enc.encode(x)
        acts = acts.float()
        idx_all[rows], acts_all[rows] = idx.cpu().numpy(), acts.cpu().numpy()
        vals_all[rows] = (acts * torch.einsum("bd,bkd->bk", g, W[idx])).cpu().numpy()
        grads[rows], reward[rows] = g.cpu().numpy(), r.cpu().numpy()
    features, dense_acts, dense_vals = densify(idx_all, acts_all, vals_all)
    return FeatureTotals(layer=layer, features=features, activations=dense_acts, total_approx=dense_vals,
                         gradient=grads, reward=reward, rows=row_labels(n, is_pairs), is_pairs=is_pairs)
