"""`Pair`: one preference pair, the record every instrument reads (a leaf: it imports only `types`).

`Inputs` names what the instruments accept: pairs (rows alternate chosen, rejected) or single texts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..errors import UsageError
from ..types import Conversation, Prompt, Text
from ._extra import RESERVED, Extra
from ._rows import Side


@dataclass(frozen=True)
class Pair:
    """One preference pair: a prompt and two responses, the first preferred.

    `prompt` is a string or a list of `{"role", "content"}` messages (the conversation before the
    response); `chosen` and `rejected` are the assistant responses as strings. `group` names the
    RewardBench 2 record a pair came from (one chosen against several rejected, read as one pair
    per combination): pairs sharing a group are scored together, best-of-N (`rewardlens.bench`),
    and a list of pairs keeps each group's pairs adjacent. None for a pair that stands alone.

    `extra` holds the record's other fields (`load_pairs` keeps every field it does not read), read-only
    (an `Extra`), so results can be joined back to the user's data (`record_fields`). It changes no
    score: it is left out of equality, hashing and every store key (docs/scoring.md, *Record fields*).
    """

    prompt: Prompt
    chosen: str
    rejected: str
    id: str | None = None
    subset: str | None = None
    group: str | None = None
    extra: Mapping[str, Any] = field(default_factory=Extra, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.extra, Mapping):
            raise TypeError(f"Pair.extra must be a mapping of field name to value, got {type(self.extra).__name__}; "
                            f"pass the record's other fields as a dict.")
        clash = sorted(RESERVED & set(self.extra))
        if clash:
            raise UsageError(f"Pair.extra may not hold {clash}: Pair holds them itself; pass them as arguments.")
        if not isinstance(self.extra, Extra):  # frozen, so the pair cannot change through it
            object.__setattr__(self, "extra", Extra(self.extra))
        if not isinstance(self.chosen, str) or not isinstance(self.rejected, str):
            raise TypeError(
                f"Pair.chosen and Pair.rejected must be strings, got {type(self.chosen).__name__} "
                f"and {type(self.rejected).__name__}; pass the assistant response text."
            )
        if not isinstance(self.prompt, (str, list)):
            raise TypeError(
                f"Pair.prompt must be a string or a list of chat messages, got "
                f"{type(self.prompt).__name__}."
            )
        if self.group is not None and not isinstance(self.group, str):
            raise TypeError(f"Pair.group must be a string or None, got {type(self.group).__name__}; "
                            f"pass the id of the record the pair came from.")

    def _repr_html_(self) -> str:
        """The pair in a notebook: id, subset and group, the prompt's turns, chosen beside rejected (escaped)."""
        from ..plotting import pair_view

        turns = [("user", self.prompt)] if isinstance(self.prompt, str) else [
            (str(m.get("role", "")), str(m.get("content", ""))) for m in self.prompt]
        about = [(k, v) for k, v in (("id", self.id), ("subset", self.subset), ("group", self.group)) if v is not None]
        return pair_view("Pair", turns, self.chosen, self.rejected, about + [(f"extra: {k}", str(v)) for k, v in
                                                                              self.extra.items()])

    def conversation(self, side: Side) -> Conversation:
        """The full chat for one side ("chosen" or "rejected"): prompt messages + assistant turn."""
        if side not in ("chosen", "rejected"):
            raise UsageError(f"side must be 'chosen' or 'rejected', got {side!r}")
        prompt = (
            [{"role": "user", "content": self.prompt}]
            if isinstance(self.prompt, str)
            else [dict(m) for m in self.prompt]
        )
        return prompt + [{"role": "assistant", "content": getattr(self, side)}]


Inputs: TypeAlias = Sequence[Pair] | Sequence[Text]
"""What the instruments read: preference pairs (rows alternate chosen, rejected) or single texts."""


def flatten_pairs(pairs: Pair | Sequence[Pair]) -> list[Pair]:
    """`pairs` as a list (one `Pair` on its own becomes a list of one)."""
    return [pairs] if isinstance(pairs, Pair) else list(pairs)


def pair_ids(pairs: Pair | Sequence[Pair]) -> list[str]:
    """Each pair's id, or its number when it has none (what `Patching.pair_ids` lists)."""
    ids = [getattr(p, "id", None) for p in flatten_pairs(pairs)]
    return [str(i) if pid is None else str(pid) for i, pid in enumerate(ids)]
