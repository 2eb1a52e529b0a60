"""Feature cards: what one SAE feature rewards, read off a corpus and a feature attribution.

A card holds, for one latent `i` at layer `l`:
- its strongest contexts in a corpus, each a token window with the feature's activation `f_i` on
  every token (the tokens as the tokenizer splits them);
- its direct write along the read-out, `u_l · d_i` (reward units per unit of activation, the
  attribution's own `values / activations`), and `cos(d_i, ū)`;
- its mean activation at the read position on chosen and rejected responses, and the mean paired
  difference with a percentile-bootstrap interval over pairs (`rewardlens.stats.bootstrap_ci`);
- its Spearman ρ with each caller-given per-sequence (or per-pair) score (`axes`);
- its causal `effect`, left None here and filled by whoever measures it (`FeatureCards.with_effects`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..data import Inputs, side
from ..errors import DataError
from ..model import RewardModel
from ..plotting import HtmlView
from ..stats import bootstrap_ci, spearman, summary_frame, to_json
from ._attribution import FeatureAttribution

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


ScoreKind = Literal["margin", "mean", "total_approx"]
"""What a card's score is: the direct margin or mean contribution, or the first-order total effect (`FeatureTotals`)."""


@dataclass(frozen=True)
class Context:
    """Where a feature fired: the token window `text` (the firing token in «»), the `activation`,
    the corpus row `input` and the token `position` in it.

    `tokens` [W]: the window's tokens as the tokenizer splits them (each id decoded alone), and
    `values` [W]: the feature's activation on each (NaN on a token the corpus pass did not read:
    a decoder's skipped first token, or every token but the read one with positions='read');
    `peak` is the firing token's index in `tokens`.
    """

    text: str
    activation: float
    input: int
    position: int
    tokens: tuple[str, ...] = ()
    values: tuple[float, ...] = ()
    peak: int = 0


@dataclass(frozen=True)
class FeatureCard:
    """What feature `feature` at `layer` rewards (see the module docstring for each number).

    `score`: the ranking score (`score_kind`: 'margin', the mean chosen − rejected direct contribution;
    'mean', the mean contribution; 'total_approx', the first-order total effect of ablating the feature,
    `FeatureTotals`, chosen − rejected for pairs; reward units). `write`: `u_l · d_i` averaged over the
    attribution's inputs where the feature fired at the read position. `chosen`, `rejected`: mean activation at the read
    position; `difference`: mean of chosen − rejected per pair, `difference_ci` its 95% interval
    (NaN without pairs). `correlations`: axis name → Spearman ρ (NaN where undefined).
    `note` says why a card is empty (no context).
    """

    feature: int
    layer: int
    score: float
    score_kind: ScoreKind
    alignment: float
    write: float
    frequency: float
    contexts: tuple[Context, ...]
    chosen: float
    rejected: float
    difference: float
    difference_ci: tuple[float, float]
    correlations: dict[str, float] = field(default_factory=dict)
    effect: float | None = None
    note: str = ""

    def summary(self) -> pd.DataFrame:
        """The card's numbers, one row each (`stats.summary_frame`): the ranking score (named by `score_kind`),
        `alignment`, `write`, `frequency`, `chosen`, `rejected`, `difference` with its interval, `effect`
        (NaN when not measured) and one `rho_<axis>` per correlation."""
        nan = math.nan
        scalars = {self.score_kind: self.score, "alignment": self.alignment, "write": self.write,
                   "frequency": self.frequency, "chosen": self.chosen, "rejected": self.rejected}
        return summary_frame([
            *({"name": k, "value": v, "low": nan, "high": nan} for k, v in scalars.items()),
            {"name": "difference", "value": self.difference, "low": self.difference_ci[0],
             "high": self.difference_ci[1]},
            {"name": "effect", "value": nan if self.effect is None else self.effect, "low": nan, "high": nan},
            *({"name": f"rho_{k}", "value": v, "low": nan, "high": nan} for k, v in self.correlations.items()),
        ])

    def row(self) -> dict[str, Any]:
        """The card's numbers as one flat row (the first context's text as `top_context`): a row of
        `FeatureCards.to_frame`."""
        top = self.contexts[0] if self.contexts else None
        return {
            "feature": self.feature, "layer": self.layer, self.score_kind: self.score, "alignment": self.alignment,
            "write": self.write, "frequency": self.frequency, "chosen": self.chosen, "rejected": self.rejected,
            "difference": self.difference, "difference_lo": self.difference_ci[0],
            "difference_hi": self.difference_ci[1], "effect": self.effect, "n_contexts": len(self.contexts),
            "top_activation": top.activation if top else math.nan, "top_context": top.text if top else "",
            **{f"rho_{name}": rho for name, rho in self.correlations.items()}, "note": self.note,
        }


@dataclass(frozen=True)
class FeatureCards(HtmlView):
    """One `FeatureCard` per reported feature, strongest-ranked first; `axes` names the correlations."""

    _html_rank = "margin"

    layer: int
    cards: tuple[FeatureCard, ...]
    axes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.cards)

    def __iter__(self) -> Iterator[FeatureCard]:
        return iter(self.cards)

    def card(self, feature: int) -> FeatureCard:
        """The card of latent `feature`."""
        for c in self.cards:
            if c.feature == feature:
                return c
        raise KeyError(f"feature {feature} has no card; the cards are for features {[c.feature for c in self.cards]}")

    def with_effects(self, effects: Mapping[int, float]) -> FeatureCards:
        """The same cards with `effect` set from `effects` (latent id → causal effect, reward units)."""
        return dataclasses.replace(self, cards=tuple(
            dataclasses.replace(c, effect=float(effects[c.feature])) if c.feature in effects else c
            for c in self.cards))

    def to_frame(self) -> pd.DataFrame:
        """One row per feature: the card's numbers (`FeatureCard.row`)."""
        import pandas as pd

        return pd.DataFrame([c.row() for c in self.cards])

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "axes": list(self.axes), "cards": [
            {**dataclasses.asdict(c), "contexts": [dataclasses.asdict(x) for x in c.contexts]} for c in self.cards]}

    def to_json(self) -> str:
        """Strict JSON of every card (NaN written as null; `rewardlens.stats.to_json`)."""
        return to_json(self.to_dict())

    def plot(self, ax: Axes | None = None) -> Figure:
        """Each feature's mean chosen − rejected activation at the read position with its interval; into
        `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (6, 0.3 * len(self.cards) + 1))
        mid = np.array([c.difference for c in self.cards][::-1], dtype=np.float64)
        lo, hi = (np.array([c.difference_ci[j] for c in self.cards][::-1], dtype=np.float64) for j in (0, 1))
        err = np.nan_to_num(np.stack([mid - lo, hi - mid]), nan=0.0)
        ax.barh([f"feature {c.feature}" for c in self.cards][::-1], np.nan_to_num(mid), xerr=err,
                color=["tab:blue" if v >= 0 else "tab:red" for v in np.nan_to_num(mid)])
        ax.axvline(0, color="black", lw=0.8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel(f"mean chosen − rejected activation at the read position, layer {self.layer} (95% interval)")
        return finish(ax, made)


def read_sides(att: FeatureAttribution, col: int) -> tuple[float, float, float, tuple[float, float]]:
    """Mean activation of feature column `col` at the read position on chosen and rejected rows, the mean
    paired difference and its bootstrap interval over pairs; NaN without pairs."""
    if not att.is_pairs:
        return math.nan, math.nan, math.nan, (math.nan, math.nan)
    a = att.activations[:, col].astype(np.float64)
    c, r = side(a, "chosen"), side(a, "rejected")
    return float(c.mean()), float(r.mean()), float((c - r).mean()), bootstrap_ci(c - r)


def direct_write(att: FeatureAttribution, col: int) -> float:
    """`u_l · d_i` averaged over the inputs where feature column `col` fired: the attribution's own
    contribution per unit of activation (NaN when it fired on none)."""
    on = att.activations[:, col] > 0
    if not on.any():
        return math.nan
    return float(np.mean(att.values[on, col] / att.activations[on, col]))


def check_axes(axes: Mapping[str, Any] | None, n_seq: int, is_pairs: bool) -> dict[str, np.ndarray]:
    """The caller's axes as float arrays, each one value per corpus sequence (or, for pairs, per pair)."""
    out = {}
    for name, values in (axes or {}).items():
        v = np.asarray(values, dtype=np.float64).ravel()
        if len(v) != n_seq and not (is_pairs and 2 * len(v) == n_seq):
            per_pair = f" or {n_seq // 2} (one per pair)" if is_pairs else ""
            raise DataError(f"axis {name!r} has {len(v)} values but the corpus has {n_seq} sequences; give {n_seq} "
                            f"(one per sequence, in the corpus' order: pairs as chosen, rejected){per_pair}")
        out[str(name)] = v
    return out


def correlations(seq_max: np.ndarray, axes: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Spearman ρ of a feature's per-sequence peak activation `seq_max` [n_seq] with each axis: per sequence,
    or, for a per-pair axis, with the chosen − rejected difference of the peak."""
    out = {}
    for name, v in axes.items():
        act = seq_max if len(v) == len(seq_max) else side(seq_max, "chosen") - side(seq_max, "rejected")
        out[name] = spearman(act, v)
    return out


def text_axes(model: RewardModel, corpus: Inputs, **scores: Callable[[str], float]) -> dict[str, np.ndarray]:
    """Axes for `feature_report(..., axes=)` from text predicates or scores: `name → score(text)` of every
    corpus sequence, decoded from its own token ids in the corpus' order (pairs: chosen, rejected), so
    the rows line up with the report's by construction. A concept's or an organism's test on text fits."""
    seqs, _ = model.encode(corpus)
    texts = [str(model.tokenizer.decode(s.ids)) for s in seqs]
    return {name: np.array([float(fn(t)) for t in texts]) for name, fn in scores.items()}
