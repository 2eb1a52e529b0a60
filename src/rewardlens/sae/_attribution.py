"""The reward as an exact sum over SAE features at one layer, plus everything after that layer.

At the read position, the residual stream after layer `l` is `x_l = Σ_i f_i d_i + b_dec + ε` (ε:
what the SAE does not reconstruct). With the norms after `l` frozen (docs/design.md §1) the reward is
affine in `x_l`: `r = u_l · x_l + Σ_{parts after l} u_p · c_p + const`, where `u_l` is the
effective read-out at that depth (the same `u` for pre-norm models; in post-norm encoders it is
pulled back through every residual norm after `l`). Hence, exactly,

    r = Σ_i f_i (u_l · d_i) + u_l · b_dec + u_l · ε + Σ_{parts after l} + const.

A feature's alignment with the read-out is `cos(d_i, u_l)`: how much reward one unit of the
feature writes, per unit of its own norm.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, row_labels, side
from ..errors import ArchitectureError, UsageError
from ..exact.internal import decompose_trace, part_names, readout_vectors
from ..model import RewardModel, Trace, TraceKey, trace, verify
from ..model.internal import check_bookkeeping
from ..plotting import HtmlView
from ..stats import ranked
from ..types import PaddingSide
from ._autoencoder import TopKSAE
from ._fidelity import Fidelity, FitPositions, fidelity

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def resid_readout(model: RewardModel, tr: Trace, layer: int, coef: Tensor) -> Tensor:
    """Read-out vectors `u_l` [n, d] of the residual after `layer`, for the readout scalar."""
    _, u_attn, _, _ = readout_vectors(model, tr, coef)
    if layer + 1 < model.n_layers:
        return u_attn[layer + 1][:, 0]  # what reads the next layer's input reads x_l
    u, _ = model.head.rows(model.final_hidden(tr[TraceKey.final()]))
    u = (coef[..., None] * u).sum(1)
    if model.arch.final_norm is not None:
        u = model.norm(model.arch.final_norm).pullback(u[:, None], tr[TraceKey.final()])[0][:, 0]
    return u


@dataclass(frozen=True)
class FeatureAttribution(HtmlView):
    """Each input's reward split over the SAE's features at `layer` (read position), in reward units.

    `features` [F]: the latents that fired on some input (ids into the SAE), `activations` and
    `values` [n, F]: `f_i` and `f_i (u·d_i)`; `decoder_bias`, `error` [n]: `u·b_dec` and `u·ε`;
    `rest` [n, Q]: the parts after `layer` (`rest_names`); `constant` [n]; `reward` [n] from the
    model's fp32 head. `alignment` [F] is `cos(d_i, ū)` with `ū` the mean unit read-out over
    inputs; `latent_alignment` [n_latents] the same for every latent. Rows alternate chosen,
    rejected for pairs. On these activations, `fvu` is the SAE's fraction of variance unexplained
    (about their mean) and `relative_error` is `Σ‖ε‖² / Σ‖x‖²`: read-position activations can be
    so alike (one end-of-turn token) that their variance, and so FVU, says little. `fidelity`: the
    SAE's explained variance and reward recovered at `resid_{layer}` on these inputs (`Fidelity`;
    None when not measured).
    """

    _html_top_names = ("feature", "mean |contribution|")

    layer: int
    features: np.ndarray
    values: np.ndarray
    activations: np.ndarray
    decoder_bias: np.ndarray
    error: np.ndarray
    rest: np.ndarray
    rest_names: list[str]
    constant: np.ndarray
    reward: np.ndarray
    alignment: np.ndarray
    latent_alignment: np.ndarray
    fvu: float
    relative_error: float
    rows: list[str]
    is_pairs: bool
    fidelity: Fidelity | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fidelity, dict):  # read back from a results store, which keeps plain records
            object.__setattr__(self, "fidelity", Fidelity(**{f.name: self.fidelity[f.name] for f in fields(Fidelity)}))

    @property
    def residual_error(self) -> np.ndarray:
        """reward − (features + decoder bias + error + parts after the layer + constant) [n]: float error only."""
        return self.reward - self.totals()["total"]

    def totals(self) -> dict[str, np.ndarray]:
        """Per input [n]: the features' sum, `decoder_bias`, `error`, `rest`, `constant` and their `total`."""
        parts = {"features": self.values.sum(1), "decoder_bias": self.decoder_bias, "error": self.error,
                 "rest": self.rest.sum(1), "constant": self.constant}
        return {**parts, "total": sum(parts.values())}

    @property
    def margin(self) -> np.ndarray:
        """Per-feature chosen − rejected contribution [n_pairs, F]."""
        return pair_margin(self.values, self.is_pairs)

    def top(self, n: int = 10, *, by: Literal["mean_abs", "mean", "margin"] = "mean_abs") -> list[tuple[int, float]]:
        """`n` (latent id, score) pairs with the largest |score|: mean |contribution| ('mean_abs'),
        mean contribution ('mean') or mean chosen − rejected contribution ('margin')."""
        return top_latents(self.features, self.values, lambda: self.margin, n, by)

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (input, fired feature) with activation, contribution and alignment."""
        import pandas as pd

        n, f = self.values.shape
        hit = self.activations.ravel() > 0
        return pd.DataFrame({
            "input": np.repeat(self.rows, f)[hit], "feature": np.tile(self.features, n)[hit],
            "activation": self.activations.ravel()[hit], "contribution": self.values.ravel()[hit],
            "alignment": np.tile(self.alignment, n)[hit],
        })

    def plot(self, n: int = 20, ax: Axes | None = None) -> Figure:
        """Bar chart of the top `n` features' mean margin (pairs) or mean contribution, blue positive and
        red negative; into `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        top = self.top(n, by="margin" if self.is_pairs else "mean")
        ax, made = one_panel(ax, (6, 0.3 * len(top) + 1))
        values = [t[1] for t in top][::-1]
        ax.barh([f"feature {t[0]}" for t in top][::-1], values,
                color=["tab:blue" if v >= 0 else "tab:red" for v in values])
        ax.axvline(0, color="black", lw=0.8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel(f"mean chosen − rejected contribution at layer {self.layer} (reward units)" if self.is_pairs
                      else f"mean contribution at layer {self.layer} (reward units)")
        return finish(ax, made)


def pair_margin(rows: np.ndarray, is_pairs: bool) -> np.ndarray:
    """Chosen − rejected of per-input rows [2n, F] → [n, F] (rows alternate chosen, rejected: `data.side`);
    a `ValueError` naming the fix where the inputs were not pairs, so a margin has no meaning."""
    if not is_pairs:
        raise UsageError("a margin needs the inputs given as rewardlens.Pair (chosen and rejected); these were "
                         "single texts, so read the per-input rows instead")
    return side(rows, "chosen") - side(rows, "rejected")


def top_latents(features: np.ndarray, values: np.ndarray, margin: Callable[[], np.ndarray], n: int,
                by: str) -> list[tuple[int, float]]:
    """`n` (latent id, score) pairs with the largest |score| (`stats.ranked`), over per-input scores `values`
    [n_inputs, F] of latents `features` [F]: mean |value| ('mean_abs'), mean value ('mean') or the mean of
    `margin()` [n_pairs, F] ('margin'): the one ranking of `FeatureAttribution.top` and `FeatureTotals.top`."""
    if by not in ("mean_abs", "mean", "margin"):
        raise UsageError(f"by must be 'mean_abs', 'mean' or 'margin', got {by!r}")
    score = {"margin": lambda: margin().mean(0), "mean": lambda: values.mean(0),
             "mean_abs": lambda: np.abs(values).mean(0)}[by]()
    return [(int(features[i]), float(score[i])) for i in ranked(np.abs(score), n)]


def densify(idx: np.ndarray, acts: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k codes [n, k] (latent ids, activations, contributions) → the latents that fired
    anywhere [F] and dense [n, F] activations and contributions (a published SAE has 10⁵ latents;
    a few hundred inputs fire a small share of them)."""
    hit = acts > 0
    features = np.unique(idx[hit])
    rows, cols = np.nonzero(hit)[0], np.searchsorted(features, idx[hit])
    dense_acts, dense_vals = (np.zeros((len(idx), len(features)), np.float32) for _ in range(2))
    dense_acts[rows, cols], dense_vals[rows, cols] = acts[hit], vals[hit]  # top-k ids are distinct per row
    return features, dense_acts, dense_vals


def check_width(model: RewardModel, sae: TopKSAE, layer: int) -> None:
    if not 0 <= layer < model.n_layers:
        raise UsageError(f"layer {layer} out of range for a model with {model.n_layers} layers", option="layer")
    if sae.d_in != model.d_model:
        where = f" (from {sae.folder})" if sae.folder else ""
        raise ArchitectureError(
            f"the SAE{where} reads vectors of width {sae.d_in} but this model's residual stream has width "
            f"{model.d_model}; it was trained on another model — load the SAE made for this backbone"
        )


def attribute_features(model: RewardModel, sae: TopKSAE, inputs: Inputs, *, layer: int, batch_size: int = 8,
                       padding_side: PaddingSide = "right", fit: FitPositions | None = "auto") -> FeatureAttribution:
    """Exact split of each input's reward over `sae`'s features at the residual after `layer`.

    `sae` must be trained on `resid_{layer}` at the read position or at all positions (it is
    applied at the read position, the only one the head reads directly). One forward per batch,
    and three more for the fidelity check (`fidelity` at positions `fit`; None skips it), which
    warns when the SAE fits poorly.
    """
    att = attribute_with_readout(model, sae, inputs, layer=layer, batch_size=batch_size,
                                 padding_side=padding_side)[0]
    if fit is None:
        return att
    return replace(att, fidelity=fidelity(model, sae, inputs, TraceKey.resid(layer), positions=fit,
                                          batch_size=batch_size))


@torch.no_grad()
def attribute_with_readout(model: RewardModel, sae: TopKSAE, inputs: Inputs, *, layer: int, batch_size: int = 8,
                           padding_side: PaddingSide = "right") -> tuple[FeatureAttribution, np.ndarray]:
    """`attribute_features`, and the effective read-out `u_l` [n, d] of every input at the layer
    (`u_l · d_i`: the reward one unit of latent `i` writes directly there, what a feature
    intervention's direct effect reads; kept out of the result, which the audit stores)."""
    check_width(model, sae, layer)
    if not model.verified:
        verify(model)
    seqs, is_pairs = model.encode(inputs)
    n, k = len(seqs), sae.k
    W, b = sae.W_dec.to(model.device, torch.float32), sae.b_dec.to(model.device, torch.float32)
    # Encode on the model's device; a copy when the SAE lives elsewhere (the caller's SAE is not moved).
    enc = sae if sae.b_dec.device == model.device else copy.deepcopy(sae).to(model.device)
    idx_all = np.zeros((n, k), dtype=np.int64)
    acts_all, vals_all = np.zeros((n, k), np.float32), np.zeros((n, k), np.float32)
    bias, err, const, reward = (np.zeros(n, np.float32) for _ in range(4))
    readout = np.zeros((n, model.d_model), np.float32)
    names = part_names(model, "sublayer", ())
    rest_mask: np.ndarray | None = None
    rest = np.zeros((n, 0), np.float32)
    u_sum = torch.zeros(model.d_model, dtype=torch.float64, device=model.device)
    sq_err, s1, s2 = 0.0, torch.zeros(model.d_model, dtype=torch.float64, device=model.device), 0.0
    for i, (rows, batch) in enumerate(model.batches(seqs, batch_size, padding_side, is_pairs)):
        tr = trace(model, batch)
        if i == 0:
            check_bookkeeping(model, tr)
        out, coef = model.head_readout(tr.captured)
        vals, depth, consts = decompose_trace(model, tr, "sublayer", set(), coef)
        if rest_mask is None:
            rest_mask = np.asarray(depth) > layer + 1
            rest = np.zeros((n, int(rest_mask.sum())), np.float32)
        u = resid_readout(model, tr, layer, coef)  # [b, d]
        readout[rows] = u.cpu().numpy()
        x = tr[TraceKey.resid(layer)]
        acts, idx = enc.encode(x)
        acts = acts.float()
        x_hat = (acts[..., None] * W[idx]).sum(1) + b
        write = torch.einsum("bd,bkd->bk", u, W[idx])
        idx_all[rows], acts_all[rows] = idx.cpu().numpy(), acts.cpu().numpy()
        vals_all[rows] = (acts * write).cpu().numpy()
        bias[rows], err[rows] = (u @ b).cpu().numpy(), (u * (x - x_hat)).sum(-1).cpu().numpy()
        rest[rows] = vals[:, 0, torch.as_tensor(rest_mask, device=vals.device)].cpu().numpy()
        c = consts[-1][:, 0] + sum((v[:, 0] for d, v in consts.items() if d > layer + 1), torch.zeros_like(u[:, 0]))
        const[rows], reward[rows] = c.cpu().numpy(), (out * coef).sum(-1).cpu().numpy()
        u_sum += (u / u.norm(dim=-1, keepdim=True).clamp_min(1e-30)).sum(0).double()
        sq_err += float((x - x_hat).double().pow(2).sum())
        s1 += x.double().sum(0)
        s2 += float(x.double().pow(2).sum())
    assert rest_mask is not None  # set by the first batch; model.encode refuses empty inputs
    features, dense_acts, dense_vals = densify(idx_all, acts_all, vals_all)
    direction = (u_sum / u_sum.norm().clamp_min(1e-30)).float()
    latent_alignment = ((W @ direction) / W.norm(dim=1).clamp_min(1e-30)).cpu().numpy()
    total_var = s2 - float(s1.pow(2).sum()) / n
    att = FeatureAttribution(
        layer=layer, features=features, values=dense_vals, activations=dense_acts, decoder_bias=bias, error=err,
        rest=rest, rest_names=[nm for nm, keep in zip(names, rest_mask) if keep], constant=const, reward=reward,
        alignment=latent_alignment[features], latent_alignment=latent_alignment, fvu=sq_err / max(total_var, 1e-30),
        relative_error=sq_err / max(s2, 1e-30), rows=row_labels(n, is_pairs), is_pairs=is_pairs,
    )
    return att, readout
