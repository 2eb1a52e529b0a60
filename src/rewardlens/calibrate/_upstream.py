"""Upstream SAE features: the first-order total ranking finds the feature that moves the margin most, where
the direct ranking cannot see one that acts only through later layers.

On the `keyword` and `list` organisms, a TopK SAE on the residual after layer 0 (`_sae.train_for`, the
first of two layers) gets one *planted upstream latent*, fixed before anything is measured: its
decoder row is the mean chosen − rejected difference of the layer-0 residual at the read token over a
stream of pairs nothing else uses, with every direction the read-out `u_0` takes removed (so its
direct attribution is 0 on every input), and it reads that same direction (encoder row ×10, bias at
the stream's median, so it fires more on the chosen side). Every latent that fires at the read token
of the bench's held-out pairs is then ablated alone (`feature_patch`, measured): the *most effective*
latent is the one with the largest |mean total effect|. Graded: its rank by the first-order total
ranking (`feature_totals(...).top(by="margin")`, one backward per batch) is 1. Reported (rows that
always pass): the planted latent's ablation share and direct share, and the most effective latent's
rank by the direct ranking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data import margin
from ..model import RewardModel, TraceKey, trace
from ..zoo.organisms import ORGANISMS
from ._core import Grade, OrganismBench
from ._sae import train_for

if TYPE_CHECKING:
    from ..sae import TopKSAE

PLANTED = 0
"""The latent the upstream feature is planted in (its trained weights are overwritten)."""
READ_SPAN_TOL = 1e-5
"""Singular values of the read-outs under this share of the largest are float noise (a pre-norm model's `u_l`
is one direction, scaled per input)."""


def plant(model: RewardModel, sae: TopKSAE, layer: int, seed: int, name: str) -> None:
    """Overwrite latent `PLANTED` of `sae` with the module docstring's upstream latent, in place."""
    from ..sae.internal import attribute_with_readout

    pairs = ORGANISMS[name].pairs(n=60, seed=seed + 5, strength=1.0)
    _, readout = attribute_with_readout(model, sae, pairs, layer=layer)
    seqs, is_pairs = model.encode(pairs)
    x = np.zeros((len(seqs), model.d_model))
    for rows, batch in model.batches(seqs, 16, "right", is_pairs):
        tr = trace(model, batch)
        x[rows] = tr[TraceKey.resid(layer)].double().cpu().numpy()
    u, s, _ = np.linalg.svd(readout.T.astype(np.float64), full_matrices=False)
    span = u[:, s > READ_SPAN_TOL * s[0]]
    d = margin(x).mean(0)
    d -= span @ (span.T @ d)
    d /= np.linalg.norm(d)
    along = (x - sae.b_dec.detach().double().cpu().numpy()) @ d
    with torch.no_grad():
        sae.W_dec[PLANTED] = torch.as_tensor(d, dtype=sae.W_dec.dtype)
        sae.encoder.weight[PLANTED] = 10 * torch.as_tensor(d, dtype=sae.W_dec.dtype)
        sae.encoder.bias[PLANTED] = float(-10 * np.median(along))


def upstream(bench: OrganismBench, name: str) -> list[Grade]:
    """The module docstring's rows for organism `name`."""
    from ..sae import attribute_features, feature_patch, feature_totals

    model, layer, sae = train_for(bench, name, layer=0)
    plant(model, sae, layer, bench.seed, name)
    pairs = bench.pairs(name)
    att = attribute_features(model, sae, pairs, layer=layer, fit=None)
    totals = feature_totals(model, sae, pairs, layer=layer)
    ablated = feature_patch(model, sae, pairs, layer=layer, features=att.features.tolist(), approx=False, n_boot=1)
    clean = float(margin(ablated.clean).mean())
    effect = ablated.total.mean(0)
    best = int(att.features[int(np.argmax(np.abs(effect)))])
    by_total = [f for f, _ in totals.top(len(totals.features), by="margin")]
    by_direct = [f for f, _ in att.top(len(att.features), by="margin")]
    fired = PLANTED in set(att.features.tolist())
    col = int(np.searchsorted(att.features, PLANTED))
    planted_share = float(effect[col]) / clean if fired else np.nan
    direct_share = float(att.margin[:, col].mean()) / clean if fired else np.nan
    n = len(att.features)
    head = f"the most effective layer-0 latent ({best}{', planted' if best == PLANTED else ''})"
    return [
        Grade.of("sae", name, f"rank of {head} by the first-order total ranking, of {n} that fire",
                 by_total.index(best) + 1, 1, "<="),
        # Informational (always pass): what the direct ranking makes of it, and what the plant does.
        # Not "rank of ...": the scorecard's rank rows all read 1, and this one need not.
        Grade.of("sae", name, f"place of {head} in the direct ranking (reported), of {n} that fire",
                 by_direct.index(best) + 1, n, "<="),
        Grade.of("sae", name, "mean ablation effect of the planted upstream latent as a share of the mean clean "
                 "margin", abs(planted_share), 0.0),
        Grade.of("sae", name, "|mean direct attribution| of the planted upstream latent as a share of the mean "
                 "clean margin", abs(direct_share), 1.0, "<="),
    ]
