"""The columns every per-pair table adds: a pair named by its id, subset, group and record fields (`Pair.extra`).

The loaders read `prompt` (or `conversations` and `system`), `chosen`, `rejected`, `id`, `subset`,
`group` (and RewardBench 2's counts) and keep every other field of the record in `Pair.extra`.
`record_fields` (one JSON row) and `record_columns` (a table's columns) are the one owner of how a
pair is named in a result, so every output (`score --json`, `bench`, the audit's tables) joins back to
the user's data by `id` the same way:

- `id` (the pair's id, else its index), `subset`, `group`, then the extra fields in the record's order;
- an extra field whose name the table already uses for a result column is written as `record.<name>`;
- JSON keeps nested values (objects, lists) as JSON; a table (Parquet, CSV) holds them as JSON text,
  and a column whose values mix kinds (a number here, text there) as text, since a Parquet column has
  one type.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from ..errors import UsageError
from ._extra import IDENTITY, thawed
from ._pair import Pair


def record_fields(pair: Pair, pair_id: str, *, taken: Collection[str] = (), every: bool = False) -> dict[str, Any]:
    """One JSON row naming `pair`: `id` = `pair_id`, `subset` and `group` (left out where None unless
    `every`), then `pair.extra` thawed (nested values stay objects and lists); an extra name in `taken`
    (the row's own result keys) becomes `record.<name>`."""
    row: dict[str, Any] = {"id": pair_id}
    for name in IDENTITY[1:]:
        value = getattr(pair, name)
        if every or value is not None:
            row[name] = value
    for name, value in pair.extra.items():
        row[_free(name, taken)] = thawed(value)
    return row


def record_columns(pairs: Sequence[Pair], ids: Sequence[str], *, taken: Collection[str] = ()) -> dict[str, list[Any]]:
    """A table's naming columns for `pairs` (one row each, `ids` their ids): `id`, `subset`, `group`,
    then every extra field any pair has (None where a pair lacks it). Nested values are JSON text, and a
    column mixing kinds of scalar is text throughout (module docstring), so every column writes to Parquet."""
    if len(pairs) != len(ids):
        raise UsageError(f"record_columns needs one id per pair, got {len(ids)} ids for {len(pairs)} pairs")
    out: dict[str, list[Any]] = {"id": list(ids), "subset": [p.subset for p in pairs],
                                 "group": [p.group for p in pairs]}
    names = list(dict.fromkeys(name for p in pairs for name in p.extra))
    for name in names:
        column = [_cell(p.extra.get(name)) for p in pairs]
        out[_free(name, taken)] = _one_kind(column)
    return out


def _free(name: str, taken: Collection[str]) -> str:
    return f"record.{name}" if name in taken or name in IDENTITY else name


def _cell(value: Any) -> Any:
    plain = thawed(value)
    return json.dumps(plain, ensure_ascii=False) if isinstance(plain, (dict, list)) else plain


def _one_kind(column: list[Any]) -> list[Any]:
    """`column` as text when its values mix kinds (numbers count as one kind; None is a gap, any kind)."""
    kinds = {"number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
             for v in column if v is not None}
    if len(kinds) <= 1:
        return column
    return [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in column]
