"""The margins and the scale of a patched effect for every patched result; its sign is `data.effect`'s
(docs/design.md §5)."""

from __future__ import annotations

import numpy as np

from ..data import effect


class PatchedMargins:
    """`effect = (r_c − r_r)_clean − (r_c − r_r)_patched`, in reward units, for patched rewards of any
    shape [n, ...] (parts, or senders × receivers); a dataclass that holds the four reward arrays and
    `min_margin` gets the margin, the effect and the normalised effect from here."""

    chosen: np.ndarray
    rejected: np.ndarray
    patched_chosen: np.ndarray
    patched_rejected: np.ndarray
    min_margin: float

    @property
    def margin(self) -> np.ndarray:
        """Clean chosen − rejected margin [n]."""
        return self.chosen - self.rejected

    def _per_pair(self, x: np.ndarray) -> np.ndarray:
        """`x` [n] shaped to broadcast against the patched rewards [n, ...]."""
        return x.reshape(-1, *([1] * (self.patched_chosen.ndim - 1)))

    @property
    def effect(self) -> np.ndarray:
        """Clean margin − patched margin [n, ...], in reward units."""
        return effect(self.margin, self.patched_chosen - self.patched_rejected)

    @property
    def near_zero(self) -> np.ndarray:
        """Pairs whose clean margin is under `min_margin` [n] (no side to normalise by)."""
        return np.abs(self.margin) < self.min_margin

    @property
    def normalized(self) -> np.ndarray:
        """`effect / margin` [n, ...] (1 = the part alone carries the whole margin).

        NaN on pairs whose clean margin is under `min_margin` (`near_zero`; e.g. chosen identical
        to rejected, a zero margin by construction): a share of nothing is undefined, not inf."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.effect / self._per_pair(self.margin)
        return np.where(self._per_pair(self.near_zero), np.nan, out)
