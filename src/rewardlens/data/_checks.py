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

Text can be fine and its token ids still say nothing: `check_tokens` looks at the ids a model read
(the model layer runs it on every encoding of pairs, docs/scoring.md, "Token checks"):

- `identical_tokens`: the two sides differ as text but encode to the same ids (a chat template that
  drops the assistant's turn, or a tokenizer that normalises the difference away): a zero margin.
- `response_missing`: the response's own last tokens (tokenized alone) occur nowhere in the sequence
  the model reads: the template drops or rewrites the assistant's content.
- `read_before_response`: a decoder's read token comes before those tokens, so the reward cannot
  see how the response ends (a pad id that occurs there moves the read token back).

When a kind holds for every pair (or sequence) that could be checked, nothing the model scores
carries the responses, so `TokenChecks.report` raises `TokenizationError`; otherwise it warns once.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from ..errors import DataError, DegeneratePairsWarning, TokenizationError, UsageError
from ..stats import summary_frame
from ._pair import Pair
from ._rows import Side, pair_of

if TYPE_CHECKING:
    import pandas as pd

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

    def summary(self) -> pd.DataFrame:
        """One row per kind of `CHECK_KINDS`, indexed by `kind`: `value` (how many pairs), `examples` (the
        first few named, as the warning names them) (`stats.summary_frame`). `describe()` says the same in
        one line."""
        return summary_frame([{"kind": kind, "value": len(self.indices[kind]), "examples": list(self.examples[kind])}
                              for kind in CHECK_KINDS], name="kind")

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


TokenCheckKind = Literal["identical_tokens", "response_missing", "read_before_response"]
TOKEN_CHECK_KINDS: tuple[TokenCheckKind, ...] = get_args(TokenCheckKind)
TAIL = 4
"""How many of a response's last tokens `check_tokens` looks for (its very last token left out)."""
_TOKEN_DESCRIBE: dict[TokenCheckKind, str] = {
    "identical_tokens": "pairs whose two sides differ as text but encode to the same token ids (a zero margin "
                        "by construction)",
    "response_missing": "sequences that do not hold their response's last tokens (the chat template drops or "
                        "rewrites the assistant's turn)",
    "read_before_response": "sequences read at a token before their response's last tokens (the reward cannot "
                            "see how the response ends)",
}
_TOKEN_FIX: dict[TokenCheckKind, str] = {
    "identical_tokens": "use a chat template that renders the assistant's turn (tokenizer.chat_template), raise "
                        "max_length= if a left cut removed the difference, or drop those pairs",
    "response_missing": "use a chat template that renders the assistant's message content (tokenizer.chat_template)",
    "read_before_response": "pass a pad_token_id= that does not occur at the end of the responses, or leave it to "
                            "the model's own",
}

_EVERY: dict[TokenCheckKind, str] = {
    "identical_tokens": "that is every pair whose sides differ",
    "response_missing": "that is every response long enough to look for",
    "read_before_response": "that is every sequence whose response was found",
}


@dataclass(frozen=True)
class TokenChecks:
    """What `check_tokens` found in `n_pairs` pairs, per kind of `TOKEN_CHECK_KINDS`.

    `found[kind]`: every pair (`identical_tokens`) or sequence (the others) of that kind, named as
    messages name it (`pair 3 (id 'x')`, `pair 3 (rejected)`); `checked[kind]`: how many could be
    checked (pairs whose texts differ; sequences whose response has three tokens or more, so one is left
    to look for once its edges are left out; sequences whose response was found, with a read position).
    """

    n_pairs: int
    found: Mapping[TokenCheckKind, tuple[str, ...]]
    checked: Mapping[TokenCheckKind, int]

    @property
    def ok(self) -> bool:
        """True when no kind was found."""
        return not any(self.found[kind] for kind in TOKEN_CHECK_KINDS)

    def everywhere(self) -> TokenCheckKind | None:
        """The first kind found in every pair or sequence that could be checked, else None."""
        return next((k for k in TOKEN_CHECK_KINDS if self.found[k] and len(self.found[k]) == self.checked[k]), None)

    def describe(self) -> str:
        """One line: how many of each kind, with the first few named."""
        parts = []
        for kind in TOKEN_CHECK_KINDS:
            named = self.found[kind]
            if named:
                shown = ", ".join(named[:EXAMPLES]) + (", ..." if len(named) > EXAMPLES else "")
                parts.append(f"{len(named)} of {self.checked[kind]} {_TOKEN_DESCRIBE[kind]}: {shown}")
        return "token checks: " + ("; ".join(parts) if parts else f"all {self.n_pairs} pairs pass")

    def report(self, stacklevel: int = 1) -> None:
        """Raise `TokenizationError` when a kind holds everywhere it was checked (nothing the model reads carries
        the responses); else warn once (`DegeneratePairsWarning`) when anything was found."""
        if self.ok:
            return
        kind = self.everywhere()
        if kind is not None:
            raise TokenizationError(f"{self.describe()}; {_EVERY[kind]}, so no score would depend on the responses. "
                                    f"Fix: {_TOKEN_FIX[kind]} (docs/scoring.md, 'Token checks')")
        fixes = "; ".join(dict.fromkeys(_TOKEN_FIX[k] for k in TOKEN_CHECK_KINDS if self.found[k]))
        warnings.warn(f"{self.describe()}. Fix: {fixes} (docs/scoring.md, 'Token checks')", DegeneratePairsWarning,
                      stacklevel=stacklevel + 1)


def check_tokens(pairs: Sequence[Pair], ids: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                 reads: Sequence[int] | None = None) -> TokenChecks:
    """The token checks of `pairs` on what a model reads of them (module docstring), raising nothing.

    `ids` [2n]: each sequence's token ids, rows alternating chosen, rejected; `responses` [2n]: each
    side's response tokenized alone (no special tokens); `reads` [2n]: each sequence's read position
    (a decoder's one read token), or None where the read cannot miss the response (encoders, reads set
    inside the response). A response's first and last tokens are left out of the search: next to
    the template they may merge into other tokens."""
    if not len(ids) == len(responses) == 2 * len(pairs) or (reads is not None and len(reads) != len(ids)):
        raise UsageError(f"check_tokens needs two sequences per pair: {len(pairs)} pairs, {len(ids)} sequences, "
                         f"{len(responses)} responses, {'no' if reads is None else len(reads)} read positions")
    found: dict[TokenCheckKind, list[str]] = {kind: [] for kind in TOKEN_CHECK_KINDS}
    checked = dict.fromkeys(TOKEN_CHECK_KINDS, 0)
    sides: dict[int, dict[Side, list[int]]] = {}
    for row, seq in enumerate(ids):
        i, side = pair_of(row)
        sides.setdefault(i, {})[side] = list(seq)
    for i, pair in enumerate(pairs):
        if pair.chosen != pair.rejected:
            checked["identical_tokens"] += 1
            if sides[i]["chosen"] == sides[i]["rejected"]:
                found["identical_tokens"].append(_name(pair, f"pair {i}"))
    for row, (seq, response) in enumerate(zip(ids, responses)):
        tail = list(response[1:-1][-TAIL:])
        if not tail:  # a response of one or two tokens: nothing left once its edges are left out
            continue
        checked["response_missing"] += 1
        end = _last_end(list(seq), tail)
        i, side = pair_of(row)
        where = _name(pairs[i], f"pair {i}") + f" ({side})"
        if end is None:
            found["response_missing"].append(where)
        elif reads is not None:
            checked["read_before_response"] += 1
            if reads[row] < end - 1:
                found["read_before_response"].append(where)
    return TokenChecks(len(pairs), {k: tuple(v) for k, v in found.items()}, checked)


def _last_end(seq: list[int], tail: list[int]) -> int | None:
    """Where the last occurrence of `tail` in `seq` ends (one past its last token), or None."""
    end, start = None, -1
    try:
        while True:  # list.index finds each candidate start in C: long sequences stay cheap
            start = seq.index(tail[0], start + 1)
            if seq[start:start + len(tail)] == tail:
                end = start + len(tail)
    except ValueError:
        return end
