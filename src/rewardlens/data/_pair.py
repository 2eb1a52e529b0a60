"""`Pair`: one preference pair, the record every instrument reads (a leaf: it imports only `types`).

`Inputs` names what the instruments accept: pairs (rows alternate chosen, rejected) or single texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from ..types import Conversation, Prompt, Text
from ._rows import Side


@dataclass(frozen=True)
class Pair:
    """One preference pair: a prompt and two responses, the first preferred.

    `prompt` is a string or a list of `{"role", "content"}` messages (the conversation before the
    response); `chosen` and `rejected` are the assistant responses as strings. `group` names the
    RewardBench 2 record a pair came from (one chosen against several rejected, read as one pair
    per combination): pairs sharing a group are scored together, best-of-N (`rewardlens.bench`),
    and a list of pairs keeps each group's pairs adjacent. None for a pair that stands alone.
    """

    prompt: Prompt
    chosen: str
    rejected: str
    id: str | None = None
    subset: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
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

    def conversation(self, side: Side) -> Conversation:
        """The full chat for one side ("chosen" or "rejected"): prompt messages + assistant turn."""
        if side not in ("chosen", "rejected"):
            raise ValueError(f"side must be 'chosen' or 'rejected', got {side!r}")
        prompt = (
            [{"role": "user", "content": self.prompt}]
            if isinstance(self.prompt, str)
            else [dict(m) for m in self.prompt]
        )
        return prompt + [{"role": "assistant", "content": getattr(self, side)}]


Inputs: TypeAlias = Sequence[Pair] | Sequence[Text]
"""What the instruments read: preference pairs (rows alternate chosen, rejected) or single texts."""
