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
- indirect = total − direct: what the layers after `l` add in response;
- total_approx: the first-order estimate of total, `−Σ_i (f'_i − f_i)(g · d_i)` per side with `g = ∂r/∂x`
  at `t*` (attribution patching over features, `_total.py`: one backward per batch for every edit).

A *group* `g` of features is edited jointly, in one copy: its edit at the read token is
`Σ_{i ∈ g} (f_i − f'_i) d_i`. Its direct effect is the sum of its members' direct effects and its
attribution the sum of theirs (both exact: the read-out is linear in `x`); its total effect is
measured, so total − direct is what the later layers add in response to the joint edit. A rule
split over co-firing features is only removed by removing them together. The empty group edits
nothing: its rewards are the clean ones, its effects 0 (the identity the splice rests on).

Modes: 'ablate' (`f' = 0`, both sides), 'clamp' (`f' = value`, both sides) and 'noising' (the
chosen run takes the rejected side's activation of the feature at *its* read token, the one token
each side's reward is read at; the rejected run is left alone). Every edit (one feature or one
group) of an input runs as one row of a batch of copies, `batch_size` rows at a time, each copy
stepped from the layer after the SAE's from the recorded clean residual (`_splice`), not one full
forward per edit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
import torch

from .. import _deprecated
from ..data import Pair, effect, margin, pair_ids, rejected
from ..data.internal import interleave, is_chosen
from ..errors import DataError, warn
from ..model import RewardModel
from ..plotting import HtmlView
from ..stats import bootstrap_ci, rowwise_spearman, top_parts
from ._attribution import FeatureAttribution, attribute_with_readout, check_width
from ._autoencoder import TopKSAE
from ._splice import check_single_read, clean_rewards, each_edit_batch, edited_rewards
from ._total import FeatureTotals, feature_totals

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FeatureMode = Literal["ablate", "clamp", "noising"]
FeatureRank = Literal["direct", "total_approx"]
DEFAULT_FEATURES = 16
"""Features patched when none are named: the top ones by mean |margin contribution| (direct, or first-order total)."""
EMPTY_GROUP = "none"
"""The empty group's name: the edit of no feature."""


def group_name(members: Sequence[int]) -> str:
    """A group's column name: its latent ids joined by '+' in the order given ('173+88+12'; '173' alone;
    `EMPTY_GROUP` for none)."""
    return "+".join(str(int(i)) for i in members) or EMPTY_GROUP


@dataclass(frozen=True)
class FeaturePatch(HtmlView):
    """Effects of each edit at `layer`, per pair [n_pairs, F]: one column per feature (`features=`) or per
    group of features edited jointly (`groups=`).

    `features` [F]: each column's latent id for a call by features; for a call by groups, the first
    member of each group, −1 for the empty group (`groups` and `names` say what a column is). `groups`:
    each column's member ids (one-member groups for a call by features); `grouped`: whether the call was by groups.
    `attribution`: the column's direct contribution to the clean margin (`FeatureAttribution.margin`,
    summed over a group's members); `total`, `direct`: clean margin − patched margin, with later
    layers recomputing and through the frozen read-out; `indirect` = total − direct. `clean`
    [2·n_pairs] the model's own rewards (interleaved chosen, rejected); `patched` [2·n_pairs, F] the
    rewards with one column edited (the side an edit leaves alone keeps its clean reward). `edit`,
    `value` say what `f'` was. `total_approx` [n_pairs, F]: the first-order estimate of `total`
    (module docstring; None when not asked for).
    """

    _html_top_names = ("feature", "mean total effect")

    layer: int
    features: np.ndarray
    edit: FeatureMode
    value: float | None
    pair_ids: list[str]
    attribution: np.ndarray
    total: np.ndarray
    direct: np.ndarray
    clean: np.ndarray
    patched: np.ndarray
    groups: tuple[tuple[int, ...], ...] = ()
    grouped: bool = False
    n_boot: int = 2000
    seed: int = 0
    total_approx: np.ndarray | None = None

    @property
    def names(self) -> list[str]:
        """Each column's name [F]: its latent id, or a group's ids joined by '+' (`group_name`)."""
        return [group_name(g) for g in self.groups] if self.groups else [str(int(i)) for i in self.features]

    def _label(self, j: int) -> int | str:
        """Column `j`'s label: its latent id for a call by features, its name for a call by groups."""
        return self.names[j] if self.grouped else int(self.features[j])

    @property
    def mode(self) -> FeatureMode:
        """`edit`'s deprecated name (one release)."""
        _deprecated.warn("FeaturePatch.mode", "rewardlens.sae.FeaturePatch:edit", stacklevel=3)
        return self.edit

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
        """(mean ρ over the pairs with a defined ρ, bootstrap interval low, high); NaN if none is defined, the
        interval NaN with one. Either NaN comes with a `RewardLensWarning` giving `faithfulness_note`."""
        rho = self.rho[np.isfinite(self.rho)]
        if self.faithfulness_note:
            warn(f"feature_patch faithfulness: {self.faithfulness_note}")
        if not len(rho):
            return math.nan, math.nan, math.nan
        lo, hi = bootstrap_ci(rho, n_boot=self.n_boot, seed=self.seed)
        return float(rho.mean()), lo, hi

    @property
    def faithfulness_note(self) -> str:
        """Why `faithfulness()` is NaN (its mean, or only its interval), with the fix; '' when it is defined.

        ρ ranks the columns, so it needs two; a pair's ρ is undefined where its attribution or its total
        effect is the same in every column (features that never fired there: both 0); the interval
        resamples pairs, so it needs two with a defined ρ."""
        n, f = self.total.shape
        if f < 2:
            return (f"ρ(attribution, total) ranks the patched columns and there is {f}, so it is undefined (NaN); "
                    f"patch at least 2 features or groups (features=None patches the top {DEFAULT_FEATURES})")
        defined = int(np.isfinite(self.rho).sum())
        if defined == 0:
            flat = "attribution or total effect is the same for every column (features that never fired: both 0)"
            return (f"on all {n} pair(s) the {flat}, so ρ is undefined on every pair and the mean is NaN; patch "
                    f"features that fire on these pairs (features=None picks the top {DEFAULT_FEATURES} by |margin "
                    "contribution|)")
        if defined < 2:
            return (f"ρ is defined on {defined} of {n} pair(s) (on the others attribution or total is the same in "
                    "every column), and a bootstrap interval over pairs needs 2, so the interval is NaN; pass more "
                    "pairs")
        return ""

    def top(self, k: int = 10) -> list[tuple[int | str, float]]:
        """`k` (latent id, or group name for a call by groups; mean total effect) with the largest mean
        |total effect| over pairs (`stats.top_parts`, the ranking of every table of top parts)."""
        return [(self._label(int(i)), float(self.total[:, i].mean())) for i in top_parts(self.total, k)]

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (pair, column) with attribution, total, direct and indirect effect (and
        total_approx); `feature` is the latent id (a call by features) or the group's name (a call by groups)."""
        import pandas as pd

        n, f = self.total.shape
        labels = np.array(self.names if self.grouped else self.features)
        approx = {} if self.total_approx is None else {"total_approx": self.total_approx.ravel()}
        return pd.DataFrame({"pair": np.repeat(self.pair_ids, f), "feature": np.tile(labels, n),
                             "attribution": self.attribution.ravel(), "total": self.total.ravel(),
                             "direct": self.direct.ravel(), "indirect": self.indirect.ravel(), **approx})

    def plot(self, n: int = 20, ax: Axes | None = None) -> Figure:
        """Mean total and direct effect of the top `n` features (by mean |total|), side by side; into
        `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        top = [int(i) for i in top_parts(self.total, n)][::-1]
        ax, made = one_panel(ax, (6, 0.35 * len(top) + 1.2))
        y = np.arange(len(top))
        ax.barh(y + 0.2, self.total[:, top].mean(0), height=0.4, color="tab:blue", label="total")
        ax.barh(y - 0.2, self.direct[:, top].mean(0), height=0.4, color="tab:gray", label="direct")
        ax.set_yticks(y, [f"{'group' if self.grouped else 'feature'} {self._label(i)}" for i in top], fontsize=7)
        ax.axvline(0, color="black", lw=0.8)
        mean, lo, hi = self.faithfulness()
        ax.set_title(f"{self.edit} at layer {self.layer}: ρ(attribution, total) {mean:.2f} [{lo:.2f}, {hi:.2f}]",
                     fontsize=9)
        ax.set_xlabel("mean effect on the margin (clean − patched, reward units)")
        ax.legend(fontsize=7)
        return finish(ax, made)


def _check_features(sae: TopKSAE, features: Sequence[int], what: str = "features") -> np.ndarray:
    """`features` as int64 latent ids [F], each in range and named once (`what` names the argument)."""
    ids = np.asarray(list(features))
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"{what} are latent ids (integers), got {list(features)[:5]!r}; pass e.g. features=[3, 17]")
    ids = ids.astype(np.int64)
    bad = ids[(ids < 0) | (ids >= sae.n_latents)]
    if bad.size:
        raise DataError(f"feature {int(bad[0])} is out of range for an SAE with {sae.n_latents} latents; "
                        f"pass latent ids in 0..{sae.n_latents - 1}")
    if len(np.unique(ids)) != len(ids):
        raise DataError(f"{what} {ids.tolist()} name a latent twice; pass each latent id once")
    return ids


def _check_groups(sae: TopKSAE, groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Each group's member ids: at least one group, members in range and named once per group (one latent may
    sit in several groups: each group is its own edit; the empty group is the edit of nothing)."""
    if isinstance(groups, (str, bytes)) or not len(groups):
        raise DataError(f"groups= is a list of groups of latent ids, got {groups!r}; pass e.g. groups=[[3, 17], [5]]")
    out = []
    for j, group in enumerate(groups):
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence | np.ndarray):
            raise DataError(f"group {j} must be a list of latent ids, got {group!r}; pass e.g. groups=[[3, 17], [5]]")
        out.append(tuple(int(i) for i in _check_features(sae, group, what=f"group {j}")))
    return tuple(out)


def _check(model: RewardModel, sae: TopKSAE, pairs: Sequence[Pair], layer: int, mode: str,
           value: float | None) -> None:
    if not isinstance(sae, TopKSAE):
        raise DataError(f"sae must be a rewardlens.sae.TopKSAE (load one with load_sae), got {type(sae).__name__}")
    check_width(model, sae, layer)
    check_single_read(model, "feature_patch")
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        raise DataError("feature_patch compares the two sides of preference pairs: pass a list of rewardlens.Pair")
    if mode not in get_args(FeatureMode):
        raise DataError(f"edit must be 'ablate', 'clamp' or 'noising', got {mode!r}", option="edit")
    if mode == "clamp" and (value is None or not math.isfinite(float(value))):
        raise DataError(f"edit='clamp' needs a finite value= to set the features to, got {value!r}")
    if mode != "clamp" and value is not None:
        raise DataError(f"value= is the clamp level; edit={mode!r} takes none (got {value!r}): drop it or use "
                        "edit='clamp'")


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
    # The chosen run takes the rejected side's activation at its read token; the rejected run is not edited.
    return interleave(rejected(acts), rejected(acts)), is_chosen(n)


def _rewards(model: RewardModel, pairs: Sequence[Pair], layer: int, delta: np.ndarray, edited: np.ndarray,
             W: torch.Tensor, member: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(clean rewards [n], rewards with one column edited [n, G]): the edit `Σ_u member[g, u] delta[r, u] W[u]`
    [d] added at `t*` of row r for column g (`member` [G, U] 0/1 over the latents `W` [U, d]). Rows not
    `edited`, and columns of no member (the empty group), keep their clean reward (they are not run)."""
    seqs, _ = model.encode(pairs)
    clean = np.zeros(len(seqs))
    for rows, batch in model.batches(seqs, batch_size):
        clean[rows] = clean_rewards(model, batch).double().cpu().numpy()
    patched = np.repeat(clean[:, None], len(member), 1)
    live = np.flatnonzero(member.any(1))  # the columns that edit something
    step = torch.as_tensor(delta, dtype=torch.float32, device=model.device)
    mask = torch.as_tensor(member[live], dtype=torch.float32, device=model.device)
    for rows, big, part in each_edit_batch(model, seqs, np.flatnonzero(edited), len(live), batch_size):
        # [b, g, U] @ [U, d]: a one-member group adds exact zeros, so it is the single-feature edit bit for bit.
        add = (step[torch.as_tensor(rows, device=model.device)][:, None] * mask[part][None]) @ W  # [b, g, d]
        got = edited_rewards(model, big, layer, add.flatten(0, 1)).double().cpu().numpy()
        patched[rows[:, None], live[part][None]] = got.reshape(len(rows), -1)
    return clean, patched


def _columns(sae: TopKSAE, ranking: FeatureAttribution | FeatureTotals, features: Sequence[int] | None,
             groups: Sequence[Sequence[int]] | None) -> tuple[tuple[int, ...], ...]:
    """Each column's member ids: the groups given, or one-member groups of `features` (default: the top
    `DEFAULT_FEATURES` of `ranking` by mean |margin|)."""
    if groups is not None:
        if features is not None:
            raise DataError("pass features= (one edit per feature) or groups= (one joint edit per group), not both")
        return _check_groups(sae, groups)
    if features is None:
        features = [latent for latent, _ in ranking.top(DEFAULT_FEATURES, by="margin")]
    elif not len(features):
        raise DataError("features=[] names no latent, so there is no column to patch; pass latent ids, "
                        f"features=None for the top {DEFAULT_FEATURES}, or groups=[[]] for the empty edit (the clean "
                        "reward)")
    return tuple((int(i),) for i in _check_features(sae, features))


def feature_patch(model: RewardModel, sae: TopKSAE, pairs: Sequence[Pair], *, layer: int,
                  features: Sequence[int] | None = None, groups: Sequence[Sequence[int]] | None = None,
                  edit: FeatureMode = "ablate", value: float | None = None, rank: FeatureRank = "direct",
                  approx: bool = False, batch_size: int = 16, n_boot: int = 2000, seed: int = 0,
                  mode: FeatureMode | None = None) -> FeaturePatch:
    """Edit each SAE feature (or each group of features, jointly) at the residual after `layer` and measure
    the margin's total, direct and indirect change (module docstring); error term kept.

    `features`: latent ids, one edit each (default: the `DEFAULT_FEATURES` with the largest mean
    |margin| by `rank`: 'direct', the margin contribution, or 'total_approx', the first-order total
    effect of ablating it, which finds features that act through later layers). `groups`: instead,
    lists of latent ids, each list one joint edit (its column named e.g. '173+88+12'; `[]` the empty
    edit). `edit`: 'ablate', 'clamp' (with a finite `value`, every member set to it) or 'noising' (`mode` is
    its deprecated name, one release: a mode is a patch mode, docs/design.md "Words").
    `approx`: also the first-order estimate `total_approx` of every column (one more forward and backward
    per batch; free with `rank='total_approx'`, which computes it anyway).
    `batch_size`: rows per forward (inputs × edits); 1 runs every edit on its own. One attribution pass
    (for `f`, `u_l` and the attribution), then the edited forwards.
    """
    edit = _deprecated.renamed("feature_patch", "mode", "edit", mode, edit)
    _check(model, sae, pairs, layer, edit, value)
    if rank not in get_args(FeatureRank):
        raise DataError(f"rank must be 'direct' or 'total_approx', got {rank!r}")
    att, readout = attribute_with_readout(model, sae, pairs, layer=layer, batch_size=batch_size)
    by_totals = rank == "total_approx" and features is None and groups is None
    totals = feature_totals(model, sae, pairs, layer=layer, batch_size=batch_size) if approx or by_totals else None
    cols = _columns(sae, totals if by_totals and totals is not None else att, features, groups)
    ids = np.array(sorted({i for g in cols for i in g}), dtype=np.int64)  # every member once [U]
    member = np.array([np.isin(ids, g) for g in cols], dtype=np.float64).reshape(len(cols), len(ids))  # [G, U]
    acts, vals = _dense(att, ids)
    new, edited = _targets(acts, edit, value)
    W = sae.W_dec.detach().to(model.device, torch.float32)[torch.as_tensor(ids, device=model.device)]  # [U, d]
    Wd = W.double().cpu().numpy()
    delta = np.where(edited[:, None], new - acts, 0.0)
    # Change of each side's reward read through the frozen read-out u_l (direct), or to first order through
    # the gradient g (total_approx), summed per group.
    direct_rows = (delta * (readout.astype(np.float64) @ Wd.T)) @ member.T
    approx_rows = None
    if totals is not None:
        approx_rows = (delta * (totals.gradient.astype(np.float64) @ Wd.T)) @ member.T
    clean, patched = _rewards(model, pairs, layer, delta, edited, W, member, batch_size)
    return FeaturePatch(
        layer=layer, features=np.array([g[0] if g else -1 for g in cols], dtype=np.int64), edit=edit,
        value=None if value is None else float(value), pair_ids=pair_ids(pairs), attribution=margin(vals) @ member.T,
        total=effect(margin(clean), margin(patched)), direct=effect(0.0, margin(direct_rows)), clean=clean,
        patched=patched, groups=cols, grouped=groups is not None, n_boot=n_boot, seed=seed,
        total_approx=None if approx_rows is None else effect(0.0, margin(approx_rows)),
    )
