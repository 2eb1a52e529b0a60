"""Preference pairs in: the `Pair` record and loaders for the file formats users bring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

Message = dict  # {"role": str, "content": str}
Prompt = Union[str, list]  # a plain string, or a list of chat messages ending with a user turn


@dataclass(frozen=True)
class Pair:
    """One preference pair: a prompt and two responses, the first preferred.

    `prompt` is a string or a list of `{"role", "content"}` messages (the conversation before the
    response); `chosen` and `rejected` are the assistant responses as strings.
    """

    prompt: Prompt
    chosen: str
    rejected: str
    id: str | None = None
    subset: str | None = None

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

    def conversation(self, side: str) -> list[dict]:
        """The full chat for one side ("chosen" or "rejected"): prompt messages + assistant turn."""
        if side not in ("chosen", "rejected"):
            raise ValueError(f"side must be 'chosen' or 'rejected', got {side!r}")
        prompt = (
            [{"role": "user", "content": self.prompt}]
            if isinstance(self.prompt, str)
            else [dict(m) for m in self.prompt]
        )
        return prompt + [{"role": "assistant", "content": getattr(self, side)}]
