"""Built-in items that do not fit a short-context model: find them, say so once, skip them whole.

The rule of what fits is the model's own (`RewardModel.fits`, the rule `encode` refuses by): an
item is skipped when any sequence an instrument needs for it is longer than `max_length` and the
model was not loaded with `truncation='left'` (then everything fits: it is cut from the left, as
every other input is). Only built-in items are skipped; a user's own items that do not fit raise
`TokenizationError` as any other input does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import DataError, TokenizationError, UsageError, warn
from ..model import RewardModel
from ..types import Conversation, Text
from ._axes import AXES, contrast_rows
from ._items import ITEMS, Item, base_items, builtin

SHOWN = 10
"""Skipped ids named in the warning; the rest are counted."""


def unfit(model: RewardModel, needs: Sequence[Sequence[Conversation]]) -> list[int]:
    """Indices `i` where some conversation of `needs[i]` does not fit `model` (an empty group always fits)."""
    unique: dict[str, Conversation] = {}
    for group in needs:
        for conv in group:
            unique.setdefault(json.dumps(conv, sort_keys=True), conv)
    if not unique:
        return []
    ok = dict(zip(unique, model.fits(list(unique.values()))))
    return [i for i, group in enumerate(needs) if not all(ok[json.dumps(c, sort_keys=True)] for c in group)]


def report(what: str, skipped: Sequence[str], total: int, max_length: int | None, verb: str) -> None:
    """One warning: how many of `total` items were skipped, which, and what ran on the rest.

    Raises TokenizationError when no item is left."""
    if not skipped:
        return
    n = len(skipped)
    shown = ", ".join(skipped[:SHOWN]) + (f", and {n - SHOWN} more" if n > SHOWN else "")
    if n == total:
        raise TokenizationError(
            f"{what}: none of the {total} built-in items fits max_length {max_length} ({shown}); raise max_length=, "
            "or load the model with truncation='left' to cut long inputs from the start", option="max_length")
    warn(f"{what}: {n} of {total} items {'does' if n == 1 else 'do'} not fit max_length {max_length} ({shown}); "
         f"{verb} the other {total - n}")


def builtin_sets(model: RewardModel, items: Sequence[Any] | None,
                 seed: int) -> tuple[dict[str, tuple[Sequence[Text], Sequence[Text]]], tuple[str, ...]]:
    """`concepts`' built-in sets: the probe axes' matched sets, one concept per axis, on the built-in items
    (or `items`), less the built-in items with a sequence that does not fit the model (left out of every
    axis); and their ids."""
    base = base_items(items)
    rows = {axis: contrast_rows(axis, base, seed) for axis in AXES}
    needs: list[list[Conversation]] = [[] for _ in base]
    for axis_rows in rows.values():
        for i, on, off in axis_rows:
            if builtin(base[i]):
                needs[i] += [on, off]
    drop = set(unfit(model, needs))
    gone = tuple(base[i].id for i in sorted(drop))
    report("concepts", gone, len(base), model.max_length, "used")
    sets: dict[str, tuple[Sequence[Text], Sequence[Text]]] = {}
    for axis, axis_rows in rows.items():
        kept = [(on, off) for i, on, off in axis_rows if i not in drop]
        if len(kept) >= 2:
            sets[axis] = ([on for on, _ in kept], [off for _, off in kept])
    thin = [axis for axis in AXES if axis not in sets]
    if thin and sets:
        warn(f"concepts: the axes {thin} apply to fewer than 2 of the {len(base) - len(drop)} items used; "
             "they are left out (a concept needs 2 inputs a side)")
    if not sets:
        used = len(base) - len(drop)
        skipped = f" ({len(drop)} of {len(base)} did not fit the model and were skipped)" if drop else ""
        raise DataError(f"concepts: a concept needs 2 inputs a side, and no probe axis applies to 2 of the {used} "
                        f"item{'s' * (used != 1)} left{skipped}; pass more items or your own sets")
    return sets, gone


def spread_items(n: int, pool: Sequence[Item] | None = None) -> list[Item]:
    """`n` built-in items spread evenly over the domains they are listed in (every `len(ITEMS) // n`-th,
    from the first): the one subset a quick run probes (the audit's `probe_items`, the monitor's), so the
    two probe the same items (the audit's rule before there was one: its stores keep their items).
    It differs from `items(n=)` (the domains' first items, in turn) for n below the number of domains:
    two items are here the first and the fourth domain's first, there the first two domains'; unifying
    on `items(n=)` changed what a quick audit probes and left a 256-token model no item that fits.
    `pool`: spread over these items instead (the probes' stages over a user's items); default `ITEMS`."""
    pool = ITEMS if pool is None else tuple(pool)
    if not 2 <= n <= len(pool):
        raise UsageError(f"probe_items must be between 2 and {len(pool)} {'built-in ' * (pool is ITEMS)}items, "
                         f"got {n}", option="probe_items")
    return list(pool[:: len(pool) // n][:n])
