"""`compare`: two reward models on the same pairs, side by side.

Behaviour is compared for any two models: how their rewards and margins rank the pairs (Spearman,
with percentile bootstrap CIs over pairs), how often they pick the same winner, where each one's
preference crystallizes (the lens on relative depth l/L), how each spreads its margin over depth
(the exact sublayer attribution, aligned by relative depth), and optionally the probe profile.

Directions are compared only when both models write into the same residual basis: same hidden
size, same number of layers, the same tokenizer vocabulary and token-embedding matrices that
match (mean row cosine ≥ `EMBEDDING_MATCH`). A reward model fine-tuned from a backbone keeps its
embeddings almost unchanged and passes; a model trained from another initialisation does not,
even with the same shapes — a coordinate of its residual stream means something else, so a
cosine across the two would be a number without a meaning. When the check fails, `refused` says
which part failed and with what values; the behavioural comparison is still made.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from .attribution import attribute
from .concepts import _collect
from .data import Pair
from .errors import DataError
from .lens import lens
from .model.core import RewardModel
from .probes import Probes
from .stats import bootstrap_ci, spearman

EMBEDDING_MATCH = 0.99
"""Mean row cosine of the token-embedding matrices above which two models share a basis."""
_PART = re.compile(r"(?:attn|mlp)_L(\d+)")


@dataclass(frozen=True)
class ModelSide:
    """One model's results on the compared pairs (n pairs, L layers).

    `reward` [2n] (rows alternate chosen, rejected); `lens_linear`, `lens_normed` [n, L+1]
    chosen − rejected margin by depth (0 = embeddings); `crystallization_linear`,
    `crystallization_normed` [n] as l / L (NaN where the final margin is near zero); `profile`
    [L+1] the mean margin attribution written at each depth (embeddings, then attention + MLP of
    each layer), reward units; `probes` the probe run, when asked for.
    """

    label: str
    model: str
    reward: np.ndarray
    lens_linear: np.ndarray
    lens_normed: np.ndarray
    crystallization_linear: np.ndarray
    crystallization_normed: np.ndarray
    profile: np.ndarray
    probes: Probes | None

    @property
    def n_layers(self) -> int:
        return self.lens_linear.shape[1] - 1

    @property
    def depth(self) -> np.ndarray:
        """Relative depth l / L of each lens depth [L+1]."""
        return np.arange(self.n_layers + 1) / self.n_layers

    @property
    def margin(self) -> np.ndarray:
        """Chosen − rejected reward [n]."""
        return self.reward[0::2] - self.reward[1::2]

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.margin > 0))


@dataclass(frozen=True)
class Basis:
    """Whether two models share a residual basis, and the values each check saw.

    `refused` is None when shared, else every failed check with its values. `embedding_cosine`
    is the mean row cosine of the token embeddings (NaN when the shapes already differ).
    """

    hidden: tuple[int, int]
    layers: tuple[int, int]
    same_vocabulary: bool
    embedding_cosine: float
    refused: str | None

    @property
    def shared(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class Comparison:
    """Two models on the same n pairs. CIs are 95% percentile bootstraps over pairs, (low, high).

    `spearman_reward` ranks all 2n rewards, `spearman_margin` the n margins; `agreement` is the
    share of pairs both models decide the same way; `accuracy_ci` [2, 2] is A's and B's.
    `depth_difference` [2] is the mean per-pair crystallization depth of B minus A (linear, normed
    lens; pairs where both are defined) with `depth_difference_ci` [2, 2]. `grid` [G] is a common
    relative-depth grid (the deeper model's depths) with both `profile_a`, `profile_b` [G]
    interpolated onto it. `probe_spearman` ranks the two probe profiles (per-axis mean effects; NaN
    without probes). Direction results (NaN, or empty, when `basis.refused`): `readout_cosine` of the
    effective read-out rows (what the heads read from their final hidden state, combined by the
    readout; mean over inputs for heads whose rows depend on the input), `residual_readout_cosine`
    of the same pulled back through each model's final norm (the direction in the residual stream),
    `direction_cosine` [L+1] of the mean chosen − rejected residual difference at the read token,
    per depth (NaN where a mean difference is zero, e.g. embeddings when both sides end alike).
    """

    a: ModelSide
    b: ModelSide
    pair_ids: list[str]
    fraction: float
    spearman_reward: float
    spearman_reward_ci: tuple[float, float]
    spearman_margin: float
    spearman_margin_ci: tuple[float, float]
    agreement: float
    agreement_ci: tuple[float, float]
    accuracy_ci: np.ndarray
    depth_difference: np.ndarray
    depth_difference_ci: np.ndarray
    grid: np.ndarray
    profile_a: np.ndarray
    profile_b: np.ndarray
    profile_correlation: float
    probe_spearman: float
    basis: Basis
    readout_cosine: float
    residual_readout_cosine: float
    direction_cosine: np.ndarray

    @property
    def refused(self) -> str | None:
        """Why directions were not compared, or None when they were."""
        return self.basis.refused

    def to_frame(self):
        """One row per pair: both models' rewards, margins and crystallization depths."""
        import pandas as pd

        out = {"pair": self.pair_ids}
        for s in (self.a, self.b):
            out |= {f"chosen_{s.label}": s.reward[0::2], f"rejected_{s.label}": s.reward[1::2],
                    f"margin_{s.label}": s.margin, f"crystallization_{s.label}": s.crystallization_linear}
        out["same_winner"] = np.sign(self.a.margin) == np.sign(self.b.margin)
        return pd.DataFrame(out)

    def depth_frame(self):
        """One row per point of the common relative-depth grid: both attribution profiles and both
        mean linear-lens margins, interpolated."""
        import pandas as pd

        lens_on = lambda s: np.interp(self.grid, s.depth, s.lens_linear.mean(0))
        return pd.DataFrame({"depth": self.grid, f"profile_{self.a.label}": self.profile_a,
                             f"profile_{self.b.label}": self.profile_b, f"lens_{self.a.label}": lens_on(self.a),
                             f"lens_{self.b.label}": lens_on(self.b)})

    def probe_frame(self):
        """One row per probe axis: each model's mean effect, CI and flag (None without probes)."""
        import pandas as pd

        if self.a.probes is None or self.b.probes is None:
            return None
        out = {"axis": list(self.a.probes.axes)}
        for s in (self.a, self.b):
            p = s.probes
            out |= {f"mean_{s.label}": p.mean, f"ci_low_{s.label}": p.ci_low, f"ci_high_{s.label}": p.ci_high,
                    f"flagged_{s.label}": p.flagged}
        return pd.DataFrame(out)

    def summary(self) -> dict:
        """Every number as a JSON-ready dict (NaN becomes None)."""
        ci = lambda c: [_num(c[0]), _num(c[1])]
        med = lambda d: _num(np.nanmedian(d)) if np.isfinite(d).any() else None
        sides = (self.a, self.b)
        out = {
            "labels": [s.label for s in sides], "models": [s.model for s in sides], "n_pairs": len(self.pair_ids),
            "agreement": {
                "spearman_reward": {"value": _num(self.spearman_reward), "ci": ci(self.spearman_reward_ci)},
                "spearman_margin": {"value": _num(self.spearman_margin), "ci": ci(self.spearman_margin_ci)},
                "same_winner": {"value": _num(self.agreement), "ci": ci(self.agreement_ci)},
                "accuracy": {s.label: {"value": s.accuracy, "ci": ci(c)} for s, c in zip(sides, self.accuracy_ci)},
            },
            "lens": {
                "fraction": self.fraction,
                "models": {s.label: {
                    "n_layers": s.n_layers, "depth": s.depth.tolist(),
                    "mean_linear_margin": s.lens_linear.mean(0).tolist(),
                    "mean_normed_margin": s.lens_normed.mean(0).tolist(),
                    "median_crystallization_linear": med(s.crystallization_linear),
                    "median_crystallization_normed": med(s.crystallization_normed)} for s in sides},
                "crystallization_difference": {
                    kind: {"mean": _num(self.depth_difference[k]), "ci": ci(self.depth_difference_ci[k])}
                    for k, kind in enumerate(("linear", "normed"))},
            },
            "attribution": {"grid": self.grid.tolist(), self.a.label: self.profile_a.tolist(),
                            self.b.label: self.profile_b.tolist(), "correlation": _num(self.profile_correlation)},
            "probes": None,
            "directions": {
                "shared_basis": self.basis.shared, "refused": self.basis.refused,
                "checks": {"hidden": list(self.basis.hidden), "layers": list(self.basis.layers),
                           "same_vocabulary": self.basis.same_vocabulary,
                           "embedding_cosine": _num(self.basis.embedding_cosine), "threshold": EMBEDDING_MATCH},
                "readout_cosine": _num(self.readout_cosine),
                "residual_readout_cosine": _num(self.residual_readout_cosine),
                "by_depth": [{"depth": float(d), "cosine": _num(c)}
                             for d, c in zip(self.a.depth, self.direction_cosine)],
            },
        }
        if self.a.probes is not None and self.b.probes is not None:
            out["probes"] = {"spearman": _num(self.probe_spearman), "axes": [
                {"axis": axis, **{s.label: {"mean": _num(s.probes.mean[j]), "flagged": bool(s.probes.flagged[j]),
                                            "ci": ci((s.probes.ci_low[j], s.probes.ci_high[j]))} for s in sides}}
                for j, axis in enumerate(self.a.probes.axes)]}
        return out

    def plot(self):
        """A 2×2 figure: margins of B against A, mean lens margins and attribution profiles on
        relative depth, and the probe profiles (or, without probes, the direction cosines)."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(2, 2, figsize=(10, 7))
        a, b = self.a, self.b
        ax[0, 0].scatter(a.margin, b.margin, s=12)
        ax[0, 0].axhline(0, color="gray", lw=0.6)
        ax[0, 0].axvline(0, color="gray", lw=0.6)
        ax[0, 0].set(xlabel=f"margin {a.label}", ylabel=f"margin {b.label}",
                     title=f"margins: Spearman {self.spearman_margin:.2f}, same winner {self.agreement:.0%}")
        for s, color in ((a, "tab:blue"), (b, "tab:orange")):
            ax[0, 1].plot(s.depth, s.lens_linear.mean(0), color=color, marker="o", label=f"{s.label} linear")
            ax[0, 1].plot(s.depth, s.lens_normed.mean(0), color=color, ls="--", label=f"{s.label} normed")
        ax[0, 1].set(xlabel="relative depth l/L", ylabel="mean margin", title="lens")
        ax[0, 1].legend(fontsize=7)
        ax[1, 0].plot(self.grid, self.profile_a, marker="o", label=a.label)
        ax[1, 0].plot(self.grid, self.profile_b, marker="o", label=b.label)
        ax[1, 0].set(xlabel="relative depth l/L", ylabel="mean margin attribution",
                     title=f"attribution profile (r = {self.profile_correlation:.2f})")
        ax[1, 0].legend(fontsize=7)
        if a.probes is not None and b.probes is not None:
            y = np.arange(len(a.probes.axes))
            for s, off in ((a, -0.15), (b, 0.15)):
                p = s.probes
                ax[1, 1].errorbar(p.mean, y + off, xerr=[p.mean - p.ci_low, p.ci_high - p.mean], fmt="o", capsize=2,
                                  label=s.label)
            ax[1, 1].set_yticks(y, a.probes.axes)
            ax[1, 1].axvline(0, color="gray", lw=0.6)
            ax[1, 1].set(xlabel="probe effect (reward units)", title=f"probes (Spearman {self.probe_spearman:.2f})")
            ax[1, 1].legend(fontsize=7)
        elif self.basis.shared:
            ax[1, 1].plot(a.depth, self.direction_cosine, marker="o")
            ax[1, 1].set(xlabel="relative depth l/L", ylabel="cosine", ylim=(-1.05, 1.05),
                         title=f"chosen − rejected directions (read-out cosine {self.readout_cosine:.2f})")
        else:
            ax[1, 1].axis("off")
            ax[1, 1].text(0, 0.5, "directions not compared:\n" + self.basis.refused, wrap=True, fontsize=8)
        fig.tight_layout()
        return fig


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _side(model: RewardModel, pairs: list[Pair], label: str, fraction: float, probes: bool, probe_items,
          seed: int, n_boot: int, batch_size: int) -> ModelSide:
    """Lens and sublayer attribution of every pair (one batched pass each), probes if asked."""
    ln = lens(model, pairs, batch_size=batch_size)
    att = attribute(model, pairs, level="sublayer", batch_size=batch_size, per_objective=False)
    profile = np.zeros(model.n_layers + 1)
    for name, column in zip(att.names, att.margin.mean(0)):
        found = _PART.fullmatch(name)
        profile[0 if found is None else int(found.group(1)) + 1] += column
    pr = None
    if probes:
        from .probes import probe

        pr = probe(model, probe_items, seed=seed, n_boot=n_boot, batch_size=batch_size)
    return ModelSide(label=label, model=repr(model), reward=att.reward, lens_linear=ln.margin("linear"),
                     lens_normed=ln.margin("normed"), crystallization_linear=ln.crystallization("linear", fraction),
                     crystallization_normed=ln.crystallization("normed", fraction), profile=profile, probes=pr)


def _embeddings(model: RewardModel) -> torch.Tensor | None:
    try:
        weight = model.model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return None
    return None if weight.is_meta else weight.detach()


def shared_basis(a: RewardModel, b: RewardModel, threshold: float = EMBEDDING_MATCH) -> Basis:
    """Run the structural checks (module docstring) on two models; see `Basis`."""
    hidden, layers = (a.d_model, b.d_model), (a.n_layers, b.n_layers)
    same_vocab = a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    why = []
    if hidden[0] != hidden[1]:
        why.append(f"hidden sizes differ: {hidden[0]} vs {hidden[1]}")
    if layers[0] != layers[1]:
        why.append(f"layer counts differ: {layers[0]} vs {layers[1]}")
    if not same_vocab:
        why.append(f"tokenizer vocabularies differ ({len(a.tokenizer.get_vocab())} vs "
                   f"{len(b.tokenizer.get_vocab())} entries, or the same size with other ids)")
    ea, eb = _embeddings(a), _embeddings(b)
    cos = float("nan")
    if ea is None or eb is None:
        why.append("a token-embedding matrix is not readable (no get_input_embeddings, or offloaded)")
    elif ea.shape != eb.shape:
        why.append(f"token-embedding matrices differ in shape: {tuple(ea.shape)} vs {tuple(eb.shape)}")
    else:
        # In chunks, in fp32 on the CPU: two 128k × 4096 matrices need not be copied whole.
        cosines = []
        for start in range(0, ea.shape[0], 8192):
            x, y = (e[start : start + 8192].float().cpu() for e in (ea, eb))
            nx, ny = x.norm(dim=1), y.norm(dim=1)
            c = (x * y).sum(1) / (nx * ny).clamp_min(1e-30)
            cosines.append(torch.where((nx == 0) & (ny == 0), torch.ones_like(c), c))  # unused rows match
        cos = float(torch.cat(cosines).mean())
        if not cos >= threshold:
            why.append(f"token embeddings differ: mean row cosine {cos:.3f} < {threshold}")
    refused = None
    if why:
        refused = "; ".join(why) + " — residual directions live in different spaces; compare behaviour only"
    return Basis(hidden, layers, same_vocab, cos, refused)


def _cosine(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise cosine of [..., d] arrays (NaN where a row is zero)."""
    norm = np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (x * y).sum(-1) / norm, np.nan)


def _directions(model: RewardModel, pairs: list[Pair], batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean chosen − rejected residual at t* per depth [L+1, d], effective read-out rows [2n, d],
    the same pulled back through the final norm [2n, d]) from one batched pass."""
    labels = ["embed", *map(str, range(model.n_layers))]
    resid, readout = _collect(model, model.encode(pairs)[0], labels, batch_size)
    residual_readout = readout
    if model.arch.final_norm is not None:  # pre-norm: the last layer's output is the final norm's input
        residual_readout = model.norm(model.arch.final_norm).pullback(readout[:, None], resid[:, -1])[0][:, 0]
    diff = (resid[0::2] - resid[1::2]).mean(0)
    return diff.cpu().numpy(), readout.cpu().numpy(), residual_readout.cpu().numpy()


def _interval(stat, n: int, n_boot: int, seed: int) -> tuple[float, float]:
    """Bootstrap CI of `stat(pair indices)` resampling pairs (stats.bootstrap_ci over the indices)."""
    return bootstrap_ci(np.arange(n, dtype=np.float64), stat=lambda idx: stat(idx.astype(int)), n_boot=n_boot,
                        seed=seed)


def compare(
    model_a: RewardModel | str | os.PathLike,
    model_b: RewardModel | str | os.PathLike,
    pairs: Sequence[Pair],
    *,
    labels: tuple[str, str] = ("A", "B"),
    fraction: float = 0.5,
    probes: bool = False,
    probe_items: Sequence | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    batch_size: int = 8,
) -> Comparison:
    """Compare two reward models on the same preference `pairs`; returns a `Comparison`.

    Models may be `RewardModel`s or folders / hub ids (opened with `rewardlens.load`). `fraction`:
    crystallization threshold (share of the final margin). `probes`: also run `rewardlens.probe`
    on both (on `probe_items`, default the built-in items). Every analysis runs batched over all
    pairs; directions are compared only when `shared_basis` accepts the two models.
    """
    from .loading import load

    pairs = list(pairs)
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        kinds = sorted({type(p).__name__ for p in pairs})
        raise DataError(f"compare needs a non-empty list of rewardlens.Pair (margins need both sides), got "
                        f"{len(pairs)} items of type {kinds}; load them with rewardlens.load_pairs")
    if len(labels) != 2 or labels[0] == labels[1] or not 0 < fraction <= 1 or n_boot < 1:
        raise ValueError(f"need two different labels, fraction in (0, 1] and n_boot >= 1; got labels={labels!r}, "
                         f"fraction={fraction}, n_boot={n_boot}")
    ma, mb = (m if isinstance(m, RewardModel) else load(str(m)) for m in (model_a, model_b))
    a = _side(ma, pairs, labels[0], fraction, probes, probe_items, seed, n_boot, batch_size)
    # The same object twice (a sanity baseline) needs no second run.
    b = replace(a, label=labels[1]) if mb is ma else _side(mb, pairs, labels[1], fraction, probes, probe_items,
                                                            seed, n_boot, batch_size)
    n = len(pairs)
    rows = lambda idx: np.stack([2 * idx, 2 * idx + 1], 1).ravel()
    same = (np.sign(a.margin) == np.sign(b.margin)).astype(np.float64)
    diff = np.stack([b.crystallization_linear - a.crystallization_linear,
                     b.crystallization_normed - a.crystallization_normed])
    diff_mean = np.array([np.nanmean(d) if np.isfinite(d).any() else np.nan for d in diff])
    grid = np.linspace(0.0, 1.0, max(a.n_layers, b.n_layers) + 1)
    profile_a, profile_b = np.interp(grid, a.depth, a.profile), np.interp(grid, b.depth, b.profile)
    probe_rho = float("nan")
    if probes:
        probe_rho = spearman(a.probes.mean, b.probes.mean)
    basis = shared_basis(ma, mb)
    readout_cos = residual_cos = float("nan")
    direction_cos = np.array([])
    if basis.shared:
        diff_a, read_a, rread_a = _directions(ma, pairs, batch_size)
        diff_b, read_b, rread_b = _directions(mb, pairs, batch_size)
        readout_cos = float(np.nanmean(_cosine(read_a, read_b)))
        residual_cos = float(np.nanmean(_cosine(rread_a, rread_b)))
        direction_cos = _cosine(diff_a, diff_b)
    return Comparison(
        a=a, b=b, pair_ids=[p.id if p.id is not None else str(i) for i, p in enumerate(pairs)], fraction=fraction,
        spearman_reward=spearman(a.reward, b.reward),
        spearman_reward_ci=_interval(lambda i: spearman(a.reward[rows(i)], b.reward[rows(i)]), n, n_boot, seed),
        spearman_margin=spearman(a.margin, b.margin),
        spearman_margin_ci=_interval(lambda i: spearman(a.margin[i], b.margin[i]), n, n_boot, seed),
        agreement=float(same.mean()), agreement_ci=bootstrap_ci(same, n_boot=n_boot, seed=seed),
        accuracy_ci=np.array([bootstrap_ci((s.margin > 0).astype(np.float64), n_boot=n_boot, seed=seed)
                              for s in (a, b)]),
        depth_difference=diff_mean, depth_difference_ci=np.array([bootstrap_ci(d, n_boot=n_boot, seed=seed)
                                                                  for d in diff]),
        grid=grid, profile_a=profile_a, profile_b=profile_b,
        profile_correlation=_pearson(profile_a, profile_b), probe_spearman=probe_rho, basis=basis,
        readout_cosine=readout_cos, residual_readout_cosine=residual_cos, direction_cosine=direction_cos,
    )


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r of two profiles; NaN when either is constant (no shape to correlate)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
