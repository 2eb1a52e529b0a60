"""`attribute`: the reward as an exact sum of embeddings, sublayers, heads or neurons."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, get_args

import numpy as np

from ..data import Inputs, Side, row_labels, side
from ..errors import UsageError
from ..model import RewardModel
from ..plotting import HtmlView
from ..stats import ranked, top_parts
from ..types import Level, PaddingSide, Ranking, Stored
from ._decompose import Decomposition, decompose
from ._steps import Steps

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RANKINGS: tuple[Ranking, ...] = get_args(Ranking)


@dataclass(frozen=True)
class Attribution(HtmlView):
    """Direct contributions of every part to the reward, in reward units.

    `values` [n, P] for the readout scalar, `constant` [n] (head bias and norm biases), `reward`
    [n] (the model's reward from its fp32 head); `values.sum(1) + constant == reward` up to float
    error, reported as `residual_error`. `per_objective` [n, k, P] and `objective_constant`
    [n, k] hold the same per head output (k = 1, the readout itself, when not kept). For pairs,
    rows alternate chosen, rejected.
    """

    _html_top_names = ("part", "mean |contribution|")

    names: list[str]
    values: np.ndarray
    constant: np.ndarray
    reward: np.ndarray
    per_objective: np.ndarray
    objective_constant: np.ndarray
    objective_reward: np.ndarray
    objectives: list[str]
    rows: list[str]
    is_pairs: bool
    level: Level
    steps: Steps | None = None
    """Multi-position read-outs (PRMs, DPO): each read's own reward, weight and parts (exact/_steps.py)."""

    STORED: ClassVar[Stored] = Stored(
        per_row=("values", "constant", "reward", "per_objective", "objective_constant", "objective_reward"),
        derived=("rows", "is_pairs", "steps"))
    """How the audit's store keeps an attribution (`types.Stored`; its steps are stored under their own key)."""

    @classmethod
    def from_decomposition(cls, dec: Decomposition, level: Level) -> Attribution:
        obj_const = dec.constants.sum(-1) + dec.head_constant
        return cls(
            names=dec.names, values=dec.scalar(dec.values), constant=dec.scalar(obj_const), reward=dec.reward,
            per_objective=dec.values, objective_constant=obj_const, objective_reward=dec.objectives,
            objectives=dec.labels, rows=row_labels(len(dec.values), dec.is_pairs), is_pairs=dec.is_pairs,
            level=level, steps=dec.steps,
        )

    @property
    def residual_error(self) -> np.ndarray:
        """reward − (Σ parts + constant) [n]: float error only; the decomposition is exact."""
        return self.reward - self.values.sum(1) - self.constant

    def _side(self, which: Side) -> np.ndarray:
        if not self.is_pairs:
            raise UsageError("chosen/rejected/margin need inputs given as rewardlens.Pair")
        return side(self.values, which)

    @property
    def chosen(self) -> np.ndarray:
        return self._side("chosen")

    @property
    def rejected(self) -> np.ndarray:
        return self._side("rejected")

    @property
    def margin(self) -> np.ndarray:
        """Per-part chosen − rejected contribution [n_pairs, P]; sums (with the constants) to the margin."""
        return self.chosen - self.rejected

    def top(self, n: int = 10, *, by: Ranking = "mean_abs") -> list[tuple[str, float]]:
        """The `n` parts with the largest mean |contribution| ('mean_abs', the rule of `stats.top_parts`)
        or |mean margin| ('margin', with its sign), largest first, NaN last, ties in part order."""
        if by not in RANKINGS:
            raise UsageError(f"by must be 'mean_abs' or 'margin', got {by!r}")
        if by == "margin":  # the signed mean margin, ranked by its size
            score = self.margin.mean(0)
            return [(self.names[i], float(score[i])) for i in ranked(np.abs(score), n)]
        score = np.abs(self.values).mean(0)
        return [(self.names[i], float(score[i])) for i in top_parts(self.values, n)]

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (input, part) with its contribution."""
        import pandas as pd

        n, p = self.values.shape
        return pd.DataFrame({
            "input": np.repeat(self.rows, p), "part": np.tile(self.names, n), "value": self.values.ravel(),
        })

    def plot(self, n: int = 20, ax: Axes | None = None) -> Figure:
        """Bar chart of the mean contribution (or mean margin, for pairs) of the top `n` parts, into
        `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        by: Ranking = "margin" if self.is_pairs else "mean_abs"
        top = self.top(n, by=by)
        ax, made = one_panel(ax, (6, 0.3 * len(top) + 1))
        ax.barh([t[0] for t in top][::-1], [t[1] for t in top][::-1])
        ax.set_xlabel("chosen − rejected contribution (reward units)" if by == "margin" else "mean |contribution|")
        return finish(ax, made)


def attribute(
    model: RewardModel,
    inputs: Inputs,
    *,
    level: Level = "sublayer",
    layers: Iterable[int] | None = None,
    batch_size: int = 8,
    padding_side: PaddingSide = "right",
    per_objective: bool | None = None,
) -> Attribution:
    """Exact direct contribution of each part to each input's reward.

    `level`: 'sublayer' (embed, attn_L{l}, mlp_L{l}), 'head' (attention split into heads plus a
    bias part where o_proj has one) or 'neuron' (MLPs split into neurons). `layers` limits the
    fine split to some layers (others stay whole). `inputs`: strings, chat conversations or Pairs.
    `per_objective` keeps each head output's decomposition too (default: yes, but not at neuron
    level, where it would multiply memory by the number of objectives).
    """
    dec = decompose(model, inputs, level=level, layers=layers, batch_size=batch_size, padding_side=padding_side,
                    per_objective=per_objective)
    return Attribution.from_decomposition(dec, level)
