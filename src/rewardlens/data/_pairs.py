"""Preference pairs in: loaders for the file formats users bring, into `Pair` records."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from ..errors import DataError, UsageError, require
from ..types import Message, Prompt
from ._checks import find
from ._extra import RESERVED, Extra
from ._fields import MISSING, bad, label, show
from ._groups import COUNTS, check_counts, combinations, csv_lists, listed, responses
from ._pair import Pair
from ._refusals import not_utf8, text_lines, unparsable, utf8_text

SUPPORTED = ".jsonl, .json, .csv, .parquet, or a folder written by Dataset(Dict).save_to_disk"
# ShareGPT speaker names -> chat-template roles; unknown names pass through unchanged.
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "system": "system", "observation": "tool", "tool": "tool", "function_call": "assistant"}
Records = Iterator[tuple[str, Any]]  # (location such as "line 3" or "record 0", raw record)


def load_pairs(path: str | os.PathLike[str], *, limit: int | None = None, strict: bool = False) -> list[Pair]:
    """Read preference pairs from a file or a saved Hugging Face dataset folder.

    Formats, by suffix: `.jsonl` (one record per line; blank lines skipped), `.json` (a list of
    records, or an object holding one such list, e.g. `{"data": [...]}`), `.csv`, `.parquet`; a
    folder is read with `datasets.load_from_disk` (a DatasetDict's "train" split, or its only one).
    Records follow any of these schemas:

    - RewardBench: `prompt` (string or messages), `chosen`, `rejected`, optional `id`, `subset`
      (and `group`, as `save_pairs` writes it). `chosen`/`rejected` may be whole conversations:
      the final assistant message is the response and, without `prompt`, the messages before it
      are the prompt.
    - RewardBench 2: `chosen` and `rejected` as lists of response texts (optional `num_correct`,
      `num_rejected`, `total_completions` must count them): one pair per (chosen, rejected)
      combination, adjacent, in order, sharing a `group` (the record's id, else its location).
    - LLaMA-Factory / ShareGPT DPO: `conversations` (`{"from", "value"}` or `{"role", "content"}`
      messages), optional `system`, and `chosen`/`rejected` as one message or a string.

    Messages of either style are read as `{"role", "content"}`; ShareGPT speakers become chat-template
    roles (case-insensitively: `human` → user, `gpt` → assistant, `system` → system, `observation` →
    tool, `function_call` → assistant; other names pass unchanged). A prompt must end on the turn the
    response answers: one ending on an assistant turn is refused. A record means the same in every
    format: in CSV a cell holding JSON messages is decoded and checked as JSONL checks them.

    Every field the schema does not read (`source`, `difficulty`, a nested `meta`, ...) is kept in
    `Pair.extra`, so results join back to the data (`record_fields`); a RewardBench 2 record's pairs
    share its fields. Reads at most `limit` records (a RewardBench 2 record counts once). Raises `DataError` naming
    file, line/record and field.

    Degenerate pairs (an empty or whitespace-only response, chosen identical to rejected, an id
    used twice, the same pair twice; see `check_pairs`) are counted and reported in one
    `DegeneratePairsWarning` (a `RewardLensWarning`) naming the first few by line/record;
    `strict=True` raises that report as a `DataError` instead.
    """
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be None or >= 0, got {limit}", option="limit")
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if not path.exists():
        raise DataError(f"{path}: no such file or directory. Fix: check the path (relative "
                        f"paths resolve against {Path.cwd()}).")
    if not path.is_dir() and suffix not in _READERS:
        raise DataError(f"{path}: unsupported file type {suffix or '(no suffix)'!r}; supported: "
                        f"{SUPPORTED}. Fix: convert the file or correct its suffix.")
    records = _read_dataset(path) if path.is_dir() else _READERS[suffix](path)
    located = [(where, pair) for where, record in islice(records, limit)
               for pair in _to_pairs(record, f"{path}, {where}", where)]
    pairs = [pair for _, pair in located]
    if not pairs and limit != 0:
        raise DataError(f"{path}: no records found. Fix: point at data with at least one record "
                        f"holding 'prompt' (or 'conversations'), 'chosen' and 'rejected'.")
    checks = find(pairs, [where for where, _ in located], str(path))
    if not checks.ok:
        if strict:
            raise checks.error()
        checks.warn(stacklevel=2)
    return pairs


def pairs_from_records(records: Sequence[Any], where: str = "request") -> list[Pair]:
    """Preference pairs from records already in memory (a JSON request's list), read by the rules of
    `load_pairs` (every schema it reads; `where` and the record's index locate a bad field in the
    `DataError`). The degenerate-pair checks are left to the caller."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise DataError(f"{where}: expected a list of pair records, found {show(records)}. Fix: send a list of "
                        "objects holding 'prompt', 'chosen' and 'rejected'.")
    return [pair for i, record in enumerate(records)
            for pair in _to_pairs(record, f"{where}, record {i}", f"record {i}")]


def save_pairs(pairs: Iterable[Pair], path: str | os.PathLike[str]) -> Path:
    """Write pairs as RewardBench-schema JSONL that `load_pairs` reads back equal; return the path.

    `id`/`subset`/`group` are written only when set, then the pair's `extra` fields; a RewardBench 2
    group is written as one line per pair, each naming its group. Messages are read back as `{"role", "content"}` with
    standard roles, so messages with other keys or ShareGPT roles do not round-trip.
    """
    path = Path(path).expanduser()
    if path.suffix.lower() != ".jsonl":
        raise UsageError(f"save_pairs writes JSON Lines; use a .jsonl path, got {str(path)!r}")
    with path.open("w", encoding="utf-8") as f:
        for pair in pairs:
            if not isinstance(pair, Pair):
                raise TypeError(f"save_pairs expects Pair objects, got {type(pair).__name__}")
            record = {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected,
                      "id": pair.id, "subset": pair.subset, "group": pair.group}
            record = {k: v for k, v in record.items() if v is not None}
            record.update(pair.extra.thaw() if isinstance(pair.extra, Extra) else pair.extra)
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


# Readers yield (location, raw record) lazily, so `limit` stops reading early.

def _read_jsonl(path: Path) -> Records:
    for n, line in text_lines(path):  # decoded line by line, so `limit` stops before a bad line
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {n}: invalid JSON ({e.msg} at column {e.pos + 1}). "
                            f"Fix: put one complete JSON object on each line.") from None
        except (ValueError, RecursionError) as e:  # an int over 4300 digits, or too deep
            raise unparsable(f"{path}, line {n}", e) from None
        yield f"line {n}", record


def _read_json(path: Path) -> Records:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    try:
        data = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as e:
        fix = "if it has one record per line, rename it to .jsonl" if e.msg == "Extra data" else ""
        raise DataError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno} ({e.msg}). "
                        f"Fix: {fix or 'repair the JSON'}.") from None
    except (ValueError, RecursionError) as e:
        raise unparsable(str(path), e) from None
    if isinstance(data, dict):
        lists = [key for key, value in data.items() if isinstance(value, list)]
        # A lone record also holds one list ("conversations"); don't take it for the records.
        if len(lists) == 1 and "chosen" not in data:
            data = data[lists[0]]
    if not isinstance(data, list):
        found = f"an object with keys {list(data)[:10]}" if isinstance(data, dict) else show(data)
        raise DataError(f"{path}: expected a list of records or an object holding one (like "
                        f"{{\"data\": [...]}}), found {found}. Fix: put the records in a list.")
    yield from ((f"record {i}", record) for i, record in enumerate(data))


def _read_csv(path: Path) -> Records:
    import pandas as pd

    # All cells as text, so ids like "007" survive; empty cells count as absent fields.
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except pd.errors.ParserError as e:
        raise DataError(f"{path}: not a readable CSV file ({' '.join(str(e).split())}). Fix: save it as "
                        f"UTF-8 CSV with a header row.") from None
    for i, row in enumerate(frame.to_dict("records")):
        yield f"record {i}", csv_lists({key: _decode_cell(cell) for key, cell in row.items() if cell != ""})


def _read_parquet(path: Path) -> Records:
    parquet = _require("pyarrow.parquet")
    i = 0
    try:  # batches are decoded lazily, so a file can fail after its first records too
        for batch in parquet.ParquetFile(path).iter_batches():
            for row in batch.to_pylist():
                yield f"record {i}", row
                i += 1
    except Exception as e:  # pyarrow raises several unrelated types for a non-Parquet file
        after = f" after record {i - 1}" if i else ""
        raise DataError(f"{path}: not a readable Parquet file{after} ({' '.join(str(e).split())}). "
                        f"Fix: check the file.") from None  # one line: pyarrow's messages hold line breaks


def _read_dataset(path: Path) -> Records:
    datasets = _require("datasets")
    try:
        data = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise DataError(f"{path}: a folder, but not one written by Dataset.save_to_disk or "
                        f"DatasetDict.save_to_disk. Fix: point at one, or at a file.") from None
    except Exception as e:  # a damaged folder: datasets raises JSON, key, Arrow and OS errors alike
        raise DataError(f"{path}: a saved dataset folder that cannot be read ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:200]}). Fix: save it again with save_to_disk, or "
                        f"point at a file.") from None
    where = ""
    if isinstance(data, datasets.DatasetDict):
        splits = list(data)
        if "train" not in data and len(splits) != 1:
            raise DataError(f"{path}: a DatasetDict with splits {splits} and no 'train' split. "
                            f"Fix: pass the folder of the split you want, e.g. {path / splits[0]}.")
        split = "train" if "train" in data else splits[0]
        data, where = data[split], f"split {split!r}, "
    i = 0
    try:  # rows are read from the Arrow files lazily, so a damaged file can fail after its first records
        for row in data:
            yield f"{where}record {i}", row
            i += 1
    except Exception as e:
        after = f" after {where}record {i - 1}" if i else ""
        raise DataError(f"{path}: a saved dataset folder that cannot be read{after} ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:200]}). Fix: save it again with save_to_disk.") from None


_READERS: dict[str, Callable[[Path], Records]] = {
    ".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def _require(module: str) -> Any:
    return require(module, "reading this format", "pip install 'rewardlens[data]'")


def _decode_cell(cell: str) -> Any:
    """A CSV cell holding JSON messages (as exporters write nested columns) becomes messages.

    The cell is messages when its JSON (one object, or a list) holds at least one whole message (a
    role and a text key). It is then read as JSONL reads the same value, so a message of it that
    lacks its role, or an entry that is no message, is refused as it would be there, not taken for
    literal text. JSON holding no whole message (`[1, 2]`, `{"role": "user"}`) stays text.
    """
    try:
        parsed = json.loads(cell) if cell[:1] in ("[", "{") else cell
    except (ValueError, RecursionError):  # not JSON (or JSON too deep to be messages): text
        return cell
    items = parsed if isinstance(parsed, list) else [parsed]
    whole = [isinstance(m, dict) and bool({"role", "from"} & m.keys()) and bool({"content", "value"} & m.keys())
             for m in items]
    return parsed if any(whole) else cell


def _to_pairs(record: Any, loc: str, where: str) -> list[Pair]:
    """The pairs of one record: one, or one per combination of a RewardBench 2 record (`_groups`)."""
    if not isinstance(record, dict):
        raise DataError(f"{loc}: expected an object with 'prompt' (or 'conversations'), 'chosen' "
                        f"and 'rejected', found {show(record)}. Fix: make each record an object.")
    for field in ("chosen", "rejected"):
        if record.get(field) is None:
            raise bad(loc, field, "the response text or message", record.get(field, MISSING),
                      f"every record needs 'chosen' and 'rejected'; it has {sorted(record)}.")
    ident, subset = label(record, "id", loc), label(record, "subset", loc)
    extra = _unread(record)
    if listed(record):
        chosen_list, rejected_list = (responses(record[f], loc, f) for f in ("chosen", "rejected"))
        check_counts(record, loc, len(chosen_list), len(rejected_list))
        prompt = _prompt(record, loc, [])
        return [Pair(prompt, c, r, pair_id, subset, group, extra)
                for c, r, pair_id, group in combinations(chosen_list, rejected_list, ident, where)]
    chosen, chosen_context = _response(record["chosen"], loc, "chosen")
    rejected, rejected_context = _response(record["rejected"], loc, "rejected")
    contexts = [c for c in (chosen_context, rejected_context) if c is not None]
    return [Pair(_prompt(record, loc, contexts), chosen, rejected, ident, subset, label(record, "group", loc), extra)]


def _read_fields(record: dict[str, Any]) -> set[str]:
    """The fields of `record` the loader reads: `Pair`'s own, the prompt's source (`conversations` and
    `system`, whose `prompt` is then not read but still reserved), and RewardBench 2's counts."""
    read = set(RESERVED) | {"conversations"}
    if record.get("conversations") is not None:  # `system` is read only beside `conversations`
        read.add("system")
    if listed(record):
        read |= {field for field, _ in COUNTS} | {"total_completions"}
    return read


def _unread(record: dict[str, Any]) -> Extra:
    """Every field of `record` the loader does not read, in the record's order (`Pair.extra`)."""
    read = _read_fields(record)
    return Extra({str(k): v for k, v in record.items() if str(k) not in read})


def _prompt(record: dict[str, Any], loc: str, contexts: list[list[Message]]) -> Prompt:
    """The prompt: `prompt`, or `conversations` (+ `system`), or the turns before whole-conversation responses."""
    field = "conversations" if record.get("conversations") is not None else "prompt"
    prompt, system = record.get(field), record.get("system")
    if field == "conversations":  # LLaMA-Factory / ShareGPT
        if system is not None and not isinstance(system, str):
            raise bad(loc, "system", "a string", system, "give the system prompt as text.")
        prompt = _messages(prompt, loc, field)
        if system:
            prompt = [{"role": "system", "content": utf8_text(system, loc, "system")}] + prompt
    elif isinstance(prompt, list):
        prompt = _messages(prompt, loc, field)
    elif prompt is None:  # the prompt may still come from whole conversations in chosen/rejected
        if not contexts:
            raise bad(loc, "prompt", "a prompt (or 'conversations', or chosen/rejected as "
                      "whole conversations)", MISSING, f"add a 'prompt'; the record has "
                      f"{sorted(record)}.")
        if contexts[0] != contexts[-1]:
            raise DataError(f"{loc}: field 'prompt' is missing and the conversations in 'chosen' "
                            f"and 'rejected' differ before their final assistant message. Fix: "
                            f"add a 'prompt', or give both the same turns before the response.")
        prompt = contexts[0]
    elif not isinstance(prompt, str):
        raise bad(loc, field, "a string or a list of messages", prompt,
                  "give the prompt as text or as [{\"role\": \"user\", \"content\": ...}].")
    else:
        utf8_text(prompt, loc, field)
    if prompt == []:
        raise bad(loc, field, "at least one message", prompt, "add the turns before the response.")
    if isinstance(prompt, list):  # named where the record holds it: a system prompt is not counted
        given = field if record.get(field) is not None else "chosen"
        _answerable(prompt, loc, f"{given}[{len(record.get(field) or prompt) - 1}]")
    return prompt


def _answerable(prompt: list[Message], loc: str, last: str) -> None:
    """Refuse a prompt whose last turn (`last`, as the record names it) is the assistant's: the response
    would follow its own turn, which a chat template renders as two assistant turns in a row (or
    refuses), so the pair would score another conversation than the one meant."""
    if prompt[-1]["role"] == "assistant":
        raise bad(loc, last, "a prompt ending on the turn the response answers (user, system or tool)",
                  prompt[-1], f"drop the trailing assistant turn {last} (if it is the response, it belongs in "
                  "'chosen' and 'rejected').")


def _response(value: Any, loc: str, field: str) -> tuple[str, list[Message] | None]:
    """The response text, plus the messages before it when `value` is a whole conversation."""
    if isinstance(value, str):
        return utf8_text(value, loc, field), None
    if isinstance(value, dict):
        return _message(value, loc, field)["content"], None
    if not isinstance(value, list):
        raise bad(loc, field, "a string, a message, or a list of messages", value,
                  "give the response text, e.g. \"chosen\": \"The answer is 4.\".")
    messages = _messages(value, loc, field)
    if not messages or messages[-1]["role"] != "assistant":
        raise bad(loc, field, "a conversation ending with an assistant message",
                  value[-1] if value else value, "end the conversation with the response.")
    return messages[-1]["content"], messages[:-1]


def _messages(value: Any, loc: str, field: str) -> list[Message]:
    if not isinstance(value, list):
        raise bad(loc, field, "a list of messages", value, "use [{\"role\": \"user\", "
                  "\"content\": ...}] or [{\"from\": \"human\", \"value\": ...}].")
    return [_message(m, loc, f"{field}[{i}]") for i, m in enumerate(value)]


def _message(value: Any, loc: str, field: str) -> Message:
    if not isinstance(value, dict):
        raise bad(loc, field, "a message {\"role\", \"content\"} or {\"from\", \"value\"}", value,
                  "write each message as an object.")
    # Arrow fills absent struct keys with None, so the keys holding values decide the style (a message
    # holding none is read as {"role", "content"} in every format).
    sharegpt = value.get("role") is None and value.get("content") is None and (
        value.get("from") is not None or value.get("value") is not None)
    role_key, text_key = ("from", "value") if sharegpt else ("role", "content")
    role, text = value.get(role_key, MISSING), value.get(text_key, MISSING)
    if not isinstance(role, str):
        raise bad(loc, f"{field}.{role_key}", "a role such as \"user\" or \"human\"", role,
                  "give every message a role.")
    if not isinstance(text, str):
        raise bad(loc, f"{field}.{text_key}", "the message text as a string", text,
                  "give every message its text (multimodal content lists are not supported).")
    utf8_text(role, loc, f"{field}.{role_key}")
    utf8_text(text, loc, f"{field}.{text_key}")
    return {"role": _ROLES.get(role.lower(), role), "content": text}
