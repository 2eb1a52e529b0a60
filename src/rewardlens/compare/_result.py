"""The result of `compare`: each model's side, the shared basis check, and the comparison."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data import chosen, margin, rejected
from ..hacking import Probes
from ..model.internal import finite_accuracy
from ..plotting import HtmlView
from ..stats import json_ready, summary_frame

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

EMBEDDING_MATCH = 0.99
"""Mean row cosine of the token-embedding matrices above which two models share a basis."""


@dataclass(frozen=True)
class ModelSide:
    """One model's results on the compared pairs (n pairs, L layers).

    `reward` [2n] (rows alternate chosen, rejected); `lens_linear`, `lens_normed` [n, L+1]
    chosen − rejected margin by depth (0 = embeddings); `crystallization_linear`,
    `crystallization_normed` [n] as l / L (NaN where the final margin is near zero); `profile`
    [L+1] the mean margin attribution written at each depth (embeddings, then attention + MLP of
    each layer), reward units; `probes` the probe run, when asked for; `near_zero` [n] the pairs whose
    final margin is too small to have a side (`Lens.near_zero_margin`).
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
    near_zero: np.ndarray

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
        return margin(self.reward)

    @property
    def accuracy(self) -> float:
        """Share of pairs with chosen > rejected, over the pairs with finite rewards (`finite_accuracy`)."""
        return finite_accuracy(self.margin)


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
class Comparison(HtmlView):
    """Two models on the same n pairs. CIs are 95% percentile bootstraps over pairs, (low, high), but for
    the accuracies, whose intervals are Wilson's.

    `spearman_reward` ranks all 2n rewards, `spearman_margin` the n margins; `agreement` is the
    share of pairs both models decide the same way; `accuracy_ci` [2, 2] is A's and B's (Wilson, over
    the finite margins).
    `depth_difference` [2] is the mean per-pair crystallization depth of B minus A (linear, normed
    lens; pairs where both are defined) with `depth_difference_ci` [2, 2]. `grid` [G] is a common
    relative-depth grid (the deeper model's depths) with both `profile_a`, `profile_b` [G]
    interpolated onto it. `formation_pairs` [2, n] is the seed paper's formation correlation per pair
    (`formation_correlation`: Pearson r of the two models' lens curves, each divided by its final
    margin, on the common grid; linear, then normed lens; NaN where either final margin is near zero
    or a curve is flat), `formation_correlation` [2] its mean over the defined pairs, with
    `formation_correlation_ci` [2, 2]. `probe_spearman` ranks the two probe profiles (per-axis mean effects; NaN
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
    formation_pairs: np.ndarray
    formation_correlation: np.ndarray
    formation_correlation_ci: np.ndarray
    probe_spearman: float
    basis: Basis
    readout_cosine: float
    residual_readout_cosine: float
    direction_cosine: np.ndarray

    @property
    def refused(self) -> str | None:
        """Why directions were not compared, or None when they were."""
        return self.basis.refused

    def to_frame(self) -> pd.DataFrame:
        """One row per pair: both models' rewards, margins and crystallization depths, and the pair's
        formation correlation (linear lens)."""
        import pandas as pd

        out: dict[str, Any] = {"pair": self.pair_ids}
        for s in (self.a, self.b):
            out |= {f"chosen_{s.label}": chosen(s.reward), f"rejected_{s.label}": rejected(s.reward),
                    f"margin_{s.label}": s.margin, f"crystallization_{s.label}": s.crystallization_linear}
        out["same_winner"] = np.sign(self.a.margin) == np.sign(self.b.margin)
        out["formation_correlation"] = self.formation_pairs[0]
        return pd.DataFrame(out)

    def depth_frame(self) -> pd.DataFrame:
        """One row per point of the common relative-depth grid: both attribution profiles and both
        mean linear-lens margins, interpolated."""
        import pandas as pd

        lens_on = lambda s: np.interp(self.grid, s.depth, s.lens_linear.mean(0))
        return pd.DataFrame({"depth": self.grid, f"profile_{self.a.label}": self.profile_a,
                             f"profile_{self.b.label}": self.profile_b, f"lens_{self.a.label}": lens_on(self.a),
                             f"lens_{self.b.label}": lens_on(self.b)})

    def probe_frame(self) -> pd.DataFrame | None:
        """One row per probe axis: each model's mean effect, CI and flag (None without probes)."""
        import pandas as pd

        if self.a.probes is None or self.b.probes is None:
            return None
        out: dict[str, Any] = {"axis": list(self.a.probes.axes)}
        for s, p in ((self.a, self.a.probes), (self.b, self.b.probes)):
            out |= {f"mean_{s.label}": p.mean, f"ci_low_{s.label}": p.ci_low, f"ci_high_{s.label}": p.ci_high,
                    f"flagged_{s.label}": p.flagged}
        return pd.DataFrame(out)

    def summary(self) -> pd.DataFrame:
        """One row per headline statistic (`stats.summary_frame`), indexed by its name (`quantity`, with the
        side's label in parentheses for a statistic of one side, e.g. 'accuracy (B)'): `value`, `low`,
        `high` (the 95% interval: Wilson's for `accuracy`, a percentile bootstrap over pairs for the rest;
        NaN where a statistic has none or is undefined, e.g. the direction cosines when `refused`), `n` (the
        pairs), `quantity`, `model` (a side's label; 'A vs B', with the two labels, for a statistic of the
        two; 'B − A' for a difference). The per-depth and per-axis numbers are in `depth_frame`,
        `probe_frame` and `to_dict`."""
        a, b = self.a, self.b
        both, diff, nan = f"{a.label} vs {b.label}", f"{b.label} − {a.label}", (float("nan"), float("nan"))
        med = lambda d: float(np.nanmedian(d)) if np.isfinite(d).any() else float("nan")
        rows: list[tuple[str, str, float, Sequence[float]]] = [
            ("spearman_reward", both, self.spearman_reward, self.spearman_reward_ci),
            ("spearman_margin", both, self.spearman_margin, self.spearman_margin_ci),
            ("same_winner", both, self.agreement, self.agreement_ci),
            *[("accuracy", s.label, s.accuracy, c) for s, c in zip((a, b), self.accuracy_ci)],
            *[(f"median_crystallization_{kind}", s.label, med(getattr(s, f"crystallization_{kind}")), nan)
              for kind in ("linear", "normed") for s in (a, b)],
            *[(f"crystallization_difference_{kind}", diff, self.depth_difference[k], self.depth_difference_ci[k])
              for k, kind in enumerate(("linear", "normed"))],
            ("attribution_profile_correlation", both, self.profile_correlation, nan),
            *[(f"formation_correlation_{kind}", both, self.formation_correlation[k], self.formation_correlation_ci[k])
              for k, kind in enumerate(("linear", "normed"))],
            ("probe_spearman", both, self.probe_spearman, nan),
            ("readout_cosine", both, self.readout_cosine, nan),
            ("residual_readout_cosine", both, self.residual_readout_cosine, nan),
        ]
        one_side = {a.label, b.label}
        return summary_frame([
            {"name": f"{q} ({m})" if m in one_side else q, "value": float(v), "low": float(c[0]),
             "high": float(c[1]), "n": len(self.pair_ids), "quantity": q, "model": m} for q, m, v, c in rows])

    def to_dict(self) -> dict[str, Any]:
        """Every number as a JSON-ready nested dict (NaN becomes None): what `rewardlens compare` writes."""
        ci = lambda c: [c[0], c[1]]
        med = lambda d: np.nanmedian(d) if np.isfinite(d).any() else None
        sides = (self.a, self.b)
        out = {
            "labels": [s.label for s in sides], "models": [s.model for s in sides], "n_pairs": len(self.pair_ids),
            "agreement": {
                "spearman_reward": {"value": (self.spearman_reward), "ci": ci(self.spearman_reward_ci)},
                "spearman_margin": {"value": (self.spearman_margin), "ci": ci(self.spearman_margin_ci)},
                "same_winner": {"value": (self.agreement), "ci": ci(self.agreement_ci)},
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
                    kind: {"mean": (self.depth_difference[k]), "ci": ci(self.depth_difference_ci[k])}
                    for k, kind in enumerate(("linear", "normed"))},
                "formation_correlation": {
                    kind: {"mean": (self.formation_correlation[k]), "ci": ci(self.formation_correlation_ci[k]),
                           "n_defined": int(np.isfinite(self.formation_pairs[k]).sum())}
                    for k, kind in enumerate(("linear", "normed"))},
            },
            "attribution": {"grid": self.grid.tolist(), self.a.label: self.profile_a.tolist(),
                            self.b.label: self.profile_b.tolist(), "correlation": (self.profile_correlation)},
            "probes": None,
            "directions": {
                "shared_basis": self.basis.shared, "refused": self.basis.refused,
                "checks": {"hidden": list(self.basis.hidden), "layers": list(self.basis.layers),
                           "same_vocabulary": self.basis.same_vocabulary,
                           "embedding_cosine": (self.basis.embedding_cosine), "threshold": EMBEDDING_MATCH},
                "readout_cosine": (self.readout_cosine),
                "residual_readout_cosine": (self.residual_readout_cosine),
                "by_depth": [{"depth": float(d), "cosine": (c)}
                             for d, c in zip(self.a.depth, self.direction_cosine)],
            },
        }
        if self.a.probes is not None and self.b.probes is not None:
            probed = ((self.a, self.a.probes), (self.b, self.b.probes))
            out["probes"] = {"spearman": (self.probe_spearman), "scale": {  # each side's flag floor's scale
                s.label: {"scale": p.scale, "source": p.scale_source, "min_effect": p.min_effect} for s, p in probed},
                "axes": [
                {"axis": axis, **{s.label: {"mean": (p.mean[j]), "flagged": bool(p.flagged[j]),
                                            "ci": ci((p.ci_low[j], p.ci_high[j]))} for s, p in probed}}
                for j, axis in enumerate(self.a.probes.axes)]}
        return json_ready(out)  # numpy values made Python ones, non-finite ones None

    def plot(self, ax: Sequence[Axes] | None = None) -> Figure:
        """Four panels: margins of B against A, mean lens margins and attribution profiles on relative
        depth, and the probe profiles (or, without probes, the direction cosines). `ax`: four axes in
        that order (e.g. `fig.subplots(2, 2)`) to draw into (their figure is returned), else a new
        2×2 figure."""
        from ..plotting import finish, panels

        flat, made = panels(ax, (2, 2), (10, 7), "Comparison.plot")
        margins, lens, profile, last = flat
        a, b = self.a, self.b
        margins.scatter(a.margin, b.margin, s=12)
        margins.axhline(0, color="gray", lw=0.6)
        margins.axvline(0, color="gray", lw=0.6)
        margins.set(xlabel=f"margin {a.label}", ylabel=f"margin {b.label}",
                    title=f"margins: Spearman {self.spearman_margin:.2f}, same winner {self.agreement:.0%}")
        for s, color in ((a, "tab:blue"), (b, "tab:orange")):
            lens.plot(s.depth, s.lens_linear.mean(0), color=color, marker="o", label=f"{s.label} linear")
            lens.plot(s.depth, s.lens_normed.mean(0), color=color, ls="--", label=f"{s.label} normed")
        lens.set(xlabel="relative depth l/L", ylabel="mean margin", title="lens")
        lens.legend(fontsize=7)
        profile.plot(self.grid, self.profile_a, marker="o", label=a.label)
        profile.plot(self.grid, self.profile_b, marker="o", label=b.label)
        profile.set(xlabel="relative depth l/L", ylabel="mean margin attribution",
                    title=f"attribution profile (r = {self.profile_correlation:.2f})")
        profile.legend(fontsize=7)
        if a.probes is not None and b.probes is not None:
            y = np.arange(len(a.probes.axes))
            for s, p, off in ((a, a.probes, -0.15), (b, b.probes, 0.15)):
                last.errorbar(p.mean, y + off, xerr=[p.mean - p.ci_low, p.ci_high - p.mean], fmt="o", capsize=2,
                              label=s.label)
            last.set_yticks(y, a.probes.axes)
            last.axvline(0, color="gray", lw=0.6)
            last.set(xlabel="probe effect (reward units)", title=f"probes (Spearman {self.probe_spearman:.2f})")
            last.legend(fontsize=7)
        elif self.basis.shared:
            last.plot(a.depth, self.direction_cosine, marker="o")
            last.set(xlabel="relative depth l/L", ylabel="cosine", ylim=(-1.05, 1.05),
                     title=f"chosen − rejected directions (read-out cosine {self.readout_cosine:.2f})")
        else:
            last.axis("off")
            last.text(0, 0.5, f"directions not compared:\n{self.basis.refused}", wrap=True, fontsize=8)
        return finish(margins, made)

