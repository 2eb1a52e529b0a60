"""The loader, fuzzed: records of every schema in every file format, well formed and not.

Properties: well-formed records load to exactly the expected pairs; anything else either loads to
valid pairs (strings that encode as UTF-8, messages with a role and content) or raises a
`DataError` that names the file, says how to fix it, prints as UTF-8 and, when it names a record
(line or index), names the first bad one: everything before it loads. A lone surrogate (the JSON
escape "\\ud800") is refused naming the line and the field. Hypothesis runs derandomized and
without an example database, so every run tests the same examples (a flaky test is a bug).
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardlens.data import CHECK_KINDS, Pair, check_pairs, load_pairs
from rewardlens.errors import DataError, DegeneratePairsWarning

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# REWARDLENS_FUZZ_EXAMPLES=2000 fuzzes deeper locally; the default keeps this file well under a minute.
FUZZ = settings(max_examples=int(os.environ.get("REWARDLENS_FUZZ_EXAMPLES", "60")), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FORMATS = ["jsonl", "json", "json-wrapped", "csv", "parquet"]
SUFFIX = {"jsonl": ".jsonl", "json": ".json", "json-wrapped": ".json", "csv": ".csv", "parquet": ".parquet"}

# ---- text ------------------------------------------------------------------------------------------

RTL = ["مرحبا بالعالم", "שלום עולם", "\u202eolleh\u202c", "\u200f\u061c!", "a\u0301\u0308"]
ODD = [" ", "\t\n", "\u2028\u2029", "\ufeffbom", "\x00nul", "\r", "null", "[1, 2]", '{"role": "user"}',
       "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👍🏽"]
HUGE = st.integers(50_000, 200_000).map(lambda n: "Ω" * n)
LONE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12) | st.sampled_from(RTL + ODD) | HUGE
TEXT_OR_SURROGATE = TEXT | st.builds(lambda a, s, b: a + s + b, TEXT, LONE, TEXT)
ROLES = ["user", "assistant", "system", "human", "gpt", "Human", "tool", "narrator"]
ANSWERABLE = ["user", "system", "human", "Human", "tool", "narrator"]  # what a prompt may end on
ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
            "tool": "tool"}  # the loader's mapping, on lower-cased names; others pass unchanged


def _role(name: str) -> str:
    return ROLE_MAP.get(name.lower(), name)


# ---- well-formed records: (record, the Pair it must load as) ---------------------------------------

SHAPES = st.fixed_dictionaries({
    "schema": st.sampled_from(["rewardbench", "sharegpt", "conversation"]),
    "messages": st.booleans(),             # rewardbench: prompt as messages; sharegpt: responses as messages
    "id": st.sampled_from([None, "int", "str"]),
    "subset": st.booleans(),
    "system": st.booleans(),
})


@st.composite
def well_formed(draw: st.DrawFn, shape: dict[str, Any], text: st.SearchStrategy[str]) -> tuple[dict, Pair]:
    """One record of `shape` (so a file's records share column types) and its expected Pair."""
    def messages(keys: tuple[str, str], n: int) -> tuple[list[dict], list[dict]]:
        # A prompt ends on a turn the response answers: one ending on the assistant's is refused.
        roles = [draw(st.sampled_from(ROLES)) for _ in range(n - 1)] + [draw(st.sampled_from(ANSWERABLE))]
        texts = [draw(text) for _ in range(n)]
        return ([{keys[0]: r, keys[1]: t} for r, t in zip(roles, texts)],
                [{"role": _role(r), "content": t} for r, t in zip(roles, texts)])

    chosen, rejected = draw(text), draw(text)
    record: dict[str, Any]
    if shape["schema"] == "rewardbench":
        prompt, expected = messages(("role", "content"), draw(st.integers(1, 3))) if shape["messages"] else (
            (p := draw(text)), p)
        record = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    elif shape["schema"] == "sharegpt":
        turns, expected = messages(("from", "value"), draw(st.integers(1, 3)))
        record = {"conversations": turns}
        if shape["system"]:
            system = draw(text)
            record["system"] = system
            expected = ([{"role": "system", "content": system}] if system else []) + expected
        wrap = (lambda t: {"from": "gpt", "value": t}) if shape["messages"] else (lambda t: t)
        record |= {"chosen": wrap(chosen), "rejected": wrap(rejected)}
    else:  # whole conversations in chosen and rejected, the prompt being the turns they share
        context, expected = messages(("role", "content"), draw(st.integers(1, 3)))
        record = {"chosen": context + [{"role": "assistant", "content": chosen}],
                  "rejected": context + [{"role": "assistant", "content": rejected}]}
    ident = None
    if shape["id"] and draw(st.booleans()):
        ident = draw(st.integers(-10**12, 10**12)) if shape["id"] == "int" else draw(text)
        record["id"] = ident
    subset = draw(text) if shape["subset"] and draw(st.booleans()) else None
    if subset is not None:
        record["subset"] = subset
    return record, Pair(expected, chosen, rejected, None if ident is None else str(ident), subset)


@st.composite
def well_formed_files(draw: st.DrawFn, fmt: str) -> tuple[list[dict], list[Pair]]:
    shape = draw(SHAPES)
    # A CSV cell cannot hold an empty string (it reads as a missing field).
    text = TEXT.filter(bool) if fmt == "csv" else TEXT
    rows = draw(st.lists(well_formed(shape, text), min_size=1, max_size=4))
    return [r for r, _ in rows], [p for _, p in rows]


# ---- anything: well-formed records mutated, random objects, non-objects -----------------------------

FIELDS = ["prompt", "chosen", "rejected", "id", "subset", "conversations", "system", "role", "content", "from",
          "value", "messages", "instruction"]
KEYS = st.sampled_from(FIELDS) | st.text(max_size=4)
LEAVES = (st.none() | st.booleans() | st.integers() | st.integers(10**18, 10**30) | st.floats()
          | TEXT_OR_SURROGATE)
VALUES = st.recursive(LEAVES, lambda c: st.lists(c, max_size=3) | st.dictionaries(KEYS, c, max_size=3),
                      max_leaves=8)
DEEP = st.integers(20, 60).map(lambda d: json.loads("[" * d + "]" * d))


@st.composite
def any_record(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["mutated", "mutated", "random", "value"]))
    if kind == "value":
        return draw(VALUES | DEEP)
    if kind == "random":
        return draw(st.dictionaries(KEYS, VALUES | DEEP, max_size=6))
    record, _ = draw(well_formed(draw(SHAPES), TEXT))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(record)) | KEYS if record else KEYS)
        action = draw(st.sampled_from(["drop", "set", "set"]))
        if action == "drop":
            record.pop(key, None)
        else:
            record[key] = draw(VALUES | DEEP)
    return record


# ---- writers ----------------------------------------------------------------------------------------


def _dump(value: Any, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


def write(folder: Path, fmt: str, records: list[Any], ascii_only: bool = True, quote_all: bool = True) -> Path:
    """`records` in `fmt`; unencodable text (lone surrogates) written as invalid UTF-8 bytes unless escaped.

    `quote_all=False` writes CSV as pandas does by default, which leaves a lone "\r" in a cell
    unquoted: any CSV reader then takes it for a line break."""
    path = folder / f"pairs{SUFFIX[fmt]}"
    if fmt == "jsonl":
        text = "".join(_dump(r, ascii_only) + "\n" for r in records)
    elif fmt in ("json", "json-wrapped"):
        text = _dump(records if fmt == "json" else {"data": records}, ascii_only)
    elif fmt == "csv":
        rows = [{k: _dump(v, ascii_only) if isinstance(v, (list, dict)) else v for k, v in r.items()}
                for r in records if isinstance(r, dict)]
        pd.DataFrame(rows, dtype=object).to_csv(path, index=False, errors="surrogatepass",
                                                quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL)
        return path
    else:
        _write_parquet(path, [r for r in records if isinstance(r, dict)])
        return path
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def _write_parquet(path: Path, records: list[dict]) -> None:
    columns = sorted({k for r in records for k in r}) or ["empty"]
    data = {k: [r.get(k) for r in records] for k in columns}
    try:
        pq.write_table(pa.Table.from_pydict(data), path)
    except Exception:  # mixed types, empty structs, huge ints, surrogates: store such columns as JSON text
        for key, values in data.items():
            try:
                pa.array(values)
            except Exception:
                data[key] = [None if v is None else json.dumps(v) for v in values]
        try:
            pq.write_table(pa.Table.from_pydict(data), path)
        except Exception:
            pq.write_table(pa.Table.from_pydict({k: [None if v is None else json.dumps(v) for v in vs]
                                                  for k, vs in data.items()}), path)


# ---- checks -----------------------------------------------------------------------------------------


def load(path: Path, **kwargs: Any) -> list[Pair]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePairsWarning)
        return load_pairs(path, **kwargs)


def assert_valid(pair: Pair) -> None:
    assert isinstance(pair, Pair)
    texts = [pair.chosen, pair.rejected]
    if isinstance(pair.prompt, list):
        assert pair.prompt and all(set(m) == {"role", "content"} for m in pair.prompt)
        texts += [t for m in pair.prompt for t in (m["role"], m["content"])]
    else:
        texts.append(pair.prompt)
    texts += [t for t in (pair.id, pair.subset) if t is not None]
    for text in texts:
        assert isinstance(text, str)
        text.encode("utf-8")  # no lone surrogate got through


FILE_LEVEL = re.compile(
    r"no records found|expected a list of records|pairs are degenerate|not a readable (CSV|Parquet) file")


def assert_loads_or_names_the_record(path: Path, fmt: str, strict: bool) -> None:
    try:
        pairs = load(path, strict=strict)
    except DataError as e:
        message = str(e)
        message.encode("utf-8")  # printable: nothing from the data breaks the message itself
        assert message.startswith(str(path)) and "Fix: " in message, message
        named = re.match(re.escape(str(path)) + r", (line|record) (\d+): ", message)
        assert named or FILE_LEVEL.search(message), message
        if named and (named[1] == "record" or fmt == "jsonl"):  # JSONL: one record per line
            before = int(named[2]) - (named[1] == "line")
            assert len(load(path, limit=before)) == before  # everything before the named record loads
        return
    assert pairs
    for pair in pairs:
        assert_valid(pair)
    checks = check_pairs(pairs, quiet=True)
    checks.describe().encode("utf-8")
    assert not strict or checks.ok


# ---- tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_well_formed_records_load_exactly(fmt, data):
    records, expected = data.draw(well_formed_files(fmt))
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), fmt, records, ascii_only=data.draw(st.booleans()))
        assert load(path) == expected


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(records=st.lists(any_record(), min_size=0, max_size=4), ascii_only=st.booleans(), quote_all=st.booleans(),
       strict=st.booleans())
def test_anything_loads_valid_pairs_or_names_the_bad_record(fmt, records, ascii_only, quote_all, strict):
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), fmt, records, ascii_only, quote_all)
        assert_loads_or_names_the_record(path, fmt, strict)


def _string_leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, str):
        return [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [leaf for key, item in items for leaf in _string_leaves(item, (*path, key))]


def _field(path: tuple) -> str:
    return path[0] + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
@FUZZ
@given(data=st.data())
def test_a_lone_surrogate_is_refused_naming_line_and_field(fmt, data):
    records, _ = data.draw(well_formed_files(fmt))
    records = json.loads(json.dumps(records))  # a copy: chosen and rejected conversations share messages
    row = data.draw(st.integers(0, len(records) - 1))
    leaf = data.draw(st.sampled_from(_string_leaves(records[row])))
    *parents, last = leaf
    holder = records[row]
    for key in parents:
        holder = holder[key]
    text, surrogate = holder[last], data.draw(LONE)
    at = data.draw(st.integers(0, len(text)))
    holder[last] = text[:at] + surrogate + text[at:]
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), fmt, records, ascii_only=True)  # escaped: valid JSON, valid UTF-8
        where = f"line {row + 1}" if fmt == "jsonl" else f"record {row}"
        with pytest.raises(DataError) as info:
            load(path)
        if row:
            assert len(load(path, limit=row)) == row
    message = str(info.value)
    assert message.startswith(f"{path}, {where}: field {_field(leaf)!r}: expected text encodable as UTF-8, "
                              f"found a lone surrogate {ascii(surrogate)[1:-1]} at character {at}. Fix: ")
    message.encode("utf-8")


@FUZZ
@given(st.lists(st.builds(Pair, st.sampled_from(["p", "q"]), st.sampled_from(["", " ", "a", "b"]),
                          st.sampled_from(["", "a", "b"]), st.sampled_from([None, "1", "2"])), max_size=8))
def test_check_pairs_counts_every_kind_like_the_definitions(pairs):
    checks = check_pairs(pairs, quiet=True)
    expected = {
        "empty": [i for i, p in enumerate(pairs) if not p.chosen.strip() or not p.rejected.strip()],
        "identical": [i for i, p in enumerate(pairs) if p.chosen == p.rejected],
        "duplicate_id": [i for i, p in enumerate(pairs) if p.id is not None and p.id in [q.id for q in pairs[:i]]],
        "repeated": [i for i, p in enumerate(pairs)
                     if (p.prompt, p.chosen, p.rejected) in [(q.prompt, q.chosen, q.rejected) for q in pairs[:i]]],
    }
    assert {k: list(checks.indices[k]) for k in CHECK_KINDS} == expected
    assert checks.ok == (not any(expected.values()))


# ---- what the fuzzing found, pinned as plain regression tests ---------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
def test_a_file_that_is_not_utf8_names_its_line(tmp_path, fmt):
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    path = write(tmp_path, fmt, [good, dict(good, chosen="caf\udce9")], ascii_only=False)
    line = {"jsonl": 2, "json": 1, "csv": 3}[fmt]
    with pytest.raises(DataError, match=rf"pairs\.{fmt}, line {line}: not valid UTF-8 .*Fix: save the file as UTF-8"):
        load(path)
    if fmt == "jsonl":  # read lazily: a limit stops before the bad line
        assert load(path, limit=1) == [Pair("p", "a", "b")]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@pytest.mark.parametrize("value, pattern", [
    ("[" * 100_000 + "]" * 100_000, r"JSON nested deeper than Python's parser allows"),
    ("9" * 5000, r"JSON that Python cannot read \(Exceeds the limit \(4300 digits\)"),
])
def test_json_python_cannot_parse_is_a_data_error(tmp_path, suffix, value, pattern):
    record = '{"prompt": "p", "chosen": "a", "rejected": "b", "id": ' + value + "}"
    path = tmp_path / f"pairs{suffix}"
    path.write_text(record + "\n" if suffix == ".jsonl" else "[" + record + "]", encoding="utf-8")
    where = ", line 1" if suffix == ".jsonl" else ""
    with pytest.raises(DataError, match=rf"pairs{re.escape(suffix)}{where}: {pattern}.*Fix: "):
        load(path)


def test_csv_cells_python_cannot_parse_stay_text(tmp_path):
    path = tmp_path / "deep.csv"
    pd.DataFrame([{"prompt": "[" * 5000 + "]" * 5000, "chosen": "[" + "9" * 5000 + "]", "rejected": "b"}]
                 ).to_csv(path, index=False)
    (pair,) = load(path)
    assert pair.prompt.startswith("[[[") and pair.chosen.startswith("[999")


def test_error_messages_escape_what_they_quote(tmp_path):
    path = write(tmp_path, "jsonl", [{"prompt": "p", "chosen": ["x\ud800"], "rejected": "b"}])
    with pytest.raises(DataError) as info:
        load(path)
    assert "\\ud800" in str(info.value)
    str(info.value).encode("utf-8")


def test_old_mac_line_endings_still_split_lines(tmp_path):
    path = tmp_path / "cr.jsonl"
    row = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})
    path.write_bytes(("\ufeff" + row + "\r" + row.replace('"a"', '"c"') + "\r\n\r\n{}\n").encode("utf-8"))
    with pytest.raises(DataError, match=r"cr\.jsonl, line 4: field 'chosen'"):
        load(path)
    assert load(path, limit=2) == [Pair("p", "a", "b"), Pair("p", "c", "b")]
