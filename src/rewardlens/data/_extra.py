"""`Extra`: a record's other fields, read-only, as `Pair.extra` holds them (a leaf: it imports nothing of
rewardlens), and the names `Pair` holds itself.

Nested objects are kept as `Extra`, lists as tuples, so a frozen `Pair` cannot be changed through its
fields; `thaw` gives plain dicts, lists and JSON scalars back (`_record` names pairs in tables with it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

IDENTITY = ("id", "subset", "group")
"""The identity columns, first in every table, in this order."""
RESERVED = frozenset({*IDENTITY, "prompt", "chosen", "rejected"})
"""Names `Pair` holds itself: never an extra field."""
_SCALARS = (str, int, float, bool, type(None))


class Extra(Mapping[str, Any]):
    """A read-only mapping of a record's other fields: nested objects become `Extra`, lists tuples, so
    a frozen `Pair` cannot be changed through it. `thaw()` gives plain JSON-style dicts and lists back."""

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items: dict[str, Any] = {str(k): _freeze(v) for k, v in (items or {}).items()}

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Extra({self.thaw()!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Extra:
        return self  # immutable: `dataclasses.asdict` and `copy.deepcopy` may share it

    def thaw(self) -> dict[str, Any]:
        """The fields as plain Python: dicts, lists and JSON scalars (other values, such as a Parquet
        timestamp, as their text)."""
        return {k: thawed(v) for k, v in self._items.items()}


def _freeze(value: Any) -> Any:
    if isinstance(value, Extra):
        return value
    if isinstance(value, Mapping):
        return Extra(value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    if isinstance(value, Extra):
        return value.thaw()
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    item = getattr(value, "item", None)  # a numpy scalar
    return item() if callable(item) and getattr(value, "ndim", None) == 0 else str(value)
