"""`rewardlens bench` on the shipped sample files: the table, --json against the model's own scores,
and --against; pairs with NaN rewards named and left out."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import load_pairs, margin, sample_path, save_pairs
from tests.helpers import finite


@pytest.fixture(scope="module")
def llama(tiny_root) -> str:
    return str(tiny_root["llama"])


def test_table_on_the_rewardbench_sample(capsys, llama):
    assert main(["bench", llama, "--pairs", str(sample_path("rewardbench")), "--n-boot", "50"]) == 0
    out = capsys.readouterr().out
    for text in ("alpacaeval-easy", "95% Wilson CI", "Chat Hard", "Reasoning", "overall (mean of the sections)",
                 "accuracy over all 40 items"):
        assert text in out


def test_json_matches_the_models_own_scores(capsys, llama):
    assert main(["bench", llama, "--pairs", str(sample_path("rewardbench")), "--n-boot", "50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pairs = load_pairs(sample_path("rewardbench"))
    right = margin(rl.load(llama).score(pairs)) > 0  # the yardstick: the model's scores, counted by hand
    naive: dict[str, list[bool]] = {}
    for p, ok in zip(pairs, right):
        naive.setdefault(p.subset or "", []).append(bool(ok))
    assert {s["subset"]: s["accuracy"] for s in out["subsets"]} == pytest.approx(
        {k: np.mean(v) for k, v in naive.items()})
    assert {s["subset"]: s["n"] for s in out["subsets"]} == {k: len(v) for k, v in naive.items()}
    # RewardBench's fixed counts: math-prm 984 against four hep-* subsets of 164 (python, js, rust, go)
    math = next(s for s in out["subsets"] if s["subset"] == "math-prm")
    assert math["weight"] == pytest.approx(984 / (984 + 4 * 164))
    assert set(out["sections"]) == {"Chat", "Chat Hard", "Safety", "Reasoning"} and not out["missing_sections"]
    assert out["overall"]["value"] == pytest.approx(np.mean([v["value"] for v in out["sections"].values()]))
    assert out["accuracy"]["value"] == pytest.approx(right.mean()) and out["comparison"] is None


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_against_on_the_rewardbench2_sample(capsys, tiny_root, llama, as_json):
    argv = ["bench", llama, "--pairs", str(sample_path("rewardbench2")), "--against", str(tiny_root["qwen2"]),
            "--n-boot", "50"]
    assert main([*argv, *(["--json"] if as_json else [])]) == 0
    out = capsys.readouterr().out
    if not as_json:
        assert "RewardBench 2 (mean best-of-N accuracy" in out and "A − B" in out
        return
    result = json.loads(out)
    assert {s["kind"] for s in result["subsets"]} == {"best-of-4"} and result["n_items"] == 8
    rows = {(r["level"], r["name"]): r for r in result["comparison"]["scores"]}
    rb2 = rows[("score", "RewardBench 2")]
    assert rb2["a"] == pytest.approx(result["rewardbench2"]["value"])
    assert rb2["difference"] == pytest.approx(rb2["a"] - rb2["b"])


def test_a_missing_second_model_is_refused_before_loading(capsys, llama, tmp_path):
    code = main(["bench", llama, "--pairs", str(sample_path("rewardbench")), "--against", str(tmp_path / "nope")])
    assert code == 2 and "no such model folder" in capsys.readouterr().err


def test_nan_pairs_are_named_in_the_table_and_null_in_json(capsys, tiny_root, tokenizer, tmp_path):
    nan_model = str(finite.nan_word_model(tiny_root["llama"], tmp_path / "injected", tokenizer))
    pairs = finite.pairs(6, bad={3, 5}, subsets=["alpacaeval-easy"] * 3 + ["mt-bench-easy"] * 3)
    path = str(save_pairs(pairs, tmp_path / "pairs.jsonl"))
    assert main(["bench", nan_model, "--pairs", path, "--n-boot", "40"]) == 0
    out = capsys.readouterr().out
    assert "note: 2 pairs with non-finite rewards excluded: p3, p5" in out
    body = out.split("\n", 1)[1]  # after the model line (its path holds the test name)
    assert "accuracy over 4 of 6 items" in body and "MOVER-Wilson" in body and "nan" not in body
    assert main(["bench", nan_model, "--pairs", path, "--n-boot", "40", "--json"]) == 0
    got = json.loads(capsys.readouterr().out, parse_constant=lambda token: pytest.fail(f"{token} is not JSON"))
    right = margin(rl.load(nan_model).score(pairs)) > 0
    assert got["excluded"] == ["p3", "p5"] and got["counted_items"] == 4
    assert [(s["subset"], s["n"], s["correct"]) for s in got["subsets"]] == [
        ("alpacaeval-easy", 2, int(right[[0, 1]].sum())), ("mt-bench-easy", 2, int(right[[3, 5]].sum()))]


def test_weighting_option_switches_to_the_items_scored(capsys, llama):
    argv = ["bench", llama, "--pairs", str(sample_path("rewardbench")), "--n-boot", "40", "--json"]
    assert main([*argv, "--weighting", "items"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weighting"] == "items"
    # by items: six code items (hep-python 2, hep-js 2, hep-rust 1, hep-go 1), so math-prm weighs 6 of 12
    assert next(s for s in out["subsets"] if s["subset"] == "math-prm")["weight"] == pytest.approx(0.5)
    assert main(argv[:-1]) == 0
    assert "weighted by RewardBench's fixed EXAMPLE_COUNTS" in capsys.readouterr().out


def test_ties_records_are_scored_in_the_table(capsys, llama, tmp_path):
    rows = [{"id": "ref:0", "prompt": "Name a prime number.", "chosen": ["7"], "rejected": ["4", "9"],
             "subset": "Ties"},
            {"id": "tied:0", "prompt": "Name a prime number.", "chosen": ["7", "11"], "rejected": ["8"],
             "subset": "Ties"}]
    path = tmp_path / "ties.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["bench", llama, "--pairs", str(path), "--n-boot", "40"]) == 0
    out = capsys.readouterr().out
    assert "ties rule" in out and "prompts with both a ref and a tied record" in out
    assert main(["bench", llama, "--pairs", str(path), "--n-boot", "40", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["ties_subset"]["n_matched"] == 1
    assert got["rewardbench2"]["value"] == pytest.approx(got["ties_subset"]["score"])  # Ties is the only subset


def test_json_items_and_frames_carry_every_field_of_the_record(capsys, llama, tmp_path):
    """bench's per-item output names each item by its record (id, subset and the fields bench does not read),
    so its numbers join back to the data by id; a RewardBench 2 record's fields name its one item."""
    records = [
        {"id": "a", "prompt": "2+2?", "chosen": "4", "rejected": "5", "subset": "math-prm", "source": "web",
         "meta": {"rater": 3}},
        {"id": "b", "prompt": "Capital?", "chosen": "Paris", "rejected": "Rome", "subset": "math-prm",
         "source": "book"},
        {"id": "g", "prompt": "p", "chosen": ["good"], "rejected": ["bad", "worse"], "subset": "Math",
         "source": "rb2", "difficulty": 4},
    ]
    path = tmp_path / "extra.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert main(["bench", llama, "--pairs", str(path), "--n-boot", "40", "--json"]) == 0
    items = {i["id"]: i for i in json.loads(capsys.readouterr().out)["items"]}
    assert items.keys() == {"a", "b", "g"}
    assert [items[k]["source"] for k in "abg"] == ["web", "book", "rb2"]
    assert items["a"]["meta"] == {"rater": 3} and items["g"]["difficulty"] == 4 and items["g"]["pairs"] == 2
    pairs = load_pairs(path)
    right = margin(rl.load(llama).score(pairs)) > 0  # the yardstick: best-of-N by hand, the group right when both are
    assert [items[k]["correct"] for k in "abg"] == [bool(right[0]), bool(right[1]), bool(right[2] and right[3])]
    b = rl.bench(rl.load(llama), pairs, n_boot=40)
    frame = b.pair_frame()
    assert list(frame["id"]) == ["a", "b", "g/0", "g/1"] and list(frame["source"]) == ["web", "book", "rb2", "rb2"]
    assert frame["meta"][0] == '{"rater": 3}' and frame["meta"][1:].isna().all()  # nested: JSON text in a table
    assert b.item_frame().set_index("id")["source"].to_dict() == {"a": "web", "b": "book", "g": "rb2"}
