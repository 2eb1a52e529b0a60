"""RewardBench 2 records: one chosen response against a list of rejected ones, read as grouped pairs.

RewardBench 2 (allenai/reward-bench-2) stores each prompt once, with `chosen` and `rejected` as
LISTS of response texts (one chosen against three rejected, except in its Ties subset), and
optionally `num_correct`, `num_rejected` and `total_completions` counting them. Such a record
becomes one `Pair` per (chosen, rejected) combination, chosen-major (chosen 0 against rejected 0,
1, 2, then chosen 1 ...), all carrying the same `group`: the record's `id`, or its location in the
file (`line 3`) when it has none. The pairs of a group are adjacent and in the record's order, so
best-of-N can be scored from them (`rewardlens.bench`). Pair ids are `<id>/<k>` (`<id>/<j>-<k>`
with several chosen responses), or none when the record has no id.

A record is read this way when `chosen` or `rejected` is a list whose first entry is a string; a
list of messages is still a whole conversation (the RewardBench 1 convention). The count fields,
when present, must agree with the lists. In CSV, where lists arrive as JSON text, both cells must
hold a JSON list of strings to be read as lists: one response that merely looks like a JSON list
stays text.
"""

from __future__ import annotations

import json
from typing import Any

from ._fields import bad
from ._refusals import utf8_text

COUNTS = (("num_correct", "chosen"), ("num_rejected", "rejected"))
"""RewardBench 2's count fields and the list each one counts."""


def listed(record: dict[str, Any]) -> bool:
    """Whether `record` is RewardBench 2-style: `chosen` or `rejected` is a list of response texts."""
    return any(isinstance(v, list) and bool(v) and isinstance(v[0], str)
               for v in (record.get("chosen"), record.get("rejected")))


def responses(value: Any, loc: str, field: str) -> list[str]:
    """The response texts of `chosen` or `rejected` in a RewardBench 2 record (one string counts as one)."""
    if isinstance(value, str):
        return [utf8_text(value, loc, field)]
    if not isinstance(value, list) or not value:
        raise bad(loc, field, "a response text or a non-empty list of response texts", value,
                  f"give {field!r} as a string or as [\"first response\", \"second response\", ...].")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise bad(loc, f"{field}[{i}]", "a response text (a RewardBench 2 list holds one response per "
                      "entry)", text, f"give every entry of {field!r} as a string.")
        utf8_text(text, loc, f"{field}[{i}]")
    return list(value)


def check_counts(record: dict[str, Any], loc: str, n_chosen: int, n_rejected: int) -> None:
    """Refuse `num_correct`/`num_rejected`/`total_completions` that disagree with the lists they count."""
    expected = {"num_correct": n_chosen, "num_rejected": n_rejected, "total_completions": n_chosen + n_rejected}
    what = {"num_correct": "'chosen'", "num_rejected": "'rejected'", "total_completions": "'chosen' and 'rejected'"}
    for field, n in expected.items():
        value = record.get(field)
        if value is None:
            continue
        if _count(value) != n:
            raise bad(loc, field, f"the number of responses in {what[field]} ({n})", value,
                      f"make {field!r} count the responses listed, or leave it out.")


def combinations(chosen: list[str], rejected: list[str], record_id: str | None,
                 where: str) -> list[tuple[str, str, str | None, str]]:
    """(chosen, rejected, pair id, group) of every combination, chosen-major."""
    group = record_id if record_id is not None else where
    one = len(chosen) == 1
    return [(c, r, None if record_id is None else f"{record_id}/{k if one else f'{j}-{k}'}", group)
            for j, c in enumerate(chosen) for k, r in enumerate(rejected)]


def csv_lists(record: dict[str, Any]) -> dict[str, Any]:
    """A CSV record whose `chosen` and `rejected` cells both hold JSON lists of strings, with the lists."""
    cells = [_string_list(record.get(field)) for field in ("chosen", "rejected")]
    if cells[0] is None or cells[1] is None:
        return record
    return {**record, "chosen": cells[0], "rejected": cells[1]}


def _string_list(cell: Any) -> list[str] | None:
    if not isinstance(cell, str) or cell[:1] != "[":
        return None
    try:
        value = json.loads(cell)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    return value if ok else None


def _count(value: Any) -> int | None:
    """A count as an int: a number, a whole float (pandas), or digits (CSV); None if it is none of them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None
