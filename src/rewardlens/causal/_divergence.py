"""Divergence-aware patching: did a patched run leave the distribution of natural activations?

A patched run can report a large effect only because it pushed later layers somewhere the model
never goes. We fit, per layer, the natural residual stream at the read position (mean and a
Ledoit–Wolf-shrunk covariance over a reference set) and measure each patched run's *downstream*
residual (the patched layer and every later one) by its whitened (Mahalanobis) distance. The
threshold is a high quantile of held-out natural distances (K-fold, so natural points are not
scored by a fit that saw them); a score above 1 means further out than natural runs go. The
inserted activation itself is natural by construction, so it is never scored on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..data import pair_of
from ..errors import UsageError
from ..model import RewardModel, TraceKey
from ..model.internal import Tokenized
from ._engine import Site

if TYPE_CHECKING:
    from ._plan import Clean

MIN_REFERENCE = 8


@dataclass(frozen=True)
class Natural:
    """Whitening of one layer's natural activations: `distance(x)` is √((x−μ)ᵀ Σ⁻¹ (x−μ)),
    Σ = a·XᵀX + c·I (the shrunk covariance), computed through the N×N Gram matrix (Woodbury)."""

    mean: Tensor
    centred: Tensor
    inner: Tensor | None
    c: float
    shrinkage: float

    @classmethod
    def fit(cls, acts: Tensor) -> Natural:
        """Fit on natural activations [N, d] (fp64 inside)."""
        acts = acts.double()
        mean = acts.mean(0)
        x = acts - mean
        n, d = x.shape
        gram = x @ x.T
        trace = float(gram.trace()) / n
        mu = trace / d
        frob = float((gram**2).sum()) / n**2  # ‖S‖²_F
        spread = frob - 2 * mu * trace + mu * mu * d  # ‖S − μI‖²_F
        beta = (float((gram.diagonal() ** 2).sum()) - n * frob) / n**2
        shrink = 1.0 if spread <= 0 else min(max(beta / spread, 0.0), 1.0)
        c = max(shrink * mu, 1e-6 * mu, 1e-30)
        a = (1 - shrink) / n
        inner = None if a == 0 else torch.linalg.inv(c / a * torch.eye(n, dtype=x.dtype, device=x.device) + gram)
        return cls(mean, x, inner, c, shrink)

    def distance(self, v: Tensor) -> Tensor:
        """Whitened distance of `v` [..., d] from the natural mean [...]."""
        v = v.double() - self.mean
        sq = (v * v).sum(-1)
        if self.inner is not None:
            p = v @ self.centred.T
            sq = sq - ((p @ self.inner) * p).sum(-1)
        return (sq.clamp_min(0) / self.c).sqrt()


def thresholds(acts: Tensor, quantile: float = 0.99, folds: int = 5) -> float:
    """The `quantile` of held-out whitened distances of natural activations [N, d] (K-fold)."""
    n = acts.shape[0]
    if n < MIN_REFERENCE:
        raise UsageError(
            f"divergence needs at least {MIN_REFERENCE} natural reference sequences to calibrate against, got {n}; "
            "pass more pairs or reference= inputs", option="divergence"
        )
    fold = torch.arange(n) % folds
    held = []
    for k in range(folds):
        out = fold == k
        held.append(Natural.fit(acts[~out]).distance(acts[out]))
    return float(np.quantile(torch.cat(held).cpu().numpy(), quantile))


class NaturalFit:
    """Per-layer whitening of natural activations at the read position; called on residuals
    [..., L, d] it returns their whitened distance over the natural threshold [..., L].

    `states`: each layer's natural residual at the read position, `TraceKey.resid(l)` → [N, d] (a
    `Clean`'s `captured`, or states a caller gathered over more pairs than one call patches: the audit
    fits once over all its pairs from its per-pair traces and patches them chunk by chunk)."""

    def __init__(self, model: RewardModel, states: Mapping[TraceKey, Tensor], quantile: float = 0.99) -> None:
        missing = [layer for layer in range(model.n_layers) if TraceKey.resid(layer) not in states]
        if missing:
            raise UsageError(f"the natural fit needs every layer's residual at the read position; layers {missing} "
                             "are missing: trace them with natural_states(model, seqs), or pass a trace's "
                             "Clean.captured")
        self.fits: list[Natural] = []
        self.limits: list[float] = []
        for layer in range(model.n_layers):
            acts = states[TraceKey.resid(layer)].to(model.device)
            self.fits.append(Natural.fit(acts))
            self.limits.append(max(thresholds(acts, quantile), 1e-30))

    def __call__(self, x: Tensor) -> Tensor:
        out = torch.stack([fit.distance(x[..., layer, :]) / limit
                           for layer, (fit, limit) in enumerate(zip(self.fits, self.limits))], dim=-1)
        return out.float()


def natural_states(model: RewardModel, seqs: list[Tokenized], batch_size: int = 8, *, is_pairs: bool = False
                   ) -> dict[TraceKey, Tensor]:
    """Each layer's residual at the read position of `seqs` (any inputs): `TraceKey.resid(l)` → [N, d].
    `is_pairs`: `seqs` are pairs' sides, chosen and rejected interleaved, batched as a pair trace batches them
    (an `OutOfMemoryError` then names pairs)."""
    from ._plan import Clean

    return Clean.run(model, seqs, heads=False, batch_size=batch_size, is_pairs=is_pairs).captured


def scorer(model: RewardModel, clean: Clean, reference: list[Tokenized] | None, batch_size: int) -> NaturalFit:
    """A `NaturalFit` on `reference` (default: every clean sequence of the sweep)."""
    return NaturalFit(model, clean.captured if reference is None else natural_states(model, reference, batch_size))


def score_patched(sweep: list[Site], targets: list[int], ratios: Tensor, n_pairs: int) -> np.ndarray:
    """Divergence [n_pairs, S]: per patched run, the largest ratio of downstream whitened distance
    to the natural threshold (`ratios` [n_targets, S, L] from a `NaturalFit`) over the patched layer
    and every later one; the larger of the two sides when both are patched (ablation)."""
    first = torch.tensor([0 if s.kind == "embed" else s.layer for s in sweep], device=ratios.device)
    downstream = torch.arange(ratios.shape[-1], device=ratios.device)[None, :] >= first[:, None]  # [S, L]
    per_run = ratios.masked_fill(~downstream[None], 0.0).amax(-1)  # [n_targets, S]
    out = torch.zeros(n_pairs, len(sweep), dtype=per_run.dtype, device=ratios.device)
    for row, seq in enumerate(targets):
        pair = pair_of(seq)[0]
        out[pair] = torch.maximum(out[pair], per_run[row])
    return out.cpu().numpy()
