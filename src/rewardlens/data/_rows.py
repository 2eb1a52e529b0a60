"""The row layout every instrument shares: rows alternate chosen, rejected.

A list of `n` pairs is scored as `2n` rows: row `2i` is pair `i`'s chosen side, row `2i + 1` its
rejected side. This module is the one place that layout is written down; everything that splits,
labels or differences rows goes through it, so no file slices `[0::2]` by hand. The helpers take
numpy arrays and torch tensors alike and split along any axis.

It also owns the sign of an effect: `effect = m_clean − m_patched` with `m = r_chosen − r_rejected`
(docs/design.md §2), so a positive effect is margin the patch took away. Every instrument that
reports an effect (patching, circuits, edges, feature patches) computes it through `effect`.
"""

from __future__ import annotations

from typing import Literal, TypeVar

import numpy as np

from ..errors import UsageError

Side = Literal["chosen", "rejected"]
SIDES: tuple[Side, Side] = ("chosen", "rejected")
Rows = TypeVar("Rows")  # an np.ndarray or a torch.Tensor: what goes in comes out
Margin = TypeVar("Margin")  # a float, an np.ndarray or a torch.Tensor


def side(rows: Rows, which: Side, axis: int = 0) -> Rows:
    """The `which` side of every pair: rows [.., 2n, ..] → [.., n, ..] along `axis`."""
    if which not in SIDES:
        raise UsageError(f"side must be one of {SIDES}, got {which!r}")
    index = (slice(None),) * axis + (slice(SIDES.index(which), None, 2),)
    return rows[index]  # type: ignore[index]


def chosen(rows: Rows, axis: int = 0) -> Rows:
    """Chosen rows (0, 2, 4, ...) along `axis`: [.., 2n, ..] → [.., n, ..]."""
    return side(rows, "chosen", axis)


def rejected(rows: Rows, axis: int = 0) -> Rows:
    """Rejected rows (1, 3, 5, ...) along `axis`: [.., 2n, ..] → [.., n, ..]."""
    return side(rows, "rejected", axis)


def margin(rows: Rows, axis: int = 0) -> Rows:
    """Chosen − rejected along `axis`: [.., 2n, ..] → [.., n, ..]."""
    return chosen(rows, axis) - rejected(rows, axis)  # type: ignore[operator]


def interleave(chosen_rows: Rows, rejected_rows: Rows, axis: int = 0) -> Rows:
    """The inverse of `chosen`/`rejected`: two [.., n, ..] arrays → [.., 2n, ..] with row `2i` from
    `chosen_rows` and row `2i + 1` from `rejected_rows` along `axis` (same dtype rules as stacking)."""
    c, r = chosen_rows, rejected_rows
    if c.shape != r.shape:  # type: ignore[attr-defined]
        raise UsageError(f"interleave takes two sides of one shape, got {tuple(c.shape)} and {tuple(r.shape)}")  # type: ignore[attr-defined]
    shape = list(c.shape)  # type: ignore[attr-defined]
    shape[axis] *= 2
    if isinstance(c, np.ndarray):
        return np.stack((c, r), axis=axis + 1).reshape(shape)  # type: ignore[arg-type, return-value]
    import torch  # torch only when torch tensors come in: the data layer stays importable without it

    return torch.stack((c, r), dim=axis + 1).reshape(shape)  # type: ignore[arg-type, return-value]


def is_chosen(n_rows: int) -> np.ndarray:
    """Which of `n_rows` rows are chosen sides [n_rows] bool (True at 0, 2, 4, ...)."""
    return np.arange(n_rows) % 2 == 0


def effect(clean_margin: float | Margin, patched_margin: Margin) -> Margin:
    """The effect of a patch, in reward units: `effect = m_clean − m_patched`, `m = r_chosen − r_rejected`.

    Positive: the patch took margin away (the patched part carried the preference); negative: the
    patch added margin. `clean_margin` [n] (or a scalar) broadcasts against `patched_margin` [n, ...]
    (one patched margin per pair and part, sender × receiver, ...) along the pair axis 0. A change Δ
    to the margin (patched = clean + Δ) has effect `effect(0.0, Δ)` = −Δ.
    """
    clean = clean_margin
    extra = getattr(patched_margin, "ndim", 0) - getattr(clean, "ndim", 0)
    if getattr(clean, "ndim", 0) and extra > 0:
        clean = clean.reshape(*clean.shape, *([1] * extra))  # type: ignore[union-attr]
    return clean - patched_margin  # type: ignore[operator, return-value]


def pair_of(row: int) -> tuple[int, Side]:
    """Which pair a row belongs to and which side it is."""
    return row // 2, SIDES[row % 2]


def rows_of(pair: int) -> tuple[int, int]:
    """The rows of pair `pair`: (its chosen row 2i, its rejected row 2i + 1); the inverse of `pair_of`."""
    return 2 * pair, 2 * pair + 1


def pair_rows(pairs: np.ndarray) -> np.ndarray:
    """The rows of the pairs `pairs` [k] (indices), each pair's chosen then rejected row [2k]."""
    index = np.asarray(pairs, dtype=np.int64)
    return interleave(2 * index, 2 * index + 1)


def pair_span(start: int, stop: int) -> slice:
    """The rows of the pairs `start` to `stop` (exclusive), as one slice: rows 2·start to 2·stop."""
    return slice(2 * start, 2 * stop)


def row_labels(n: int, is_pairs: bool) -> list[str]:
    """Row names: `0`, `1`, ... or `0/chosen`, `0/rejected`, ... for pairs."""
    if is_pairs:
        return ["{}/{}".format(*pair_of(i)) for i in range(n)]
    return [str(i) for i in range(n)]
