"""RewardBench 2 records (chosen/rejected as lists) read as grouped pairs, from every format we read."""

from __future__ import annotations

import json

import pytest

from rewardlens.data import SAMPLES, Pair, load_pairs, sample_path, save_pairs
from rewardlens.errors import DataError
from tests.data.test_data import FORMATS, write_jsonl, write_records

pytest.importorskip("pandas")
pytest.importorskip("datasets")
pytest.importorskip("pyarrow")

# RewardBench 2's hub schema: one chosen against three rejected, with its count fields.
RB2 = [
    {"id": "f-1", "prompt": "Who wrote Hamlet?", "subset": "Factuality", "chosen": ["Shakespeare."],
     "rejected": ["Marlowe.", "Dickens.", "Austen."], "num_correct": 1, "num_rejected": 3, "total_completions": 4},
    {"id": "m-2", "prompt": "What is 3 + 4?", "subset": "Math", "chosen": ["7"],
     "rejected": ["6", "8", "34"], "num_correct": 1, "num_rejected": 3, "total_completions": 4},
]


def expected(records: list[dict]) -> list[Pair]:
    """The pairs a reader must produce, written out by hand: one per (chosen, rejected), chosen-major."""
    return [Pair(r["prompt"], c, rej, id=f"{r['id']}/{k}" if len(r["chosen"]) == 1 else f"{r['id']}/{j}-{k}",
                 subset=r["subset"], group=r["id"])
            for r in records for j, c in enumerate(r["chosen"]) for k, rej in enumerate(r["rejected"])]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rewardbench2_records_from_every_format(tmp_path, fmt):
    pairs = load_pairs(write_records(tmp_path, fmt, RB2))
    assert pairs == expected(RB2)
    # the pairs of one record are adjacent and carry its group
    assert [p.group for p in pairs] == ["f-1"] * 3 + ["m-2"] * 3


def test_several_chosen_without_counts_and_without_id(tmp_path):
    record = {"prompt": "Name a primary colour.", "chosen": ["Red.", "Blue."], "rejected": ["Green.", "Pink."]}
    other = dict(record, prompt="Name another primary colour.")
    pairs = load_pairs(write_jsonl(tmp_path / "ties.jsonl", [dict(record, id="t"), other]), strict=True)
    assert pairs[:4] == expected([dict(record, id="t", subset=None)])
    # without an id the group is the record's location and the pairs have no id
    assert [(p.chosen, p.rejected, p.id, p.group) for p in pairs[4:]] == [
        ("Red.", "Green.", None, "line 2"), ("Red.", "Pink.", None, "line 2"),
        ("Blue.", "Green.", None, "line 2"), ("Blue.", "Pink.", None, "line 2")]


def test_a_string_chosen_against_a_list(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "p", "chosen": "good", "rejected": ["bad", "worse"],
                                                 "id": 4}])
    assert load_pairs(path) == [Pair("p", "good", "bad", id="4/0", group="4"),
                                Pair("p", "good", "worse", id="4/1", group="4")]


def test_limit_counts_records_not_pairs(tmp_path):
    path = write_jsonl(tmp_path / "rb2.jsonl", RB2)
    assert load_pairs(path, limit=1) == expected(RB2[:1])


def test_groups_round_trip_through_save_pairs(tmp_path):
    pairs = expected(RB2) + [Pair("q", "a", "b", id="plain")]
    path = save_pairs(pairs, tmp_path / "saved.jsonl")
    assert load_pairs(path) == pairs
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["group"] == "f-1" and "group" not in lines[-1]


def test_pair_group_must_be_text():
    with pytest.raises(TypeError, match="Pair.group must be a string"):
        Pair("p", "a", "b", group=3)  # type: ignore[arg-type]


MALFORMED = [
    (dict(RB2[0], rejected=["Marlowe.", 7, "Austen."]),
     r"line 2: field 'rejected\[1\]': expected a response text .*found number 7"),
    (dict(RB2[0], num_rejected=2), r"line 2: field 'num_rejected': expected the number of responses in "
                                   r"'rejected' \(3\), found number 2"),
    (dict(RB2[0], total_completions="five"), r"line 2: field 'total_completions': expected .*\(4\)"),
    (dict(RB2[0], rejected=[]), r"line 2: field 'rejected': expected a response text or a non-empty list"),
    (dict(RB2[0], chosen=["x"], rejected={"role": "assistant", "content": "y"}),
     r"line 2: field 'rejected': expected a response text or a non-empty list"),
    ({k: v for k, v in RB2[0].items() if k != "prompt"}, r"line 2: field 'prompt': expected a prompt"),
]


@pytest.mark.parametrize("bad, pattern", MALFORMED)
def test_malformed_rewardbench2_records_name_record_field_and_fix(tmp_path, bad, pattern):
    path = write_jsonl(tmp_path / "bad.jsonl", [RB2[1], bad])
    with pytest.raises(DataError, match=r"bad\.jsonl, " + pattern) as info:
        load_pairs(path)
    assert "Fix: " in str(info.value)


def test_a_csv_response_that_looks_like_a_list_stays_text(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "list.csv"
    pd.DataFrame([{"prompt": "Give a JSON list.", "chosen": '["a", "b"]', "rejected": "no"}]).to_csv(path, index=False)
    assert load_pairs(path) == [Pair("Give a JSON list.", '["a", "b"]', "no")]


def test_shipped_samples_load():
    rb1 = load_pairs(sample_path("rewardbench"), strict=True)
    rb2 = load_pairs(sample_path("rewardbench2"), strict=True)
    records = [json.loads(x) for x in sample_path("rewardbench2").read_text(encoding="utf-8").splitlines()]
    assert rb2 == expected(records)
    assert len(rb1) == len(sample_path("rewardbench").read_text(encoding="utf-8").splitlines())
    assert all(p.group is None and p.subset for p in rb1)
    assert set(SAMPLES) == {"rewardbench", "rewardbench2"}
    with pytest.raises(ValueError, match="rewardbench2"):
        sample_path("nope")
