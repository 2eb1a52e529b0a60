"""How the loaders name a bad field: the record, the field, what was expected, what was found, the fix.

Shared by the record readers (`_pairs`, `_groups`) so every refusal reads the same way:
`<file>, line 3: field 'rejected': expected ..., found number 42. Fix: ...`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import DataError
from ._refusals import utf8_text

MISSING = object()
"""A field the record does not have (shown as "no such field")."""
_KINDS = {dict: "object", list: "list", str: "string", int: "number", float: "number",
          bool: "boolean", type(None): "null"}


def bad(loc: str, field: str, expected: str, found: Any, fix: str) -> DataError:
    """The `DataError` for one field of one record."""
    return DataError(f"{loc}: field {field!r}: expected {expected}, found {show(found)}. "
                     f"Fix: {fix}")


def show(value: Any) -> str:
    """A value as a message shows it: its JSON kind and at most 60 characters of it."""
    if value is MISSING:
        return "no such field"
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (ValueError, RecursionError):  # an int too long to print, or nesting too deep
        text = "..."
    text = text if len(text) <= 60 else text[:57] + "..."
    # Lone surrogates would make the message itself unprintable: show them escaped.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _KINDS.get(type(value), type(value).__name__) + ("" if value is None else f" {text}")


def label(record: dict[str, Any], field: str, loc: str) -> str | None:
    """Optional `id`/`subset`/`group` as text: numeric ids (RewardBench, Parquet) become strings."""
    value = record.get(field)
    if isinstance(value, float):  # an int column with gaps comes back from pandas as floats
        value = None if math.isnan(value) else int(value) if value.is_integer() else value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if value is None or isinstance(value, str):
        return value if value is None else utf8_text(value, loc, field)
    raise bad(loc, field, "a string or a number", value, f"store {field!r} as text.")
