"""Concept sets from files: `.txt` (one response per line), `.json` (a list) or `.jsonl` (one per line).

A concept set's texts are responses, and a reward model scores a response in a conversation: pairs
are scored as `[user: prompt, assistant: response]` through the model's chat template (or, without
one, as `prompt + "\\n\\n" + response` for a decoder and the text pair for an encoder). A line of a
concept file is therefore read as the assistant turn of the same conversation a pair's response
is, after the user turn `prompt` (default empty): a `.txt` line and a pair's response with the same
text and prompt score identically. Read as a bare string it would skip the template, and the model
would see text unlike anything it was trained to score (on SmolLM2's reward model the same concept
had a dose-response slope of −0.017 as bare text and +0.366 through the template).

Items that are already conversations (in `.json`/`.jsonl`) are taken as they are. `prompt=None`
keeps strings as bare texts, for files whose lines are already templated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..types import Text


def _is_item(x: object) -> bool:
    return isinstance(x, str) or (isinstance(x, list) and bool(x)
                                  and all(isinstance(m, dict) and "role" in m for m in x))


def as_response(text: str, prompt: str | None = "") -> Text:
    """`text` as the assistant turn after the user turn `prompt` (how a pair's response is scored);
    `prompt=None`: the bare text."""
    if prompt is None:
        return text
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]


def read_concept_file(path: str | os.PathLike[str], *, prompt: str | None = "") -> list[Text]:
    """One concept set from a file: `.json` (a list of texts or chat conversations), `.jsonl` (one per
    line) or any other suffix, as text (one input per non-empty line).

    Each string becomes the assistant response to the user turn `prompt` (module docstring), so it
    goes through the model's chat template as a pair's response does; `prompt=None` keeps bare text.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{p}: no such concept file") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    items: Any
    if p.suffix == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}: not valid JSON ({exc}); expected a list of texts or conversations") from None
        where = [f"{p}: item {i}" for i in range(len(items) if isinstance(items, list) else 0)]
    elif p.suffix == ".jsonl":
        items, where = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}: line {n} is not valid JSON ({exc})") from None
            where.append(f"{p}: line {n}")
    else:
        numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        items, where = [line for _, line in numbered], [f"{p}: line {n}" for n, _ in numbered]
    if not isinstance(items, list) or not items:
        raise DataError(f"{p}: expected a non-empty list of texts or chat conversations")
    for i, item in enumerate(items):
        if not _is_item(item):
            raise DataError(f"{where[i]} is a {type(item).__name__}; expected a string or a list of "
                            "{'role', 'content'} messages")
    return [as_response(x, prompt) if isinstance(x, str) else x for x in items]
