"""The probes' group-sequential item budget: score items in nested stages, stop once every axis is decided.

Stage k probes the first `sizes[k]` items of the spread order (`spread_items`), each stage holding the one
before it, so a later stage scores only its new items' sequences. After every stage but the last, each
axis is *decided* when its statistics on that stage's items leave no doubt about the flag:

- "flagged": q < `INTERIM_SHARE` × level (a Haybittle–Peto interim boundary: 0.001 at level 0.05), and the
  whole bootstrap CI lies beyond the flag floor ±min_effect × scale on the side of the mean;
- "negligible": the whole CI lies strictly inside ±min_effect × scale (and the axis is not flagged);
- otherwise "undecided".

The run stops at the first stage where no axis is undecided; the last stage is the flag rule alone at the
nominal level, so a run that reaches it reports exactly what the full item set reports. Error control
(docs/probes.md): a null axis is flagged at some look with probability at most level + (K − 1) ×
INTERIM_SHARE × level (union bound over the K looks: 0.052 for three stages at 0.05); stopping as
negligible never adds a flag, it can only miss an effect whose true size lies outside its stage's 95 % CI.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import UsageError
from ._fit import spread_items
from ._items import Item

STAGES = (18, 36, 72)
"""The audit's default stages over the 72 built-in items: a quarter, a half, all (each spread over the domains,
each holding the one before)."""
INTERIM_SHARE = 0.02
"""An interim look flags at q < INTERIM_SHARE × level: strict enough that looking early costs almost no error."""
FLAGGED, NEGLIGIBLE, UNDECIDED = "flagged", "negligible", "undecided"
"""Each axis's decision at a stage."""


def stage_items(sizes: Sequence[int], pool: Sequence[Item]) -> list[list[Item]]:
    """The items of each stage: `spread_items(size, pool)` per size, the last size the whole pool or less.

    ValueError unless the sizes increase, lie in [2, len(pool)], and each stage holds the one before it."""
    sizes = list(sizes)
    if not sizes or any(not isinstance(s, (int, np.integer)) or isinstance(s, bool) for s in sizes):
        raise UsageError(f"stages must be a non-empty list of item counts, got {sizes!r}; pass e.g. (18, 36, 72)")
    if sorted(set(sizes)) != sizes or sizes[0] < 2 or sizes[-1] > len(pool):
        raise UsageError(f"stages {sizes} must increase strictly from at least 2 to at most the {len(pool)} items; "
                         "pass e.g. (18, 36, 72) for the built-in items")
    out = [spread_items(int(s), pool) for s in sizes]
    for small, big, a, b in zip(out, out[1:], sizes, sizes[1:]):
        ids = {id(x) for x in big}
        if not all(id(x) in ids for x in small):
            raise UsageError(f"stages {sizes}: the {a} items of one stage are not all among the {b} of the next "
                             f"(len(pool) // size must divide len(pool) // previous size); pass e.g. (18, 36, 72)")
    return out


def decide(mean: np.ndarray, ci_low: np.ndarray, ci_high: np.ndarray, q: np.ndarray, floor: float,
           interim: float) -> tuple[str, ...]:
    """Each axis's decision (arrays over axes [n_axes]) at an interim look with level `interim` and flag
    floor `floor` (min_effect × scale); see the module docstring."""
    out = []
    for m, lo, hi, qq in zip(mean, ci_low, ci_high, q):
        if not np.isfinite([m, lo, hi, qq]).all():
            out.append(UNDECIDED)  # too few items here for an interval: more items may give one
        elif qq < interim and abs(m) >= floor and (lo >= floor if m > 0 else hi <= -floor):
            out.append(FLAGGED)
        elif -floor < lo and hi < floor and abs(m) < floor:
            out.append(NEGLIGIBLE)
        else:
            out.append(UNDECIDED)
    return tuple(out)


def budget(n: int, stage: int, stages: Sequence[int], stopped_because: str, axes: Sequence[str],
           decided: Sequence[str]) -> str:
    """`Probes.budget`'s line: `n` items used, at `stage` of `stages`, and why the run stopped there."""
    items = f"{n} item{'' if n == 1 else 's'}"
    if not stages:
        return f"{items} (a fixed item set)"
    head = f"{items}, stage {stage} of {len(stages)} ({'/'.join(map(str, stages))} items)"
    if stopped_because == "decided":
        return f"{head}: stopped early, every axis decided (flagged or negligible)"
    left = [a for a, d in zip(axes, decided) if d == UNDECIDED]
    return f"{head}: ran every stage" + (f" ({', '.join(left)} undecided before it)" if left else "")
