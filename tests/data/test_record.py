"""A record's other fields: kept by every loader in `Pair.extra`, read-only, and named the same way in every
table (`record_fields`, `record_columns`), so results join back to the user's data by id."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import rewardlens as rl
from rewardlens.data import Extra, load_pairs, record_columns, record_fields, save_pairs

RECORDS = [
    {"id": "a", "prompt": "2+2?", "chosen": "4", "rejected": "5", "subset": "math", "source": "web",
     "difficulty": 1, "meta": {"tags": ["x", "y"], "rater": 3}},
    {"id": "b", "prompt": "Capital of France?", "chosen": "Paris", "rejected": "Rome", "source": "book",
     "difficulty": "hard", "system": "be brief"},
]


def _jsonl(tmp_path, records=RECORDS):
    path = tmp_path / "extra.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_jsonl_keeps_every_field_it_does_not_read(tmp_path):
    a, b = load_pairs(_jsonl(tmp_path))
    assert a.extra.thaw() == {"source": "web", "difficulty": 1, "meta": {"tags": ["x", "y"], "rater": 3}}
    # `system` is read only beside `conversations`; beside `prompt` it is the user's field and is kept.
    assert b.extra.thaw() == {"source": "book", "difficulty": "hard", "system": "be brief"}


def test_sharegpt_system_and_rewardbench2_counts_are_read_not_kept(tmp_path):
    records = [{"conversations": [{"from": "human", "value": "hi"}], "system": "sys", "chosen": "a",
                "rejected": "b", "source": "sg"},
               {"id": "r", "prompt": "p", "chosen": ["c"], "rejected": ["r1", "r2"], "num_correct": 1,
                "num_rejected": 2, "total_completions": 3, "subset": "Math", "source": "rb2"}]
    got = load_pairs(_jsonl(tmp_path, records))
    assert [p.extra.thaw() for p in got] == [{"source": "sg"}, {"source": "rb2"}, {"source": "rb2"}]


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_parquet_and_csv_keep_extra_columns(tmp_path, suffix):
    frame = pd.DataFrame([{"id": "a", "prompt": "p", "chosen": "c", "rejected": "r", "source": "web", "level": "2"}])
    path = tmp_path / f"x{suffix}"
    frame.to_parquet(path) if suffix == ".parquet" else frame.to_csv(path, index=False)
    (pair,) = load_pairs(path)
    assert pair.extra.thaw() == {"source": "web", "level": "2"}


def test_save_pairs_round_trips_the_extra_fields(tmp_path):
    pairs = load_pairs(_jsonl(tmp_path))
    back = load_pairs(save_pairs(pairs, tmp_path / "back.jsonl"))
    assert [p.extra.thaw() for p in back] == [p.extra.thaw() for p in pairs]


def test_extra_is_frozen_and_changes_no_equality_or_hash():
    meta = {"tags": ["x"]}
    pair = rl.Pair("q", "a", "b", id="1", extra={"meta": meta})
    meta["tags"].append("y")  # the caller's dict is copied, not shared
    assert pair.extra.thaw() == {"meta": {"tags": ["x"]}}
    with pytest.raises(TypeError):
        pair.extra["meta"]["tags"] = []  # type: ignore[index]
    assert isinstance(pair.extra["meta"], Extra) and pair.extra["meta"]["tags"] == ("x",)
    plain = rl.Pair("q", "a", "b", id="1")
    assert pair == plain and hash(pair) == hash(plain)


def test_extra_may_not_shadow_what_pair_holds():
    with pytest.raises(ValueError, match=r"Pair.extra may not hold \['id'\]"):
        rl.Pair("q", "a", "b", extra={"id": "x"})


def test_record_fields_and_columns_name_pairs_the_same_way(tmp_path):
    a, b = load_pairs(_jsonl(tmp_path))
    assert record_fields(a, "a") == {"id": "a", "subset": "math", "source": "web", "difficulty": 1,
                                     "meta": {"tags": ["x", "y"], "rater": 3}}
    assert record_fields(b, "b", taken=("source",), every=True) == {
        "id": "b", "subset": None, "group": None, "record.source": "book", "difficulty": "hard",
        "system": "be brief"}
    cols = record_columns([a, b], ["a", "b"])
    assert cols == {"id": ["a", "b"], "subset": ["math", None], "group": [None, None], "source": ["web", "book"],
                    # 1 and "hard" in one column: text throughout, so the column has one Parquet type
                    "difficulty": ["1", "hard"],
                    "meta": ['{"tags": ["x", "y"], "rater": 3}', None], "system": [None, "be brief"]}
    back = pd.read_parquet(_parquet(pd.DataFrame(cols), tmp_path))
    assert json.loads(back["meta"][0]) == {"tags": ["x", "y"], "rater": 3}


def _parquet(frame, tmp_path):
    path = tmp_path / "cols.parquet"
    frame.to_parquet(path, index=False)
    return path
