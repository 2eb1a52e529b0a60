"""The command line, run in-process on a real folder and a real pairs file."""

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory, pairs):
    return str(save_pairs(pairs, tmp_path_factory.mktemp("cli") / "pairs.jsonl"))


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_score_json_matches_the_api(capsys, tiny_root, pairs_file, pairs):
    out = _json(capsys, ["score", str(tiny_root["gpt2"]), "--pairs", pairs_file, "--json"])
    rewards = rl.load(str(tiny_root["gpt2"])).score(pairs)
    np.testing.assert_allclose([p["margin"] for p in out["pairs"]], rewards[0::2] - rewards[1::2], rtol=1e-5)
    assert out["accuracy"] == pytest.approx(np.mean(rewards[0::2] > rewards[1::2]))


def test_score_json_carries_each_records_subset_and_group(capsys, tiny_root, pairs, tmp_path):
    """Scores join back to the user's data: `score --json` used to drop `subset` (and `group`)."""
    labelled = [rl.Pair(p.prompt, p.chosen, p.rejected, id=f"q{i}", subset=["chat", None][i % 2],
                        group="g1" if i == 0 else None) for i, p in enumerate(pairs)]
    path = str(save_pairs(labelled, tmp_path / "labelled.jsonl"))
    out = _json(capsys, ["score", str(tiny_root["gpt2"]), "--pairs", path, "--json"])
    got = {p["id"]: p for p in out["pairs"]}
    assert got["q0"]["subset"] == "chat" and got["q0"]["group"] == "g1"
    assert "subset" not in got["q1"] and "group" not in got["q1"]  # no label on the record: none in its row


def test_attribute_and_lens_json(capsys, tiny_root, pairs_file, pairs):
    out = _json(capsys, ["attribute", str(tiny_root["qwen2"]), "--pairs", pairs_file, "--json", "--level", "head",
                         "--all-parts"])
    assert out["max_abs_residual_error"] < 1e-5
    first = out["pairs"][0]
    att = rl.attribute(rl.load(str(tiny_root["qwen2"])), pairs, level="head")
    assert first["parts"]["attn_L1_H2"] == pytest.approx(float(att.margin[0, att.names.index("attn_L1_H2")]), rel=1e-5)
    ln = _json(capsys, ["lens", str(tiny_root["qwen2"]), "--pairs", pairs_file, "--json"])
    margins = [p["linear_margin"][-1] for p in ln["pairs"]]
    np.testing.assert_allclose(margins, [p["margin"] for p in out["pairs"]], rtol=1e-4)


def test_table_output_and_audit_of_the_demo(capsys, tmp_path):
    # the demo organism: trained on first use, then cached
    assert main(["audit", "--limit", "3", "--out", str(tmp_path), "--no-concepts", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "demo model" in text and "sycophancy" in text and "crystallization" in text
    assert "pair accuracy: 0.000 over 3 pairs" in text  # the planted bias: it prefers agreeing with the user
    assert "largest |reward − (Σ parts + constant)|" in text
    assert "top parts by mean |total effect| (noising, read positions)" in text  # the causal view next to attribution
    assert "flagged probe axes: sycophancy" in text and (tmp_path / "report.html").is_file()


def test_bad_pairs_file_exits_with_a_named_error(capsys, tiny_root, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "chosen": "a"}\n')
    assert main(["score", str(tiny_root["llama"]), "--pairs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "rejected" in err


@pytest.mark.parametrize("argv", [["--limit", "0"], ["--batch-size", "0"], ["--fraction", "0"]])
def test_bad_options_are_refused_by_the_parser(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["audit", *argv])
    assert exc.value.code == 2 and "must be" in capsys.readouterr().err


def test_missing_model_and_bad_dtype_exit_cleanly(capsys, tiny_root, pairs_file, tmp_path):
    assert main(["score", str(tmp_path / "nowhere"), "--pairs", pairs_file]) == 2
    assert "rewardlens: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a bad --dtype is refused by the parser, before the model loads
        main(["score", str(tiny_root["llama"]), "--pairs", pairs_file, "--dtype", "float8"])
    assert exc.value.code == 2 and "float8" in capsys.readouterr().err


def test_readout_option_for_a_multi_objective_head(capsys, tiny_root, pairs_file, pairs):
    out = _json(capsys, ["score", str(tiny_root["armorm"]), "--pairs", pairs_file, "--json", "--readout", "2"])
    rewards = rl.load(str(tiny_root["armorm"])).objectives(pairs)[:, 2]
    np.testing.assert_allclose([p["chosen"] for p in out["pairs"]], rewards[0::2], rtol=1e-5)


EXTRA_RECORDS = [
    {"id": "a", "prompt": "2+2?", "chosen": "4", "rejected": "5", "source": "web", "difficulty": 1,
     "meta": {"tags": ["x"], "rater": 3}, "margin": "user's own"},
    {"id": "b", "prompt": "Capital of France?", "chosen": "Paris", "rejected": "Rome", "source": "book",
     "difficulty": "hard"},
]


def test_score_json_carries_every_other_field_of_the_record(capsys, tiny_root, tmp_path):
    """Every field the loader does not read comes back in the pair's row, joined by id; a nested one as JSON,
    and one named like a score key (`margin`) as `record.margin`, beside the score's own."""
    path = tmp_path / "extra.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in EXTRA_RECORDS), encoding="utf-8")
    out = _json(capsys, ["score", str(tiny_root["gpt2"]), "--pairs", str(path), "--json"])
    got = {p["id"]: p for p in out["pairs"]}
    for record in EXTRA_RECORDS:
        row = got[record["id"]]
        assert row["source"] == record["source"] and row["difficulty"] == record["difficulty"]
    assert got["a"]["meta"] == {"tags": ["x"], "rater": 3} and "meta" not in got["b"]
    assert got["a"]["record.margin"] == "user's own" and isinstance(got["a"]["margin"], float)
