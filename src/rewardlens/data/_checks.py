"""Degenerate preference pairs: found, counted and reported once, never passed on silently.

A pair can be well formed and still say nothing about a preference. Four kinds are checked:

- `empty`: the chosen or the rejected response is empty or only whitespace. The model scores
  the prompt and the template alone, so the margin compares nothing the pair is about.
- `identical`: chosen equals rejected. Both sides are the same sequence, so the margin is zero by
  construction and every ratio to it is undefined (the instruments report NaN there).
- `duplicate_id`: the pair's `id` was used by an earlier pair, so results keyed by id (tables,
  reports, `pair_ids`) cannot tell the two apart.
- `repeated`: the same prompt, chosen and rejected as an earlier pair. Pooled statistics and
  bootstrap intervals treat pairs as independent units, so a repeat counts its pair twice.

`check_pairs` returns a `PairChecks`. By default a degenerate set warns: one
`DegeneratePairsWarning` (a `RewardLensWarning`) with the count per kind and the first few pairs
of each. `strict=True` turns the same report into a `DataError`. `load_pairs` runs the same
check with each pair named by its line or record in the file (docs/scoring.md, "Degenerate pairs").
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import DataError, DegeneratePairsWarning
from ._pair import Pair

if TYPE_CHECKING:
    from ..types import Prompt

CheckKind = Literal["empty", "identical", "duplicate_id", "repeated"]
CHECK_KINDS: tuple[CheckKind, ...] = get_args(CheckKind)
EXAMPLES = 3  # pairs named per kind in a message
_DESCRIBE: dict[CheckKind, str] = {
    "empty": "with an empty or whitespace-only response",
    "identical": "with chosen identical to rejected, a zero margin by construction",
    "duplicate_id": "reusing an earlier pair's id",
    "repeated": "repeating an earlier pair word for word",
}
_FIX = ("drop or repair those pairs (they give zero or meaningless margins, or count twice in "
        "pooled statistics: docs/scoring.md, 'Degenerate pairs')")


@dataclass(frozen=True)
class PairChecks:
    """What `check_pairs` found in `n_pairs` pairs, per kind (see `CHECK_KINDS`).

    `indices[kind]`: the positions (0-based, in the order given) of every pair of that kind; for
    `duplicate_id` and `repeated` the later occurrences, so dropping them keeps the first one.
    `examples[kind]`: the first few of them, named as messages name them (`line 7 (id 'x')` for
    a loaded file, `pair 3` for pairs built in Python). A pair can be of several kinds.
    """

    n_pairs: int
    indices: Mapping[CheckKind, tuple[int, ...]]
    examples: Mapping[CheckKind, tuple[str, ...]]
    source: str = ""

    @property
    def counts(self) -> dict[CheckKind, int]:
        """Number of pairs of each kind."""
        return {kind: len(self.indices[kind]) for kind in CHECK_KINDS}

    @property
    def ok(self) -> bool:
        """True when no pair is degenerate."""
        return not any(self.indices[kind] for kind in CHECK_KINDS)

    @property
    def flagged(self) -> tuple[int, ...]:
        """Sorted positions of the pairs of any kind (the ones to drop for a clean set)."""
        return tuple(sorted({i for kind in CHECK_KINDS for i in self.indices[kind]}))

    def summary(self) -> list[dict[str, Any]]:
        """One row per kind of `CHECK_KINDS`: `kind`, `pairs` (how many), `examples` (the first few named,
        as the warning names them). `describe()` says the same in one line."""
        return [{"kind": kind, "pairs": len(self.indices[kind]), "examples": list(self.examples[kind])}
                for kind in CHECK_KINDS]

    def describe(self) -> str:
        """One line: how many pairs are degenerate, per kind, with the first few of each named."""
        where = f"{self.source}: " if self.source else ""
        if self.ok:
            return f"{where}all {self.n_pairs} pairs pass the degenerate-pair checks"
        parts = []
        for kind in CHECK_KINDS:
            count = len(self.indices[kind])
            if count:
                shown = ", ".join(self.examples[kind]) + (", ..." if count > len(self.examples[kind]) else "")
                parts.append(f"{count} {_DESCRIBE[kind]}: {shown}")
        return f"{where}{len(self.flagged)} of {self.n_pairs} pairs are degenerate: " + "; ".join(parts)

    def __str__(self) -> str:
        return self.describe()

    def warning(self) -> str:
        """The message of the one warning a degenerate set gets by default."""
        return f"{self.describe()}. Fix: {_FIX}, or pass strict=True to refuse them."

    def warn(self, stacklevel: int = 1) -> None:
        """Emit the one `DegeneratePairsWarning` (a `RewardLensWarning`) a degenerate set gets.

        `stacklevel` as in `warnings.warn`, counted from the caller of this method."""
        warnings.warn(self.warning(), DegeneratePairsWarning, stacklevel=stacklevel + 1)

    def error(self) -> DataError:
        """The `DataError` that `strict=True` raises for these findings."""
        return DataError(f"{self.describe()}. Fix: {_FIX}, or run without strict to only warn.")


def check_pairs(pairs: Sequence[Pair], *, strict: bool = False, quiet: bool = False) -> PairChecks:
    """Check `pairs` for degenerate ones (empty responses, identical sides, duplicate ids, repeats).

    Returns the findings. When some pair is degenerate, `strict=True` raises `DataError` naming
    them; otherwise one `RewardLensWarning` says the same (none with `quiet=True`, for callers
    that report the findings themselves). Pairs are named `pair <index>`, with the id where set.
    """
    for i, pair in enumerate(pairs):
        if not all(isinstance(getattr(pair, f, None), str) for f in ("chosen", "rejected")):
            raise TypeError(f"check_pairs expects rewardlens.Pair objects; pair {i} is {type(pair).__name__}")
    checks = find(pairs, [f"pair {i}" for i in range(len(pairs))])
    if not checks.ok:
        if strict:
            raise checks.error()
        if not quiet:
            checks.warn(stacklevel=2)
    return checks


def find(pairs: Sequence[Pair], where: Sequence[str], source: str = "") -> PairChecks:
    """The findings for `pairs`, pair `i` named `where[i]` in examples (plus its id when set)."""
    found: dict[CheckKind, list[int]] = {kind: [] for kind in CHECK_KINDS}
    seen_ids: set[str] = set()
    seen_pairs: set[tuple[bool, str, str, str]] = set()
    for i, pair in enumerate(pairs):
        if not pair.chosen.strip() or not pair.rejected.strip():
            found["empty"].append(i)
        if pair.chosen == pair.rejected:
            found["identical"].append(i)
        if pair.id is not None:
            if pair.id in seen_ids:
                found["duplicate_id"].append(i)
            seen_ids.add(pair.id)
        key = (isinstance(pair.prompt, str), _canonical(pair.prompt), pair.chosen, pair.rejected)
        if key in seen_pairs:
            found["repeated"].append(i)
        seen_pairs.add(key)
    examples = {kind: tuple(_name(pairs[i], where[i]) for i in found[kind][:EXAMPLES]) for kind in CHECK_KINDS}
    return PairChecks(len(pairs), {k: tuple(v) for k, v in found.items()}, examples, source)


def _canonical(prompt: Prompt) -> str:
    """A prompt as one comparable string: messages with the same keys and values compare equal."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=repr)


def _name(pair: Pair, where: str) -> str:
    return where if pair.id is None else f"{where} (id {pair.id!r})"
