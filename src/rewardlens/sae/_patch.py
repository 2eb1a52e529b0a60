"""Feature interventions: the reward with SAE features removed, clamped, or taken from the other side.

The SAE is spliced in at the read position `t*` of the residual after `layer` *keeping its error
term*: with `x = Σ_i f_i d_i + b_dec + ε`, setting the features `F` to `f'` gives

    x' = x − Σ_{i ∈ F} (f_i − f'_i) d_i,

so an edit that changes nothing (`f' = f`) is the model's own run, exactly. Per feature `i` and
pair (docs/patching.md's sign: clean margin − patched margin, positive when the feature carries the
preference):

- total: the margin change with every later layer recomputing (the model's own forward, edited);
- direct: the change read straight through the frozen read-out `u_l` (docs/sae.md): the
  feature's direct attribution difference, `(f_i − f'_i)(u_l · d_i)` per side;
- indirect = total − direct: what the layers after `l` add in response.

Modes: 'ablate' (`f' = 0`, both sides), 'clamp' (`f' = value`, both sides) and 'noising' (the
chosen run takes the rejected side's activation of the feature at *its* read token, the one token
each side's reward is read at; the rejected run is left alone). Every single-feature edit of an
input runs as one row of a batch of copies, `batch_size` rows at a time, each copy stepped from the
layer after the SAE's from the recorded clean residual (`_splice`), not one full forward per feature.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
import torch

from ..data import Pair, pair_ids
from ..errors import DataError
from ..model import RewardModel
from ..stats import bootstrap_ci, rowwise_spearman, top_parts
from ._attribution import FeatureAttribution, attribute_with_readout, check_width
from ._autoencoder import TopKSAE
from ._splice import check_single_read, clean_rewards, each_edit_batch, edited_rewards

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FeatureMode = Literal["ablate", "clamp", "noising"]
DEFAULT_FEATURES = 16
"""Features patched when none are named: the top ones by mean |margin contribution|."""


@dataclass(frozen=True)
class FeaturePatch:
    """Effects of editing each SAE feature at `layer`, per pair [n_pairs, F] over `features` (latent ids).

    `attribution`: the feature's direct contribution to the clean margin (`FeatureAttribution.margin`);
    `total`, `direct`: clean margin − patched margin, with later layers recomputing and through the
    frozen read-out; `indirect` = total − direct. `clean` [2·n_pairs] the model's own rewards
    (interleaved chosen, rejected); `patched` [2·n_pairs, F] the rewards with one feature edited
    (the side a mode leaves alone keeps its clean reward). `mode`, `value` say what `f'` was.
    """

    layer: int
    features: np.ndarray
    mode: FeatureMode
    value: float | None
    pair_ids: list[str]
    attribution: np.ndarray
    total: np.ndarray
    direct: np.ndarray
    clean: np.ndarray
    patched: np.ndarray
    n_boot: int = 2000
    seed: int = 0

    @property
    def indirect(self) -> np.ndarray:
        """Total − direct [n_pairs, F]: what the layers after `layer` add in response to the edit."""
        return self.total - self.direct

    @property
    def rho(self) -> np.ndarray:
        """Per-pair Spearman ρ [n_pairs] between attribution and total effect across the features (NaN
        where either is the same for every feature)."""
        return rowwise_spearman(self.attribution, self.total)

    def faithfulness(self) -> tuple[float, float, float]:
        """(mean ρ over the pairs with a defined ρ, bootstrap interval low, high); NaN if none is defined."""
        rho = self.rho[np.isfinite(self.rho)]
        if not len(rho):
            return math.nan, math.nan, math.nan
        lo, hi = bootstrap_ci(rho, n_boot=self.n_boot, seed=self.seed)
        return float(rho.mean()), lo, hi

    def top(self, k: int = 10) -> list[tuple[int, float]]:
        """`k` (latent id, mean total effect) with the largest mean |total effect| over pairs
        (`stats.top_parts`, the ranking of every table of top parts)."""
        return [(int(self.features[i]), float(self.total[:, i].mean())) for i in top_parts(self.total, k)]

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (pair, feature) with attribution, total, direct and indirect effect."""
        import pandas as pd

        n, f = self.total.shape
        return pd.DataFrame({"pair": np.repeat(self.pair_ids, f), "feature": np.tile(self.features, n),
                             "attribution": self.attribution.ravel(), "total": self.total.ravel(),
                             "direct": self.direct.ravel(), "indirect": self.indirect.ravel()})

    def plot(self, n: int = 20, ax: Axes | None = None) -> Figure:
        """Mean total and direct effect of the top `n` features (by mean |total|), side by side; into
        `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        top = [int(i) for i in top_parts(self.total, n)][::-1]
        ax, made = one_panel(ax, (6, 0.35 * len(top) + 1.2))
        y = np.arange(len(top))
        ax.barh(y + 0.2, self.total[:, top].mean(0), height=0.4, color="tab:blue", label="total")
        ax.barh(y - 0.2, self.direct[:, top].mean(0), height=0.4, color="tab:gray", label="direct")
        ax.set_yticks(y, [f"feature {self.features[i]}" for i in top], fontsize=7)
        ax.axvline(0, color="black", lw=0.8)
        mean, lo, hi = self.faithfulness()
        ax.set_title(f"{self.mode} at layer {self.layer}: ρ(attribution, total) {mean:.2f} [{lo:.2f}, {hi:.2f}]",
                     fontsize=9)
        ax.set_xlabel("mean effect on the margin (clean − patched, reward units)")
        ax.legend(fontsize=7)
        return finish(ax, made)


def _check_features(sae: TopKSAE, features: Sequence[int]) -> np.ndarray:
    ids = np.asarray(list(features))
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"features are latent ids (integers), got {list(features)[:5]!r}; pass e.g. features=[3, 17]")
    ids = ids.astype(np.int64)
    bad = ids[(ids < 0) | (ids >= sae.n_latents)]
    if bad.size:
        raise DataError(f"feature {int(bad[0])} is out of range for an SAE with {sae.n_latents} latents; "
                        f"pass latent ids in 0..{sae.n_latents - 1}")
    if len(np.unique(ids)) != len(ids):
        raise DataError(f"features {ids.tolist()} name a latent twice; pass each latent id once")
    return ids


def _check(model: RewardModel, sae: TopKSAE, pairs: Sequence[Pair], layer: int, mode: str,
           value: float | None) -> None:
    if not isinstance(sae, TopKSAE):
        raise DataError(f"sae must be a rewardlens.sae.TopKSAE (load one with load_sae), got {type(sae).__name__}")
    check_width(model, sae, layer)
    check_single_read(model, "feature_patch")
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        raise DataError("feature_patch compares the two sides of preference pairs: pass a list of rewardlens.Pair")
    if mode not in get_args(FeatureMode):
        raise DataError(f"mode must be 'ablate', 'clamp' or 'noising', got {mode!r}")
    if mode == "clamp" and (value is None or not math.isfinite(float(value))):
        raise DataError(f"mode='clamp' needs a finite value= to set the features to, got {value!r}")
    if mode != "clamp" and value is not None:
        raise DataError(f"value= is the clamp level; mode={mode!r} takes none (got {value!r}): drop it or use "
                        "mode='clamp'")


def _dense(att: FeatureAttribution, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clean activations and direct contributions [n, F] of latents `ids` (0 where a latent did not fire)."""
    col = np.searchsorted(att.features, ids)
    fired = (col < len(att.features)) & (att.features[np.minimum(col, len(att.features) - 1)] == ids)
    acts, vals = (np.zeros((len(att.reward), len(ids)), np.float64) for _ in range(2))
    acts[:, fired], vals[:, fired] = att.activations[:, col[fired]], att.values[:, col[fired]]
    return acts, vals


def _targets(acts: np.ndarray, mode: FeatureMode, value: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(f' [n, F], which rows are edited [n]) for the mode; rows alternate chosen, rejected."""
    n = len(acts)
    if mode == "ablate":
        return np.zeros_like(acts), np.ones(n, bool)
    if mode == "clamp":
        assert value is not None  # _check refuses a clamp without a value
        return np.full_like(acts, float(value)), np.ones(n, bool)
    new = acts.copy()
    new[0::2] = acts[1::2]  # the chosen run takes the rejected side's activation at its read token
    return new, np.arange(n) % 2 == 0


def _rewards(model: RewardModel, pairs: Sequence[Pair], layer: int, delta: np.ndarray, edited: np.ndarray,
             W: torch.Tensor, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(clean rewards [n], rewards with one feature edited [n, F]): `delta[r, j] · W[j]` [d] added at `t*`
    of row r for edit j. Rows not `edited` keep their clean reward (they are not run)."""
    seqs, _ = model.encode(pairs)
    clean = np.zeros(len(seqs))
    for rows, batch in model.batches(seqs, batch_size):
        clean[rows] = clean_rewards(model, batch).double().cpu().numpy()
    patched = np.repeat(clean[:, None], len(W), 1)
    step = torch.as_tensor(delta, dtype=torch.float32, device=model.device)
    for rows, big, part in each_edit_batch(model, seqs, np.flatnonzero(edited), len(W), batch_size):
        add = step[torch.as_tensor(rows, device=model.device), part][..., None] * W[part][None]  # [b, f, d]
        got = edited_rewards(model, big, layer, add.flatten(0, 1)).double().cpu().numpy()
        patched[rows[:, None], np.arange(part.start, part.stop)[None]] = got.reshape(len(rows), -1)
    return clean, patched


def feature_patch(model: RewardModel, sae: TopKSAE, pairs: Sequence[Pair], *, layer: int,
                  features: Sequence[int] | None = None, mode: FeatureMode = "ablate", value: float | None = None,
                  batch_size: int = 16, n_boot: int = 2000, seed: int = 0) -> FeaturePatch:
    """Edit each SAE feature at the residual after `layer`, one at a time, and measure the margin's
    total, direct and indirect change (module docstring); error term kept.

    `features`: latent ids (default: the `DEFAULT_FEATURES` with the largest mean |margin
    contribution|). `mode`: 'ablate', 'clamp' (with a finite `value`) or 'noising'. `batch_size`:
    rows per forward (inputs × feature edits); 1 runs every edit on its own. One attribution pass
    (for `f`, `u_l` and the attribution), then the edited forwards.
    """
    _check(model, sae, pairs, layer, mode, value)
    att, readout = attribute_with_readout(model, sae, pairs, layer=layer, batch_size=batch_size)
    if features is None:
        features = [latent for latent, _ in att.top(DEFAULT_FEATURES, by="margin")]
    ids = _check_features(sae, features)
    acts, vals = _dense(att, ids)
    new, edited = _targets(acts, mode, value)
    W = sae.W_dec.detach().to(model.device, torch.float32)[torch.as_tensor(ids, device=model.device)]  # [F, d]
    writes = readout.astype(np.float64) @ W.double().cpu().numpy().T  # u_l · d_i [n, F]
    delta = np.where(edited[:, None], new - acts, 0.0)
    direct_rows = delta * writes  # change of each side's direct contribution
    clean, patched = _rewards(model, pairs, layer, delta, edited, W, batch_size)
    margin = lambda r: r[0::2] - r[1::2]  # noqa: E731 - chosen − rejected, the pairs' own convention
    return FeaturePatch(
        layer=layer, features=ids, mode=mode, value=None if value is None else float(value),
        pair_ids=pair_ids(pairs), attribution=margin(vals),
        total=margin(clean)[:, None] - margin(patched), direct=-margin(direct_rows), clean=clean, patched=patched,
        n_boot=n_boot, seed=seed,
    )
