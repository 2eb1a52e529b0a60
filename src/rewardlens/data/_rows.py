"""The row layout every instrument shares: rows alternate chosen, rejected.

A list of `n` pairs is scored as `2n` rows: row `2i` is pair `i`'s chosen side, row `2i + 1` its
rejected side. This module is the one place that layout is written down; everything that splits,
labels or differences rows goes through it, so no file slices `[0::2]` by hand. The helpers take
numpy arrays and torch tensors alike and split along any axis.
"""

from __future__ import annotations

from typing import Literal, TypeVar

Side = Literal["chosen", "rejected"]
SIDES: tuple[Side, Side] = ("chosen", "rejected")
Rows = TypeVar("Rows")  # an np.ndarray or a torch.Tensor: what goes in comes out


def side(rows: Rows, which: Side, axis: int = 0) -> Rows:
    """The `which` side of every pair: rows [.., 2n, ..] → [.., n, ..] along `axis`."""
    if which not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {which!r}")
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


def pair_of(row: int) -> tuple[int, Side]:
    """Which pair a row belongs to and which side it is."""
    return row // 2, SIDES[row % 2]


def row_labels(n: int, is_pairs: bool) -> list[str]:
    """Row names: `0`, `1`, ... or `0/chosen`, `0/rejected`, ... for pairs."""
    if is_pairs:
        return ["{}/{}".format(*pair_of(i)) for i in range(n)]
    return [str(i) for i in range(n)]
