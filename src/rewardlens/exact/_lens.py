"""`lens`: the reward read out after every layer, two ways, and where pair preferences crystallize."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, get_args

import numpy as np

from ..data import Inputs, chosen, margin, rejected, row_labels
from ..errors import UsageError
from ..model import RewardModel
from ..plotting import HtmlView
from ..types import CrystallizationRule, LensKind, PaddingSide, Stored
from ._decompose import Decomposition, decompose

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LENS_KINDS: tuple[LensKind, ...] = get_args(LensKind)
CRYSTALLIZATION_RULES: tuple[CrystallizationRule, ...] = get_args(CrystallizationRule)


@dataclass(frozen=True)
class Lens(HtmlView):
    """Reward lens [n, L+1]: depth 0 is the embeddings, depth l+1 the output of layer l.

    `linear`: cumulative exact contributions with the final norm's scale frozen (what the parts
    written so far contribute to the reward). `normed`: the head applied to the re-normalised
    partial residual, `w·N(x_l) + b` (logit-lens style). Both equal `reward` at the last depth.
    Per-objective versions are [n, k, L+1].
    """

    linear: np.ndarray
    normed: np.ndarray
    reward: np.ndarray
    linear_objectives: np.ndarray
    normed_objectives: np.ndarray
    rows: list[str]
    is_pairs: bool

    STORED: ClassVar[Stored] = Stored(per_row=("linear", "normed", "reward", "linear_objectives",
                                               "normed_objectives"), derived=("rows", "is_pairs"))
    """How the audit's store keeps a lens (`types.Stored`)."""

    @classmethod
    def from_decomposition(cls, dec: Decomposition) -> Lens:
        """The lens as a view of a decomposition at any level: `linear` at depth d sums the parts
        that entered by d (`dec.depth`) and the constants; `normed` was read off the same trace."""
        return _from_decomposition(dec)

    @property
    def n_layers(self) -> int:
        return self.linear.shape[1] - 1

    def margin(self, kind: LensKind = "linear") -> np.ndarray:
        """Chosen − rejected lens [n_pairs, L+1]."""
        if not self.is_pairs:
            raise UsageError("margins need inputs given as rewardlens.Pair")
        arr = self._kind(kind)
        return margin(arr)

    def _kind(self, kind: LensKind) -> np.ndarray:
        if kind not in LENS_KINDS:
            raise UsageError(f"kind must be 'linear' or 'normed', got {kind!r}")
        return self.linear if kind == "linear" else self.normed

    def crystallization(
        self, kind: LensKind = "linear", fraction: float = 0.5, min_margin: float = 1e-4,
        rule: CrystallizationRule = "stays",
    ) -> np.ndarray:
        """Crystallization depth per pair as l / L. A depth *passes* when its margin m_l is on the
        final margin's side and |m_l| ≥ `fraction` · |m_L|.

        `rule="stays"` (default): the first depth after which every depth passes. `rule="first"`:
        the first depth that passes, even if a later one falls back (the seed paper's rule; it is
        never later than 'stays'). NaN where the final margin is too small to have a side (see
        `near_zero_margin`)."""
        if not 0 < fraction <= 1:
            raise UsageError(f"fraction must be in (0, 1], got {fraction}", option="fraction")
        if rule not in CRYSTALLIZATION_RULES:
            raise UsageError(f"rule must be 'stays' or 'first', got {rule!r}")
        margin = self.margin(kind)
        final = margin[:, -1:]
        ok = (np.sign(margin) == np.sign(final)) & (np.abs(margin) >= fraction * np.abs(final))
        if rule == "first":  # the final depth always passes, so argmax finds a passing depth
            depth = np.argmax(ok, axis=1) / self.n_layers
            return np.where(self.near_zero_margin(min_margin), np.nan, depth)
        # Last depth that fails; crystallized from the one after it (the final depth always passes).
        fails = ~ok
        last_fail = np.where(fails.any(1), fails.shape[1] - 1 - np.argmax(fails[:, ::-1], axis=1), -1)
        depth = (last_fail + 1) / self.n_layers
        return np.where(self.near_zero_margin(min_margin), np.nan, depth)

    def near_zero_margin(self, min_margin: float = 1e-4) -> np.ndarray:
        """Pairs whose final margin is too small to define a side [n_pairs] (bool).

        Too small means under `min_margin`, or under ten times the decomposition's own float
        error on the pair (large only for half-precision backbones), whichever is larger.
        """
        err = np.abs(self.linear[:, -1] - self.reward)
        floor = np.maximum(min_margin, 10 * (chosen(err) + rejected(err)))
        return np.abs(margin(self.reward)) < floor

    def to_frame(self) -> pd.DataFrame:
        """Long table: input, depth, linear and normed lens values."""
        import pandas as pd

        n, d = self.linear.shape
        return pd.DataFrame({
            "input": np.repeat(self.rows, d), "depth": np.tile(np.arange(d), n),
            "linear": self.linear.ravel(), "normed": self.normed.ravel(),
        })

    def plot(self, ax: Axes | None = None) -> Figure:
        """Lens curves (mean margin for pairs, mean reward otherwise), both kinds, against depth; into
        `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (6, 3.5))
        for kind in LENS_KINDS:
            curve = self.margin(kind) if self.is_pairs else self._kind(kind)
            ax.plot(np.arange(self.n_layers + 1), curve.mean(0), marker="o", label=f"{kind} lens")
        ax.set_xlabel("depth (0 = embeddings)")
        ax.set_ylabel("chosen − rejected margin" if self.is_pairs else "reward")
        ax.legend()
        return finish(ax, made)


def lens(model: RewardModel, inputs: Inputs, *, batch_size: int = 8, padding_side: PaddingSide = "right") -> Lens:
    """Linear and normed reward lens of every input (see `Lens`)."""
    return Lens.from_decomposition(decompose(model, inputs, level="sublayer", batch_size=batch_size,
                                             padding_side=padding_side))


def _from_decomposition(dec: Decomposition) -> Lens:
    depths = dec.constants.shape[-1]
    enters = np.zeros((len(dec.depth), depths))  # [P, L+1]: part p enters at depth d
    enters[np.arange(len(dec.depth)), dec.depth] = 1.0
    by_depth = dec.values.astype(np.float64) @ enters
    # The head's and final norm's constant applies at every depth; in post-norm encoders each
    # layer's norm biases enter at that layer.
    linear_obj = (np.cumsum(by_depth + dec.constants, axis=-1) + dec.head_constant[..., None]).astype(np.float32)
    return Lens(
        linear=dec.scalar(linear_obj), normed=dec.scalar(dec.normed), reward=dec.reward,
        linear_objectives=linear_obj, normed_objectives=dec.normed,
        rows=row_labels(len(dec.values), dec.is_pairs), is_pairs=dec.is_pairs,
    )
