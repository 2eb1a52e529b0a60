"""The loader's formats, fuzzed against each other: a record means the same in JSONL, JSON, CSV and Parquet.

Properties: (1) one generated record, well formed or not (messages lacking a role or a text, ShareGPT and
role/content styles mixed, prompts ending on an assistant turn, odd text, numeric ids), written to all four
formats, loads to the same pairs in each, or is refused in each with a `DataError` naming the same field;
(2) hostile files (random bytes, truncated or ragged files, another format's bytes under a suffix, a damaged
saved-dataset folder) load to pairs or raise the library's own error class (`RewardLensError`) as one line,
never another exception type.
Hypothesis runs derandomized and without an example database, so every run tests the same examples.
"""

from __future__ import annotations

import csv
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from rewardlens.data import Pair, load_pairs
from rewardlens.errors import DataError, DegeneratePairsWarning, RewardLensError

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FUZZ = settings(max_examples=int(os.environ.get("REWARDLENS_FUZZ_EXAMPLES", "60")), deadline=None,
                derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS = (".jsonl", ".json", ".csv", ".parquet")

# ---- one record, representable in every format ------------------------------------------------------
# A CSV cell cannot hold "" (it reads as a missing field), and a top-level text that starts like JSON is
# ambiguous there (it may be a cell of messages): plain texts avoid both. Lone surrogates are another test's.

ODD = ["مرحبا", "\u202eolleh\u202c", "a\u0301", " lead", "trail ", "two\nlines", "cr\rhere", "tab\t", "null", "NaN",
       "007", "𝔘 👍🏽", "\x00nul", "\u2028"]
TEXT = (st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=10) | st.sampled_from(ODD)).filter(
    lambda t: t[:1] not in ("[", "{"))
ROLES = st.sampled_from(["user", "assistant", "system", "tool", "human", "gpt", "Human", "GPT", "observation",
                         "function_call", "narrator"])
KEYS = (("role", "content"), ("from", "value"))


@st.composite
def message(draw: st.DrawFn) -> dict[str, Any]:
    """A message of either style, sometimes missing its role or its text, or holding a None."""
    role_key, text_key = draw(st.sampled_from(KEYS))
    out: dict[str, Any] = {}
    if draw(st.integers(0, 9)):  # one in ten lacks its role
        out[role_key] = draw(ROLES | st.none())
    if draw(st.integers(0, 9)):
        out[text_key] = draw(TEXT | st.none())
    return out or {role_key: draw(ROLES)}  # never {}: Arrow cannot store a struct without fields


def whole(m: dict[str, Any]) -> bool:
    """A message with a role key and a text key (whatever they hold): what makes a CSV cell messages."""
    return bool({"role", "from"} & m.keys() and {"content", "value"} & m.keys())


@st.composite
def messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One to three messages, at least one of them whole: JSON holding none is text in a CSV cell (the
    documented rule), so only such values mean one thing in every format."""
    out = draw(st.lists(message(), min_size=1, max_size=3))
    if not any(map(whole, out)):
        out[draw(st.integers(0, len(out) - 1))] = {"role": draw(ROLES), "content": draw(TEXT)}
    return out


@st.composite
def response(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["text", "text", "message", "conversation"]))
    if kind == "text":
        return draw(TEXT)
    if kind == "message":  # one message alone: whole, or a CSV cell would hold text (see `messages`)
        return draw(message().filter(whole))
    return draw(messages()) + [{"role": "assistant", "content": draw(TEXT)}]


@st.composite
def record(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"chosen": draw(response()), "rejected": draw(response())}
    prompt = draw(st.sampled_from(["text", "messages", "conversations", "none"]))
    if prompt == "text":
        out["prompt"] = draw(TEXT)
    elif prompt == "messages":
        out["prompt"] = draw(messages())
    elif prompt == "conversations":
        out["conversations"] = draw(messages())
        if draw(st.booleans()):
            out["system"] = draw(TEXT)
    if draw(st.booleans()):
        out["id"] = draw(st.integers(-10**6, 10**6) | TEXT)
    if draw(st.booleans()):
        out["subset"] = draw(TEXT)
    return out


def write(folder: Path, suffix: str, rec: dict[str, Any]) -> Path:
    """`rec` as the one record of a file: nested values as JSON text in CSV, as Arrow structs in Parquet."""
    path = folder / f"pairs{suffix}"
    if suffix == ".jsonl":
        path.write_text(json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps([rec], ensure_ascii=False), encoding="utf-8")
    elif suffix == ".csv":
        row = {k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for k, v in rec.items()}
        pd.DataFrame([row], dtype=object).to_csv(path, index=False, quoting=csv.QUOTE_ALL)
    else:
        try:
            pq.write_table(pa.Table.from_pylist([rec]), path)
        except (pa.ArrowException, ValueError, TypeError):  # e.g. a list of messages of clashing field types
            reject()
    return path


FIELD = re.compile(r"field '([^']*)'")


def outcome(path: Path) -> tuple[str, Any]:
    """("pairs", the pairs) or ("refused", the field the error names, None if it names none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePairsWarning)
        try:
            return "pairs", load_pairs(path)
        except DataError as e:
            assert str(e).startswith(str(path)) and "Fix: " in str(e), str(e)
            found = FIELD.search(str(e))
            return "refused", found and found.group(1)


@FUZZ
@given(rec=record())
def test_a_record_means_the_same_in_every_format(rec):
    with tempfile.TemporaryDirectory() as folder:
        results = {suffix: outcome(write(Path(folder), suffix, rec)) for suffix in FORMATS}
    assert len(set(map(repr, results.values()))) == 1, results


def test_the_formats_disagreed_on_a_message_without_its_role(tmp_path):
    """What the property above found first: CSV took a cell of messages with one lacking its role for
    literal prompt text, where JSONL (and Parquet) refused the record."""
    rec = {"prompt": [{"role": "user", "content": "Hi"}, {"content": "More?"}], "chosen": "a", "rejected": "b"}
    assert {suffix: outcome(write(tmp_path, suffix, rec)) for suffix in FORMATS} == dict.fromkeys(
        FORMATS, ("refused", "prompt[1].role"))


def test_a_message_holding_no_value_is_read_in_one_style_everywhere(tmp_path):
    """Arrow fills a struct's absent keys with None; a message with nothing in either style's keys was read
    as ShareGPT-style in Parquet (refused for its 'from') and as role/content-style elsewhere."""
    rec = {"prompt": [{"from": "human", "value": "Hi"}, {"role": None}], "chosen": "a", "rejected": "b"}
    assert {suffix: outcome(write(tmp_path, suffix, rec)) for suffix in FORMATS} == dict.fromkeys(
        FORMATS, ("refused", "prompt[1].role"))


# ---- hostile files: the library's own error, never another type ------------------------------------

GOOD = b'{"prompt": "p", "chosen": "a", "rejected": "b"}'


@st.composite
def hostile_bytes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "cut", "spliced", "ragged_csv", "parquet_cut", "nested"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    if kind == "cut":  # a good file of any format, cut anywhere
        whole = draw(st.sampled_from([GOOD + b"\n" + GOOD, b"[" + GOOD + b"]", b"prompt,chosen,rejected\np,a,b\n"]))
        return whole[:draw(st.integers(0, len(whole)))]
    if kind == "spliced":  # random bytes inside a good record
        at = draw(st.integers(0, len(GOOD)))
        return GOOD[:at] + draw(st.binary(min_size=1, max_size=8)) + GOOD[at:]
    if kind == "ragged_csv":
        rows = draw(st.lists(st.lists(st.sampled_from(["p", "a", '"b', "", '""', "x,y", "[", "{}", "\r"]), max_size=5),
                             max_size=4))
        return ("prompt,chosen,rejected\n" + "\n".join(",".join(r) for r in rows)).encode()
    if kind == "parquet_cut":
        table = pa.Table.from_pylist([{"prompt": "p", "chosen": "a", "rejected": "b"}] * 3)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        whole = sink.getvalue().to_pybytes()
        at = draw(st.integers(0, len(whole)))
        return whole[:at] + draw(st.binary(max_size=16)) + whole[at + 16:]
    depth = draw(st.integers(1, 40))
    return (b"[" * depth + GOOD + b"]" * draw(st.integers(0, depth))) + b"\n"


def loads_or_refuses(path: Path, strict: bool) -> None:
    """`load_pairs(path)` gives valid pairs or the library's own error as one printable line; nothing else."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePairsWarning)
        try:
            pairs = load_pairs(path, strict=strict)
        except RewardLensError as e:
            message = str(e)
            message.encode("utf-8")
            assert "\n" not in message and "Fix: " in message, message
            return
    assert pairs and all(isinstance(p, Pair) for p in pairs)


@FUZZ
@given(content=hostile_bytes(), suffix=st.sampled_from(FORMATS), strict=st.booleans())
def test_hostile_files_load_or_raise_the_librarys_own_error(content, suffix, strict):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"pairs{suffix}"
        path.write_bytes(content)
        loads_or_refuses(path, strict)


_SAVED: dict[str, bytes] = {}


def saved_dataset() -> dict[str, bytes]:
    """The files of a small saved Hugging Face dataset (built once), by name."""
    if not _SAVED:
        datasets = pytest.importorskip("datasets")
        with tempfile.TemporaryDirectory() as folder:
            rows = [{"prompt": "p", "chosen": f"a{i}", "rejected": "b"} for i in range(3)]
            datasets.Dataset.from_list(rows).save_to_disk(folder)
            _SAVED.update({f.name: f.read_bytes() for f in Path(folder).iterdir()})
    return _SAVED


@FUZZ
@given(data=st.data())
def test_a_damaged_saved_dataset_folder_raises_the_librarys_own_error(data):
    """Before, a damaged state.json raised JSONDecodeError or KeyError out of `datasets`."""
    files = dict(saved_dataset())
    name = data.draw(st.sampled_from(sorted(files)))
    how = data.draw(st.sampled_from(["cut", "garbage", "splice", "drop", "json"]))
    whole = files[name]
    at = data.draw(st.integers(0, len(whole)))
    if how == "drop":
        del files[name]
    elif how == "json":  # valid JSON of the wrong shape
        files[name] = json.dumps(data.draw(st.sampled_from([{}, [], None, 3, {"_data_files": [{}]}]))).encode()
    else:
        noise = data.draw(st.binary(min_size=1, max_size=16))
        files[name] = {"cut": whole[:at], "garbage": noise, "splice": whole[:at] + noise + whole[at + len(noise):]}[how]
    with tempfile.TemporaryDirectory() as folder:
        for file, content in files.items():
            (Path(folder) / file).write_bytes(content)
        loads_or_refuses(Path(folder), strict=False)
