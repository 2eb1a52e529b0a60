"""Preference-pair loaders: every format, both schemas, exact values, and precise errors."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from rewardlens.data import Pair, load_pairs, save_pairs
from rewardlens.errors import DataError, RewardLensError

# Some fixtures are degenerate on purpose (an empty rejected response, the same pair under two ids);
# test_degenerate.py checks the warning they get, here it would only be noise.
pytestmark = pytest.mark.filterwarnings("ignore::rewardlens.errors.DegeneratePairsWarning")

pd = pytest.importorskip("pandas")
datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")

MATH = [{"role": "user", "content": "What is 2+2?"}]

# RewardBench schema: string prompt, message prompt, numeric id, and no id at all.
REWARDBENCH = [
    {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No.", "id": 7, "subset": "chat"},
    {"prompt": MATH, "chosen": "4", "rejected": "5", "id": "b-2", "subset": "math-prm"},
    {"prompt": "Ünïcödé ✓\nline two", "chosen": "ok 👍", "rejected": "", "subset": None},
]
REWARDBENCH_PAIRS = [
    Pair("Say hi.", "Hi!", "No.", id="7", subset="chat"),
    Pair(MATH, "4", "5", id="b-2", subset="math-prm"),
    Pair("Ünïcödé ✓\nline two", "ok 👍", "", id=None, subset=None),
]

# LLaMA-Factory / ShareGPT DPO schema.
SHAREGPT = [
    {
        "conversations": [{"from": "human", "value": "Name a colour."}],
        "chosen": {"from": "gpt", "value": "Blue."},
        "rejected": {"from": "gpt", "value": "Seven."},
    },
    {
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                          {"from": "human", "value": "Bye"}],
        "system": "Be brief.",
        "chosen": {"from": "gpt", "value": "Goodbye."},
        "rejected": {"from": "gpt", "value": "Why?"},
        "id": 3,
    },
]
SHAREGPT_PAIRS = [
    Pair([{"role": "user", "content": "Name a colour."}], "Blue.", "Seven."),
    Pair(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
        "Goodbye.", "Why?", id="3",
    ),
]

SCHEMAS = {"rewardbench": (REWARDBENCH, REWARDBENCH_PAIRS), "sharegpt": (SHAREGPT, SHAREGPT_PAIRS)}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def write_records(tmp_path, fmt, records):
    """Write `records` the way real users' files look in each format."""
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "pairs.jsonl", records)
    if fmt == "json":
        path = tmp_path / "pairs.json"
        path.write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")
        return path
    if fmt == "json-wrapped":
        path = tmp_path / "pairs.json"
        path.write_text(json.dumps({"data": records}), encoding="utf-8")
        return path
    if fmt == "csv":
        # Nested values are JSON in CSV cells, as exporters write them.
        rows = [{k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()}
                for r in records]
        path = tmp_path / "pairs.csv"
        # object dtype: a partly missing int id column stays "3", not the float "3.0".
        pd.DataFrame(rows, dtype=object).to_csv(path, index=False)
        return path
    if fmt == "parquet":
        path = tmp_path / "pairs.parquet"
        pd.DataFrame(_arrow_friendly(records)).to_parquet(path, index=False)
        return path
    if fmt == "dataset":
        path = tmp_path / "pairs_ds"
        datasets.Dataset.from_list(_arrow_friendly(records)).save_to_disk(str(path))
        return path
    if fmt == "datasetdict":
        path = tmp_path / "pairs_dd"
        extra = datasets.Dataset.from_list([{"prompt": "other", "chosen": "a", "rejected": "b"}])
        datasets.DatasetDict({"test": extra, "train": datasets.Dataset.from_list(_arrow_friendly(records))}
                             ).save_to_disk(str(path))
        return path
    raise AssertionError(fmt)


def _arrow_friendly(records):
    """Arrow needs one type per column, and from_list takes its columns from the first record."""
    keys = {k for r in records for k in r}
    out = [{k: str(r[k]) if k == "id" and k in r else r.get(k) for k in keys} for r in records]
    # A column cannot mix strings and message lists, so keep only the records of one prompt kind.
    kinds = {type(r.get("prompt")) for r in out}
    if len(kinds) > 1:
        out = [r for r in out if isinstance(r.get("prompt"), str)]
    return out


FORMATS = ["jsonl", "json", "json-wrapped", "csv", "parquet", "dataset", "datasetdict"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("schema", SCHEMAS)
def test_every_format_and_schema(tmp_path, fmt, schema):
    records, expected = SCHEMAS[schema]
    path = write_records(tmp_path, fmt, records)
    if fmt in ("parquet", "dataset", "datasetdict") and schema == "rewardbench":
        expected = [p for p in expected if isinstance(p.prompt, str)]
    if fmt == "csv" and schema == "rewardbench":
        # An empty CSV cell is indistinguishable from a missing field, so "" rejected is dropped.
        expected, path = expected[:2], write_records(tmp_path, fmt, records[:2])
    assert load_pairs(path) == expected


def test_message_prompts_in_parquet_and_dataset(tmp_path):
    records = [{"prompt": MATH, "chosen": "4", "rejected": "5", "id": "a"},
               {"prompt": MATH + [{"role": "assistant", "content": "?"}, {"role": "user", "content": "Sure?"}],
                "chosen": "Yes", "rejected": "No", "id": "b"}]
    expected = [Pair(r["prompt"], r["chosen"], r["rejected"], id=r["id"]) for r in records]
    for fmt in ("parquet", "dataset", "csv"):
        assert load_pairs(write_records(tmp_path, fmt, records)) == expected


def test_numeric_ids_become_strings(tmp_path):
    records = [{"prompt": "p", "chosen": "a", "rejected": "b", "id": i} for i in (1, 2)]
    for fmt in ("parquet", "csv", "jsonl"):
        path = tmp_path / f"ids.{fmt}"
        if fmt == "jsonl":
            write_jsonl(path, records)
        else:
            getattr(pd.DataFrame(records), "to_parquet" if fmt == "parquet" else "to_csv")(path, index=False)
        assert [p.id for p in load_pairs(path)] == ["1", "2"]


def test_int_ids_with_gaps_from_pandas(tmp_path):
    frame = pd.DataFrame({"prompt": ["p", "q"], "chosen": ["a", "a"], "rejected": ["b", "b"],
                          "id": [1, None]})  # pandas stores this column as float64 1.0, NaN
    frame.to_parquet(tmp_path / "gaps.parquet")
    assert [p.id for p in load_pairs(tmp_path / "gaps.parquet")] == ["1", None]
    write_jsonl(tmp_path / "nan.jsonl", [dict(ROW, id=float("nan"))])
    assert load_pairs(tmp_path / "nan.jsonl")[0].id is None


def test_utf8_bom_is_tolerated(tmp_path):
    for name, text in [("bom.jsonl", json.dumps(ROW)), ("bom.json", json.dumps([ROW]))]:
        (tmp_path / name).write_text("\ufeff" + text, encoding="utf-8")
        assert load_pairs(tmp_path / name) == [Pair("p", "a", "b")]


def test_datasetdict_takes_train_else_only_split(tmp_path):
    one = datasets.Dataset.from_list([{"prompt": "p", "chosen": "a", "rejected": "b"}])
    datasets.DatasetDict({"test": one}).save_to_disk(str(tmp_path / "only"))
    assert load_pairs(tmp_path / "only") == [Pair("p", "a", "b")]
    datasets.DatasetDict({"test": one, "dev": one}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(DataError, match=r"two.*splits \['test', 'dev'\].*no 'train'"):
        load_pairs(tmp_path / "two")
    assert load_pairs(tmp_path / "two" / "dev") == [Pair("p", "a", "b")]  # the suggested fix works


def test_llama_factory_dpo_record(tmp_path):
    record = {
        "conversations": [
            {"from": "human", "value": "I have a list of numbers in Python. How do I sort it?"},
            {"from": "gpt", "value": "Use `sorted(numbers)` for a new list or `numbers.sort()` in place."},
            {"from": "human", "value": "And in descending order?"},
        ],
        "system": "You are a helpful programming assistant.",
        "chosen": {"from": "gpt", "value": "Pass `reverse=True`: `sorted(numbers, reverse=True)`."},
        "rejected": {"from": "gpt", "value": "Python cannot sort in descending order."},
    }
    path = tmp_path / "dpo_en_demo.json"
    path.write_text(json.dumps([record], indent=2), encoding="utf-8")
    (pair,) = load_pairs(path)
    assert pair == Pair(
        [
            {"role": "system", "content": "You are a helpful programming assistant."},
            {"role": "user", "content": "I have a list of numbers in Python. How do I sort it?"},
            {"role": "assistant",
             "content": "Use `sorted(numbers)` for a new list or `numbers.sort()` in place."},
            {"role": "user", "content": "And in descending order?"},
        ],
        "Pass `reverse=True`: `sorted(numbers, reverse=True)`.",
        "Python cannot sort in descending order.",
    )
    assert pair.conversation("chosen")[-1] == {"role": "assistant", "content": pair.chosen}


def test_sharegpt_role_content_style_and_string_responses(tmp_path):
    path = write_jsonl(tmp_path / "rc.jsonl", [{
        "conversations": [{"role": "user", "content": "Hi"}], "system": "",
        "chosen": "Hello.", "rejected": {"role": "assistant", "content": "Go away."}}])
    assert load_pairs(path) == [Pair([{"role": "user", "content": "Hi"}], "Hello.", "Go away.")]


def test_chosen_rejected_as_full_conversations(tmp_path):
    convo = [{"role": "user", "content": "2+2?"}]
    records = [
        # No prompt: it comes from the shared turns before the last assistant message.
        {"chosen": convo + [{"role": "assistant", "content": "4"}],
         "rejected": convo + [{"role": "assistant", "content": "5"}]},
        # A prompt is given (UltraFeedback-binarized style): it wins, the response is the last turn.
        {"prompt": "2+2?", "chosen": convo + [{"role": "assistant", "content": "4"}], "rejected": "5"},
    ]
    assert load_pairs(write_jsonl(tmp_path / "full.jsonl", records)) == [
        Pair(convo, "4", "5"), Pair("2+2?", "4", "5")]


def test_limit(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", REWARDBENCH + [{"broken": True}])
    assert load_pairs(path, limit=2) == REWARDBENCH_PAIRS[:2]
    assert load_pairs(path, limit=0) == []
    assert load_pairs(write_records(tmp_path, "parquet", REWARDBENCH), limit=1) == REWARDBENCH_PAIRS[:1]
    with pytest.raises(ValueError, match="limit"):
        load_pairs(path, limit=-1)


def test_blank_lines_skipped_and_line_numbers_count_them(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text('\n{"prompt": "p", "chosen": "a", "rejected": "b"}\n   \n\n{"prompt": "p"}\n')
    with pytest.raises(DataError, match=r"gaps\.jsonl, line 5: field 'chosen'"):
        load_pairs(path)
    assert load_pairs(path, limit=1) == [Pair("p", "a", "b")]


def test_round_trip(tmp_path):
    pairs = REWARDBENCH_PAIRS + SHAREGPT_PAIRS + [Pair("x", 'say "{}" [1]', "\u2028\r\n", id="007")]
    path = save_pairs(pairs, tmp_path / "out.jsonl")
    assert path == tmp_path / "out.jsonl"
    assert load_pairs(path) == pairs
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert first == {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No.", "id": "7", "subset": "chat"}
    assert load_pairs(save_pairs(load_pairs(path), tmp_path / "again.jsonl")) == pairs
    with pytest.raises(ValueError, match=r"\.jsonl"):
        save_pairs(pairs, tmp_path / "out.json")


def test_csv_response_that_looks_like_json_stays_text(tmp_path):
    path = tmp_path / "j.csv"
    row = {"prompt": "Give JSON.", "chosen": '{"a": 1}', "rejected": "[1, 2]", "id": 5}
    pd.DataFrame([row]).to_csv(path, index=False)
    assert load_pairs(path) == [Pair("Give JSON.", '{"a": 1}', "[1, 2]", id="5")]


# --- errors ----------------------------------------------------------------------------------

ROW = {"prompt": "p", "chosen": "a", "rejected": "b"}

MALFORMED = [
    # (records after one good one, expected message pattern)
    ([{"prompt": "p", "rejected": "b"}], r"line 2: field 'chosen': expected .*found no such field"),
    ([{"prompt": "p", "chosen": "a"}], r"line 2: field 'rejected'"),
    ([{"chosen": "a", "rejected": "b"}], r"line 2: field 'prompt': expected a prompt \(or 'conversations'"),
    ([{"prompt": "p", "chosen": 42, "rejected": "b"}], r"line 2: field 'chosen': expected .*found number 42"),
    ([{"prompt": 3, "chosen": "a", "rejected": "b"}], r"line 2: field 'prompt': .*found number 3"),
    ([{"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}],
     r"line 2: field 'prompt\[0\]\.content': expected the message text.*found no such field"),
    ([{"prompt": [{"role": "user", "content": ["x"]}], "chosen": "a", "rejected": "b"}],
     r"line 2: field 'prompt\[0\]\.content'.*found list"),
    ([{"conversations": [{"from": "human"}], "chosen": {"from": "gpt", "value": "a"}, "rejected": "b"}],
     r"line 2: field 'conversations\[0\]\.value'"),
    ([{"conversations": [{"value": "hi"}], "chosen": "a", "rejected": "b"}],
     r"line 2: field 'conversations\[0\]\.from'"),
    ([{"conversations": "hi", "chosen": "a", "rejected": "b"}],
     r"line 2: field 'conversations': expected a list of messages, found string"),
    ([{"conversations": [], "chosen": "a", "rejected": "b"}],
     r"line 2: field 'conversations': expected at least one"),
    ([{"conversations": [{"from": "human", "value": "hi"}], "chosen": {"from": "gpt"}, "rejected": "b"}],
     r"line 2: field 'chosen\.value'"),
    ([{"conversations": [{"from": "human", "value": "hi"}], "system": 1, "chosen": "a", "rejected": "b"}],
     r"line 2: field 'system'"),
    ([{"prompt": "p", "chosen": "a", "rejected": "b", "id": [1]}], r"line 2: field 'id'"),
    ([{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
       "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}]}],
     r"line 2: field 'prompt' is missing and .*'chosen' and 'rejected' differ"),
    ([{"chosen": [{"role": "user", "content": "q"}], "rejected": "b"}],
     r"line 2: field 'chosen': expected a conversation ending with an assistant message, "
     r"found object {\"role\": \"user\""),
    ([["p", "a", "b"]], r"line 2: expected an object.*found list"),
]


@pytest.mark.parametrize("bad, pattern", MALFORMED)
def test_malformed_jsonl_records(tmp_path, bad, pattern):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROW] + bad)
    with pytest.raises(DataError, match=r"bad\.jsonl, " + pattern) as info:
        load_pairs(path)
    assert "Fix: " in str(info.value)


def test_invalid_json_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n" + '{"prompt": "p", "chosen": "a",\n')
    with pytest.raises(DataError, match=r"broken\.jsonl, line 3: invalid JSON"):
        load_pairs(path)


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet", "dataset"])
def test_malformed_record_index_in_tabular_formats(tmp_path, fmt):
    records = [ROW, ROW, {"prompt": "p", "chosen": "a", "rejected": None}]
    if fmt == "csv":
        records[2] = {"prompt": "p", "chosen": "a", "rejected": ""}  # an empty cell is a missing field
    path = write_records(tmp_path, fmt, records)
    with pytest.raises(DataError, match=rf"{path.name}, record 2: field 'rejected'"):
        load_pairs(path)


def test_datasetdict_error_names_split(tmp_path):
    bad = datasets.Dataset.from_list([{"prompt": "p", "chosen": "a", "rejected": "b"},
                                      {"prompt": "p", "chosen": "a", "rejected": None}])
    datasets.DatasetDict({"train": bad}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"dd, split 'train', record 1: field 'rejected'"):
        load_pairs(tmp_path / "dd")


def test_csv_without_prompt_column(tmp_path):
    path = tmp_path / "noprompt.csv"
    pd.DataFrame([{"question": "q", "chosen": "a", "rejected": "b"}]).to_csv(path, index=False)
    pattern = r"noprompt\.csv, record 0: field 'prompt'.*\['chosen', 'question', 'rejected'\]"
    with pytest.raises(DataError, match=pattern):
        load_pairs(path)


@pytest.mark.parametrize("name, content", [
    ("empty.jsonl", ""), ("empty.jsonl", "\n \n"), ("empty.json", ""), ("empty.json", "[]"),
    ("empty.csv", ""), ("empty.csv", "prompt,chosen,rejected\n")])
def test_empty_files(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=rf"{name}: no records found"):
        load_pairs(tmp_path / name)


def test_empty_parquet_and_dataset(tmp_path):
    pd.DataFrame({"prompt": [], "chosen": [], "rejected": []}).to_parquet(tmp_path / "e.parquet")
    with pytest.raises(DataError, match=r"e\.parquet: no records found"):
        load_pairs(tmp_path / "e.parquet")


def test_json_shape_errors(tmp_path):
    path = tmp_path / "shape.json"
    path.write_text(json.dumps({"data": [ROW], "more": [ROW]}))
    with pytest.raises(DataError, match=r"shape\.json: expected a list of records.*\['data', 'more'\]"):
        load_pairs(path)
    path.write_text(json.dumps(ROW))
    with pytest.raises(DataError, match=r"shape\.json: expected a list of records"):
        load_pairs(path)
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n")
    with pytest.raises(DataError, match=r"shape\.json: invalid JSON at line 2.*rename it to \.jsonl"):
        load_pairs(path)
    path.write_text('"just a string"')
    with pytest.raises(DataError, match=r"shape\.json: expected a list of records.*found string"):
        load_pairs(path)


def test_unknown_suffix_lists_supported(tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_text("hello")
    pattern = r"pairs\.txt: unsupported file type '\.txt'.*\.jsonl, \.json, \.csv, \.parquet"
    with pytest.raises(DataError, match=pattern):
        load_pairs(path)


def test_file_not_found(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: no such file"):
        load_pairs(tmp_path / "missing.jsonl")


def test_folder_that_is_not_a_dataset(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=r"plain: a folder, but not one written by .*save_to_disk"):
        load_pairs(tmp_path / "plain")


def test_not_a_parquet_file(tmp_path):
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"fake\.parquet: not a readable Parquet file"):
        load_pairs(tmp_path / "fake.parquet")


@pytest.mark.parametrize("module, fmt", [("pyarrow", "parquet"), ("datasets", "dataset")])
def test_missing_optional_dependency_names_extra(tmp_path, monkeypatch, module, fmt):
    path = write_records(tmp_path, fmt, [ROW])
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(ImportError, match=r"rewardlens\[data\]") as info:
        load_pairs(path)
    assert isinstance(info.value, RewardLensError)  # the library's own class, still an ImportError


def test_optional_deps_are_imported_lazily():
    # Checked on the source: importing the package would pull in torch and be slow.
    import rewardlens.data._pairs

    tree = ast.parse(Path(rewardlens.data._pairs.__file__).read_text(encoding="utf-8"))
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top_level for a in n.names} | {n.module for n in top_level
                                                            if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n and n.split(".")[0] in ("datasets", "pyarrow")}


# --- formats agree: a record means the same in JSONL, JSON, CSV and Parquet ------------------------

USER = {"role": "user", "content": "Hi"}


@pytest.mark.parametrize("prompt, field, found", [
    ([USER, {"content": "More?"}], "prompt[1].role", "no such field"),           # one message lacks its role
    ([USER, "More?"], "prompt[1]", 'string "More?"'),                             # an entry that is no message
    ([{"from": "human", "value": "Hi"}, {"from": "gpt"}], "prompt[1].value", "no such field"),
])
def test_a_csv_cell_of_messages_is_refused_as_jsonl_refuses_it(tmp_path, prompt, field, found):
    """Before, the CSV cell was taken for literal prompt text while the same record in JSONL was refused."""
    record = {"prompt": prompt, "chosen": "a", "rejected": "b"}
    messages = {}
    for fmt in ("jsonl", "csv"):
        with pytest.raises(DataError) as info:
            load_pairs(write_records(tmp_path, fmt, [record]))
        messages[fmt] = str(info.value).split(": ", 1)[1]  # after "<file>, line 1" / "<file>, record 0"
    assert messages["jsonl"] == messages["csv"]
    assert messages["csv"].startswith(f"field {field!r}: expected ") and f"found {found}. Fix: " in messages["csv"]


GPT_LAST = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]
ASSISTANT_LAST = [USER, {"role": "assistant", "content": "Hello!"}]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("record, field", [
    ({"prompt": ASSISTANT_LAST, "chosen": "a", "rejected": "b"}, "prompt[1]"),
    ({"conversations": GPT_LAST, "system": "Be brief.", "chosen": "a", "rejected": "b"}, "conversations[1]"),
    ({"chosen": ASSISTANT_LAST + [{"role": "assistant", "content": "a"}],
      "rejected": ASSISTANT_LAST + [{"role": "assistant", "content": "b"}]}, "chosen[1]"),
])
def test_a_prompt_ending_on_an_assistant_turn_is_refused(tmp_path, fmt, record, field):
    """The response would follow an assistant turn: the template renders another conversation than meant."""
    path = write_records(tmp_path, fmt, [record])
    where = "line 1" if fmt == "jsonl" else "record 0"
    with pytest.raises(DataError) as info:
        load_pairs(path)
    assert str(info.value) == (
        f"{path}, {where}: field {field!r}: expected a prompt ending on the turn the response answers (user, "
        f'system or tool), found object {{"role": "assistant", "content": "Hello!"}}. Fix: drop the trailing '
        f"assistant turn {field} (if it is the response, it belongs in 'chosen' and 'rejected').")



def test_a_format_whose_reader_is_missing_names_the_extra(monkeypatch, tmp_path):
    from rewardlens.errors import MissingDependencyError

    path = tmp_path / "pairs.parquet"
    path.write_bytes(b"PAR1")  # never read: the reader is refused first
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MissingDependencyError, match=r"reading this format, which needs the 'pyarrow' package, not "
                                                     r"installed; fix: pip install 'rewardlens\[data\]'"):
        load_pairs(path)
